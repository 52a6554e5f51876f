"""Reads experts' source matrices for the sculptor: positioned reads into reused buffers,
each chunk hashed (CRC-32C) while it is still in the CPU cache; an expert whose bytes are
not in the page cache is read with ``O_DIRECT`` (no copy through the page cache)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import numpy as np

from smoe.errors import SmoeError
from smoe.format.manifest import checksum
from smoe.interop.safetensors_io import FLOAT_DTYPES, TensorInfo
from smoe.plumbing import fileio
from smoe.sculpt.source.checkpoint import ExpertRef, src_dtype

__all__ = ["ExpertReader", "cached_fraction"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _CacheStatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("cache", "dirty", "writeback", "evicted", "recently_evicted")
    ]


def _cachestat_call() -> Callable[..., int] | None:
    """libc's ``syscall`` for ``cachestat`` (Linux 6.5+, number 451 on x86-64 and arm64),
    or None where there is no such call."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return cast("Callable[..., int]", fn)  # ctypes' foreign functions are untyped


_SYSCALL = _cachestat_call()
_CACHESTAT = 451


def cached_fraction(fd: int, offset: int, n: int) -> float | None:
    """The share of the pages holding ``n`` bytes at ``offset`` of ``fd`` that are in the
    page cache (Linux ``cachestat``), or None where the kernel cannot tell.

    >>> fd = fileio.open_input("fixtures/q4_v2.smoe")
    >>> _ = os.pread(fd, 4096, 0)
    >>> cached_fraction(fd, 0, 4096) in (1.0, None)
    True
    >>> os.close(fd)
    """
    global _SYSCALL
    if _SYSCALL is None or n <= 0:
        return None
    first, end = offset // _PAGE * _PAGE, -(-(offset + n) // _PAGE) * _PAGE
    where, stat = _CacheStatRange(first, end - first), _CacheStat()
    if _SYSCALL(_CACHESTAT, fd, ctypes.byref(where), ctypes.byref(stat), 0) != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            _SYSCALL = None  # no cachestat in this kernel (or a seccomp filter): stop asking
        return None
    return min(1.0, stat.cache * _PAGE / (end - first))


