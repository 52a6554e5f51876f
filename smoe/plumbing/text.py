"""Text that is valid UTF-8 wherever it is written (a manifest, a marker): the one place a
lone surrogate is made safe.

Python keeps each byte of a file name that is not UTF-8 as a lone surrogate (U+DC80 to
U+DCFF, ``os.fsdecode``), and a JSON ``\\ud800`` escape gives one too; neither can be encoded
as UTF-8, and JSON that holds one (even escaped) is refused by strict readers. Such a byte is
written as ``\\xNN``, as the terminal shows it; any other lone surrogate as U+FFFD.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["utf8_text", "utf8_tree"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8_text(s: str) -> str:
    """``s`` with every lone surrogate replaced: an undecodable byte as ``\\xNN``, any other
    surrogate as U+FFFD; text without one comes back as it is.

    >>> import os
    >>> utf8_text(os.fsdecode(b"caf\\xe9.smoe")), utf8_text("\\ud800x"), utf8_text("é")
    ('caf\\\\xe9.smoe', '\\ufffdx', 'é')
    """
    if s.isascii():
        return s
    return _SURROGATE.sub(_escaped, s)


def _escaped(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "\ufffd"


def utf8_tree(obj: Any) -> Any:
    """A JSON document (dicts, lists, scalars) with :func:`utf8_text` applied to every string,
    keys included; anything else is returned as it is.

    >>> utf8_tree({"name\\udcff": ["v\\udcfe.smoe", 1, None]})
    {'name\\\\xff': ['v\\\\xfe.smoe', 1, None]}
    """
    if isinstance(obj, str):
        return utf8_text(obj)
    if isinstance(obj, dict):
        return {utf8_tree(k): utf8_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [utf8_tree(v) for v in obj]
    return obj
