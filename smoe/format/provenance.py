"""What a vault's manifest says of where it came from, for ``smoe dump`` and ``smoe report``:
the tool that wrote it, the source (model id, revision, files, model card) and the free-form
``metadata`` (docs/MANIFEST.md).

Nothing here judges the manifest (``smoe verify --deep`` does): a manifest that cannot be
read gives no provenance, and what a readable one holds is shown as it is, as text.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from smoe.errors import SmoeError
from smoe.format import manifest as manifests

__all__ = ["notable", "provenance_of", "read_provenance", "rows"]


def read_provenance(
    vault: str | os.PathLike, entries: int, manifest: str | os.PathLike | None = "auto"
) -> dict[str, Any] | None:
    """The provenance (:func:`provenance_of`) in the manifest of ``vault``: ``manifest``
    "auto" (the sidecar ``<vault>.manifest.json`` when it exists), a path, or None (none).
    None also when the manifest cannot be read (bounded by the vault's ``entries``, as every
    reader of it is).

    >>> prov = read_provenance("fixtures/q4_v2.smoe", 8)
    >>> prov["manifest"], prov["tool"]["command"], prov["metadata"]
    ('fixtures/q4_v2.smoe.manifest.json', 'fixtures/generate.py', {})
    >>> read_provenance("fixtures/q4_v2.smoe", 8, manifest=None) is None
    True
    """
    if manifest is None:
        return None
    if isinstance(manifest, str) and manifest == "auto":
        where = manifests.path_for(vault)
        if not os.path.lexists(where):
            return None
    else:
        where = Path(manifest)
    try:
        doc = manifests.load(where, entries)
    except SmoeError:  # its finding is verify --deep's to report
        return None
    return provenance_of(doc, where)


def provenance_of(doc: dict[str, Any], where: str | os.PathLike) -> dict[str, Any]:
    """The provenance keys of a loaded manifest ``doc`` read from ``where``: ``manifest`` (its
    path), ``tool``, ``source`` (each as recorded, or null) and ``metadata`` (an object; empty
    when there is none).

    >>> provenance_of({"tool": {"name": "smoe"}, "metadata": {"name": "x"}}, "v.smoe.manifest.json")
    {'manifest': 'v.smoe.manifest.json', 'tool': {'name': 'smoe'}, 'source': None, \
'metadata': {'name': 'x'}}
    """
    metadata = doc.get("metadata")
    return {
        "manifest": os.fsdecode(where),
        "tool": doc.get("tool"),
        "source": doc.get("source"),
        "metadata": {} if metadata is None else metadata,
    }


def notable(prov: dict[str, Any] | None) -> bool:
    """Whether ``prov`` says where the weights came from or holds metadata: a model id,
    checkpoint files, a model card or any metadata (what ``smoe dump`` and ``smoe report``
    show a provenance part for; the fixtures' manifests say none of it).

    >>> notable(read_provenance("fixtures/q4_v2.smoe", 8)), notable({"metadata": {"name": "x"}})
    (False, True)
    """
    if not prov:
        return False
    source = prov.get("source")
    source = source if isinstance(source, dict) else {}
    return bool(
        source.get("model_id") or source.get("files") or source.get("card") or prov.get("metadata")
    )


def rows(prov: dict[str, Any]) -> list[tuple[str, str]]:
    """``prov`` as (field, text) rows, fields named by their manifest keys: the source's
    ``model_id``, ``revision``, ``model_type``, its files (count and bytes) and model card
    entries, the tool, then each ``metadata`` key; keys in order, so that a manifest spelled
    another way gives the same rows. A value that is not text is shown as JSON; nothing is
    escaped here (the caller escapes for its medium).

    >>> prov = {"tool": {"name": "smoe", "version": "1.0", "command": "sculpt",
    ...                  "options": {"bits": 4, "max_layers": None}},
    ...         "source": {"model_id": "org/name", "files": [{"name": "m.safetensors", "size": 9}],
    ...                    "card": {"license": "apache-2.0"}},
    ...         "metadata": {"name": "My model"}}
    >>> for row in rows(prov):
    ...     print(*row, sep=": ")
    source.model_id: org/name
    source.files: 1 file, 9 bytes
    source.card.license: apache-2.0
    tool: smoe 1.0 sculpt (bits 4)
    metadata.name: My model
    """
    out: list[tuple[str, str]] = []
    source = prov.get("source")
    source = source if isinstance(source, dict) else {}
    for key in ("model_id", "revision", "model_type"):
        if source.get(key) is not None:
            out.append((f"source.{key}", _text(source[key])))
    files = source.get("files")
    if isinstance(files, list) and files:
        sizes = [f.get("size") for f in files if isinstance(f, dict)]
        total = sum(s for s in sizes if isinstance(s, int) and not isinstance(s, bool))
        plural = "" if len(files) == 1 else "s"
        out.append(("source.files", f"{len(files)} file{plural}, {total:,} bytes"))
    card = source.get("card")
    if isinstance(card, dict):
        for key, value in sorted(card.items()):
            text = ", ".join(map(_text, value)) if isinstance(value, list) else _text(value)
            out.append((f"source.card.{key}", text))
    tool = prov.get("tool")
    if isinstance(tool, dict):
        words = [_text(tool[k]) for k in ("name", "version", "command") if tool.get(k) is not None]
        options = tool.get("options")
        if isinstance(options, dict):
            shaping = [f"{k} {_text(v)}" for k, v in sorted(options.items()) if v is not None]
            words += [f"({', '.join(shaping)})"] if shaping else []
        out.append(("tool", " ".join(words)))
    metadata = prov.get("metadata")
    if isinstance(metadata, dict):
        out += [(f"metadata.{k}", _text(v)) for k, v in sorted(metadata.items())]
    elif metadata is not None:
        out.append(("metadata", _text(metadata)))
    return out


def _text(value: object) -> str:
    """Text as it is; any other value as JSON (keys sorted), cut to 60 characters."""
    if isinstance(value, str):
        return value
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."
