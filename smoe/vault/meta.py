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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smoe.errors import RefusedInput, UsageError
from smoe.format import manifest
from smoe.plumbing.atomic import AtomicFile, sweep_stale
from smoe.plumbing.lock import Lock
from smoe.vault.companions import lock_path
from smoe.vault.metadata import (
    KEY_PATTERN,
    LIMITS,
    MAX_KEYS,
    MAX_TEXT,
    check_key,
    check_metadata,
    check_value,
    stored_metadata,
)

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
    absent: list[str] = field(default_factory=list)
    """Keys ``unset`` asked to remove that the metadata did not hold (nothing to do)."""

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
            "absent": self.absent,
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
    return MetaResult(path, where, stored_metadata(doc, where))


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
    rules (RefusedInput); another smoe process writing the vault (WriteFailed). A key to
    remove that the metadata does not hold is already as asked: listed in ``absent``.

    >>> import shutil, tempfile
    >>> d = tempfile.mkdtemp()
    >>> v = shutil.copy("fixtures/q4_v2.smoe", d)
    >>> _ = shutil.copy("fixtures/q4_v2.smoe.manifest.json", d)
    >>> r = edit_meta(v, set={"name": "OLMoE tiny", "license": "apache-2.0"})
    >>> r.metadata, r.changed, r.set
    ({'license': 'apache-2.0', 'name': 'OLMoE tiny'}, True, ['license', 'name'])
    >>> edit_meta(v, unset=["license"]).metadata
    {'name': 'OLMoE tiny'}
    >>> r = edit_meta(v, unset=["license"])
    >>> r.changed, r.unset, r.absent
    (False, [], ['license'])
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
        old = stored_metadata(doc, where)
        absent = [k for k in dropped if k not in old]  # already as asked: a note, not an error
        dropped = [k for k in dropped if k in old]
        new = {k: v for k, v in old.items() if k not in dropped} | wanted
        new = dict(sorted(new.items()))
        if len(new) > MAX_KEYS:
            raise RefusedInput(
                f"{where}: the metadata would hold {len(new)} keys, more than the "
                f"{MAX_KEYS} allowed"
            )
        set_keys = [k for k in wanted if old.get(k) != wanted[k]]
        result = MetaResult(path, where, new, bool(set_keys or dropped), set_keys, dropped, absent)
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
