"""`smoe-dump`: everything in a vault, as a rich tree, as JSON, or one value of it.

Works on broken vaults too: it shows what can be located and ends with the verifier's
findings (with ``deep``, also the manifest's). Field names are exactly those of the spec;
each tensor descriptor also carries ``name`` and ``type_name`` (docs/JSON.md).

With ``--experts`` (or ``--layer L``) every expert and every tensor is one line that names
it in full, so that ``grep`` keeps the context (:data:`EXPERT_LINE`, :data:`TENSOR_LINE`)::

    layer 1 expert 3  blob at 0x20000, raw 3,264 B, padded 16,384 B, 96 groups
    layer 1 expert 3 gate_proj  Q4  [32, 64]  packed +0    (0x20000) 1,024 B  \
scales +1024 (0x20400) 64 B
    layer 1 expert 3 up_proj    Q4  [32, 64]  packed +1088 (0x20440) 1,024 B  \
scales +2112 (0x20840) 64 B
    layer 1 expert 3 down_proj  Q4  [64, 32]  packed +2176 (0x20880) 1,024 B  \
scales +3200 (0x20c80) 64 B

``grep down_proj`` gives every down projection with its layer and expert, ``grep -w 'layer 1
expert 3'`` (or ``'layer 1 expert 3 '``, with the space) that expert's four lines. Columns are
padded with spaces to the widest value of the vault, whatever is shown, so a line reads the
same with ``--experts`` and with ``--layer L``.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from smoe.cli.console import shown, to_json
from smoe.errors import UsageError
from smoe.format import findings
from smoe.format.findings import Finding
from smoe.format.provenance import notable, read_provenance
from smoe.format.provenance import rows as provenance_rows
from smoe.format.records import plain, plain_rows
from smoe.format.verify import Report, verify_file
from smoe.format.view import Data, FileView, arch_view, header_view, table_views
from smoe_gen import layout
from smoe_gen.layout import TENSOR_NAMES

__all__ = [
    "EXPERT_LINE",
    "TENSOR_LINE",
    "collect",
    "collect_path",
    "document",
    "field",
    "field_text",
    "render",
    "tensor_name",
]

EXPERT_LINE = "{expert}  blob at {offset}, raw {raw} B, padded {padded} B, {groups} groups"
"""An expert's line of ``--experts``: ``expert`` is ``layer L expert E``, padded with spaces
to the vault's widest (``offset`` in hex, sizes with thousands separators)."""

TENSOR_LINE = (
    "{tensor}  {type_name}  {shape}  packed {packed_offset} {packed_at} {packed_size}  "
    "scales {scales_offset} {scales_at} {scales_size}"
)
"""A tensor's line of ``--experts``: ``tensor`` is ``layer L expert E NAME`` (NAME: gate_proj,
up_proj, down_proj; ``tensor_type=N`` for a value the spec does not define), ``type_name``
``Q4`` or ``Q2``, ``shape`` ``[ROWS, COLS]``, ``*_offset`` ``+N`` (from the blob's start),
``*_at`` the absolute offset ``(0xHEX)``, ``*_size`` ``N B`` with thousands separators. Each
field is padded with spaces to the vault's widest value of it (sizes on the left)."""

_RIGHT = frozenset({"packed_size", "scales_size"})  # right-aligned fields of TENSOR_LINE


def collect_path(
    path: str | os.PathLike, deep: bool = False, manifest: str | os.PathLike | None = "auto"
) -> tuple[dict, Report]:
    """Open ``path`` (``fileio.NotRegular`` if it is not a regular file) and :func:`collect`.

    >>> dump, report = collect_path("fixtures/q4_v2.smoe")
    >>> dump["file"], report.ok
    ({'path': 'fixtures/q4_v2.smoe', 'size': 147456, 'vault_type': 'full'}, True)
    >>> dump["arch"]["model_type"], dump["experts"][7]["tensors"][2]["rows"]
    ('olmoe', 64)
    >>> {k: dump["experts"][7]["tensors"][2][k] for k in ("tensor_type", "name", "type_name")}
    {'tensor_type': 2, 'name': 'down_proj', 'type_name': 'Q4'}
    """
    with FileView.open(path) as view:
        return collect(Path(path), view, deep=deep, manifest=manifest)


