"""numba's disk cache of the compiled kernels, made to fail soft: a damaged entry is compiled
afresh and rewritten, a cache that cannot be written leaves the kernels compiled in memory,
and both are noted (:func:`notes`) for ``smoe warmup`` to say, never raised.

numba's own cache raises on an entry it cannot unpickle (a torn or garbled ``.nbi`` index
or ``.nbc`` data file: ``UnpicklingError``, ``EOFError``) and on a write that fails (a full
disk, a folder where a file belongs), which reached the user as internal errors. Here the
same cache (numba's files, names and layout, so ``numba`` and smoe share one cache) is
subclassed so that:

* a load that fails for any reason is a miss, and the entry is noted as damaged: the
  kernel is compiled and the save rewrites the entry (the index first, if it was the
  damaged part);
* a save that fails is noted with its reason, and the kernel runs from memory;
* with ``NUMBA_CACHE_DIR`` set, that folder is the only place the cache goes: numba would
  otherwise fall back silently to ``__pycache__`` beside the installed modules when the
  folder cannot be created. When it cannot, nothing is kept, and that is noted.

Everything here leans on numba's private caching classes (``numba.core.caching``); where
they are not as expected, :func:`give_cache` leaves numba's own cache in place.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

from smoe.errors import os_message

__all__ = ["CacheNotes", "give_cache", "notes"]


@dataclass
class CacheNotes:
    """What this process could not do with the disk cache, one line per place, first
    reason kept: ``damaged`` entries (compiled afresh; rewritten unless also in
    ``not_kept``), and places where compiled code could ``not_kept``.

    >>> CacheNotes().lines()
    ([], [])
    """

    damaged: dict[str, str] = field(default_factory=dict)
    not_kept: dict[str, str] = field(default_factory=dict)

    def rewritten(self, folder: str, base: str) -> None:
        """The function cached as ``folder/base.*`` was saved: its damaged entries are
        rewritten.

        >>> n = CacheNotes({"/c/f-1.py311.nbi": "EOFError; compiled afresh"})
        >>> n.rewritten("/c", "f-1.py311")
        >>> n.lines()[0]
        ['/c/f-1.py311.nbi: EOFError; compiled afresh and rewritten']
        """
        for path, why in self.damaged.items():
            head, name = os.path.split(path)
            done = why.endswith(" and rewritten")
            if head == folder and name.startswith(base + ".") and not done:
                self.damaged[path] = why + " and rewritten"

    def lines(self) -> tuple[list[str], list[str]]:
        """``(damaged, not_kept)`` as ``PLACE: WHY`` lines, in the order first seen.

        >>> CacheNotes(not_kept={"/ro/cache": "Read-only file system"}).lines()
        ([], ['/ro/cache: Read-only file system'])
        """
        return (
            [f"{where}: {why}" for where, why in self.damaged.items()],
            [f"{where}: {why}" for where, why in self.not_kept.items()],
        )


_NOTES = CacheNotes()


def notes() -> CacheNotes:
    """This process's notes (one object, filled in as kernels load and compile).

    >>> isinstance(notes(), CacheNotes)
    True
    """
    return _NOTES


def _why(e: BaseException, where: str = "") -> str:
    """One line of why: ``FILE: STRERROR`` for an OSError (``STRERROR`` when the file is
    ``where``, the place the line names already), else the exception's kind and text.

    >>> _why(IsADirectoryError(21, "Is a directory", "/c/f.nbi"), "/c/f.nbi")
    'Is a directory'
    >>> _why(EOFError("Ran out of input"))
    'EOFError: Ran out of input'
    """
    if isinstance(e, OSError):
        same = e.filename is not None and e.filename2 is None and os.fsdecode(e.filename) == where
        return (e.strerror or str(e)) if same else os_message(e)
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def give_cache(dispatcher: Any) -> None:
    """Give a ``numba.njit`` dispatcher compiled without ``cache=True`` the fail-soft disk
    cache; where there is no place to keep it, leave it compiling in memory (noted); where
    numba's internals are not as expected, numba's own cache.

    >>> import numba
    >>> from smoe.quant.traits import level_center
    >>> dispatcher = numba.njit(level_center)  # nothing compiled yet
    >>> give_cache(dispatcher)
    >>> type(dispatcher._cache).__name__ in ("FailSoftCache", "NullCache")  # Null: no place
    True
    """
    try:
        cls = _cache_class()
    except (ImportError, AttributeError, TypeError):  # another numba: its own cache
        with contextlib.suppress(RuntimeError):  # no writable cache location
            dispatcher.enable_caching()
        return
    try:
        dispatcher._cache = cls(dispatcher.py_func)
    except RuntimeError:  # numba found no place to keep it
        where, why = _no_place(dispatcher.py_func)
        _NOTES.not_kept.setdefault(where, why)


def _no_place(py_func: Any) -> tuple[str, str]:
    """Where the cache would have gone and why it cannot (``NUMBA_CACHE_DIR``'s folder, or
    the module's own)."""
    from numba.core import config

    folder = getattr(config, "CACHE_DIR", "")  # (set from NUMBA_CACHE_DIR at import)
    if folder:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            return str(folder), f"NUMBA_CACHE_DIR cannot be created ({_why(e)}); compiled in memory"
        return str(folder), "NUMBA_CACHE_DIR cannot be written; compiled in memory"
    source = getattr(getattr(py_func, "__code__", None), "co_filename", "?")
    return os.path.dirname(source), "no writable cache location; compiled in memory"


_CLASS: list[Any] = []


def _cache_class() -> Any:
    """The fail-soft ``FunctionCache`` subclass, made once."""
    if not _CLASS:
        _CLASS.append(_define())
    return _CLASS[0]


def _define() -> Any:
    from numba.core import caching, config

    class Index(caching.IndexDataCacheFile):
        """An index or data file that cannot be read is a miss, noted as damaged."""

        def _load_index(self) -> dict:
            try:
                return super()._load_index()
            except Exception as e:  # rewritten whole by the next save
                why = _why(e, self._index_path)
                _NOTES.damaged.setdefault(self._index_path, f"{why}; compiled afresh")
                return {}

        def _load_data(self, name: str) -> Any:
            try:
                return super()._load_data(name)
            except FileNotFoundError:
                raise  # numba's own miss: removed while the index names it
            except Exception as e:  # overwritten by the save of the same key
                where = os.path.join(self._cache_path, name)
                _NOTES.damaged.setdefault(where, f"{_why(e, where)}; compiled afresh")
                return None

    locators = list(caching.CompileResultCacheImpl._locator_classes)
    user = caching.UserProvidedCacheLocator

    class Impl(caching.CompileResultCacheImpl):
        _locator_classes = [user] if getattr(config, "CACHE_DIR", "") else locators

    class FailSoftCache(caching.FunctionCache):
        _impl_class = Impl

        def __init__(self, py_func: Any) -> None:
            super().__init__(py_func)
            old = self._cache_file
            self._cache_file = Index(old._cache_path, self._impl.filename_base, old._source_stamp)

        def load_overload(self, sig: Any, target_context: Any) -> Any:
            try:
                return super().load_overload(sig, target_context)
            except Exception as e:  # data that unpickles but does not rebuild
                _NOTES.damaged.setdefault(self._cache_path, f"{_why(e)}; compiled afresh")
                return None

        def save_overload(self, sig: Any, data: Any) -> None:
            try:
                super().save_overload(sig, data)
            except Exception as e:  # a full disk, a folder in the way: run from memory
                _NOTES.not_kept.setdefault(self._cache_path, f"{_why(e)}; compiled in memory")
            else:
                _NOTES.rewritten(self._cache_path, self._impl.filename_base)

    return FailSoftCache
