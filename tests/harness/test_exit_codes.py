"""One table of exit codes for both languages, and the same words for the same failure
(issue 23, cases 9 and 11).

* The table (codegen/exit_codes.yaml) is what both tools were built from: smoe_gen.exit_codes
  for the Python CLI, exit_codes.hpp compiled into `smoe-stream` (its hidden `exit-codes`).
* Every shared case runs through `python -m smoe verify|dump|export` and `smoe-stream
  check|forward`: the same exit status, one line on stderr, `error: MESSAGE` in Python and
  `smoe-stream: MESSAGE` in C++ with the same MESSAGE byte for byte (a usage error is
  `error: MESSAGE (see PROG --help)` in both); where both judged the vault, the same first
  error finding in their --json documents; where neither could, the same error document.
* A name with ESC, OSC, newline, C1 or undecodable bytes is shown identically by both (and
  no control byte reaches the terminal): `smoe-stream shown` against console.shown on
  thousands of texts, and on real file names.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from smoe.cli import failures
from smoe.cli.console import one_line, shown
from smoe.errors import (
    FormatError,
    RefusedInput,
    SmoeError,
    UnreadableInput,
    UsageError,
    WriteFailed,
    WriterStateError,
)
from smoe.plumbing.fileio import NotRegular
from smoe_gen import exit_codes

from fixtures_data import CORRUPT, FIXTURES, ROOT
from helpers import SMOE_STREAM, Arg, plain_env, run, strict_json

pytestmark = pytest.mark.usefixtures("smoe_stream")

CPP = [SMOE_STREAM]
GOOD = FIXTURES / "q4_v2.smoe"  # 2 layers of 4 experts, with its manifest beside it
STATUS = {k.name: k.status for k in exit_codes.ALL}
CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")  # C0 but LF, DEL, C1


def both(py: Sequence[Arg], cpp: Sequence[Arg]) -> tuple[subprocess.CompletedProcess, ...]:
    """The Python CLI on ``py`` and smoe-stream on ``cpp``, output as bytes."""
    return run(*py, text=False), run(*cpp, command=CPP, text=False)


def line(proc: subprocess.CompletedProcess, prefix: bytes) -> bytes:
    """The one stderr line of a failure, less ``prefix``; no control byte in it."""
    err = proc.stderr
    assert b"Traceback" not in err and err.count(b"\n") == 1 and err.endswith(b"\n"), err
    assert err.startswith(prefix), err
    assert not CONTROL.search(err[:-1]), err
    return err[len(prefix) : -1]


# ---- the table -------------------------------------------------------------------------------
def test_both_languages_hold_the_table_of_codegen() -> None:
    kinds = yaml.safe_load((ROOT / "codegen" / "exit_codes.yaml").read_text())["kinds"]
    table = [{**k, "meaning": " ".join(k["meaning"].split())} for k in kinds]
    assert [k._asdict() for k in exit_codes.ALL] == table
    r = run("exit-codes", command=CPP)
    assert r.returncode == 0, r.stderr
    assert strict_json(r.stdout) == table
    assert STATUS == {
        "ok": 0,
        "invalid": 1,
        "refused": 1,
        "write_failed": 1,
        "failed": 1,
        "internal": 1,
        "unreadable": 2,
        "usage": 2,
        "interrupted": 130,
        "stdout_closed": 141,
        "terminated": 143,
    }


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (UnreadableInput("v: cannot open"), "unreadable"),
        (NotRegular("v: not a regular file (a FIFO)"), "unreadable"),
        (UsageError("--jobs: must be at least 1"), "usage"),
        (RefusedInput("m/config.json: no hidden_size"), "refused"),
        (FormatError("v: bad magic"), "invalid"),
        (WriteFailed("o: No space left on device"), "write_failed"),
        (WriterStateError("plan: not yet"), "failed"),
        (SmoeError("v: file shrank while reading"), "failed"),
        (OSError(5, "Input/output error", "v"), "failed"),
        (KeyError("x"), "internal"),
        (MemoryError(), "internal"),
    ],
)
def test_python_takes_each_kind_from_the_table(error: BaseException, kind: str) -> None:
    assert failures.exit_kind(error) is exit_codes.BY_NAME[kind]
    assert failures.describe(error)[1] == failures.exit_status(error) == STATUS[kind]


# ---- the shared cases ------------------------------------------------------------------------
@dataclass
class Files:
    root: Path
    vault: Path  # a copy of GOOD with its manifest beside it
    x: Path  # IN.f32 for forward


@pytest.fixture
def files(tmp_path: Path) -> Files:
    vault = Path(shutil.copy(GOOD, tmp_path / "v.smoe"))
    shutil.copy(f"{GOOD}.manifest.json", f"{vault}.manifest.json")
    x = tmp_path / "x.f32"
    x.write_bytes(struct.pack("<64f", *[0.25] * 64))
    return Files(tmp_path, vault, x)


def bad_input(kind: str, path: Path) -> Path:
    """A path of ``kind`` that cannot be read at ``path``."""
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "notdir":
        path.write_text("a file, not a folder")
        return path / "x"
    return path  # missing


UNREADABLE = {
    "missing": "cannot open: No such file or directory",
    "folder": "not a regular file (a folder)",
    "fifo": "not a regular file (a FIFO)",
    "notdir": "cannot open: Not a directory",
}


@pytest.mark.parametrize("kind", UNREADABLE)
@pytest.mark.parametrize(("py", "cpp"), [("verify", "check"), ("dump", "check --deep")])
def test_a_vault_that_cannot_be_read(files: Files, kind: str, py: str, cpp: str) -> None:
    """Exit 2 (unreadable), the same line; with --json the same error document."""
    b = bad_input(kind, files.root / "b.smoe")
    p, c = both([py, b], [*cpp.split(), b])
    assert (p.returncode, c.returncode) == (2, 2)
    want = f"{b}: {UNREADABLE[kind]}".encode()
    assert line(p, b"error: ") == line(c, b"smoe-stream: ") == want
    assert p.stdout == c.stdout == b""
    p, c = both([py, "--json", b], [*cpp.split(), "--json", b])
    assert (p.returncode, c.returncode) == (2, 2)
    doc = {"schema": "smoe-findings/1", "ok": False, "error": {"message": want.decode()}}
    doc["error"]["exit_code"] = 2
    assert strict_json(p.stdout) == strict_json(c.stdout) == doc


def first_error(proc: subprocess.CompletedProcess) -> dict:
    """The first error finding of a --json findings document (code, field, offset, message)."""
    doc = strict_json(proc.stdout)
    err = next(f for f in doc["findings"] if f["severity"] == "error")
    return {k: err[k] for k in ("code", "field", "offset", "message")}


def manifest_with(vault: Path, edit: Callable[[dict], str]) -> Path:
    """The vault's manifest rewritten as ``edit(doc)`` returns it, beside it."""
    path = Path(f"{vault}.manifest.json")
    path.write_text(edit(json.loads(path.read_text())))
    return path


