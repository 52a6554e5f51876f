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
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast, overload

import numpy as np

from smoe.errors import RefusedInput, SmoeError, WriteFailed
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile, Signature

__all__ = [
    "DTYPE_SIZES",
    "FLOAT_DTYPES",
    "TensorInfo",
    "copy_range",
    "json_excerpt",
    "read_array",
    "read_header",
    "write_file",
    "write_streaming",
]

DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
FLOAT_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}
"""Dtypes expert weights may have, with the numpy dtype their raw bytes are read as."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes lie: shard, absolute offset, size, dtype and shape.

    >>> shard = Path("fixtures/checkpoints/qwen3_moe/model.safetensors")
    >>> info = read_header(shard)["lm_head.weight"]
    >>> info.dtype, info.shape, info.offset, info.nbytes
    ('BF16', (128, 64), 7472, 16384)
    """

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


_MAX_HEADER = 100_000_000  # the safetensors library's MAX_HEADER_SIZE
_ENTRY_KEYS = ("dtype", "shape", "data_offsets")


class _HeaderFault(ValueError):
    """A fault in a JSON header: the message is ``{before} at offset {X}{after}``, where X
    is the absolute file offset of character ``pos`` of the header."""

    def __init__(self, pos: int, before: str, after: str = "") -> None:
        super().__init__(before, after)
        self.pos, self.before, self.after = pos, before, after


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """``object_pairs_hook`` refusing a key given twice (json.loads would keep the last)."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _HeaderFault(-1, "", f" has the key {key!r} twice")
        out[key] = value
    return out


def _no_constant(name: str) -> object:
    raise _HeaderFault(-1, "", f" has {name}, which is not JSON")


def _int(text: str) -> int | float:
    """Integers as JSON spells them, except ``-0``: the safetensors library reads it as a
    float, so it stays the float -0.0 here and the type checks refuse it."""
    return -0.0 if text.lstrip("-").strip("0") == "" and text.startswith("-") else int(text)


_DECODER = json.JSONDecoder(object_pairs_hook=_unique, parse_constant=_no_constant, parse_int=_int)


_WHITESPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace, as json.decoder spells it
_scanstring = cast(  # json.decoder.scanstring (CPython's, in C): the stubs leave it out
    Callable[[str, int, bool], tuple[str, int]], vars(json.decoder)["scanstring"]
)


def _skip_ws(text: str, i: int) -> int:
    m = _WHITESPACE.match(text, i)  # always matches (maybe empty)
    return m.end() if m else i


def _what(key: str) -> str:
    if key == "__metadata__":
        return key
    return f"tensor {key[:77] + '...' if len(key) > 80 else key!r}"


def _member(text: str, i: int) -> tuple[str, object, int]:
    """One ``"key": value`` of an object starting at ``i``: key, value, end position."""
    if text[i : i + 1] != '"':
        raise _HeaderFault(i, "header is not valid JSON", " (expecting a quoted key)")
    try:
        key, j = _scanstring(text, i + 1, True)
    except json.JSONDecodeError as e:
        raise _HeaderFault(e.pos, "header is not valid JSON", f" ({_reason(e)})") from None
    j = _skip_ws(text, j)
    if text[j : j + 1] != ":":
        raise _HeaderFault(j, "header is not valid JSON", " (expecting ':')")
    j = _skip_ws(text, j + 1)
    try:
        value, j = _DECODER.raw_decode(text, j)
    except _HeaderFault as e:
        raise _HeaderFault(i, f"{_what(key)} (entry", f"){e.after}") from None
    except json.JSONDecodeError as e:
        raise _HeaderFault(e.pos, "header is not valid JSON", f" ({_reason(e)})") from None
    except RecursionError:
        raise _HeaderFault(i, f"{_what(key)} (entry", ") is nested too deeply") from None
    except ValueError:  # an integer literal of more than 4300 digits
        raise _HeaderFault(i, f"{_what(key)} (entry", ") has an integer too long to read") from None
    return key, value, j


def _reason(e: json.JSONDecodeError) -> str:
    return e.msg.removesuffix(" at").lower()


def _top_level(text: str) -> list[tuple[str, int, object]]:
    """(key, character position of the key, value) of a JSON object, in file order."""
    i = _skip_ws(text, 0)
    if text[i : i + 1] != "{":
        raise _HeaderFault(i, "header", " is not a JSON object")
    items: list[tuple[str, int, object]] = []
    seen: set[str] = set()
    j = _skip_ws(text, i + 1)
    while text[j : j + 1] != "}":
        i = _skip_ws(text, j + 1) if items else j
        key, value, j = _member(text, i)
        if key in seen:
            raise _HeaderFault(i, f"header names {_what(key)} twice, again")
        seen.add(key)
        items.append((key, i, value))
        j = _skip_ws(text, j)
        if text[j : j + 1] not in (",", "}"):
            raise _HeaderFault(j, "header is not valid JSON", " (expecting ',' or '}')")
    end = _skip_ws(text, j + 1)
    if end != len(text):
        raise _HeaderFault(end, "header has data after its JSON object")
    return items


def json_excerpt(value: object) -> str:
    """``value`` as it reads in JSON, cut to 60 characters: how a refused value of a JSON
    input (a safetensors header, config.json) is quoted in its error.

    >>> json_excerpt({"dtype": "BF16"})
    '{"dtype": "BF16"}'
    >>> long = json_excerpt(list(range(100)))
    >>> len(long), long[-8:]
    (60, '5, 16...')
    """
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
        return False
    return True


def _is_u64(value: object) -> bool:
    return type(value) is int and 0 <= value < 1 << 64  # JSON true/false are not integers


def _entry(name: str, meta: object) -> tuple[str, tuple[int, ...], int, int]:
    """A tensor's (dtype, shape, begin, end) from its header entry, every field checked;
    a fault raises ValueError with the rest of the sentence."""
    if not name:
        raise ValueError("has an empty name")
    if not _valid_unicode(name):
        raise ValueError("has a name that is not valid Unicode (lone surrogate)")
    if not isinstance(meta, dict):
        raise ValueError(
            f"is {json_excerpt(meta)}, expected an object with dtype, shape and data_offsets"
        )
    for key in _ENTRY_KEYS:
        if key not in meta:
            raise ValueError(f"has no {key!r}")
    for key in meta:
        if key not in _ENTRY_KEYS:
            raise ValueError(f"has an unknown key {key!r}")
    dtype, shape, offsets = meta["dtype"], meta["shape"], meta["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise ValueError(f"has an unsupported dtype {json_excerpt(dtype)}")
    if not isinstance(shape, list) or not all(map(_is_u64, shape)):
        raise ValueError(
            f"has shape {json_excerpt(shape)}, expected a list of unsigned 64-bit integers"
        )
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_u64, offsets))):
        raise ValueError(
            f"has data_offsets {json_excerpt(offsets)}, expected two unsigned 64-bit integers"
        )
    begin, end = offsets
    if end < begin:
        raise ValueError(f"has data_offsets [{begin}, {end}], which end before they begin")
    nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
    if nbytes >= 1 << 64:
        raise ValueError(f"has shape {json_excerpt(shape)} of {dtype}: 2^64 bytes or more")
    if end - begin != nbytes:
        raise ValueError(
            f"has data_offsets [{begin}, {end}] holding {end - begin} bytes, but "
            f"{dtype} {shape} needs {nbytes}"
        )
    return dtype, tuple(shape), begin, end


def _check_metadata(meta: object) -> None:
    if not isinstance(meta, dict):
        raise ValueError(f"is {json_excerpt(meta)}, expected an object of strings")
    for key, value in meta.items():
        if not isinstance(value, str):
            raise ValueError(f"key {key!r} is {json_excerpt(value)}, expected a string")
        if not (_valid_unicode(key) and _valid_unicode(value)):
            raise ValueError(f"key {key!r} is not valid Unicode (lone surrogate)")


def _tile(path: Path, places: list[tuple[int, int, str]], base: int, size: int) -> None:
    """The tensors' (begin, end, name), sorted, must cover the data exactly up to the end."""
    prev_end, prev = 0, "the header"
    for begin, end, name in sorted(places):
        if begin != prev_end:
            what = (
                "overlaps"
                if begin < prev_end
                else f"leaves a hole of {begin - prev_end} bytes after"
            )
            raise RefusedInput(
                f"{path}: {_what(name)} data at offset {base + begin} {what} "
                f"{prev}, which ends at offset {base + prev_end}"
            )
        prev_end, prev = end, _what(name)
    if base + prev_end > size:
        raise RefusedInput(
            f"{path}: {prev} data ends at offset {base + prev_end}, beyond the end "
            f"of the file ({size} bytes)"
        )
    if base + prev_end < size:
        raise RefusedInput(
            f"{path}: {size - base - prev_end} bytes at offset {base + prev_end} "
            f"after {prev} belong to no tensor"
        )


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Index one shard's tensors, checked at least as strictly as the safetensors library.

    The header must be UTF-8 JSON, an object without duplicate keys; names valid Unicode;
    ``__metadata__`` strings only; every entry a known dtype, a shape of unsigned 64-bit
    integers and data_offsets holding exactly its bytes; and the tensors, sorted by
    offset, must tile the data (no overlap, no hole) up to the end of the file. Every
    message names the absolute byte offset at fault.

    >>> tensors = read_header(Path("fixtures/checkpoints/mixtral/model.safetensors"))
    >>> len(tensors), tensors["model.norm.weight"].shape
    (41, (64,))
    >>> import tempfile
    >>> bad = Path(tempfile.mkdtemp()) / "bad.safetensors"
    >>> _ = bad.write_bytes((2).to_bytes(8, "little") + b"{]")
    >>> read_header(bad)
    Traceback (most recent call last):
    smoe.errors.RefusedInput: .../bad.safetensors: header is not valid JSON at offset 9 ...
    """
    fd = fileio.open_input(path)
    try:
        size = os.fstat(fd).st_size
        if size < 8:
            raise RefusedInput(
                f"{path}: not a safetensors file ({size} bytes, shorter than the "
                "8-byte header length)"
            )
        (n,) = struct.unpack("<Q", fileio.pread_exact(fd, 8, 0, path))
        if n > _MAX_HEADER:
            raise RefusedInput(
                f"{path}: header length {n} at offset 0 exceeds the safetensors "
                f"limit of {_MAX_HEADER} bytes"
            )
        if n > size - 8:
            raise RefusedInput(
                f"{path}: header length {n} at offset 0 exceeds the file size {size}"
            )
        raw = fileio.pread_exact(fd, n, 8, path)
    finally:
        os.close(fd)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RefusedInput(
            f"{path}: header is not valid UTF-8 at offset {8 + e.start} (byte 0x{raw[e.start]:02x})"
        ) from None

    def offset(pos: int) -> int:  # only called on a fault: O(header) is fine
        return 8 + len(text[:pos].encode("utf-8"))

    try:
        items = _top_level(text)
    except _HeaderFault as e:
        raise RefusedInput(f"{path}: {e.before} at offset {offset(e.pos)}{e.after}") from None
    base = 8 + n
    out: dict[str, TensorInfo] = {}
    places = []
    for name, pos, meta in items:
        try:
            if name == "__metadata__":
                _check_metadata(meta)
                continue
            dtype, shape, begin, end = _entry(name, meta)
        except ValueError as e:
            raise RefusedInput(
                f"{path}: {_what(name)} (entry at offset {offset(pos)}) {e}"
            ) from None
        out[name] = TensorInfo(name, path, dtype, shape, base + begin, end - begin)
        places.append((begin, end, name))
    _tile(path, places, base, size)
    return out


def read_array(info: TensorInfo, fd: int | None = None) -> np.ndarray:
    """One tensor's values with positioned reads (float dtypes: see FLOAT_DTYPES).

    Reads loop until every byte is in (a single read returns at most about 2 GiB); a file
    that shrank or a read error is one SmoeError line naming the file and the offset.

    >>> shard = Path("fixtures/checkpoints/qwen3_moe/model.safetensors")
    >>> info = read_header(shard)["model.norm.weight"]
    >>> read_array(info).dtype, read_array(info).shape
    (dtype('uint16'), (64,))
    """
    if info.dtype not in FLOAT_DTYPES:
        raise RefusedInput(
            f"{info.path}: tensor {info.name!r} is {info.dtype}; expert weights "
            "must be BF16, F16 or F32"
        )
    buf = np.empty(info.nbytes, np.uint8)
    # a descriptor of our own never blocks on a FIFO put in a shard's place
    use = fileio.open_input(info.path) if fd is None else fd
    try:
        fileio.preadv_exact(use, buf, info.offset, info.path)
    finally:
        if fd is None:
            os.close(use)
    return buf.view(FLOAT_DTYPES[info.dtype]).reshape(info.shape)


def copy_range(
    src_fd: int,
    src_off: int,
    dst_fd: int,
    dst_off: int,
    n: int,
    chunk: int = 8 << 20,
    *,
    src_path: str | os.PathLike,
    dst_path: str | os.PathLike,
) -> None:
    """Copy n bytes between files with positioned I/O, at most ``chunk`` bytes in memory.

    Reads and writes are checked: a source that shrank or a failed write (ENOSPC, EIO)
    raises one SmoeError line naming the file and the offset.

    >>> import tempfile
    >>> src, dst = Path(tempfile.mkdtemp()) / "src", Path(tempfile.mkdtemp()) / "dst"
    >>> _ = src.write_bytes(b"0123456789")
    >>> with src.open("rb") as a, dst.open("wb") as b:
    ...     copy_range(a.fileno(), 2, b.fileno(), 0, 5, chunk=2, src_path=src, dst_path=dst)
    >>> dst.read_bytes()
    b'23456'
    """
    buf = bytearray(min(chunk, max(n, 1)))
    view = memoryview(buf)
    done = 0
    while done < n:
        want = min(len(buf), n - done)
        fileio.preadv_exact(src_fd, view[:want], src_off + done, src_path)
        fileio.pwrite_all(dst_fd, view[:want], dst_off + done, dst_path)
        done += want


@overload
def write_file(
    path: Path,
    items: list[tuple[str, str, tuple[int, ...]]],
    fill: Callable[[int, int, int], None],
    metadata: dict[str, str] | None = None,
    *,
    stage: Literal[False] = False,
    replace: bool = True,
    ours: Signature | None = None,
) -> int: ...
@overload
def write_file(
    path: Path,
    items: list[tuple[str, str, tuple[int, ...]]],
    fill: Callable[[int, int, int], None],
    metadata: dict[str, str] | None = None,
    *,
    stage: Literal[True],
    replace: bool = True,
    ours: Signature | None = None,
) -> tuple[int, AtomicFile]: ...
@overload
def write_file(
    path: Path,
    items: list[tuple[str, str, tuple[int, ...]]],
    fill: Callable[[int, int, int], None],
    metadata: dict[str, str] | None = None,
    *,
    stage: bool,
    replace: bool = True,
    ours: Signature | None = None,
) -> int | tuple[int, AtomicFile]: ...
def write_file(
    path: Path,
    items: list[tuple[str, str, tuple[int, ...]]],
    fill: Callable[[int, int, int], None],
    metadata: dict[str, str] | None = None,
    *,
    stage: bool = False,
    replace: bool = True,
    ours: Signature | None = None,
) -> int | tuple[int, AtomicFile]:
    """Write a safetensors file whose tensors ``items`` = (name, dtype, shape) are in name
    order; ``fill(fd, i, offset)`` writes tensor i's bytes at absolute ``offset`` (with
    :func:`fileio.pwrite_all`). ``replace`` False: an existing ``path`` is refused and never
    replaced (:class:`~smoe.plumbing.atomic.AtomicFile`); ``ours``: only a file with that
    signature is replaced.

    The header is written first (all sizes are known), so data can be streamed tensor by
    tensor with bounded memory. Atomic: temp file, fsync, rename; on any error the temp
    file is removed and nothing appears under ``path``. Returns the file size; with
    ``stage=True`` the data is written and fsynced but not renamed, and ``(size, file)``
    is returned: the caller renames with ``file.commit()`` (or drops it with ``.abort()``).

    >>> import tempfile
    >>> from smoe.plumbing import fileio
    >>> out = Path(tempfile.mkdtemp()) / "one.safetensors"
    >>> data = np.arange(6, dtype="<f4").reshape(2, 3)
    >>> def fill(fd: int, i: int, at: int) -> None:
    ...     fileio.pwrite_all(fd, data, at, out)
    >>> write_file(out, [("w", "F32", (2, 3))], fill)
    96
    >>> read_array(read_header(out)["w"]).tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
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
    out = AtomicFile(path, replace=replace, ours=ours)
    try:
        fd = out.fd
        assert fd is not None
        out.pwrite(struct.pack("<Q", len(raw)) + raw, 0)
        out.truncate(base + pos)
        for i in order:
            try:
                fill(fd, i, base + places[i])
            except SmoeError:  # (an input that cannot be opened is an OSError too)
                raise
            except OSError as e:  # a fill that wrote with a bare os.pwrite
                raise WriteFailed(
                    f"{path}: cannot write tensor {items[i][0]!r} at offset "
                    f"{base + places[i]}: {e.strerror or e}"
                ) from None
        if stage:
            out.sync()
            return base + pos, out
        out.commit()
    except BaseException:
        out.abort()
        raise
    return base + pos


