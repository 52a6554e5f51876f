"""Python code compiled from generated source, kept on disk as ``.pyc`` files are: the
compiled encoder's straight-line kernels are some 200 KB of generated Python, and compiling
them again in every process costs about a tenth of a sculpt's set-up.

A cached entry is ``__pycache__/<module>.gen-<key>.<cache tag>.bin`` beside the module (or
under ``sys.pycache_prefix``): the interpreter's magic number, the SHA-256 of the source,
then the marshalled code object. Anything that does not match (another interpreter, other
source, a torn or damaged file) is compiled afresh and the entry rewritten; an entry that
cannot be written (a read-only install) is simply not kept. Like numba's cache of the same
kernels beside it, it is kept whatever ``PYTHONDONTWRITEBYTECODE`` says: that flag is about
the import system's ``.pyc`` files.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import marshal
import sys
from pathlib import Path
from types import CodeType

from smoe.errors import RefusedInput, SmoeError
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile

__all__ = ["cache_path", "compile_cached"]

_MAGIC = importlib.util.MAGIC_NUMBER
_MAX = 64 << 20  # far above any generated kernel's code


def cache_path(source: str, filename: str) -> Path | None:
    """Where the code compiled from ``source`` (attributed to ``filename``) is kept, or None
    where this interpreter keeps no bytecode cache.

    >>> p = cache_path("x = 1", "smoe/quant/kernels/encode.py")
    >>> p.parent.name, p.name.startswith("encode.gen-"), p.suffix
    ('__pycache__', True, '.bin')
    """
    return _entry(hashlib.sha256(source.encode()).digest(), filename)


def _entry(digest: bytes, filename: str) -> Path | None:
    """:func:`cache_path` for source whose SHA-256 is ``digest``."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    pyc = Path(importlib.util.cache_from_source(filename))
    return pyc.with_name(f"{Path(filename).stem}.gen-{digest.hex()[:24]}.{tag}.bin")


def compile_cached(source: str, filename: str) -> CodeType:
    """``compile(source, filename, "exec")``, from the disk cache when it holds this very
    source for this interpreter, else compiled and (where writable) kept.

    >>> import tempfile
    >>> name = tempfile.mkdtemp() + "/gen.py"
    >>> first = compile_cached("def f():\\n    return 41 + 1\\n", name)  # compiled, kept
    >>> again = compile_cached("def f():\\n    return 41 + 1\\n", name)  # from the cache
    >>> again == first, again.co_filename == name
    (True, True)
    """
    digest = hashlib.sha256(source.encode()).digest()
    path = _entry(digest, filename)
    if path is not None:
        with contextlib.suppress(OSError, ValueError, EOFError, TypeError, SmoeError):
            data = fileio.read_whole(path, _MAX, lambda size: RefusedInput(f"{path}: too large"))
            head = len(_MAGIC) + len(digest)
            if data[:head] == _MAGIC + digest:
                code = marshal.loads(data[head:])
                if isinstance(code, CodeType) and code.co_filename == filename:
                    return code
    code = compile(source, filename, "exec")
    if path is not None:
        _keep(path, _MAGIC + digest + marshal.dumps(code))
    return code


def _keep(path: Path, data: bytes) -> None:
    """Write a cache entry atomically; a failure only means it is not kept."""
    with contextlib.suppress(OSError, SmoeError), AtomicFile(path) as out:
        out.pwrite(data, 0)
        out.commit()
