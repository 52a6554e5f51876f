"""SMOE-Q2/Q4 group quantisation: encode and decode (ruling D2).

A tensor is flattened row-major; every run of ``GROUP_SIZE`` weights (the last run may be
partial) shares one IEEE binary16 scale, and weight ``i`` is stored as a ``bits``-wide
code, packed LSB-first. Decoding is fixed by the format::

    w = (code - c) / c * scale,    c = (2**bits - 1) / 2

The encoder chooses the scales. ``scale="absmax"`` stores each group's absolute maximum
rounded to fp16 (clipped to the largest finite fp16), as the reference Sculptor did for
Q4. ``scale="optimal"`` (the default) aims at the least squared error per group:

* Q4: codes are computed for two candidate scales, ``0.96`` and ``0.89`` times the fp16
  absmax. Each code set gives, from two row sums, the exact error at its own scale and an
  upper bound of the error at any other scale, hence also its least-squares scale. Those
  scales and the absmax itself, rounded to fp16, are scored and the best kept. On
  normal-like weights that is ~0.5 dB better than absmax and within ~0.07 dB of a dense
  search over all fp16 scales. Choosing by bounds, about one group in ten ends up a
  little (up to ~20%) worse than with absmax; the total error is ~11% lower.
* Q2: every code assignment a scale can produce splits a group's sorted magnitudes into
  an inner (``|level| = 1/3``) and an outer (``|level| = 1``) part. All
  ``GROUP_SIZE + 1`` splits are scored in closed form from prefix sums and the best one's
  least-squares scale kept: the exact optimum, then rounded to fp16. Never worse than the
  reference 64-candidate grid search or absmax, beyond that rounding.

With ``importance`` (one value ``h_c >= 0`` per column, e.g. the mean square of each input
channel from a llama.cpp importance matrix, :mod:`smoe.sculpt.source.imatrix`), ``optimal``
minimises the weighted error ``sum(h_c (w - w_hat)^2)`` per group instead, the error of the output
``W x``
for inputs with those mean squares. The importance is divided by its maximum and rounded
to bfloat16 precision (8 significant bits, far finer than any calibration resolves it).

* Q2: the exact weighted optimum. The splits are the same; sorted with their importance
  (ties in ``|w|`` broken by it), split ``k`` scores ``b_k^2 / d_k`` with
  ``b_k = 3 sum(h a) - 2 sum(h a)[:k]`` and ``d_k = 9 sum(h) - 8 sum(h)[:k]``.
* Q4: a ladder of four candidate scales (:data:`_Q4W_FACTORS`, 1.0 down to 0.6 times the
  fp16 absmax: a weighted optimum may clip unimportant weights hard, or fit an important
  one exactly) instead of two, each scored with its weighted least-squares scale and the
  absmax by weighted sums. ~0.17 dB (output SNR) from a dense search of the weighted error.
* A group whose weights with importance are all zero (or whose importance is all zero)
  has the same weighted error at every scale: it gets the plain scale. Importance that is
  uniform (all equal, or all zero) gives the plain encoding, byte for byte.

Codes are always the nearest level for the *stored* (fp16-rounded) scale. Large tensors
are processed in chunks of whole groups, so working memory is bounded by the chunk size;
:func:`encode_into` writes straight into caller buffers such as a memory-mapped blob.

Inputs are ``float32``, ``float16`` (or any real float numpy can cast) arrays, or raw
bfloat16 bit patterns as ``uint16`` with ``src_dtype="bf16"``.

Weights the format cannot hold (issue 10):

* NaN and ±Inf are always refused with :class:`NonFiniteWeights` (exact count, first
  position).
* The top level of both widths is 1.0, so the largest magnitude a group can decode to is
  ``FP16_MAX`` (65504). ``overflow="raise"`` (what vault writers use) refuses any
  ``|w| > 65504`` with :class:`ScaleOverflow`; ``overflow="clip"`` (the default of this
  module) clips the scale to 65504, so larger weights decode to ±65504 and the rest of
  their group to multiples of ``65504 / c``.
* Underflow is not refused: a group with ``absmax < 2**-25`` gets scale 0 and decodes to
  zeros, groups below ``2**-14`` get subnormal (coarser) scales. That loses at most
  ~``3e-8`` per weight; when a whole tensor is that small its SNR drops to ~0 dB
  (``N(0, 1e-8)``: 0.9 dB at Q4, against 19.9 dB at ``N(0, 1e-7)``), which the sculpt
  summary warns about (:data:`SNR_FLOOR_DB`).

Both checks ride on the per-group maxima the encoder computes anyway (one integer max per
chunk); only a failure rescans the tensor to count.

The code below is the reference encoder. With numba installed (``pip install
'smoe[fast]'``), :mod:`smoe.quant.kernels.encode` encodes tensors of at least
:data:`FAST_MIN_WEIGHTS` weights several times faster, byte for byte the same (the same
scales, codes and refusals; the SNR statistics agree to float rounding), and
:mod:`smoe.quant.kernels.decode` decodes them (:func:`decode`, :func:`decode_bf16`) about ten
times faster, bit for bit the same. ``kernel=`` or the ``SMOE_KERNEL`` environment variable
chooses: ``auto`` (the default), ``numpy`` (this code) or ``fast`` (the compiled code for
every size; an error without numba).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Literal

import numpy as np

from smoe.errors import RefusedInput, SmoeError
from smoe_gen.layout import (  # the sizes are re-exported
    GROUP_SIZE,
    SUPPORTED_BITS,
    num_groups,
    packed_size,
    scales_size,
)

__all__ = [
    "CHUNK_WEIGHTS",
    "FAST_MIN_WEIGHTS",
    "FP16_MAX",
    "SNR_FLOOR_DB",
    "Kernel",
    "NonFiniteWeights",
    "QuantStats",
    "ScaleMode",
    "ScaleOverflow",
    "SrcDtype",
    "UnrepresentableWeights",
    "bf16_to_f32",
    "decode",
    "decode_bf16",
    "encode",
    "encode_into",
    "fast_kernels",
    "level_center",
    "num_groups",
    "packed_size",
    "prepare_fast",
    "scales_size",
    "snr_db",
]

ScaleMode = Literal["optimal", "absmax"]
SrcDtype = Literal["f32", "f16", "bf16"]
Overflow = Literal["clip", "raise"]
Kernel = Literal["auto", "numpy", "fast"]

CHUNK_WEIGHTS = 1 << 18
"""Default weights per processing chunk (a multiple of ``GROUP_SIZE``)."""

FAST_MIN_WEIGHTS = 1 << 16
"""``kernel="auto"``: tensors with at least this many weights use the compiled encoder and
decoder (smaller ones are not worth their first compile, seconds before it is cached on
disk)."""

KERNEL_ENV = "SMOE_KERNEL"
"""Environment variable giving the default ``kernel``: ``auto``, ``numpy`` or ``fast``."""

FP16_MAX = float(np.finfo(np.float16).max)
"""Largest finite binary16 value (65504): the largest scale, and (top level 1.0) the largest
magnitude either width decodes to."""

SNR_FLOOR_DB = {4: 10.0, 2: 2.5}
"""Per bit width, the tensor SNR (dB, ``optimal`` scales) below which a sculpt warns.

Measured on 512 x 2048 tensors (Q4 / Q2): N(0, 0.02) 20.5 / 9.5, Laplace 18.0 / 7.3,
Student-t(5) 17.8 / 7.5, N(0, 0.02) with 4 outliers of 8-10x per row 17.5 / 7.5, one 9x
outlier in every group (the synthetic test checkpoints) 13.0 / 3.8; Student-t(3) 14.4 /
5.1. Broken weights sit near 0 dB (a tensor whose groups underflow: 0.9 / 0.0). The
floors keep ~3 dB (Q4) and ~1.3 dB (Q2) below the worst healthy case. ``absmax`` scales
lose more, at Q2 much more (1.4 dB on the outlier case), and are warned about there.
"""

_OK_BITS = {
    "clip": int(np.float32(np.finfo(np.float32).max).view(np.int32)),
    "raise": int(np.float32(FP16_MAX).view(np.int32)),
}
"""Per ``overflow`` mode, the largest acceptable ``|w|`` as a float32 bit pattern: a
larger pattern in a group's absmax is non-finite (both modes) or above 65504 ("raise")."""

