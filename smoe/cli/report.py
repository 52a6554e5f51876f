"""`smoe report`: one self-contained HTML page that pictures a vault.

The page (``smoe/cli/templates/report.html.j2``, rendered by jinja2 with autoescaping) holds
inline SVG and CSS only: no script, no external resource, it opens from disk. It shows a
map of the file (every region, blobs coloured by layer), the header and arch fields with
their offsets (``activation`` by name: ``silu (0)``, ``unknown (N)`` for a value the spec
does not name), per-layer sizes, the verifier's findings and, when the integrity manifest
(docs/MANIFEST.md) is there, per-expert quantisation SNR as a layer x expert heat map with
a histogram per tensor kind.

What the vault costs, in the summary and per layer (:func:`figures`):

- **weights**: the experts' weights, the sum over the table's experts of ``rows x cols`` of
  their three tensors (from the descriptors);
- **bits per weight**: blob bytes x 8 / weights, once with the blobs' ``raw_size`` (the
  packed codes and the fp16 group scales) and once with their ``padded_size`` (as stored,
  page padding included);
- **compression against BF16**: the same weights in BF16 (2 bytes each) / blob bytes, raw
  and padded (that is 16 / bits per weight);
- **streaming cost per token**: an engine that streams experts reads ``top_k`` blobs (the
  arch block's ``moe_top_k``) in each MoE layer of the file, so per layer ``top_k`` x the
  layer's mean blob size and in total the sum over the layers present: blobs per token
  ``top_k x layers``, bytes per token raw (``raw_size``) and as read in whole pages
  (``padded_size``), rounded to whole bytes. A version 1 vault has no arch block and hence
  no ``top_k``: its cost per token is "unknown (v1 vault)".

The heat map's colours are fixed bands of absolute SNR per bit width (:func:`snr_bands`),
not a scale stretched over the vault's own spread, so an expert's colour depends on its SNR
alone: :data:`SNR_BANDS` bands of :data:`SNR_BAND_STEP_DB` dB each from the width's floor
(``smoe.quant.SNR_FLOOR_DB``) up, the step being the distance from the floor to the SNR of
Gaussian weights (Q4 20.5 dB, Q2 9.5 dB) divided by :data:`SNR_BANDS`: Q4 10, 11.5, 13, 14.5,
16, 17.5 and 19 dB and up; Q2 2.5, 3.5, ..., 8.5 dB and up. A value above the last edge takes
the top colour; below the floor is red. The histograms' bars take the same colours.

The page stays small however large the vault: blobs are drawn per run of one layer (at most
:data:`MAX_RUNS` segments), the heat map is one SVG path per colour rather than one element
per expert, and per-expert tooltips are only written for vaults of up to
:data:`CELL_TITLES_MAX` experts (per-layer ones otherwise). Qwen3-235B's 12,032 experts
with a manifest give a page of about 0.3 MB.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smoe.cli.console import valid_text
from smoe.errors import SmoeError, WriteFailed
from smoe.format import manifest as manifests
from smoe.format.findings import Finding, Value, display
from smoe.format.provenance import notable, read_provenance
from smoe.format.provenance import rows as provenance_rows
from smoe.format.records import model_type_str
from smoe.format.verify import Report, verify_file
from smoe.format.view import FileView, Geometry, arch_view, header_view, table_views
from smoe.interop.safetensors_io import DTYPE_SIZES
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile, Signature, refuse_foreign
from smoe.quant import SNR_FLOOR_DB
from smoe_gen import layout
from smoe_gen.layout import TENSOR_NAMES

__all__ = [
    "ReportResult",
    "activation_name",
    "band_colour",
    "collect",
    "figures",
    "fit_widths",
    "human",
    "layer_colour",
    "manifest_for",
    "render",
    "snr_band",
    "snr_bands",
    "viridis",
    "write_report",
]

TEMPLATE = "report.html.j2"
GENERATOR = b'<meta name="generator" content="smoe '  # in the page's head (the template)
SCHEMA = "smoe-report/1"  # the "schema" key of `smoe report --json` (docs/JSON.md)
WIDTH = 1160  # drawing width of the maps, in CSS pixels
MAX_RUNS = 512  # blob segments drawn on the file map at most (runs are merged beyond)
BLOB_DETAIL_MAX = 256  # up to this many blobs, the blob strip shows each (raw | padding)
CELL_TITLES_MAX = 2048  # up to this many experts, every heat-map cell has a tooltip
MAX_ROWS = 1024  # layers shown in the heat map and the per-layer table at most
MAX_COLS = 1024  # expert columns of the heat map at most
HIST_BINS = 40
BF16_BYTES = DTYPE_SIZES["BF16"]  # per weight, of the BF16 the compression is measured against
UNKNOWN_V1 = "unknown (v1 vault)"  # the cost per token of a vault without moe_top_k
UNKNOWN_ARCH = "unknown (no readable arch block)"
UNKNOWN_TABLE = "unknown (no readable expert table)"
# a page replaced by report -o --force must be one report wrote (its generator tag)
REPORT_SIGNATURE = Signature(
    "a page smoe report wrote", lambda fd: GENERATOR in os.pread(fd, 4096, 0)
)
UNKNOWN_WHY = {
    UNKNOWN_TABLE: "the expert table cannot be read (see the findings)",
    UNKNOWN_V1: "a v1 vault has no arch block, so no moe_top_k",
    UNKNOWN_ARCH: "the arch block cannot be read (see the findings)",
}

SNR_BANDS = 7
"""Colour bands of the SNR heat map (one SVG path each), the last open upwards."""
SNR_GAUSSIAN_DB = {4: 20.5, 2: 9.5}
"""Per bit width, the tensor SNR of N(0, 0.02) weights (``smoe.quant.SNR_FLOOR_DB``'s
measurements): the bands reach from the floor to it."""
SNR_BAND_STEP_DB = {
    bits: (gaussian - SNR_FLOOR_DB[bits]) / SNR_BANDS for bits, gaussian in SNR_GAUSSIAN_DB.items()
}
"""Per bit width, the width of one colour band (dB): Q4 1.5, Q2 1.0."""
OTHER_BANDS = (0.0, 3.0)
"""(lowest edge, step) of the bands of a bit width without a floor (not a readable vault)."""

VIRIDIS = (
    "#440154",
    "#482878",
    "#3e4989",
    "#31688e",
    "#26828e",
    "#1f9e89",
    "#35b779",
    "#6ece58",
    "#fde725",
)
REGION_COLOURS = {
    "header": "#1e293b",
    "table": "#2563eb",
    "descriptors": "#0ea5e9",
    "arch": "#9333ea",
    "align": "#cbd5e1",
    "gap": "#e2e8f0",
}
BELOW_FLOOR = "#e11d48"  # cells and bars under the bit width's SNR floor
EXACT = "#f5d0fe"  # every tensor all-zero or exactly representable: no finite SNR
UNRECORDED = "#94a3b8"  # the manifest has no SNR for the expert
ABSENT = "#eef1f5"  # no such expert in the vault (partial vault)
MIXED = "#a8a29e"  # a merged blob segment holding several layers
UNUSED = "url(#hatch)"  # bytes no region claims (holes between blobs, a tail)


@dataclass
class ReportResult:
    """What :func:`write_report` wrote and what it found.

    >>> import os, tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "q4.html")
    >>> result = write_report("fixtures/q4_v2.smoe", out)
    >>> result.experts, result.layers, result.ok, result.snr
    (8, 2, True, False)
    >>> result.figures["weights"], result.figures["per_token"]["bytes_read"]
    (49152, 65536)
    """

    path: Path
    vault: Path
    bytes: int
    experts: int
    layers: int
    manifest: Path | None
    snr: bool
    ok: bool
    errors: int
    warnings: int
    unreadable: bool
    provenance: dict[str, Any] | None = None
    """The manifest's provenance and metadata (:func:`smoe.format.provenance.provenance_of`),
    or None without a readable manifest."""
    figures: dict[str, Any] | None = None
    """The vault's weights, bits per weight, compression and cost per token
    (:func:`figures`, less its per-layer part), or None when the header cannot be trusted."""

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document of ``smoe report``.

        >>> import os, tempfile
        >>> out = os.path.join(tempfile.mkdtemp(), "q4.html")
        >>> doc = write_report("fixtures/q4_v2.smoe", out).to_dict()
        >>> doc["schema"], doc["report"] == out, doc["vault"], doc["manifest"]
        ('smoe-report/1', True, 'fixtures/q4_v2.smoe', None)
        >>> doc["weights"], doc["bits_per_weight"], doc["compression_vs_bf16"]["raw"]
        (49152, {'raw': 4.25, 'padded': 21.333333333333332}, 3.764705882352941)
        >>> doc["per_token"]
        {'top_k': 2, 'blobs': 4, 'bytes_raw': 13056, 'bytes_read': 65536}
        """
        f = self.figures or {}
        tok = f.get("per_token") or {}
        return {
            "schema": SCHEMA,
            "report": str(self.path),
            "vault": str(self.vault),
            "bytes": self.bytes,
            "experts": self.experts,
            "layers": self.layers,
            "manifest": None if self.manifest is None else str(self.manifest),
            "snr": self.snr,
            "ok": self.ok,
            "errors": self.errors,
            "warnings": self.warnings,
            "provenance": self.provenance,
            "weights": f.get("weights"),
            "bits_per_weight": {"raw": f.get("bits_raw"), "padded": f.get("bits_padded")},
            "compression_vs_bf16": {"raw": f.get("vs_bf16_raw"), "padded": f.get("vs_bf16_padded")},
            "per_token": {k: tok.get(k) for k in ("top_k", "blobs", "bytes_raw", "bytes_read")},
        }


