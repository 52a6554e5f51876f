"""The readers' view of a vault file: positioned reads, never a memory map.

A mapped file that shrinks raises SIGBUS, which Python cannot catch, so :class:`FileView`
reads with ``pread``: ``len(view)`` is the size at open, ``view[a:b]`` a read-only uint8
array (clipped to the size like a numpy slice), ``view[i]`` an int, and a read that comes
back short because the file shrank is one :class:`SmoeError` line. Every function here also
accepts an in-memory uint8 array in place of a view. The structured views of the header,
the table and descriptors and the arch block are here too, shared by reader, verifier and
dump.

>>> with FileView.open("fixtures/q4_v2.smoe") as view:
...     bytes(view[:4]), view[4], len(view)
(b'SMOE', 222, 147456)
"""

from __future__ import annotations

import contextlib
import operator
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import SupportsIndex, overload

import numpy as np

from smoe.errors import SmoeError
from smoe.plumbing import fileio
from smoe_gen import layout

__all__ = [
    "FileView",
    "Geometry",
    "arch_block",
    "arch_view",
    "chunks",
    "first_nonfinite_f16",
    "first_nonzero",
    "header_view",
    "table_views",
]

CHUNK = 8 << 20  # large ranges are read in pieces of this size (memory stays bounded)


class FileView:
    """A regular file read with ``pread``; the fd is closed by :meth:`close` or on exit.

    >>> view = FileView.open("fixtures/q4_v2.smoe")
    >>> view
    FileView('fixtures/q4_v2.smoe', 147456 bytes)
    >>> view[0:8:2]  # a slice is a read-only uint8 array
    array([ 83,  79, 222,   0], dtype=uint8)
    >>> view.close(); view.closed
    True
    """

    def __init__(self, fd: int, path: Path, size: int) -> None:
        self.fd = fd
        self.path = path
        self.size = size

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> FileView:
        """Open ``path``; FIFOs, folders and devices raise ``fileio.NotRegular`` at once.

        >>> with FileView.open("fixtures/q4_v2.smoe") as view:
        ...     view.size
        147456
        """
        path = Path(path)
        fd = fileio.open_input(path)
        try:
            size = os.fstat(fd).st_size
        except OSError as e:
            os.close(fd)
            raise fileio.CannotOpen.of(path, e) from None
        return cls(fd, path, size)

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, key: slice) -> np.ndarray: ...
    @overload
    def __getitem__(self, key: SupportsIndex) -> int: ...

    def __getitem__(self, key: SupportsIndex | slice) -> np.ndarray | int:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.size)
            if step == 1:
                return self.read(start, max(0, stop - start))
            picked = range(start, stop, step)
            if not picked:
                return self.read(0, 0)
            lo, hi = min(picked[0], picked[-1]), max(picked[0], picked[-1]) + 1
            return self.read(lo, hi - lo)[picked[0] - lo :: step]
        i = operator.index(key)
        if i < 0:
            i += self.size
        if not 0 <= i < self.size:
            raise IndexError(f"{self.path}: offset {key} outside the file ({self.size} bytes)")
        return int(self.read(i, 1)[0])

    def read(self, offset: int, n: int) -> np.ndarray:
        """Exactly ``n`` bytes at ``offset`` as a read-only uint8 array (one ``preadv``).

        A read from a closed view, or one the file has shrunk under, raises
        :class:`SmoeError`.

        >>> with FileView.open("fixtures/q4_v2.smoe") as view:
        ...     view.read(16384, 4)
        array([134, 169, 147, 152], dtype=uint8)
        """
        if self.fd < 0:
            raise SmoeError(
                f"{self.path}: cannot read {n} bytes at offset {offset}: the file is closed"
            )
        try:
            buf = np.empty(n, np.uint8)
        except (MemoryError, ValueError):
            raise SmoeError(
                f"{self.path}: cannot read {n} bytes at offset {offset}: not enough memory"
            ) from None
        if n and self._preadv(buf, offset) != n:  # short, interrupted or failed: the
            fileio.preadv_exact(self.fd, buf.data, offset, self.path)  # careful way, clean errors
        buf.flags.writeable = False
        return buf

    def _preadv(self, buf: np.ndarray, offset: int) -> int:
        try:
            return os.preadv(self.fd, [buf.data], offset)
        except OSError:
            return -1

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran.

        >>> FileView.open("fixtures/q4_v2.smoe").closed
        False
        """
        return self.fd < 0

    def close(self) -> None:
        """Close the file descriptor (again: nothing happens); reads then raise.

        >>> view = FileView.open("fixtures/q4_v2.smoe")
        >>> view.close()
        >>> view.read(0, 4)
        Traceback (most recent call last):
        smoe.errors.SmoeError: fixtures/q4_v2.smoe: cannot read 4 bytes at offset 0: the file ...
        """
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> FileView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.close()

    def __repr__(self) -> str:
        return f"FileView({str(self.path)!r}, {self.size} bytes)"


Data = FileView | np.ndarray  # anything with len() and [a:b] -> uint8 array


def chunks(
    data: Data, lo: int, hi: int, step: int | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """(offset, bytes) pieces of [lo, hi), each at most ``step`` (default CHUNK) long.

    >>> with FileView.open("fixtures/q4_v2.smoe") as view:
    ...     [(at, len(piece)) for at, piece in chunks(view, 0, 64, step=24)]
    [(0, 24), (24, 24), (48, 16)]
    """
    step = step or CHUNK
    if hi - lo <= step:
        if hi > lo:
            yield lo, data[lo:hi]
        return
    for at in range(lo, hi, step):
        yield at, data[at : min(at + step, hi)]


def first_nonzero(data: Data, lo: int, hi: int) -> tuple[int, int] | None:
    """(offset, value) of the first non-zero byte in [lo, hi), read in chunks; or None.

    >>> with FileView.open("fixtures/q4_v2.smoe") as view:
    ...     first_nonzero(view, 0, 64), first_nonzero(view, 1504, 1536)
    ((0, 83), None)
    """
    for at, piece in chunks(data, lo, hi):
        if piece.any():
            i = int(np.argmax(piece != 0))
            return at + i, int(piece[i])
    return None


def first_nonfinite_f16(data: Data, lo: int, hi: int) -> tuple[int, float] | None:
    """(offset, value) of the first non-finite little-endian float16 in [lo, hi), or None.

    >>> data = np.array([1.0, 2.0, np.inf], "<f2").view(np.uint8)  # or a FileView
    >>> first_nonfinite_f16(data, 0, len(data)), first_nonfinite_f16(data, 0, 4)
    ((4, inf), None)
    """
    for at, piece in chunks(data, lo, hi, max(2, CHUNK & ~1)):
        values = piece[: len(piece) & ~1].view("<f2")
        finite = np.isfinite(values)
        if not finite.all():
            i = int(np.argmin(finite))
            return at + 2 * i, float(values[i])
    return None


# ---- structured views ----------------------------------------------------------------------
@dataclass
class Geometry:
    """Where the regions lie, from the header (only meaningful once the header passed).

    ``smoe.format.verify.check_header`` computes it; an open vault keeps it:

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as v:
    ...     geo = v.geometry
    >>> geo.version, geo.total, geo.bits, geo.data_offset
    (2, 8, 4, 16384)
    """

    size: int
    version: int
    total: int
    bits: int
    data_offset: int
    descriptors_offset: int
    descriptors_end: int
    reserved_ext: int
    table_readable: bool
    arch_readable: bool


def header_view(data: Data) -> np.void:
    """The 64-byte header as a structured record (the file must hold 64 bytes).

    >>> with FileView.open("fixtures/q4_v2.smoe") as view:
    ...     header = header_view(view)
    >>> int(header["version"]), int(header["total_experts"]), int(header["bits"])
    (2, 8, 4)
    """
    record: np.void = data[: layout.HEADER_SIZE].view(layout.HEADER_DTYPE)[0]
    return record


def table_views(data: Data, geo: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """The expert table and the descriptors [n, 3] as structured arrays, from one read
    (only when ``geo.table_readable``: the region is bounded by the file size).

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as v:
    ...     table, descriptors = table_views(v.data, v.geometry)
    >>> table["expert_id"][:4], descriptors.shape, int(descriptors[0, 0]["rows"])
    (array([0, 1, 2, 3], dtype=uint32), (8, 3), 32)
    """
    raw = data[layout.TABLE_OFFSET : geo.descriptors_end]
    split = geo.descriptors_offset - layout.TABLE_OFFSET
    table = raw[:split].view(layout.EXPERT_ENTRY_DTYPE)
    descs = (
        raw[split:]
        .view(layout.TENSOR_DESCRIPTOR_DTYPE)
        .reshape(geo.total, layout.TENSORS_PER_EXPERT)
    )
    return table, descs


def arch_block(data: Data, geo: Geometry) -> np.ndarray:
    """The arch block's 128 bytes (only when ``geo.arch_readable``).

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as v:
    ...     bytes(arch_block(v.data, v.geometry)[:4])
    b'SARC'
    """
    return data[geo.reserved_ext : geo.reserved_ext + layout.ARCH_BLOCK_SIZE]


def arch_view(data: Data, geo: Geometry) -> np.void:
    """The arch block as a structured record (only when ``geo.arch_readable``).

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as v:
    ...     arch = arch_view(v.data, v.geometry)
    >>> bytes(arch["model_type"]), int(arch["num_heads"]), int(arch["moe_top_k"])
    (b'olmoe', 4, 2)
    """
    record: np.void = arch_block(data, geo).view(layout.ARCH_BLOCK_DTYPE)[0]
    return record
