"""The resume journal is read with a bound derived from what it can hold (issue 23, item 7):
its header and one longest line per planned expert. A longer file (a crash's NUL tail, a
torn write) is read only up to that bound and the rest ignored as torn: a 1 GiB tail cost
2.1 GB of memory on ``--resume``; now the resume adopts what the journal's lines say, in
bounded memory, and gives the same bytes."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from smoe.plumbing import fileio
from smoe.sculpt import SculptOptions, sculpt
from smoe.sculpt import journal as journals
from smoe.sculpt.journal import JOURNAL_MAGIC, Entry, journal_limit, read_journal
from smoe_testkit.synth import write_checkpoint

from helpers import SMOE, python

GIB = 1 << 30
FP = "ab" * 32  # a fingerprint's 64 hex digits

# A resumed sculpt killed (SIGKILL, no clean-up) once more than ARGV[3] experts are journaled.
KILL_AFTER_EXPERTS = """
import os, signal, sys
from smoe.sculpt import SculptOptions, sculpt

def progress(done, total, nbytes):
    if done > int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)

sculpt(sys.argv[1], sys.argv[2], SculptOptions(resume=True, jobs=1), progress=progress)
"""

# ``smoe ARGS`` as a child, then its exit status, stdout and peak RSS (KiB) on one line each.
PEAK_RSS = """
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=600)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps([proc.returncode, proc.stdout, proc.stderr, peak]))
"""


def journal_file(tmp_path: Path, lines: list[bytes], tail: int = 0) -> Path:
    path = tmp_path / ".m.smoe.journal"
    path.write_bytes(f"{JOURNAL_MAGIC} {FP}\n".encode() + b"".join(lines))
    if tail:
        os.truncate(path, path.stat().st_size + tail)  # a sparse NUL tail, as after a crash
    return path


def test_the_limit_holds_the_longest_lines() -> None:
    """Every field at its widest: the bound is never below what a run writes."""
    widest = Entry(2**32 - 1, (2**32 - 1,) * 3, (-1.2345678901234567e-300,) * 3)
    line = Entry(widest.blob, widest.sources, widest.snrs, widest.snrs).line((2**32 - 1,) * 2)
    header = f"{JOURNAL_MAGIC} {FP}\n".encode()
    assert journal_limit(3) == len(header) + 3 * len(line)


def test_a_nul_tail_is_read_only_up_to_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [Entry(7 + e, (1, 2, 3), (12.5, None, 9.0)).line((0, e)) for e in range(4)]
    path = journal_file(tmp_path, lines, tail=GIB)
    reads: list[int] = []
    real = fileio.pread_exact

    def pread_exact(fd: int, n: int, offset: int, where: str | os.PathLike) -> bytes:
        reads.append(n)
        return real(fd, n, offset, where)

    monkeypatch.setattr(fileio, "pread_exact", pread_exact)
    fd = os.open(path, os.O_RDONLY)
    try:
        done = read_journal(fd, path, FP, experts=4)
    finally:
        os.close(fd)
    assert sorted(done) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert done[(0, 2)] == Entry(9, (1, 2, 3), (12.5, None, 9.0))
    assert sum(reads) <= journal_limit(4)


def test_lines_past_the_bound_are_ignored_as_torn(tmp_path: Path) -> None:
    """More lines than the run has experts cannot all be its own: those past the bound
    (and the one it cuts) are not adopted; none is ever adopted unverified anyway."""
    lines = [Entry(7, (1, 2, 3), (1.0, 2.0, 3.0)).line((0, e)) for e in range(400)]
    path = journal_file(tmp_path, lines)
    fd = os.open(path, os.O_RDONLY)
    try:
        done = read_journal(fd, path, FP, experts=2)
    finally:
        os.close(fd)
    limit = journal_limit(2)
    whole = sum(len(line) for line in lines[: len(done)]) + len(f"{JOURNAL_MAGIC} {FP}\n")
    assert len(done) >= 2 and whole <= limit
    assert sorted(done) == [(0, e) for e in range(len(done))]


def test_journal_read_passes_the_bound(tmp_path: Path) -> None:
    journal = journals.Journal(tmp_path / ".m.smoe.journal")
    try:
        journal.start(FP, {(0, 1): Entry(7, (1, 2, 3), (12.5, None, 9.0))})
        os.truncate(journal.path, journal.path.stat().st_size + GIB)
        assert list(journal.read(FP, experts=1)) == [(0, 1)]
    finally:
        journal.close(remove=True)


def test_resume_after_a_crash_with_a_nul_tail_in_bounded_memory(tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / "ck", layers=2, experts=4, seed=3)
    ref = sculpt(ck, tmp_path / "ref", SculptOptions(jobs=1))
    out = tmp_path / "out"
    killed = python(KILL_AFTER_EXPERTS, ck, out, 3, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    journal = out / ".ck.smoe.journal"
    journaled = journal.read_bytes().count(b"\n") - 1
    assert journaled > 3
    os.truncate(journal, journal.stat().st_size + GIB)
    proc = python(PEAK_RSS, *SMOE, "sculpt", ck, out, "--resume", "--jobs", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    code, stdout, stderr, peak_kib = json.loads(proc.stdout)
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["experts_resumed"] == journaled
    assert summary["experts_resumed"] + summary["experts_written"] == 8
    assert (out / "ck.smoe").read_bytes() == ref.vault.read_bytes()
    assert not journal.exists()
    assert peak_kib * 1024 < GIB // 2, f"peak RSS {peak_kib} KiB for a 1 GiB journal tail"
