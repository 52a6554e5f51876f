"""The resume journal ``.<stem>.smoe.journal``: one line per finished expert under a
fingerprint of the run (see :mod:`smoe.sculpt`), and the check that adopts a journaled
blob only if its bytes and its sources still match."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smoe import __version__
from smoe.errors import SmoeError
from smoe.plumbing import fileio
from smoe.sculpt.expert_reader import ExpertReader
from smoe.sculpt.options import SculptOptions
from smoe.sculpt.provenance import tensor_entries
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef
from smoe.vault.writer import VaultWriter

__all__ = [
    "JOURNAL_MAGIC",
    "Entry",
    "Journal",
    "fingerprint",
    "journal_limit",
    "keep_verified",
    "read_journal",
]

JOURNAL_MAGIC = "smoe-journal/2"
# The longest line: 6 integers below 2**32 (layer, expert, 4 CRC-32C) of at most 10 digits,
# 6 SNRs of at most 24 characters (repr of a float: "-1.2345678901234567e-308"), 11 spaces
# and the newline.
_MAX_LINE = 6 * 10 + 6 * 24 + 12


@dataclass(frozen=True)
class Entry:
    """One journaled expert: blob CRC-32C, source CRC-32C and SNR per tensor (and with an
    importance matrix, the weighted SNR per tensor).

    >>> Entry(7, (1, 2, 3), (12.5, None, 9.0)).line((0, 1))
    b'0 1 7 1 2 3 12.5 - 9.0\\n'
    """

    blob: int
    sources: tuple[int, ...]
    snrs: tuple[float | None, ...]
    weighted: tuple[float | None, ...] | None = None

    def line(self, key: tuple[int, int]) -> bytes:
        """The journal line of expert ``key`` (layer, expert), as :func:`read_journal` reads it.

        >>> Entry(7, (1, 2, 3), (1.0, 2.0, 3.0), (4.0, None, 6.0)).line((2, 5))
        b'2 5 7 1 2 3 1.0 2.0 3.0 4.0 - 6.0\\n'
        """
        values = self.snrs + (self.weighted or ())
        snrs = " ".join("-" if v is None else repr(float(v)) for v in values)
        crcs = " ".join(str(c) for c in self.sources)
        return f"{key[0]} {key[1]} {self.blob} {crcs} {snrs}\n".encode("ascii")


def fingerprint(
    ckpt: Checkpoint,
    refs: list[ExpertRef],
    meta: bytes,
    opts: SculptOptions,
    imatrix_sha256: str | None = None,
) -> str:
    """Identifies one planned run by its inputs' layout and the outputs' shape (no mtimes),
    and the importance matrix's content.

    >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
    >>> refs = list(ck.experts.values())
    >>> fp = fingerprint(ck, refs, b"metadata", SculptOptions())
    >>> len(fp), fp == fingerprint(ck, refs, b"metadata", SculptOptions(bits=2))
    (64, False)
    """
    h = hashlib.sha256(f"{JOURNAL_MAGIC} smoe {__version__}\n".encode())
    h.update(meta)
    shaping: dict[str, Any] = {"scale": opts.scale, "bits": opts.bits, "version": opts.version}
    if imatrix_sha256 is not None:
        shaping["imatrix"] = imatrix_sha256
    h.update(json.dumps(shaping).encode())
    for ref in refs:
        if ref.transposed:
            h.update(b"transposed\n")
        for scale in ref.scales:  # FP8: its scales are inputs too
            if scale is not None:
                info = scale.scale
                h.update(
                    f"{info.name}|{info.dtype}|{info.shape}|{info.offset}|{scale.block}\n".encode()
                )
        for info, idx, rows in ref.sources:
            shard = info.path.relative_to(ckpt.root).as_posix()
            h.update(
                f"{info.name}|{info.dtype}|{info.shape}|{info.offset}|{idx}|{rows}|"
                f"{shard}\n".encode()
            )
    return h.hexdigest()


def _parse_line(line: str) -> tuple[tuple[int, int], Entry] | None:
    parts = line.split(" ")
    if len(parts) not in (9, 12) or not all(p.isdigit() for p in parts[:6]):
        return None
    snrs: list[float | None] = []
    for p in parts[6:]:
        try:
            snrs.append(None if p == "-" else float(p))
        except ValueError:
            return None
    nums = [int(p) for p in parts[:6]]
    weighted = tuple(snrs[3:]) if len(snrs) == 6 else None
    return (nums[0], nums[1]), Entry(nums[2], tuple(nums[3:6]), tuple(snrs[:3]), weighted)


def journal_limit(experts: int) -> int:
    """The most bytes the journal of a run of ``experts`` experts can hold: its header (the
    magic and a 64-digit fingerprint) and one longest line per expert, each journaled once.

    >>> journal_limit(0), journal_limit(128 * 48)
    (80, 1327184)
    """
    return len(JOURNAL_MAGIC) + 1 + 64 + 1 + experts * _MAX_LINE


def read_journal(fd: int, path: Path, fp: str, experts: int) -> dict[tuple[int, int], Entry]:
    """Finished experts, if the journal belongs to this very run (else nothing).

    Read only up to :func:`journal_limit` of the run's ``experts``: what lies past it was
    not written by this run (a crash's NUL tail, a torn write) and is ignored as torn, not
    refused: a journal only saves work (every blob it names is verified before it is
    adopted, and the journal is rewritten), and memory stays bounded.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / ".m.smoe.journal"
    >>> _ = path.write_bytes(b"smoe-journal/2 ab12\\n0 1 7 1 2 3 12.5 - 9.0\\n0 2 8 4")
    >>> fd = os.open(path, os.O_RDONLY)
    >>> read_journal(fd, path, "ab12", 2), read_journal(fd, path, "cd34", 2)  # a torn line
    ({(0, 1): Entry(blob=7, sources=(1, 2, 3), snrs=(12.5, None, 9.0), weighted=None)}, {})
    >>> os.close(fd)
    """
    try:
        size = os.fstat(fd).st_size
    except OSError as e:
        raise SmoeError(f"{path}: cannot read: {e.strerror or e}") from None
    limit = min(size, journal_limit(experts))
    text = fileio.pread_exact(fd, limit, 0, path).decode("ascii", "replace")
    lines = text.split("\n")
    if not lines or lines[0] != f"{JOURNAL_MAGIC} {fp}":
        return {}
    done = {}
    for line in lines[1:-1]:  # the last element is "" or a torn line
        parsed = _parse_line(line)
        if parsed is not None:
            done[parsed[0]] = parsed[1]
    return done


class Journal:
    """The journal file, opened without following links; lines appended with checked writes.

    >>> import tempfile
    >>> journal = Journal(Path(tempfile.mkdtemp()) / ".m.smoe.journal")
    >>> journal.start("ab12", {(0, 1): Entry(7, (1, 2, 3), (12.5, None, 9.0))})
    >>> journal.append(Entry(8, (4, 5, 6), (1.0, 2.0, 3.0)).line((0, 2)))
    >>> sorted(journal.read("ab12", experts=2))
    [(0, 1), (0, 2)]
    >>> journal.close(remove=True); journal.path.exists()
    False
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = fileio.open_owned(path)
        self.end = 0

    def read(self, fp: str, experts: int) -> dict[tuple[int, int], Entry]:
        """The finished experts of run ``fp`` of ``experts`` experts (:func:`read_journal`,
        which that bounds); none for another run.

        >>> import tempfile
        >>> journal = Journal(Path(tempfile.mkdtemp()) / ".m.smoe.journal")
        >>> journal.read("ab12", experts=8)  # a new, empty journal
        {}
        >>> journal.close(remove=True)
        """
        assert self.fd is not None
        return read_journal(self.fd, self.path, fp, experts)

    def start(self, fp: str, kept: dict[tuple[int, int], Entry]) -> None:
        """Rewrite as this run's header plus the experts kept.

        >>> import tempfile
        >>> journal = Journal(Path(tempfile.mkdtemp()) / ".m.smoe.journal")
        >>> journal.start("ab12", {})
        >>> journal.path.read_bytes()
        b'smoe-journal/2 ab12\\n'
        >>> journal.close(remove=True)
        """
        assert self.fd is not None
        fileio.truncate(self.fd, 0, self.path)
        self.end = 0
        self.append(f"{JOURNAL_MAGIC} {fp}\n".encode("ascii"))
        if kept:
            self.append(b"".join(e.line(k) for k, e in sorted(kept.items())))

    def append(self, data: bytes) -> None:
        """Write ``data`` (whole lines) at the end, with a checked write.

        >>> import tempfile
        >>> journal = Journal(Path(tempfile.mkdtemp()) / ".m.smoe.journal")
        >>> journal.append(b"a line\\n"); journal.end
        7
        >>> journal.close(remove=True)
        """
        assert self.fd is not None
        fileio.pwrite_all(self.fd, data, self.end, self.path)
        self.end += len(data)

    def close(self, remove: bool) -> None:
        """Close the file; ``remove``: delete it too (kept for ``--resume`` otherwise).

        >>> import tempfile
        >>> journal = Journal(Path(tempfile.mkdtemp()) / ".m.smoe.journal")
        >>> journal.close(remove=False); journal.path.exists()
        True
        """
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if remove:
            fileio.unlink_owned(self.path)


def keep_verified(
    writer: VaultWriter,
    refs: list[ExpertRef],
    done: dict[tuple[int, int], Entry],
    threads: int,
    weighted: bool = False,
) -> dict[tuple[int, int], Entry]:
    """Adopt each journaled blob whose bytes AND sources still match; the rest are redone.
    ``weighted``: the run has an importance matrix (its journal lines carry weighted SNRs).

    Blobs and sources are re-read and hashed (the cost of a resume) by ``threads`` threads,
    each through its own chunk-sized buffer, in file order.

    >>> import tempfile
    >>> from smoe.format.manifest import checksum
    >>> ck = Checkpoint.open("fixtures/checkpoints/olmoe")
    >>> refs = [ck.experts[(0, 0)]]
    >>> w = VaultWriter(tempfile.mkdtemp() + "/m.smoe", ck.model_info(), version=1)
    >>> w.add_expert(0, 0, refs[0].shapes)
    >>> plan = w.begin()
    >>> hole = checksum(bytes(plan.experts[0].raw_size))  # the blob the partial holds now
    >>> stale = {(0, 0): Entry(hole, (1, 2, 3), (None, None, None))}  # sources changed since
    >>> keep_verified(w, refs, stale, threads=1)
    {}
    >>> sources = tuple(checksum(a) for a, _ in refs[0].load())
    >>> list(keep_verified(w, refs, {(0, 0): Entry(hole, sources, (None,) * 3)}, threads=1))
    [(0, 0)]
    >>> w.abort()
    """
    by_key = {(r.layer, r.expert): r for r in refs}
    candidates = sorted(
        (k for k in done if k in by_key),
        key=lambda k: min((str(p), o) for p, o, _ in by_key[k].ranges()),
    )
    threads = max(1, min(threads, len(candidates)))

    def check(t: int) -> dict[tuple[int, int], tuple[int, ...]]:
        """Source CRC-32C of this thread's share of the candidates whose blob is intact."""
        return {
            k: reader.crcs(by_key[k], slot=t)
            for k in candidates[t::threads]
            if writer.stored_crc(*k) == done[k].blob
        }

    now: dict[tuple[int, int], tuple[int, ...]] = {}
    with ExpertReader(slots=threads) as reader, ThreadPoolExecutor(threads) as pool:
        for share in pool.map(check, range(threads)):
            now.update(share)
    kept = {}
    for key in sorted(now):
        entry = done[key]
        if now[key] == entry.sources and (entry.weighted is not None) == weighted:
            writer.adopt(
                *key, entry.blob, tensor_entries(by_key[key], now[key], entry.snrs, entry.weighted)
            )
            kept[key] = entry
    return kept
