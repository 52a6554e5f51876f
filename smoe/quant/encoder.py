"""The encoder: :func:`encode` and :func:`encode_into` (see :mod:`smoe.quant` for what they
compute), run chunk by chunk by the numpy reference or, when :mod:`~smoe.quant.dispatch`
says so, by the compiled kernels, which give the same bytes."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

import numpy as np

from smoe.quant.compiling import KernelCall, run_kernels
from smoe.quant.dispatch import chosen_module, fast_kernels
from smoe.quant.errors import UnrepresentableWeights, refusal
from smoe.quant.importance import ImportanceRuns, prepare_importance
from smoe.quant.inputs import bf16_to_f32, flat_source, read_chunk, source_kind
from smoe.quant.packing import floor_codes, pack_into
from smoe.quant.scales import choose_scales
from smoe.quant.stats import QuantStats
from smoe.quant.traits import (
    CHUNK_WEIGHTS,
    FAST_MIN_WEIGHTS,
    OK_BITS,
    Kernel,
    Overflow,
    ScaleMode,
    SrcDtype,
    check_bits,
    level_center,
)
from smoe_gen.layout import GROUP_SIZE, num_groups, packed_size

__all__ = ["encode", "encode_into", "encoder_kernels", "prepare_fast"]


def encode(
    weights: np.ndarray,
    bits: int,
    scale: ScaleMode = "optimal",
    *,
    src_dtype: SrcDtype | None = None,
    chunk_weights: int = CHUNK_WEIGHTS,
    overflow: Overflow = "clip",
    kernel: Kernel | None = None,
    importance: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Quantise ``weights`` (any shape, flattened row-major) to SMOE-Q``bits``.

    ``weights``: float32 / float16 (any real float) array, or raw bfloat16 bits as a
    ``uint16`` array with ``src_dtype="bf16"`` (``"f16"`` reads ``uint16`` as fp16 bits).
    ``scale``: ``"optimal"`` (least squared error) or ``"absmax"`` (reference).
    ``overflow``: ``"clip"`` scales above 65504 to 65504, or ``"raise"``
    :class:`~smoe.quant.errors.ScaleOverflow` for any ``|w| > 65504``. ``kernel``:
    ``"auto"``, ``"numpy"`` or ``"fast"`` (default ``$SMOE_KERNEL`` or auto; see
    :mod:`smoe.quant`).
    ``importance``: one non-negative value per column (``weights.shape[-1]``), e.g. the mean
    square of each input channel (:mod:`smoe.sculpt.source.imatrix`): ``optimal`` scales then
    minimise the error weighted by it, ``sum(imp[col] * (w - w_hat)^2)`` (see
    :mod:`smoe.quant`); uniform importance (or None) gives the plain encoding, byte for byte.
    Returns ``(packed, scales)``: ``uint8[packed_size(n, bits)]`` and little-endian
    ``float16[num_groups(n)]``. Raises :class:`~smoe.quant.errors.NonFiniteWeights` (a
    ``SmoeError`` and a ``ValueError``) on inf/nan weights.

    >>> import numpy as np
    >>> from smoe.quant import decode, snr_db
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> packed, scales = encode(w, 4)
    >>> packed.nbytes, scales  # 4 bits per weight; one fp16 scale per group of 64
    (64, array([0.9604, 0.9604], dtype=float16))
    >>> round(snr_db(w, decode(packed, scales, 4, w.shape)), 1)
    24.0
    >>> imp = np.r_[np.ones(32), np.full(32, 100.0)]  # the right half's inputs are larger
    >>> packed, scales = encode(w, 4, importance=imp)
    >>> round(snr_db(w, decode(packed, scales, 4, w.shape)), 1)  # plain error: worse
    19.2
    """
    n = np.asarray(weights).size
    packed = np.empty(packed_size(n, bits), np.uint8)
    scales = np.empty(num_groups(n), np.dtype("<f2"))
    encode_into(
        weights,
        bits,
        packed,
        scales,
        scale,
        src_dtype=src_dtype,
        chunk_weights=chunk_weights,
        overflow=overflow,
        kernel=kernel,
        importance=importance,
    )
    return packed, scales


