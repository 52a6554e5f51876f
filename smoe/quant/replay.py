"""The statistics an encoder gathered, recomputed from the codes and scales it wrote.

A resumed sculpt keeps a journaled expert only if its blob gives back the SNR the journal
recorded; :func:`tensor_stats` replays the encoder's own float32 arithmetic over the stored
codes and scales, in the numpy encoder's order or, with ``compiled``, the compiled one's
(:func:`smoe.quant.kernels.encode.replay_chunk`, beside the kernel it follows).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from smoe.quant.importance import ImportanceRuns, prepare_importance
from smoe.quant.inputs import bf16_to_f32, flat_source, read_chunk, source_kind
from smoe.quant.stats import QuantStats
from smoe.quant.traits import CHUNK_WEIGHTS, level_center
from smoe_gen.layout import GROUP_SIZE, num_groups, packed_size

__all__ = ["tensor_stats"]


@dataclass(frozen=True)
class _Stored:
    """One tensor's source (``src`` read as ``kind``, ``n`` weights), the codes and fp16
    scales stored for it, and the encoder's importance runs and chunk length."""

    src: np.ndarray
    kind: str
    n: int
    bits: int
    packed: np.ndarray
    fp16: np.ndarray
    runs: ImportanceRuns | None
    chunk: int


def tensor_stats(
    weights: np.ndarray,
    src_dtype: str | None,
    bits: int,
    packed: np.ndarray,
    scales: np.ndarray,
    importance: np.ndarray | None = None,
    compiled: bool = False,
) -> QuantStats | None:
    """The :class:`~smoe.QuantStats` that :func:`smoe.quant.encode_into` gathered when
    it encoded ``weights`` (read as ``src_dtype``, with per-column ``importance``) into the
    codes ``packed`` and fp16 ``scales`` (their ``uint8`` bytes), recomputed from those codes
    and scales: chunk by chunk and run by run in the numpy encoder's float32 arithmetic, or
    with ``compiled`` in the compiled encoder's lanes and tiles (its own routines, given the
    stored scales: no scale is searched). None when, ``compiled``, a code is not the nearest
    level of its stored scale (then the compiled encoder did not write these codes).

    >>> from smoe import quant
    >>> w = np.linspace(-1, 1, 130, dtype=np.float32)  # two groups and two weights
    >>> stats = QuantStats()
    >>> packed, scales = np.empty(65, np.uint8), np.empty(3, "<f2")
    >>> quant.encode_into(w, 4, packed, scales, stats=stats, kernel="numpy")
    >>> tensor_stats(w, None, 4, packed, scales.view(np.uint8)).snr_db == stats.snr_db
    True
    """
    kind = source_kind(weights, src_dtype)
    n = weights.size
    src = flat_source(weights, kind)
    prepared = prepare_importance(importance, weights.shape)
    stats = QuantStats()
    if n == 0:
        return stats
    chunk = min(CHUNK_WEIGHTS, num_groups(n) * GROUP_SIZE)
    runs = None if prepared is None else ImportanceRuns(*prepared, chunk)
    fp16 = np.ascontiguousarray(scales).view("<f2")
    if packed.size != packed_size(n, bits) or fp16.size != num_groups(n):
        return None
    stored = _Stored(src, kind, n, bits, packed, fp16, runs, chunk)
    if compiled:
        sums = _compiled_sums(stored)
        if sums is None:
            return None
        stats.add_sums(n, sums, runs.top if runs is not None else 1.0)
    else:
        _reference_sums(stored, stats)
    return stats


