"""Descriptor rules (and the shape rules of experts and layers), vectorised over the
descriptors of a range of experts.

Order: a check that finds a slice it cannot trust clears it in ``ok`` (tensor type, rows,
cols, packed and scales sizes, slice bounds); the slice overlap check, after all of them,
compares only the slices of experts whose every slice passed, and leaves the experts that
pass it too in ``sound`` (what a deep check may read).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import cast

import numpy as np

from smoe.format.verify.report import Collector, EntryOffsets, Report
from smoe.format.verify.rules import Section
from smoe.format.view import Geometry
from smoe_gen import layout
from smoe_gen.layout import Rule

__all__ = ["DESCRIPTORS", "check_descriptors"]

_K = layout.TENSORS_PER_EXPERT
_AT = layout.TENSOR_DESCRIPTOR_OFFSETS


class _Descriptors:
    """What the descriptor rules read: experts ``lo..`` of the table, their descriptors
    (``flat``: one row per descriptor), the header, the arch block (or None)."""

    def __init__(
        self,
        table: np.ndarray,
        descs: np.ndarray,
        geo: Geometry,
        header: np.void,
        arch: np.void | None,
        lo: int,
        report: Report,
    ) -> None:
        self.c = Collector(report)
        self.table, self.descs, self.geo = table, descs, geo
        self.header, self.arch, self.lo = header, arch, lo
        self.n = n = len(table)
        self.flat = descs.reshape(-1)
        self.rows, self.cols = self.flat["rows"], self.flat["cols"]
        self.slot: np.ndarray = np.tile(np.arange(_K, dtype=np.uint8), n)
        entry: np.ndarray = lo + np.arange(n * _K, dtype=np.int64) // _K
        self.base = layout.descriptor_offset(geo.total, entry, self.slot)
        self.bits_ok = geo.bits in layout.SUPPORTED_BITS
        self.ok = np.ones(n * _K, bool)  # the slices no check has distrusted yet
        self.sound = np.zeros(n, bool)  # set by the slice overlap check

    def at(self, name: str) -> np.ndarray:
        """Absolute offset of field ``name`` of every descriptor."""
        return self.base + _AT[name]

    def path(self, name: str) -> Callable[[int], str]:
        return lambda i: f"experts[{self.lo + i // _K}].tensors[{i % _K}].{name}"

    @cached_property
    def raw(self) -> np.ndarray:
        """The raw_size of each descriptor's blob."""
        return np.repeat(self.table["raw_size"], _K)

    @cached_property
    def weights(self) -> np.ndarray:
        """rows * cols of every descriptor (< 2**64)."""
        return self.rows.astype(np.uint64) * self.cols.astype(np.uint64)

    @cached_property
    def entries(self) -> np.ndarray:
        """The table index of every expert."""
        return self.lo + np.arange(self.n)

    @cached_property
    def gate_at(self) -> np.ndarray:
        """Absolute offset of every expert's gate_proj descriptor."""
        return layout.descriptor_offset(self.geo.total, self.entries, np.zeros_like(self.entries))

    @cached_property
    def up_ok(self) -> np.ndarray:
        """Experts whose up_proj has gate_proj's shape."""
        rows, cols = self.descs["rows"], self.descs["cols"]
        return (rows[:, 1] == rows[:, 0]) & (cols[:, 1] == cols[:, 0])

    @cached_property
    def shape_ok(self) -> np.ndarray:
        """Experts whose up_proj has gate_proj's shape, and down_proj its transpose."""
        rows, cols = self.descs["rows"], self.descs["cols"]
        return self.up_ok & (rows[:, 2] == cols[:, 0]) & (cols[:, 2] == rows[:, 0])


DESCRIPTORS: Section[_Descriptors] = Section("descriptors")
"""The descriptor rules, in the order they run."""