def write_report(
    vault: str | os.PathLike,
    out: str | os.PathLike,
    deep: bool = False,
    manifest: str | os.PathLike | None = "auto",
    replace: bool = True,
) -> ReportResult:
    """Write the report page of ``vault`` to ``out`` atomically (``replace`` False, as
    ``smoe report`` without ``--force``: an existing ``out`` is refused and never replaced).

    ``manifest``: "auto" (the sidecar ``VAULT.manifest.json`` when it exists), a path, or
    None (no SNR). ``deep`` also reads every blob and checks them against the manifest, as
    ``smoe verify --deep`` does. An output that is the vault or its manifest (also through
    symlinks or hard links), or a folder, is refused before anything is written, and so is a
    named ``manifest`` that is not a regular file (a missing one is not "no manifest"). A
    vault that breaks rules still gets its page (its findings are on it).

    >>> import os, tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "q4.html")
    >>> write_report("fixtures/q4_v2.smoe", out).bytes == os.path.getsize(out)
    True
    >>> write_report("fixtures/q4_v2.smoe", "fixtures/q4_v2.smoe")
    Traceback (most recent call last):
    smoe.errors.WriteFailed: fixtures/q4_v2.smoe: the output is the input ... itself; ...
    """
    vault, out = Path(vault), Path(out)
    side = manifest_for(vault, manifest)
    if side is not None and not (isinstance(manifest, str) and manifest == "auto"):
        fileio.require_regular(side)  # a named manifest that is not there: refused (exit 2)
    fileio.refuse_same_file(out, [vault, manifests.path_for(vault), *([side] if side else [])])
    if out.is_dir():
        raise WriteFailed(f"{out}: is a folder; name the .html file to write")
    if not replace:
        fileio.refuse_existing(out)
    else:
        refuse_foreign(out, REPORT_SIGNATURE)
    with FileView.open(vault) as view:
        report = verify_file(view, vault, deep=deep, manifest=manifest)
        context = collect(view, vault, report, side, deep)
    html = render(context).encode("utf-8")
    with AtomicFile(out, replace=replace, ours=REPORT_SIGNATURE) as f:
        f.pwrite(html, 0)
        f.commit()
    return ReportResult(
        path=out,
        vault=vault,
        bytes=len(html),
        experts=context["experts"],
        layers=context["layer_count"],
        manifest=side if context["snr"] is not None else None,
        snr=context["snr"] is not None,
        ok=report.ok,
        errors=len(report.errors),
        warnings=sum(f.severity == "warning" for f in report.findings),
        unreadable=any(f.code == "header.size" for f in report.errors),
        provenance=context["provenance"]["doc"] if context["provenance"] else None,
        figures=_without_layers(context["figures"]),
    )


def _without_layers(fig: dict[str, Any] | None) -> dict[str, Any] | None:
    """:func:`figures` less its per-layer part (the page's, not ``--json``'s)."""
    return None if fig is None else {k: v for k, v in fig.items() if k != "layers"}


def manifest_for(vault: Path, manifest: str | os.PathLike | None) -> Path | None:
    """The manifest whose SNR the page shows: the sidecar when it exists ("auto"), the
    given file, or None.

    >>> manifest_for(Path("fixtures/q4_v2.smoe"), "auto")
    PosixPath('fixtures/q4_v2.smoe.manifest.json')
    >>> manifest_for(Path("fixtures/q4_v2.smoe"), None) is None
    True
    """
    if manifest is None:
        return None
    if isinstance(manifest, str) and manifest == "auto":
        side = manifests.path_for(vault)
        return side if os.path.lexists(side) else None
    return Path(manifest)


def render(context: dict[str, Any]) -> str:
    """The page for a :func:`collect` context.

    >>> from smoe.format.verify import verify_file
    >>> with FileView.open("fixtures/q4_v2.smoe") as view:
    ...     report = verify_file(view, "fixtures/q4_v2.smoe")
    ...     context = collect(view, Path("fixtures/q4_v2.smoe"), report, None, deep=False)
    >>> page = render(context)
    >>> page.startswith("<!DOCTYPE html>"), "<script" in page
    (True, False)
    """
    return _template().render(**context)


@functools.lru_cache(maxsize=1)
def _template() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("smoe.cli", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=_num, human=human, hexa=lambda v: f"{int(v):#x}")
    return env.get_template(TEMPLATE)


# ---- what the page shows ---------------------------------------------------------------
def collect(
    view: FileView | np.ndarray, path: Path, report: Report, manifest: Path | None, deep: bool
) -> dict[str, Any]:
    """Everything the template draws, as plain data (coordinates already computed).

    ``report`` is the verifier's report of the same ``view``; ``manifest`` the file to take
    SNR from (see :func:`manifest_for`), or None.

    >>> from smoe.format.verify import verify_file
    >>> with FileView.open("fixtures/q4_v2.smoe") as view:
    ...     report = verify_file(view, "fixtures/q4_v2.smoe")
    ...     context = collect(view, Path("fixtures/q4_v2.smoe"), report, None, deep=False)
    >>> [r["label"] for r in context["regions"]]
    ['header', 'expert table', 'tensor descriptors', 'alignment (zero)', 'arch block', 'zero gap']
    >>> context["experts"], [lay["count"] for lay in context["layers"]], context["snr"]
    (8, [4, 4], None)
    """
    size = len(view)
    ctx = _empty_context(path, size, report, deep)
    ctx["provenance"] = _provenance(view, path, manifest)
    if size < layout.HEADER_SIZE:
        ctx["snr_note"] = "The file is shorter than a header; there is nothing to picture."
        return ctx
    h = header_view(view)
    ctx["header"] = _fields(h, layout.HEADER_DTYPE, "header", 0)
    ctx["summary"] = _format_summary(h, size)
    if report.geometry is None:
        ctx["snr_note"] = "The header cannot be trusted (see the findings), so nothing is drawn."
        return ctx
    _picture(ctx, view, report.geometry, h, manifest)
    return ctx


def _provenance(
    view: FileView | np.ndarray, path: Path, manifest: Path | None
) -> dict[str, Any] | None:
    """The page's provenance part from ``manifest`` (None without a readable one): its
    name, its (field, text) rows, whether to show them (:func:`smoe.format.provenance.notable`)
    and the provenance itself for ``--json``."""
    entries = int(header_view(view)["total_experts"]) if len(view) >= layout.HEADER_SIZE else 0
    prov = read_provenance(path, entries, manifest) if manifest is not None else None
    if prov is None:
        return None
    return {
        "manifest": valid_text(os.path.basename(prov["manifest"])),
        "rows": [(valid_text(k), valid_text(v)) for k, v in provenance_rows(prov)],
        "shown": notable(prov),
        "doc": prov,
    }