def collect(
    path: Path, data: Data, deep: bool = False, manifest: str | os.PathLike | None = "auto"
) -> tuple[dict, Report]:
    """The dump as plain data: keys file, header, arch, experts, findings, provenance (each
    as docs/JSON.md says).

    ``manifest`` as for ``smoe.format.verify.verify_path`` (checked only with ``deep``; its
    provenance and metadata are read whenever it can be).

    >>> import numpy as np
    >>> data = np.fromfile("fixtures/q4_v2.smoe", np.uint8)
    >>> data[8] = 3  # header.version
    >>> dump, report = collect(Path("v.smoe"), data)
    >>> dump["header"]["version"], dump["experts"], [f["code"] for f in dump["findings"]]
    (3, [], ['header.version'])
    """
    report = verify_file(data, path, deep=deep, manifest=manifest)
    geo = report.geometry
    out: dict = {
        "file": {"path": str(path), "size": len(data)},
        "header": None,
        "arch": None,
        "experts": [],
        "findings": [f.to_dict() for f in report.findings],
    }
    if len(data) >= layout.HEADER_SIZE and geo is not None:
        out["header"] = plain(header_view(data))
        total = int(out["header"]["total_experts"])
        width = int(out["header"]["num_moe_layers"]) * int(out["header"]["max_experts_per_layer"])
        out["file"]["vault_type"] = "full" if total >= width else "partial"
        if geo.version >= layout.VERSION_WITH_ARCH and geo.arch_readable:
            arch = plain(arch_view(data, geo))
            arch["flag_names"] = [n for n, bit in layout.FLAG_NAMES.items() if arch["flags"] & bit]
            out["arch"] = arch
        if geo.table_readable:
            table, descs = table_views(data, geo)
            entries = plain_rows(table)
            type_name = f"Q{out['header']['bits']}"
            tensors = [_named(t, type_name) for t in plain_rows(descs.reshape(-1))]
            k = layout.TENSORS_PER_EXPERT
            for i, e in enumerate(entries):
                e["tensors"] = tensors[i * k : (i + 1) * k]
            out["experts"] = entries
    elif len(data) >= layout.HEADER_SIZE:
        out["header"] = plain(header_view(data))
    listed = int(out["header"]["total_experts"]) if out["header"] is not None else 0
    out["provenance"] = read_provenance(path, listed, manifest)  # bounded as verify bounds it
    return out, report


def tensor_name(tensor_type: int) -> str | None:
    """The name of a ``tensor_type`` value (gate_proj, up_proj, down_proj); None for a value
    the spec does not define (a broken descriptor, which verify reports).

    >>> tensor_name(2), tensor_name(7)
    ('down_proj', None)
    """
    return TENSOR_NAMES[tensor_type] if 0 <= tensor_type < len(TENSOR_NAMES) else None


def _named(desc: dict, type_name: str) -> dict:
    """A descriptor's fields with ``name`` and ``type_name`` right after ``tensor_type``."""
    t = desc["tensor_type"]
    head = {"tensor_type": t, "name": tensor_name(t), "type_name": type_name}
    return {**head, **{k: v for k, v in desc.items() if k != "tensor_type"}}


# ---- the JSON document, and one value of it (--field) ---------------------------------------
_DOCUMENT_KEYS = ("file", "header", "arch", "experts", "findings", "provenance")
_STEP = re.compile(r"\[(\d+)\]|\.?([^.\[\]]+)")


def document(dump: dict) -> dict:
    """The ``--json`` document of a :func:`collect` dump (docs/JSON.md, "Dump document").

    >>> doc = document(collect_path("fixtures/q4_v2.smoe")[0])
    >>> list(doc)
    ['schema', 'file', 'header', 'arch', 'experts', 'findings', 'provenance']
    """
    return {"schema": findings.SCHEMA, **{k: dump[k] for k in _DOCUMENT_KEYS}}


