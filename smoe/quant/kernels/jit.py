"""How the compiled kernels (:mod:`smoe.quant.kernels.encode`, :mod:`smoe.quant.kernels.decode`) are
compiled: one ``numba.njit`` setting for both. Importing this module needs numba."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba

__all__ = ["jit"]


def jit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit`` with IEEE semantics (``error_model="numpy"``: ``x / 0`` is inf or nan,
    as in numpy; no fastmath unless asked), without the GIL (a sculpt's reader thread and
    an export's decoding threads run meanwhile), cached on disk where a location is
    writable (``__pycache__`` or ``NUMBA_CACHE_DIR``; compiled in memory otherwise).

    >>> @jit()
    ... def ratio(a, b):
    ...     return a / b
    >>> ratio(3.0, 2.0), ratio(1.0, 0.0)  # IEEE: inf, not ZeroDivisionError
    (1.5, inf)
    """

    def wrap(fn: Callable[..., Any]) -> Any:
        options.setdefault("error_model", "numpy")
        options.setdefault("nogil", True)
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # no writable cache location (e.g. a read-only install)
            return numba.njit(cache=False, **options)(fn)

    return wrap
