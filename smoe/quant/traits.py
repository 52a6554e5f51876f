"""The numbers of SMOE-Q2/Q4 every part of the quantiser shares: bit widths and their
decoding centre, the fp16 ceiling, chunk sizes, the kernel switch, the SNR floors, and the
argument types of the public API."""

from __future__ import annotations

from typing import Literal

import numpy as np

from smoe_gen.layout import GROUP_SIZE, SUPPORTED_BITS

__all__ = [
    "CHUNK_WEIGHTS",
    "FAST_MIN_WEIGHTS",
    "FP16_MAX",
    "KERNEL_ENV",
    "OK_BITS",
    "SNR_FLOOR_DB",
    "Kernel",
    "Overflow",
    "ScaleMode",
    "SrcDtype",
    "check_bits",
    "level_center",
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

OK_BITS = {
    "clip": int(np.float32(np.finfo(np.float32).max).view(np.int32)),
    "raise": int(np.float32(FP16_MAX).view(np.int32)),
}
"""Per ``overflow`` mode, the largest acceptable ``|w|`` as a float32 bit pattern: a
larger pattern in a group's absmax is non-finite (both modes) or above 65504 ("raise")."""


def level_center(bits: int) -> float:
    """The ``c`` of ``w = (code - c) / c * scale``: ``(2**bits - 1) / 2``.

    >>> level_center(4), level_center(2)
    (7.5, 1.5)
    """
    check_bits(bits)
    return ((1 << bits) - 1) / 2


def check_bits(bits: int) -> None:
    """Refuse a bit width the format does not define (or whose group is not whole bytes).

    >>> check_bits(4)
    >>> check_bits(3)
    Traceback (most recent call last):
    ValueError: bits must be one of (2, 4), got 3
    """
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    if (GROUP_SIZE * bits) % 8:
        raise ValueError(f"a group of {GROUP_SIZE} {bits}-bit codes is not whole bytes")
