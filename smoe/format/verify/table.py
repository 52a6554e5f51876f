"""Expert table rules, vectorised over the whole table (read once).

Order: the blob bounds check leaves the mask of entries whose blob lies inside the file
(``inside``); the overlap and gap checks, after it, read only those entries.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np

from smoe.format.verify.report import Collector, EntryOffsets, Report
from smoe.format.verify.rules import Section
from smoe.format.view import Geometry
from smoe_gen import layout
from smoe_gen.layout import Rule

__all__ = ["TABLE", "check_table"]

_HEADER_AT = layout.HEADER_OFFSETS


class _Table:
    """What the table rules read: the entries' fields as arrays, the header, the geometry."""

    def __init__(self, table: np.ndarray, geo: Geometry, header: np.void, report: Report) -> None:
        self.c = Collector(report)
        self.table, self.geo, self.header = table, geo, header
        self.n = len(table)
        self.layer = table["layer_id"].astype(np.uint64)
        self.expert = table["expert_id"].astype(np.uint64)
        self.off, self.raw, self.pad = table["byte_offset"], table["raw_size"], table["padded_size"]
        self.size = np.uint64(geo.size)
        self.inside = np.zeros(self.n, bool)  # set by the blob bounds check

    @staticmethod
    def at(name: str) -> EntryOffsets:
        """Absolute offset of field ``name`` of every entry."""
        return EntryOffsets(name)

    @staticmethod
    def path(name: str) -> Callable[[int], str]:
        return lambda i: f"experts[{i}].{name}"

    @cached_property
    def keys(self) -> np.ndarray:
        """(layer_id, expert_id) of every entry as one sortable number."""
        return (self.layer << np.uint64(32)) | self.expert

    @cached_property
    def back(self) -> np.ndarray:
        """The entries whose layer_id is below their predecessor's."""
        return np.flatnonzero(self.layer[1:] < self.layer[:-1]) + 1

    def unsorted(self, i: int) -> str:
        layer, expert = self.layer, self.expert
        return (
            f"(layer {layer[i]}, expert {expert[i]}) follows "
            f"(layer {layer[i - 1]}, expert {expert[i - 1]}): the table must be sorted"
        )

    @cached_property
    def file_order(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The entries inside the file in blob order, with their blobs' starts and ends."""
        idx = np.flatnonzero(self.inside)
        o = self.off[idx]
        order = idx if not (o[1:] < o[:-1]).any() else idx[np.argsort(o, kind="stable")]
        return order, self.off[order], self.off[order] + self.pad[order]


TABLE: Section[_Table] = Section("table")
"""The table rules, in the order they run."""


def check_table(table: np.ndarray, geo: Geometry, report: Report, header: np.void) -> np.ndarray:
    """Table rules over the table (from ``table_views``); returns the mask of entries whose
    blob lies inside the file.

    >>> from smoe.format.verify.header import check_header
    >>> from smoe.format.view import FileView, header_view, table_views
    >>> with FileView.open("fixtures/corrupt/duplicate_expert.smoe") as view:
    ...     report = Report(size=len(view))
    ...     geo = check_header(view, report)
    ...     table, descs = table_views(view, geo)
    ...     inside = check_table(table, geo, report, header_view(view))
    >>> bool(inside.all()), [(f.code, f.path, f.message) for f in report.errors]
    (True, [('table.duplicate', 'experts[1].expert_id', '(layer 0, expert 0) appears twice')])
    """
    f = _Table(table, geo, header, report)
    TABLE.run(f)
    return f.inside


@TABLE.rule(Rule.TABLE_DUPLICATE)
def _duplicate(f: _Table) -> None:
    if f.n < 2:
        return
    dup = np.flatnonzero(f.keys[1:] == f.keys[:-1]) + 1
    f.c.many(
        Rule.TABLE_DUPLICATE,
        dup,
        f.at("expert_id"),
        f.path("expert_id"),
        lambda i: f"(layer {f.layer[i]}, expert {f.expert[i]}) appears twice",
    )


@TABLE.rule(Rule.TABLE_ORDER)
def _order(f: _Table) -> None:
    if f.n < 2:
        return
    behind = np.setdiff1d(np.flatnonzero(f.keys[1:] < f.keys[:-1]) + 1, f.back)
    f.c.many(Rule.TABLE_ORDER, f.back, f.at("layer_id"), f.path("layer_id"), f.unsorted)
    f.c.many(Rule.TABLE_ORDER, behind, f.at("expert_id"), f.path("expert_id"), f.unsorted)


@TABLE.rule(Rule.ENTRY_EXPERT_ID)
def _expert_id(f: _Table) -> None:
    width = int(f.header["max_experts_per_layer"])
    f.c.many(
        Rule.ENTRY_EXPERT_ID,
        f.expert >= np.uint64(width),
        f.at("expert_id"),
        f.path("expert_id"),
        f"expert_id must be below max_experts_per_layer {width}",
        f"< {width}",
        f.table["expert_id"],
    )


@TABLE.rule(Rule.TABLE_LAYERS)
def _layers(f: _Table) -> None:
    layer = f.layer
    if f.n and not (layer[1:] < layer[:-1]).any():  # sorted: count the changes
        n_layers = 1 + int(np.count_nonzero(layer[1:] != layer[:-1]))
    else:
        n_layers = len(np.unique(layer))
    if n_layers > int(f.header["num_moe_layers"]):
        f.c.one(
            Rule.TABLE_LAYERS,
            _HEADER_AT["num_moe_layers"],
            "header.num_moe_layers",
            f"the table holds {n_layers} layers, more than num_moe_layers",
            n_layers,
            int(f.header["num_moe_layers"]),
        )


@TABLE.rule(Rule.ENTRY_BYTE_OFFSET_ALIGN)
def _byte_offset_align(f: _Table) -> None:
    f.c.many(
        Rule.ENTRY_BYTE_OFFSET_ALIGN,
        f.off % np.uint64(layout.PAGE_SIZE) != 0,
        f.at("byte_offset"),
        f.path("byte_offset"),
        f"blob offset must be a multiple of {layout.PAGE_SIZE}",
        lambda: layout.round_up(f.off, layout.PAGE_SIZE),
        f.off,
    )


@TABLE.rule(Rule.ENTRY_BYTE_OFFSET)
def _byte_offset(f: _Table) -> None:
    f.c.many(
        Rule.ENTRY_BYTE_OFFSET,
        f.off < np.uint64(f.geo.data_offset),
        f.at("byte_offset"),
        f.path("byte_offset"),
        f"blob starts before data_offset {f.geo.data_offset}",
        f">= {f.geo.data_offset}",
        f.off,
    )


@TABLE.rule(Rule.ENTRY_RAW_SIZE)
def _raw_size(f: _Table) -> None:
    f.c.many(
        Rule.ENTRY_RAW_SIZE,
        f.raw == 0,
        f.at("raw_size"),
        f.path("raw_size"),
        "raw_size must be at least 1",
        ">= 1",
        f.raw,
    )


# One checker for both: padded_size is judged only where the blob's data lies inside the
# file, and its findings come between those of the data and those of the padding.
@TABLE.rule(Rule.ENTRY_BLOB_BOUNDS, Rule.ENTRY_PADDED_SIZE)
def _blob_bounds(f: _Table) -> None:
    size, off, raw, pad, c = f.size, f.off, f.raw, f.pad, f.c
    start_ok = off < size  # raw_size >= 1, so a blob must start inside the file
    room = np.where(start_ok, size - np.minimum(off, size), 0)
    raw_out = ~start_ok | (raw > room)
    c.many(
        Rule.ENTRY_BLOB_BOUNDS,
        ~start_ok,
        f.at("byte_offset"),
        f.path("byte_offset"),
        f"blob starts at or beyond the end of the file ({f.geo.size} bytes)",
        f"< {f.geo.size}",
        off,
    )
    c.many(
        Rule.ENTRY_BLOB_BOUNDS,
        start_ok & raw_out,
        f.at("raw_size"),
        f.path("raw_size"),
        f"blob data runs past the end of the file ({f.geo.size} bytes)",
        room,
        raw,
    )
    sane = ~raw_out
    want_pad = layout.round_up(np.minimum(raw, size), layout.PAGE_SIZE)  # cannot overflow
    c.many(
        Rule.ENTRY_PADDED_SIZE,
        sane & (pad != want_pad),
        f.at("padded_size"),
        f.path("padded_size"),
        f"padded_size must be raw_size rounded up to {layout.PAGE_SIZE}",
        want_pad,
        pad,
    )
    pad_out = sane & (pad > room)
    c.many(
        Rule.ENTRY_BLOB_BOUNDS,
        pad_out,
        f.at("padded_size"),
        f.path("padded_size"),
        f"blob padding runs past the end of the file ({f.geo.size} bytes)",
        room,
        pad,
    )
    f.inside = sane & ~pad_out


@TABLE.rule(Rule.ENTRY_GROUP_SIZE)
def _group_size(f: _Table) -> None:
    f.c.many(
        Rule.ENTRY_GROUP_SIZE,
        f.table["group_size"] != int(f.header["group_size"]),
        f.at("group_size"),
        f.path("group_size"),
        "group_size must equal header.group_size",
        int(f.header["group_size"]),
        f.table["group_size"],
    )


@TABLE.rule(Rule.ENTRY_RESERVED)
def _reserved(f: _Table) -> None:
    reserved = f.table["reserved"]
    bad = reserved.any(axis=1)
    if bad.any():  # report the first non-zero byte
        f.c.many(
            Rule.ENTRY_RESERVED,
            bad,
            layout.entry_offset(np.arange(f.n, dtype=np.int64))
            + layout.EXPERT_ENTRY_OFFSETS["reserved"]
            + reserved.argmax(axis=1),
            f.path("reserved"),
            "reserved bytes must be zero",
        )


# Overlap and gaps between blobs, in file order (D4: readers need no particular order).
@TABLE.rule(Rule.TABLE_OVERLAP)
def _overlap(f: _Table) -> None:
    if not f.inside.any():
        return
    order, starts, ends = f.file_order
    overl = np.flatnonzero(starts[1:] < ends[:-1]) + 1
    f.c.many(
        Rule.TABLE_OVERLAP,
        order[overl],
        f.at("byte_offset"),
        f.path("byte_offset"),
        lambda i: f"blob overlaps another blob (starts at {f.off[i]})",
    )


@TABLE.rule(Rule.TABLE_GAP)
def _gap(f: _Table) -> None:
    if not f.inside.any():
        return
    order, starts, ends = f.file_order
    gaps = np.flatnonzero(starts[1:] > ends[:-1]) + 1
    f.c.many(
        Rule.TABLE_GAP,
        order[gaps],
        f.at("byte_offset"),
        f.path("byte_offset"),
        "unused bytes before this blob (blobs are not back to back)",
    )
    if starts[0] != f.geo.data_offset:
        f.c.one(
            Rule.TABLE_GAP,
            f.at("byte_offset")[order[0]],
            f"experts[{order[0]}].byte_offset",
            "the first blob does not start at data_offset",
            f.geo.data_offset,
            int(starts[0]),
        )