_Q4_FACTORS = (0.96, 0.89)
"""Q4 ``optimal``: the candidate scales, as multiples of the fp16 absmax scale (tuned on
normal-like weights against a dense search of fp16 scales; see bench/quant_bench.py)."""

_Q4W_FACTORS = (1.0, 0.86, 0.73, 0.6)
"""Q4 ``optimal`` with importance: the candidate ladder, as multiples of the fp16 absmax scale.
A weighted optimum strays further from the absmax than a plain one (it clips unimportant
large weights, or fits an important one exactly): on heavy-tailed weights with outlier
channels (bench/imatrix_bench.py) 1 % / 5 % / 50 % / 95 % / 99 % of groups sit at ~0.47 /
0.62 / 0.88 / 1.08 / 1.2 times it. Four rungs, each with its weighted least-squares scale,
keep ~0.17 dB of output SNR from a dense search there (two, as without importance: ~0.6 dB;
six: ~0.05 dB, at more cost)."""

_SRC_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": None}


# ---------------------------------------------------------------------------- errors


class UnrepresentableWeights(RefusedInput, ValueError):
    """Weights the format cannot hold; see :class:`NonFiniteWeights`, :class:`ScaleOverflow`.

    ``count``: offending weights; ``groups``: groups holding them; ``position``: index
    (in the input's shape) of the first non-finite weight, or of the largest ``|w|``;
    ``value``: the weight there; ``bits``. Pickles with its message and fields (sculpt
    workers run in other processes). :meth:`within` adds where it happened.

    >>> import numpy as np
    >>> try:
    ...     encode(np.array([1.0, np.nan, np.inf], np.float32), 4)
    ... except UnrepresentableWeights as e:
    ...     print(type(e).__name__, e.count, e.position, isinstance(e, ValueError))
    NonFiniteWeights 2 (1,) True
    """

    def __init__(
        self,
        message: str,
        *,
        count: int = 0,
        groups: int = 0,
        position: tuple[int, ...] = (),
        value: float = 0.0,
        bits: int = 0,
    ) -> None:
        super().__init__(message)
        self.count, self.groups, self.position = count, groups, position
        self.value, self.bits = value, bits

    def within(self, where: str) -> UnrepresentableWeights:
        """The same error with ``where: `` (e.g. ``layer 3 expert 5 down_proj``) prepended.

        >>> e = ScaleOverflow("1 group needs a scale above 65504", count=1, groups=1, bits=4)
        >>> e2 = e.within("layer 3 expert 5 down_proj")
        >>> print(e2); e2.count, type(e2).__name__
        layer 3 expert 5 down_proj: 1 group needs a scale above 65504
        (1, 'ScaleOverflow')
        """
        return type(self)(
            f"{where}: {self}",
            count=self.count,
            groups=self.groups,
            position=self.position,
            value=self.value,
            bits=self.bits,
        )


class NonFiniteWeights(UnrepresentableWeights):
    """NaN or ±Inf weights: the format stores finite values only.

    >>> import numpy as np
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> w[1, 5], w[1, 7] = np.nan, np.inf
    >>> encode(w, 4)
    Traceback (most recent call last):
    smoe.quant.NonFiniteWeights: 2 weights are inf or nan, the first (nan) at row 1 col 5; the \
format stores finite values only
    """


class ScaleOverflow(UnrepresentableWeights):
    """``|w| > 65504``: the group would need a scale above the largest float16.

    Raised with ``overflow="raise"`` only; ``"clip"`` clips the scale to 65504.

    >>> import numpy as np
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> w[0, 3] = 70000
    >>> encode(w, 4, overflow="raise")
    Traceback (most recent call last):
    smoe.quant.ScaleOverflow: 1 group needs a scale above 65504 (the largest float16): 1 weight \
has |w| > 65504, up to 70000.0 at row 0 col 3; the largest magnitude Q4 can hold is 65504 \
(top level 1.0 x scale 65504)
    >>> float(encode(w, 4, "absmax")[1][0])  # the default, overflow="clip"
    65504.0
    """


def _where(position: tuple[int, ...]) -> str:
    if len(position) == 2:
        return f"row {position[0]} col {position[1]}"
    return f"index {position[0]}" if len(position) == 1 else f"index {position}"


def _refuse(
    src: np.ndarray, kind: str, shape: tuple[int, ...], bits: int, overflow: str, chunk: int
) -> UnrepresentableWeights:
    """The failure path: rescan the whole input, count exactly, build the error."""
    n = int(np.prod(shape, dtype=np.int64))
    buf = np.empty(chunk, np.float32)
    bad = over = groups = 0
    first = top = -1
    top_abs = 0.0
    for start in range(0, n, chunk):
        w = _read_chunk(src, kind, start, min(start + chunk, n), buf)
        finite = np.isfinite(w)
        k = int(w.size - np.count_nonzero(finite))
        if k and first < 0:
            first = start + int(np.argmin(finite))
        bad += k
        if bad or overflow != "raise":
            continue
        mag = np.abs(w)
        hit = mag > FP16_MAX
        k = int(np.count_nonzero(hit))
        if k:
            over += k
            pad = np.zeros(num_groups(w.size) * GROUP_SIZE, bool)
            pad[: w.size] = hit
            groups += int(np.count_nonzero(pad.reshape(-1, GROUP_SIZE).any(axis=1)))
            i = int(np.argmax(mag))
            if mag[i] > top_abs:
                top, top_abs = start + i, float(mag[i])
    if bad:
        pos = tuple(int(i) for i in np.unravel_index(first, shape))
        value = float(_read_chunk(src, kind, first, first + 1, buf)[0])
        msg = (
            f"1 weight is inf or nan ({value}) at {_where(pos)}"
            if bad == 1
            else f"{bad} weights are inf or nan, the first ({value}) at {_where(pos)}"
        )
        return NonFiniteWeights(
            f"{msg}; the format stores finite values only",
            count=bad,
            groups=0,
            position=pos,
            value=value,
            bits=bits,
        )
    pos = tuple(int(i) for i in np.unravel_index(max(top, 0), shape))
    need = "1 group needs" if groups == 1 else f"{groups} groups need"
    have = "1 weight has" if over == 1 else f"{over} weights have"
    return ScaleOverflow(
        f"{need} a scale above 65504 (the largest float16): {have} |w| > 65504, up to "
        f"{np.float32(top_abs)!s} at {_where(pos)}; the largest magnitude Q{bits} can hold "
        "is 65504 (top level 1.0 x scale 65504)",
        count=over,
        groups=groups,
        position=pos,
        value=top_abs,
        bits=bits,
    )


# ---------------------------------------------------------------------------- sizes
# num_groups, packed_size and scales_size are the generated layout's (imported above).


def level_center(bits: int) -> float:
    """The ``c`` of ``w = (code - c) / c * scale``: ``(2**bits - 1) / 2``.

    >>> level_center(4), level_center(2)
    (7.5, 1.5)
    """
    _check_bits(bits)
    return ((1 << bits) - 1) / 2


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    if (GROUP_SIZE * bits) % 8:
        raise ValueError(f"a group of {GROUP_SIZE} {bits}-bit codes is not whole bytes")