def _empty_context(path: Path, size: int, report: Report, deep: bool) -> dict[str, Any]:
    """The context of a file with nothing to picture: its name, size and findings."""
    from smoe import __version__

    return {
        "name": valid_text(path.name),
        "path": valid_text(os.fsdecode(path)),
        "size": size,
        "version": __version__,
        "deep": deep,
        "header": None,
        "arch": None,
        "summary": [],
        "findings": [_finding(f) for f in report.findings],
        "experts": 0,
        "layer_count": 0,
        "maps": None,
        "regions": [],
        "layers": [],
        "layers_hidden": 0,
        "snr": None,
        "snr_note": "",
        "figures": None,
        "verdict": _verdict(report, deep),
    }


def _format_summary(h: np.void, size: int) -> list[tuple[str, str, str]]:
    """The summary rows a header alone gives: format and file size."""
    return [
        (
            "format",
            f"v{int(h['version'])} · SMOE-Q{int(h['bits'])}",
            f"group {int(h['group_size'])}, {human(layout.PAGE_SIZE, 0)} pages",
        ),
        ("file size", human(size), f"{_num(size)} bytes"),
    ]


def _picture(
    ctx: dict[str, Any],
    view: FileView | np.ndarray,
    geo: Geometry,
    h: np.void,
    manifest: Path | None,
) -> None:
    """Fill in what a trusted header lets the page draw: arch block, summary, file map,
    layers and SNR."""
    size = ctx["size"]
    arch = None
    if geo.version >= layout.VERSION_WITH_ARCH and geo.arch_readable:
        arch = arch_view(view, geo)
        ctx["arch"] = _fields(arch, layout.ARCH_BLOCK_DTYPE, "arch_block", geo.reserved_ext)
    table = descs = None
    if geo.table_readable:
        table, descs = table_views(view, geo)
    blobs = _blobs(table, size)
    layers = _layers(table, descs, size)
    ctx["experts"] = geo.total
    ctx["layer_count"] = distinct = len(np.unique(blobs["layer"]))
    ctx["summary"] += _vault_summary(h, geo, arch, blobs, distinct)
    if arch is not None:
        top_k, unknown = int(arch["moe_top_k"]), ""
    elif geo.version < layout.VERSION_WITH_ARCH:
        top_k, unknown = None, UNKNOWN_V1
    else:
        top_k, unknown = None, UNKNOWN_ARCH
    fig = figures(table, descs, top_k, size, unknown)
    ctx["figures"] = fig
    ctx["summary"] += _figure_summary(fig)
    for lay in layers:
        lay["fig"] = fig["layers"].get(lay["layer"])
    regions = _regions(geo, blobs, size)
    ctx["regions"] = [r for r in regions if r["kind"] != "blobs"]
    ctx["maps"] = _maps(regions, blobs, geo, size, distinct)
    bits = int(h["bits"])
    snr, ctx["snr_note"] = _manifest_snr(manifest, size, geo, table, bits)
    if snr is not None and table is not None:
        ctx["snr"] = _snr_view(snr, table, layers, int(h["max_experts_per_layer"]), bits)
        for lay in layers:
            lay["snr"] = ctx["snr"]["per_layer"].get(lay["layer"])
    ctx["layers_hidden"] = distinct - len(layers)
    ctx["layers"] = layers


def _vault_summary(
    h: np.void, geo: Geometry, arch: np.void | None, blobs: dict[str, np.ndarray], distinct: int
) -> list[tuple[str, str, str]]:
    """The summary rows of the table and arch block: experts, layers, model, blob bytes."""
    width = int(h["num_moe_layers"]) * int(h["max_experts_per_layer"])
    kind = (
        f"full: {int(h['num_moe_layers'])} × {int(h['max_experts_per_layer'])}"
        if geo.total >= width
        else f"partial: {_num(geo.total)} of {_num(width)}"
    )
    padded, raw = int(blobs["padded"].sum()), int(blobs["raw"].sum())
    model = f"d_model {int(h['d_model'])}"
    if arch is not None:
        model += f" · top-{int(arch['moe_top_k'])} of {int(h['max_experts_per_layer'])}"
    return [
        ("experts", _num(geo.total), kind),
        ("layers", f"{distinct} of {int(h['num_moe_layers'])}", "MoE layers in this file"),
        ("model", valid_text(_model_type(arch)) if arch is not None else "unknown (v1)", model),
        (
            "expert blobs",
            human(padded),
            f"data {human(raw)}, padding {100 * (padded - raw) / padded:.1f} %"
            if padded
            else "none",
        ),
    ]


def figures(
    table: np.ndarray | None,
    descs: np.ndarray | None,
    top_k: int | None,
    size: int,
    unknown: str = "",
) -> dict[str, Any]:
    """What the vault's experts cost: weights, bits per weight, compression against BF16,
    the streaming cost per token (see the module's docstring), in total and per layer id.

    Blob sizes are the table's, clipped to the file's ``size`` (as the map draws them);
    ``top_k`` None (``unknown`` says why) leaves the cost per token unknown, and so does
    ``table`` None. A figure that cannot be had (no descriptors, no weights) is None.

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as v:
    ...     table, descs = table_views(v.data, v.geometry)
    ...     f = figures(table, descs, 2, len(v.data))
    >>> f["weights"], f["raw"], f["padded"], f["bf16"], f["bits_raw"], f["bits_padded"]
    (49152, 26112, 131072, 98304, 4.25, 21.333333333333332)
    >>> round(f["vs_bf16_raw"], 3), f["vs_bf16_padded"]
    (3.765, 0.75)
    >>> f["per_token"]
    {'top_k': 2, 'blobs': 4, 'bytes_raw': 13056, 'bytes_read': 65536, 'layers': 2, 'unknown': ''}
    >>> f["layers"][0]["token_read"], figures(table, descs, None, 0)["per_token"]["blobs"]
    (32768, None)
    """
    ids = np.zeros(0, np.int64) if table is None else table["layer_id"].astype(np.int64)
    empty = not len(ids)
    uniq, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    raw_of = np.zeros(len(uniq), np.int64)
    pad_of = np.zeros(len(uniq), np.int64)
    weights_of: list[int] | None = None
    if table is not None and not empty:
        np.add.at(raw_of, inverse, _clip(table["raw_size"], size))
        np.add.at(pad_of, inverse, _clip(table["padded_size"], size))
        if descs is not None:
            # Python ints: rows x cols of a broken descriptor may not fit in 64 bits
            per_entry = [
                sum(r * c for r, c in zip(rows, cols))
                for rows, cols in zip(descs["rows"].tolist(), descs["cols"].tolist())
            ]
            weights_of = [0] * len(uniq)
            for i, w in zip(inverse.tolist(), per_entry):
                weights_of[i] += w
    raw, padded = int(raw_of.sum()), int(pad_of.sum())
    weights = sum(weights_of) if weights_of is not None else None
    layers: dict[int, dict[str, Any]] = {}
    token_raw = token_read = 0.0
    for i, lay in enumerate(uniq.tolist()):
        n = int(counts[i])
        t_raw = None if top_k is None else top_k * int(raw_of[i]) / n
        t_read = None if top_k is None else top_k * int(pad_of[i]) / n
        token_raw += t_raw or 0.0
        token_read += t_read or 0.0
        layers[int(lay)] = {
            **_bits(
                weights_of[i] if weights_of is not None else None, int(raw_of[i]), int(pad_of[i])
            ),
            "token_raw": None if t_raw is None else round(t_raw),
            "token_read": None if t_read is None else round(t_read),
        }
    known = top_k is not None and not empty
    blobs = top_k * len(uniq) if top_k is not None and not empty else None
    return {
        **_bits(weights, raw, padded),
        "raw": raw,
        "padded": padded,
        "layers": layers,
        "per_token": {
            "top_k": top_k,
            "blobs": blobs,
            "bytes_raw": round(token_raw) if known else None,
            "bytes_read": round(token_read) if known else None,
            "layers": len(uniq),
            "unknown": "" if known else (UNKNOWN_TABLE if table is None else unknown),
        },
    }


