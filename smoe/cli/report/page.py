"""What the page shows: the context the template renders (summary, figures, fields, findings)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from smoe.cli.console import valid_text
from smoe.cli.report.constants import (
    BF16_BYTES,
    UNKNOWN_ARCH,
    UNKNOWN_TABLE,
    UNKNOWN_V1,
    UNKNOWN_WHY,
)
from smoe.cli.report.filemap import file_maps, file_regions
from smoe.cli.report.layers import blob_columns, clip_column, layer_rows
from smoe.cli.report.snr import manifest_snr, snr_view
from smoe.cli.report.text import fmt_num, human
from smoe.format.findings import Finding, Value, display
from smoe.format.provenance import notable, read_provenance
from smoe.format.provenance import rows as provenance_rows
from smoe.format.records import model_type_str
from smoe.format.verify import Report
from smoe.format.view import FileView, Geometry, arch_view, header_view, table_views
from smoe_gen import layout

__all__ = ["activation_name", "collect", "figures"]


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
        ("file size", human(size), f"{fmt_num(size)} bytes"),
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
    blobs = blob_columns(table, size)
    layers = layer_rows(table, descs, size)
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
    regions = file_regions(geo, blobs, size)
    ctx["regions"] = [r for r in regions if r["kind"] != "blobs"]
    ctx["maps"] = file_maps(regions, blobs, geo, size, distinct)
    bits = int(h["bits"])
    snr, ctx["snr_note"] = manifest_snr(manifest, size, geo, table, bits)
    if snr is not None and table is not None:
        ctx["snr"] = snr_view(snr, table, layers, int(h["max_experts_per_layer"]), bits)
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
        else f"partial: {fmt_num(geo.total)} of {fmt_num(width)}"
    )
    padded, raw = int(blobs["padded"].sum()), int(blobs["raw"].sum())
    model = f"d_model {int(h['d_model'])}"
    if arch is not None:
        model += f" · top-{int(arch['moe_top_k'])} of {int(h['max_experts_per_layer'])}"
    return [
        ("experts", fmt_num(geo.total), kind),
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
        np.add.at(raw_of, inverse, clip_column(table["raw_size"], size))
        np.add.at(pad_of, inverse, clip_column(table["padded_size"], size))
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
            ("expert weights", fmt_num(f["weights"]), f"BF16: {human(f['bf16'])}"),
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
                f"{fmt_num(tok['blobs'])} blobs (top-{tok['top_k']} × {fmt_num(tok['layers'])} "
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
