"""Atomic folder creation, the sibling of :class:`~smoe.plumbing.atomic.AtomicFile`: a
temporary folder beside the target, filled, fsynced, renamed onto it, the parent fsynced.

Until :meth:`AtomicFolder.commit` nothing exists under the final name; leaving the ``with``
block by an exception removes the temporary folder by the caller's rule (``remove``: only
what it wrote). The temporary folder (``.<name>.<8 hex>.tmp``) is new, made with the owner,
group and mode of an (empty) folder it replaces; what is at the target is checked as any
output is (:func:`smoe.plumbing.fileio.existing_output`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

from smoe.errors import WriteFailed
from smoe.plumbing import fileio

__all__ = ["AtomicFolder", "make_tmp_dir"]


def make_tmp_dir(out_dir: Path) -> Path:
    """A new folder beside ``out_dir``, with the owner, group and mode of the (empty)
    folder there it is to replace, from the start.

    >>> import tempfile
    >>> tmp = make_tmp_dir(Path(tempfile.mkdtemp()) / "out")
    >>> tmp.name.startswith(".out.") and tmp.name.endswith(".tmp"), tmp.is_dir()
    (True, True)
    """
    replaced = fileio.existing_output(out_dir, folder=True)
    while True:
        tmp = out_dir.parent / f".{out_dir.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.mkdir(tmp, 0o777)
            fileio.take_over(tmp, replaced)
            return tmp
        except FileExistsError:
            continue
        except OSError as e:
            raise WriteFailed(f"{tmp}: cannot create the folder: {e.strerror or e}") from None


class AtomicFolder:
    """A folder written whole or not at all: fill :attr:`tmp`, then :meth:`commit`.

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "export"
    >>> with AtomicFolder(out, remove=lambda tmp: None) as staged:
    ...     _ = (staged.tmp / "a.txt").write_text("hi")
    ...     staged.commit()
    >>> sorted(p.name for p in out.iterdir())
    ['a.txt']
    """

    def __init__(self, target: Path, remove: Callable[[Path], None]) -> None:
        self.target = target
        self.tmp = make_tmp_dir(target)
        self.remove = remove
        self.committed = False

    def __enter__(self) -> AtomicFolder:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None and not self.committed:
            self.remove(self.tmp)

    def commit(
        self,
        move_aside: Callable[[], Path | None] = lambda: None,
        put_back: Callable[[Path, Path], None] | None = None,
    ) -> Path | None:
        """fsync the folder and rename it onto the target; ``move_aside()`` first takes what
        is there out of the way (the path it went to, or None), and ``put_back(aside,
        target)`` returns it if the rename fails. Returns the aside path.

        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "out"
        >>> with AtomicFolder(out, remove=lambda tmp: None) as staged:
        ...     staged.commit() is None
        True
        """
        fileio.fsync_dir(self.tmp)
        old = move_aside()
        try:
            fileio.rename(self.tmp, self.target)
        except BaseException:
            if old is not None and put_back is not None:
                put_back(old, self.target)  # what was there, back in place
            raise
        self.committed = True
        fileio.fsync_dir(self.target.parent if str(self.target.parent) else Path("."))
        return old