@overload
def write_streaming(
    path: Path,
    tensors: Iterable[TensorInfo],
    metadata: dict[str, str] | None = None,
    *,
    stage: Literal[False] = False,
) -> int: ...
@overload
def write_streaming(
    path: Path,
    tensors: Iterable[TensorInfo],
    metadata: dict[str, str] | None = None,
    *,
    stage: Literal[True],
) -> tuple[int, AtomicFile]: ...
def write_streaming(
    path: Path,
    tensors: Iterable[TensorInfo],
    metadata: dict[str, str] | None = None,
    *,
    stage: bool = False,
) -> int | tuple[int, AtomicFile]:
    """A safetensors file of existing tensors, copied from their source shards chunkwise.

    A source shard is never the output (refused by device and inode); ``stage`` as in
    :func:`write_file`.

    >>> import tempfile
    >>> src = read_header(Path("fixtures/checkpoints/qwen3_moe/model.safetensors"))
    >>> out = Path(tempfile.mkdtemp()) / "norms.safetensors"
    >>> size = write_streaming(out, [src["model.norm.weight"]], {"format": "pt"})
    >>> list(read_header(out)), size == out.stat().st_size
    (['model.norm.weight'], True)
    """
    items = list(tensors)
    fileio.refuse_same_file(path, sorted({t.path for t in items}))
    fds: dict[Path, int] = {}

    def fill(fd: int, i: int, offset: int) -> None:
        t = items[i]
        src = fds.get(t.path)
        if src is None:
            src = fds[t.path] = fileio.open_input(t.path)
        copy_range(src, t.offset, fd, offset, t.nbytes, src_path=t.path, dst_path=path)

    try:
        return write_file(
            path, [(t.name, t.dtype, t.shape) for t in items], fill, metadata, stage=stage
        )
    finally:
        for src in fds.values():
            os.close(src)


def _metadata(fd: int) -> dict[str, object]:
    """The ``__metadata__`` of the safetensors file open at ``fd`` (bounded; {} if none)."""
    size = os.fstat(fd).st_size
    head = os.pread(fd, 8, 0)
    if len(head) != 8:
        return {}
    (n,) = struct.unpack("<Q", head)
    if n > min(_MAX_HEADER, size - 8):
        return {}
    try:
        header = json.loads(os.pread(fd, n, 8))
    except ValueError:
        return {}
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def marked(what: str, key: str, value: str) -> Signature:
    """The signature of a safetensors file smoe wrote with ``__metadata__[key] == value``.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "x.safetensors"
    >>> _ = write_file(path, [], lambda fd, i, off: None, {"smoe": "export"})
    >>> sig = marked("an export", "smoe", "export")
    >>> fd = os.open(path, os.O_RDONLY); sig.probe(fd), marked("?", "smoe", "scout").probe(fd)
    (True, False)
    >>> os.close(fd)
    """
    return Signature(what, lambda fd: _metadata(fd).get(key) == value)
