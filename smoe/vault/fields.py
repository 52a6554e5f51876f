"""A header or arch block as a dict of plain Python values (``Vault.header``, ``Vault.arch``).

The numpy records the reader checks and the writers copy hold numpy scalars, ``model_type``
as bytes and float32 fields as binary fractions; code that only wants to look at a vault
(print it, compare it with a config, serialise it with ``json.dumps``) wants ints, floats
and text, as safetensors' and gguf-py's metadata give them; byte arrays (``magic``,
``reserved``) are the hex text ``smoe dump --json`` prints. The records stay available beside them
(``Vault.header_record``, ``Vault.arch_record``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from smoe.format.records import model_type_str

__all__ = ["FieldText", "Fields"]


class FieldText(str):
    """A text field: a ``str`` that also answers as the bytes it was read from
    (``model_type``'s text, or the hex text of ``magic`` and ``reserved``).

    Until the header and arch block were dicts, ``vault.arch["model_type"]`` was bytes;
    code written then (``== b"olmoe"``, ``.decode()``, ``bytes(...)``) keeps working, and so
    does ``vault.header["magic"] == layout.MAGIC``.

    >>> t = FieldText("olmoe", b"olmoe")
    >>> t == "olmoe", t == b"olmoe", bytes(t), t.upper()
    (True, True, b'olmoe', 'OLMOE')
    """

    _raw: bytes

    def __new__(cls, text: str, raw: bytes | None = None) -> FieldText:
        self = super().__new__(cls, text)
        self._raw = text.encode() if raw is None else raw
        return self

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        """The text itself, as a plain ``str`` (what ``bytes.decode`` gave before).

        >>> FieldText("qwen3_moe").decode()
        'qwen3_moe'
        """
        return str(self)

    def hex(self) -> str:
        """The hex of the bytes (what ``bytes.hex`` gave before; a byte array's own text).

        >>> FieldText("olmoe").hex()
        '6f6c6d6f65'
        """
        return self._raw.hex()

    def __bytes__(self) -> bytes:
        return self._raw

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (bytes, bytearray)):
            return self._raw == other
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return str.__hash__(self)


def _plain(value: Any, dtype: np.dtype) -> Any:
    """One field's value: an int, the shortest decimal that reads back as the same float32
    (``1e-06``, not ``9.99999997e-07``), :class:`FieldText` for text and for byte arrays
    (their hex, as ``dump --json`` prints them)."""
    if dtype.subdtype is not None:  # magic, reserved: u1 arrays
        raw = bytes(np.asarray(value, np.uint8))
        return FieldText(raw.hex(), raw)
    if dtype.kind == "S":
        return FieldText(model_type_str(value), bytes(value))
    if dtype.kind == "f":
        return float(np.format_float_scientific(value, unique=True))
    return int(value)


class Fields(dict[str, Any]):
    """A structured record's fields as a new dict: ints, floats, text (:class:`FieldText`),
    the byte arrays (``magic``, ``reserved``) as their hex text, as ``smoe dump --json``
    prints them; ``json.dumps`` takes it as it is. Changing it changes nothing else.

    ``dtype`` and ``record`` give the numpy record it was read from (for code written
    against the record: ``vault.header.dtype.names``).

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as v:
    ...     h, a = v.header, v.arch
    >>> h["version"], h["bits"], h["magic"], bytes(h["magic"])
    (2, 4, '534d4f45deea0001', b'SMOE\\xde\\xea\\x00\\x01')
    >>> a["model_type"], a["rope_theta"], a["rms_norm_eps"]
    ('olmoe', 10000.0, 1e-05)
    """

    _record: np.void

    def __init__(self, record: np.void) -> None:
        dt = record.dtype
        super().__init__((name, _plain(record[name], dt[name])) for name in dt.names or ())
        self._record = record

    @property
    def dtype(self) -> np.dtype:
        """The record's numpy dtype (its field names, types and offsets).

        >>> from smoe.vault.reader import Vault
        >>> Vault.open("fixtures/q4_v2.smoe").header.dtype.names[:3]
        ('magic', 'version', 'num_moe_layers')
        """
        return self._record.dtype

    @property
    def record(self) -> np.void:
        """The numpy record these fields were read from.

        >>> from smoe.vault.reader import Vault
        >>> Vault.open("fixtures/q4_v2.smoe").arch.record["model_type"]
        np.bytes_(b'olmoe')
        """
        return self._record
