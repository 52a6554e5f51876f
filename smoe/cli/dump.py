"""`smoe-dump`: everything in a vault, as a rich tree or as JSON.

Works on broken vaults too: it shows what can be located and ends with the verifier's
findings (with ``deep``, also the manifest's). Field names are exactly those of the spec.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from smoe.format.findings import Finding
from smoe.format.records import plain, plain_rows
from smoe.format.verify import Report, verify_file
from smoe.format.view import Data, FileView, arch_view, header_view, table_views
from smoe_gen import layout
from smoe_gen.layout import TENSOR_NAMES

__all__ = ["collect", "collect_path", "render"]


def collect_path(
    path: str | os.PathLike, deep: bool = False, manifest: str | os.PathLike | None = "auto"
) -> tuple[dict, Report]:
    """Open ``path`` (``fileio.NotRegular`` if it is not a regular file) and :func:`collect`.

    >>> dump, report = collect_path("fixtures/q4_v2.smoe")
    >>> dump["file"], report.ok
    ({'path': 'fixtures/q4_v2.smoe', 'size': 147456, 'vault_type': 'full'}, True)
    >>> dump["arch"]["model_type"], dump["experts"][7]["tensors"][2]["rows"]
    ('olmoe', 64)
    """
    with FileView.open(path) as view:
        return collect(Path(path), view, deep=deep, manifest=manifest)


def collect(
    path: Path, data: Data, deep: bool = False, manifest: str | os.PathLike | None = "auto"
) -> tuple[dict, Report]:
    """The dump as plain data: keys file, header, arch, experts, findings (each as
    docs/JSON.md says).

    ``manifest`` as for ``smoe.format.verify.verify_path`` (checked only with ``deep``).

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
            tensors = plain_rows(descs.reshape(-1))
            k = layout.TENSORS_PER_EXPERT
            for i, e in enumerate(entries):
                e["tensors"] = tensors[i * k : (i + 1) * k]
            out["experts"] = entries
    elif len(data) >= layout.HEADER_SIZE:
        out["header"] = plain(header_view(data))
    return out, report


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


def _render_table(root: Tree, dump: dict, experts: bool, layer: int | None) -> None:
    by_layer: dict[int, list[dict]] = {}
    for e in dump["experts"]:
        by_layer.setdefault(e["layer_id"], []).append(e)
    node = root.add(
        f"[bold]expert table[/] ({len(dump['experts'])} entries, {len(by_layer)} layers)"
    )
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
            en = ln.add(
                f"expert {e['expert_id']}: blob at {e['byte_offset']:#x}, "
                f"raw {e['raw_size']:,} B, padded {e['padded_size']:,} B, "
                f"{e['num_groups']} groups"
            )
            for t, d in enumerate(e["tensors"]):
                p0 = e["byte_offset"] + d["packed_offset"]
                s0 = e["byte_offset"] + d["scales_offset"]
                en.add(
                    f"{TENSOR_NAMES[t]} [{d['rows']}, {d['cols']}]  packed "
                    f"+{d['packed_offset']} ({p0:#x}) {d['packed_size']:,} B  scales "
                    f"+{d['scales_offset']} ({s0:#x}) {d['scales_size']:,} B"
                )
    if not experts and layer is None:
        node.add("[dim](--experts to list every expert, --layer L for one layer)[/]")


def _ranges(ids: list[int]) -> str:
    """Runs of consecutive ids: ``0-3,5,7-8``."""
    runs: list[list[int]] = []  # [first, last]
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
