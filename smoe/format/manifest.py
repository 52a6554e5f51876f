"""The integrity manifest beside a vault (``<vault>.manifest.json``; docs/MANIFEST.md).

Per expert: the CRC-32C of its blob, plus provenance (source tensors and their CRC-32C,
SNR, tool version and options). Writers build it with :class:`ManifestBuilder`; ``smoe
verify --deep`` checks a vault against it with :func:`check`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import crc32c as _crc32c
import numpy as np

from smoe.errors import FormatError, SmoeError
from smoe.format.findings import Finding
from smoe.interop.safetensors_io import json_excerpt
from smoe.plumbing import fileio
from smoe.plumbing.text import utf8_tree
from smoe_gen import layout
from smoe_gen.layout import Rule

__all__ = [
    "CHECKSUM",
    "SCHEMA",
    "ManifestBuilder",
    "ManifestError",
    "check",
    "checksum",
    "encode",
    "load",
    "path_for",
    "source_fault",
    "tool_info",
]

SCHEMA = "smoe-manifest/1"
"""The manifest's ``"schema"`` key."""
CHECKSUM = "crc32c"
"""The manifest's ``"checksum"`` key: the checksum of every blob."""
_SUFFIX = ".manifest.json"
_MAX_BYTES = 64 << 20
_BYTES_PER_ENTRY = 4096
_MAX_DEPTH = 16
_CHUNK = 8 << 20  # bytes of a blob checksummed at a time
_U32, _U64 = (1 << 32) - 1, (1 << 64) - 1


def checksum(data: bytes | bytearray | memoryview | np.ndarray, value: int = 0) -> int:
    """CRC-32C of ``data`` (continuing from ``value``).

    >>> hex(checksum(b"123456789")), checksum(b"6789", checksum(b"12345")) == 0xE3069283
    ('0xe3069283', True)
    """
    if isinstance(data, np.ndarray):
        data = memoryview(np.ascontiguousarray(data)).cast("B")
    return _crc32c.crc32c(data, value)


def path_for(vault: str | os.PathLike) -> Path:
    """Where the manifest of ``vault`` lives: its name with ``.manifest.json`` appended.

    >>> path_for("out/qwen3.smoe")
    PosixPath('out/qwen3.smoe.manifest.json')
    """
    vault = Path(vault)
    return vault.with_name(vault.name + _SUFFIX)


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(float(v), 4)


