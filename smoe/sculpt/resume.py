"""The resume verdict: a journaled blob is adopted only if the partial file and the sources
bear out everything its line says (:mod:`smoe.sculpt.journal`).

What a kept expert's manifest entry and the summary record (blob CRC-32C, source CRC-32C,
SNR, weighted SNR) is recomputed from the partial file and the sources (:func:`keep_verified`),
never copied from the line; the SNR by the encoder's own arithmetic
(:func:`smoe.quant.replay.tensor_stats`)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from smoe import quant
from smoe.errors import SmoeError
from smoe.format.manifest import checksum
from smoe.format.plan import ExpertSlot
from smoe.plumbing import fileio
from smoe.quant.replay import tensor_stats
from smoe.sculpt.expert_reader import ExpertReader
from smoe.sculpt.provenance import tensor_entries
from smoe.sculpt.source.checkpoint import ExpertRef
from smoe.sculpt.workers import expert_importance
from smoe.vault.writer import VaultWriter

if TYPE_CHECKING:
    from smoe.sculpt.source.imatrix import ImportanceMatrix
from smoe.sculpt.journal import Entry

__all__ = ["Resumed", "blob_stats", "keep_verified", "untouched"]


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
    >>> from smoe.sculpt.source.checkpoint import Checkpoint
    >>> ck = Checkpoint.open("fixtures/checkpoints/olmoe")
    >>> ref = ck.experts[(0, 0)]
    >>> w = VaultWriter(tempfile.mkdtemp() + "/m.smoe", ck.model_info(), version=1)
    >>> w.add_expert(0, 0, ref.shapes)
    >>> slot = w.begin().experts[0]
    >>> blob = np.zeros(slot.raw_size, np.uint8)
    >>> sources = tuple(checksum(a) for a, _ in ref.load())
    >>> job = Job(ref, slot, 4, "optimal")
    >>> o = quantise_expert(job, ref.load(), sources, blob)
    >>> key, crc, snrs = o.key, o.blob_crc, list(o.snrs)
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
    verdicts: dict[tuple[int, int], _Verdict] = {}
    fd = _open_partial(writer)
    try:
        with ExpertReader(slots=threads) as reader, ThreadPoolExecutor(threads) as pool:

            def check(t: int) -> dict[tuple[int, int], _Verdict]:
                """The verdicts on this thread's share of the candidates."""
                buf = np.empty(0, np.uint8)
                out: dict[tuple[int, int], _Verdict] = {}
                for k in candidates[t::threads]:
                    slot = slots[k]
                    if buf.size < slot.raw_size:
                        buf = np.empty(slot.raw_size, np.uint8)
                    blob = buf[: slot.raw_size]
                    try:
                        fileio.preadv_exact(fd, blob, slot.byte_offset, path)
                    except SmoeError:
                        out[k] = _Verdict(_STALE)  # (the partial is shorter than planned)
                        continue
                    out[k] = _verdict(done[k], by_key[k], slot, blob, reader, t, writer, imatrix)
                return out

            for share in pool.map(check, range(threads)):
                verdicts.update(share)
    finally:
        os.close(fd)
    resumed = Resumed()
    for key in sorted(verdicts):
        verdict = verdicts[key]
        if verdict.verdict == _CONTRADICTED:
            resumed.contradicted.append(key)
        entry = verdict.entry
        if entry is None:
            continue
        shown = weighted and entry.weighted is not None
        writer.adopt(*key, entry.blob, tensor_entries(by_key[key], entry.tensors, shown))
        resumed.kept[key] = entry
        resumed.source_bytes[key] = verdict.source_bytes
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


@dataclass(frozen=True)
class _Verdict:
    """The verdict on one journal line (kept, stale or contradicted) and, kept, the entry
    as recomputed and the bytes of the sources read to verify it."""

    verdict: str
    entry: Entry | None = None
    source_bytes: int = 0


def _verdict(
    entry: Entry,
    ref: ExpertRef,
    slot: ExpertSlot,
    blob: np.ndarray,
    reader: ExpertReader,
    t: int,
    writer: VaultWriter,
    imatrix: ImportanceMatrix | None,
) -> _Verdict:
    """Whether the journal's ``entry`` for ``ref`` holds for its ``blob`` as the partial
    has it (see :func:`keep_verified`); the sources are read into buffer ``t`` of
    ``reader``."""
    if checksum(blob) != entry.blob:
        return _Verdict(_STALE)
    if (entry.weighted is not None) != (imatrix is not None) or untouched(slot, blob):
        return _Verdict(_CONTRADICTED)
    mats, crcs = reader.read(ref, t)
    if crcs != entry.sources:
        return _Verdict(_STALE)
    importance = expert_importance(ref, imatrix)
    stats = blob_stats(slot, mats, writer.bits, writer.scale, blob, importance, entry)
    if stats is None:
        return _Verdict(_CONTRADICTED)
    snrs = tuple(s.finite_snr_db for s in stats)
    weighted = tuple(s.weighted_snr_db for s in stats) if imatrix is not None else None
    kept = Entry(blob=entry.blob, sources=crcs, snrs=snrs, weighted=weighted)
    return _Verdict(_KEPT, kept, ref.source_bytes)


def untouched(slot: ExpertSlot, blob: np.ndarray) -> bool:
    """Whether a tensor of the ``blob`` (``uint8``) of ``slot`` is all zero bytes, codes and
    scales: what the partial file holds where nothing was written. The encoder never writes
    that: a zero scale (weights too small for fp16, or zeros) stores every code as
    ``2**(bits-1)``.

    >>> from smoe.format.plan import make_plan
    >>> from smoe.vault.blob import MatrixInput, encode_blob
    >>> slot = make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, bits=4, version=2).experts[0]
    >>> untouched(slot, np.zeros(slot.raw_size, np.uint8))
    True
    >>> zeros = [np.zeros((32, 64)), np.zeros((32, 64)), np.zeros((64, 32))]
    >>> blob = np.frombuffer(encode_blob(slot, MatrixInput.each(zeros), 4, "optimal"), np.uint8)
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
    >>> from smoe.sculpt.source.checkpoint import Checkpoint
    >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe").experts[(0, 1)]
    >>> slot = make_plan({(0, 1): ref.shapes}, 4, 2).experts[0]
    >>> blob = np.zeros(slot.raw_size, np.uint8)
    >>> job = Job(ref, slot, 4, "optimal")
    >>> o = quantise_expert(job, ref.load(), (1, 2, 3), blob)
    >>> crc, srcs, snrs = o.blob_crc, o.sources, list(o.snrs)
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
