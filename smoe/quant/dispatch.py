"""Which code encodes or decodes a tensor: the numpy reference or the compiled kernels
(:mod:`smoe.quant.kernels`, with numba installed). ``kernel=`` or ``$SMOE_KERNEL`` chooses:
``auto`` (compiled from :data:`~smoe.quant.traits.FAST_MIN_WEIGHTS` weights on, when numba
imports), ``numpy`` or ``fast`` (compiled for every size; an error without numba). The
kernel modules are imported once per process, on first use. Inside :func:`run_choice`,
``auto`` means that block's choice (a run's: :func:`smoe.quant.first_run.run_kernel`)."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from types import ModuleType

from smoe.errors import MissingExtra, SmoeError
from smoe.quant.traits import FAST_MIN_WEIGHTS, KERNEL_ENV, Kernel

__all__ = ["chosen_module", "compiled_module", "decode_kernels", "fast_kernels", "run_choice"]

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
    if choice == "auto" and _RUN:
        choice = _RUN[-1]
    if choice == "numpy" or (choice == "auto" and n < FAST_MIN_WEIGHTS):
        return None
    module = _imported(key, name)
    if module is None:  # the kernels could not be imported
        if choice == "fast":
            raise MissingExtra.needs(f"{KERNEL_ENV}=fast needs numba", "fast")
        return None
    return module


def _imported(key: str, name: str) -> ModuleType | None:
    """``smoe.quant.kernels.<name>``, imported once per process (kept in ``_FAST[key]``);
    None without numba."""
    if key not in _FAST:
        try:
            _FAST[key] = importlib.import_module(f"smoe.quant.kernels.{name}")
        except ImportError:
            _FAST[key] = None
    module = _FAST[key]
    return module if isinstance(module, ModuleType) else None


def chosen_module(
    name: str, n: int = FAST_MIN_WEIGHTS, kernel: Kernel | None = None
) -> ModuleType | None:
    """The module ``smoe.quant.kernels.<name>`` (``encode`` or ``decode``) if ``kernel``
    (default: ``$SMOE_KERNEL``, a :func:`run_choice`, or ``auto``) wants the compiled code
    for ``n`` weights, else None; unlike :func:`fast_kernels`, without checking (running)
    numpy's einsum order.

    >>> chosen_module("encode", 1 << 30, "numpy") is None
    True
    """
    return _compiled({"encode": "module", "decode": "decode"}[name], name, n, kernel)


def compiled_module(name: str) -> ModuleType | None:
    """The compiled kernels' module ``smoe.quant.kernels.<name>`` (``encode`` or ``decode``),
    whatever ``kernel`` or ``$SMOE_KERNEL`` say, with no check run; None without numba.

    >>> module = compiled_module("encode")  # None without numba
    >>> module is None or module.__name__ == "smoe.quant.kernels.encode"
    True
    """
    return _imported({"encode": "module", "decode": "decode"}[name], name)


_RUN: list[Kernel] = []
"""The choices of the :func:`run_choice` blocks this process is in, innermost last."""


@contextlib.contextmanager
def run_choice(kernel: Kernel | None) -> Iterator[None]:
    """Inside the block ``auto`` means ``kernel`` (None: ``auto`` stays ``auto``): a
    run's one choice for all of its tensors (:func:`smoe.quant.first_run.run_kernel`), which
    forked workers inherit. ``kernel=`` and ``$SMOE_KERNEL`` still win.

    >>> with run_choice("numpy"):
    ...     fast_kernels(4, "optimal", n=1 << 30, kernel="auto") is None
    True
    """
    if kernel is None:
        yield
        return
    _RUN.append(kernel)
    try:
        yield
    finally:
        _RUN.pop()


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