def field(doc: dict, name: str) -> object:
    """The value at ``name`` in ``doc``, a dotted path of its keys; a list's entries by index,
    as ``experts.3`` or ``experts[3]`` (the form of a finding's ``field``).

    An unknown name is a :class:`~smoe.errors.UsageError` naming the nearest valid names at
    the step that failed.

    >>> doc = document(collect_path("fixtures/q4_v2.smoe")[0])
    >>> field(doc, "header.bits"), field(doc, "experts[7].tensors.2.name")
    (4, 'down_proj')
    >>> field(doc, "header.num_layers")
    Traceback (most recent call last):
    ...
    smoe.errors.UsageError: --field header.num_layers: no such field (nearest: \
header.num_moe_layers, header.max_experts_per_layer, header.version)
    """
    steps = _steps(name)
    value: object = doc
    path = ""
    for step in steps:
        if isinstance(value, dict) and isinstance(step, str) and step in value:
            value, path = value[step], f"{path}.{step}" if path else step
        elif isinstance(value, list) and isinstance(step, int) and step < len(value):
            value, path = value[step], f"{path}[{step}]"
        else:
            raise UsageError(f"--field {name}: no such field ({_nearest(value, path, step)})")
    return value


def _steps(name: str) -> list[str | int]:
    """``experts[3].tensors.2.rows`` -> ['experts', 3, 'tensors', 2, 'rows'] (a step of
    digits alone is an index); a name that is no path at all is a UsageError."""
    steps: list[str | int] = []
    pos = 0
    for m in _STEP.finditer(name):
        if m.start() != pos or (pos == 0 and name.startswith(".")):
            break
        index, key = m.groups()
        steps.append(int(index) if index is not None else int(key) if key.isdigit() else key)
        pos = m.end()
    if not name or pos != len(name):
        raise UsageError(
            f"--field {name}: not a field name (a dotted path such as header.num_moe_layers, "
            "arch.model_type or experts[0].tensors[2].rows)"
        )
    return steps


def _nearest(value: object, path: str, step: str | int) -> str:
    """What ``value`` at ``path`` offers instead of ``step``, for the error message."""
    if value is None:
        return f"{path} is null"
    if isinstance(value, list):
        last = f"{path}[{len(value) - 1}]" if value else None
        count = f"{len(value)} entr{'y' if len(value) == 1 else 'ies'}"
        return f"{path} is a list of {count}" + (f", {path}[0]..{last}" if last else "")
    if not isinstance(value, dict):
        return f"{path} is a value, it has no fields"
    names = [str(k) for k in value]
    close = difflib.get_close_matches(str(step), names, n=3, cutoff=0.0)
    return "nearest: " + ", ".join(f"{path}.{k}" if path else k for k in close)


def field_text(value: object) -> str:
    """How ``--field`` prints a value: a string bare (as the terminal shows text), a number,
    boolean or null as in JSON, an object or a list as one line of compact JSON.

    >>> print(field_text("olmoe"), field_text(1e-06), field_text(None), field_text([32, 64]))
    olmoe 1e-06 null [32,64]
    """
    if isinstance(value, str):
        return shown(value)
    return to_json(value, indent=None, compact=True)


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def _safe(value: object) -> str:
    """``value`` as tree text: rich markup escaped, control characters and undecodable bytes
    (lone surrogates) as ``\\xNN``, so that no byte of the file reaches the terminal raw."""
    text = _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()) & 0xFF:02x}", str(value))
    return escape(text)


def _severity_style(f: Finding | dict) -> str:
    sev = f["severity"] if isinstance(f, dict) else f.severity
    return {"error": "bold red", "warning": "yellow", "info": "cyan"}[sev]