def tool_info(command: str, options: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``tool``: this package's name and version, the command and its options.

    >>> info = tool_info("sculpt", {"version": 2, "bits": 4})
    >>> info["name"], info["command"], info["options"]
    ('smoe', 'sculpt', {'bits': 4, 'version': 2})
    """
    from smoe import __version__

    return {
        "name": "smoe",
        "version": __version__,
        "command": command,
        "options": dict(sorted(options.items())),
    }


class ManifestBuilder:
    """Collects per-expert entries while a vault is written; :meth:`document` gives the
    manifest, :func:`encode` its bytes.

    >>> builder = ManifestBuilder(tool_info("sculpt", {"bits": 4}))
    >>> builder.add(0, 0, checksum(b"blob"), [{"name": "gate_proj", "snr_db": 18.123456}])
    >>> doc = builder.document("v.smoe", 32768, 4, [(0, 0, 16384, 4)])
    >>> doc["vault"], doc["experts"][0]["tensors"]
    ({'name': 'v.smoe', 'size': 32768, 'experts': 1, 'bits': 4}, \
[{'name': 'gate_proj', 'snr_db': 18.1235}])
    """

    def __init__(
        self,
        tool: dict[str, Any],
        source: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.tool = tool
        self.source = source
        # the free-form ``metadata`` (name, description, license, ...: smoe meta); None: the
        # manifest has no ``metadata`` key (the bytes of a manifest without any stay as they were)
        self.metadata = dict(sorted(metadata.items())) if metadata else None
        self.experts: dict[tuple[int, int], dict[str, Any]] = {}

    def add(
        self, layer: int, expert: int, crc: int, tensors: list[dict[str, Any]] | None = None
    ) -> None:
        """Record one blob's CRC-32C and its tensors' provenance (SNR rounded to 4 places,
        non-finite as None); offsets come from the table at :meth:`document`.

        >>> builder = ManifestBuilder(tool_info("sculpt", {}))
        >>> builder.add(1, 3, 0xE3069283)
        >>> builder.experts
        {(1, 3): {'crc32c': 3808858755}}
        """
        entry: dict[str, Any] = {"crc32c": int(crc)}
        if tensors is not None:
            entry["tensors"] = [{**t, "snr_db": _finite(t.get("snr_db"))} for t in tensors]
        self.experts[(int(layer), int(expert))] = entry

    def document(
        self, name: str, size: int, bits: int, slots: Iterable[tuple[int, int, int, int]]
    ) -> dict[str, Any]:
        """The manifest for a vault whose table is ``slots`` = (layer, expert, offset, raw).

        >>> builder = ManifestBuilder(tool_info("sculpt", {}))
        >>> builder.add(0, 0, 0xE3069283)
        >>> builder.document("v.smoe", 32768, 4, [(0, 0, 16384, 9)])["experts"]
        [{'layer': 0, 'expert': 0, 'offset': 16384, 'raw_size': 9, 'crc32c': 3808858755}]
        >>> builder.document("v.smoe", 32768, 4, [(0, 1, 16384, 9)])
        Traceback (most recent call last):
        smoe.errors.SmoeError: manifest: no checksum recorded for layer 0 expert 1
        """
        rows = []
        for layer, expert, offset, raw in slots:
            entry = self.experts.get((layer, expert))
            if entry is None:
                raise SmoeError(f"manifest: no checksum recorded for layer {layer} expert {expert}")
            rows.append(
                {"layer": layer, "expert": expert, "offset": offset, "raw_size": raw, **entry}
            )
        doc = {
            "schema": SCHEMA,
            "checksum": CHECKSUM,
            "vault": {"name": name, "size": size, "experts": len(rows), "bits": bits},
            "tool": self.tool,
            "source": self.source,
            "experts": rows,
        }
        if self.metadata:
            doc["metadata"] = self.metadata
        return doc


def encode(doc: dict[str, Any]) -> bytes:
    """RFC 8259 JSON: sorted keys, ASCII only, no NaN/Infinity, a final newline; every
    string valid Unicode (:func:`smoe.plumbing.text.utf8_tree`: a byte of a name that is not
    UTF-8 as ``\\xNN``, never a lone surrogate, which strict readers refuse).

    >>> print(encode({"vault": {"name": "é.smoe"}, "schema": SCHEMA}).decode("ascii"), end="")
    {
      "schema": "smoe-manifest/1",
      "vault": {
        "name": "\\u00e9.smoe"
      }
    }
    """
    return (
        json.dumps(utf8_tree(doc), indent=2, sort_keys=True, ensure_ascii=True, allow_nan=False)
        + "\n"
    ).encode("ascii")


# ---- reading and checking ---------------------------------------------------------------
class ManifestError(FormatError):
    """The manifest cannot be used: ``finding`` says why (code ``manifest.malformed``).

    >>> try:
    ...     load("fixtures/q4_v2.smoe", entries=8)  # the vault, not its manifest
    ... except ManifestError as e:
    ...     e.finding.code, e.finding.path
    ('manifest.malformed', 'manifest')
    """

    def __init__(self, finding: Finding) -> None:
        super().__init__(f"{finding.path}: {finding.message}")
        self.finding = finding


def _malformed(where: str, message: str) -> ManifestError:
    return ManifestError(Finding.of(Rule.MANIFEST_MALFORMED, 0, where, message))


def _depth(obj: Any, limit: int) -> int:
    stack = [(obj, 1)]
    deepest = 0
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > limit:
            return d
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
    return deepest


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def load(path: str | os.PathLike, entries: int) -> dict[str, Any]:
    """Read and parse a manifest, bounded by the vault's table size; ManifestError if bad.

    >>> doc = load("fixtures/q4_v2.smoe.manifest.json", entries=8)
    >>> doc["schema"], doc["vault"]["size"], len(doc["experts"]), sorted(doc["experts"][0])
    ('smoe-manifest/1', 147456, 8, ['crc32c', 'expert', 'layer', 'offset', 'raw_size'])
    """
    path = Path(path)
    limit = _MAX_BYTES + _BYTES_PER_ENTRY * entries
    raw = fileio.read_whole(
        path,
        limit,
        lambda size: _malformed(
            "manifest",
            f"{path} is {size} bytes, more than the {limit} bytes allowed for {entries} experts",
        ),
    )
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _malformed("manifest", f"{path} is not UTF-8 JSON ({e})") from None
    if _depth(doc, _MAX_DEPTH) > _MAX_DEPTH:
        raise _malformed("manifest", f"{path} nests deeper than {_MAX_DEPTH} levels")
    if not isinstance(doc, dict):
        raise _malformed("manifest", f"{path} is not a JSON object")
    for key, want in (("schema", SCHEMA), ("checksum", CHECKSUM)):
        if doc.get(key) != want:
            raise _malformed(f"manifest/{key}", f"is {doc.get(key)!r}, expected {want!r}")
    vault = doc.get("vault")
    if not isinstance(vault, dict):
        raise _malformed("manifest/vault", "missing or not an object")
    for key in ("size", "experts"):
        _uint(vault.get(key), f"manifest/vault/{key}", _U64)
    rows = doc.get("experts")
    if not isinstance(rows, list):
        raise _malformed("manifest/experts", "missing or not an array")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise _malformed(f"manifest/experts/{i}", "not an object")
        for key, top in (
            ("layer", _U32),
            ("expert", _U32),
            ("offset", _U64),
            ("raw_size", _U64),
            ("crc32c", _U32),
        ):
            _uint(row.get(key), f"manifest/experts/{i}/{key}", top)
    return doc


def _uint(v: Any, where: str, top: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
        raise _malformed(where, f"is {v!r}, expected an integer in [0, {top}]")
    return v


def check(
    doc: dict[str, Any],
    size: int,
    table: np.ndarray,
    read: Callable[[int, int], bytes | np.ndarray],
    blobs: bool = True,
) -> list[Finding]:
    """Findings of a vault (its ``size``, its table, a blob reader) against a loaded manifest.

    ``read(offset, n)`` returns the vault's bytes (it may raise SmoeError if the file shrank);
    the header and descriptors are read through it too, to bound each expert's recorded
    sources (``tensors[].index`` and ``rows``, :func:`source_fault`). ``blobs=False`` checks
    everything but the blobs' CRC-32C (reads no blob: whether the manifest belongs to the
    vault, as ``smoe meta`` asks before it edits one).

    >>> from smoe.vault.reader import Vault
    >>> doc = load("fixtures/q4_v2.smoe.manifest.json", entries=8)
    >>> with Vault.open("fixtures/q4_v2.smoe") as v:
    ...     check(doc, len(v.data), v.table, lambda offset, n: v.data[offset : offset + n])
    []
    >>> other = load("fixtures/q2_v2.smoe.manifest.json", entries=8)
    >>> with Vault.open("fixtures/q4_v2.smoe") as v:
    ...     found = check(other, len(v.data), v.table, lambda o, n: v.data[o : o + n])
    >>> [(f.code, f.path, f.expected, f.actual) for f in found]
    [('manifest.expert', 'manifest/experts/0/raw_size', 1728, 3264)]
    """
    out = _vault_findings(doc["vault"], size, len(table))
    if out:
        return out
    rows = doc["experts"]
    if len(rows) != len(table):
        return [
            Finding.of(
                Rule.MANIFEST_EXPERT,
                0,
                "manifest/experts",
                f"the manifest lists {len(rows)} experts, the table has {len(table)}",
                len(rows),
                len(table),
            )
        ]
    experts, heights = _shapes(table, read)
    for i, row in enumerate(rows):
        moved = _row_finding(i, row, table[i])
        if moved is not None:
            return [moved]
        sources = _sources_finding(i, row, table[i], heights[i], experts)
        out += [sources] if sources is not None else []
        out += _blob_findings(i, row, table[i], read) if blobs else []
    return out


def source_fault(
    entry: dict[str, Any],
    rows: int,
    expert_rows: int,
    experts: int,
    place: tuple[int, int, int] | None = None,
) -> tuple[str, str] | None:
    """The first of an ``experts[].tensors[]`` entry's ``index`` and ``rows`` that its vault
    cannot hold, as (key, why); None if both fit. A vault tensor of ``rows`` rows, in an
    expert of ``expert_rows`` rows (its three tensors'), is one slab (``index`` below the
    header's ``max_experts_per_layer`` = ``experts``) or ``rows`` rows of one within the
    expert's: what is read back is bounded by the vault before anything is sized by it.

    >>> source_fault({"index": 3, "rows": [32, 64]}, 32, 128, 4) is None
    True
    >>> source_fault({"index": 10**12}, 32, 128, 4)
    ('index', 'is 1000000000000, expected an expert index below max_experts_per_layer 4')
    >>> source_fault({"rows": [96, 160]}, 64, 128, 4)
    ('rows', "is [96, 160], expected [start, start + 64] within the expert's 128 rows")

    With ``place`` = (layer, expert, tensor), once both fit, the ``source`` name must also
    be that of the entry's own tensor (:func:`source_name_fault`).
    """
    index, span = entry.get("index"), entry.get("rows")
    if index is not None and not _uint_below(index, experts):
        why = f"expected an expert index below max_experts_per_layer {experts}"
        return "index", f"is {json_excerpt(index)}, {why}"
    if span is None or (
        isinstance(span, list)
        and len(span) == 2
        and _uint_below(span[0], expert_rows)
        and _uint_below(span[1], expert_rows + 1)
        and span[1] - span[0] == rows
    ):
        if place is None:
            return None
        return _halves_fault(span, rows, place[2]) or source_name_fault(
            entry.get("source"), index, *place
        )
    why = f"expected [start, start + {rows}] within the expert's {expert_rows} rows"
    return "rows", f"is {json_excerpt(span)}, {why}"


_LAYER_OF = re.compile(r"(?:^|\.)(?:layers|blocks)\.(\d+)\.")
_EXPERT_OF = re.compile(r"\.experts\.(\d+)\.")
_ROLE_OF = re.compile(r"(?:^|\.)(gate_proj|w1|up_proj|w3|down_proj|w2)\.weight$")
_ROLES = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1, "down_proj": 2, "w2": 2}
_FUSED_DOWN = re.compile(r"(?:^|\.)(?:down_proj|output_linear\.weight|fc2\.weight|w2_weight)$")


def source_name_fault(
    source: object, index: object, layer: int, expert: int, tensor: int
) -> tuple[str, str] | None:
    """Whether a manifest entry's ``source`` names another tensor than the entry's own
    (``tensor``: 0 gate, 1 up, 2 down of ``expert`` in ``layer``): a layer number, an expert
    number, a fused slab ``index`` or a role that is not the entry's. A permuted manifest
    would make ``export --hf`` write each expert under another's name; names of layouts not
    listed here are not judged.

    >>> source_name_fault("model.layers.1.mlp.experts.3.up_proj.weight", None, 1, 3, 1) is None
    True
    >>> source_name_fault("layers.1.experts.2.w3.weight", None, 1, 3, 1)
    ('source', "names expert 2 ('layers.1.experts.2.w3.weight'), the entry is expert 3")
    >>> source_name_fault("model.layers.0.mlp.experts.gate_up_proj", 1, 0, 1, 2)[1]
    "names a gate/up tensor ('model.layers.0.mlp.experts.gate_up_proj') for down_proj"
    """
    if not isinstance(source, str):
        return None
    m = _LAYER_OF.search(source)
    if m and int(m.group(1)) != layer:
        return "source", f"names layer {m.group(1)} ({source!r}), the entry is layer {layer}"
    m = _EXPERT_OF.search(source)
    if m and int(m.group(1)) != expert:
        return "source", f"names expert {m.group(1)} ({source!r}), the entry is expert {expert}"
    if isinstance(index, int) and not isinstance(index, bool) and index != expert:
        return "index", f"is {index}, the entry is expert {expert} (its slab of {source!r})"
    m = _ROLE_OF.search(source)
    name = layout.TENSOR_NAMES[tensor]
    if m and _ROLES[m.group(1)] != tensor:
        return "source", f"names {m.group(1)} ({source!r}) for {name}"
    if index is not None and not m and (tensor == 2) != bool(_FUSED_DOWN.search(source)):
        what = "a gate/up tensor" if tensor == 2 else "a down tensor"
        return "source", f"names {what} ({source!r}) for {name}"
    return None


def _halves_fault(span: object, rows: int, tensor: int) -> tuple[str, str] | None:
    """A fused gate/up source holds the gate's rows first, then the up's: a gate entry
    must start at 0 and an up entry at the gate's height (swapped halves would export each
    matrix in the other's place)."""
    if not isinstance(span, list) or tensor not in (0, 1):
        return None
    start = 0 if tensor == 0 else rows
    if span[0] == start:
        return None
    role = "gate rows come first" if tensor == 0 else "up rows follow the gate's"
    return "rows", f"is {json_excerpt(span)}, expected [{start}, {start + rows}] ({role})"


def _uint_below(v: object, top: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < top


def _shapes(
    table: np.ndarray, read: Callable[[int, int], bytes | np.ndarray]
) -> tuple[int, list[list[int]]]:
    """The header's ``max_experts_per_layer`` and each table entry's tensor rows [n, 3],
    read through ``read`` (the table lies inside the file, so its descriptors do too)."""
    n = len(table)
    header = np.frombuffer(bytes(read(0, layout.HEADER_SIZE)), layout.HEADER_DTYPE)[0]
    size = n * layout.TENSORS_PER_EXPERT * layout.TENSOR_DESCRIPTOR_DTYPE.itemsize
    raw = bytes(read(layout.descriptors_offset(n), size)) if n else b""
    descs = np.frombuffer(raw, layout.TENSOR_DESCRIPTOR_DTYPE)
    heights = descs["rows"].astype(np.int64).reshape(n, layout.TENSORS_PER_EXPERT).tolist()
    return int(header["max_experts_per_layer"]), heights


def _sources_finding(
    i: int, row: dict[str, Any], entry: np.void, heights: list[int], experts: int
) -> Finding | None:
    """Manifest row ``i``'s ``tensors`` (absent: recorded by an older tool) against the
    shapes of table entry ``i``: three objects, each ``index`` and ``rows`` in bounds."""
    tensors = row.get("tensors")
    if tensors is None:
        return None
    who = f"layer {int(entry['layer_id'])} expert {int(entry['expert_id'])}"
    at, where = int(entry["byte_offset"]), f"manifest/experts/{i}/tensors"
    if (
        not isinstance(tensors, list)
        or len(tensors) != layout.TENSORS_PER_EXPERT
        or not all(isinstance(t, dict) for t in tensors)
    ):
        why = f"{who}: tensors is {json_excerpt(tensors)}, expected 3 objects (gate, up, down)"
        return Finding.of(Rule.MANIFEST_EXPERT, at, where, why)
    for t, source in enumerate(tensors):
        place = (int(entry["layer_id"]), int(entry["expert_id"]), t)
        fault = source_fault(source, heights[t], sum(heights), experts, place)
        if fault is not None:
            key, why = fault
            name = layout.TENSOR_NAMES[t]
            message = f"{who}: {name}'s {key} {why}"
            return Finding.of(Rule.MANIFEST_EXPERT, at, f"{where}/{t}/{key}", message)
    return None


def _vault_findings(vault: dict[str, Any], size: int, experts: int) -> list[Finding]:
    """The manifest's ``vault`` object against this vault: another file's manifest?"""
    return [
        Finding.of(
            Rule.MANIFEST_VAULT,
            0,
            f"manifest/vault/{key}",
            f"the manifest describes a vault with {key} {vault[key]}, "
            f"this one has {actual} (it belongs to another file)",
            vault[key],
            actual,
        )
        for key, actual in (("size", size), ("experts", experts))
        if vault[key] != actual
    ]


def _row_finding(i: int, row: dict[str, Any], entry: np.void) -> Finding | None:
    """The first field of manifest row ``i`` that disagrees with table entry ``i``."""
    layer, expert = int(entry["layer_id"]), int(entry["expert_id"])
    off, raw = int(entry["byte_offset"]), int(entry["raw_size"])
    for key, actual in (("layer", layer), ("expert", expert), ("offset", off), ("raw_size", raw)):
        if row[key] != actual:
            return Finding.of(
                Rule.MANIFEST_EXPERT,
                off,
                f"manifest/experts/{i}/{key}",
                f"table entry {i} (layer {layer} expert {expert}) has {key} "
                f"{actual}, the manifest says {row[key]}",
                row[key],
                actual,
            )
    return None


def _blob_findings(
    i: int, row: dict[str, Any], entry: np.void, read: Callable[[int, int], bytes | np.ndarray]
) -> list[Finding]:
    """The blob of table entry ``i`` against its recorded CRC-32C (read in chunks)."""
    off, raw = int(entry["byte_offset"]), int(entry["raw_size"])
    crc = 0
    for at in range(off, off + raw, _CHUNK):
        crc = checksum(read(at, min(_CHUNK, off + raw - at)), crc)
    if crc == row["crc32c"]:
        return []
    return [
        Finding.of(
            Rule.MANIFEST_CHECKSUM,
            off,
            f"manifest/experts/{i}/crc32c",
            f"layer {int(entry['layer_id'])} expert {int(entry['expert_id'])}: the blob's "
            "CRC-32C differs from the manifest (the blob was changed or damaged)",
            row["crc32c"],
            crc,
        )
    ]