def encode_into(
    weights: np.ndarray,
    bits: int,
    packed_out: np.ndarray,
    scales_out: np.ndarray,
    scale: ScaleMode = "optimal",
    *,
    src_dtype: SrcDtype | None = None,
    chunk_weights: int = CHUNK_WEIGHTS,
    stats: QuantStats | None = None,
    overflow: Overflow = "clip",
    kernel: Kernel | None = None,
    importance: np.ndarray | None = None,
) -> None:
    """Quantise ``weights`` into caller buffers (e.g. slices of a memory-mapped blob).

    ``packed_out``: writable ``uint8`` array of ``packed_size(n, bits)`` bytes.
    ``scales_out``: writable array of ``num_groups(n)`` fp16 values, or ``uint8`` of
    ``scales_size(n)`` bytes (stored little-endian; alignment does not matter).
    ``stats``: if given, accumulates the signal and the quantisation error (the decoded
    value of every code, computed in the same pass), so ``stats.snr_db`` equals
    ``snr_db(w, decode(...))`` without decoding; with ``importance`` also the
    importance-weighted powers (``stats.weighted_snr_db``).
    See :func:`encode` for the other arguments. Working memory is ``O(chunk_weights)``
    (plus the importance's columns).

    >>> import numpy as np
    >>> from smoe.quant import QuantStats, packed_size, scales_size
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> blob = np.zeros(packed_size(w.size, 4) + scales_size(w.size), np.uint8)
    >>> stats = QuantStats()
    >>> encode_into(w, 4, blob[:64], blob[64:], stats=stats)  # packed, then the scales' bytes
    >>> blob[64:].view("<f2"), round(stats.snr_db, 1)
    (array([0.9604, 0.9604], dtype=float16), 24.0)
    """
    job = _encoding(
        weights,
        bits,
        packed_out,
        scales_out,
        scale,
        src_dtype,
        chunk_weights,
        stats,
        overflow,
        importance,
    )
    if job is None:
        return
    fast = fast_kernels(bits, scale, job.src.size, kernel)
    if fast is not None and _encode_fast(fast, job):
        return
    _encode_reference(job)


def prepare_fast(bits: int, scale: ScaleMode = "optimal", *, importance: bool = False) -> bool:
    """Compile (or load from the disk cache) the compiled encoder for ``bits`` / ``scale``
    (and with ``importance``, its weighted form too) now if large tensors will use it;
    whether they will. Call it before forking workers: they then inherit the compiled code
    instead of each compiling or loading it. A compile says so first (the notices of
    :func:`smoe.quant.compiling.run_kernels`).

    >>> import os
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"SMOE_KERNEL": "numpy"}):  # the numpy encoder only
    ...     prepare_fast(4)
    False
    """
    calls = encoder_kernels(bits, scale, importance=importance)
    if not calls:
        return False
    run_kernels(calls)
    return fast_kernels(bits, scale) is not None


def encoder_kernels(
    bits: int,
    scale: ScaleMode = "optimal",
    *,
    importance: bool = False,
    kernel: Kernel | None = None,
) -> list[KernelCall]:
    """The compiled encoder's kernels that large tensors at ``bits`` / ``scale`` run (with
    ``importance`` the weighted ones too: a sculpt with ``--imatrix`` runs both), each as a
    call that compiles or loads it (:class:`~smoe.quant.compiling.KernelCall`), in the
    order :func:`prepare_fast` runs them; none where numpy encodes large tensors
    (``kernel``, default ``$SMOE_KERNEL``, or a run's choice; or no numba).

    >>> import os
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"SMOE_KERNEL": "numpy"}):
    ...     encoder_kernels(4)
    []
    >>> names = [k.name for k in encoder_kernels(2, importance=True, kernel="auto")]
    >>> names or ["encode Q2 optimal", "encode Q2 optimal weighted"]  # (without numba: none)
    ['encode Q2 optimal', 'encode Q2 optimal weighted']
    """
    _check_modes(bits, scale, "clip", CHUNK_WEIGHTS)
    qk = chosen_module("encode", FAST_MIN_WEIGHTS, kernel)
    if qk is None:
        return []
    calls = []
    if bits == 4 and scale == "optimal":  # fast_kernels checks numpy's einsum first
        calls.append(
            KernelCall(
                "einsum order check (Q4 optimal)",
                partial(fast_kernels, 4, "optimal", kernel="fast"),
                qk.einsum_check_cached,
            )
        )
    for weighted in (False, True) if importance else (False,):
        name = "encode " + (f"Q{bits} optimal" if scale == "optimal" else "absmax")
        calls.append(
            KernelCall(
                name + (" weighted" if weighted else ""),
                partial(_encode_samples, bits, scale, weighted),
                partial(_samples_cached, qk, bits, scale, weighted),
            )
        )
    return calls


