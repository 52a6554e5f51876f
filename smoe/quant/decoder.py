"""The decoder: :func:`decode` (float32) and :func:`decode_bf16` (bfloat16 bits, rounded as
torch rounds), by the numpy reference chunk by chunk or, when :mod:`~smoe.quant.dispatch`
says so, by the compiled decoder (:mod:`smoe.quant.kernels.decode`), bit for bit the same."""

from __future__ import annotations

from functools import partial
from types import ModuleType

import numpy as np

from smoe.quant.compiling import KernelCall
from smoe.quant.dispatch import chosen_module, decode_kernels
from smoe.quant.packing import level_lut
from smoe.quant.traits import CHUNK_WEIGHTS, FAST_MIN_WEIGHTS, Kernel, check_bits
from smoe_gen.layout import GROUP_SIZE, num_groups, packed_size

__all__ = ["decode", "decode_bf16", "decoder_kernels"]


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
    :func:`~smoe.quant.encode` (the compiled decoder, :mod:`smoe.quant.kernels.decode`, gives
    the same bits).

    >>> import numpy as np
    >>> from smoe.quant import encode
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> packed, scales = encode(w, 2)
    >>> back = decode(packed, scales, 2, w.shape)
    >>> back.shape, back.dtype
    ((2, 64), dtype('float32'))
    >>> np.unique(back)  # Q2: four levels, +-scale and +-scale/3
    array([-0.7558594 , -0.25195312,  0.25195312,  0.7558594 ], dtype=float32)
    """
    return _decode_as(np.float32, packed, scales, bits, shape, out, chunk_weights, kernel)


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
    >>> from smoe.quant import encode
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> packed, scales = encode(w, 2)
    >>> bf = decode_bf16(packed, scales, 2, w.shape)
    >>> bf.shape, [hex(v) for v in np.unique(bf)]  # 0.7558594 is 0x3f418000: a tie, to even
    ((2, 64), ['0x3e81', '0x3f42', '0xbe81', '0xbf42'])
    """
    return _decode_as(np.uint16, packed, scales, bits, shape, out, chunk_weights, kernel)


def decoder_kernels(kernel: Kernel | None = None) -> list[KernelCall]:
    """The compiled decoder's kernels, each as a call that compiles or loads it
    (:class:`~smoe.quant.compiling.KernelCall`): to float32 and to bfloat16, from arrays
    of one's own and from read-only ones (a vault's views); none where numpy decodes large
    tensors (``kernel``, default ``$SMOE_KERNEL``; or no numba).

    >>> decoder_kernels("numpy")
    []
    """
    qk = chosen_module("decode", FAST_MIN_WEIGHTS, kernel)
    if qk is None:
        return []
    calls = []
    for readonly in (False, True):
        for dtype in (np.float32, np.uint16):
            name = f"decode to {'float32' if dtype is np.float32 else 'bfloat16'}"
            name += ", read-only input" if readonly else ""
            run = partial(_decode_sample, dtype, readonly)
            calls.append(KernelCall(name, run, partial(_decoded_cached, qk, dtype, readonly)))
    return calls


_SAMPLE_SHAPE = (GROUP_SIZE * 2 + 1,)  # two groups and a partial one


def _sample(readonly: bool) -> tuple[np.ndarray, np.ndarray]:
    """Codes and scales of :data:`_SAMPLE_SHAPE` weights (Q4, zeros)."""
    n = _SAMPLE_SHAPE[0]
    packed, scales = np.zeros(packed_size(n, 4), np.uint8), np.zeros(num_groups(n), "<f2")
    for a in (packed, scales):
        a.flags.writeable = not readonly
    return packed, scales


def _decode_sample(dtype: type, readonly: bool) -> None:
    """Decode the :func:`_sample` with the compiled decoder (compiling or loading it)."""
    packed, scales = _sample(readonly)
    _decode_as(dtype, packed, scales, 4, _SAMPLE_SHAPE, None, CHUNK_WEIGHTS, "fast")


def _decoded_cached(qk: ModuleType, dtype: type, readonly: bool) -> bool | None:
    """Whether the compiled decoder would find its code for the :func:`_sample` (in this
    process or numba's disk cache); nothing is compiled, loaded or decoded."""
    packed, scales = _sample(readonly)
    p, sc, _, flat = _decode_args(packed, scales, 4, _SAMPLE_SHAPE, None, dtype, CHUNK_WEIGHTS)
    found: bool | None = qk.decode_into_cached(p, _scale_bytes(sc), 4, flat)
    return found


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
    fast = decode_kernels(flat.size, kernel)
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
    check_bits(bits)
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


def _decode_chunk(
    p: np.ndarray, sc: np.ndarray, bits: int, start: int, stop: int, dst: np.ndarray
) -> None:
    """The numpy decoder: weights ``start:stop`` (``start`` at a group) into float32 ``dst``."""
    per = 8 // bits
    levels = level_lut(bits)[p[start // per : -(-stop // per)]].reshape(-1)[: stop - start]
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