def _bits(weights: int | None, raw: int, padded: int) -> dict[str, Any]:
    """Weights, their BF16 bytes, bits per weight and compression against BF16 of blobs of
    ``raw`` and ``padded`` bytes (None where there are no weights to divide by)."""
    out: dict[str, Any] = {"weights": weights, "bf16": None}
    out.update(bits_raw=None, bits_padded=None, vs_bf16_raw=None, vs_bf16_padded=None)
    if weights is None:
        return out
    out["bf16"] = bf16 = BF16_BYTES * weights
    if weights > 0:
        out["bits_raw"], out["bits_padded"] = raw * 8 / weights, padded * 8 / weights
        out["vs_bf16_raw"] = bf16 / raw if raw else None
        out["vs_bf16_padded"] = bf16 / padded if padded else None
    return out


def _figure_summary(f: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The summary rows of :func:`figures`: weights, bits per weight, compression, the
    cost per token."""
    tok = f["per_token"]
    if f["weights"] is None:
        rows = [("expert weights", "unknown", "the descriptors cannot be read")]
    else:
        rows = [
            ("expert weights", _num(f["weights"]), f"BF16: {human(f['bf16'])}"),
            (
                "bits per weight",
                _fixed(f["bits_raw"], 3),
                f"{_fixed(f['bits_padded'], 3)} with page padding",
            ),
            (
                "compression vs BF16",
                _ratio(f["vs_bf16_raw"]),
                f"{_ratio(f['vs_bf16_padded'])} with page padding",
            ),
        ]
    if tok["bytes_read"] is None:
        why = tok["unknown"] or "none"
        sub = UNKNOWN_WHY.get(why, "no experts in the table")
        rows.append(("read per token", why, sub))
    else:
        rows.append(
            (
                "read per token",
                human(tok["bytes_read"]),
                f"{_num(tok['blobs'])} blobs (top-{tok['top_k']} × {_num(tok['layers'])} "
                f"layers), data {human(tok['bytes_raw'])}",
            )
        )
    return rows


def _fixed(v: float | None, digits: int) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def _ratio(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}×"


def _verdict(report: Report, deep: bool) -> dict[str, Any]:
    counts = {
        s: sum(f.severity == s for f in report.findings) for s in ("error", "warning", "info")
    }
    return {"ok": report.ok, **counts, "deep": deep}


def _finding(f: Finding) -> dict[str, Any]:
    return {
        "severity": f.severity,
        "code": f.code,
        "offset": f.offset,
        "path": valid_text(f.path),
        "message": valid_text(f.message),
        "expected": _value(f.expected),
        "actual": _value(f.actual),
    }


def _value(v: Value) -> str | None:
    shown = display(v)
    return None if shown is None else valid_text(shown)


def _fields(rec: np.void, dtype: np.dtype, doc_key: str, base: int) -> list[dict[str, Any]]:
    """Rows of (absolute offset, size, name, shown value, first sentence of the spec doc)."""
    docs = layout.FIELD_DOCS[doc_key]
    rows = []
    fields: Mapping[str, tuple[Any, ...]] = dtype.fields or {}
    for name in dtype.names or ():
        sub, off = fields[name][:2]
        v = rec[name]
        if name == "model_type":
            shown = repr(_model_type_bytes(rec))
        elif name == "activation":
            shown = activation_name(int(v))
        elif name == "flags":
            names = [n for n, bit in layout.FLAG_NAMES.items() if int(v) & bit]
            shown = f"{int(v):#x} = {' | '.join(names) or 'none'}"
        elif getattr(v, "shape", ()) != () or isinstance(v, bytes):
            raw = bytes(np.asarray(v).tobytes()) if not isinstance(v, bytes) else v
            shown = raw.hex(" ")
            if name.startswith("reserved") and not any(raw):
                shown = "all zero"
        elif sub.kind == "f":
            shown = str(np.float32(v))
        else:
            shown = f"{int(v)} ({int(v):#x})" if int(v) > 9 else str(int(v))
        doc = docs.get(name, "")
        rows.append(
            {
                "offset": base + off,
                "size": sub.itemsize,
                "name": name,
                "value": valid_text(shown),
                "doc": _first_sentence(doc),
                "full_doc": doc,
            }
        )
    return rows


def activation_name(value: int) -> str:
    """The arch block's ``activation`` as the page shows it: the spec's name with the number.

    >>> activation_name(0), activation_name(7)
    ('silu (0)', 'unknown (7)')
    """
    try:
        return f"{layout.Activation(value).name.lower()} ({value})"
    except ValueError:
        return f"unknown ({value})"


def _model_type_bytes(arch: np.void) -> str:
    at = layout.ARCH_BLOCK_OFFSETS["model_type"]
    return model_type_str(arch.tobytes()[at : at + layout.MODEL_TYPE_SIZE])


def _model_type(arch: np.void) -> str:
    return _model_type_bytes(arch) or "(empty model_type)"


def _first_sentence(doc: str) -> list[tuple[str, bool]]:
    """The doc's first sentence as (text, is code) pieces (backticks mark code)."""
    m = re.match(r"((?:e\.g\.|i\.e\.|\.(?!\s)|[^.;])+[.;])(\s|$)", doc)
    text = (m.group(1) if m else doc).rstrip(";.")
    return [(piece, i % 2 == 1) for i, piece in enumerate(text.split("`")) if piece]


# ---- blobs and layers ----------------------------------------------------------------------
def _blobs(table: np.ndarray | None, size: int) -> dict[str, np.ndarray]:
    """Blob columns in file order (start clipped to the file, end clipped too)."""
    if table is None or not len(table):
        z = np.zeros(0, np.int64)
        return {"layer": z, "expert": z, "start": z, "end": z, "raw": z, "padded": z}
    order = np.argsort(table["byte_offset"], kind="stable")
    start = _clip(table["byte_offset"][order], size)
    padded = _clip(table["padded_size"][order], size)
    return {
        "layer": table["layer_id"][order].astype(np.int64),
        "expert": table["expert_id"][order].astype(np.int64),
        "start": start,
        "end": np.minimum(start + padded, size),
        "padded": padded,
        "raw": _clip(table["raw_size"][order], size),
    }


def _clip(column: np.ndarray, size: int) -> np.ndarray:
    """An unsigned column clipped to ``size`` as int64 (sums of two cannot overflow)."""
    return np.minimum(column.astype(np.uint64), np.uint64(size)).astype(np.int64)


def _layers(table: np.ndarray | None, descs: np.ndarray | None, size: int) -> list[dict[str, Any]]:
    """Per layer id (the first MAX_ROWS): expert count and ids, shapes of its first
    expert, bytes, span."""
    if table is None or not len(table):
        return []
    ids = table["layer_id"].astype(np.int64)
    uniq, first, counts = np.unique(ids, return_index=True, return_counts=True)
    raw = np.bincount(np.searchsorted(uniq, ids), weights=table["raw_size"].astype(np.float64))
    pad = np.bincount(np.searchsorted(uniq, ids), weights=table["padded_size"].astype(np.float64))
    out = []
    for i, lay in enumerate(uniq[:MAX_ROWS].tolist()):
        sel = ids == lay
        offs = table["byte_offset"][sel].tolist()  # as written (may point past the end)
        ends = [o + p for o, p in zip(offs, table["padded_size"][sel].tolist())]
        d = descs[int(first[i])] if descs is not None else None
        shapes = (
            [f"{int(d[t]['rows'])}×{int(d[t]['cols'])}" for t in range(len(d))]
            if d is not None
            else []
        )
        out.append(
            {
                "layer": int(lay),
                "count": int(counts[i]),
                "ids": _ranges(table["expert_id"][sel].astype(np.int64).tolist()),
                "shapes": shapes,
                "raw": int(raw[i]),
                "padded": int(pad[i]),
                "share": float(pad[i]) / size if size else 0.0,
                "start": min(offs),
                "end": max(ends),
                "colour": "",
                "snr": None,
                "fig": None,
            }
        )
    for i, lay in enumerate(out):
        lay["colour"] = layer_colour(i, len(uniq))
    return out


def layer_colour(i: int, n: int) -> str:
    """Layer ``i`` of ``n``'s colour: warm-to-green hues along the layers, lightness
    alternating so that neighbours differ.

    >>> layer_colour(0, 94), layer_colour(1, 94), layer_colour(93, 94)
    ('hsl(28,68%,50%)', 'hsl(29,68%,62%)', 'hsl(148,68%,62%)')
    """
    hue = 28 + 120 * (i / max(1, n - 1))
    light = 50 if i % 2 == 0 else 62
    return f"hsl({hue:.0f},68%,{light}%)"


def _ranges(ids: Sequence[int]) -> str:
    parts: list[list[int]] = []
    for i in sorted(set(ids)):
        if parts and parts[-1][1] == i - 1:
            parts[-1][1] = i
        else:
            parts.append([i, i])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)


