"""The blobs and the layers of a vault: per-layer sizes and colours."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from smoe.cli.report.constants import MAX_ROWS

__all__ = ["layer_colour"]


def blob_columns(table: np.ndarray | None, size: int) -> dict[str, np.ndarray]:
    """Blob columns in file order (start clipped to the file, end clipped too)."""
    if table is None or not len(table):
        z = np.zeros(0, np.int64)
        return {"layer": z, "expert": z, "start": z, "end": z, "raw": z, "padded": z}
    order = np.argsort(table["byte_offset"], kind="stable")
    start = clip_column(table["byte_offset"][order], size)
    padded = clip_column(table["padded_size"][order], size)
    return {
        "layer": table["layer_id"][order].astype(np.int64),
        "expert": table["expert_id"][order].astype(np.int64),
        "start": start,
        "end": np.minimum(start + padded, size),
        "padded": padded,
        "raw": clip_column(table["raw_size"][order], size),
    }


def clip_column(column: np.ndarray, size: int) -> np.ndarray:
    """An unsigned column clipped to ``size`` as int64 (sums of two cannot overflow)."""
    return np.minimum(column.astype(np.uint64), np.uint64(size)).astype(np.int64)


def layer_rows(
    table: np.ndarray | None, descs: np.ndarray | None, size: int
) -> list[dict[str, Any]]:
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