def big_integer(digits: int, where: str) -> Callable[[dict], str]:
    """A manifest with an integer literal of ``digits`` digits (``where``: an unknown key,
    the vault's size, or a negative one in an expert's entry)."""

    def edit(doc: dict) -> str:
        marker = "111222333444555666777"  # found nowhere else in a manifest
        if where == "unknown key":
            doc["later"] = int(marker)
        elif where == "vault.size":
            doc["vault"]["size"] = int(marker)
        else:
            doc["experts"][0]["later"] = -int(marker)
        return json.dumps(doc).replace(marker, "7" * digits)

    return edit


@pytest.mark.parametrize(
    ("digits", "where"),
    [(5000, "unknown key"), (5000, "vault.size"), (4301, "negative in an entry")],
)
def test_an_integer_beyond_what_python_reads_is_refused_by_both(
    files: Files, digits: int, where: str
) -> None:
    """Python's json refuses an integer of more than sys.int_info.default_max_str_digits
    digits: the manifest is not JSON to either tool (exit 1, manifest.malformed)."""
    assert sys.int_info.default_max_str_digits == 4300
    manifest_with(files.vault, big_integer(digits, where))
    p, c = both(
        ["verify", "--deep", "--json", files.vault], ["check", "--deep", "--json", files.vault]
    )
    assert (p.returncode, c.returncode) == (1, 1), (p.stderr, c.stderr)
    pe, ce = first_error(p), first_error(c)
    assert (pe["code"], pe["field"], pe["offset"]) == (ce["code"], ce["field"], ce["offset"])
    assert (pe["code"], pe["field"]) == ("manifest.malformed", "manifest")
    assert f"{digits} digits" in pe["message"] and f"{digits} digits" in ce["message"]
    assert ce["message"].startswith(f"{files.vault}.manifest.json: not valid JSON at byte ")