# ---- the file map ------------------------------------------------------------------------
def _regions(geo: Geometry, blobs: dict[str, np.ndarray], size: int) -> list[dict[str, Any]]:
    """A non-overlapping cover of [0, size): metadata regions, blob runs, unclaimed bytes."""
    claimed: list[tuple[int, int, str, str, str, int | None]] = []  # start, end, kind, ...

    def add(
        start: int, end: int, kind: str, label: str, colour: str, layer: int | None = None
    ) -> None:
        if end > start:
            claimed.append((start, end, kind, label, colour, layer))

    k = layout
    add(0, k.HEADER_SIZE, "header", "header", REGION_COLOURS["header"])
    add(k.TABLE_OFFSET, geo.descriptors_offset, "table", "expert table", REGION_COLOURS["table"])
    add(
        geo.descriptors_offset,
        geo.descriptors_end,
        "descriptors",
        "tensor descriptors",
        REGION_COLOURS["descriptors"],
    )
    meta_end = geo.descriptors_end
    if geo.version >= k.VERSION_WITH_ARCH and geo.reserved_ext:
        add(
            geo.descriptors_end,
            geo.reserved_ext,
            "align",
            "alignment (zero)",
            REGION_COLOURS["align"],
        )
        add(
            geo.reserved_ext,
            geo.reserved_ext + k.ARCH_BLOCK_SIZE,
            "arch",
            "arch block",
            REGION_COLOURS["arch"],
        )
        meta_end = max(meta_end, geo.reserved_ext + k.ARCH_BLOCK_SIZE)
    add(meta_end, geo.data_offset, "gap", "zero gap", REGION_COLOURS["gap"])
    n_layers = len(np.unique(blobs["layer"]))
    rank = {int(v): i for i, v in enumerate(np.unique(blobs["layer"]).tolist())}
    for start, end, lay in _runs(blobs):
        label = "blobs, several layers" if lay is None else f"layer {lay} blobs"
        colour = MIXED if lay is None else layer_colour(rank[lay], n_layers)
        add(start, end, "blobs", label, colour, lay)
    claimed.sort(key=lambda r: (r[0], r[1]))
    out: list[dict[str, Any]] = []
    cursor = 0
    for start, end, kind, label, colour, lay in claimed:
        start = max(start, cursor)
        end = min(end, size)
        if start > cursor:
            out.append(_region(cursor, min(start, size), "unused", "unclaimed bytes", UNUSED))
        if end > start:
            out.append(_region(start, end, kind, label, colour, lay))
            cursor = end
    if cursor < size:
        out.append(_region(cursor, size, "unused", "unclaimed bytes", UNUSED))
    for r in out:
        r["share"] = (r["end"] - r["start"]) / size if size else 0.0
    return out


def _region(
    start: int, end: int, kind: str, label: str, colour: str, layer: int | None = None
) -> dict[str, Any]:
    ink = "#ffffff" if kind in ("header", "table", "descriptors", "arch") else "#0f172a"
    return {
        "start": start,
        "end": end,
        "size": end - start,
        "kind": kind,
        "label": label,
        "colour": colour,
        "layer": layer,
        "ink": ink,
    }


def _runs(blobs: dict[str, np.ndarray]) -> list[tuple[int, int, int | None]]:
    """(start, end, layer) of contiguous runs of one layer's blobs in file order; merged
    into at most MAX_RUNS segments (layer None when a segment mixes layers)."""
    start, end, lay = blobs["start"], blobs["end"], blobs["layer"]
    if not len(start):
        return []
    brk = np.ones(len(start), bool)
    brk[1:] = (lay[1:] != lay[:-1]) | (start[1:] != end[:-1])
    first = np.flatnonzero(brk)
    if len(first) > MAX_RUNS:
        first = first[np.linspace(0, len(first) - 1, MAX_RUNS).astype(np.int64)]
        first = np.unique(first)
    last = np.r_[first[1:], len(start)] - 1
    out = []
    for a, b in zip(first.tolist(), last.tolist()):
        layers = lay[a : b + 1]
        one = int(layers[0]) if (layers == layers[0]).all() else None
        out.append((int(start[a]), int(end[a : b + 1].max()), one))
    return out


def fit_widths(sizes: Sequence[float], width: float, minimum: float) -> list[float]:
    """Widths proportional to ``sizes`` summing to ``width``, none below ``minimum``.

    >>> fit_widths([64, 1000, 100_000], 100, 5)
    [5.0, 5.0, 90.0]
    >>> fit_widths([1, 3], 100, 0)
    [25.0, 75.0]
    """
    n = len(sizes)
    if not n:
        return []
    if n * minimum >= width:
        return [width / n] * n
    s = np.asarray(sizes, np.float64)
    fixed = np.zeros(n, bool)
    while True:
        free = width - minimum * fixed.sum()
        total = s[~fixed].sum()
        w = np.where(fixed, minimum, s * (free / total if total > 0 else 0.0))
        small = ~fixed & (w < minimum)
        if not small.any():
            return w.tolist()
        fixed |= small


def _bar(
    regions: list[dict[str, Any]], width: float, minimum: float, lo: int, hi: int
) -> list[dict[str, Any]]:
    """Segments of [lo, hi) (regions clipped to it), laid out with :func:`fit_widths`."""
    parts = []
    for r in regions:
        a, b = max(r["start"], lo), min(r["end"], hi)
        if b > a:
            parts.append({**r, "start": a, "end": b, "size": b - a})
    widths = fit_widths([p["size"] for p in parts], width, minimum)
    x = 0.0
    for p, w in zip(parts, widths):
        p["x"], p["w"] = round(x, 2), round(w, 2)
        p["text"] = _fit_label(p, w)
        p["title"] = (
            f"{p['label']}: {_num(p['start'])}..{_num(p['end'])} "
            f"({p['start']:#x}), {_num(p['size'])} bytes ({human(p['size'])})"
        )
        x += w
    return parts


def _fit_label(p: dict[str, Any], w: float) -> str:
    for text in (p["label"], p["label"].replace(" blobs", "").replace("layer ", "L")):
        if len(text) * 6.3 + 10 <= w:
            return text
    return ""


def _maps(
    regions: list[dict[str, Any]],
    blobs: dict[str, np.ndarray],
    geo: Geometry,
    size: int,
    layers: int,
) -> dict[str, Any]:
    """The three bars: the whole file, the metadata area, the blob area."""
    whole = _bar(regions, WIDTH, 4.0, 0, size)
    meta_hi = min(geo.data_offset, size)
    meta = _bar(regions, WIDTH, 3.0, 0, meta_hi) if meta_hi > 0 else []
    blob_lo = min(geo.data_offset, size)
    strip: dict[str, Any] = {
        "segments": [],
        "padding": [],
        "ticks": [],
        "labels": [],
        "detail": False,
    }
    if size > blob_lo:
        scale = WIDTH / (size - blob_lo)
        strip["segments"] = [
            {
                **p,
                "x": round((p["start"] - blob_lo) * scale, 2),
                "w": round(max((p["end"] - p["start"]) * scale, 0.0), 3),
            }
            for p in _bar(regions, WIDTH, 0.0, blob_lo, size)
        ]
        last = -1e9
        for p in strip["segments"]:
            p["text"] = _fit_label(p, p["w"])
            centre = p["x"] + p["w"] / 2
            if p["kind"] == "blobs" and p["layer"] is not None and centre - last >= 34:
                strip["labels"].append({"x": round(centre, 2), "label": str(p["layer"])})
                last = centre
        if any(p["text"] for p in strip["segments"]):
            strip["labels"] = []
        strip["padding"] = _padding_marks(blobs, blob_lo, scale, strip)
        strip["ticks"] = _ticks(blob_lo, size, scale)
    return {
        "whole": whole,
        "meta": meta,
        "meta_end": meta_hi,
        "strip": strip,
        "blob_lo": blob_lo,
        "width": WIDTH,
        "layers": layers,
        "zoom_x": _x_at(whole, blob_lo),
    }