# ---------------------------------------------------------------------------- inputs


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 bit patterns (``uint16``/``int16``) to ``float32`` exactly.

    >>> import numpy as np
    >>> bf16_to_f32(np.array([0x3F80, 0xC000, 0x7F80], np.uint16))
    array([ 1., -2., inf], dtype=float32)
    """
    u16 = np.asarray(bits)
    if u16.dtype.itemsize != 2 or u16.dtype.kind not in "ui":
        raise TypeError(f"bfloat16 bit patterns must be 16-bit integers, got {u16.dtype}")
    out = u16.astype(np.uint32)
    out <<= 16
    return out.view(np.float32)


def _source_kind(weights: np.ndarray, src_dtype: str | None) -> str:
    """Resolve how to read ``weights``: "bf16" (uint16 bits), "f16bits" or "float"."""
    dt = weights.dtype
    if src_dtype is not None and src_dtype not in _SRC_DTYPES:
        raise ValueError(f"src_dtype must be one of {sorted(_SRC_DTYPES)}, got {src_dtype!r}")
    if dt.name == "bfloat16":  # ml_dtypes / jax arrays: reinterpret the bits
        if src_dtype not in (None, "bf16"):
            raise TypeError(f"bfloat16 array given with src_dtype={src_dtype!r}")
        return "bf16"
    if dt.kind in "ui" and dt.itemsize == 2:
        if src_dtype == "bf16":
            return "bf16"
        if src_dtype == "f16":
            return "f16bits"
        raise TypeError(f"{dt} input needs src_dtype='bf16' or 'f16' to say what its bits are")
    if dt.kind != "f":
        raise TypeError(f"weights must be a float array or 16-bit patterns, got {dt}")
    if src_dtype is not None and np.dtype(_SRC_DTYPES[src_dtype] or np.uint16) != dt:
        raise TypeError(f"src_dtype={src_dtype!r} does not match the array dtype {dt}")
    return "float"


def _flat_source(weights: np.ndarray, kind: str) -> np.ndarray:
    """A 1-D view (no copy for C-contiguous arrays) of the raw input elements."""
    if kind == "bf16" and weights.dtype.name == "bfloat16":
        weights = weights.view(np.uint16)
    elif kind == "f16bits":
        weights = weights.view(np.float16)
    return weights.reshape(-1) if weights.flags.c_contiguous else weights


def _read_chunk(src: np.ndarray, kind: str, start: int, stop: int, out: np.ndarray) -> np.ndarray:
    """Input elements ``[start, stop)`` as float32: a view, or converted into ``out``."""
    if src.ndim == 1 and kind == "float" and src.dtype == np.float32 and src.flags.aligned:
        return src[start:stop]  # no copy needed
    part = src[start:stop] if src.ndim == 1 else src.flat[start:stop]
    dst = out[: stop - start]
    if kind == "bf16":
        u32 = dst.view(np.uint32)
        np.copyto(u32, part, casting="unsafe")
        u32 <<= 16
    else:
        np.copyto(dst, part, casting="unsafe")
    return dst


# ---------------------------------------------------------------------------- kernels


_F16_MIN_NORMAL = np.float32(2.0**-14)


def _f16_round(s: np.ndarray) -> np.ndarray:
    """Round scales to the nearest binary16 value (ties to even), clipped to
    ``[0, FP16_MAX]``, returned as float32. Same result as ``.astype(np.float16)`` but
    several times faster: rounds the float32 bit pattern to 10 mantissa bits."""
    x = np.clip(np.asarray(s, np.float32), 0, FP16_MAX)
    u = x.view(np.uint32)
    u += np.uint32(0x0FFF) + ((u >> 13) & 1)
    u &= np.uint32(0xFFFFE000)
    tiny = x < _F16_MIN_NORMAL  # fp16 subnormals: a fixed step of 2**-24
    if tiny.any():
        x[tiny] = np.rint(np.asarray(s, np.float32)[tiny] * np.float32(2.0**24)) * np.float32(
            2.0**-24
        )
    return x


def _floor_codes(g: np.ndarray, s: np.ndarray, bits: int, out: np.ndarray) -> np.ndarray:
    """Nearest-level codes of groups ``g`` (rows) for scales ``s``, minus ``2**(bits-1)``.

    Levels sit at half-integers ``v = code - c`` of ``x = w * c / s``; the nearest one is
    ``floor(x) + 0.5``, clipped to ``[-c, c]``. A zero scale maps every weight to ``v = 0.5``
    (decoded value 0).
    """
    c = level_center(bits)
    half = 1 << (bits - 1)
    with np.errstate(divide="ignore"):
        inv = np.where(s > 0, np.float32(c) / s, np.float32(0)).astype(np.float32)
    np.multiply(g, inv[:, None], out=out)
    np.floor(out, out=out)
    np.clip(out, -half, half - 1, out=out)
    return out


def _absmax(g: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Per-row ``max(|g|)``, via the sign-cleared bit patterns (integer max is faster)."""
    bits = work.view(np.int32)
    np.bitwise_and(g.view(np.int32), 0x7FFFFFFF, out=bits)
    return bits.max(axis=1).view(np.float32)


def _scales_candidates(
    g: np.ndarray, absmax: np.ndarray, bits: int, work: np.ndarray, aux: np.ndarray
) -> np.ndarray:
    """Per-group fp16 scales for ``optimal`` Q4 (see module docstring).

    With ``s0`` the fp16 absmax scale and ``f0`` the first factor, works on
    ``t = g * c / (f0 * s0)``, so every candidate is at most one scalar multiply away. For a
    candidate's levels ``v`` (half-integers) the squared error at the scale ``r * f0 * s0``
    is, up to the constant ``sum(g^2)`` and the factor ``(f0 * s0 / c)^2``,
    ``r^2 * sum(v^2) - 2 r * sum(v t)``: exact for the codes' own scale, an upper bound for
    any other (re-assigning codes can only lower it). Each candidate's codes give three
    scores: at its own scale, at its least-squares scale, and at the absmax scale ``s0``.
    """
    m = len(g)
    c = level_center(bits)
    half = 1 << (bits - 1)
    s0 = _f16_round(absmax)
    f0 = _Q4_FACTORS[0]
    base = s0 * np.float32(f0)  # unit of t: one step is base / c
    with np.errstate(divide="ignore"):
        inv = np.float32(c) / base
    inv[base == 0] = 0
    t = np.multiply(g, inv[:, None], out=aux)
    peak = float((absmax * inv).max(initial=0))  # max |t|
    nf = len(_Q4_FACTORS)
    svt = np.empty((3 * nf, m), np.float32)
    svv = np.empty((3 * nf, m), np.float32)
    cands = np.empty((3 * nf, m), np.float32)
    for i, factor in enumerate(_Q4_FACTORS):
        rel = np.float32(factor / f0)  # candidate step in units of t's
        if i == 0:
            v = np.floor(t, out=work)
        else:
            v = np.multiply(t, 1 / rel, out=work)
            np.floor(v, out=v)
        if peak / rel >= half - 0.01:  # codes could leave [0, 2 c]
            np.clip(v, -half, half - 1, out=v)
        v += 0.5
        np.einsum("ij,ij->i", v, t, out=svt[i])
        np.einsum("ij,ij->i", v, v, out=svv[i])
        cands[i] = s0 * np.float32(factor)
        cands[nf + i] = svt[i] / svv[i] * base  # least-squares scale for these codes
        cands[2 * nf + i] = s0
    svt[nf : 2 * nf] = svt[2 * nf :] = svt[:nf]
    svv[nf : 2 * nf] = svv[2 * nf :] = svv[:nf]
    cands = _f16_round(cands)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = cands / base
        err = r * (r * svv - 2 * svt)
    best = np.fmin.reduce(err, axis=0)  # ignores nan (zero scale or overflowed sums)
    pick = np.where(err == best, cands, np.float32(np.inf)).min(axis=0)  # ties: smallest
    return np.where(pick <= FP16_MAX, pick, cands[0])