def test_an_integer_of_4300_digits_is_read_by_both(files: Files) -> None:
    manifest_with(files.vault, big_integer(4300, "unknown key"))
    p, c = both(["verify", "--deep", files.vault], ["check", "--deep", files.vault])
    assert (p.returncode, c.returncode) == (0, 0), (p.stdout, c.stderr)


@pytest.mark.parametrize("kind", [*UNREADABLE, "dangling symlink"])
def test_a_manifest_that_cannot_be_read_is_a_finding_in_both(files: Files, kind: str) -> None:
    """`--manifest PATH` (or a sidecar that is a dangling symlink) that cannot be read: the
    deep check's manifest.malformed finding, exit 1 (invalid), in both (C++ used to exit 2)."""
    if kind == "dangling symlink":
        side = Path(f"{files.vault}.manifest.json")
        side.unlink()
        side.symlink_to("nowhere.json")
        args: list[Arg] = ["--deep", files.vault]
        why = f"{side}: cannot open: No such file or directory"
    else:
        m = bad_input(kind, files.root / "m.json")
        args = ["--deep", files.vault, "--manifest", m]
        why = f"{m}: {UNREADABLE[kind]}"
    p, c = both(["verify", "--json", *args], ["check", "--json", *args])
    assert (p.returncode, c.returncode) == (1, 1), (p.stderr, c.stderr)
    want = {"code": "manifest.malformed", "field": "manifest", "offset": 0, "message": why}
    assert first_error(p) == first_error(c) == want
    p, c = both(["verify", *args], ["check", *args])
    assert (p.returncode, c.returncode) == (1, 1)
    assert p.stderr == b""  # Python prints the findings on stdout
    assert f"manifest.malformed at offset 0x0 (manifest): {why}".encode() in p.stdout
    assert line(c, b"smoe-stream: ") == (
        f"{files.vault}: manifest.malformed at offset 0 (manifest): {why}".encode()
    )


def test_a_vault_that_breaks_a_rule_or_is_too_short(files: Files) -> None:
    """Judged by both: the same first error; 1 (invalid) for a broken rule, 2 for a file
    shorter than a header (unreadable, and still reported as the header.size finding)."""
    short = files.root / "short.smoe"
    short.write_bytes(GOOD.read_bytes()[:30])
    for vault, code in (
        (CORRUPT / "bad_magic.smoe", 1),
        (CORRUPT / "version_0.smoe", 1),
        (short, 2),
    ):
        p, c = both(["verify", "--json", vault], ["check", "--json", vault])
        assert (p.returncode, c.returncode) == (code, code), vault
        pe, ce = first_error(p), first_error(c)
        assert (pe["code"], pe["field"], pe["offset"]) == (ce["code"], ce["field"], ce["offset"])


def test_a_valid_vault(files: Files) -> None:
    for args in ([files.vault], ["--deep", files.vault]):
        p, c = both(["verify", *args], ["check", *args])
        assert (p.returncode, c.returncode) == (0, 0), (p.stdout, c.stderr)