def _x_at(bar: list[dict[str, Any]], offset: int) -> float:
    """Where byte ``offset`` falls on a bar laid out by :func:`_bar`."""
    for p in bar:
        if p["start"] <= offset < p["end"]:
            return round(p["x"] + p["w"] * (offset - p["start"]) / p["size"], 2)
    return float(WIDTH)


def _padding_marks(
    blobs: dict[str, np.ndarray], lo: int, scale: float, strip: dict[str, Any]
) -> list[dict[str, Any]]:
    """Where the padding lies: per blob for few blobs, else summed per blob-strip segment
    (drawn at each segment's end, to scale)."""
    start, end, raw = blobs["start"], blobs["end"], blobs["raw"]
    pad_start = np.minimum(start + raw, end)
    if len(start) <= BLOB_DETAIL_MAX:
        strip["detail"] = True
        return [
            {
                "x": round((int(a) - lo) * scale, 2),
                "w": round((int(b) - int(a)) * scale, 3),
                "title": f"padding of layer {int(la)} expert {int(e)}: {_num(int(b) - int(a))} "
                f"bytes at {int(a):#x}",
            }
            for a, b, la, e in zip(pad_start, end, blobs["layer"], blobs["expert"])
            if b > a
        ]
    marks = []
    for seg in strip["segments"]:
        if seg["kind"] != "blobs":
            continue
        inside = (start >= seg["start"]) & (end <= seg["end"])
        padding = int((end[inside] - pad_start[inside]).sum())
        if padding > 0:
            w = padding * scale
            marks.append(
                {
                    "x": round(seg["x"] + seg["w"] - w, 2),
                    "w": round(w, 3),
                    "title": f"{seg['label']}: {_num(padding)} bytes of padding in "
                    f"{int(inside.sum())} blobs (drawn together)",
                }
            )
    return marks


def _ticks(lo: int, hi: int, scale: float) -> list[dict[str, Any]]:
    """Byte-offset ticks at round values, at least ~90 px apart."""
    span = hi - lo
    raw_step = span / max(1, WIDTH // 90)
    step = _nice(raw_step)
    first = -(-lo // step) * step
    return [
        {"x": round((v - lo) * scale, 2), "label": human(v, 0 if v % (1 << 30) == 0 else 1)}
        for v in range(first, hi + 1, step)
    ]


def _nice(x: float) -> int:
    """The smallest 1, 2 or 5 times a power of two's decimal-ish neighbour >= x (bytes)."""
    unit = 1
    for u in (1 << 10, 1 << 20, 1 << 30, 1 << 40):
        if x >= u:
            unit = u
    for m in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1024):
        if m * unit >= x:
            return m * unit
    return math.ceil(x)


# ---- SNR from the manifest ---------------------------------------------------------------
def _manifest_snr(
    where: Path | None, size: int, geo: Geometry, table: np.ndarray | None, bits: int
) -> tuple[np.ndarray | None, str]:
    """Per table entry the three tensors' SNR (NaN: none recorded, +inf: exact), or None and
    the reason the page gives."""
    if where is None:
        return None, (
            "No integrity manifest beside this vault, so there is no SNR to show "
            "(smoe sculpt writes VAULT.manifest.json)."
        )
    if table is None:
        return None, "The expert table cannot be read, so the manifest is not used."
    try:
        doc = manifests.load(where, geo.total)
    except SmoeError as e:
        return (
            None,
            f"The manifest {valid_text(os.fsdecode(where))} cannot be used: {valid_text(str(e))}",
        )
    vault = doc["vault"]
    if vault["size"] != size or vault["experts"] != geo.total:
        return None, (
            f"The manifest {valid_text(os.fsdecode(where))} describes another file "
            f"({vault['size']} bytes, {vault['experts']} experts), so its SNR is "
            "not shown."
        )
    snr, recorded, weighted = _snr_table(doc["experts"], table)
    if not recorded:
        return None, (
            f"The manifest {valid_text(os.fsdecode(where))} records no per-tensor SNR "
            "(it was not written by smoe sculpt)."
        )
    if weighted:
        return snr, (
            f"Importance-weighted SNR (the expected SNR of each expert's output, "
            f"from the imatrix sculpt) from {valid_text(os.fsdecode(where))}."
        )
    return snr, f"SNR from {valid_text(os.fsdecode(where))}."


def _snr_table(rows: list[dict[str, Any]], table: np.ndarray) -> tuple[np.ndarray, int, int]:
    """The manifest's ``experts`` rows as SNR per table entry and tensor (NaN: none recorded,
    +inf: exact), with the count of rows of this vault that have tensors and of tensors
    whose SNR is importance-weighted."""
    index = {
        (int(la), int(e)): i
        for i, (la, e) in enumerate(zip(table["layer_id"].tolist(), table["expert_id"].tolist()))
    }
    snr = np.full((len(table), layout.TENSORS_PER_EXPERT), np.nan)
    recorded = weighted = 0
    for row in rows:
        i = index.get((row["layer"], row["expert"]))
        tensors = row.get("tensors")
        if i is None or not isinstance(tensors, list):
            continue
        recorded += 1
        for t, tensor in enumerate(tensors[: layout.TENSORS_PER_EXPERT]):
            value, is_weighted = _tensor_snr(tensor)
            weighted += is_weighted
            if not math.isnan(value):  # none recorded: an earlier row's value stays
                snr[i, t] = value
    return snr, recorded, weighted


def _tensor_snr(tensor: object) -> tuple[float, bool]:
    """One manifest tensor's SNR (NaN: none recorded, +inf: null, all zero or exactly
    representable), and whether it is the importance-weighted one."""
    if not isinstance(tensor, dict):
        return math.nan, False
    # an imatrix sculpt records the importance-weighted SNR (the expected SNR of the
    # expert's output), which is what its scales were chosen for: show that one
    weighted = _finite_number(tensor.get("weighted_snr_db"))
    key = "weighted_snr_db" if weighted else "snr_db"
    v = tensor.get(key)
    if v is None and key in tensor:
        return math.inf, weighted
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v), weighted
    return math.nan, weighted


def _finite_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def viridis(t: float) -> str:
    """The viridis colour at ``t`` in [0, 1] (linear between nine stops).

    >>> viridis(0.0), viridis(1.0), viridis(2.0)
    ('#440154', '#fde725', '#fde725')
    """
    t = min(1.0, max(0.0, t)) * (len(VIRIDIS) - 1)
    i = min(int(t), len(VIRIDIS) - 2)
    f = t - i
    a, b = VIRIDIS[i], VIRIDIS[i + 1]
    mix = [round(int(a[k : k + 2], 16) * (1 - f) + int(b[k : k + 2], 16) * f) for k in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in mix)


@dataclass(frozen=True)
class _ExpertSnr:
    """The manifest's SNR per table entry, and what the heat map derives from it."""

    snr: np.ndarray  # (entries, tensors): NaN none recorded, +inf exact
    lay_ids: np.ndarray
    exp_ids: np.ndarray
    expert_min: np.ndarray  # per entry the lowest finite SNR (+inf: no finite value)
    recorded: np.ndarray  # per entry: some SNR recorded
    exact: np.ndarray  # per entry: recorded, but no finite value
    floor: float | None  # the bit width's SNR floor
    edges: tuple[float, ...]  # the colour bands' lower edges (snr_bands)


@dataclass(frozen=True)
class _Grid:
    """The heat map's cells: one row per shown layer, one column per expert id."""

    rows: list[int]  # the layer id of each row
    cols: int
    # (rows, cols) cell codes: 0 absent, 1 unrecorded, 2 exact, 3 below floor, 4 + colour band
    code: np.ndarray
    row: np.ndarray  # per entry its row (-1: a layer not shown)
    shown: np.ndarray  # per entry: drawn in the grid
    value_code: np.ndarray  # per entry its cell code


