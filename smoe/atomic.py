"""Atomic file creation: a temporary file beside the target, fsync, rename, fsync the folder.

Until :meth:`AtomicFile.commit` nothing exists under the final name; :meth:`abort`
(or leaving a ``with`` block by an exception) removes the temporary file. The temporary
file is created exclusively and never through a symlink (:mod:`smoe.fileio`); a fixed
temporary name (a resumable partial file) is reused only if it is a regular file of ours.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from smoe import fileio
from smoe.fileio import current_umask, fsync_dir

if TYPE_CHECKING:
    from collections.abc import Buffer

__all__ = ["AtomicFile", "current_umask", "fsync_dir", "sweep_stale"]


_TMP = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{8}\.tmp$")


def sweep_stale(path: str | os.PathLike) -> int:
    """Remove the temporary files a killed writer of ``path`` left (regular files only).

    Call it only while holding the target's lock: a live writer's temporary file has the
    same form. Returns how many were removed.
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


class AtomicFile:
    """A file written under a temporary name and renamed onto ``path`` when complete."""

    def __init__(self, path: str | os.PathLike, tmp: str | os.PathLike | None = None) -> None:
        self.path = Path(path)
        fileio.ensure_dir(self.path.parent)
        if tmp is None:
            while True:
                self.tmp = self.path.parent / f".{self.path.name}.{secrets.token_hex(4)}.tmp"
                try:
                    fd = fileio.create_new(self.tmp)
                    break
                except fileio.SmoeError:
                    if not os.path.lexists(self.tmp):
                        raise
        else:  # a fixed name, e.g. a resumable partial file
            self.tmp = Path(tmp)
            fd = fileio.open_owned(self.tmp)
        self.fd: int | None = fd

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def pwrite(self, data: Buffer, offset: int) -> None:
        """Write all of ``data`` at ``offset`` (checked; see :func:`fileio.pwrite_all`)."""
        assert self.fd is not None, "write to a closed AtomicFile"
        fileio.pwrite_all(self.fd, data, offset, self.path)

    def truncate(self, size: int) -> None:
        assert self.fd is not None, "truncate of a closed AtomicFile"
        fileio.truncate(self.fd, size, self.path)

    def sync(self) -> None:
        """fsync the data without renaming (before a companion file is renamed)."""
        assert self.fd is not None, "sync of a closed AtomicFile"
        fileio.fsync(self.fd, self.path)

    def commit(self) -> Path:
        """fsync the data, rename onto the final name, fsync the folder."""
        assert self.fd is not None, "commit of a closed AtomicFile"
        try:
            fileio.fsync(self.fd, self.path)
            os.close(self.fd)
            self.fd = None
            fileio.rename(self.tmp, self.path)
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
        fileio.unlink_owned(self.tmp)
