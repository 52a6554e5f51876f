"""The resume journal ``.<stem>.smoe.journal``: one line per finished expert under a
fingerprint of the run (see :mod:`smoe.sculpt`), and the check that adopts a journaled
blob only if the partial file and the sources bear out everything its line says.

The journal is a hint, never a source of truth: what a kept expert's manifest entry and
the summary record (blob CRC-32C, source CRC-32C, SNR, weighted SNR) is recomputed from
the partial file and the sources (:func:`keep_verified`), never copied from the line."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from smoe import __version__, quant
from smoe.errors import SmoeError
from smoe.format.manifest import checksum
from smoe.format.plan import ExpertSlot
from smoe.plumbing import fileio
from smoe.quant.replay import tensor_stats
from smoe.sculpt.expert_reader import ExpertReader
from smoe.sculpt.options import SculptOptions
from smoe.sculpt.provenance import tensor_entries
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef
from smoe.sculpt.workers import expert_importance
from smoe.vault.writer import VaultWriter

if TYPE_CHECKING:
    from smoe.sculpt.source.imatrix import ImportanceMatrix

__all__ = [
    "JOURNAL_MAGIC",
    "Entry",
    "Journal",
    "Resumed",
    "blob_stats",
    "fingerprint",
    "journal_limit",
    "keep_verified",
    "read_journal",
    "untouched",
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


@dataclass
class Resumed:
    """What :func:`keep_verified` found: the experts kept (their journal entries, every
    value in them recomputed from the partial file and the sources), the bytes of each
    kept expert's source matrices as quantised (what :func:`~smoe.sculpt.workers.quantise_expert`
    counts), and the experts whose journal line its blob contradicts (redone).

    >>> print(Resumed({}, {}, [(0, 1), (0, 2)]).warning)  # doctest: +NORMALIZE_WHITESPACE
    resume: redid 2 experts whose journal lines do not match their blobs in the partial file
    (an edited or damaged journal)
    >>> Resumed().warning is None
    True
    """

    kept: dict[tuple[int, int], Entry] = field(default_factory=dict)
    source_bytes: dict[tuple[int, int], int] = field(default_factory=dict)
    contradicted: list[tuple[int, int]] = field(default_factory=list)

    @property
    def warning(self) -> str | None:
        """The one warning line about the experts redone because their journal line lied
        about their blob (its CRC matched, but not what else the line says), or None.

        >>> print(Resumed({}, {}, [(1, 3)]).warning)  # doctest: +NORMALIZE_WHITESPACE
        resume: redid 1 expert whose journal line does not match its blob in the partial file
        (an edited or damaged journal)
        """
        n = len(self.contradicted)
        if not n:
            return None
        if n == 1:
            what = "1 expert whose journal line does not match its blob"
        else:
            what = f"{n} experts whose journal lines do not match their blobs"
        return f"resume: redid {what} in the partial file (an edited or damaged journal)"


_STALE, _CONTRADICTED, _KEPT = "stale", "contradicted", "kept"


def keep_verified(
    writer: VaultWriter,
    refs: list[ExpertRef],
    done: dict[tuple[int, int], Entry],
    threads: int,
    imatrix: ImportanceMatrix | None = None,
) -> Resumed:
    """Adopt each journaled expert whose blob, read back from the partial file, is what the
    journal says it is and was made from the sources as they are now; the rest are redone.
    ``imatrix``: the run's importance matrix (its journal lines carry weighted SNRs).

    The journal is a hint, never a source of truth. An expert is kept only if

    1. its blob's CRC-32C, recomputed from the partial file, is the journal's;
    2. none of its tensors is all zero bytes (packed codes and scales): the partial's
       untouched content. The encoder never writes that (a zero scale stores every code
       as ``2**(bits-1)``, :func:`smoe.quant.packing.floor_codes`), so no source encodes
       to it;
    3. the CRC-32C of its source bytes, re-read now, are the journal's;
    4. the SNR (and with an importance matrix the importance-weighted SNR) of every tensor,
       recomputed from the blob's codes and scales against the sources just read
       (:func:`blob_stats`), is the journal's value exactly: the recomputation repeats the
       encoder's arithmetic, so a journal line written by the run agrees to the last bit.

    The values kept are the recomputed ones. A line whose CRC matches but that fails 2 or 4
    (or whose SNR fields are not this run's kind) was edited or damaged: its expert is
    counted in :attr:`Resumed.contradicted`. Blobs and sources are read by ``threads``
    threads, each through its own buffers, in file order. Recomputing the SNR costs about
    what the encoder's code pass costs: no scale is searched and nothing is written.

    >>> import tempfile
    >>> from smoe.format.manifest import checksum
    >>> from smoe.sculpt.workers import Job, quantise_expert
    >>> ck = Checkpoint.open("fixtures/checkpoints/olmoe")
    >>> ref = ck.experts[(0, 0)]
    >>> w = VaultWriter(tempfile.mkdtemp() + "/m.smoe", ck.model_info(), version=1)
    >>> w.add_expert(0, 0, ref.shapes)
    >>> slot = w.begin().experts[0]
    >>> blob = np.zeros(slot.raw_size, np.uint8)
    >>> sources = tuple(checksum(a) for a, _ in ref.load())
    >>> job = Job(ref, slot, 4, "optimal")
    >>> key, crc, _, snrs, _, _, _ = quantise_expert(job, ref.load(), sources, blob)
    >>> hole = Entry(checksum(bytes(slot.raw_size)), sources, tuple(snrs))  # never written
    >>> keep_verified(w, [ref], {key: hole}, threads=1).contradicted
    [(0, 0)]
    >>> fd = os.open(w.partial_path, os.O_WRONLY); _ = os.pwrite(fd, blob, slot.byte_offset)
    >>> os.close(fd)
    >>> edited = Entry(crc, sources, (99.5, snrs[1], snrs[2]))
    >>> keep_verified(w, [ref], {key: edited}, threads=1).contradicted
    [(0, 0)]
    >>> stale = Entry(crc, (1, 2, 3), tuple(snrs))  # the sources changed since
    >>> keep_verified(w, [ref], {key: stale}, threads=1)
    Resumed(kept={}, source_bytes={}, contradicted=[])
    >>> resumed = keep_verified(w, [ref], {key: Entry(crc, sources, tuple(snrs))}, threads=1)
    >>> resumed.kept[key].snrs == tuple(snrs), resumed.source_bytes
    (True, {(0, 0): 24576})
    >>> w.abort()
    """
    by_key = {(r.layer, r.expert): r for r in refs}
    slots = {e.key: e for e in writer.plan.experts}
    candidates = sorted(
        (k for k in done if k in by_key),
        key=lambda k: min((str(p), o) for p, o, _ in by_key[k].ranges()),
    )
    threads = max(1, min(threads, len(candidates)))
    weighted = imatrix is not None
    path = writer.partial_path
    verdicts: dict[tuple[int, int], tuple[str, Entry | None, int]] = {}
    fd = _open_partial(writer)
    try:
        with ExpertReader(slots=threads) as reader, ThreadPoolExecutor(threads) as pool:

            def check(t: int) -> dict[tuple[int, int], tuple[str, Entry | None, int]]:
                """The verdicts on this thread's share of the candidates."""
                buf = np.empty(0, np.uint8)
                out: dict[tuple[int, int], tuple[str, Entry | None, int]] = {}
                for k in candidates[t::threads]:
                    slot = slots[k]
                    if buf.size < slot.raw_size:
                        buf = np.empty(slot.raw_size, np.uint8)
                    blob = buf[: slot.raw_size]
                    try:
                        fileio.preadv_exact(fd, blob, slot.byte_offset, path)
                    except SmoeError:
                        out[k] = (_STALE, None, 0)  # (the partial is shorter than planned)
                        continue
                    out[k] = _verdict(done[k], by_key[k], slot, blob, reader, t, writer, imatrix)
                return out

            for share in pool.map(check, range(threads)):
                verdicts.update(share)
    finally:
        os.close(fd)
    resumed = Resumed()
    for key in sorted(verdicts):
        verdict, entry, nbytes = verdicts[key]
        if verdict == _CONTRADICTED:
            resumed.contradicted.append(key)
        if entry is None:
            continue
        wsnrs = entry.weighted if weighted else None
        writer.adopt(
            *key, entry.blob, tensor_entries(by_key[key], entry.sources, entry.snrs, wsnrs)
        )
        resumed.kept[key] = entry
        resumed.source_bytes[key] = nbytes
    return resumed


def _open_partial(writer: VaultWriter) -> int:
    """The writer's partial file opened for reading, never through a link: the very file
    the writer holds (the same device and inode), or a SmoeError."""
    path = writer.partial_path
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise SmoeError(f"{path}: cannot open for reading: {e.strerror or e}") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != writer.partial_identity:
        os.close(fd)
        raise SmoeError(f"{path}: was replaced by another file while sculpting; refused")
    return fd


def _verdict(
    entry: Entry,
    ref: ExpertRef,
    slot: ExpertSlot,
    blob: np.ndarray,
    reader: ExpertReader,
    t: int,
    writer: VaultWriter,
    imatrix: ImportanceMatrix | None,
) -> tuple[str, Entry | None, int]:
    """Whether the journal's ``entry`` for ``ref`` holds for its ``blob`` as the partial
    has it (see :func:`keep_verified`): ``(verdict, the entry as recomputed if kept, source
    bytes)``; the sources are read into buffer ``t`` of ``reader``."""
    if checksum(blob) != entry.blob:
        return _STALE, None, 0
    if (entry.weighted is not None) != (imatrix is not None) or untouched(slot, blob):
        return _CONTRADICTED, None, 0
    mats, crcs = reader.read(ref, t)
    if crcs != entry.sources:
        return _STALE, None, 0
    importance = expert_importance(ref, imatrix)
    stats = blob_stats(slot, mats, writer.bits, writer.scale, blob, importance, entry)
    if stats is None:
        return _CONTRADICTED, None, 0
    snrs = tuple(s.finite_snr_db for s in stats)
    weighted = tuple(s.weighted_snr_db for s in stats) if imatrix is not None else None
    return _KEPT, Entry(entry.blob, crcs, snrs, weighted), ref.source_bytes


def untouched(slot: ExpertSlot, blob: np.ndarray) -> bool:
    """Whether a tensor of the ``blob`` (``uint8``) of ``slot`` is all zero bytes, codes and
    scales: what the partial file holds where nothing was written. The encoder never writes
    that: a zero scale (weights too small for fp16, or zeros) stores every code as
    ``2**(bits-1)``.

    >>> from smoe.format.plan import make_plan
    >>> from smoe.vault.writer import encode_blob
    >>> slot = make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, bits=4, version=2).experts[0]
    >>> untouched(slot, np.zeros(slot.raw_size, np.uint8))
    True
    >>> zeros = [np.zeros((32, 64)), np.zeros((32, 64)), np.zeros((64, 32))]
    >>> blob = np.frombuffer(encode_blob(slot, zeros, 4, "optimal"), np.uint8)
    >>> untouched(slot, blob), hex(blob[0])  # all-zero weights: scale 0, every code 8
    (False, '0x88')
    """
    for t in slot.tensors:
        spans = ((t.packed_offset, t.packed_size), (t.scales_offset, t.scales_size))
        if t.packed_size and not any(blob[o : o + n].any() for o, n in spans):
            return True
    return False


# ---- the SNR of a blob, recomputed -------------------------------------------------------------
def blob_stats(
    slot: ExpertSlot,
    mats: list[tuple[np.ndarray, str | None]],
    bits: int,
    scale: str,
    blob: np.ndarray,
    importance: list[np.ndarray | None] | None = None,
    expect: Entry | None = None,
) -> list[quant.QuantStats] | None:
    """Per tensor of the ``blob`` (``uint8``) of ``slot``, the signal and error power of its
    codes and scales against the source matrices ``mats`` (as
    :meth:`~smoe.sculpt.expert_reader.ExpertReader.read` gives them), weighted by
    ``importance`` (per tensor, or None), as the encoder computed them when it wrote the
    blob: the same error per weight, ``w - (code - c) * (scale / c)``, summed in the same
    order (:func:`smoe.quant.replay.tensor_stats`), so the SNR is the encoder's to the last
    bit. (Not the
    decoder's values: :func:`smoe.quant.decode` multiplies ``((code - c) / c) * scale``,
    which rounds differently in the last bit of some weights.)

    ``expect``: a journal entry; then a tensor whose SNR (or weighted SNR) is not the
    entry's is recomputed the other way (by the compiled encoder's order where numpy's was
    taken, or the reverse: the encoder falls back to numpy for some tensors, and
    ``$SMOE_KERNEL`` may have changed), and None is returned if it still differs.

    >>> from smoe.format.manifest import checksum
    >>> from smoe.format.plan import make_plan
    >>> from smoe.sculpt.workers import Job, quantise_expert
    >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe").experts[(0, 1)]
    >>> slot = make_plan({(0, 1): ref.shapes}, 4, 2).experts[0]
    >>> blob = np.zeros(slot.raw_size, np.uint8)
    >>> job = Job(ref, slot, 4, "optimal")
    >>> _, crc, srcs, snrs, _, _, _ = quantise_expert(job, ref.load(), (1, 2, 3), blob)
    >>> [s.finite_snr_db for s in blob_stats(slot, ref.load(), 4, "optimal", blob)] == snrs
    True
    >>> edited = Entry(crc, srcs, (99.5, *snrs[1:]))
    >>> blob_stats(slot, ref.load(), 4, "optimal", blob, expect=edited) is None
    True
    """
    out = []
    for i, (t, (w, src)) in enumerate(zip(slot.tensors, mats)):
        packed = blob[t.packed_offset : t.packed_offset + t.packed_size]
        scales = blob[t.scales_offset : t.scales_offset + t.scales_size]
        h = importance[i] if importance else None
        first = quant.fast_kernels(bits, scale, w.size) is not None
        stats = tensor_stats(w, src, bits, packed, scales, h, compiled=first)
        if expect is not None and not _agrees(stats, expect, i):
            if not first and not _compiled_available(bits, scale):  # (numpy's always is)
                return None
            stats = tensor_stats(w, src, bits, packed, scales, h, compiled=not first)
            if not _agrees(stats, expect, i):
                return None
        if stats is None:
            return None
        out.append(stats)
    return out


def _agrees(stats: quant.QuantStats | None, expect: Entry, i: int) -> bool:
    """Whether tensor ``i``'s recomputed SNR and weighted SNR are the journal entry's
    values, exactly (a journal value is the repr of a float: it reads back as that float;
    NaN agrees with nothing)."""
    if stats is None:
        return False
    weighted = expect.weighted[i] if expect.weighted is not None else None
    return stats.finite_snr_db == expect.snrs[i] and stats.weighted_snr_db == weighted


def _compiled_available(bits: int, scale: str) -> bool:
    """Whether the compiled encoder could have encoded a tensor at ``bits`` / ``scale``."""
    try:
        return quant.fast_kernels(bits, scale, kernel="fast") is not None
    except SmoeError:  # no numba
        return False
