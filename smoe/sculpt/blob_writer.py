"""Writes the sculptor's blobs into the partial file from a thread of its own, with
``O_DIRECT`` where the file system takes it and the caller asks for it: the device reads
each blob straight from its buffer, sparing the CPU the page cache's copy, its dirty-page
bookkeeping and the write-back (a page-cached Q4 sculpt on 2 cores spent ~0.55 of its
~3 CPU-seconds of the experts phase there).

The sculptor asks for it when the expert's sources came from the page cache (the run is
CPU-bound); for an expert read from the disk it writes through the page cache with
write-back started at once, as the device is then the bound and the CPU has time to
spare (measured no slower, and the kernel merges the write-back).

Only whole 4 KiB blocks from a block-aligned offset go with ``O_DIRECT``; a blob's last
partial block goes through the page cache, so exactly the bytes of a buffered write are
written and the file's holes (each blob's padding) stay holes. A file system that refuses
``O_DIRECT`` (e.g. tmpfs on older kernels), or a direct write that fails, falls back to
buffered writes (a real error, ENOSPC or EIO, is then reported by
:func:`smoe.plumbing.fileio.pwrite_all` as one line naming the file).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import numpy as np

from smoe.errors import SmoeError
from smoe.plumbing import fileio

__all__ = ["BlobWriter"]

T = TypeVar("T")


def _sync_file_range() -> Callable[..., int] | None:
    """libc's ``sync_file_range`` (Linux), or None."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def _start_writeback(fd: int, offset: int, n: int) -> None:
    """Start writing ``n`` bytes at ``offset`` to disk now
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait), so that a later
    fsync has little left to wait for. Advice only: the fsync makes them durable and
    reports any error."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, n, _SYNC_FILE_RANGE_WRITE)


class BlobWriter(Generic[T]):
    """Writes blobs at their offsets from a thread, while the caller encodes the next.

    :meth:`buffer` gives a reused, block-aligned buffer to encode a blob into, and
    :meth:`write` hands it over with what to report once it is written; each report
    comes back (from :meth:`write` or :meth:`drain`) only once its blob's bytes are
    written, in the order given. Of the ``buffers`` buffers, the one :meth:`buffer`
    gives is never being written (at most ``buffers - 1`` writes are pending).
    ``fd``: the file opened for buffered writes; ``direct_fd``: the same file with
    ``O_DIRECT`` (:func:`smoe.plumbing.fileio.direct_io`), or None. Both are closed by
    :meth:`close`.

    >>> import tempfile
    >>> path = tempfile.mkdtemp() + "/blobs"
    >>> fd = fileio.create_new(path)
    >>> direct = os.open(path, os.O_WRONLY)
    >>> with BlobWriter(fd, path, direct if fileio.direct_io(direct) else None) as out:
    ...     blob = out.buffer(5000)
    ...     blob[:] = 7
    ...     done = list(out.write(blob, 8192, "first"))
    ...     done += out.write(out.buffer(3), 0, "second")
    ...     done += out.drain()
    >>> done, os.path.getsize(path), open(path, "rb").read()[8192:][:3]
    (['first', 'second'], 13192, b'\\x07\\x07\\x07')
    """

    ALIGN = fileio.DIRECT_ALIGN

    def __init__(self, fd: int, name: str, direct_fd: int | None = None, buffers: int = 2) -> None:
        self.fd, self.name, self.direct_fd = fd, name, direct_fd
        self._bufs = [np.empty(0, np.uint8) for _ in range(max(2, buffers))]
        self._turn = 0
        self._pending: deque[tuple[Future[None], T]] = deque()
        self._thread = ThreadPoolExecutor(max_workers=1)
        self.direct_bytes = 0
        """Bytes written with ``O_DIRECT`` so far."""

    def buffer(self, nbytes: int) -> np.ndarray:
        """A block-aligned ``uint8`` buffer of ``nbytes`` (its previous content left as it
        was), not being written; valid until the next-but-one call.

        >>> with BlobWriter(os.open(os.devnull, os.O_WRONLY), os.devnull) as out:
        ...     buf = out.buffer(100)
        >>> buf.shape, buf.ctypes.data % BlobWriter.ALIGN
        ((100,), 0)
        """
        i = self._turn
        if self._bufs[i].nbytes < nbytes:
            self._bufs[i] = fileio.aligned_empty(nbytes)
        return self._bufs[i][:nbytes]

    def write(self, blob: np.ndarray, offset: int, report: T, direct: bool = True) -> Iterator[T]:
        """Write ``blob`` (the last :meth:`buffer`) at ``offset`` in the thread (``direct``:
        with ``O_DIRECT`` if the file takes it, else through the page cache); yields the
        reports of earlier blobs whose writes finished, and waits so that the next
        :meth:`buffer` is free. An error of any write is raised here or by :meth:`drain`.

        >>> with BlobWriter(os.open(os.devnull, os.O_WRONLY), os.devnull) as out:
        ...     list(out.write(out.buffer(10), 0, "a")), list(out.drain())
        ([], ['a'])
        """
        self._pending.append((self._thread.submit(self._write, blob, offset, direct), report))
        self._turn = (self._turn + 1) % len(self._bufs)
        while len(self._pending) >= len(self._bufs):
            yield self._finish()

    def drain(self) -> Iterator[T]:
        """Wait for every pending write; yields their reports in order.

        >>> with BlobWriter(os.open(os.devnull, os.O_WRONLY), os.devnull) as out:
        ...     list(out.drain())
        []
        """
        while self._pending:
            yield self._finish()

    def _finish(self) -> T:
        future, report = self._pending[0]
        future.result()
        self._pending.popleft()
        return report

    def _write(self, blob: np.ndarray, offset: int, use_direct: bool) -> None:
        """Whole blocks with ``O_DIRECT`` (if any), the rest through the page cache."""
        n, head, direct = len(blob), 0, self.direct_fd if use_direct else None
        if direct is not None and offset % self.ALIGN == 0:
            head = n // self.ALIGN * self.ALIGN
        if direct is not None and head:
            try:
                fileio.pwrite_all(direct, blob[:head], offset, self.name)
                self.direct_bytes += head
            except SmoeError:  # refused (EINVAL) or failed: buffered from now on
                self._refuse_direct()
                head = 0
        if head < n:
            fileio.pwrite_all(self.fd, blob[head:], offset + head, self.name)
            _start_writeback(self.fd, offset + head, n - head)

    def _refuse_direct(self) -> None:
        fd, self.direct_fd = self.direct_fd, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Wait for the writes in flight (their errors are dropped: only a clean
        :meth:`drain` means the blobs are written), stop the thread, close both files.

        >>> BlobWriter(os.open(os.devnull, os.O_WRONLY), os.devnull).close()
        """
        self._thread.shutdown(wait=True)
        self._pending.clear()
        self._refuse_direct()
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def __enter__(self) -> BlobWriter[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