def _samples(bits: int, scale: str, weighted: bool) -> list[_Encoding]:
    """The encodings of two small samples, two groups of bfloat16 bits and two groups and
    one weight of float32, that run the kernel large tensors of either kind run (one
    compiled function: whether the words are float32 is an argument)."""
    jobs = []
    for n, dtype, kind in (
        (GROUP_SIZE * 2, np.uint16, "bf16"),
        (GROUP_SIZE * 2 + 1, np.float32, None),
    ):
        imp = np.arange(n, dtype=np.float32) if weighted else None
        packed, scales = np.empty(packed_size(n, bits), np.uint8), np.empty(num_groups(n), "<f2")
        w = np.zeros(n, dtype)
        job = _encoding(w, bits, packed, scales, scale, kind, CHUNK_WEIGHTS, None, "clip", imp)
        assert job is not None
        jobs.append(job)
    return jobs


def _encode_samples(bits: int, scale: str, weighted: bool) -> None:
    """Encode the :func:`_samples` with the compiled encoder (compiling or loading it)."""
    for job in _samples(bits, scale, weighted):
        fast = fast_kernels(bits, scale, job.src.size, "fast")
        if fast is not None:  # (None: Q4 optimal, where numpy's einsum sums otherwise)
            _encode_fast(fast, job)


def _samples_cached(qk: ModuleType, bits: int, scale: str, weighted: bool) -> bool | None:
    """Whether the compiled encoder would find its code for the :func:`_samples` (in this
    process or numba's disk cache); nothing is compiled, loaded or encoded."""
    probe = _CacheProbe(qk)
    for job in _samples(bits, scale, weighted):
        _encode_fast(probe, job)
    if None in probe.found:
        return None
    return all(probe.found)


class _CacheProbe:
    """Stands in for the kernels module ``qk`` in :func:`_encode_fast`: each chunk only asks
    whether its kernel is compiled (``found``); nothing is encoded."""

    def __init__(self, qk: ModuleType) -> None:
        self.qk = qk
        self.REFUSED, self.NEEDS_REFERENCE = qk.REFUSED, qk.NEEDS_REFERENCE
        self.found: list[bool | None] = []

    def encode_chunk(self, *args: Any) -> int:
        self.found.append(self.qk.encode_chunk_cached(*args))
        return int(self.qk.OK)


# ---------------------------------------------------------------------------- arguments


def _check_modes(bits: int, scale: str, overflow: str, chunk_weights: int) -> None:
    """Refuse a bit width, scale mode, overflow mode or chunk size :func:`encode_into`
    does not take."""
    check_bits(bits)
    if scale not in ("optimal", "absmax"):
        raise ValueError(f"scale must be 'optimal' or 'absmax', got {scale!r}")
    if overflow not in OK_BITS:
        raise ValueError(f"overflow must be 'clip' or 'raise', got {overflow!r}")
    if chunk_weights <= 0 or chunk_weights % GROUP_SIZE:
        raise ValueError(f"chunk_weights must be a positive multiple of {GROUP_SIZE}")


def _encoding(
    weights: np.ndarray,
    bits: int,
    packed_out: np.ndarray,
    scales_out: np.ndarray,
    scale: str,
    src_dtype: str | None,
    chunk_weights: int,
    stats: QuantStats | None,
    overflow: str,
    importance: np.ndarray | None,
) -> _Encoding | None:
    """:func:`encode_into`'s arguments checked and flattened into one encoding (None: no
    weights)."""
    _check_modes(bits, scale, overflow, chunk_weights)
    weights = np.asarray(weights)
    kind = source_kind(weights, src_dtype)
    n = weights.size
    packed = _out_view(packed_out, np.uint8, packed_size(n, bits), "packed_out")
    scales = _out_view(scales_out, np.dtype("<f2"), num_groups(n), "scales_out")
    src = flat_source(weights, kind)
    prepared = prepare_importance(importance, weights.shape)
    if n == 0:
        return None
    chunk = min(chunk_weights, num_groups(n) * GROUP_SIZE)
    runs = None if prepared is None else ImportanceRuns(*prepared, chunk)
    return _Encoding(
        src, kind, weights.shape, bits, scale, packed, scales, stats, overflow, chunk, runs
    )


