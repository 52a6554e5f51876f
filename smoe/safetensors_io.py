"""Streaming safetensors: index shard headers without loading data, read one tensor with
positioned reads, and write a file tensor by tensor (bounded memory, atomic).

The ``safetensors`` package loads or maps whole files; a converter of checkpoints
larger than memory needs to read exactly the bytes of one tensor, so this module
reads the format directly: an 8-byte little-endian header length, a JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` (offsets relative to the
end of the header) and the data.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smoe.atomic import AtomicFile
from smoe.errors import SmoeError

DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
FLOAT_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
"""Dtypes expert weights may have, with the numpy dtype their raw bytes are read as."""

MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes lie: shard, absolute offset, size, dtype and shape."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Index one shard's tensors; every offset is checked against the file size."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SmoeError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER, size - 8):
            raise SmoeError(f"{path}: header length {n} at offset 0 exceeds the file size {size}")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SmoeError(f"{path}: header at offset 8 is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise SmoeError(f"{path}: header at offset 8 is not a JSON object")
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = meta["dtype"], tuple(meta["shape"]), meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SmoeError(f"{path}: tensor {name!r} has a malformed header entry") from None
        if dtype not in DTYPE_SIZES or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SmoeError(f"{path}: tensor {name!r} has dtype {dtype!r} shape {list(shape)}")
        nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end
                and end - begin == nbytes and base + end <= size):
            raise SmoeError(f"{path}: tensor {name!r} data_offsets [{begin}, {end}] do not hold "
                            f"{nbytes} bytes inside the file ({size} bytes)")
        out[name] = TensorInfo(name, path, dtype, shape, base + begin, nbytes)
    return out


def read_array(info: TensorInfo, fd: int | None = None) -> np.ndarray:
    """One tensor's values with a positioned read (float dtypes: see FLOAT_DTYPES)."""
    if info.dtype not in FLOAT_DTYPES:
        raise SmoeError(f"{info.path}: tensor {info.name!r} is {info.dtype}; expert weights "
                        "must be BF16, F16 or F32")
    buf = np.empty(info.nbytes, np.uint8)
    own = fd is None
    if own:
        fd = os.open(info.path, os.O_RDONLY)
    try:
        got = os.preadv(fd, [buf], info.offset)
    finally:
        if own:
            os.close(fd)
    if got != info.nbytes:
        raise SmoeError(f"{info.path}: short read of {info.name!r} at offset {info.offset}")
    return buf.view(FLOAT_DTYPES[info.dtype]).reshape(info.shape)


def copy_range(src_fd: int, src_off: int, dst_fd: int, dst_off: int, n: int,
               chunk: int = 8 << 20) -> None:
    """Copy n bytes between files with positioned I/O, at most ``chunk`` bytes in memory."""
    buf = bytearray(min(chunk, max(n, 1)))
    view = memoryview(buf)
    done = 0
    while done < n:
        want = min(len(buf), n - done)
        got = os.preadv(src_fd, [view[:want]], src_off + done)
        if got <= 0:
            raise SmoeError(f"short read at offset {src_off + done}")
        os.pwrite(dst_fd, view[:got], dst_off + done)
        done += got


def write_file(path: Path, items: list[tuple[str, str, tuple[int, ...]]],
               fill: Callable[[int, int, int], None],
               metadata: dict[str, str] | None = None) -> int:
    """Write a safetensors file whose tensors ``items`` = (name, dtype, shape) are in name
    order; ``fill(fd, i, offset)`` writes tensor i's bytes at absolute ``offset``.

    The header is written first (all sizes are known), so data can be streamed tensor by
    tensor with bounded memory. Atomic: temp file, fsync, rename. Returns the file size.
    """
    order = sorted(range(len(items)), key=lambda i: items[i][0])
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(sorted(metadata.items()))
    pos = 0
    places = {}
    for i in order:
        name, dtype, shape = items[i]
        n = math.prod(shape) * DTYPE_SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        places[i] = pos
        pos += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    base = 8 + len(raw)
    with AtomicFile(path) as out:
        fd = out.fd
        assert fd is not None
        os.pwrite(fd, struct.pack("<Q", len(raw)) + raw, 0)
        os.ftruncate(fd, base + pos)
        for i in order:
            fill(fd, i, base + places[i])
        out.commit()
    return base + pos


def write_streaming(path: Path, tensors: Iterable[TensorInfo],
                    metadata: dict[str, str] | None = None) -> int:
    """A safetensors file of existing tensors, copied from their source shards chunkwise."""
    items = list(tensors)
    fds: dict[Path, int] = {}

    def fill(fd: int, i: int, offset: int) -> None:
        t = items[i]
        src = fds.get(t.path)
        if src is None:
            src = fds[t.path] = os.open(t.path, os.O_RDONLY)
        copy_range(src, t.offset, fd, offset, t.nbytes)

    try:
        return write_file(path, [(t.name, t.dtype, t.shape) for t in items], fill, metadata)
    finally:
        for src in fds.values():
            os.close(src)