def render(dump: dict, console: Console, experts: bool = False, layer: int | None = None) -> None:
    """The rich tree: summary, header, arch, table by layer, findings.

    Lines are as wide as they need: ``console`` decides whether they wrap (a terminal) or not
    (the CLI's console of a pipe), so no label is cut here.

    >>> from rich.console import Console
    >>> dump, report = collect_path("fixtures/q4_v2.smoe")
    >>> render(dump, Console(width=200))
    fixtures/q4_v2.smoe  147,456 bytes  v2  Q4  group 64  data_offset 0x4000  full vault, 8 experts
    ├── header (64 bytes at 0)
    │   └── offset  field                  value
    │            0  magic                  534d4f45deea0001
    │            8  version                2 (0x2)
    ...
    ├── expert table (8 entries, 2 layers)
    │   ├── layer 0: 4 experts (ids 0-3), gate_proj 32x64 up_proj 32x64 down_proj 64x32, ...
    │   ├── layer 1: 4 experts (ids 0-3), gate_proj 32x64 up_proj 32x64 down_proj 64x32, ...
    │   └── (--experts to list every expert, --layer L for one layer)
    └── findings (1)
        └── warning: arch.rms_norm_eps at 0x638 (arch.rms_norm_eps): differs from the ...
    """
    f = dump["file"]
    h = dump["header"]
    label = f"[bold]{_safe(f['path'])}[/]  {f['size']:,} bytes"
    if h is not None:
        label += (
            f"  v{h['version']}  Q{h['bits']}  group {h['group_size']}  "
            f"data_offset {h['data_offset']:#x}  {f.get('vault_type', '?')} vault, "
            f"{h['total_experts']} experts"
        )
    root = Tree(label)
    _render_provenance(root, dump.get("provenance"))
    if h is not None:
        ht = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for col in ("offset", "field", "value"):
            ht.add_column(col, justify="right" if col == "offset" else "left")
        for name, off in layout.HEADER_OFFSETS.items():
            v = h[name]
            shown = v if isinstance(v, str) else f"{v} ({v:#x})"
            ht.add_row(str(off), name, _safe(shown))
        root.add(f"[bold]header[/] ({layout.HEADER_SIZE} bytes at 0)").add(ht)
    a = dump["arch"]
    if a is not None:
        at = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for col in ("offset", "field", "value"):
            at.add_column(col, justify="right" if col == "offset" else "left")
        base = h["reserved_ext"]
        for name, off in layout.ARCH_BLOCK_OFFSETS.items():
            off += base
            v = a[name]
            if name == "flags":
                v = f"{v:#x} = {' | '.join(a['flag_names']) or 'none'}"
            elif name == "reserved":
                v = "all zero" if set(v) <= {"0"} else v
            at.add_row(str(off), name, _safe(v))
        root.add(f"[bold]arch block[/] ({layout.ARCH_BLOCK_SIZE} bytes at {base})").add(at)
    elif h is not None:
        root.add("[bold]arch block[/]: none (version 1)")
    if dump["experts"]:
        _render_table(root, dump, experts, layer)
    fnode = root.add(f"[bold]findings[/] ({len(dump['findings'])})")
    for fi in dump["findings"]:
        line = (
            f"{fi['severity']}: {fi['code']} at {fi['offset']:#x} ({fi['field']}): {fi['message']}"
        )
        if fi["expected"] is not None or fi["actual"] is not None:
            line += f" [expected {fi['expected_text']}, got {fi['actual_text']}]"
        fnode.add(f"[{_severity_style(fi)}]{_safe(line)}[/]", highlight=False)
    console.print(root)


def _render_provenance(root: Tree, prov: dict | None) -> None:
    """The manifest's provenance as ``field  value`` lines (fields named by their manifest
    keys: ``source.model_id``, ``metadata.name``, ...), when it says where the weights came
    from or holds metadata (:func:`smoe.format.provenance.notable`)."""
    if prov is None or not notable(prov):
        return
    pt = Table(show_header=False, box=None, pad_edge=False)
    pt.add_column("field")
    pt.add_column("value")
    for key, value in provenance_rows(prov):
        pt.add_row(_safe(key), _safe(shown(value)))
    name = _safe(os.path.basename(prov["manifest"]))
    root.add(f"[bold]provenance[/] (from {name})").add(pt)