def _out_view(arr: np.ndarray, dtype: np.dtype | type, count: int, name: str) -> np.ndarray:
    """Validate an output buffer and return it as a flat array of ``count`` ``dtype``."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name} must be a numpy array")
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        raise ValueError(f"{name} must be writable and C-contiguous")
    flat = arr.reshape(-1)
    dtype = np.dtype(dtype)
    if flat.dtype == np.uint8 and dtype != np.uint8:
        if flat.size != count * dtype.itemsize:
            raise ValueError(f"{name} has {flat.size} bytes, need {count * dtype.itemsize}")
        return flat.view(dtype)
    if flat.dtype.kind != np.dtype(dtype).kind or flat.dtype.itemsize != dtype.itemsize:
        raise TypeError(f"{name} must be {dtype} (or uint8 bytes), got {flat.dtype}")
    if flat.size != count:
        raise ValueError(f"{name} has {flat.size} elements, need {count}")
    return flat


@dataclass
class _Encoding:
    """One :func:`encode_into` call on validated, flattened arguments: the input ``src``
    (read as ``kind``, of ``shape``), the output views ``packed`` and ``scales`` (fp16),
    ``chunk`` weights at a time, and the importance ``runs`` (None: none)."""

    src: np.ndarray
    kind: str
    shape: tuple[int, ...]
    bits: int
    scale: str
    packed: np.ndarray
    scales: np.ndarray
    stats: QuantStats | None
    overflow: str
    chunk: int
    runs: ImportanceRuns | None

    @property
    def unit(self) -> float:
        """The unit of the importance (its maximum; 1 without), for the weighted stats."""
        return self.runs.top if self.runs is not None else 1.0

    def refused(self) -> UnrepresentableWeights:
        """The error of weights the format cannot hold, counted over the whole input."""
        return refusal(self.src, self.kind, self.shape, self.bits, self.overflow, self.chunk)


# ---------------------------------------------------------------------------- numpy


def _encode_reference(job: _Encoding) -> None:
    """The numpy encoder: chunk by chunk, its whole groups and then (at the end) the
    partial last group."""
    n = job.src.size
    buf, work, aux = (np.empty(job.chunk, np.float32) for _ in range(3))
    codes = np.empty(job.chunk, np.uint8)
    for start in range(0, n, job.chunk):
        stop = min(start + job.chunk, n)
        flat = read_chunk(job.src, job.kind, start, stop, buf)
        full = (stop - start) // GROUP_SIZE * GROUP_SIZE
        for lo, hi in ((0, full), (full, stop - start)):
            if hi > lo:
                _encode_run(job, flat[lo:hi], start + lo, work[: hi - lo], aux[: hi - lo], codes)


def _encode_run(
    job: _Encoding, w: np.ndarray, at: int, work: np.ndarray, aux: np.ndarray, codes: np.ndarray
) -> None:
    """Encode the weights ``w`` from flat index ``at`` (whole groups, or the partial last
    group) into ``job``'s outputs; ``work``, ``aux``: float32 scratch of ``w.size``,
    ``codes``: uint8 scratch of at least as many."""
    g = w.reshape(-1, min(w.size, GROUP_SIZE))
    f = work.reshape(g.shape)
    scratch = aux.reshape(g.shape)
    h = None if job.runs is None else job.runs.run(at, at + w.size).reshape(g.shape)
    s = _encode_groups(g, job.bits, job.scale, f, scratch, OK_BITS[job.overflow], h)
    if s is None:
        raise job.refused() from None
    stored = job.scales[at // GROUP_SIZE : at // GROUP_SIZE + len(s)]
    stored[...] = s
    if job.stats is not None:
        _add_error(job.stats, g, f, stored, job.bits, scratch, h, job.unit)
    nbytes = -(-w.size * job.bits // 8)
    pack_into(f, job.bits, job.packed[at * job.bits // 8 :][:nbytes], codes)


def _encode_groups(
    g: np.ndarray,
    bits: int,
    scale: str,
    work: np.ndarray,
    aux: np.ndarray,
    limit: int,
    h: np.ndarray | None = None,
) -> np.ndarray | None:
    """Choose fp16 scales for the groups (rows) of ``g``; leave ``codes - 2**(bits-1)`` in
    ``work`` and return the scales as float32. ``work``, ``aux``: scratch shaped like ``g``;
    ``h``: importance shaped like ``g`` (only ``optimal`` uses it), or None.
    ``None`` when a group's absmax, as a float32 bit pattern, exceeds ``limit``."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = choose_scales(g, bits, scale, work, aux, limit, h)
        if s is None:
            return None
        floor_codes(g, s, bits, work)
    return s