def _q2_split_matrix(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Level matrix of the Q2 splits ``k = 0..n`` of ``n`` sorted magnitudes (1 for the
    inner level ``s/3``, 3 for the outer ``s``, in thirds of ``s``) and ``1 / sqrt(d_k)``,
    ``d_k = sum(level^2) = k + 9 (n - k)``."""
    k = np.arange(n + 1)
    m = np.where(np.arange(n)[:, None] < k[None, :], 1.0, 3.0)
    return m, 1.0 / np.sqrt(k + 9.0 * (n - k))


_TILE = 128
"""Groups per block when transposing (keeps the strided copy in cache)."""


def _scales_q2_optimal(
    g: np.ndarray, work: np.ndarray, aux: np.ndarray, limit: int
) -> np.ndarray | None:
    """Per-group fp16 scales for Q2 ``optimal``: the least-squares optimum, or ``None`` if
    a magnitude's bit pattern exceeds ``limit`` (see ``_OK_BITS``).

    Every code assignment a scale can produce splits a group's sorted magnitudes ``a`` in
    two: split ``k`` puts ``a[:k]`` on the inner level ``s/3`` and the rest on ``s``. In
    thirds of ``s``, ``b_k = 3 * sum(a) - 2 * sum(a[:k])`` and ``d_k = k + 9 (n - k)``; the
    split's least-squares scale is ``3 b_k / d_k`` and its error ``sum(a^2) - b_k^2 / d_k``.
    All ``n + 1`` splits are scored from prefix sums (groups side by side, so each step is
    one long vector add) and the best is kept: the exact optimum, then rounded to fp16.
    The split index rides in the low mantissa bits of the score, so one max finds both; it
    perturbs scores by < 2**-15, which can only swap near-equal splits.
    """
    m, n = g.shape
    kbits = n.bit_length()
    ks = np.arange(n + 1)
    r = (1.0 / np.sqrt(ks + 9.0 * (n - ks))).astype(np.float32)
    mag = aux.view(np.int32)  # |g| as bit patterns: same order as the floats, faster sort
    np.bitwise_and(g.view(np.int32), 0x7FFFFFFF, out=mag)
    mag.sort(axis=1)
    if mag[:, -1].max() > limit:  # each group's absmax is its last magnitude
        return None
    p = work.reshape(n, m)  # magnitude rank x group
    for i in range(0, m, _TILE):
        p[:, i : i + _TILE] = aux[i : i + _TILE].T
    for k in range(1, n):  # row k - 1 becomes sum(a[:k])
        np.add(p[k], p[k - 1], out=p[k])
    b0 = p[-1] * np.float32(3)  # b_0: every weight on the outer level
    p *= np.float32(-2)
    p += b0  # row k - 1: b_k
    score = np.multiply(p, r[1:, None], out=aux.reshape(n, m))  # b_k / sqrt(d_k) >= 0
    tag = score.view(np.int32)
    tag &= np.int32(-1 << kbits)
    tag |= ks[1:, None].astype(np.int32)
    top = tag.max(axis=0)
    tag0 = (b0 * r[0]).view(np.int32) & np.int32(-1 << kbits)  # split 0
    top = np.maximum(top, tag0)
    k = top & np.int32((1 << kbits) - 1)
    bk = np.where(k > 0, p[np.maximum(k - 1, 0), np.arange(m)], b0).astype(np.float64)
    s = 3.0 * bk / (k + 9.0 * (n - k))
    over = ~(s <= FP16_MAX)
    if over.any():  # the optimum does not fit in fp16 (or sums overflowed): redo clipped
        a = np.sort(np.abs(g[over].astype(np.float64)), axis=1)
        s[over] = _q2_clipped(a)
    return _f16_round(s)


def _q2_clipped(a: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
    """Q2 optimum with the scale constrained to ``<= FP16_MAX``, for sorted magnitudes
    ``a`` (float64, rows = groups; only huge groups get here) and their importance ``h``
    (None: uniform)."""
    m, r = _q2_split_matrix(a.shape[1])
    if h is None:
        b = a @ (m / 3.0)  # sum(a * level / s)
        d = 1.0 / (9.0 * r * r)  # sum((level / s)^2)
    else:
        b = (h * a) @ (m / 3.0)
        d = h @ (m * m / 9.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.minimum(b / d, FP16_MAX)
        gain = 2 * s * b - s * s * d  # error reduction of split k at its clipped scale
    gain[np.isnan(gain)] = -np.inf
    return s[np.arange(len(a)), gain.argmax(axis=1)]


# ---------------------------------------------------------------------------- importance


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """Round finite non-negative float32 values to bfloat16 precision (ties to even)."""
    u = np.array(x, np.float32).view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> 16) & 1)
    u &= np.uint32(0xFFFF0000)
    return u.view(np.float32)


def _prepare_importance(
    importance: np.ndarray | None, shape: tuple[int, ...]
) -> tuple[np.ndarray, float] | None:
    """Per-column importance as the encoders use it: divided by its maximum and rounded to
    bfloat16 precision (float32 values in ``[0, 1]``), and that maximum; ``None`` when it is
    uniform (all equal, also all zero, before or after rounding): the plain encoder runs."""
    if importance is None:
        return None
    imp = np.asarray(importance)
    cols = shape[-1] if shape else 1
    if imp.shape != (cols,):
        raise ValueError(
            f"importance must hold one value per column ({cols},), got shape {imp.shape}"
        )
    if imp.dtype.kind not in "fiu":
        raise TypeError(f"importance must be real numbers, got {imp.dtype}")
    imp = imp.astype(np.float64)
    bad = ~(np.isfinite(imp) & (imp >= 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"importance must be finite and >= 0: column {i} holds {float(imp[i])}")
    top = float(imp.max(initial=0.0))
    if top == 0 or float(imp.min()) == top:
        return None
    h = _bf16_round(np.abs(imp / top).astype(np.float32))
    return None if float(h.min()) == float(h.max()) else (h, top)


class _ImportanceRuns:
    """Per-weight importance of flat index ranges ``[start, stop)`` (row-major, column =
    index mod ``cols``), as contiguous float32 runs; O(chunk + cols) memory, allocated on
    first use (the compiled encoder takes the columns ``h`` themselves). ``top``: the
    importance's maximum, the unit of ``h`` (weighted statistics are kept in the caller's
    units, so that one ``QuantStats`` can sum several tensors)."""

    def __init__(self, h: np.ndarray, top: float, chunk: int) -> None:
        self.h = h
        self.top = top
        self.cols = h.size
        self.chunk = chunk
        self.tiled: np.ndarray | None = None
        self.buf: np.ndarray | None = None

    def run(self, start: int, stop: int) -> np.ndarray:
        off, n = start % self.cols, stop - start
        if off + n <= self.cols:
            return self.h[off : off + n]
        if self.cols < self.chunk:
            if self.tiled is None:
                self.tiled = np.resize(self.h, self.chunk + self.cols)
            return self.tiled[off : off + n]
        if self.buf is None:
            self.buf = np.empty(self.chunk, np.float32)
        first = self.cols - off  # cols >= chunk >= n: it wraps once
        self.buf[:first] = self.h[off:]
        self.buf[first:n] = self.h[: n - first]
        return self.buf[:n]


def _scales_q4_weighted(
    g: np.ndarray, h: np.ndarray, absmax: np.ndarray, bits: int, work: np.ndarray, aux: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group fp16 scales for ``optimal`` Q4 with importance ``h`` (shaped like ``g``),
    and each group's ``sum(h v t)`` of the first rung (0: no weight with importance is
    non-zero).

    :func:`_scales_candidates` with the ladder :data:`_Q4W_FACTORS` and weighted sums: for
    levels ``v`` at the scale ``r * f0 * s0`` the weighted squared error is, up to constants,
    ``r^2 * sum(h v^2) - 2 r * sum(h v t)``, exact at the codes' own scale, a bound elsewhere;
    each rung scores its own scale, its weighted least-squares scale and ``s0``.
    """
    m = len(g)
    c = level_center(bits)
    half = 1 << (bits - 1)
    s0 = _f16_round(absmax)
    f0 = _Q4W_FACTORS[0]
    base = s0 * np.float32(f0)
    with np.errstate(divide="ignore"):
        inv = np.float32(c) / base
    inv[base == 0] = 0
    t = np.multiply(g, inv[:, None], out=aux)
    u = h * t  # h t: sum(v u) is sum(h v t)
    vv = np.empty_like(g)
    peak = float((absmax * inv).max(initial=0))
    nf = len(_Q4W_FACTORS)
    svt = np.empty((3 * nf, m), np.float32)
    svv = np.empty((3 * nf, m), np.float32)
    cands = np.empty((3 * nf, m), np.float32)
    for i, factor in enumerate(_Q4W_FACTORS):
        rel = np.float32(factor / f0)
        if i == 0:
            v = np.floor(t, out=work)
        else:
            v = np.multiply(t, np.float32(1) / rel, out=work)
            np.floor(v, out=v)
        if peak / rel >= half - 0.01:
            np.clip(v, -half, half - 1, out=v)
        v += 0.5
        np.einsum("ij,ij->i", v, u, out=svt[i])
        np.multiply(v, v, out=vv)
        np.einsum("ij,ij->i", vv, h, out=svv[i])
        cands[i] = s0 * np.float32(factor)
        cands[nf + i] = svt[i] / svv[i] * base
        cands[2 * nf + i] = s0
    svt[nf : 2 * nf] = svt[2 * nf :] = svt[:nf]
    svv[nf : 2 * nf] = svv[2 * nf :] = svv[:nf]
    cands = _f16_round(cands)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = cands / base
        err = r * (r * svv - 2 * svt)
    best = np.fmin.reduce(err, axis=0)
    pick = np.where(err == best, cands, np.float32(np.inf)).min(axis=0)  # ties: smallest
    return np.where(pick <= FP16_MAX, pick, cands[0]), svt[0]


