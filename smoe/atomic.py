"""Atomic file creation: a temporary file beside the target, fsync, rename, fsync the folder.

Until :meth:`AtomicFile.commit` nothing exists under the final name; :meth:`abort`
(or leaving a ``with`` block by an exception) removes the temporary file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicFile:
    """A file written under a temporary name and renamed onto ``path`` when complete."""

    def __init__(self, path: str | os.PathLike, tmp: str | os.PathLike | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if tmp is None:
            fd, name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                        dir=self.path.parent)
            self.tmp = Path(name)
        else:  # a fixed name, e.g. a resumable partial file
            self.tmp = Path(tmp)
            fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT, 0o666)
        self.fd: int | None = fd
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0600 is not what users expect

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    @property
    def active(self) -> bool:
        return self.fd is not None

    def commit(self) -> Path:
        """fsync the data, rename onto the final name, fsync the folder."""
        assert self.fd is not None, "commit of a closed AtomicFile"
        try:
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None
            os.replace(self.tmp, self.path)
            fsync_dir(self.path.parent)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Close and delete the temporary file (idempotent)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.tmp.unlink(missing_ok=True)