def _add_error(
    stats: QuantStats,
    g: np.ndarray,
    f: np.ndarray,
    stored: np.ndarray,
    bits: int,
    err: np.ndarray,
    h: np.ndarray | None,
    unit: float,
) -> None:
    """Add the groups ``g`` and their errors to ``stats``: ``code - c = f + 0.5``, so the
    decoded value is ``(f + 0.5) * s / c`` with ``s`` the ``stored`` fp16 scale. ``err``:
    scratch shaped like ``g``."""
    np.add(f, np.float32(0.5), out=err)
    err *= (stored.astype(np.float32) / np.float32(level_center(bits)))[:, None]
    np.subtract(g, err, out=err)
    stats.add(g, err, h, unit)


# ---------------------------------------------------------------------------- compiled


def _encode_fast(qk: ModuleType | _CacheProbe, job: _Encoding) -> bool:
    """:func:`encode_into` with the compiled kernels ``qk`` (or a :class:`_CacheProbe`);
    False (nothing counted in ``stats``) when a Q2 optimum exceeds 65504, which only the
    reference encoder clips."""
    n = job.src.size
    words_of_bf16 = job.kind == "bf16" and job.src.ndim == 1 and job.src.flags.c_contiguous
    buf = None if words_of_bf16 else np.empty(job.chunk, np.float32)
    chunk_scales = np.empty(job.chunk // GROUP_SIZE, np.float32)
    sums = np.zeros(4 if job.runs is None else 6)
    for start in range(0, n, job.chunk):
        stop = min(start + job.chunk, n)
        full = (stop - start) // GROUP_SIZE * GROUP_SIZE
        words, tail = _chunk_words(job, start, stop, full, buf)
        groups = num_groups(stop - start)
        p0 = start * job.bits // 8
        status = qk.encode_chunk(
            words,
            not words_of_bf16,
            tail,
            job.bits,
            job.scale == "optimal",
            OK_BITS[job.overflow],
            job.packed[p0 : p0 + packed_size(stop - start, job.bits)],
            chunk_scales[:groups],
            sums,
            None
            if job.runs is None
            else (job.runs.h, start % job.runs.cols, job.runs.run(start + full, stop)),
        )
        if status == qk.REFUSED:
            raise job.refused() from None
        if status == qk.NEEDS_REFERENCE:
            return False
        g0 = start // GROUP_SIZE
        job.scales[g0 : g0 + groups] = chunk_scales[:groups]
    if job.stats is not None:
        job.stats.add_sums(n, sums, job.unit)
    return True


def _chunk_words(
    job: _Encoding, start: int, stop: int, full: int, buf: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Weights ``start:stop`` as the kernels take them: the ``full`` weights of whole groups
    as uint64 words (bfloat16 bits read in place when ``buf`` is None, else float32 read
    into ``buf``), and the rest (the partial last group) as float32."""
    if buf is None:
        part = job.src[start:stop]
        tail = bf16_to_f32(part[full:])
    else:
        part = read_chunk(job.src, job.kind, start, stop, buf)
        tail = part[full:]
    words = part[:full].view(np.uint64)
    if not words.flags.aligned:
        words = words.copy()
    return words, tail
