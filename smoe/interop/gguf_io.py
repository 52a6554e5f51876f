"""GGUF (llama.cpp's file format) read with bounded memory: the header, the key-values and
the tensor infos, through a window of positioned reads, every count bounded by the bytes
left in the file before anything is allocated.

The checks are those of llama.cpp's reader ``ggml/src/gguf.cpp`` (bar its 64-byte limit on
tensor names), and more: tensors follow each other in the data section, each padded to the
alignment, and the file ends with the last one. Value and ggml type enums and the key
names come from the ``gguf`` package, passed in by the caller (an optional dependency); its
own ``GGUFReader`` is not used: it maps the file (one that shrinks kills the process with
SIGBUS) and does not bound counts by the file size.

The file is any :class:`Source` (:class:`smoe.format.view.FileView`, or :class:`InMemory`
bytes); this module knows nothing of what the tensors mean.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from smoe.errors import RefusedInput

__all__ = ["GgufReader", "InMemory", "KeyValue", "Tensor", "type_name"]

MAX_ARRAY = 1 << 30  # ggml's GGUF_MAX_ARRAY_ELEMENTS
MAX_STRING = 1 << 30  # ggml's GGUF_MAX_STRING_LENGTH
MAX_DIMS = 4  # GGML_MAX_DIMS
HEADER_WINDOW = 1 << 20  # header bytes read at a time


class Source(Protocol):
    """A file read with positioned reads: its name in messages, its size, ``read``."""

    @property
    def path(self) -> Path: ...

    @property
    def size(self) -> int: ...

    def read(self, offset: int, n: int) -> np.ndarray: ...


@dataclass(frozen=True)
class InMemory:
    """GGUF bytes held in memory, read as a file is.

    >>> InMemory(b"GGUF\\x03\\0\\0\\0").read(4, 1)
    array([3], dtype=uint8)
    """

    data: bytes
    path: Path = Path("<memory>")

    @property
    def size(self) -> int:
        """The number of bytes.

        >>> InMemory(b"GGUF").size
        4
        """
        return len(self.data)

    def read(self, offset: int, n: int) -> np.ndarray:
        """``n`` bytes at ``offset`` as a read-only uint8 array.

        >>> bytes(InMemory(b"GGUF").read(1, 2))
        b'GU'
        """
        return np.frombuffer(self.data, np.uint8, n, offset)


class KeyValue(NamedTuple):
    """One key-value: where its key starts, its type (a ``GGUFValueType``, or ``(ARRAY,
    item type)``) and its value (None where it was skipped).

    >>> KeyValue(24, "UINT32", 32).value
    32
    """

    at: int
    type: Any
    value: Any


class Tensor(NamedTuple):
    """One tensor info: where it starts, its ggml type, its ``ne`` (innermost first) and
    the absolute offset of its data.

    >>> Tensor(96, "F32", (32, 2), 128).ne
    (32, 2)
    """

    at: int
    type: Any
    ne: tuple[int, ...]
    offset: int


def type_name(vtype: Any) -> str:
    """How messages name a value type: ``UINT32``, or ``an array of STRING``.

    >>> import gguf
    >>> vt = gguf.GGUFValueType
    >>> type_name(vt.UINT32), type_name((vt.ARRAY, vt.STRING))
    ('UINT32', 'an array of STRING')
    """
    if isinstance(vtype, tuple):
        return f"an array of {vtype[1].name}"
    return str(vtype.name)


class GgufReader:
    """Reads a GGUF file front to back: :meth:`header`, :meth:`key_values`, then
    :meth:`tensor_infos` (:meth:`expect` and :meth:`alignment` read the key-values found);
    refusals are one :class:`~smoe.errors.RefusedInput` line naming the offset.

    >>> import gguf, tempfile
    >>> from smoe.format.view import FileView
    >>> w = gguf.GGUFWriter(path := tempfile.mkdtemp() + "/t.gguf", "llama")
    >>> w.add_tensor("blk.0.ffn_up.weight", np.ones((2, 32), np.float32))
    >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    >>> with FileView.open(path) as view:
    ...     reader = GgufReader(view, gguf)
    ...     version, n_tensors, n_kv = reader.header()
    ...     kv = reader.key_values(n_kv, keep={"general.architecture"})
    ...     tensors = reader.tensor_infos(n_tensors, reader.alignment(kv))
    >>> version, kv["general.architecture"].value, tensors["blk.0.ffn_up.weight"].ne
    (3, 'llama', (32, 2))
    """

    def __init__(self, source: Source, gguf: Any) -> None:
        self.source, self.g, self.path, self.size = source, gguf, source.path, source.size
        self.pos = 0
        self._buf = np.empty(0, np.uint8)
        self._buf_at = 0
        vt = gguf.GGUFValueType
        self.scalars = {
            vt.UINT8: "<u1",
            vt.INT8: "<i1",
            vt.UINT16: "<u2",
            vt.INT16: "<i2",
            vt.UINT32: "<u4",
            vt.INT32: "<i4",
            vt.FLOAT32: "<f4",
            vt.BOOL: "<u1",
            vt.UINT64: "<u8",
            vt.INT64: "<i8",
            vt.FLOAT64: "<f8",
        }

    # ---- bounded reads -----------------------------------------------------------------
    def _take(self, n: int, what: str) -> bytes:
        self._room(n, what)
        lo = self.pos - self._buf_at
        if lo < 0 or lo + n > len(self._buf):
            self._buf_at = self.pos
            self._buf = self.source.read(self.pos, min(self.size - self.pos, max(n, HEADER_WINDOW)))
            lo = 0
        self.pos += n
        return self._buf[lo : lo + n].tobytes()

    def _room(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise RefusedInput(
                f"{self.path}: {what} at offset {self.pos} needs {n} bytes, but the "
                f"file ends at offset {self.size} (truncated?)"
            )

    def _skip(self, n: int, what: str) -> None:
        self._room(n, what)
        self.pos += n

    def _u32(self, what: str) -> int:
        return int(struct.unpack("<I", self._take(4, what))[0])

    def _u64(self, what: str) -> int:
        return int(struct.unpack("<Q", self._take(8, what))[0])

    def _string_length(self, what: str) -> int:
        at = self.pos
        n = self._u64(f"{what} length")
        if n > MAX_STRING:
            raise RefusedInput(
                f"{self.path}: {what} at offset {at} is {n} bytes long (GGUF strings "
                f"are at most {MAX_STRING})"
            )
        return n

    def _string(self, what: str, strict: bool = True) -> str:
        at = self.pos
        raw = self._take(self._string_length(what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if not strict:
                return raw.decode("utf-8", "replace")
            raise RefusedInput(
                f"{self.path}: {what} at offset {at} is not valid UTF-8 (byte "
                f"0x{raw[e.start]:02x} at offset {at + 8 + e.start})"
            ) from None

    def _skip_string(self, what: str) -> None:
        self._skip(self._string_length(what), what)

    # ---- the header --------------------------------------------------------------------
    def header(self) -> tuple[int, int, int]:
        """Version, tensor count and key-value count (little-endian GGUF 2 or 3 only;
        the counts must fit in the file).

        >>> import gguf
        >>> GgufReader(InMemory(b"GGUF" + struct.pack("<IQQ", 3, 0, 0)), gguf).header()
        (3, 0, 0)
        >>> GgufReader(InMemory(b"GGUF" + struct.pack("<IQQ", 3, 1, 0)), gguf).header()
        Traceback (most recent call last):
        smoe.errors.RefusedInput: <memory>: 1 tensors (count at offset 8) and 0 key-values ...
        """
        if self._take(4, "magic") != b"GGUF":
            raise RefusedInput(f"{self.path}: not a GGUF file (no GGUF magic at offset 0)")
        version = self._u32("version")
        if version & 0xFFFF == 0 and version:
            raise RefusedInput(
                f"{self.path}: GGUF version at offset 4 reads {version:#x}: a "
                "big-endian file; only little-endian GGUF is read"
            )
        if version not in (2, self.g.GGUF_VERSION):
            raise RefusedInput(
                f"{self.path}: GGUF version {version} at offset 4; llama.cpp and "
                f"smoe read versions 2 and {self.g.GGUF_VERSION}"
            )
        n_tensors = self._u64("tensor count")
        n_kv = self._u64("key-value count")
        # the smallest key-value is 14 bytes (1-byte key, u8 value), tensor info 25 (0-d)
        if n_kv * 14 + n_tensors * 25 > self.size - self.pos:
            raise RefusedInput(
                f"{self.path}: {n_tensors} tensors (count at offset 8) and {n_kv} "
                f"key-values (count at offset 16) cannot fit in {self.size} bytes"
            )
        return version, n_tensors, n_kv

    # ---- the key-values ----------------------------------------------------------------
    def key_values(
        self,
        n: int,
        keep: Collection[str] = (),
        on_key: Callable[[str, dict[str, KeyValue]], None] | None = None,
    ) -> dict[str, KeyValue]:
        """key -> :class:`KeyValue` of the ``n`` key-values: scalars' values always, strings'
        and string arrays' only for the keys in ``keep`` (other arrays are skipped).
        ``on_key(key, so_far)`` is called as each key is read (to refuse a wrong file at once).

        >>> import gguf
        >>> entry = struct.pack("<Q", 12) + b"general.type" + struct.pack("<IQ", 8, 7) + b"imatrix"
        >>> reader = GgufReader(InMemory(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + entry), gguf)
        >>> _ = reader.header()
        >>> reader.key_values(1, keep={"general.type"})["general.type"]
        KeyValue(at=24, type=<GGUFValueType.STRING: 8>, value='imatrix')
        """
        out: dict[str, KeyValue] = {}
        for i in range(n):
            at = self.pos
            key = self._string(f"key {i}")
            if not key:
                raise RefusedInput(f"{self.path}: key {i} at offset {at} is empty")
            if key in out:
                raise RefusedInput(
                    f"{self.path}: key {key!r} at offset {at} appears twice (first at "
                    f"offset {out[key].at})"
                )
            out[key] = self._value(key, at, key in keep)
            if on_key is not None:
                on_key(key, out)
        return out

    def _value(self, key: str, at: int, keep: bool) -> KeyValue:
        """The value of ``key`` (whose key string starts at ``at``)."""
        vt = self.g.GGUFValueType
        vtype = self._value_type(key, at)
        if vtype == vt.ARRAY:
            return self._array(key, at, keep)
        if vtype == vt.STRING:
            if keep:
                return KeyValue(at, vtype, self._string(f"key {key!r} value"))
            self._skip_string(f"key {key!r} value")
            return KeyValue(at, vtype, None)
        dtype = np.dtype(self.scalars[vtype])
        raw = self._take(dtype.itemsize, f"key {key!r} value")
        return KeyValue(at, vtype, np.frombuffer(raw, dtype)[0].item())

    def _array(self, key: str, at: int, keep: bool) -> KeyValue:
        """An array value: its count bounded by the bytes left; kept if of strings."""
        vt = self.g.GGUFValueType
        item = self._value_type(key, at)
        if item == vt.ARRAY:
            raise RefusedInput(
                f"{self.path}: key {key!r} at offset {at} is an array of "
                "arrays, which GGUF readers refuse"
            )
        count = self._u64(f"key {key!r} array length")
        least = 8 if item == vt.STRING else np.dtype(self.scalars[item]).itemsize
        if count > MAX_ARRAY or count * least > self.size - self.pos:
            raise RefusedInput(
                f"{self.path}: key {key!r} at offset {at} claims an array of "
                f"{count} {item.name} values; the file has "
                f"{self.size - self.pos} bytes left"
            )
        value = None
        if item != vt.STRING:
            self._skip(count * least, f"key {key!r} values")
        elif keep:  # e.g. dataset names: paths, shown as they decode
            value = [self._string(f"key {key!r} item {j}", strict=False) for j in range(count)]
        else:
            for j in range(count):
                self._skip_string(f"key {key!r} item {j}")
        return KeyValue(at, (vt.ARRAY, item), value)

    def _value_type(self, key: str, at: int) -> Any:
        raw = self._u32(f"key {key!r} type")
        try:
            return self.g.GGUFValueType(raw)
        except ValueError:
            raise RefusedInput(
                f"{self.path}: key {key!r} at offset {at} has unknown value type {raw}"
            ) from None

    def expect(self, kv: dict[str, KeyValue], key: str, vtype: Any, expected: str) -> Any:
        """The value of ``key`` (present in ``kv``), refused unless of type ``vtype``
        (``expected``: how the message names it).

        >>> import gguf
        >>> vt = gguf.GGUFValueType
        >>> reader = GgufReader(InMemory(b""), gguf)
        >>> reader.expect({"n": KeyValue(24, vt.UINT32, 7)}, "n", vt.UINT32, "UINT32")
        7
        >>> reader.expect({"n": KeyValue(24, vt.INT8, 7)}, "n", vt.UINT32, "UINT32")
        Traceback (most recent call last):
        smoe.errors.RefusedInput: <memory>: key n at offset 24 is INT8, expected UINT32
        """
        at, found, value = kv[key]
        if found != vtype:
            raise RefusedInput(
                f"{self.path}: key {key} at offset {at} is {type_name(found)}, expected {expected}"
            )
        return value

    def alignment(self, kv: dict[str, KeyValue]) -> int:
        """``general.alignment`` (a power of two), or GGUF's default of 32.

        >>> import gguf
        >>> GgufReader(InMemory(b""), gguf).alignment({})
        32
        """
        key = self.g.Keys.General.ALIGNMENT
        if key not in kv:
            return int(self.g.GGUF_DEFAULT_ALIGNMENT)
        value = self.expect(kv, key, self.g.GGUFValueType.UINT32, "UINT32")
        if value == 0 or value & (value - 1):
            raise RefusedInput(
                f"{self.path}: key {key} at offset {kv[key].at} is {value}, not a power of two"
            )
        return int(value)

    # ---- the tensor infos --------------------------------------------------------------
    def tensor_infos(self, n: int, alignment: int) -> dict[str, Tensor]:
        """name -> :class:`Tensor` of the ``n`` tensor infos, all checked: the data of each
        follows the one before, padded to ``alignment``, and the last ends the file.

        >>> import gguf
        >>> padded = b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + bytes(8)  # to 32 bytes
        >>> reader = GgufReader(InMemory(padded), gguf)
        >>> _ = reader.header()
        >>> reader.tensor_infos(0, 32)
        {}
        """
        infos: dict[str, Tensor] = {}
        expected = 0  # the data offset the next tensor must have
        for i in range(n):
            name, info, nbytes = self._tensor_info(i, infos, expected, alignment)
            infos[name] = info
            expected += -(-nbytes // alignment) * alignment
        start = -(-self.pos // alignment) * alignment
        self._check_data(start, expected, next(reversed(infos), None))
        return {k: t._replace(offset=start + t.offset) for k, t in infos.items()}

    def _tensor_info(
        self, i: int, infos: dict[str, Tensor], expected: int, alignment: int
    ) -> tuple[str, Tensor, int]:
        """Tensor info ``i``: its name, the info (data offset relative) and its data's size."""
        at = self.pos
        name = self._string(f"tensor {i} name")
        if not name:
            raise RefusedInput(f"{self.path}: tensor {i} at offset {at} has an empty name")
        if name in infos:
            raise RefusedInput(
                f"{self.path}: tensor {name!r} at offset {at} appears twice "
                f"(first at offset {infos[name].at})"
            )
        ne = self._shape(name, at)
        ttype, block, type_size = self._ggml_type(name, at)
        if ne and ne[0] % block:
            raise RefusedInput(
                f"{self.path}: tensor {name!r} at offset {at} has rows of "
                f"{ne[0]} elements, not a multiple of {ttype.name}'s block of "
                f"{block}"
            )
        offset = self._u64(f"tensor {name!r} data offset")
        if offset != expected:
            raise RefusedInput(
                f"{self.path}: tensor {name!r} at offset {at} has data offset "
                f"{offset}, expected {expected} (tensors follow each other, "
                f"each padded to {alignment} bytes)"
            )
        return name, Tensor(at, ttype, ne, offset), math.prod(ne) // block * type_size

    def _shape(self, name: str, at: int) -> tuple[int, ...]:
        """A tensor's ``ne``: at most :data:`MAX_DIMS` dimensions, fewer than 2^63 elements."""
        n_dims = self._u32(f"tensor {name!r} dimension count")
        if n_dims > MAX_DIMS:
            raise RefusedInput(
                f"{self.path}: tensor {name!r} at offset {at} has {n_dims} "
                f"dimensions (at most {MAX_DIMS})"
            )
        ne = tuple(self._u64(f"tensor {name!r} dimension {j}") for j in range(n_dims))
        if any(d >= 1 << 63 for d in ne) or math.prod(ne) >= 1 << 63:
            raise RefusedInput(
                f"{self.path}: tensor {name!r} at offset {at} has shape "
                f"{list(ne)}: 2^63 elements or more"
            )
        return ne

    def _ggml_type(self, name: str, at: int) -> tuple[Any, int, int]:
        """A tensor's ggml type, its block size (elements) and the bytes of a block."""
        raw = self._u32(f"tensor {name!r} type")
        try:
            ttype = self.g.GGMLQuantizationType(raw)
            block, type_size = self.g.GGML_QUANT_SIZES[ttype]
        except (ValueError, KeyError):
            raise RefusedInput(
                f"{self.path}: tensor {name!r} at offset {at} has unknown ggml type {raw}"
            ) from None
        return ttype, int(block), int(type_size)

    def _check_data(self, start: int, length: int, last: str | None) -> None:
        """The data section (``length`` bytes at ``start``) must end the file exactly."""
        if start + length > self.size:
            raise RefusedInput(
                f"{self.path}: tensor data runs from offset {start} to "
                f"{start + length}, beyond the end of the file ({self.size} bytes; "
                "truncated?)"
            )
        if start + length < self.size:
            after = "the key-values" if last is None else f"the last tensor ({last!r})"
            raise RefusedInput(
                f"{self.path}: {self.size - start - length} bytes at offset "
                f"{start + length} after {after} belong to no tensor"
            )
