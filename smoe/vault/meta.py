"""The free-form ``metadata`` of a vault's manifest (docs/MANIFEST.md): its rules, and
``smoe meta``'s reading and editing of it.

``metadata`` is a flat JSON object of text: the vault's human-readable ``name``, a
``description``, a ``license`` (``smoe sculpt --title/--description/--license`` set them) and
any other key of the documented form (:data:`KEY_PATTERN`). It lives in the manifest only,
not in the vault: editing it rewrites ``<vault>.manifest.json`` and nothing else.

An edit (:func:`edit_meta`) first checks that the manifest belongs to the vault (the checks
``smoe verify --deep`` makes, less the blobs' CRC-32C: no blob is read), then writes the
whole manifest anew, every other key as it was, under a temporary name, fsyncs it and renames
it over the old one (:class:`~smoe.plumbing.atomic.AtomicFile`): an interruption at any instant
leaves the old manifest or the new one, never a mix. It holds the vault's lock (the one
``smoe sculpt`` and ``smoe upgrade`` hold while they write the vault), so two edits, or an
edit and a sculpt, never interleave. The blobs and the manifest's checksums are untouched:
``smoe verify --deep`` passes after an edit as it did before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smoe.errors import RefusedInput, SmoeError, UsageError
from smoe.format import manifest
from smoe.interop.safetensors_io import json_excerpt
from smoe.plumbing.atomic import AtomicFile, sweep_stale
from smoe.plumbing.lock import Lock
from smoe.vault.companions import lock_path

__all__ = [
    "KEY_PATTERN",
    "LIMITS",
    "MAX_KEYS",
    "MAX_TEXT",
    "MetaResult",
    "check_key",
    "check_metadata",
    "check_value",
    "edit_meta",
    "parse_assignment",
    "read_meta",
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


def parse_assignment(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (``smoe meta --set``) as a checked (key, value); split at the first
    ``=``.

    >>> parse_assignment("description=Q4 of x=y")
    ('description', 'Q4 of x=y')
    >>> parse_assignment("name")
    Traceback (most recent call last):
    smoe.errors.UsageError: expected KEY=VALUE, got 'name'
    """
    key, eq, value = text.partition("=")
    if not eq:
        raise UsageError(f"expected KEY=VALUE, got {text!r}")
    key = check_key(key)
    return key, check_value(key, value)


