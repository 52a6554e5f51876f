"""The resume journal ``.<stem>.smoe.journal``: one line per finished expert under a
fingerprint of the run (see :mod:`smoe.sculpt`).

The journal is a hint, never a source of truth: what a kept expert's manifest entry and
the summary record is recomputed from the partial file and the sources
(:func:`smoe.sculpt.resume.keep_verified`), never copied from the line."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smoe import __version__
from smoe.errors import SmoeError
from smoe.plumbing import fileio
from smoe.sculpt.options import SculptOptions
from smoe.sculpt.outcome import ExpertOutcome, TensorOutcome
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef

if TYPE_CHECKING:
    pass

__all__ = [
    "JOURNAL_MAGIC",
    "Entry",
    "Journal",
    "fingerprint",
    "journal_limit",
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

    @classmethod
    def of(cls, outcome: ExpertOutcome, weighted: bool) -> Entry:
        """The entry of an expert as written (``weighted``: the run has an importance
        matrix, so its line carries the weighted SNRs).

        >>> t = TensorOutcome(source_crc=1, snr=12.5, weighted_snr=13.0)
        >>> Entry.of(ExpertOutcome((0, 1), 7, (t, t, t), 64), weighted=False).line((0, 1))
        b'0 1 7 1 1 1 12.5 12.5 12.5\\n'
        """
        return cls(
            blob=outcome.blob_crc,
            sources=outcome.sources,
            snrs=outcome.snrs,
            weighted=outcome.weighted if weighted else None,
        )

    @property
    def tensors(self) -> tuple[TensorOutcome, ...]:
        """Per tensor, what the line says of it.

        >>> Entry(7, (1, 2), (12.5, None), (13.0, None)).tensors[0]
        TensorOutcome(source_crc=1, snr=12.5, weighted_snr=13.0, report=None)
        """
        weighted = self.weighted or (None,) * len(self.snrs)
        return tuple(
            TensorOutcome(source_crc=crc, snr=snr, weighted_snr=w)
            for crc, snr, w in zip(self.sources, self.snrs, weighted)
        )

    def outcome(self, key: tuple[int, int], source_bytes: int) -> ExpertOutcome:
        """The expert ``key`` as this entry (recomputed by a resume) has it written.

        >>> Entry(7, (1, 2, 3), (12.5, None, 9.0)).outcome((0, 1), 64).snrs
        (12.5, None, 9.0)
        """
        return ExpertOutcome(
            key=key, blob_crc=self.blob, tensors=self.tensors, source_bytes=source_bytes
        )


def fingerprint(
    ckpt: Checkpoint,
    refs: list[ExpertRef],
    meta: bytes,
    opts: SculptOptions,
    imatrix_sha256: str | None = None,
    calibration: dict[str, Any] | None = None,
) -> str:
    """Identifies one planned run by its inputs' layout and the outputs' shape (no mtimes),
    and the importance matrix's content, or the calibration data's (its record: hash,
    shape, device).

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
    if calibration is not None:
        shaping["calibration"] = {k: v for k, v in calibration.items() if k != "file"}
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
                f"{shard}\n".encode("utf-8", "surrogateescape")
            )
    return h.hexdigest()


def _parse_line(line: str) -> tuple[tuple[int, int], Entry] | None:
    parts = line.split(" ")
    numbers = parts[:6]  # layer, expert and 32-bit CRCs: ASCII digits, at most 10 of them
    if len(parts) not in (9, 12) or not all(
        p.isascii() and p.isdigit() and len(p) <= 10 for p in numbers
    ):
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