class ExpertReader:
    """Reads experts' source matrices into reused buffers, hashing each chunk while it is
    still in the CPU cache.

    A fresh array per expert costs a page fault per 4 KiB (more than the read itself);
    here each of ``slots`` buffers is allocated once and grows only for a larger expert.
    Each chunk of :attr:`CHUNK` bytes is read with a positioned read and its CRC-32C is
    continued at once. One descriptor per shard, opened on first use; one thread may fill
    a slot while another uses a different one.

    An expert mostly absent from the page cache (:func:`cached_fraction`) is read with
    ``O_DIRECT`` when ``direct`` is true: the device writes straight into the buffer,
    sparing the CPU the page cache's copy and bookkeeping (it would be read once only).
    A file system that refuses ``O_DIRECT`` (e.g. tmpfs) is read through the page cache.

    >>> from smoe.sculpt.source.checkpoint import Checkpoint
    >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe_fused").experts[(0, 1)]
    >>> with ExpertReader() as reader:
    ...     mats, crcs = reader.read(ref)
    ...     [(str(a.dtype), a.shape, src) for a, src in mats] == [
    ...         (str(a.dtype), a.shape, src) for a, src in ref.load()]
    True
    >>> crcs == tuple(checksum(a) for a, _ in ref.load())
    True
    """

    CHUNK = 1 << 20
    ALIGN = 64
    HINT = 8 << 20  # the most Linux reads ahead for one POSIX_FADV_WILLNEED call
    DIRECT_ALIGN = fileio.DIRECT_ALIGN
    DIRECT_CHUNK = 4 << 20  # one request per read: no read-ahead to split it
    DIRECT_BELOW = 0.5  # read with O_DIRECT when less than this share is page-cached
    DIRECT_THREADS = 3  # an expert's matrices are read at once, one thread each

    def __init__(self, slots: int = 2, direct: bool = True) -> None:
        self._bufs = [np.empty(0, np.uint8) for _ in range(slots)]
        self._fds: dict[Path, int] = {}
        self._dfds: dict[Path, int | None] = {}
        self._lock = threading.Lock()
        self._threads: ThreadPoolExecutor | None = None
        self.direct = direct
        self.direct_reads = 0
        """Experts read with ``O_DIRECT`` so far."""

    def _fd(self, path: Path) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:  # a shard swapped for a FIFO since it was indexed: refused
                fd = self._fds[path] = fileio.open_input(path)
            return fd

    def _direct_fd(self, path: Path) -> int | None:
        """A second descriptor of ``path`` with ``O_DIRECT``, or None if refused."""
        with self._lock:
            if path in self._dfds:
                return self._dfds[path]
        fd: int | None = fileio.open_input(path)
        assert fd is not None
        if not fileio.direct_io(fd):
            os.close(fd)
            fd = None
        with self._lock:
            if path in self._dfds:  # another thread was quicker
                if fd is not None:
                    os.close(fd)
                return self._dfds[path]
            self._dfds[path] = fd
            return fd

    def _refuse_direct(self, path: Path) -> None:
        """Read ``path`` through the page cache from now on."""
        with self._lock:
            fd = self._dfds.get(path)
            self._dfds[path] = None
        if fd is not None:
            os.close(fd)

    def _pool(self) -> ThreadPoolExecutor:
        """Threads for the matrices of one ``O_DIRECT`` read (made on first use)."""
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self.DIRECT_THREADS)
            return self._threads

    def _buffer(self, slot: int, nbytes: int) -> np.ndarray:
        if self._bufs[slot].nbytes < nbytes:
            self._bufs[slot] = fileio.aligned_empty(nbytes)
        return self._bufs[slot]

    def uses_direct(self, ref: ExpertRef) -> bool:
        """Whether :meth:`read` takes ``ref`` with ``O_DIRECT``: ``direct`` is on, each
        matrix starts 8-byte aligned (as the encoder reads it) and less than
        :attr:`DIRECT_BELOW` of its pages are in the page cache.

        >>> from smoe.sculpt.source.checkpoint import Checkpoint
        >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe_fused").experts[(0, 1)]
        >>> with ExpertReader() as reader:
        ...     _ = reader.read(ref)  # now cached
        ...     reader.uses_direct(ref), ExpertReader(direct=False).uses_direct(ref)
        (False, False)
        """
        if not self.direct or any(offset % 8 for _, offset, _ in ref.ranges()):
            return False
        share = self._cached_share(ref)
        return share is not None and share < self.DIRECT_BELOW

    def _cached_share(self, ref: ExpertRef) -> float | None:
        """The share of the expert's bytes in the page cache, or None if unknown."""
        if _SYSCALL is None:
            return None
        cached = total = 0.0
        for path, offset, n in ref.ranges():
            share = cached_fraction(self._fd(path), offset, n)
            if share is None:
                return None
            cached += share * n
            total += n
        return cached / total if total else None

    def read(
        self, ref: ExpertRef, slot: int = 0
    ) -> tuple[list[tuple[np.ndarray, str | None]], tuple[int, ...]]:
        """(matrices as :meth:`ExpertRef.load` gives them, CRC-32C of each one's stored
        bytes). The arrays are views of buffer ``slot``, valid until the next read into it.
        The matrices are read in file order.

        >>> from smoe.sculpt.source.checkpoint import Checkpoint
        >>> ref = Checkpoint.open("fixtures/checkpoints/olmoe_mixed_dtype").experts[(0, 0)]
        >>> with ExpertReader() as reader:
        ...     mats, crcs = reader.read(ref)
        >>> [(str(a.dtype), a.shape, src) for a, src in mats]
        [('uint16', (32, 64), 'bf16'), ('float16', (32, 64), None), ('float32', (64, 32), None)]
        """
        parts = ref.parts()
        direct = self.uses_direct(ref)
        align = self.DIRECT_ALIGN if direct else self.ALIGN
        places, leads, end = [], [], 0
        for part in parts:
            lead = part.offset % align if direct else 0
            places.append(end)
            leads.append(lead)
            end += -(-(lead + part.nbytes) // align) * align
        buf = self._buffer(slot, end)
        crcs = [0] * len(parts)
        order = sorted(range(len(parts)), key=lambda k: (str(parts[k].path), parts[k].offset))
        if direct:  # all at once: no read-ahead keeps the device busy for us
            spans = [-(-(lead + p.nbytes) // align) * align for p, lead in zip(parts, leads)]
            done = self._pool().map(
                lambda i: self._fill_direct(parts[i], buf[places[i] : places[i] + spans[i]]),
                order,
            )
            for i, crc in zip(order, done):
                crcs[i] = crc
            self.direct_reads += 1
        else:
            for i in order:
                part, at = parts[i], places[i]
                crcs[i] = self._fill(part.path, part.offset, buf[at : at + part.nbytes])
        mats = [
            (
                ref.finish(
                    k,
                    buf[at + lead : at + lead + p.nbytes]
                    .view(FLOAT_DTYPES.get(p.dtype, np.uint8))
                    .reshape(p.shape),
                ),
                src_dtype(p),
            )
            for k, (p, at, lead) in enumerate(zip(parts, places, leads))
        ]
        return mats, tuple(crcs)

    def crcs(self, ref: ExpertRef, slot: int = 0) -> tuple[int, ...]:
        """The CRC-32C values :meth:`read` gives, through :attr:`CHUNK` bytes of buffer
        ``slot`` only.

        >>> from smoe.sculpt.source.checkpoint import Checkpoint
        >>> ref = Checkpoint.open("fixtures/checkpoints/olmoe_mixed_dtype").experts[(0, 0)]
        >>> with ExpertReader() as reader:
        ...     reader.crcs(ref) == reader.read(ref)[1]
        True
        """
        buf = self._buffer(slot, self.CHUNK)[: self.CHUNK]
        return tuple(self._fill(path, offset, buf, n) for path, offset, n in ref.ranges())

    def _fill(self, path: Path, offset: int, buf: np.ndarray, n: int | None = None) -> int:
        """Read ``n`` bytes (default ``len(buf)``) at ``offset`` into ``buf`` chunk by chunk,
        wrapping around when ``buf`` is shorter; their CRC-32C."""
        fd, value, done = self._fd(path), 0, 0
        n = len(buf) if n is None else n
        view = memoryview(buf)
        while done < n:
            at = done % len(view)
            k = min(self.CHUNK, n - done, len(view) - at)
            fileio.preadv_exact(fd, view[at : at + k], offset + done, path)
            value = checksum(view[at : at + k], value)
            done += k
        return value

    def _fill_direct(self, part: TensorInfo, region: np.ndarray) -> int:
        """Read ``part`` with ``O_DIRECT`` into ``region`` (aligned, whole blocks: the part's
        bytes start at its offset's remainder modulo :attr:`DIRECT_ALIGN`); the CRC-32C of
        the part's bytes. A refusal (EINVAL) or a short read continues through the page
        cache (a file that shrank is an error there)."""
        path, n = part.path, part.nbytes
        lead = part.offset % self.DIRECT_ALIGN
        start, need = part.offset - lead, lead + n
        view = memoryview(region)
        fd, got = self._direct_fd(path), 0
        while fd is not None and got < need:
            k = min(self.DIRECT_CHUNK, len(view) - got)
            try:
                r = os.preadv(fd, [view[got : got + k]], start + got)
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise SmoeError(
                        f"{path}: cannot read {n} bytes at offset {part.offset}: {e.strerror or e}"
                    ) from None
                self._refuse_direct(path)
                break
            got += r
            if r == 0 or r % self.DIRECT_ALIGN:  # the end of the file (or an odd short read)
                break
        if got < need:
            fileio.preadv_exact(self._fd(path), view[got:need], start + got, path)
        return checksum(view[lead:need])

    def hint(self, ref: ExpertRef) -> None:
        """Ask the kernel to start reading an expert's bytes now (POSIX_FADV_WILLNEED),
        unless they are all in the page cache already or :meth:`read` will take them with
        ``O_DIRECT`` (the page cache is bypassed).

        >>> from smoe.sculpt.source.checkpoint import Checkpoint
        >>> ref = Checkpoint.open("fixtures/checkpoints/olmoe_mixed_dtype").experts[(0, 0)]
        >>> with ExpertReader() as reader:
        ...     reader.hint(ref)
        """
        advise = getattr(os, "posix_fadvise", None)
        if advise is None or self._cached_share(ref) == 1.0 or self.uses_direct(ref):
            return
        for path, offset, n in ref.ranges():
            fd = self._fd(path)
            for at in range(0, n, self.HINT):
                with contextlib.suppress(OSError):
                    advise(fd, offset + at, min(self.HINT, n - at), os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        """Close every descriptor (the reader may be used again: they reopen).

        >>> ExpertReader().close()
        """
        with self._lock:
            for fd in (*self._fds.values(), *self._dfds.values()):
                if fd is not None:
                    os.close(fd)
            self._fds.clear()
            self._dfds.clear()
            threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown()

    def __enter__(self) -> ExpertReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
