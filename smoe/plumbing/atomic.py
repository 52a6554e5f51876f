"""Atomic file creation: a temporary file beside the target, fsync, rename, fsync the folder.

Until :meth:`AtomicFile.commit` nothing exists under the final name; :meth:`abort`
(or leaving a ``with`` block by an exception) removes the temporary file. The temporary
file is created exclusively and never through a symlink (:mod:`smoe.plumbing.fileio`); a fixed
temporary name (a resumable partial file) is reused only if it is a regular file of ours.
An existing target that is not a regular file (a FIFO, a device, a folder) is refused before
anything is created, and again at the rename; a file that is replaced passes its owner, group
and mode on to the new one (a new file takes the umask's mode).
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from smoe.errors import WriteFailed
from smoe.plumbing import fileio
from smoe.plumbing.fileio import fsync_dir

if TYPE_CHECKING:
    from collections.abc import Buffer
    from types import TracebackType

__all__ = ["AtomicFile", "Signature", "put_in_place", "refuse_foreign", "sweep_stale"]


@dataclass(frozen=True)
class Signature:
    """How one kind of output smoe writes is known again, so that a replacing write (the
    CLI's ``--force``, the API's default) never replaces a file smoe did not write.

    ``probe`` reads an open, regular existing file (bounded) and says whether it is one.

    >>> import tempfile
    >>> greeting = Signature("a greeting", lambda fd: os.pread(fd, 5, 0) == b"hello")
    >>> path = tempfile.mkdtemp() + "/out.txt"
    >>> with AtomicFile(path, ours=greeting) as f:  # nothing there yet: created
    ...     f.pwrite(b"hello", 0)
    ...     _ = f.commit()
    >>> fd = os.open(path, os.O_RDONLY); greeting.probe(fd)
    True
    >>> os.close(fd)
    """

    what: str  # "a .smoe vault", for the refusal
    probe: Callable[[int], bool]


def refuse_foreign(path: str | os.PathLike, ours: Signature) -> None:
    """Refuse (:class:`~smoe.errors.WriteFailed`) a regular file at ``path`` that is not
    ``ours``: nothing there, or a symlink (replaced, never followed), passes.

    >>> import tempfile
    >>> sig = Signature("a greeting", lambda fd: os.pread(fd, 5, 0) == b"hello")
    >>> refuse_foreign(tempfile.mkdtemp() + "/absent", sig)
    >>> refuse_foreign("LICENSE", sig)
    Traceback (most recent call last):
    smoe.errors.WriteFailed: LICENSE: exists and smoe did not write it (not a greeting); ...
    """
    fd = fileio.open_existing(path)
    if fd is None:
        return  # absent, a symlink, or out of reach: creating or renaming says why
    try:
        st = os.fstat(fd)
        ok = not stat.S_ISREG(st.st_mode) or ours.probe(fd)  # not a file: existing_output's
    except (OSError, ValueError):
        ok = False
    finally:
        os.close(fd)
    if not ok:
        raise WriteFailed(
            f"{path}: exists and smoe did not write it (not {ours.what}); --force replaces "
            "only what smoe wrote: move it away yourself if it is to go"
        )


_TMP = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{8}\.tmp$")


def sweep_stale(path: str | os.PathLike) -> int:
    """Remove the temporary files a killed writer of ``path`` left (regular files only).

    Call it only while holding the target's lock: a live writer's temporary file has the
    same form. Returns how many were removed.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> f = AtomicFile(f"{d}/out.smoe")  # as a killed writer leaves it: never committed
    >>> os.close(f.fd)
    >>> sweep_stale(f"{d}/out.smoe"), os.listdir(d)
    (1, [])
    """
    path = Path(path)
    removed = 0
    try:
        names = os.listdir(path.parent)
    except OSError:
        return 0
    for name in names:
        m = _TMP.match(name)
        if m and m.group("name") == path.name:
            fileio.unlink_owned(path.parent / name)
            removed += 1
    return removed


def put_in_place(f: AtomicFile) -> None:
    """Rename ``f``'s closed temporary file onto its path: replacing what is there, or
    (``f.replace`` False) only if nothing is (:func:`~smoe.plumbing.fileio.rename_new`).

    >>> import os, tempfile
    >>> f = AtomicFile(tempfile.mkdtemp() + "/out.bin", replace=False)
    >>> os.close(f.fd); f.fd = None  # (as a commit closes it)
    >>> put_in_place(f); f.path.exists(), f.tmp.exists()
    (True, False)
    """
    if f.replace:
        if f.ours is not None:
            refuse_foreign(f.path, f.ours)  # again: a file put there meanwhile is kept
        fileio.rename(f.tmp, f.path)
    else:
        fileio.rename_new(f.tmp, f.path)


class AtomicFile:
    """A file written under a temporary name and renamed onto ``path`` when complete.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with AtomicFile(f"{d}/out.bin") as f:
    ...     f.pwrite(b"hello", 0)
    ...     os.listdir(d) == [f.tmp.name]  # only the temporary file so far
    ...     f.commit().name
    True
    'out.bin'
    >>> os.listdir(d)
    ['out.bin']
    """

    def __init__(
        self,
        path: str | os.PathLike,
        tmp: str | os.PathLike | None = None,
        replace: bool = True,
        ours: Signature | None = None,
    ) -> None:
        """``replace=False``: an existing ``path`` is refused now and at the commit, which
        then never replaces it (:func:`~smoe.plumbing.fileio.rename_new`), so that an output
        that appears meanwhile (another run) is kept: :class:`~smoe.errors.OutputExists`.
        ``ours``: a file replaced must carry that signature, now and at the commit."""
        self.path = Path(path)
        self.replace = replace
        self.ours = ours
        if not replace:
            fileio.refuse_existing(self.path)
        elif ours is not None:
            refuse_foreign(self.path, ours)
        replaced = fileio.existing_output(self.path)  # a FIFO or a device: refused here
        fileio.ensure_dir(self.path.parent)
        if tmp is None:
            while True:
                self.tmp = self.path.parent / f".{self.path.name}.{secrets.token_hex(4)}.tmp"
                try:
                    fd = fileio.create_new(self.tmp)
                    break
                except WriteFailed:
                    if not os.path.lexists(self.tmp):
                        raise
            fileio.take_over(fd, replaced)  # never wider than the file it replaces
        else:  # a fixed name, e.g. a resumable partial file: takes over at the rename, so
            self.tmp = Path(tmp)  # that a read-only target cannot lock a resume out
            fd = fileio.open_owned(self.tmp)
        self.fd: int | None = fd

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()

    def pwrite(self, data: Buffer, offset: int) -> None:
        """Write all of ``data`` at ``offset`` (checked; see :func:`fileio.pwrite_all`).

        >>> import tempfile, numpy as np
        >>> f = AtomicFile(tempfile.mkdtemp() + "/out.bin")
        >>> f.pwrite(np.ones(2, "<u2"), 1)
        >>> f.commit().read_bytes().hex(" ")
        '00 01 00 01 00'
        """
        assert self.fd is not None, "write to a closed AtomicFile"
        fileio.pwrite_all(self.fd, data, offset, self.path)

    def truncate(self, size: int) -> None:
        """Set the temporary file's size (a larger size leaves a hole that reads as zeros).

        >>> import tempfile
        >>> f = AtomicFile(tempfile.mkdtemp() + "/out.bin")
        >>> f.truncate(16384)
        >>> f.commit().stat().st_size
        16384
        """
        assert self.fd is not None, "truncate of a closed AtomicFile"
        fileio.truncate(self.fd, size, self.path)

    def sync(self) -> None:
        """fsync the data without renaming (before a companion file is renamed).

        >>> import tempfile
        >>> f = AtomicFile(tempfile.mkdtemp() + "/out.bin")
        >>> f.pwrite(b"data", 0)
        >>> f.sync()
        >>> f.path.exists()  # still under the temporary name
        False
        >>> f.abort()
        """
        assert self.fd is not None, "sync of a closed AtomicFile"
        fileio.fsync(self.fd, self.path)

    def commit(self) -> Path:
        """fsync the data, rename onto the final name, fsync the folder; returns the path.

        >>> import tempfile
        >>> f = AtomicFile(tempfile.mkdtemp() + "/out.bin")
        >>> f.pwrite(b"data", 0)
        >>> f.commit().read_bytes(), f.tmp.exists()
        (b'data', False)
        """
        assert self.fd is not None, "commit of a closed AtomicFile"
        try:
            fileio.fsync(self.fd, self.path)
            os.close(self.fd)
            self.fd = None
            put_in_place(self)
            fsync_dir(self.path.parent)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Close and delete the temporary file (idempotent).

        >>> import os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> f = AtomicFile(f"{d}/out.bin")
        >>> f.pwrite(b"data", 0)
        >>> f.abort(); f.abort()
        >>> os.listdir(d)
        []
        """
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        fileio.unlink_owned(self.tmp)
