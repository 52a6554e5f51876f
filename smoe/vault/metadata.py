"""The rules of a manifest's free-form ``metadata`` (docs/MANIFEST.md): what a key and a
value may be, and the checked reading of a manifest's ``metadata`` object. Apart from
:mod:`smoe.vault.meta` (which opens vaults to edit it) so that the reader, the writers and
the upgrade can check it without importing what edits it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from smoe.errors import RefusedInput, SmoeError, UsageError
from smoe.interop.safetensors_io import json_excerpt

__all__ = [
    "KEY_PATTERN",
    "LIMITS",
    "MAX_KEY",
    "MAX_KEYS",
    "MAX_TEXT",
    "check_key",
    "check_metadata",
    "check_value",
    "stored_metadata",
]

KEY_PATTERN = r"[a-z][a-z0-9_]*(?:[.-][a-z0-9_]+)*"
"""A metadata key: lower-case ASCII letters, digits and ``_``, in parts joined by ``.`` or
``-``, starting with a letter; at most :data:`MAX_KEY` characters (``name``, ``license``,
``general.source_url``, ``quantized-by``)."""
MAX_KEY = 64
MAX_KEYS = 64
"""At most this many keys in ``metadata``."""
MAX_TEXT = 4096
"""At most this many characters in a value (``name`` and ``license``: :data:`LIMITS`)."""
LIMITS = {"name": 256, "license": 128}
"""Shorter bounds of the keys ``smoe sculpt`` sets (``description``: :data:`MAX_TEXT`)."""

_KEY = re.compile(KEY_PATTERN)
_LICENSE = re.compile(r"[A-Za-z0-9()](?:[A-Za-z0-9.+:_() -]*[A-Za-z0-9.+_()])?")
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # tab and line feed are text


def check_key(key: object) -> str:
    """``key`` if it is a metadata key (:data:`KEY_PATTERN`); else a UsageError.

    >>> check_key("general.source_url")
    'general.source_url'
    >>> check_key("Name")
    Traceback (most recent call last):
    smoe.errors.UsageError: metadata key 'Name': expected lower-case letters, digits and '_', \
in parts joined by '.' or '-', starting with a letter, at most 64 characters (e.g. name, \
license, general.source_url)
    """
    if not isinstance(key, str) or len(key) > MAX_KEY or not _KEY.fullmatch(key):
        shown = key if isinstance(key, str) else json_excerpt(key)
        raise UsageError(
            f"metadata key {shown!r}: expected lower-case letters, digits and '_', in parts "
            f"joined by '.' or '-', starting with a letter, at most {MAX_KEY} characters "
            "(e.g. name, license, general.source_url)"
        )
    return key


def check_value(key: str, value: object) -> str:
    """``value`` if it can be the text of metadata ``key``; else a UsageError: not a string,
    not UTF-8 (undecodable bytes of a command line), empty, a control character other than
    tab and line feed, longer than its bound, or (``license``) not a license id.

    >>> check_value("license", "Apache-2.0 OR MIT")
    'Apache-2.0 OR MIT'
    >>> check_value("name", 3)
    Traceback (most recent call last):
    smoe.errors.UsageError: metadata name: the value is a number, expected text
    >>> check_value("description", "a\\x1b[31m")
    Traceback (most recent call last):
    smoe.errors.UsageError: metadata description: the value holds the control character \
U+001B; text only (tab and line feed allowed)
    """
    if not isinstance(value, str):
        kind = {bool: "a boolean", int: "a number", float: "a number", type(None): "null"}
        what = kind.get(type(value), "a list" if isinstance(value, list) else "an object")
        raise UsageError(f"metadata {key}: the value is {what}, expected text")
    if _SURROGATE.search(value):
        raise UsageError(f"metadata {key}: the value is not UTF-8 text (undecodable bytes)")
    if not value.strip():
        raise UsageError(f"metadata {key}: the value is empty (--unset {key} removes a key)")
    bad = _CONTROL.search(value)
    if bad:
        raise UsageError(
            f"metadata {key}: the value holds the control character "
            f"U+{ord(bad.group()):04X}; text only (tab and line feed allowed)"
        )
    limit = LIMITS.get(key, MAX_TEXT)
    if len(value) > limit:
        raise UsageError(
            f"metadata {key}: the value is {len(value)} characters, more than the {limit} allowed"
        )
    if key == "license" and not _LICENSE.fullmatch(value):
        raise UsageError(
            f"metadata license: {value!r} is not a license id (an SPDX identifier or "
            "expression such as Apache-2.0 or 'MIT OR Apache-2.0', or a Hub id such as "
            "llama3.1: letters, digits, '.', '+', '-', '_', ':', parentheses and spaces)"
        )
    return value


def check_metadata(metadata: Mapping[str, object]) -> dict[str, str]:
    """A whole ``metadata`` object, every key and value checked, in key order; a UsageError
    for the first one that is not, or for more than :data:`MAX_KEYS` keys.

    >>> check_metadata({"name": "Qwen3 30B, Q4", "license": "apache-2.0"})
    {'license': 'apache-2.0', 'name': 'Qwen3 30B, Q4'}
    """
    if len(metadata) > MAX_KEYS:
        raise UsageError(f"metadata: {len(metadata)} keys, more than the {MAX_KEYS} allowed")
    return {check_key(k): check_value(k, metadata[k]) for k in sorted(metadata, key=str)}


def stored_metadata(doc: Mapping[str, Any], where: Path) -> dict[str, str]:
    """The ``metadata`` of the manifest document ``doc`` read from ``where`` (absent or null:
    none), refused (RefusedInput) if it breaks the rules.

    >>> stored_metadata({"metadata": {"name": "tiny"}}, Path("v.smoe.manifest.json"))
    {'name': 'tiny'}
    >>> stored_metadata({}, Path("v.smoe.manifest.json"))
    {}
    """
    stored = doc.get("metadata")
    if stored is None:
        return {}
    if not isinstance(stored, dict):
        raise RefusedInput(
            f"{where}: manifest/metadata is {json_excerpt(stored)}, expected an object of text"
        )
    try:
        return check_metadata(stored)
    except SmoeError as e:
        raise RefusedInput(f"{where}: manifest/metadata breaks the rules: {e}") from None
