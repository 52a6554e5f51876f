"""Which code encodes or decodes a tensor: the numpy reference or the compiled kernels
(:mod:`smoe.quant.kernels`, with numba installed). ``kernel=`` or ``$SMOE_KERNEL`` chooses:
``auto`` (compiled from :data:`~smoe.quant.traits.FAST_MIN_WEIGHTS` weights on, when numba
imports), ``numpy`` or ``fast`` (compiled for every size; an error without numba). The
kernel modules are imported once per process, on first use."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from smoe.errors import SmoeError
from smoe.quant.traits import FAST_MIN_WEIGHTS, KERNEL_ENV, Kernel

__all__ = ["decode_kernels", "fast_kernels"]

_FAST: dict[str, ModuleType | bool | None] = {}
"""Per process: the encoder's kernels module ("module") and the decoder's ("decode"), None
without numba, and whether numpy's einsum sums as the Q4 kernel assumes ("q4")."""


def _compiled(key: str, name: str, n: int, kernel: Kernel | None) -> ModuleType | None:
    """The compiled module ``smoe.quant.kernels.<name>`` (imported once, kept in
    ``_FAST[key]``) if ``kernel`` (default: ``$SMOE_KERNEL`` or ``auto``) wants it for ``n``
    weights; None for numpy. ``fast`` without numba is an error; ``auto`` then quietly stays
    on numpy. (Plain :class:`~smoe.errors.SmoeError`s, exit status 1: a bad
    ``$SMOE_KERNEL`` or a missing numba is not a refused command line.)"""
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


def decode_kernels(n: int, kernel: Kernel | None = None) -> ModuleType | None:
    """The compiled decoder (:mod:`smoe.quant.kernels.decode`) if it should decode ``n``
    weights with ``kernel`` (default: ``$SMOE_KERNEL`` or ``auto``), as :func:`fast_kernels`
    chooses the encoder; else None.

    >>> decode_kernels(4096, "auto") is None, decode_kernels(1 << 30, "numpy") is None
    (True, True)
    """
    return _compiled("decode", "decode", n, kernel)