@pytest.mark.parametrize(
    ("py", "cpp"),
    [
        (["verify", "--bogus", "@"], ["check", "--bogus", "@"]),
        (["verify"], ["check"]),
        (["dump", "--layer", "x", "@"], ["bench", "@", "--threads", "x"]),
        ([], []),
        (["frobnicate"], ["frobnicate"]),
    ],
    ids=["unknown option", "no vault", "bad number", "no command", "unknown command"],
)
def test_a_usage_error_is_one_line(files: Files, py: list[Arg], cpp: list[Arg]) -> None:
    """Exit 2 (usage): `error: MESSAGE (see PROG --help)`, one line (C++ used to print the
    whole usage after it); with --json the message is the error document's."""
    sub = {"@": files.vault}
    py, cpp = [sub.get(str(a), a) for a in py], [sub.get(str(a), a) for a in cpp]
    p, c = both(py, cpp)
    assert (p.returncode, c.returncode) == (2, 2)
    pl, cl = line(p, b"error: "), line(c, b"error: ")
    assert re.fullmatch(rb".+ \(see smoe( [a-z]+)? --help\)", pl), pl
    assert re.fullmatch(rb".+ \(see smoe-stream --help\)", cl), cl
    assert p.stdout == c.stdout == b""
    if cpp[:1] == ["check"]:
        p, c = both([*py, "--json"], [*cpp, "--json"])
        for proc, message in ((p, pl), (c, cl)):
            assert strict_json(proc.stdout)["error"] == {
                "message": message.decode(),
                "exit_code": 2,
            }


def test_an_output_in_the_way_or_an_input(files: Files) -> None:
    """Exit 1 (write_failed) in both, the same line: a FIFO at the output, an output that is
    the input (C++ used to exit 2)."""
    fifo = files.root / "out.f32"
    os.mkfifo(fifo)
    for out, why in (
        (fifo, "exists and is not a regular file (a FIFO); refusing to replace it"),
        (
            files.vault,
            f"the output is the input {files.vault} itself; refusing to overwrite an input",
        ),
    ):
        p, c = both(["export", files.vault, out], ["forward", files.vault, 0, 0, files.x, out])
        assert (p.returncode, c.returncode) == (1, 1)
        assert line(p, b"error: ") == line(c, b"smoe-stream: ") == f"{out}: {why}".encode()
    assert fifo.is_fifo() and files.vault.read_bytes() == GOOD.read_bytes()


def test_bench_topk_is_bounded_by_the_experts_per_layer(files: Files) -> None:
    r = run("bench", files.vault, "--topk", 100000, command=CPP)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (
        f"error: --topk: 100000 is more than the 4 experts per layer of {files.vault} "
        "(see smoe-stream --help)\n"
    )
    r = run("bench", files.vault, "--topk", 4, "--seconds", "0.05", "--pattern", "seq", command=CPP)
    assert r.returncode == 0, r.stderr
    assert strict_json(r.stdout)["topk"] == 4


# ---- names on the terminal -------------------------------------------------------------------
NAMES = [
    b"csi\x1b[31mred",
    b"osc\x1b]0;title\x07",
    b"new\nline",
    b"cr\rreturn",
    b"tab\tand\n  fold",
    b"c1\xc2\x9b2J",
    b"nel\xc2\x85\n",
    b"undecodable\xff\xfe",
    b"cut\xe2\x82",
    b"del\x7f",
    b"caf\xc3\xa9",
]


def expected(path: bytes) -> bytes:
    return shown(os.fsdecode(path)).encode()


