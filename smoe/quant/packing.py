"""Codes and their bytes: the nearest level of each weight for its group's stored scale,
the codes packed LSB-first (ruling D2), and per byte the levels its fields decode to."""

from __future__ import annotations

import numpy as np

from smoe.quant.traits import level_center

__all__ = ["floor_codes", "level_lut", "pack_into"]

_LUTS: dict[int, np.ndarray] = {}


def floor_codes(g: np.ndarray, s: np.ndarray, bits: int, out: np.ndarray) -> np.ndarray:
    """Nearest-level codes of groups ``g`` (rows) for scales ``s``, minus ``2**(bits-1)``.

    Levels sit at half-integers ``v = code - c`` of ``x = w * c / s``; the nearest one is
    ``floor(x) + 0.5``, clipped to ``[-c, c]``. A zero scale maps every weight to ``v = 0.5``
    (decoded value 0).

    >>> g = np.array([[-1.0, -0.2, 0.2, 1.0], [5.0, 0.0, 0.0, 0.0]], np.float32)
    >>> floor_codes(g, np.array([1.0, 0.0], np.float32), 2, np.empty_like(g))  # + 2: the codes
    array([[-2., -1.,  0.,  1.],
           [ 0.,  0.,  0.,  0.]], dtype=float32)
    """
    c = level_center(bits)
    half = 1 << (bits - 1)
    with np.errstate(divide="ignore"):
        inv = np.where(s > 0, np.float32(c) / s, np.float32(0)).astype(np.float32)
    np.multiply(g, inv[:, None], out=out)
    np.floor(out, out=out)
    np.clip(out, -half, half - 1, out=out)
    return out


def pack_into(f: np.ndarray, bits: int, out: np.ndarray, scratch: np.ndarray) -> None:
    """Pack codes ``f + 2**(bits-1)`` (float, row-major; ``f`` is overwritten) LSB-first
    into the bytes ``out``. ``scratch``: ``uint8`` buffer of at least ``f.size`` bytes.

    >>> out = np.zeros(2, np.uint8)
    >>> pack_into(np.array([-2, -1, 0, 1, 1], np.float32), 2, out, np.empty(5, np.uint8))
    >>> [bin(b) for b in out]  # codes 0, 1, 2, 3 in the first byte; 3 in the partial last
    ['0b11100100', '0b11']
    """
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


def level_lut(bits: int) -> np.ndarray:
    """``lut[byte, j]`` = level ``(code - c) / c`` of field ``j`` of ``byte`` (one table per
    width, built on first use; the numpy and the compiled decoder multiply these values).

    >>> level_lut(2)[0b11100100].tolist()  # codes 0, 1, 2, 3
    [-1.0, -0.3333333432674408, 0.3333333432674408, 1.0]
    """
    if bits not in _LUTS:
        per = 8 // bits
        c = level_center(bits)
        byte = np.arange(256)[:, None]
        codes = (byte >> (bits * np.arange(per))) & ((1 << bits) - 1)
        _LUTS[bits] = ((codes - c) / c).astype(np.float32)
    return _LUTS[bits]