def _reference_sums(t: _Stored, stats: QuantStats) -> None:
    """:func:`tensor_stats` as the numpy encoder sums (``smoe.quant.encoder._encode_run``):
    per chunk its whole groups, then the partial last group, each run's error
    ``w - (f + 0.5) * (scale / c)`` in float32 (``f + 0.5 = code - c``), added to
    ``stats`` with the run's importance."""
    src, kind, n, bits = t.src, t.kind, t.n, t.bits
    packed, fp16, runs, chunk = t.packed, t.fp16, t.runs, t.chunk
    levels = _code_levels(bits)
    c = np.float32(level_center(bits))
    unit = runs.top if runs is not None else 1.0
    buf, err = np.empty(chunk, np.float32), np.empty(chunk, np.float32)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        flat = read_chunk(src, kind, start, stop, buf)
        full = (stop - start) // GROUP_SIZE * GROUP_SIZE
        for lo, hi in ((0, full), (full, stop - start)):
            if hi <= lo:
                continue
            at, m = start + lo, hi - lo
            p0 = at * bits // 8
            v = levels[packed[p0 : p0 + -(-m * bits // 8)]].reshape(-1)[:m]
            g0 = at // GROUP_SIZE
            k = fp16[g0 : g0 + num_groups(m)].astype(np.float32) / c
            e = err[:m]
            width = min(m, GROUP_SIZE)
            np.multiply(v.reshape(-1, width), k[:, None], out=e.reshape(-1, width))
            np.subtract(flat[lo:hi], e, out=e)
            stats.add(flat[lo:hi], e, None if runs is None else runs.run(at, at + m), unit)


_LEVELS: dict[int, np.ndarray] = {}


def _code_levels(bits: int) -> np.ndarray:
    """``table[byte, j]`` = ``code - c`` of field ``j`` of ``byte`` (half-integers, exact in
    float32; the encoder's ``f + 0.5``).

    >>> _code_levels(2)[0b11100100].tolist()  # codes 0, 1, 2, 3
    [-1.5, -0.5, 0.5, 1.5]
    """
    if bits not in _LEVELS:
        per = 8 // bits
        codes = (np.arange(256)[:, None] >> (bits * np.arange(per))) & ((1 << bits) - 1)
        _LEVELS[bits] = (codes - level_center(bits)).astype(np.float32)
    return _LEVELS[bits]


def _compiled_sums(t: _Stored) -> np.ndarray | None:
    """:func:`tensor_stats` as the compiled encoder sums (``smoe.quant.encoder._encode_fast``):
    the same chunks, handed to :func:`smoe.quant.kernels.encode.replay_chunk` as the encoder hands
    them to ``encode_chunk``; the sums, or None if a code differs."""
    src, kind, n, bits = t.src, t.kind, t.n, t.bits
    packed, fp16, runs, chunk = t.packed, t.fp16, t.runs, t.chunk
    replay = _compiled_replay()
    words_of_bf16 = kind == "bf16" and src.ndim == 1 and src.flags.c_contiguous
    buf = None if words_of_bf16 else np.empty(chunk, np.float32)
    sums = np.zeros(4 if runs is None else 6)
    scales32 = fp16.astype(np.float32)  # exact: what the encoder chose, then stored
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        full = (stop - start) // GROUP_SIZE * GROUP_SIZE
        if buf is None:
            part = src[start:stop]
            tail = bf16_to_f32(part[full:])
        else:
            part = read_chunk(src, kind, start, stop, buf)
            tail = part[full:]
        words = part[:full].view(np.uint64)
        if not words.flags.aligned:
            words = words.copy()
        g0, p0 = start // GROUP_SIZE, start * bits // 8
        hcols, c0, htail = (
            (None, 0, None)
            if runs is None
            else (
                runs.h,
                start % runs.cols,
                runs.run(start + full, stop),
            )
        )
        ok = replay(
            words,
            buf is not None,
            tail,
            hcols,
            c0,
            htail,
            bits,
            packed[p0 : p0 + packed_size(stop - start, bits)],
            scales32[g0 : g0 + num_groups(stop - start)],
            sums,
        )
        if not ok:
            return None
    return sums


_REPLAY: list[Any] = []
_REPLAY_LOCK = threading.Lock()


def _compiled_replay() -> Any:
    """:func:`smoe.quant.kernels.encode.replay_chunk` (numba needed), imported once per
    process (numba compiles it, or loads it from its disk cache, on its first call)."""
    with _REPLAY_LOCK:
        if not _REPLAY:
            from smoe.quant.kernels.encode import replay_chunk

            _REPLAY.append(replay_chunk)
    return _REPLAY[0]