def _render_table(root: Tree, dump: dict, experts: bool, layer: int | None) -> None:
    by_layer: dict[int, list[dict]] = {}
    for e in dump["experts"]:
        by_layer.setdefault(e["layer_id"], []).append(e)
    node = root.add(
        f"[bold]expert table[/] ({len(dump['experts'])} entries, {len(by_layer)} layers)"
    )
    lines = _expert_lines(dump["experts"]) if experts or layer is not None else {}
    for lay, entries in by_layer.items():
        if layer is not None and lay != layer:
            continue
        ids = [e["expert_id"] for e in entries]
        shapes = entries[0]["tensors"]
        dims = " ".join(f"{TENSOR_NAMES[t]} {d['rows']}x{d['cols']}" for t, d in enumerate(shapes))
        last = entries[-1]
        span = f"{entries[0]['byte_offset']:#x}..{last['byte_offset'] + last['padded_size']:#x}"
        ln = node.add(
            f"layer {lay}: {len(entries)} experts (ids {_ranges(ids)}), {dims}, blobs {span}"
        )
        if not (experts or layer is not None):
            continue
        for e in entries:
            expert_line, tensor_lines = lines[id(e)]
            en = ln.add(_safe(expert_line))
            for text in tensor_lines:
                en.add(_safe(text))
    if not experts and layer is None:
        node.add("[dim](--experts to list every expert, --layer L for one layer)[/]")


def _expert_lines(entries: list[dict]) -> dict[int, tuple[str, list[str]]]:
    """Each entry's :data:`EXPERT_LINE` and :data:`TENSOR_LINE` s (by ``id()`` of the entry),
    padded to the widest values of all ``entries``, so that a line does not depend on which
    layers are shown.

    >>> dump, _ = collect_path("fixtures/q4_v2.smoe")
    >>> expert, tensors = _expert_lines(dump["experts"])[id(dump["experts"][7])]
    >>> print(expert, *tensors, sep="\\n")
    layer 1 expert 3  blob at 0x20000, raw 3,264 B, padded 16,384 B, 96 groups
    layer 1 expert 3 gate_proj  Q4  [32, 64]  packed +0    (0x20000) 1,024 B  \
scales +1024 (0x20400) 64 B
    layer 1 expert 3 up_proj    Q4  [32, 64]  packed +1088 (0x20440) 1,024 B  \
scales +2112 (0x20840) 64 B
    layer 1 expert 3 down_proj  Q4  [64, 32]  packed +2176 (0x20880) 1,024 B  \
scales +3200 (0x20c80) 64 B
    """
    heads = {id(e): f"layer {e['layer_id']} expert {e['expert_id']}" for e in entries}
    cells: dict[int, list[dict[str, str]]] = {}
    for e in entries:
        base = e["byte_offset"]
        cells[id(e)] = [
            {
                "tensor": f"{heads[id(e)]} {d['name'] or 'tensor_type=' + str(d['tensor_type'])}",
                "type_name": d["type_name"],
                "shape": f"[{d['rows']}, {d['cols']}]",
                "packed_offset": f"+{d['packed_offset']}",
                "packed_at": f"({base + d['packed_offset']:#x})",
                "packed_size": f"{d['packed_size']:,} B",
                "scales_offset": f"+{d['scales_offset']}",
                "scales_at": f"({base + d['scales_offset']:#x})",
                "scales_size": f"{d['scales_size']:,} B",
            }
            for d in e["tensors"]
        ]
    every = [c for row in cells.values() for c in row]
    width = {k: max(len(c[k]) for c in every) for k in every[0]} if every else {}
    head_width = max(map(len, heads.values()), default=0)
    out: dict[int, tuple[str, list[str]]] = {}
    for e in entries:
        expert = EXPERT_LINE.format(
            expert=heads[id(e)].ljust(head_width),
            offset=f"{e['byte_offset']:#x}",
            raw=f"{e['raw_size']:,}",
            padded=f"{e['padded_size']:,}",
            groups=e["num_groups"],
        )
        tensors = [
            TENSOR_LINE.format(**{k: _pad(k, v, width[k]) for k, v in c.items()})
            for c in cells[id(e)]
        ]
        out[id(e)] = (expert, tensors)
    return out


def _pad(key: str, value: str, width: int) -> str:
    return value.rjust(width) if key in _RIGHT else value.ljust(width)


def _ranges(ids: list[int]) -> str:
    """Runs of consecutive ids: ``0-3,5,7-8``."""
    runs: list[list[int]] = []  # [first, last]
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
