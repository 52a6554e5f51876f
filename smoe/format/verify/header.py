"""Header rules, and where the arch block may lie: the first section, whose gates decide
whether anything else of the file can be located.

Order: the size gate comes first (nothing is read from a file shorter than the header);
the magic and version gates before any field is trusted; the table_offset gate before the
rules that locate the table, the descriptors and the arch block from it.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from smoe.format.verify.report import Collector, Report
from smoe.format.verify.rules import Section
from smoe.format.view import Data, Geometry, header_view
from smoe_gen import layout
from smoe_gen.layout import Rule

__all__ = ["HEADER", "check_header"]

_AT = layout.HEADER_OFFSETS  # field -> offset


class _Header:
    """What the header rules read: the file's size and (past the size gate) its header."""

    def __init__(self, data: Data, report: Report) -> None:
        self.c = Collector(report)
        self.data = data
        self.size = len(data)

    @cached_property
    def h(self) -> np.void:
        return header_view(self.data)

    def field(self, name: str) -> int:
        return int(self.h[name])

    @cached_property
    def total(self) -> int:
        return self.field("total_experts")

    @cached_property
    def slots(self) -> int:
        """num_moe_layers x max_experts_per_layer: the experts a full vault holds."""
        return self.field("num_moe_layers") * self.field("max_experts_per_layer")

    @cached_property
    def data_offset(self) -> int:
        return self.field("data_offset")

    @cached_property
    def ext(self) -> int:
        return self.field("reserved_ext")

    @cached_property
    def d_end(self) -> int:
        return int(layout.descriptors_end(self.total))

    @cached_property
    def with_arch(self) -> bool:
        return self.field("version") >= layout.VERSION_WITH_ARCH

    def geometry(self) -> Geometry:
        return Geometry(
            self.size,
            self.field("version"),
            self.total,
            self.field("bits"),
            self.data_offset,
            int(layout.descriptors_offset(self.total)),
            self.d_end,
            self.ext,
            table_readable=self.d_end <= self.size,
            arch_readable=self.with_arch and self.ext + layout.ARCH_BLOCK_SIZE <= self.size,
        )


HEADER: Section[_Header] = Section("header")
"""The header rules, in the order they run."""


def check_header(data: Data, report: Report) -> Geometry | None:
    """Header rules; returns the geometry, or None when nothing else can be located.

    >>> from smoe.format.view import FileView
    >>> with FileView.open("fixtures/q4_v2.smoe") as view:
    ...     report = Report(size=len(view))
    ...     geo = check_header(view, report)
    >>> geo.version, geo.total, geo.bits, geo.data_offset, report.findings
    (2, 8, 4, 16384, [])
    """
    f = _Header(data, report)
    return f.geometry() if HEADER.run(f) else None


@HEADER.rule(Rule.HEADER_SIZE, gate=True)
def _size(f: _Header) -> bool:
    if f.size >= layout.HEADER_SIZE:
        return True
    f.c.one(
        Rule.HEADER_SIZE,
        0,
        "header",
        f"file of {f.size} bytes is shorter than the {layout.HEADER_SIZE}-byte header",
        layout.HEADER_SIZE,
        f.size,
    )
    return False


@HEADER.rule(Rule.HEADER_MAGIC, gate=True)
def _magic(f: _Header) -> bool:
    magic = bytes(f.h["magic"])
    if magic == layout.MAGIC:
        return True
    f.c.one(
        Rule.HEADER_MAGIC,
        _AT["magic"],
        "header.magic",
        "not a .smoe vault (bad magic)",
        layout.MAGIC.hex(" "),
        magic.hex(" "),
    )
    return False


@HEADER.rule(Rule.HEADER_VERSION, gate=True)
def _version(f: _Header) -> bool:
    version = f.field("version")
    if layout.VERSION_MIN <= version <= layout.VERSION_MAX:
        return True
    f.c.one(
        Rule.HEADER_VERSION,
        _AT["version"],
        "header.version",
        f"unsupported version; readers accept {layout.VERSION_MIN}..{layout.VERSION_MAX}",
        f"{layout.VERSION_MIN}..{layout.VERSION_MAX}",
        version,
    )
    return False


@HEADER.rule(Rule.HEADER_TOTAL_EXPERTS)
def _total_experts(f: _Header) -> None:
    if f.total > f.slots:
        f.c.one(
            Rule.HEADER_TOTAL_EXPERTS,
            _AT["total_experts"],
            "header.total_experts",
            "more experts than num_moe_layers x max_experts_per_layer",
            f.slots,
            f.total,
        )


@HEADER.rule(Rule.HEADER_PARTIAL)
def _partial(f: _Header) -> None:
    if f.total < f.slots:
        f.c.one(
            Rule.HEADER_PARTIAL,
            _AT["total_experts"],
            "header.total_experts",
            f"partial: {f.total} of {f.slots} experts",
        )


