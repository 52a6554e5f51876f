"""A checkpoint's model card (``README.md``): what its YAML front matter says of the model's
license, name and base model, for the manifest's ``source.card`` (docs/MANIFEST.md).

The card is untrusted and may be anything: only its first :data:`MAX_BYTES` bytes are read
(a FIFO, a device or a folder is refused without blocking), the front matter must end within
them, and it is read line by line without a YAML library (no anchors, aliases, tags or
nested documents are expanded): top-level ``key: value`` lines of the keys in :data:`KEYS`,
a value a plain, single- or double-quoted scalar, or a list of them (``[a, b]`` or ``- a``
lines), each of at most :data:`MAX_VALUE` characters. Anything else is left out. A card that
cannot be read is a warning, never a failure of the sculpt.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from smoe.errors import SmoeError
from smoe.plumbing import fileio

__all__ = ["CARD", "KEYS", "MAX_BYTES", "MAX_ITEMS", "MAX_VALUE", "front_matter", "read_card"]

CARD = "README.md"
"""The model card's file name in a checkpoint folder (as on the HuggingFace Hub)."""
MAX_BYTES = 64 << 10
"""Bytes of the card read at most: its front matter must end within them."""
KEYS = ("license", "license_name", "license_link", "model_name", "base_model")
"""The front matter keys recorded (HuggingFace's model card metadata)."""
MAX_VALUE = 1024
"""A longer value is left out."""
MAX_ITEMS = 16
"""A list keeps at most this many values."""

_KEY_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)[ \t]*:(?:[ \t]+(.*))?$")
_ITEM = re.compile(r"[ \t]*-[ \t]+(.*)$")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_FENCE = ("---", "...")

Value = str | list[str]


def read_card(root: str | os.PathLike) -> tuple[dict[str, Value] | None, str | None]:
    """The recorded front matter of ``root``'s model card, or None (no card, no front matter
    or none of :data:`KEYS`), and a warning when there is a card that cannot be read.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> card = "---\\nlicense: apache-2.0\\ntags: [moe]\\n---\\n# Model\\n"
    >>> _ = (d / "README.md").write_text(card)
    >>> read_card(d)
    ({'license': 'apache-2.0'}, None)
    >>> read_card("fixtures/checkpoints/qwen3_moe")
    (None, None)
    """
    path = Path(root) / CARD
    if not os.path.lexists(path):
        return None, None
    unused = "the model card's license is not recorded"
    try:
        fd = fileio.open_input(path)
    except SmoeError as e:
        return None, f"{e}; {unused}"
    try:
        size = os.fstat(fd).st_size
        raw = fileio.pread_exact(fd, min(size, MAX_BYTES), 0, path)
    except SmoeError as e:
        return None, f"{e}; {unused}"
    finally:
        os.close(fd)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if size > MAX_BYTES and e.start >= len(raw) - 3:  # a character cut at the bound
            text = raw[: e.start].decode("utf-8")
        else:
            return None, f"{path}: not UTF-8 text (byte {e.start}); {unused}"
    lines = text.removeprefix("\ufeff").split("\n")
    if not lines or lines[0].rstrip() != "---":
        return None, None  # no front matter: nothing to record
    body = front_matter(lines)
    if body is None:
        return None, (
            f"{path}: its front matter (between '---' lines) does not end within the first "
            f"{MAX_BYTES} bytes; {unused}"
        )
    return body or None, None


def front_matter(lines: list[str]) -> dict[str, Value] | None:
    """The :data:`KEYS` entries of front matter ``lines`` (the first is the opening
    ``---``), or None when no closing ``---`` (or ``...``) line follows.

    >>> front_matter(["---", "license: other", "license_name: 'tongyi qianwen'",
    ...               "base_model:", "  - Qwen/Qwen3-30B-A3B-Base", "model-index:",
    ...               "  - name: x", "---"])  # doctest: +NORMALIZE_WHITESPACE
    {'license': 'other', 'license_name': 'tongyi qianwen',
     'base_model': ['Qwen/Qwen3-30B-A3B-Base']}
    >>> front_matter(["---", "license: mit"]) is None
    True
    """
    end = next((i for i, line in enumerate(lines[1:], 1) if line.rstrip() in _FENCE), None)
    if end is None:
        return None
    body = [line.rstrip("\r") for line in lines[1:end]]
    out: dict[str, Value] = {}
    i = 0
    while i < len(body):
        m = _KEY_LINE.match(body[i])
        i += 1
        if not m:
            continue
        key, rest = m.group(1), (m.group(2) or "").strip()
        items: list[str | None] = []
        if not rest or rest.startswith("#"):  # a block list may follow: "  - item" lines
            while i < len(body) and (body[i][:1] in (" ", "\t", "-") or not body[i].strip()):
                item = _ITEM.match(body[i])
                if item:
                    items.append(_scalar(item.group(1)))
                i += 1
            value: Value | None = _listed(items)
        elif rest.startswith("["):
            inner = rest[1:].partition("]")[0] if "]" in rest else ""
            value = _listed([_scalar(x) for x in inner.split(",")]) if inner.strip() else None
        else:
            value = _scalar(rest)
        if key in KEYS and key not in out and value is not None:
            out[key] = value
    return out


def _listed(items: list[str | None]) -> list[str] | None:
    kept = [x for x in items if x is not None][:MAX_ITEMS]
    return kept or None


def _scalar(text: str) -> str | None:
    """A plain, single- or double-quoted YAML scalar as its text; None for anything else (a
    mapping, an anchor, an alias, a tag, a block scalar), an empty value, or one too long or
    holding control characters."""
    text = text.strip()
    if text.startswith('"'):
        end = text.rfind('"')
        try:
            value = json.loads(text[: end + 1]) if end > 0 else None
        except ValueError:
            value = None
        value = value if isinstance(value, str) else None
    elif text.startswith("'"):
        end = text.rfind("'")
        value = text[1:end].replace("''", "'") if end > 0 else None
    elif not text or text[0] in "{[&*!|>%@`":
        value = None
    else:
        value = re.split(r"[ \t]#", text, maxsplit=1)[0].strip()
        if ": " in value or value.endswith(":"):  # a mapping ("- name: x"), not a scalar
            value = None
    if not value or len(value) > MAX_VALUE or _CONTROL.search(value):
        return None
    return value