def check_descriptors(
    table: np.ndarray,
    descs: np.ndarray,
    geo: Geometry,
    report: Report,
    header: np.void,
    arch: np.void | None,
    lo: int = 0,
    hi: int | None = None,
) -> np.ndarray:
    """Descriptor rules for experts lo..hi (default all) of the arrays from ``table_views``;
    returns the mask of experts whose slices are all sound.

    >>> from smoe.format.verify.header import check_header
    >>> from smoe.format.view import FileView, header_view, table_views
    >>> with FileView.open("fixtures/corrupt/packed_size_mismatch.smoe") as view:
    ...     report = Report(size=len(view))
    ...     geo = check_header(view, report)
    ...     table, descs = table_views(view, geo)
    ...     sound = check_descriptors(table, descs, geo, report, header_view(view), None)
    >>> sound.tolist(), [f.path for f in report.errors]
    ([False, True, True, True, True, True, True, True], ['experts[0].tensors[0].packed_size'])
    """
    f = _Descriptors(table[lo:hi], descs[lo:hi], geo, header, arch, lo, report)
    DESCRIPTORS.run(f)
    return f.sound


@DESCRIPTORS.rule(Rule.DESCRIPTOR_TENSOR_TYPE)
def _tensor_type(f: _Descriptors) -> None:
    bad = f.flat["tensor_type"] != f.slot
    f.c.many(
        Rule.DESCRIPTOR_TENSOR_TYPE,
        bad,
        f.at("tensor_type"),
        f.path("tensor_type"),
        "descriptors must come in the order gate, up, down",
        f.slot,
        f.flat["tensor_type"],
    )
    f.ok &= ~bad


@DESCRIPTORS.rule(Rule.DESCRIPTOR_NDIM)
def _ndim(f: _Descriptors) -> None:
    f.c.many(
        Rule.DESCRIPTOR_NDIM,
        f.flat["ndim"] != layout.TENSOR_NDIM,
        f.at("ndim"),
        f.path("ndim"),
        "ndim must be 2",
        layout.TENSOR_NDIM,
        f.flat["ndim"],
    )


@DESCRIPTORS.rule(Rule.DESCRIPTOR_RESERVED)
def _reserved(f: _Descriptors) -> None:
    reserved = f.flat["reserved_0"]
    f.c.many(
        Rule.DESCRIPTOR_RESERVED,
        reserved.any(axis=1),
        f.at("reserved_0") + reserved.argmax(axis=1),
        f.path("reserved_0"),
        "reserved bytes must be zero",
    )


@DESCRIPTORS.rule(Rule.DESCRIPTOR_ROWS)
def _rows(f: _Descriptors) -> None:
    bad = f.rows == 0
    f.c.many(
        Rule.DESCRIPTOR_ROWS,
        bad,
        f.at("rows"),
        f.path("rows"),
        "rows must be at least 1",
        ">= 1",
        f.rows,
    )
    f.ok &= ~bad


@DESCRIPTORS.rule(Rule.DESCRIPTOR_COLS)
def _cols(f: _Descriptors) -> None:
    rows, cols = f.rows, f.cols
    f.c.many(
        Rule.DESCRIPTOR_COLS,
        cols == 0,
        f.at("cols"),
        f.path("cols"),
        "cols must be at least 1",
        ">= 1",
        cols,
    )
    empty = (rows == 0) | (cols == 0)
    f.ok &= ~empty
    if not f.bits_ok:
        return
    # the codes fit in the blob (division: no overflow)
    room = f.raw * np.uint64(8) // np.uint64(f.geo.bits) // np.maximum(rows, 1).astype(np.uint64)
    bad = ~empty & (cols > room)
    f.c.many(
        Rule.DESCRIPTOR_COLS,
        bad,
        f.at("cols"),
        f.path("cols"),
        "the matrix's codes do not fit in the blob's raw_size",
        room,
        cols,
    )
    f.ok &= ~bad


