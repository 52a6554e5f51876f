"""Reads experts' source matrices for the sculptor: positioned reads into reused buffers,
each chunk hashed (CRC-32C) while it is still in the CPU cache."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import numpy as np

from smoe import fileio
from smoe.checkpoint import ExpertRef, _src_dtype
from smoe.manifest import checksum
from smoe.safetensors_io import FLOAT_DTYPES


class ExpertReader:
    """Reads experts' source matrices into reused buffers, hashing each chunk while it is
    still in the CPU cache.

    A fresh array per expert costs a page fault per 4 KiB (more than the read itself);
    here each of ``slots`` buffers is allocated once and grows only for a larger expert.
    Each chunk of :attr:`CHUNK` bytes is read with a positioned read and its CRC-32C is
    continued at once. One descriptor per shard, opened on first use; one thread may fill
    a slot while another uses a different one.
    """

    CHUNK = 1 << 20
    ALIGN = 64
    HINT = 8 << 20  # the most Linux reads ahead for one POSIX_FADV_WILLNEED call

    def __init__(self, slots: int = 2) -> None:
        self._bufs = [np.empty(0, np.uint8) for _ in range(slots)]
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()

    def _fd(self, path: Path) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:  # a shard swapped for a FIFO since it was indexed: refused
                fd = self._fds[path] = fileio.open_input(path)
            return fd

    def _buffer(self, slot: int, nbytes: int) -> np.ndarray:
        if self._bufs[slot].nbytes < nbytes:
            self._bufs[slot] = np.empty(nbytes, np.uint8)
        return self._bufs[slot]

    def read(
        self, ref: ExpertRef, slot: int = 0
    ) -> tuple[list[tuple[np.ndarray, str | None]], tuple[int, ...]]:
        """(matrices as :meth:`ExpertRef.load` gives them, CRC-32C of each one's stored
        bytes). The arrays are views of buffer ``slot``, valid until the next read into it.
        The matrices are read in file order."""
        parts = ref.parts()
        places, end = [], 0
        for part in parts:
            places.append(end)
            end += -(-part.nbytes // self.ALIGN) * self.ALIGN
        buf = self._buffer(slot, end)
        crcs = [0] * len(parts)
        for i in sorted(range(len(parts)), key=lambda k: (str(parts[k].path), parts[k].offset)):
            part = parts[i]
            crcs[i] = self._fill(part.path, part.offset, buf[places[i] : places[i] + part.nbytes])
        mats = [
            (buf[at : at + p.nbytes].view(FLOAT_DTYPES[p.dtype]).reshape(p.shape), _src_dtype(p))
            for p, at in zip(parts, places)
        ]
        return mats, tuple(crcs)

    def crcs(self, ref: ExpertRef, slot: int = 0) -> tuple[int, ...]:
        """The CRC-32C values :meth:`read` gives, through :attr:`CHUNK` bytes of buffer
        ``slot`` only."""
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

    def hint(self, ref: ExpertRef) -> None:
        """Ask the kernel to start reading an expert's bytes now (POSIX_FADV_WILLNEED)."""
        advise = getattr(os, "posix_fadvise", None)
        if advise is None:
            return
        for path, offset, n in ref.ranges():
            fd = self._fd(path)
            for at in range(0, n, self.HINT):
                with contextlib.suppress(OSError):
                    advise(fd, offset + at, min(self.HINT, n - at), os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self) -> ExpertReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