def _scales_q2_weighted(
    g: np.ndarray, h: np.ndarray, limit: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-group fp16 scales for Q2 ``optimal`` with importance ``h``: the exact weighted
    least-squares optimum; and each group's ``sum(h |w|)`` (0: no weight with importance
    is non-zero). ``None`` if a magnitude's bit pattern exceeds ``limit``.

    :func:`_scales_q2_optimal` with weights: the magnitudes are sorted with their importance
    (one sort of 64-bit keys ``|w| bits << 32 | h bits``: ties in ``|w|`` ordered by ``h``);
    with prefix sums ``P_k = sum(h a)``, ``Q_k = sum(h)`` over ``a[:k]``, split ``k`` has
    ``b_k = 3 P_n - 2 P_k`` and ``d_k = 9 Q_n - 8 Q_k``, least-squares scale ``3 b_k / d_k``
    and error ``sum(h a^2) - b_k^2 / d_k``. Every split is scored (``b_k (b_k / d_k)``,
    the split index in the low mantissa bits) and the best kept, then rounded to fp16.
    """
    m, n = g.shape
    kbits = n.bit_length()
    mag = np.bitwise_and(g.view(np.uint32), np.uint32(0x7FFFFFFF))
    if int(mag.max(initial=0)) > limit:
        return None
    key = mag.astype(np.uint64)
    key <<= np.uint64(32)
    key |= h.view(np.uint32)
    key.sort(axis=1)
    p = (key >> np.uint64(32)).astype(np.uint32).view(np.float32).T.copy()  # rank x group
    q = key.astype(np.uint32).view(np.float32).T.copy()
    p *= q  # h a
    for k in range(1, n):  # row k - 1 becomes P_k, Q_k
        np.add(p[k], p[k - 1], out=p[k])
        np.add(q[k], q[k - 1], out=q[k])
    total = p[-1].copy()
    b0 = p[-1] * np.float32(3)  # split 0: every weight on the outer level
    d0 = q[-1] * np.float32(9)
    p *= np.float32(-2)
    p += b0  # row k - 1: b_k
    q *= np.float32(-8)
    q += d0  # row k - 1: d_k
    with np.errstate(divide="ignore", invalid="ignore"):
        score = p * (p / q)
        score0 = b0 * (b0 / d0)
    tag = score.view(np.int32)
    tag &= np.int32(-1 << kbits)
    tag |= np.arange(1, n + 1, dtype=np.int32)[:, None]
    top = np.maximum(tag.max(axis=0), score0.view(np.int32) & np.int32(-1 << kbits))
    k = top & np.int32((1 << kbits) - 1)
    cols = np.arange(m)
    at = np.maximum(k - 1, 0)
    bk = np.where(k > 0, p[at, cols], b0).astype(np.float64)
    dk = np.where(k > 0, q[at, cols], d0).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = 3.0 * bk / dk
    over = ~(s <= FP16_MAX)
    if over.any():  # the optimum does not fit in fp16 (or sums overflowed): redo clipped
        rows = key[over]
        a = (rows >> np.uint64(32)).astype(np.uint32).view(np.float32).astype(np.float64)
        w = rows.astype(np.uint32).view(np.float32).astype(np.float64)
        s[over] = _q2_clipped(a, w)
    return _f16_round(s), total


def _plain_scales(
    g: np.ndarray, bits: int, scale: str, work: np.ndarray, aux: np.ndarray, limit: int
) -> np.ndarray | None:
    """Scales of the groups of ``g`` without importance (see :func:`_encode_groups`)."""
    if scale == "optimal" and 1 << (bits - 1) == 2:  # two magnitude levels: Q2
        return _scales_q2_optimal(g, work, aux, limit)
    absmax = _absmax(g, work)
    if absmax.view(np.int32).max() > limit:  # NaN and Inf patterns are the largest
        return None
    if scale == "absmax":
        return _f16_round(absmax)
    return _scales_candidates(g, absmax, bits, work, aux)


def _weighted_scales(
    g: np.ndarray, h: np.ndarray, bits: int, work: np.ndarray, aux: np.ndarray, limit: int
) -> np.ndarray | None:
    """``optimal`` scales with importance ``h``. A group whose weights with importance are
    all zero (also: whose importance is all zero) has the same weighted error at every
    scale: it gets the plain scale instead."""
    if bits == 2:
        found = _scales_q2_weighted(g, h, limit)
        if found is None:
            return None
        s, signal = found
    else:
        absmax = _absmax(g, work)
        if absmax.view(np.int32).max() > limit:
            return None
        s, signal = _scales_q4_weighted(g, h, absmax, bits, work, aux)
    plain = signal == 0
    if plain.any():
        sub = np.ascontiguousarray(g[plain])
        s[plain] = _plain_scales(
            sub, bits, "optimal", np.empty_like(sub), np.empty_like(sub), limit
        )
    return s


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
        if h is not None and scale == "optimal":
            s = _weighted_scales(g, h, bits, work, aux, limit)
        else:
            s = _plain_scales(g, bits, scale, work, aux, limit)
        if s is None:
            return None
        _floor_codes(g, s, bits, work)
    return s


def _pack_into(f: np.ndarray, bits: int, out: np.ndarray, scratch: np.ndarray) -> None:
    """Pack codes ``f + 2**(bits-1)`` (float, row-major; ``f`` is overwritten) LSB-first
    into the bytes ``out``. ``scratch``: ``uint8`` buffer of at least ``f.size`` bytes."""
    per = 8 // bits
    flat = f.reshape(-1)
    np.add(flat, 1 << (bits - 1), out=flat)
    codes = scratch[: flat.size]
    np.copyto(codes, flat, casting="unsafe")
    whole = flat.size // per
    if whole:  # the codes of one byte as one little-endian word: shift each field down
        word = codes[: whole * per].view(np.dtype(f"<u{per}"))
        acc = word.copy()
        for j in range(1, per):
            acc |= word >> ((8 - bits) * j)
        np.copyto(out[:whole], acc, casting="unsafe")  # keeps the low byte
    if whole * per < flat.size:  # partial last byte: unused high fields stay zero
        tail = codes[whole * per :].astype(np.int64)
        out[whole] = int((tail << (bits * np.arange(tail.size))).sum())


# ---------------------------------------------------------------------------- encode


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
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> blob = np.zeros(packed_size(w.size, 4) + scales_size(w.size), np.uint8)
    >>> stats = QuantStats()
    >>> encode_into(w, 4, blob[:64], blob[64:], stats=stats)  # packed, then the scales' bytes
    >>> blob[64:].view("<f2"), round(stats.snr_db, 1)
    (array([0.9604, 0.9604], dtype=float16), 24.0)
    """
    _check_bits(bits)
    if scale not in ("optimal", "absmax"):
        raise ValueError(f"scale must be 'optimal' or 'absmax', got {scale!r}")
    if overflow not in _OK_BITS:
        raise ValueError(f"overflow must be 'clip' or 'raise', got {overflow!r}")
    if chunk_weights <= 0 or chunk_weights % GROUP_SIZE:
        raise ValueError(f"chunk_weights must be a positive multiple of {GROUP_SIZE}")
    weights = np.asarray(weights)
    kind = _source_kind(weights, src_dtype)
    n = weights.size
    packed = _out_view(packed_out, np.uint8, packed_size(n, bits), "packed_out")
    scales = _out_view(scales_out, np.dtype("<f2"), num_groups(n), "scales_out")
    src = _flat_source(weights, kind)
    prepared = _prepare_importance(importance, weights.shape)
    if n == 0:
        return
    chunk = min(chunk_weights, num_groups(n) * GROUP_SIZE)
    runs = None if prepared is None else _ImportanceRuns(*prepared, chunk)
    fast = fast_kernels(bits, scale, n, kernel)
    if fast is not None and _encode_fast(
        fast, src, kind, weights.shape, bits, scale, packed, scales, stats, overflow, chunk, runs
    ):
        return
    _encode_reference(
        src, kind, weights.shape, bits, scale, packed, scales, stats, overflow, chunk, runs
    )