@dataclass
class MetaResult:
    """What :func:`read_meta` or :func:`edit_meta` found: the vault, its manifest, the
    metadata (after the edit), whether the manifest was rewritten, and the keys set and
    removed.

    >>> r = read_meta("fixtures/q4_v2.smoe")
    >>> r.manifest.name, r.metadata, r.changed
    ('q4_v2.smoe.manifest.json', {}, False)
    """

    vault: Path
    manifest: Path
    metadata: dict[str, str]
    changed: bool = False
    set: list[str] = field(default_factory=list)
    unset: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document of ``smoe meta`` (docs/JSON.md, "Meta document").

        >>> doc = read_meta("fixtures/q4_v2.smoe").to_dict()
        >>> doc["schema"], doc["metadata"], doc["changed"]
        ('smoe-meta/1', {}, False)
        """
        return {
            "schema": SCHEMA,
            "vault": os.fsdecode(self.vault),
            "manifest": os.fsdecode(self.manifest),
            "metadata": self.metadata,
            "changed": self.changed,
            "set": self.set,
            "unset": self.unset,
        }


SCHEMA = "smoe-meta/1"  # the "schema" key of `smoe meta --json` (docs/JSON.md)


def read_meta(vault: str | os.PathLike) -> MetaResult:
    """The metadata of ``vault``'s manifest, once the manifest is known to be the vault's
    (refusals as for :func:`edit_meta`).

    >>> read_meta("fixtures/q4_v2.smoe").vault
    PosixPath('fixtures/q4_v2.smoe')
    """
    path = Path(vault)
    where, doc = _checked(path)
    return MetaResult(path, where, _stored(doc, where))


def edit_meta(
    vault: str | os.PathLike,
    set: Mapping[str, object] | None = None,
    unset: Iterable[str] = (),
) -> MetaResult:
    """Set the keys of ``set`` and remove those of ``unset`` in ``vault``'s manifest,
    atomically and under the vault's lock (see the module docstring); nothing is written when
    nothing changes.

    Refused before anything is written: a key or value that breaks the rules
    (:func:`check_key`, :func:`check_value`) or a key both set and unset (UsageError); a vault
    that cannot be opened or is no vault; a vault without a manifest, a manifest that cannot
    be read, or one that does not match the vault; metadata in the manifest that breaks the
    rules, a key to remove that it does not hold (RefusedInput); another smoe process writing
    the vault (WriteFailed).

    >>> import shutil, tempfile
    >>> d = tempfile.mkdtemp()
    >>> v = shutil.copy("fixtures/q4_v2.smoe", d)
    >>> _ = shutil.copy("fixtures/q4_v2.smoe.manifest.json", d)
    >>> r = edit_meta(v, set={"name": "OLMoE tiny", "license": "apache-2.0"})
    >>> r.metadata, r.changed, r.set
    ({'license': 'apache-2.0', 'name': 'OLMoE tiny'}, True, ['license', 'name'])
    >>> edit_meta(v, unset=["license"]).metadata
    {'name': 'OLMoE tiny'}
    >>> from smoe.format.verify import verify_path
    >>> verify_path(v, deep=True).ok
    True
    """
    path = Path(vault)
    wanted = {check_key(k): check_value(k, v) for k, v in sorted((set or {}).items())}
    dropped = sorted(dict.fromkeys(check_key(k) for k in unset))
    both = [k for k in dropped if k in wanted]
    if both:
        raise UsageError(f"metadata key {both[0]!r}: both set and unset")
    _checked(path)  # an unreadable vault or manifest is refused before the lock file is made
    with Lock(lock_path(path), path):
        where, doc = _checked(path)
        old = _stored(doc, where)
        missing = [k for k in dropped if k not in old]
        if missing:
            has = ", ".join(old) or "none"
            raise RefusedInput(
                f"{where}: the metadata has no key {missing[0]!r} to unset (it has: {has})"
            )
        new = {k: v for k, v in old.items() if k not in dropped} | wanted
        new = dict(sorted(new.items()))
        if len(new) > MAX_KEYS:
            raise RefusedInput(
                f"{where}: the metadata would hold {len(new)} keys, more than the "
                f"{MAX_KEYS} allowed"
            )
        set_keys = [k for k in wanted if old.get(k) != wanted[k]]
        result = MetaResult(path, where, new, bool(set_keys or dropped), set_keys, dropped)
        if not result.changed:
            return result
        if new:
            doc["metadata"] = new
        else:
            doc.pop("metadata", None)
        try:
            data = manifest.encode(doc)
        except (TypeError, ValueError) as e:  # a number of an unknown key that JSON cannot hold
            raise RefusedInput(
                f"{where}: holds a value strict JSON cannot write ({e}); nothing written"
            ) from None
        target = os.path.realpath(where)  # through a symlink: its target
        sweep_stale(target)  # the temporary files of a killed edit (we hold the lock)
        with AtomicFile(target) as out:
            out.pwrite(data, 0)
            out.commit()
    return result


def _checked(path: Path) -> tuple[Path, dict[str, Any]]:
    """The manifest beside ``path`` and its document, once ``path`` opened as a vault and
    the manifest passed the checks ``smoe verify --deep`` makes of it, less the blobs'."""
    from smoe.vault.reader import Vault

    with Vault.open(path) as v:
        where = manifest.path_for(path)
        if not os.path.lexists(where):
            raise RefusedInput(
                f"{path}: has no manifest ({where.name} beside it), where the metadata is "
                "kept; smoe sculpt writes one with every vault, and smoe upgrade VAULT --out "
                "NEW --config CONFIG writes a copy of the vault with one"
            )
        try:
            doc = manifest.load(where, len(v))
        except manifest.ManifestError as e:
            raise RefusedInput(f"{where}: the vault's manifest is unusable ({e})") from None
        found = manifest.check(doc, len(v.data), v.table, lambda o, n: v.data[o : o + n], False)
    if found:
        raise RefusedInput(
            f"{where}: does not match {path}: {found[0].message} (smoe verify --deep "
            f"{path} checks both)"
        )
    return where, doc


def _stored(doc: dict[str, Any], where: Path) -> dict[str, str]:
    """The manifest's ``metadata`` (absent or null: none), refused if it breaks the rules."""
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
