"""The report's fixed sizes, limits and colours (one place for the page's look)."""

from __future__ import annotations

import os

from smoe.interop.safetensors_io import DTYPE_SIZES
from smoe.plumbing.atomic import Signature
from smoe.quant import SNR_FLOOR_DB

__all__ = [
    "ABSENT",
    "BELOW_FLOOR",
    "BF16_BYTES",
    "BLOB_DETAIL_MAX",
    "CELL_TITLES_MAX",
    "EXACT",
    "GENERATOR",
    "HIST_BINS",
    "MAX_COLS",
    "MAX_ROWS",
    "MAX_RUNS",
    "MIXED",
    "OTHER_BANDS",
    "REGION_COLOURS",
    "REPORT_SIGNATURE",
    "SCHEMA",
    "SNR_BANDS",
    "SNR_BAND_STEP_DB",
    "SNR_GAUSSIAN_DB",
    "TEMPLATE",
    "UNKNOWN_ARCH",
    "UNKNOWN_TABLE",
    "UNKNOWN_V1",
    "UNKNOWN_WHY",
    "UNRECORDED",
    "UNUSED",
    "VIRIDIS",
    "WIDTH",
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
