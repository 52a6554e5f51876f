"""One writer per output: an exclusive lock file beside it, named by :func:`lock_for`.

Every command that writes a vault, an export folder or a vault's manifest holds the lock of
its output while it writes, so two runs never interleave; the name is spelled here only.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from smoe.errors import WriteFailed
from smoe.plumbing.fileio import open_owned, pwrite_all, same_file

__all__ = ["Lock", "lock_for"]


def lock_for(path: str | os.PathLike) -> Path:
    """The lock file of ``path``: ``.<name>.lock`` beside it (the name as given: a caller
    that locks a file's real target resolves symlinks first).

    >>> str(lock_for("out/q4.smoe"))
    'out/.q4.smoe.lock'
    """
    p = Path(path)
    return p.parent / f".{p.name}.lock"


class Lock:
    """An exclusive ``flock`` on ``path`` (created without following links) holding our pid.

    The kernel drops the lock when the process dies, so a killed run never blocks the next
    one. A clean release removes the file; a run that finds the file replaced after locking
    it (a racing release) simply locks the new one.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with Lock(f"{d}/.out.smoe.lock", "out.smoe"):
    ...     Lock(f"{d}/.out.smoe.lock", "out.smoe").__enter__()
    Traceback (most recent call last):
    smoe.errors.WriteFailed: out.smoe: another smoe process (pid ...) is writing it; wait ...
    >>> os.listdir(d)  # released: the lock file is gone
    []
    """

    def __init__(self, path: str | os.PathLike, target: str | os.PathLike) -> None:
        self.path = Path(path)
        self.target = target
        self.fd: int | None = None

    def __enter__(self) -> Lock:
        for _ in range(100):
            fd = open_owned(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = ""
                try:
                    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                    holder = f" (pid {text})" if text.isdigit() else ""
                except OSError:
                    pass
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise WriteFailed(
                        f"{self.target}: another smoe process{holder} is writing "
                        f"it; wait for it to finish (lock {self.path.name})"
                    ) from None
                raise WriteFailed(f"{self.path}: cannot lock: {e.strerror or e}") from None
            try:
                current = os.lstat(self.path)
            except OSError:
                current = None
            if current is None or not same_file(current, os.fstat(fd)):
                os.close(fd)  # released and removed by its holder meanwhile: lock the new one
                continue
            try:
                os.ftruncate(fd, 0)
                pwrite_all(fd, f"{os.getpid()}\n".encode(), 0, self.path)
            except BaseException:
                os.close(fd)
                raise
            self.fd = fd
            return self
        raise WriteFailed(f"{self.path}: cannot lock: the lock file keeps being replaced")

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Remove the lock file and drop the lock (still held while the file is removed).

        >>> import os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> lock = Lock(f"{d}/.out.smoe.lock", "out.smoe").__enter__()
        >>> os.listdir(d)
        ['.out.smoe.lock']
        >>> lock.release(); os.listdir(d)
        []
        """
        if self.fd is not None:
            try:
                st = os.lstat(self.path)
                if same_file(st, os.fstat(self.fd)):
                    os.unlink(self.path)
            except OSError:
                pass
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = None