@HEADER.rule(Rule.HEADER_TABLE_OFFSET, gate=True)
def _table_offset(f: _Header) -> bool:
    if f.field("table_offset") == layout.TABLE_OFFSET:
        return True
    f.c.one(
        Rule.HEADER_TABLE_OFFSET,
        _AT["table_offset"],
        "header.table_offset",
        "the expert table must start right after the header",
        layout.TABLE_OFFSET,
        f.field("table_offset"),
    )
    return False


@HEADER.rule(Rule.HEADER_GROUP_SIZE)
def _group_size(f: _Header) -> None:
    if f.field("group_size") != layout.GROUP_SIZE:
        f.c.one(
            Rule.HEADER_GROUP_SIZE,
            _AT["group_size"],
            "header.group_size",
            f"group size must be {layout.GROUP_SIZE}",
            layout.GROUP_SIZE,
            f.field("group_size"),
        )


@HEADER.rule(Rule.HEADER_BITS)
def _bits(f: _Header) -> None:
    bits = f.field("bits")
    if bits not in layout.SUPPORTED_BITS:
        f.c.one(
            Rule.HEADER_BITS,
            _AT["bits"],
            "header.bits",
            f"bits must be one of {layout.SUPPORTED_BITS}",
            " or ".join(map(str, layout.SUPPORTED_BITS)),
            bits,
        )


@HEADER.rule(Rule.HEADER_D_MODEL)
def _d_model(f: _Header) -> None:
    if f.field("d_model") < 1:
        f.c.one(
            Rule.HEADER_D_MODEL,
            _AT["d_model"],
            "header.d_model",
            "d_model must be at least 1",
            ">= 1",
            0,
        )


@HEADER.rule(Rule.HEADER_DATA_OFFSET_ALIGN)
def _data_offset_align(f: _Header) -> None:
    if f.data_offset % layout.PAGE_SIZE:
        f.c.one(
            Rule.HEADER_DATA_OFFSET_ALIGN,
            _AT["data_offset"],
            "header.data_offset",
            f"data_offset must be a multiple of {layout.PAGE_SIZE}",
            layout.round_up(f.data_offset, layout.PAGE_SIZE),
            f.data_offset,
        )


@HEADER.rule(Rule.HEADER_DATA_OFFSET_BOUNDS)
def _data_offset_bounds(f: _Header) -> None:
    if f.data_offset > f.size:
        f.c.one(
            Rule.HEADER_DATA_OFFSET_BOUNDS,
            _AT["data_offset"],
            "header.data_offset",
            f"data_offset lies beyond the end of the file ({f.size} bytes)",
            f"<= {f.size}",
            f.data_offset,
        )


@HEADER.rule(Rule.HEADER_TABLE_BOUNDS)
def _table_bounds(f: _Header) -> None:
    if f.d_end > f.data_offset:
        f.c.one(
            Rule.HEADER_TABLE_BOUNDS,
            _AT["total_experts"],
            "header.total_experts",
            f"the table and descriptors of {f.total} experts end at {f.d_end}, past data_offset",
            f"<= {f.data_offset}",
            f.d_end,
        )


@HEADER.rule(Rule.HEADER_RESERVED_EXT)
def _reserved_ext(f: _Header) -> None:
    if not f.with_arch and f.ext:
        f.c.one(
            Rule.HEADER_RESERVED_EXT,
            _AT["reserved_ext"],
            "header.reserved_ext",
            "non-zero in a v1 vault (ignored)",
            0,
            f.ext,
        )


@HEADER.rule(Rule.ARCH_BOUNDS)
def _arch_bounds(f: _Header) -> None:
    if f.with_arch and f.ext + layout.ARCH_BLOCK_SIZE > f.size:
        f.c.one(
            Rule.ARCH_BOUNDS,
            _AT["reserved_ext"],
            "header.reserved_ext",
            f"the arch block lies beyond the end of the file ({f.size} bytes)",
            f"<= {f.size - layout.ARCH_BLOCK_SIZE}",
            f.ext,
        )


@HEADER.rule(Rule.ARCH_PLACEMENT)
def _arch_placement(f: _Header) -> None:
    if not f.with_arch:
        return
    problems = []
    if f.ext % layout.ARCH_ALIGN:
        problems.append(f"not a multiple of {layout.ARCH_ALIGN}")
    if f.ext < f.d_end:
        problems.append(f"inside the descriptors (which end at {f.d_end})")
    if f.ext + layout.ARCH_BLOCK_SIZE > f.data_offset:
        problems.append(
            f"the {layout.ARCH_BLOCK_SIZE}-byte block crosses data_offset {f.data_offset}"
        )
    if problems:
        f.c.one(
            Rule.ARCH_PLACEMENT,
            _AT["reserved_ext"],
            "header.reserved_ext",
            "arch block misplaced: " + "; ".join(problems),
            f"multiple of {layout.ARCH_ALIGN} in [{f.d_end}, "
            f"{f.data_offset - layout.ARCH_BLOCK_SIZE}]",
            f.ext,
        )