def _snr_view(
    snr: np.ndarray, table: np.ndarray, layers: list[dict[str, Any]], max_experts: int, bits: int
) -> dict[str, Any]:
    """Heat map (cells as one path per colour), legend, histograms, worst experts."""
    s = _expert_snr(snr, table, bits)
    grid = _grid(s, [lay["layer"] for lay in layers[:MAX_ROWS]], max_experts)
    per_layer = _per_layer(s, grid.rows)
    heat = _heat(s, grid)
    if len(table) <= CELL_TITLES_MAX:
        heat["cells"] = _cell_titles(s, grid)
    else:
        heat["row_titles"] = _row_titles(grid.rows, per_layer)
    finite = s.snr[np.isfinite(s.snr)]  # clipped to ±SNR_SHOWN
    return {
        "heat": heat,
        "edges": s.edges,
        "step": s.edges[1] - s.edges[0],
        "legend": _band_legend(s, grid),
        "swatches": _swatches(s, grid, bits),
        "floor": s.floor,
        "bits": bits,
        "hists": _histograms(s, finite),
        "worst": _worst(s),
        "per_layer": per_layer,
        "recorded": int(s.recorded.sum()),
        "total": len(table),
        "tensors": int(finite.size),
    }


SNR_SHOWN = 1e4
"""The largest SNR (dB) the page draws as it is: a manifest may record any finite number,
but no quantiser gives 10,000 dB; values beyond ±SNR_SHOWN are drawn (and listed) at it."""


def _expert_snr(snr: np.ndarray, table: np.ndarray, bits: int) -> _ExpertSnr:
    snr = np.where(np.isfinite(snr), np.clip(snr, -SNR_SHOWN, SNR_SHOWN), snr)
    expert_min = np.where(np.isfinite(snr), snr, np.inf).min(axis=1)  # inf: no finite value
    recorded = ~np.isnan(snr).all(axis=1)
    return _ExpertSnr(
        snr=snr,
        lay_ids=table["layer_id"].astype(np.int64),
        exp_ids=table["expert_id"].astype(np.int64),
        expert_min=expert_min,
        recorded=recorded,
        exact=recorded & ~np.isfinite(expert_min),
        floor=SNR_FLOOR_DB.get(bits),
        edges=snr_bands(bits),
    )


def _grid(s: _ExpertSnr, rows: list[int], max_experts: int) -> _Grid:
    """Each entry's cell and code (a colour bin of its lowest SNR, or why it has none)."""
    exp_ids = s.exp_ids
    row_of = {v: i for i, v in enumerate(rows)}
    cols = int(min(MAX_COLS, max(max_experts, int(exp_ids.max()) + 1 if len(exp_ids) else 1)))
    code = np.zeros((len(rows), cols), np.int64)
    r = np.array([row_of.get(int(v), -1) for v in s.lay_ids.tolist()], np.int64)
    shown = (r >= 0) & (exp_ids < cols)
    bands = np.maximum(_bands_of(s.expert_min, s.edges), 0)  # below the floor: code 3 below
    value_code = np.where(~s.recorded, 1, np.where(s.exact, 2, 4 + bands))
    if s.floor is not None:
        value_code = np.where(s.recorded & ~s.exact & (s.expert_min < s.floor), 3, value_code)
    code[r[shown], exp_ids[shown]] = value_code[shown]
    return _Grid(rows=rows, cols=cols, code=code, row=r, shown=shown, value_code=value_code)


