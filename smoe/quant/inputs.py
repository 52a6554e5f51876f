"""The encoder's inputs: which kind of numbers an array holds (float, fp16 bits, bfloat16
bits) and its elements read chunk by chunk as float32, without copying what need not be."""

from __future__ import annotations

import numpy as np

__all__ = ["SRC_DTYPES", "as_float32", "bf16_to_f32", "flat_source", "read_chunk", "source_kind"]

SRC_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": None}
"""The ``src_dtype`` names and the numpy dtype each reads (bfloat16: raw ``uint16`` bits)."""


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


def source_kind(weights: np.ndarray, src_dtype: str | None) -> str:
    """Resolve how to read ``weights``: "bf16" (uint16 bits), "f16bits" or "float".

    >>> source_kind(np.zeros(2, np.uint16), "bf16"), source_kind(np.zeros(2, np.float16), None)
    ('bf16', 'float')
    >>> source_kind(np.zeros(2, np.uint16), None)
    Traceback (most recent call last):
    TypeError: uint16 input needs src_dtype='bf16' or 'f16' to say what its bits are
    """
    dt = weights.dtype
    if src_dtype is not None and src_dtype not in SRC_DTYPES:
        raise ValueError(f"src_dtype must be one of {sorted(SRC_DTYPES)}, got {src_dtype!r}")
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
    if src_dtype is not None and np.dtype(SRC_DTYPES[src_dtype] or np.uint16) != dt:
        raise TypeError(f"src_dtype={src_dtype!r} does not match the array dtype {dt}")
    return "float"


def as_float32(weights: np.ndarray, src_dtype: str | None = None) -> np.ndarray:
    """``weights`` (a float array, or 16-bit patterns read as ``src_dtype``) as the float32
    values every encoder reads: what the Hessian-aware encoder, which works on whole
    matrices, is given.

    >>> as_float32(np.array([0x3F80, 0xC000], np.uint16), "bf16")
    array([ 1., -2.], dtype=float32)
    """
    kind = source_kind(weights, src_dtype)
    if kind == "bf16":
        return bf16_to_f32(weights.view(np.uint16) if weights.dtype.kind != "u" else weights)
    if kind == "f16bits":
        return weights.view(np.float16).astype(np.float32)
    return np.asarray(weights, np.float32)


def flat_source(weights: np.ndarray, kind: str) -> np.ndarray:
    """A 1-D view (no copy for C-contiguous arrays) of the raw input elements (fp16 bits
    as float16, bfloat16 arrays as their ``uint16`` bits); a strided array stays as it is.

    >>> w = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> flat_source(w, "float").shape, flat_source(w[:, :2], "float").shape
    ((6,), (2, 2))
    >>> flat_source(np.array([0x3C00], np.uint16), "f16bits")
    array([1.], dtype=float16)
    """
    if kind == "bf16" and weights.dtype.name == "bfloat16":
        weights = weights.view(np.uint16)
    elif kind == "f16bits":
        weights = weights.view(np.float16)
    return weights.reshape(-1) if weights.flags.c_contiguous else weights


def read_chunk(src: np.ndarray, kind: str, start: int, stop: int, out: np.ndarray) -> np.ndarray:
    """Input elements ``[start, stop)`` as float32: a view, or converted into ``out``.

    >>> bits = np.array([0x3F80, 0x4000, 0xC040], np.uint16)  # bfloat16 1, 2, -3
    >>> read_chunk(bits, "bf16", 1, 3, np.empty(4, np.float32))
    array([ 2., -3.], dtype=float32)
    """
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