@DESCRIPTORS.rule(Rule.DESCRIPTOR_PACKED_SIZE)
def _packed_size(f: _Descriptors) -> None:
    if not f.bits_ok:
        return
    want = layout.packed_size(f.weights, f.geo.bits)
    bad = f.flat["packed_size"] != want
    f.c.many(
        Rule.DESCRIPTOR_PACKED_SIZE,
        bad,
        f.at("packed_size"),
        f.path("packed_size"),
        "packed_size must be ceil(rows * cols * bits / 8)",
        want,
        f.flat["packed_size"],
    )
    f.ok &= ~bad


@DESCRIPTORS.rule(Rule.DESCRIPTOR_SCALES_SIZE)
def _scales_size(f: _Descriptors) -> None:
    if not f.bits_ok:
        return
    want = layout.scales_size(f.weights)
    bad = f.flat["scales_size"] != want
    f.c.many(
        Rule.DESCRIPTOR_SCALES_SIZE,
        bad,
        f.at("scales_size"),
        f.path("scales_size"),
        f"scales_size must be ceil(rows * cols / {layout.GROUP_SIZE}) * {layout.SCALE_BYTES}",
        want,
        f.flat["scales_size"],
    )
    f.ok &= ~bad


@DESCRIPTORS.rule(Rule.ENTRY_NUM_GROUPS)
def _num_groups(f: _Descriptors) -> None:
    if not f.bits_ok:
        return
    sums = layout.num_groups(f.weights).reshape(f.n, _K).sum(axis=1, dtype=np.uint64)
    f.c.many(
        Rule.ENTRY_NUM_GROUPS,
        f.table["num_groups"] != sums,
        EntryOffsets("num_groups", f.lo),
        lambda i: f"experts[{f.lo + i}].num_groups",
        f"num_groups must be the sum of ceil(rows * cols / {layout.GROUP_SIZE}) over the "
        "three tensors",
        sums,
        f.table["num_groups"],
    )


@DESCRIPTORS.rule(Rule.DESCRIPTOR_SLICE_BOUNDS)
def _slice_bounds(f: _Descriptors) -> None:
    raw = f.raw
    for what in ("packed", "scales"):
        o, s = f.flat[f"{what}_offset"], f.flat[f"{what}_size"]
        out = (o > raw) | (s > raw - np.minimum(o, raw))

        def outside(i: int, o: np.ndarray = o, s: np.ndarray = s, what: str = what) -> str:
            return f"{what} slice [{o[i]}, +{s[i]}) lies outside the blob's raw_size {raw[i]}"

        f.c.many(
            Rule.DESCRIPTOR_SLICE_BOUNDS,
            out,
            f.at(f"{what}_offset"),
            f.path(f"{what}_offset"),
            outside,
            None,
            o,
        )
        f.ok &= ~out