def _encode_reference(
    src: np.ndarray,
    kind: str,
    shape: tuple[int, ...],
    bits: int,
    scale: str,
    packed: np.ndarray,
    scales: np.ndarray,
    stats: QuantStats | None,
    overflow: str,
    chunk: int,
    runs: _ImportanceRuns | None = None,
) -> None:
    """The numpy encoder: :func:`encode_into` on validated, flattened arguments."""
    n = src.size
    limit = _OK_BITS[overflow]
    buf, work, aux = (np.empty(chunk, np.float32) for _ in range(3))
    codes = np.empty(chunk, np.uint8)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        flat = _read_chunk(src, kind, start, stop, buf)
        full = (stop - start) // GROUP_SIZE * GROUP_SIZE
        g0 = start // GROUP_SIZE
        b0 = start * bits // 8
        for lo, hi in ((0, full), (full, stop - start)):
            if hi == lo:
                continue
            g = flat[lo:hi].reshape(-1, min(hi - lo, GROUP_SIZE))
            f = work[: hi - lo].reshape(g.shape)
            h = None if runs is None else runs.run(start + lo, start + hi).reshape(g.shape)
            s = _encode_groups(g, bits, scale, f, aux[: hi - lo].reshape(g.shape), limit, h)
            if s is None:
                raise _refuse(src, kind, shape, bits, overflow, chunk) from None
            scales[g0 + lo // GROUP_SIZE : g0 + lo // GROUP_SIZE + len(s)] = s
            if stats is not None:  # code - c = work + 0.5, so w_hat = (work + 0.5) * s / c
                err = aux[: hi - lo].reshape(g.shape)
                np.add(f, np.float32(0.5), out=err)
                err *= (
                    scales[g0 + lo // GROUP_SIZE : g0 + lo // GROUP_SIZE + len(s)].astype(
                        np.float32
                    )
                    / np.float32(level_center(bits))
                )[:, None]
                np.subtract(g, err, out=err)
                stats.add(g, err, h, runs.top if runs is not None else 1.0)
            nbytes = -(-(hi - lo) * bits // 8)
            _pack_into(f, bits, packed[b0 + lo * bits // 8 :][:nbytes], codes)


# ---------------------------------------------------------------------------- compiled


_FAST: dict[str, ModuleType | bool | None] = {}
"""Per process: the encoder's kernels module ("module") and the decoder's ("decode"), None
without numba, and whether numpy's einsum sums as the Q4 kernel assumes ("q4")."""


def _compiled(key: str, name: str, n: int, kernel: Kernel | None) -> ModuleType | None:
    """The compiled module ``smoe.<name>`` (imported once, kept in ``_FAST[key]``) if
    ``kernel`` (default: ``$SMOE_KERNEL`` or ``auto``) wants it for ``n`` weights; None for
    numpy. ``fast`` without numba is an error; ``auto`` then quietly stays on numpy."""
    choice = kernel or os.environ.get(KERNEL_ENV, "") or "auto"
    if choice not in ("auto", "numpy", "fast"):
        raise SmoeError(f"{KERNEL_ENV} must be auto, numpy or fast, got {choice!r}")
    if choice == "numpy" or (choice == "auto" and n < FAST_MIN_WEIGHTS):
        return None
    if key not in _FAST:
        try:
            _FAST[key] = importlib.import_module(f"smoe.quant.kernels.{name}")
        except ImportError:
            _FAST[key] = None
    module = _FAST[key]
    if not isinstance(module, ModuleType):  # None: the kernels could not be imported
        if choice == "fast":
            raise SmoeError(f"{KERNEL_ENV}=fast needs numba: pip install 'smoe[fast]'")
        return None
    return module


def fast_kernels(
    bits: int, scale: str, n: int = FAST_MIN_WEIGHTS, kernel: Kernel | None = None
) -> ModuleType | None:
    """The compiled encoder (:mod:`smoe.quant.kernels.encode`) if it should encode ``n`` weights at
    ``bits`` / ``scale`` with ``kernel`` (default: ``$SMOE_KERNEL`` or ``auto``), else None.

    >>> fast_kernels(4, "optimal", n=4096, kernel="auto") is None  # too small to be worth it
    True
    >>> fast_kernels(4, "optimal", kernel="numpy") is None
    True
    """
    module = _compiled("module", "encode", n, kernel)
    if module is None:
        return None
    if bits == 4 and scale == "optimal":
        if "q4" not in _FAST:
            _FAST["q4"] = module.einsum_order_holds()
        if not _FAST["q4"]:
            return None  # this numpy sums in another order: only the reference matches it
    return module


def prepare_fast(bits: int, scale: ScaleMode = "optimal", *, importance: bool = False) -> bool:
    """Compile (or load from the disk cache) the compiled encoder for ``bits`` / ``scale``
    (and with ``importance``, its weighted form too) now if large tensors will use it;
    whether they will. Call it before forking workers: they then inherit the compiled code
    instead of each compiling or loading it.

    >>> import os
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"SMOE_KERNEL": "numpy"}):  # the numpy encoder only
    ...     prepare_fast(4)
    False
    """
    if fast_kernels(bits, scale) is None:
        return False
    for src in (np.zeros(GROUP_SIZE * 2, np.uint16), np.zeros(GROUP_SIZE * 2 + 1, np.float32)):
        for imp in (None, np.arange(src.size, dtype=np.float32)) if importance else (None,):
            encode(
                src,
                bits,
                scale,
                src_dtype="bf16" if src.dtype == np.uint16 else None,
                kernel="fast",
                importance=imp,
            )
    return True


def _encode_fast(
    qk: ModuleType,
    src: np.ndarray,
    kind: str,
    shape: tuple[int, ...],
    bits: int,
    scale: str,
    packed: np.ndarray,
    scales: np.ndarray,
    stats: QuantStats | None,
    overflow: str,
    chunk: int,
    runs: _ImportanceRuns | None = None,
) -> bool:
    """:func:`encode_into` with the compiled kernels; False (nothing counted in ``stats``)
    when a Q2 optimum exceeds 65504, which only the reference encoder clips."""
    n = src.size
    words_of_bf16 = kind == "bf16" and src.ndim == 1 and src.flags.c_contiguous
    buf = None if words_of_bf16 else np.empty(chunk, np.float32)
    chunk_scales = np.empty(chunk // GROUP_SIZE, np.float32)
    sums = np.zeros(4 if runs is None else 6)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        full = (stop - start) // GROUP_SIZE * GROUP_SIZE
        if words_of_bf16:
            part = src[start:stop]
            tail = bf16_to_f32(part[full:])
        else:
            assert buf is not None  # allocated unless the input is read as bf16 words
            part = _read_chunk(src, kind, start, stop, buf)
            tail = part[full:]
        words = part[:full].view(np.uint64)
        if not words.flags.aligned:
            words = words.copy()
        g0, groups = start // GROUP_SIZE, num_groups(stop - start)
        p0 = start * bits // 8
        out = packed[p0 : p0 + packed_size(stop - start, bits)]
        status = qk.encode_chunk(
            words,
            not words_of_bf16,
            tail,
            bits,
            scale == "optimal",
            _OK_BITS[overflow],
            out,
            chunk_scales[:groups],
            sums,
            None if runs is None else (runs.h, start % runs.cols, runs.run(start + full, stop)),
        )
        if status == qk.REFUSED:
            raise _refuse(src, kind, shape, bits, overflow, chunk) from None
        if status == qk.NEEDS_REFERENCE:
            return False
        scales[g0 : g0 + groups] = chunk_scales[:groups]
    if stats is not None:
        stats.add_sums(n, sums, runs.top if runs is not None else 1.0)
    return True


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
    :class:`ScaleOverflow` for any ``|w| > 65504``. ``kernel``: ``"auto"``, ``"numpy"``
    or ``"fast"`` (default ``$SMOE_KERNEL`` or auto; see the module docstring).
    ``importance``: one non-negative value per column (``weights.shape[-1]``), e.g. the mean
    square of each input channel (:mod:`smoe.sculpt.source.imatrix`): ``optimal`` scales then
    minimise the error weighted by it, ``sum(imp[col] * (w - w_hat)^2)`` (see the module docstring);
    uniform importance (or None) gives the plain encoding, byte for byte.
    Returns ``(packed, scales)``: ``uint8[packed_size(n, bits)]`` and little-endian
    ``float16[num_groups(n)]``. Raises :class:`NonFiniteWeights` (a ``SmoeError`` and a
    ``ValueError``) on inf/nan weights.

    >>> import numpy as np
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


# ---------------------------------------------------------------------------- decode

_LUTS: dict[int, np.ndarray] = {}


def _level_lut(bits: int) -> np.ndarray:
    """``lut[byte, j]`` = level ``(code - c) / c`` of field ``j`` of ``byte``."""
    if bits not in _LUTS:
        per = 8 // bits
        c = level_center(bits)
        byte = np.arange(256)[:, None]
        codes = (byte >> (bits * np.arange(per))) & ((1 << bits) - 1)
        _LUTS[bits] = ((codes - c) / c).astype(np.float32)
    return _LUTS[bits]


def _decode_args(
    packed: np.ndarray,
    scales: np.ndarray,
    bits: int,
    shape: tuple[int, ...],
    out: np.ndarray | None,
    dtype: type,
    chunk_weights: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Check :func:`decode`'s arguments: ``(flat packed, flat fp16 scales, out, flat out)``
    (``out`` of ``dtype``, allocated if None)."""
    _check_bits(bits)
    if chunk_weights <= 0 or chunk_weights % GROUP_SIZE:
        raise ValueError(f"chunk_weights must be a positive multiple of {GROUP_SIZE}")
    shape = tuple(int(d) for d in shape)
    n = int(np.prod(shape, dtype=np.int64))
    p = np.ascontiguousarray(packed).reshape(-1)
    if p.dtype != np.uint8 or p.size != packed_size(n, bits):
        raise ValueError(f"packed must be {packed_size(n, bits)} uint8 bytes for shape {shape}")
    sc = np.ascontiguousarray(scales).reshape(-1)
    if sc.dtype == np.uint8:
        sc = sc.view("<f2") if sc.size % 2 == 0 else sc
    if sc.dtype.kind != "f" or sc.dtype.itemsize != 2 or sc.size != num_groups(n):
        raise ValueError(f"scales must be {num_groups(n)} float16 values for shape {shape}")
    if out is None:
        out = np.empty(shape, dtype)
    elif out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        name = np.dtype(dtype).name
        raise ValueError(f"out must be a C-contiguous {name} array of shape {shape}")
    return p, sc, out, out.reshape(-1)


def _decode_kernels(n: int, kernel: Kernel | None) -> ModuleType | None:
    """The compiled decoder (:mod:`smoe.quant.kernels.decode`) if it should decode ``n`` weights
    with ``kernel`` (default: ``$SMOE_KERNEL`` or ``auto``), as :func:`fast_kernels` chooses
    the encoder; else None."""
    return _compiled("decode", "decode", n, kernel)


def _decode_chunk(
    p: np.ndarray, sc: np.ndarray, bits: int, start: int, stop: int, dst: np.ndarray
) -> None:
    """The numpy decoder: weights ``start:stop`` (``start`` at a group) into float32 ``dst``."""
    per = 8 // bits
    levels = _level_lut(bits)[p[start // per : -(-stop // per)]].reshape(-1)[: stop - start]
    g0 = start // GROUP_SIZE
    full = (stop - start) // GROUP_SIZE * GROUP_SIZE
    s = sc[g0 : g0 + num_groups(stop - start)].astype(np.float32)
    np.multiply(
        levels[:full].reshape(-1, GROUP_SIZE),
        s[: full // GROUP_SIZE, None],
        out=dst[:full].reshape(-1, GROUP_SIZE),
    )
    if full < stop - start:
        np.multiply(levels[full:], s[-1], out=dst[full : stop - start])


def _scale_bytes(sc: np.ndarray) -> np.ndarray:
    """fp16 scales as their little-endian bytes (``uint8``), as the compiled decoder reads."""
    return np.ascontiguousarray(sc, np.dtype("<f2")).view(np.uint8)


def decode(
    packed: np.ndarray,
    scales: np.ndarray,
    bits: int,
    shape: tuple[int, ...],
    *,
    out: np.ndarray | None = None,
    chunk_weights: int = CHUNK_WEIGHTS,
    kernel: Kernel | None = None,
) -> np.ndarray:
    """Dequantise SMOE-Q``bits`` codes to a float32 array of ``shape`` (ruling D2).

    ``packed``: ``uint8`` bytes; ``scales``: fp16 values or their raw ``uint8`` bytes.
    Both must have exactly the D2 sizes for ``prod(shape)`` weights. ``out`` optionally
    receives the result (float32, C-contiguous, ``shape``). ``kernel``: as for
    :func:`encode` (the compiled decoder, :mod:`smoe.quant.kernels.decode`, gives the same bits).

    >>> import numpy as np
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> packed, scales = encode(w, 2)
    >>> back = decode(packed, scales, 2, w.shape)
    >>> back.shape, back.dtype
    ((2, 64), dtype('float32'))
    >>> np.unique(back)  # Q2: four levels, +-scale and +-scale/3
    array([-0.7558594 , -0.25195312,  0.25195312,  0.7558594 ], dtype=float32)
    """
    return _decode_as(np.float32, packed, scales, bits, shape, out, chunk_weights, kernel)


def _bf16_bits(f32: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> None:
    """Round float32 values to bfloat16 bit patterns (``uint16``) into ``out``, to nearest
    even as torch rounds: ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16`` on the float32 bits
    ``u``, in uint32 arithmetic (beyond the bfloat16 range: inf), and every NaN, whatever
    its sign and payload, to the quiet NaN 0x7FC0 (the sum would carry a NaN with a high
    payload into the sign bit or wrap it around to zero).
    ``scratch``: ``uint32`` of the same size. All three flat and C-contiguous.

    >>> import numpy as np
    >>> nans = np.array([0x7FC00000, 0x7FFFFFFF, 0xFFFFFFFF], np.uint32).view(np.float32)
    >>> x = np.array([1.0, 1.00390625, 1.01171875, 3.4e38, *nans], np.float32)
    >>> out = np.empty(x.size, np.uint16)
    >>> _bf16_bits(x, out, np.empty(x.size, np.uint32))
    >>> [hex(v) for v in out]  # ties to even: 1 + 2**-8 down to 1, 1 + 3 * 2**-8 up
    ['0x3f80', '0x3f80', '0x3f82', '0x7f80', '0x7fc0', '0x7fc0', '0x7fc0']
    """
    u = f32.view(np.uint32)
    np.right_shift(u, 16, out=scratch)
    np.bitwise_and(scratch, 1, out=scratch)
    scratch += 0x7FFF
    scratch += u
    scratch >>= 16
    np.copyto(out, scratch, casting="unsafe")
    np.bitwise_and(u, 0x7FFFFFFF, out=scratch)
    np.putmask(out, scratch > 0x7F800000, 0x7FC0)


def decode_bf16(
    packed: np.ndarray,
    scales: np.ndarray,
    bits: int,
    shape: tuple[int, ...],
    *,
    out: np.ndarray | None = None,
    chunk_weights: int = CHUNK_WEIGHTS,
    kernel: Kernel | None = None,
) -> np.ndarray:
    """:func:`decode` rounded to bfloat16: its bit patterns as a ``uint16`` array of
    ``shape`` (into ``out`` if given: uint16, C-contiguous, ``shape``). Each float32 value
    is rounded by :func:`_bf16_bits`; the compiled decoder rounds in the same pass, the
    numpy one chunk by chunk (working memory ``O(chunk_weights)``).

    >>> import numpy as np
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> packed, scales = encode(w, 2)
    >>> bf = decode_bf16(packed, scales, 2, w.shape)
    >>> bf.shape, [hex(v) for v in np.unique(bf)]  # 0.7558594 is 0x3f418000: a tie, to even
    ((2, 64), ['0x3e81', '0x3f42', '0xbe81', '0xbf42'])
    """
    return _decode_as(np.uint16, packed, scales, bits, shape, out, chunk_weights, kernel)


def _decode_as(
    dtype: type,
    packed: np.ndarray,
    scales: np.ndarray,
    bits: int,
    shape: tuple[int, ...],
    out: np.ndarray | None,
    chunk_weights: int,
    kernel: Kernel | None,
) -> np.ndarray:
    """:func:`decode` (``dtype`` float32) or :func:`decode_bf16` (uint16): compiled when
    ``kernel`` wants it, else numpy chunk by chunk (bfloat16 through a float32 chunk)."""
    p, sc, out, flat = _decode_args(packed, scales, bits, shape, out, dtype, chunk_weights)
    fast = _decode_kernels(flat.size, kernel)
    if fast is not None:
        fast.decode_into(p, _scale_bytes(sc), bits, flat)
        return out
    chunk = min(chunk_weights, flat.size)
    wide = dtype is np.uint16  # decoded into a float32 chunk, then rounded into ``out``
    f32 = np.empty(chunk if wide else 0, np.float32)
    scratch = np.empty(chunk if wide else 0, np.uint32)
    for start in range(0, flat.size, chunk_weights):
        stop = min(start + chunk_weights, flat.size)
        dst = f32[: stop - start] if wide else flat[start:stop]
        _decode_chunk(p, sc, bits, start, stop, dst)
        if wide:
            _bf16_bits(dst, flat[start:stop], scratch[: stop - start])
    return out


# ---------------------------------------------------------------------------- metrics


def snr_db(w: np.ndarray, w_hat: np.ndarray, *, chunk_weights: int = CHUNK_WEIGHTS) -> float:
    """Signal-to-noise ratio ``10 * log10(var(w) / var(w - w_hat))`` in dB (float64 sums).

    ``inf`` when the error is exactly constant (e.g. zero). Computed in chunks.

    >>> import numpy as np
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> round(snr_db(w, w + 0.01 * np.cos(np.arange(64))), 1), snr_db(w, w + 0.5)
    (38.2, inf)
    """
    a = np.asarray(w).reshape(-1)
    b = np.asarray(w_hat).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {np.shape(w)} vs {np.shape(w_hat)}")
    stats = QuantStats()  # the encoder's own accumulator, fed float64 chunks
    for start in range(0, a.size, chunk_weights):
        x = a[start : start + chunk_weights].astype(np.float64)
        stats.add(x, x - b[start : start + chunk_weights])
    return stats.snr_db


class QuantStats:
    """Signal and error power of one or more encodes; see ``encode_into(stats=...)``.

    Keeps count, sum and sum of squares per chunk (numpy encoder: float32 BLAS dot products
    summed in float64, a chunk whose float32 sums overflow redone in float64; compiled
    encoder: float32 sums of 16 weights per lane, summed in float64): weights and errors
    are near zero-mean, so ``sumsq - sum**2 / n`` loses nothing that matters for a figure
    in dB, and it costs a fraction of a decode.

    Encodes with importance ``h`` (per weight) also add ``sum(h w^2)`` and ``sum(h err^2)``:
    :attr:`weighted_snr_db` is their ratio, the expected SNR of the output ``W x`` for
    inputs whose channels are uncorrelated with mean squares ``h`` (what an importance
    matrix holds). Powers, not variances: the output's mean is part of its signal.

    >>> import numpy as np
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> stats = QuantStats()
    >>> for bits in (4, 2):  # one accumulator over several encodes
    ...     _ = encode_into(w, bits, np.empty(packed_size(w.size, bits), np.uint8),
    ...                     np.empty(2, "<f2"), stats=stats)
    >>> stats.n, round(stats.snr_db, 1), stats.weighted_snr_db
    (256, 14.8, None)
    """

    _RESOLUTION = 1e-4
    """Variances below this fraction of the mean square are taken as zero: float32 sums
    cannot resolve them (e.g. the error of a constant tensor)."""

    def __init__(self) -> None:
        self.n = 0
        self.sums = [0.0, 0.0, 0.0, 0.0]  # signal sum, signal sumsq, error sum, error sumsq
        self.weighted_n = 0  # weights counted with importance
        self.wsums = [0.0, 0.0]  # sum(h w^2), sum(h err^2)

    def add_sums(self, n: int, sums: np.ndarray, unit: float = 1.0) -> None:
        """Add ``sum(w), sum(w^2), sum(err), sum(err^2)`` of ``n`` weights, and if ``sums``
        has six, ``sum(h w^2), sum(h err^2)`` (``h`` in units of ``unit``).

        >>> import numpy as np
        >>> stats = QuantStats()
        >>> stats.add_sums(128, np.array([0.0, 43.0, 0.0, 0.043]))  # error power 1/1000
        >>> round(stats.snr_db, 1)
        30.0
        """
        self.n += int(n)
        for k in range(4):
            self.sums[k] += float(sums[k])
        if len(sums) > 4:
            self.weighted_n += int(n)
            self.wsums[0] += float(sums[4]) * unit
            self.wsums[1] += float(sums[5]) * unit

    def add(
        self, w: np.ndarray, err: np.ndarray, h: np.ndarray | None = None, unit: float = 1.0
    ) -> None:
        """Add weights ``w`` and their errors ``err`` (float32 or float64, any shape), with
        per-weight importance ``h`` (shaped like ``w``, in units of ``unit``) if given.

        >>> import numpy as np
        >>> w = np.linspace(-1, 1, 128, dtype=np.float32)
        >>> stats = QuantStats()
        >>> err = 0.01 * np.cos(np.arange(128, dtype=np.float32))
        >>> stats.add(w, err, h=np.ones(128, np.float32))
        >>> round(stats.snr_db, 1), round(stats.weighted_snr_db, 1)
        (38.3, 38.3)
        """
        x, e = w.reshape(-1), err.reshape(-1)
        self.n += x.size
        with np.errstate(over="ignore", invalid="ignore"):
            part = [float(v) for v in (x.sum(), np.dot(x, x), e.sum(), np.dot(e, e))]
        if not np.isfinite(part).all():
            x, e = x.astype(np.float64), e.astype(np.float64)
            part = [float(v) for v in (x.sum(), np.dot(x, x), e.sum(), np.dot(e, e))]
        for k, v in enumerate(part):
            self.sums[k] += v
        if h is not None:
            hx = h.reshape(-1)
            with np.errstate(over="ignore", invalid="ignore"):
                wpart = [float(np.dot(hx * x, x)), float(np.dot(hx * e, e))]
            if not np.isfinite(wpart).all():
                x, e, hx = x.astype(np.float64), e.astype(np.float64), hx.astype(np.float64)
                wpart = [float(np.dot(hx * x, x)), float(np.dot(hx * e, e))]
            self.weighted_n += x.size
            self.wsums[0] += wpart[0] * unit
            self.wsums[1] += wpart[1] * unit

    def _m2(self, s: float, ss: float) -> float:
        m2 = ss - s * s / self.n if self.n else 0.0
        return m2 if m2 > ss * self._RESOLUTION else 0.0

    @property
    def snr_db(self) -> float:
        """``10 * log10(var(w) / var(w - w_hat))`` as :func:`snr_db` gives it: ``inf`` when
        the error has no variance, ``-inf`` when only the signal has none.

        >>> import numpy as np
        >>> stats = QuantStats()
        >>> encode_into(np.zeros(64, np.float32), 4, np.empty(32, np.uint8), np.empty(1, "<f2"),
        ...             stats=stats)
        >>> stats.snr_db  # all zeros: encoded exactly
        inf
        """
        sig = self._m2(self.sums[0], self.sums[1])
        err = self._m2(self.sums[2], self.sums[3])
        if err == 0:
            return float("inf")
        if sig == 0:
            return float("-inf")
        return float(10 * np.log10(sig / err))

    @property
    def finite_snr_db(self) -> float | None:
        """:attr:`snr_db`, or ``None`` (JSON ``null``) when it is not finite: the encode is
        exact up to a constant offset (e.g. an all-zero tensor) or the tensor is constant.

        >>> import numpy as np
        >>> stats = QuantStats()
        >>> encode_into(np.zeros(64, np.float32), 4, np.empty(32, np.uint8), np.empty(1, "<f2"),
        ...             stats=stats)
        >>> stats.finite_snr_db is None
        True
        """
        v = self.snr_db
        return v if np.isfinite(v) else None

    @property
    def weighted_snr_db(self) -> float | None:
        """``10 * log10(sum(h w^2) / sum(h err^2))``, ``None`` (JSON ``null``) when no encode
        had importance or the ratio is not finite (no error, or no weighted signal).

        >>> import numpy as np
        >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
        >>> stats = QuantStats()
        >>> imp = np.r_[np.ones(32), np.full(32, 100.0)]
        >>> encode_into(w, 4, np.empty(64, np.uint8), np.empty(2, "<f2"), stats=stats,
        ...             importance=imp)
        >>> round(stats.weighted_snr_db, 1), round(stats.snr_db, 1)  # output SNR, weight SNR
        (24.4, 19.2)
        """
        sig, err = self.wsums
        if not self.weighted_n or err <= 0 or sig <= 0:
            return None
        v = float(10 * np.log10(sig / err))
        return v if np.isfinite(v) else None
