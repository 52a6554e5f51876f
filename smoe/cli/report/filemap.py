"""The map of the file: every region, blobs coloured by layer, at a readable width."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from smoe.cli.report.constants import (
    BLOB_DETAIL_MAX,
    MAX_RUNS,
    MIXED,
    REGION_COLOURS,
    UNUSED,
    WIDTH,
)
from smoe.cli.report.layers import layer_colour
from smoe.cli.report.text import fmt_num, human
from smoe.format.view import Geometry
from smoe_gen import layout

__all__ = ["fit_widths"]


def file_regions(geo: Geometry, blobs: dict[str, np.ndarray], size: int) -> list[dict[str, Any]]:
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
            f"{p['label']}: {fmt_num(p['start'])}..{fmt_num(p['end'])} "
            f"({p['start']:#x}), {fmt_num(p['size'])} bytes ({human(p['size'])})"
        )
        x += w
    return parts


def _fit_label(p: dict[str, Any], w: float) -> str:
    for text in (p["label"], p["label"].replace(" blobs", "").replace("layer ", "L")):
        if len(text) * 6.3 + 10 <= w:
            return text
    return ""


def file_maps(
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
                "title": f"padding of layer {int(la)} expert {int(e)}: {fmt_num(int(b) - int(a))} "
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
                    "title": f"{seg['label']}: {fmt_num(padding)} bytes of padding in "
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