def _heat(s: _ExpertSnr, g: _Grid) -> dict[str, Any]:
    """The heat map's geometry, its cells as paths, its axes (tooltips are added after)."""
    fills = {0: ABSENT, 1: UNRECORDED, 2: EXACT, 3: BELOW_FLOOR}
    fills.update({4 + b: band_colour(b) for b in range(SNR_BANDS)})
    rows, cols = len(g.rows), g.cols
    cw = int(min(44, max(2, (WIDTH - 60) // cols)))
    ch = cw if rows * cw <= 900 else int(max(2, 900 // max(1, rows)))
    ox, oy = 52, 30
    step = _tick_step(rows, ch, 14)
    return {
        "cols": cols,
        "rows": rows,
        "cw": cw,
        "ch": ch,
        "ox": ox,
        "oy": oy,
        "paths": _cell_paths(g.code, fills),
        "cells": [],
        "row_titles": [],
        "xticks": _axis_ticks(cols, cw, 26),
        "yticks": [{"y": i * ch + ch / 2, "label": g.rows[i]} for i in range(0, rows, step)],
        "hidden": int((~g.shown).sum()),
        "w": ox + cols * cw + 8,
        "h": oy + rows * ch + 8,
    }


def _cell_titles(s: _ExpertSnr, g: _Grid) -> list[dict[str, Any]]:
    """A tooltip per drawn cell: the expert's three SNRs."""
    names = TENSOR_NAMES
    cells = []
    for i in np.flatnonzero(g.shown).tolist():
        vals = ", ".join(
            f"{names[k].split('_')[0]} {_db(s.snr[i, k])}" for k in range(s.snr.shape[1])
        )
        cells.append(
            {
                "x": int(s.exp_ids[i]),
                "y": int(g.row[i]),
                "title": f"layer {int(s.lay_ids[i])} expert {int(s.exp_ids[i])}: {vals}",
            }
        )
    return cells


def _per_layer(s: _ExpertSnr, rows: list[int]) -> dict[int, dict[str, Any]]:
    """Per shown layer: its lowest and mean SNR, where the lowest is, how many are low."""
    return {lay: _layer_snr(s, lay) for lay in rows}


def _layer_snr(s: _ExpertSnr, lay: int) -> dict[str, Any]:
    sel = s.lay_ids == lay
    vals = s.snr[sel]
    fin = vals[np.isfinite(vals)]
    if not fin.size:
        return {"min": None, "mean": None, "worst": None, "low": 0}
    m = np.where(np.isfinite(vals), vals, np.inf)
    at = np.unravel_index(int(np.argmin(m)), m.shape)
    worst = int(s.exp_ids[np.flatnonzero(sel)[at[0]]])
    low = int((s.expert_min[sel] < s.floor).sum()) if s.floor is not None else 0
    return {
        "min": float(fin.min()),
        "mean": float(fin.mean()),
        "worst": f"expert {worst} {TENSOR_NAMES[at[1]]}",
        "low": low,
    }


def _row_titles(rows: list[int], per_layer: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """A tooltip per heat-map row (for vaults too large for one per cell)."""
    titles = []
    for i, lay in enumerate(rows):
        p = per_layer[lay]
        text = (
            f"layer {lay}: lowest {_db(p['min'])} ({p['worst']}), mean {_db(p['mean'])}"
            if p["min"] is not None
            else f"layer {lay}: no SNR recorded"
        )
        titles.append({"y": i, "title": text})
    return titles


def _swatches(s: _ExpertSnr, g: _Grid, bits: int) -> list[dict[str, Any]]:
    """The legend's keys besides the colour scale, with their counts (below the floor
    always, the others when they occur)."""
    floor = s.floor
    keys = [
        (BELOW_FLOOR, f"below the Q{bits} floor ({floor:g} dB)", int((g.value_code == 3).sum()))
        if floor is not None
        else None,
        (EXACT, "exact (all-zero tensors, no finite SNR)", int(s.exact.sum())),
        (UNRECORDED, "no SNR in the manifest", int((~s.recorded).sum())),
        (ABSENT, "not in this vault", int((g.code == 0).sum())),
    ]
    return [
        {"fill": f, "label": lab, "count": n}
        for f, lab, n in (k for k in keys if k is not None)
        if n or f == BELOW_FLOOR
    ]


def _histograms(s: _ExpertSnr, finite: np.ndarray) -> list[dict[str, Any]]:
    """One histogram per tensor kind, all over the same span."""
    if finite.size:
        h_lo, h_hi = _widen(float(finite.min()), float(finite.max()))
    else:
        h_lo, h_hi = s.edges[0], s.edges[-1]
    return [
        _histogram(s.snr[:, k], TENSOR_NAMES[k], (h_lo, h_hi), s.edges, s.floor)
        for k in range(s.snr.shape[1])
    ]


def _worst(s: _ExpertSnr) -> list[dict[str, Any]]:
    """The (up to) eight experts of lowest SNR, and their worst tensor."""
    order = np.argsort(np.where(np.isfinite(s.expert_min), s.expert_min, np.inf), kind="stable")
    worst_rows = []
    for i in order[:8].tolist():
        if not np.isfinite(s.expert_min[i]):
            break
        k = int(np.nanargmin(np.where(np.isfinite(s.snr[i]), s.snr[i], np.nan)))
        worst_rows.append(
            {
                "layer": int(s.lay_ids[i]),
                "expert": int(s.exp_ids[i]),
                "tensor": TENSOR_NAMES[k],
                "snr": float(s.expert_min[i]),
                "low": s.floor is not None and s.expert_min[i] < s.floor,
            }
        )
    return worst_rows


def _cell_paths(code: np.ndarray, fills: dict[int, str]) -> list[dict[str, str]]:
    """One SVG path per cell code: a rectangle per run of equal codes along each row, in
    cell units (the template scales them)."""
    pieces: dict[int, list[str]] = {}
    for y, row in enumerate(code.tolist()):
        x = 0
        n = len(row)
        while x < n:
            c = row[x]
            e = x + 1
            while e < n and row[e] == c:
                e += 1
            pieces.setdefault(c, []).append(f"M{x} {y}h{e - x}v1h-{e - x}z")
            x = e
    return [{"fill": fills[c], "d": "".join(p)} for c, p in sorted(pieces.items())]


def _tick_step(n: int, cell: float, spacing: float) -> int:
    for step in (1, 2, 4, 5, 8, 10, 16, 20, 32, 50, 64, 100, 128, 256, 512, 1024):
        if step * cell >= spacing:
            return step
    return max(1, n)


def _axis_ticks(n: int, cell: float, spacing: float) -> list[dict[str, Any]]:
    step = _tick_step(n, cell, spacing)
    return [{"x": i * cell + cell / 2, "label": i} for i in range(0, n, step)]


def snr_bands(bits: int) -> tuple[float, ...]:
    """The lower edges (dB) of the heat map's :data:`SNR_BANDS` colour bands at ``bits``:
    from the width's floor (``smoe.quant.SNR_FLOOR_DB``) up in steps of
    :data:`SNR_BAND_STEP_DB`; the last band is open upwards. Fixed per width, whatever the
    vault's SNR; a width without a floor gets :data:`OTHER_BANDS`.

    >>> snr_bands(4)
    (10.0, 11.5, 13.0, 14.5, 16.0, 17.5, 19.0)
    >>> snr_bands(2)
    (2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5)
    >>> snr_bands(3)
    (0.0, 3.0, 6.0, 9.0, 12.0, 15.0, 18.0)
    """
    lowest = SNR_FLOOR_DB.get(bits, OTHER_BANDS[0])
    step = SNR_BAND_STEP_DB.get(bits, OTHER_BANDS[1])
    return tuple(lowest + i * step for i in range(SNR_BANDS))


def snr_band(snr: float, bits: int) -> int:
    """The colour band of an expert whose lowest SNR is ``snr`` dB at ``bits``: 0 to
    ``SNR_BANDS - 1`` (everything from the last edge up takes the last), -1 below the floor
    (drawn red; a width without a floor puts it in band 0). It depends on ``snr`` and
    ``bits`` only, never on the other experts.

    >>> [snr_band(v, 4) for v in (9.99, 10.0, 11.49, 11.5, 18.9, 19.0, 20.5, 60.0)]
    [-1, 0, 0, 1, 5, 6, 6, 6]
    >>> [snr_band(v, 2) for v in (2.4, 2.5, 7.3, 9.5)]
    [-1, 0, 4, 6]
    """
    band = int(_bands_of(np.array([snr], np.float64), snr_bands(bits))[0])
    return band if bits in SNR_FLOOR_DB else max(band, 0)


def _bands_of(values: np.ndarray, edges: tuple[float, ...]) -> np.ndarray:
    """Per value the index of the last edge at or below it (-1 below the first; +inf takes
    the last band, NaN -1)."""
    found = np.searchsorted(np.asarray(edges, np.float64), values, side="right") - 1
    return np.where(np.isnan(values), -1, found).astype(np.int64)


def band_colour(band: int) -> str:
    """The fill of colour band ``band`` (:func:`snr_band`): viridis from dark (the floor)
    to yellow (the top band); below the floor is red.

    >>> band_colour(0), band_colour(SNR_BANDS - 1), band_colour(-1) == BELOW_FLOOR
    ('#440154', '#fde725', True)
    """
    return BELOW_FLOOR if band < 0 else viridis(band / (SNR_BANDS - 1))


def _band_legend(s: _ExpertSnr, g: _Grid) -> list[dict[str, Any]]:
    """The legend's boxes: below the floor (when there is one), then each band, with the
    band's range as its label and tooltip, and how many experts it holds."""
    w = 54
    boxes: list[dict[str, Any]] = []
    bands = np.where(g.value_code >= 4, g.value_code - 4, -2)  # -2: not a coloured cell
    if s.floor is not None:
        n = int((g.value_code == 3).sum())
        boxes.append(
            {
                "fill": BELOW_FLOOR,
                "label": f"< {s.floor:g}",
                "title": f"below the floor, {s.floor:g} dB: {_experts(n)}",
            }
        )
    for b, lo in enumerate(s.edges):
        n = int((bands == b).sum())
        if b + 1 < len(s.edges):
            label = f"{lo:g}–{s.edges[b + 1]:g}"
            title = f"{lo:g} dB up to {s.edges[b + 1]:g} dB: {_experts(n)}"
        else:
            label, title = f"≥ {lo:g}", f"{lo:g} dB and above: {_experts(n)}"
        boxes.append({"fill": band_colour(b), "label": label, "title": title})
    for i, box in enumerate(boxes):
        box["x"], box["w"] = i * w, w
    return boxes


def _widen(lo: float, hi: float, least: float = 0.5) -> tuple[float, float]:
    if hi - lo < least:
        mid = (lo + hi) / 2
        return mid - least / 2, mid + least / 2
    return lo, hi


def _legend_ticks(lo: float, hi: float, width: float) -> list[dict[str, Any]]:
    out = []
    digits = 2 if hi - lo < 2 else 1
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        out.append({"x": width * i / 4, "label": f"{v:.{digits}f}"})
    return out


def _histogram(
    values: np.ndarray,
    name: str,
    span: tuple[float, float],
    bands: tuple[float, ...],
    floor: float | None,
) -> dict[str, Any]:
    """Bars over ``span`` (the same for every tensor kind), coloured like the heat map
    (each bar by the colour band, of lower edges ``bands``, its middle falls in); below the
    floor in red."""
    w, h, head = 340, 120, 14
    lo, hi = span
    fin = values[np.isfinite(values)]
    counts, edges = np.histogram(fin, bins=HIST_BINS, range=(lo, hi))
    top = max(1, int(counts.max()) if counts.size else 1)
    bw = w / HIST_BINS
    bars = []
    for i, n in enumerate(counts.tolist()):
        if not n:
            continue
        bh = max(1.5, (h - head) * n / top)
        mid = (edges[i] + edges[i + 1]) / 2
        band = int(_bands_of(np.array([mid]), bands)[0])
        fill = band_colour(band if floor is not None else max(band, 0))
        bars.append(
            {
                "x": round(i * bw + 0.5, 2),
                "w": round(bw - 1, 2),
                "y": round(h - bh, 2),
                "h": round(bh, 2),
                "fill": fill,
                "title": f"{name}: {n} tensors with SNR {edges[i]:.2f}..{edges[i + 1]:.2f} dB",
            }
        )
    floor_x = (w * (floor - lo) / (hi - lo)) if floor is not None and lo <= floor <= hi else None
    return {
        "name": name,
        "bars": bars,
        "w": w,
        "h": h,
        "top": top,
        "floor_x": floor_x,
        "n": int(fin.size),
        "exact": int(np.isposinf(values).sum()),
        "min": float(fin.min()) if fin.size else None,
        "median": float(np.median(fin)) if fin.size else None,
        "max": float(fin.max()) if fin.size else None,
        "low": int((fin < floor).sum()) if floor is not None else 0,
        "ticks": _legend_ticks(lo, hi, w),
    }


# ---- text helpers --------------------------------------------------------------------------
def _db(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if math.isinf(v):
        return "exact"
    return f"{v:.2f} dB"


def _experts(n: int) -> str:
    return f"{_num(n)} expert{'' if n == 1 else 's'}"


def _num(v: int | float) -> str:
    return f"{int(v):,}"


def human(n: int | float, digits: int = 1) -> str:
    """Bytes in IEC units.

    >>> human(64), human(16384), human(120_647_139_328)
    ('64 B', '16.0 KiB', '112.4 GiB')
    """
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1024
    return f"{n:.{digits}f} TiB"
