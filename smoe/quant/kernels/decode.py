"""Compiled SMOE-Q2/Q4 decoder (numba), bit-identical to the numpy reference.

:func:`smoe.quant.decode` (float32) and :func:`smoe.quant.decode_bf16` (bfloat16 bits)
call :func:`decode_into` for tensors of at least ``quant.FAST_MIN_WEIGHTS`` weights. It
computes the reference's very products: per group, the fp16 scale is widened to float32
as numpy widens it (numba has no float16: the bits are widened with integer arithmetic,
NaN payloads kept, subnormals exact) and multiplied once by each of the ``2**bits``
levels of the numpy decoder's own table (:func:`smoe.quant.packing.level_lut`); every
weight of the group then takes its code's product.
For bfloat16 output each product is rounded as the reference rounds float32 (to nearest
even on the bits, ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16`` in uint32; every NaN 0x7FC0),
so the tensor is written once, with no float32 copy of it.

Importing this module needs numba; :mod:`smoe.quant` falls back to numpy without it.
Compiled code is cached on disk (``__pycache__``, or ``NUMBA_CACHE_DIR``) where writable.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba.extending import overload

from smoe.quant.kernels.jit import cached, jit
from smoe.quant.packing import level_lut
from smoe_gen.layout import GROUP_SIZE, SUPPORTED_BITS

__all__ = ["decode_into", "decode_into_cached", "widen_f16"]

if GROUP_SIZE != 64 or set(SUPPORTED_BITS) != {2, 4}:
    raise ImportError("the compiled decoder is written for Q2 and Q4 in groups of 64 weights")

_LEVELS = {b: np.ascontiguousarray(level_lut(b)[: 1 << b, 0]) for b in SUPPORTED_BITS}
"""Per width, the level of each code: field 0 of the bytes below ``2**bits`` in that
table, the same float32 values the numpy decoder multiplies."""

_U32 = np.uint32
_TWO_M24 = np.float32(2.0**-24)


@jit(inline="always")
def _widen(h):
    """The float32 value of fp16 bits ``h`` (as uint32), as numpy's cast gives it."""
    sign = (h & _U32(0x8000)) << _U32(16)
    e = h & _U32(0x7C00)
    m = h & _U32(0x03FF)
    if e == _U32(0):  # zero or subnormal: m * 2**-24, exact in float32
        u = np.float32(np.float32(m) * _TWO_M24).view(np.uint32)
    elif e == _U32(0x7C00):  # inf or NaN: the payload kept (a signalling NaN stays one)
        u = _U32(0x7F800000) | (m << _U32(13))
    else:
        u = ((h & _U32(0x7FFF)) + _U32(0x1C000)) << _U32(13)
    return _U32(u | sign).view(np.float32)


@jit(inline="always")
def _scale(sb, g):
    """Group ``g``'s scale from the little-endian fp16 bytes ``sb``."""
    return _widen(_U32(sb[2 * g]) | (_U32(sb[2 * g + 1]) << _U32(8)))


@jit(inline="always")
def _bf16(x):
    """float32 ``x`` rounded to bfloat16 bits as the reference rounds (NaN: 0x7FC0)."""
    u = np.float32(x).view(np.uint32)
    if (u & _U32(0x7FFFFFFF)) > _U32(0x7F800000):
        return np.uint16(0x7FC0)
    return np.uint16(_U32(u + _U32(0x7FFF) + ((u >> _U32(16)) & _U32(1))) >> _U32(16))


def _entry(x, table):
    """float32 ``x`` as an entry of ``table``: itself, or its bfloat16 bits (uint16)."""
    return _bf16(x) if table.dtype == np.uint16 else x


@overload(_entry)
def _entry_typed(x, table):
    """:func:`_entry` in compiled code: chosen by the table's type when compiling."""
    if table.dtype == numba.types.uint16:
        return lambda x, table: _bf16(x)
    return lambda x, table: x


@jit(inline="always")
def _products(levels, s, table):
    """``table[code]`` = ``levels[code] * s`` (float32), or its bfloat16 bits."""
    for c in range(levels.size):
        table[c] = _entry(levels[c] * s, table)


@jit(inline="always")
def _spread4(packed, p, table, out, o, nbytes):
    """Two Q4 codes per byte, low nibble first."""
    for k in range(nbytes):
        b = packed[p + k]
        out[o + 2 * k] = table[b & 15]
        out[o + 2 * k + 1] = table[b >> 4]


