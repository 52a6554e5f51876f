"""Per-expert SNR from the integrity manifest: the heat map, its bands, the histograms, the
worst experts."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smoe.cli.console import valid_text
from smoe.cli.report.constants import (
    ABSENT,
    BELOW_FLOOR,
    CELL_TITLES_MAX,
    EXACT,
    HIST_BINS,
    MAX_COLS,
    MAX_ROWS,
    OTHER_BANDS,
    SNR_BAND_STEP_DB,
    SNR_BANDS,
    UNRECORDED,
    VIRIDIS,
    WIDTH,
)
from smoe.cli.report.text import experts_text, fmt_db
from smoe.errors import SmoeError
from smoe.format import manifest as manifests
from smoe.format.view import Geometry
from smoe.quant import SNR_FLOOR_DB
from smoe_gen import layout
from smoe_gen.layout import TENSOR_NAMES

__all__ = ["band_colour", "snr_band", "snr_bands", "viridis"]


def manifest_snr(
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


def snr_view(
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
            f"{names[k].split('_')[0]} {fmt_db(s.snr[i, k])}" for k in range(s.snr.shape[1])
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
            f"layer {lay}: lowest {fmt_db(p['min'])} ({p['worst']}), mean {fmt_db(p['mean'])}"
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
                "title": f"below the floor, {s.floor:g} dB: {experts_text(n)}",
            }
        )
    for b, lo in enumerate(s.edges):
        n = int((bands == b).sum())
        if b + 1 < len(s.edges):
            label = f"{lo:g}–{s.edges[b + 1]:g}"
            title = f"{lo:g} dB up to {s.edges[b + 1]:g} dB: {experts_text(n)}"
        else:
            label, title = f"≥ {lo:g}", f"{lo:g} dB and above: {experts_text(n)}"
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
