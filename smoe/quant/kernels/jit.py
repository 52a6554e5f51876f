"""How the compiled kernels (:mod:`smoe.quant.kernels.encode`, :mod:`smoe.quant.kernels.decode`) are
compiled: one ``numba.njit`` setting for both. Importing this module needs numba."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numba
from numba.core import event

from smoe.quant.kernels.disk_cache import give_cache

__all__ = ["cached", "compiles_watched", "jit"]


def jit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit`` with IEEE semantics (``error_model="numpy"``: ``x / 0`` is inf or nan,
    as in numpy; no fastmath unless asked), without the GIL (a sculpt's reader thread and
    an export's decoding threads run meanwhile), cached on disk where a location is
    writable (``NUMBA_CACHE_DIR`` when set, else ``__pycache__``; compiled in memory
    otherwise), a damaged entry compiled afresh (:mod:`smoe.quant.kernels.disk_cache`).

    >>> @jit()
    ... def ratio(a, b):
    ...     return a / b
    >>> ratio(3.0, 2.0), ratio(1.0, 0.0)  # IEEE: inf, not ZeroDivisionError
    (1.5, inf)
    """

    def wrap(fn: Callable[..., Any]) -> Any:
        options.setdefault("error_model", "numpy")
        options.setdefault("nogil", True)
        dispatcher = numba.njit(**options)(fn)
        give_cache(dispatcher)  # numba's disk cache, failing soft (damaged, unwritable)
        return dispatcher

    return wrap


def cached(dispatcher: Any, args: tuple[Any, ...]) -> bool | None:
    """Whether calling ``dispatcher`` (a :func:`jit` function) with ``args`` would find its
    machine code without compiling: already compiled in this process, or in numba's disk
    cache. Nothing is compiled or loaded: this asks the cache's index what numba's own
    lookup asks it (the argument types, this CPU, the function's bytecode, under the
    source file's current stamp and this numba's version) and checks that the data file it
    names is there. None where numba's internals are not as this expects (another numba).

    >>> @jit()
    ... def twice(x):
    ...     return 2 * x
    >>> cached(twice, (1.5,)) in (True, False)  # on disk from an earlier run, or not
    True
    >>> twice(1.5), cached(twice, (1.5,))  # compiled (or loaded) now: in this process
    (3.0, True)
    """
    try:
        types = tuple(dispatcher.typeof_pyval(a) for a in args)
        if dispatcher.overloads.get(types) is not None:
            return True
        cache = dispatcher._cache
        index_file = getattr(cache, "_cache_file", None)
        if index_file is None:  # a NullCache: nothing is kept on disk
            return False
        key = cache._index_key(types, dispatcher.targetctx.codegen())
        data = index_file._load_index().get(key)
        return data is not None and os.path.isfile(os.path.join(cache.cache_path, data))
    except Exception:  # numba's private layout is not as expected: cannot tell
        return None


@contextlib.contextmanager
def compiles_watched(on_compile: Callable[[], None]) -> Iterator[None]:
    """Inside the block, ``on_compile()`` is called as each numba compilation starts (a cache
    miss: numba broadcasts its ``numba:compile`` event only when it compiles, never when
    it loads from its disk cache), nested ones (callees) included.

    >>> seen = []
    >>> with compiles_watched(lambda: seen.append(1)):
    ...     _ = numba.njit(lambda x: x + 1)(1)  # not cached: compiled
    >>> len(seen) >= 1
    True
    """

    class Listener(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            on_compile()

        def on_end(self, ev: event.Event) -> None:
            pass

    with event.install_listener("numba:compile", Listener()):
        yield