@jit(inline="always")
def _spread2(packed, p, table, out, o, nbytes):
    """Four Q2 codes per byte, lowest bits first."""
    for k in range(nbytes):
        b = packed[p + k]
        out[o + 4 * k] = table[b & 3]
        out[o + 4 * k + 1] = table[(b >> 2) & 3]
        out[o + 4 * k + 2] = table[(b >> 4) & 3]
        out[o + 4 * k + 3] = table[b >> 6]


@jit()
def _decode(packed, sb, levels, bits, out, table):
    """Decode ``out.size`` weights; ``table`` (float32 or uint16, ``2**bits`` entries)
    chooses the output: float32 values or bfloat16 bits."""
    n = out.size
    per = 8 // bits
    gbytes = GROUP_SIZE // per
    full = n // GROUP_SIZE
    if bits == 4:
        for g in range(full):
            _products(levels, _scale(sb, g), table)
            _spread4(packed, g * gbytes, table, out, g * GROUP_SIZE, gbytes)
    else:
        for g in range(full):
            _products(levels, _scale(sb, g), table)
            _spread2(packed, g * gbytes, table, out, g * GROUP_SIZE, gbytes)
    if full * GROUP_SIZE < n:  # the partial last group
        _products(levels, _scale(sb, full), table)
        mask = (1 << bits) - 1
        for j in range(n - full * GROUP_SIZE):
            b = packed[full * gbytes + j // per]
            out[full * GROUP_SIZE + j] = table[(b >> (bits * (j % per))) & mask]


@jit()
def _widen_all(h, out):
    for i in range(h.size):
        out[i] = _widen(_U32(h[i]))


def widen_f16(bits: np.ndarray) -> np.ndarray:
    """float32 values of fp16 bit patterns (``uint16``), widened as the kernels widen scales
    (the same bits as numpy's ``astype(np.float32)``, NaN payloads included).

    >>> widen_f16(np.array([0x3C00, 0x0001, 0xFBFF, 0x7C01], np.uint16)).view(np.uint32)
    array([1065353216,  864026624, 3347046400, 2139103232], dtype=uint32)
    """
    h = np.ascontiguousarray(bits, np.uint16).reshape(-1)
    out = np.empty(h.size, np.float32)
    _widen_all(h, out)
    return out.reshape(np.shape(bits))


def decode_into(packed: np.ndarray, scale_bytes: np.ndarray, bits: int, out: np.ndarray) -> None:
    """Decode ``out.size`` weights (validated sizes, as :func:`smoe.quant.decode` checks
    them) into ``out``: flat C-contiguous ``float32`` (the values) or ``uint16`` (their
    bfloat16 bits). ``packed``: the codes' ``uint8`` bytes; ``scale_bytes``: the scales'
    little-endian fp16 bytes as ``uint8``.

    >>> from smoe import quant
    >>> w = np.linspace(-1, 1, 130, dtype=np.float32)  # two groups and two weights
    >>> packed, scales = quant.encode(w, 4, kernel="numpy")
    >>> out = np.empty(w.size, np.uint16)
    >>> decode_into(packed, scales.view(np.uint8), 4, out)
    >>> out[-3:].tolist()  # the partial last group
    [16238, 16254, 16254]
    >>> ref = quant.decode_bf16(packed, scales, 4, w.shape, kernel="numpy")
    >>> bool((out == ref).all())
    True
    """
    _decode(*_decode_args(packed, scale_bytes, bits, out))


def decode_into_cached(
    packed: np.ndarray, scale_bytes: np.ndarray, bits: int, out: np.ndarray
) -> bool | None:
    """Whether :func:`decode_into` with these arguments would find its compiled code (in
    this process or numba's disk cache) instead of compiling it; nothing is decoded,
    compiled or loaded (:func:`smoe.quant.kernels.jit.cached`; None: cannot tell).

    >>> packed, sb, out = np.zeros(32, np.uint8), np.zeros(2, np.uint8), np.empty(64, np.float32)
    >>> decode_into(packed, sb, 4, out)  # decoded: compiled (or loaded) now
    >>> decode_into_cached(packed, sb, 4, out)
    True
    """
    return cached(_decode, _decode_args(packed, scale_bytes, bits, out))


def _decode_args(
    packed: np.ndarray, scale_bytes: np.ndarray, bits: int, out: np.ndarray
) -> tuple[Any, ...]:
    """The compiled decoder's arguments for :func:`decode_into`'s."""
    if bits not in _LEVELS:
        raise ValueError(f"bits must be one of {tuple(_LEVELS)}, got {bits!r}")
    return packed, scale_bytes, _LEVELS[bits], bits, out, np.empty(1 << bits, out.dtype)