@pytest.mark.parametrize("name", NAMES, ids=ascii)
def test_a_name_is_shown_the_same_by_both(files: Files, name: bytes) -> None:
    missing = os.fsencode(files.root) + b"/" + name + b".smoe"
    p, c = both(["verify", missing], ["check", missing])
    assert (p.returncode, c.returncode) == (2, 2)
    want = expected(missing) + b": cannot open: No such file or directory"
    assert line(p, b"error: ") == line(c, b"smoe-stream: ") == want

    vault = os.fsencode(files.root) + b"/" + name + b".v.smoe"
    shutil.copy(GOOD, os.fsdecode(vault))
    p, c = both(["verify", vault], ["check", vault])
    assert (p.returncode, c.returncode) == (0, 0)
    for out in (p.stdout, c.stdout):
        assert not CONTROL.search(out), out
    assert p.stdout.splitlines()[-1].startswith(expected(vault) + b": valid")
    assert c.stdout.splitlines()[0].startswith(expected(vault) + b": valid")
    p, c = both(["verify", "--json", vault], ["check", "--json", vault])
    assert strict_json(p.stdout)["vault"] == strict_json(c.stdout)["vault"]


TOKENS = [
    b"a", b"Z", b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c", b"\x1b", b"\x1b[", b"\x07", b"\x00",
    b"\x1c", b"\x1f", b"\x7f", b"\x80", b"\xa0", b"\xc2\x85", b"\xc2\x9b", b"\xc2\x9f",
    b"\xc2\xa0", b"\xc3\xa9", b"\xe1\x9a\x80", b"\xe2\x80\x80", b"\xe2\x80\x8b", b"\xe2\x80\xa8",
    b"\xe2\x80\xaf", b"\xe3\x80\x80", b"\xf0\x9f\x98\x80", b"\xff", b"\xfe", b"\xc0\x80",
    b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf0\x9f", b"\\x1b", b"%s", b"'",
]  # fmt: skip


def texts(n: int) -> list[bytes]:
    rng = random.Random(23)
    out = [b"", b" ", b"\n", b"\n\n \t", *TOKENS]
    while len(out) < n:
        out.append(b"".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 12))))
        if rng.random() < 0.2:
            out.append(rng.randbytes(rng.randint(1, 16)))
    return out


def test_shown_and_fold_lines_agree_with_python_on_any_bytes(tmp_path: Path) -> None:
    """harness/text.cpp against smoe.cli.console: shown (the terminal) and fold_lines (the
    JSON error message, whose undecodable bytes are U+FFFD each: one_line)."""
    cases = texts(4000)
    blob = tmp_path / "texts.bin"
    blob.write_bytes(b"".join(struct.pack("<I", len(t)) + t for t in cases))
    r = run("shown", blob, command=CPP)
    assert r.returncode == 0, r.stderr
    got = strict_json(r.stdout)
    assert len(got) == len(cases)
    for t, (cpp_shown, cpp_folded) in zip(cases, got):
        text = os.fsdecode(t)
        assert (cpp_shown, cpp_folded) == (shown(text), one_line(text)), t
        assert not CONTROL.search(cpp_shown.encode()), t


# ---- signals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sig", "kind"), [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated")]
)
@pytest.mark.parametrize("command", ["forward", "dequant", "fp16-table"])
def test_a_signal_while_writing_leaves_no_temporary_file(
    files: Files, slow_fsync: Path, command: str, sig: int, kind: str
) -> None:
    """SIGINT 130 and SIGTERM 143, as the table says; the temporary files are removed and
    nothing appears under the output's name."""
    out = files.root / "out"
    out.mkdir()
    argv = {
        "forward": ["forward", files.vault, 0, 0, files.x, out / "y.f32"],
        "dequant": ["dequant", files.vault, 0, 0, out],
        "fp16-table": ["fp16-table", out / "t.f32"],
    }[command]
    mark = files.root / "fsync.mark"
    env = plain_env(LD_PRELOAD=str(slow_fsync), SMOE_FSYNC_MARK=str(mark))
    proc = subprocess.Popen(
        [SMOE_STREAM, *map(str, argv)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while not mark.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no fsync within a minute"
            time.sleep(0.01)
        assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")]  # being written
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == STATUS[kind], (proc.returncode, stderr)
    assert (stdout, stderr) == (b"", f"smoe-stream: {kind}\n".encode())
    assert list(out.iterdir()) == []