@DESCRIPTORS.rule(Rule.DESCRIPTOR_SLICE_OVERLAP)
def _slice_overlap(f: _Descriptors) -> None:
    """Slices of one expert must not overlap each other (runs after every check that
    clears ``ok``: it compares only the slices of experts that passed them)."""
    # all(axis=1) of a 2-D array is an array (numpy's stubs also allow a scalar)
    exp_ok = cast(np.ndarray, f.ok.reshape(f.n, _K).all(axis=1))
    if exp_ok.any():
        d = f.descs
        starts = np.stack([d["packed_offset"], d["scales_offset"]], axis=2).reshape(f.n, -1)
        sizes = np.stack([d["packed_size"], d["scales_size"]], axis=2).reshape(f.n, -1)
        order = np.argsort(starts, axis=1, kind="stable")
        s_sorted = np.take_along_axis(starts, order, axis=1)
        e_sorted = s_sorted + np.take_along_axis(sizes, order, axis=1)
        hit = s_sorted[:, 1:] < e_sorted[:, :-1]
        overl = hit.any(axis=1) & exp_ok
        # Name the slice that starts inside its predecessor: slot j = tensor j // 2, part j % 2.
        culprit = np.take_along_axis(order, hit.argmax(axis=1)[:, None] + 1, axis=1)[:, 0]
        parts = ("packed_offset", "scales_offset")
        parts_at = np.array([_AT[p] for p in parts])
        where = (
            layout.descriptor_offset(f.geo.total, f.entries, culprit // 2) + parts_at[culprit % 2]
        )
        f.c.many(
            Rule.DESCRIPTOR_SLICE_OVERLAP,
            overl,
            where,
            lambda i: f"experts[{f.lo + i}].tensors[{culprit[i] // 2}].{parts[culprit[i] % 2]}",
            "this slice overlaps another of the expert",
        )
        exp_ok &= ~overl
    f.sound = exp_ok


@DESCRIPTORS.rule(Rule.DESCRIPTOR_SHAPE)
def _shape(f: _Descriptors) -> None:
    if f.n == 0:
        return
    rows, cols = f.descs["rows"], f.descs["cols"]
    bad_t = np.where(f.up_ok, 2, 1)  # the first tensor that does not fit the gate (D3)
    f.c.many(
        Rule.DESCRIPTOR_SHAPE,
        ~f.shape_ok,
        layout.descriptor_offset(f.geo.total, f.entries, bad_t) + _AT["rows"],
        lambda i: f"experts[{f.lo + i}].tensors[{bad_t[i]}].rows",
        lambda i: (
            f"shapes gate {rows[i, 0]}x{cols[i, 0]}, up {rows[i, 1]}x{cols[i, 1]}, "
            f"down {rows[i, 2]}x{cols[i, 2]}: up must equal gate and down its transpose"
        ),
    )
    d_model = int(f.header["d_model"])
    f.c.many(
        Rule.DESCRIPTOR_SHAPE,
        f.shape_ok & (cols[:, 0] != d_model),
        f.gate_at + _AT["cols"],
        lambda i: f"experts[{f.lo + i}].tensors[0].cols",
        "gate_proj columns must equal d_model",
        d_model,
        cols[:, 0],
    )


@DESCRIPTORS.rule(Rule.LAYER_SHAPE)
def _layer_shape(f: _Descriptors) -> None:
    if f.n == 0:
        return
    rows, cols = f.descs["rows"], f.descs["cols"]
    layer = f.table["layer_id"]
    first = np.r_[True, layer[1:] != layer[:-1]]
    # Compare each entry with the first entry of its (sorted) layer run.
    run = np.maximum.accumulate(np.where(first, np.arange(f.n), 0))
    differ = (rows[:, 0] != rows[run, 0]) | (cols[:, 0] != cols[run, 0])
    f.c.many(
        Rule.LAYER_SHAPE,
        differ,
        f.gate_at + _AT["rows"],
        lambda i: f"experts[{f.lo + i}].tensors[0].rows",
        lambda i: (
            f"layer {layer[i]}: shape {rows[i, 0]}x{cols[i, 0]} differs from the "
            f"layer's first expert {rows[run[i], 0]}x{cols[run[i], 0]}"
        ),
    )


@DESCRIPTORS.rule(Rule.ARCH_MOE_FFN_DIM)
def _moe_ffn_dim(f: _Descriptors) -> None:
    arch = f.arch
    if f.n == 0 or arch is None or bytes(arch["magic"]) != layout.ARCH_MAGIC:
        return
    moe = int(arch["moe_ffn_dim"])
    rows = f.descs["rows"]
    mism = np.flatnonzero(f.shape_ok & (rows[:, 0] != moe))
    if len(mism):
        i = int(mism[0])
        f.c.one(
            Rule.ARCH_MOE_FFN_DIM,
            f.geo.reserved_ext + layout.ARCH_BLOCK_OFFSETS["moe_ffn_dim"],
            "arch.moe_ffn_dim",
            f"disagrees with the descriptors ({len(mism)} experts); shapes win",
            int(rows[i, 0]),
            moe,
        )
