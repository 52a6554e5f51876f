"""Every rule of the format, checked over a file read with ``pread`` (or an array).

Rules come in sections, each a function returning findings; the table and descriptor
rules are vectorised over the table (read once), so a 12,032-expert table checks in
milliseconds. ``deep`` also reads, expert by expert in bounded pieces, every blob's
padding, scales and last code bytes (zero padding, finite scales, zero unused code bits)
and checks the blobs against the manifest beside the vault (docs/MANIFEST.md). Every
finding is of a rule of the spec's registry (``smoe_gen.layout.Rule``, shared with the C++
harness); fixtures/corrupt/EXPECTED.json names the code each corrupt fixture must raise.
Offsets and sizes come from the generated layout's helpers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from smoe.errors import SmoeError
from smoe.format import manifest as manifests
from smoe.format.findings import Finding, Value
from smoe.format.view import (
    Data,
    FileView,
    Geometry,
    arch_block,
    arch_view,
    first_nonfinite_f16,
    first_nonzero,
    header_view,
    table_views,
)
from smoe_gen import layout
from smoe_gen.layout import Rule

__all__ = [
    "MAX_PER_CODE",
    "Report",
    "check_arch",
    "check_descriptors",
    "check_header",
    "check_table",
    "verify",
    "verify_file",
    "verify_path",
]

MAX_PER_CODE = 20
"""Findings of one code listed one by one; the rest are summarised in one more (the C++
harness lists as many)."""
_HEADER_AT = layout.HEADER_OFFSETS  # field -> offset, in the header and the arch block
_ARCH_AT = layout.ARCH_BLOCK_OFFSETS


@dataclass
class Report:
    """The verdict on one file: its size, the findings, and its geometry (None when the
    header cannot locate anything else).

    >>> report = verify_path("fixtures/q4_v2.smoe")
    >>> report.ok, report.size, [f.code for f in report.findings]
    (True, 147456, ['arch.rms_norm_eps'])
    """

    size: int
    findings: list[Finding] = field(default_factory=list)
    geometry: Geometry | None = None

    @property
    def errors(self) -> list[Finding]:
        """The findings of severity ``error``.

        >>> [f.code for f in verify_path("fixtures/corrupt/duplicate_expert.smoe").errors]
        ['table.duplicate']
        """
        return [f for f in self.findings if f.severity == "error"]

    @property
    def ok(self) -> bool:
        """Whether no rule is broken (warnings and info allowed).

        >>> verify_path("fixtures/q4_v2.smoe").ok, verify_path("fixtures/corrupt/truncated.smoe").ok
        (True, False)
        """
        return not self.errors

    def add(self, *items: Finding) -> None:
        """Append findings (in the order given; :meth:`sort` orders them).

        >>> report = Report(size=30)
        >>> report.add(Finding.of(Rule.HEADER_SIZE, 0, "header", "short", 64, 30))
        >>> report.ok
        False
        """
        self.findings.extend(items)

    def sort(self) -> None:
        """Errors first, then warnings, then info; each by offset.

        >>> report = Report(size=100)
        >>> report.add(Finding.of(Rule.HEADER_PARTIAL, 20, "header.total_experts", "partial"))
        >>> report.add(Finding.of(Rule.HEADER_BITS, 24, "header.bits", "bits must be 2 or 4"))
        >>> report.sort()
        >>> [f.severity for f in report.findings]
        ['error', 'info']
        """
        self.findings.sort(key=lambda f: (layout.SEVERITIES.index(f.severity), f.offset))


_Given = Value | np.generic  # one expected or actual value, as found
_Values = _Given | np.ndarray  # ... or one per item


class _Collector:
    """Builds findings from vectorised masks, capping how many of one code are listed."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def one(
        self,
        rule: Rule,
        offset: int,
        path: str,
        message: str,
        expected: _Given = None,
        actual: _Given = None,
    ) -> None:
        self.report.add(Finding.of(rule, int(offset), path, message, _py(expected), _py(actual)))

    def many(
        self,
        rule: Rule,
        where: np.ndarray | np.bool,
        offsets: np.ndarray | _EntryOffsets,
        paths: Callable[[int], str],
        message: str | Callable[[int], str],
        expected: _Values | Callable[[], np.ndarray] = None,
        actual: _Values = None,
    ) -> None:
        """``where``: a mask or the indices of bad items; the other arguments map an index to
        its parts (``expected`` may be a function computing the array, called only when an
        item is bad)."""
        where = np.asarray(where)  # a mask from .any(axis=...) is an array
        idx = np.flatnonzero(where) if where.dtype == bool else where
        if not len(idx):
            return
        if callable(expected):
            expected = expected()
        for i in idx[:MAX_PER_CODE]:
            i = int(i)
            self.one(
                rule,
                int(offsets[i]),
                paths(i),
                message(i) if callable(message) else message,
                expected[i] if isinstance(expected, np.ndarray) else expected,
                actual[i] if isinstance(actual, np.ndarray) else actual,
            )
        if len(idx) > MAX_PER_CODE:
            first = int(idx[MAX_PER_CODE])
            self.one(
                rule,
                int(offsets[first]),
                paths(first),
                f"and {len(idx) - MAX_PER_CODE} more like the above",
            )


def _py(v: _Given) -> Value:
    """A numpy scalar as the Python value a finding holds."""
    if isinstance(v, np.generic):
        return v.item()
    return v


# ---------------------------------------------------------------------------- header
def check_header(data: Data, report: Report) -> Geometry | None:
    """Header rules; returns the geometry, or None when nothing else can be located.

    >>> with FileView.open("fixtures/q4_v2.smoe") as view:
    ...     report = Report(size=len(view))
    ...     geo = check_header(view, report)
    >>> geo.version, geo.total, geo.bits, geo.data_offset, report.findings
    (2, 8, 4, 16384, [])
    """
    c = _Collector(report)
    size = len(data)
    h = header_view(data)
    magic = bytes(h["magic"])
    if magic != layout.MAGIC:
        c.one(
            Rule.HEADER_MAGIC,
            _HEADER_AT["magic"],
            "header.magic",
            "not a .smoe vault (bad magic)",
            layout.MAGIC.hex(" "),
            magic.hex(" "),
        )
        return None
    version = int(h["version"])
    if not layout.VERSION_MIN <= version <= layout.VERSION_MAX:
        c.one(
            Rule.HEADER_VERSION,
            _HEADER_AT["version"],
            "header.version",
            f"unsupported version; readers accept {layout.VERSION_MIN}..{layout.VERSION_MAX}",
            f"{layout.VERSION_MIN}..{layout.VERSION_MAX}",
            version,
        )
        return None
    total = int(h["total_experts"])
    layers, width = int(h["num_moe_layers"]), int(h["max_experts_per_layer"])
    if total > layers * width:
        c.one(
            Rule.HEADER_TOTAL_EXPERTS,
            _HEADER_AT["total_experts"],
            "header.total_experts",
            "more experts than num_moe_layers x max_experts_per_layer",
            layers * width,
            total,
        )
    elif total < layers * width:
        c.one(
            Rule.HEADER_PARTIAL,
            _HEADER_AT["total_experts"],
            "header.total_experts",
            f"partial: {total} of {layers * width} experts",
        )
    if int(h["table_offset"]) != layout.TABLE_OFFSET:
        c.one(
            Rule.HEADER_TABLE_OFFSET,
            _HEADER_AT["table_offset"],
            "header.table_offset",
            "the expert table must start right after the header",
            layout.TABLE_OFFSET,
            int(h["table_offset"]),
        )
        return None
    if int(h["group_size"]) != layout.GROUP_SIZE:
        c.one(
            Rule.HEADER_GROUP_SIZE,
            _HEADER_AT["group_size"],
            "header.group_size",
            f"group size must be {layout.GROUP_SIZE}",
            layout.GROUP_SIZE,
            int(h["group_size"]),
        )
    bits = int(h["bits"])
    if bits not in layout.SUPPORTED_BITS:
        c.one(
            Rule.HEADER_BITS,
            _HEADER_AT["bits"],
            "header.bits",
            f"bits must be one of {layout.SUPPORTED_BITS}",
            " or ".join(map(str, layout.SUPPORTED_BITS)),
            bits,
        )
    if int(h["d_model"]) < 1:
        c.one(
            Rule.HEADER_D_MODEL,
            _HEADER_AT["d_model"],
            "header.d_model",
            "d_model must be at least 1",
            ">= 1",
            0,
        )
    d_off, d_end = layout.descriptors_offset(total), layout.descriptors_end(total)
    data_offset = int(h["data_offset"])
    if data_offset % layout.PAGE_SIZE:
        c.one(
            Rule.HEADER_DATA_OFFSET_ALIGN,
            _HEADER_AT["data_offset"],
            "header.data_offset",
            f"data_offset must be a multiple of {layout.PAGE_SIZE}",
            layout.round_up(data_offset, layout.PAGE_SIZE),
            data_offset,
        )
    if data_offset > size:
        c.one(
            Rule.HEADER_DATA_OFFSET_BOUNDS,
            _HEADER_AT["data_offset"],
            "header.data_offset",
            f"data_offset lies beyond the end of the file ({size} bytes)",
            f"<= {size}",
            data_offset,
        )
    if d_end > data_offset:
        c.one(
            Rule.HEADER_TABLE_BOUNDS,
            _HEADER_AT["total_experts"],
            "header.total_experts",
            f"the table and descriptors of {total} experts end at {d_end}, past data_offset",
            f"<= {data_offset}",
            d_end,
        )
    ext = int(h["reserved_ext"])
    arch_readable = False
    if version < layout.VERSION_WITH_ARCH:
        if ext:
            c.one(
                Rule.HEADER_RESERVED_EXT,
                _HEADER_AT["reserved_ext"],
                "header.reserved_ext",
                "non-zero in a v1 vault (ignored)",
                0,
                ext,
            )
    else:
        arch_readable = ext + layout.ARCH_BLOCK_SIZE <= size
        if not arch_readable:
            c.one(
                Rule.ARCH_BOUNDS,
                _HEADER_AT["reserved_ext"],
                "header.reserved_ext",
                f"the arch block lies beyond the end of the file ({size} bytes)",
                f"<= {size - layout.ARCH_BLOCK_SIZE}",
                ext,
            )
        problems = []
        if ext % layout.ARCH_ALIGN:
            problems.append(f"not a multiple of {layout.ARCH_ALIGN}")
        if ext < d_end:
            problems.append(f"inside the descriptors (which end at {d_end})")
        if ext + layout.ARCH_BLOCK_SIZE > data_offset:
            problems.append(
                f"the {layout.ARCH_BLOCK_SIZE}-byte block crosses data_offset {data_offset}"
            )
        if problems:
            c.one(
                Rule.ARCH_PLACEMENT,
                _HEADER_AT["reserved_ext"],
                "header.reserved_ext",
                "arch block misplaced: " + "; ".join(problems),
                f"multiple of {layout.ARCH_ALIGN} in [{d_end}, "
                f"{data_offset - layout.ARCH_BLOCK_SIZE}]",
                ext,
            )
    return Geometry(
        size,
        version,
        total,
        bits,
        data_offset,
        d_off,
        d_end,
        ext,
        table_readable=d_end <= size,
        arch_readable=arch_readable,
    )


# ---------------------------------------------------------------------------- arch block
def check_arch(data: Data, geo: Geometry, report: Report) -> None:
    """Arch block rules (only when ``geo.arch_readable``); one read of its 128 bytes.

    >>> with FileView.open("fixtures/corrupt/head_dim_300.smoe") as view:
    ...     report = Report(size=len(view))
    ...     check_arch(view, check_header(view, report), report)
    >>> [(f.code, f.offset, f.message, f.expected, f.actual) for f in report.errors]
    [('arch.head_dim', 1564, 'head_dim must be in 1..256', '1..256', 300)]
    """
    c = _Collector(report)
    block = arch_block(data, geo)
    a = block.view(layout.ARCH_BLOCK_DTYPE)[0]
    base = geo.reserved_ext

    def bad(rule: Rule, name: str, message: str, expected, actual) -> None:
        c.one(rule, base + _ARCH_AT[name], f"arch.{name}", message, expected, actual)

    if bytes(a["magic"]) != layout.ARCH_MAGIC:
        bad(
            Rule.ARCH_MAGIC,
            "magic",
            'the arch block must start with "SARC"',
            layout.ARCH_MAGIC.hex(" "),
            bytes(a["magic"]).hex(" "),
        )
        return
    if int(a["block_version"]) != layout.ARCH_BLOCK_VERSION:
        bad(
            Rule.ARCH_BLOCK_VERSION,
            "block_version",
            "unknown arch block version",
            layout.ARCH_BLOCK_VERSION,
            int(a["block_version"]),
        )
    if int(a["block_size"]) != layout.ARCH_BLOCK_SIZE:
        bad(
            Rule.ARCH_BLOCK_SIZE,
            "block_size",
            f"arch block size must be {layout.ARCH_BLOCK_SIZE}",
            layout.ARCH_BLOCK_SIZE,
            int(a["block_size"]),
        )
    flags = int(a["flags"])
    if flags & ~layout.FLAGS_KNOWN_MASK:
        bad(
            Rule.ARCH_FLAGS,
            "flags",
            "unknown flag bits 3..31 set",
            flags & layout.FLAGS_KNOWN_MASK,
            flags,
        )
    heads, kv = int(a["num_heads"]), int(a["num_kv_heads"])
    if heads < 1:
        bad(Rule.ARCH_NUM_HEADS, "num_heads", "num_heads must be at least 1", ">= 1", heads)
    if kv < 1:
        bad(Rule.ARCH_NUM_KV_HEADS, "num_kv_heads", "num_kv_heads must be at least 1", ">= 1", kv)
    elif heads % kv:
        bad(
            Rule.ARCH_NUM_KV_HEADS,
            "num_kv_heads",
            f"num_heads {heads} is not divisible by num_kv_heads {kv}",
            f"a divisor of {heads}",
            kv,
        )
    hd = int(a["head_dim"])
    if not 1 <= hd <= layout.MAX_HEAD_DIM:
        bad(
            Rule.ARCH_HEAD_DIM,
            "head_dim",
            f"head_dim must be in 1..{layout.MAX_HEAD_DIM}",
            f"1..{layout.MAX_HEAD_DIM}",
            hd,
        )
    k = int(a["moe_top_k"])
    if not 1 <= k <= layout.MAX_MOE_TOP_K:
        bad(
            Rule.ARCH_MOE_TOP_K,
            "moe_top_k",
            f"moe_top_k must be in 1..{layout.MAX_MOE_TOP_K}",
            f"1..{layout.MAX_MOE_TOP_K}",
            k,
        )
    act = int(a["activation"])
    if act != layout.Activation.SILU:
        bad(Rule.ARCH_ACTIVATION, "activation", "only activation 0 (SiLU) is implemented", 0, act)
    res = np.asarray(a["reserved"])
    if res.any():
        first = int(np.flatnonzero(res)[0])
        c.one(
            Rule.ARCH_RESERVED,
            base + _ARCH_AT["reserved"] + first,
            "arch.reserved",
            "reserved bytes must be zero",
            0,
            int(res[first]),
        )
    mt = base + _ARCH_AT["model_type"]
    raw = bytes(block[_ARCH_AT["model_type"] : _ARCH_AT["model_type"] + layout.MODEL_TYPE_SIZE])
    stem, nul, rest = raw.partition(b"\0")
    try:
        stem.decode("utf-8")
    except UnicodeDecodeError as e:
        c.one(
            Rule.ARCH_MODEL_TYPE,
            mt + e.start,
            "arch.model_type",
            "model_type is not valid UTF-8",
            "UTF-8",
            raw.hex(),
        )
    if rest.strip(b"\0"):
        at = len(stem) + len(nul) + next(i for i, b in enumerate(rest) if b)
        c.one(
            Rule.ARCH_MODEL_TYPE,
            mt + at,
            "arch.model_type",
            "model_type is not NUL-padded (bytes after the first NUL must be zero, ruling R2)",
            0,
            raw[at],
        )
    eps = float(a["rms_norm_eps"])
    ref = layout.REFERENCE_RMS_NORM_EPS
    if np.isfinite(eps) and not abs(eps - ref) <= layout.RMS_NORM_EPS_TOLERANCE * ref:
        bad(
            Rule.ARCH_RMS_NORM_EPS,
            "rms_norm_eps",
            f"differs from the kernels' {ref:g} by more than {layout.RMS_NORM_EPS_TOLERANCE:.0%}",
            ref,
            eps,
        )
    for rule, name in (
        (Rule.ARCH_ROPE_THETA, "rope_theta"),
        (Rule.ARCH_RMS_NORM_EPS, "rms_norm_eps"),
    ):  # not load rules (D6, R5)
        if not np.isfinite(a[name]):
            bad(rule, name, f"{name} is not finite", "finite", float(a[name]))


# ---------------------------------------------------------------------------- table
class _EntryOffsets:
    """Absolute offset of field ``name`` of entry ``lo + i``, computed only when indexed."""

    def __init__(self, name: str, lo: int) -> None:
        self.field = layout.EXPERT_ENTRY_OFFSETS[name]
        self.lo = lo

    def __getitem__(self, i: int) -> int:
        return layout.entry_offset(self.lo + int(i)) + self.field


def _entry_offsets(name: str, lo: int = 0) -> _EntryOffsets:
    return _EntryOffsets(name, lo)


def check_table(table: np.ndarray, geo: Geometry, report: Report, header: np.void) -> np.ndarray:
    """Table rules over the table (from ``table_views``); returns the mask of entries whose
    blob lies inside the file.

    >>> with FileView.open("fixtures/corrupt/duplicate_expert.smoe") as view:
    ...     report = Report(size=len(view))
    ...     geo = check_header(view, report)
    ...     table, descs = table_views(view, geo)
    ...     inside = check_table(table, geo, report, header_view(view))
    >>> bool(inside.all()), [(f.code, f.path, f.message) for f in report.errors]
    (True, [('table.duplicate', 'experts[1].expert_id', '(layer 0, expert 0) appears twice')])
    """
    c = _Collector(report)
    n = len(table)
    layer = table["layer_id"].astype(np.uint64)
    expert = table["expert_id"].astype(np.uint64)
    off = table["byte_offset"]
    raw = table["raw_size"]
    pad = table["padded_size"]
    size = np.uint64(geo.size)
    path = lambda name: lambda i: f"experts[{i}].{name}"  # noqa: E731
    if n > 1:
        keys = (layer << np.uint64(32)) | expert
        prev, cur = keys[:-1], keys[1:]
        dup = np.flatnonzero(cur == prev) + 1
        back = np.flatnonzero(layer[1:] < layer[:-1]) + 1
        order = np.setdiff1d(np.flatnonzero(cur < prev) + 1, back)
        eo = _entry_offsets("expert_id")
        c.many(
            Rule.TABLE_DUPLICATE,
            dup,
            eo,
            path("expert_id"),
            lambda i: f"(layer {layer[i]}, expert {expert[i]}) appears twice",
        )

        def unsorted(i: int) -> str:
            return (
                f"(layer {layer[i]}, expert {expert[i]}) follows "
                f"(layer {layer[i - 1]}, expert {expert[i - 1]}): the table must be sorted"
            )

        c.many(Rule.TABLE_ORDER, back, _entry_offsets("layer_id"), path("layer_id"), unsorted)
        c.many(Rule.TABLE_ORDER, order, eo, path("expert_id"), unsorted)
    width = int(header["max_experts_per_layer"])
    c.many(
        Rule.ENTRY_EXPERT_ID,
        expert >= np.uint64(width),
        _entry_offsets("expert_id"),
        path("expert_id"),
        f"expert_id must be below max_experts_per_layer {width}",
        f"< {width}",
        table["expert_id"],
    )
    if n and not (layer[1:] < layer[:-1]).any():  # sorted: count the changes
        n_layers = 1 + int(np.count_nonzero(layer[1:] != layer[:-1]))
    else:
        n_layers = len(np.unique(layer))
    if n_layers > int(header["num_moe_layers"]):
        c.one(
            Rule.TABLE_LAYERS,
            _HEADER_AT["num_moe_layers"],
            "header.num_moe_layers",
            f"the table holds {n_layers} layers, more than num_moe_layers",
            n_layers,
            int(header["num_moe_layers"]),
        )
    c.many(
        Rule.ENTRY_BYTE_OFFSET_ALIGN,
        off % np.uint64(layout.PAGE_SIZE) != 0,
        _entry_offsets("byte_offset"),
        path("byte_offset"),
        f"blob offset must be a multiple of {layout.PAGE_SIZE}",
        lambda: layout.round_up(off, layout.PAGE_SIZE),
        off,
    )
    c.many(
        Rule.ENTRY_BYTE_OFFSET,
        off < np.uint64(geo.data_offset),
        _entry_offsets("byte_offset"),
        path("byte_offset"),
        f"blob starts before data_offset {geo.data_offset}",
        f">= {geo.data_offset}",
        off,
    )
    c.many(
        Rule.ENTRY_RAW_SIZE,
        raw == 0,
        _entry_offsets("raw_size"),
        path("raw_size"),
        "raw_size must be at least 1",
        ">= 1",
        raw,
    )
    start_ok = off < size  # raw_size >= 1, so a blob must start inside the file
    room = np.where(start_ok, size - np.minimum(off, size), 0)
    raw_out = ~start_ok | (raw > room)
    c.many(
        Rule.ENTRY_BLOB_BOUNDS,
        ~start_ok,
        _entry_offsets("byte_offset"),
        path("byte_offset"),
        f"blob starts at or beyond the end of the file ({geo.size} bytes)",
        f"< {geo.size}",
        off,
    )
    c.many(
        Rule.ENTRY_BLOB_BOUNDS,
        start_ok & raw_out,
        _entry_offsets("raw_size"),
        path("raw_size"),
        lambda i: f"blob data runs past the end of the file ({geo.size} bytes)",
        room,
        raw,
    )
    sane = ~raw_out
    want_pad = layout.round_up(np.minimum(raw, size), layout.PAGE_SIZE)  # cannot overflow
    c.many(
        Rule.ENTRY_PADDED_SIZE,
        sane & (pad != want_pad),
        _entry_offsets("padded_size"),
        path("padded_size"),
        f"padded_size must be raw_size rounded up to {layout.PAGE_SIZE}",
        want_pad,
        pad,
    )
    pad_out = sane & (pad > room)
    c.many(
        Rule.ENTRY_BLOB_BOUNDS,
        pad_out,
        _entry_offsets("padded_size"),
        path("padded_size"),
        f"blob padding runs past the end of the file ({geo.size} bytes)",
        room,
        pad,
    )
    c.many(
        Rule.ENTRY_GROUP_SIZE,
        table["group_size"] != int(header["group_size"]),
        _entry_offsets("group_size"),
        path("group_size"),
        "group_size must equal header.group_size",
        int(header["group_size"]),
        table["group_size"],
    )
    reserved = table["reserved"]
    res_bad = reserved.any(axis=1)
    if res_bad.any():  # report the first non-zero byte
        c.many(
            Rule.ENTRY_RESERVED,
            res_bad,
            layout.entry_offset(np.arange(n, dtype=np.int64))
            + layout.EXPERT_ENTRY_OFFSETS["reserved"]
            + reserved.argmax(axis=1),
            path("reserved"),
            "reserved bytes must be zero",
        )
    inside = sane & ~pad_out
    # Overlap and gaps between blobs, in file order (D4: readers need no particular order).
    idx = np.flatnonzero(inside)
    if len(idx):
        o = off[idx]
        order = idx if not (o[1:] < o[:-1]).any() else idx[np.argsort(o, kind="stable")]
        starts, ends = off[order], off[order] + pad[order]
        overl = np.flatnonzero(starts[1:] < ends[:-1]) + 1
        c.many(
            Rule.TABLE_OVERLAP,
            order[overl],
            _entry_offsets("byte_offset"),
            path("byte_offset"),
            lambda i: f"blob overlaps another blob (starts at {off[i]})",
        )
        gaps = np.flatnonzero(starts[1:] > ends[:-1]) + 1
        c.many(
            Rule.TABLE_GAP,
            order[gaps],
            _entry_offsets("byte_offset"),
            path("byte_offset"),
            "unused bytes before this blob (blobs are not back to back)",
        )
        if starts[0] != geo.data_offset:
            c.one(
                Rule.TABLE_GAP,
                _entry_offsets("byte_offset")[order[0]],
                f"experts[{order[0]}].byte_offset",
                "the first blob does not start at data_offset",
                geo.data_offset,
                int(starts[0]),
            )
    return inside


# ---------------------------------------------------------------------------- descriptors
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

    >>> with FileView.open("fixtures/corrupt/packed_size_mismatch.smoe") as view:
    ...     report = Report(size=len(view))
    ...     geo = check_header(view, report)
    ...     table, descs = table_views(view, geo)
    ...     sound = check_descriptors(table, descs, geo, report, header_view(view), None)
    >>> sound.tolist(), [f.path for f in report.errors]
    ([False, True, True, True, True, True, True, True], ['experts[0].tensors[0].packed_size'])
    """
    c = _Collector(report)
    table, descs = table[lo:hi], descs[lo:hi]
    n = len(table)
    flat = descs.reshape(-1)
    k = layout.TENSORS_PER_EXPERT
    ok = np.ones(n * k, bool)
    slot: np.ndarray = np.tile(np.arange(k, dtype=np.uint8), n)
    entry: np.ndarray = lo + np.arange(n * k, dtype=np.int64) // k
    base = layout.descriptor_offset(geo.total, entry, slot)

    def at(name: str) -> np.ndarray:
        """Absolute offset of field ``name`` of every descriptor."""
        return base + layout.TENSOR_DESCRIPTOR_OFFSETS[name]

    def path(name: str) -> Callable[[int], str]:
        return lambda i: f"experts[{lo + i // k}].tensors[{i % k}].{name}"

    bad = flat["tensor_type"] != slot
    c.many(
        Rule.DESCRIPTOR_TENSOR_TYPE,
        bad,
        at("tensor_type"),
        path("tensor_type"),
        "descriptors must come in the order gate, up, down",
        slot,
        flat["tensor_type"],
    )
    ok &= ~bad
    bad = flat["ndim"] != layout.TENSOR_NDIM
    c.many(
        Rule.DESCRIPTOR_NDIM,
        bad,
        at("ndim"),
        path("ndim"),
        "ndim must be 2",
        layout.TENSOR_NDIM,
        flat["ndim"],
    )
    c.many(
        Rule.DESCRIPTOR_RESERVED,
        flat["reserved_0"].any(axis=1),
        at("reserved_0") + flat["reserved_0"].argmax(axis=1),
        path("reserved_0"),
        "reserved bytes must be zero",
    )
    rows, cols = flat["rows"], flat["cols"]
    c.many(
        Rule.DESCRIPTOR_ROWS,
        rows == 0,
        at("rows"),
        path("rows"),
        "rows must be at least 1",
        ">= 1",
        rows,
    )
    c.many(
        Rule.DESCRIPTOR_COLS,
        cols == 0,
        at("cols"),
        path("cols"),
        "cols must be at least 1",
        ">= 1",
        cols,
    )
    bad = (rows == 0) | (cols == 0)
    ok &= ~bad
    raw = np.repeat(table["raw_size"], k)
    if geo.bits in layout.SUPPORTED_BITS:  # the codes fit in the blob (division: no overflow)
        room = raw * np.uint64(8) // np.uint64(geo.bits) // np.maximum(rows, 1).astype(np.uint64)
        bad = ~bad & (cols > room)
        c.many(
            Rule.DESCRIPTOR_COLS,
            bad,
            at("cols"),
            path("cols"),
            "the matrix's codes do not fit in the blob's raw_size",
            room,
            cols,
        )
        ok &= ~bad
    if geo.bits in layout.SUPPORTED_BITS:
        weights = rows.astype(np.uint64) * cols.astype(np.uint64)  # < 2**64
        want_p = layout.packed_size(weights, geo.bits)
        want_s = layout.scales_size(weights)
        bad = flat["packed_size"] != want_p
        c.many(
            Rule.DESCRIPTOR_PACKED_SIZE,
            bad,
            at("packed_size"),
            path("packed_size"),
            "packed_size must be ceil(rows * cols * bits / 8)",
            want_p,
            flat["packed_size"],
        )
        ok &= ~bad
        bad = flat["scales_size"] != want_s
        c.many(
            Rule.DESCRIPTOR_SCALES_SIZE,
            bad,
            at("scales_size"),
            path("scales_size"),
            f"scales_size must be ceil(rows * cols / {layout.GROUP_SIZE}) * {layout.SCALE_BYTES}",
            want_s,
            flat["scales_size"],
        )
        ok &= ~bad
        sums = layout.num_groups(weights).reshape(n, k).sum(axis=1, dtype=np.uint64)
        bad = table["num_groups"] != sums
        c.many(
            Rule.ENTRY_NUM_GROUPS,
            bad,
            _entry_offsets("num_groups", lo),
            lambda i: f"experts[{lo + i}].num_groups",
            f"num_groups must be the sum of ceil(rows * cols / {layout.GROUP_SIZE}) over the "
            "three tensors",
            sums,
            table["num_groups"],
        )
    for what in ("packed", "scales"):
        o, s = flat[f"{what}_offset"], flat[f"{what}_size"]
        out = (o > raw) | (s > raw - np.minimum(o, raw))

        def outside(i: int, o: np.ndarray = o, s: np.ndarray = s, what: str = what) -> str:
            return f"{what} slice [{o[i]}, +{s[i]}) lies outside the blob's raw_size {raw[i]}"

        c.many(
            Rule.DESCRIPTOR_SLICE_BOUNDS,
            out,
            at(f"{what}_offset"),
            path(f"{what}_offset"),
            outside,
            None,
            o,
        )
        ok &= ~out
    # Slices of one expert must not overlap each other.
    # all(axis=1) of a 2-D array is an array (numpy's stubs also allow a scalar)
    exp_ok = cast(np.ndarray, ok.reshape(n, k).all(axis=1))
    if exp_ok.any():
        starts = np.stack([descs["packed_offset"], descs["scales_offset"]], axis=2).reshape(n, -1)
        sizes = np.stack([descs["packed_size"], descs["scales_size"]], axis=2).reshape(n, -1)
        order = np.argsort(starts, axis=1, kind="stable")
        s_sorted = np.take_along_axis(starts, order, axis=1)
        e_sorted = s_sorted + np.take_along_axis(sizes, order, axis=1)
        hit = s_sorted[:, 1:] < e_sorted[:, :-1]
        overl = hit.any(axis=1) & exp_ok
        # Name the slice that starts inside its predecessor: slot j = tensor j // 2, part j % 2.
        culprit = np.take_along_axis(order, hit.argmax(axis=1)[:, None] + 1, axis=1)[:, 0]
        parts = ("packed_offset", "scales_offset")
        parts_at = np.array([layout.TENSOR_DESCRIPTOR_OFFSETS[p] for p in parts])
        where = (
            layout.descriptor_offset(geo.total, lo + np.arange(n), culprit // 2)
            + parts_at[culprit % 2]
        )
        c.many(
            Rule.DESCRIPTOR_SLICE_OVERLAP,
            overl,
            where,
            lambda i: f"experts[{lo + i}].tensors[{culprit[i] // 2}].{parts[culprit[i] % 2]}",
            "this slice overlaps another of the expert",
        )
        exp_ok &= ~overl
    _check_shapes(c, geo, table, descs, header, arch, lo)
    return exp_ok


def _check_shapes(
    c: _Collector,
    geo: Geometry,
    table: np.ndarray,
    descs: np.ndarray,
    header: np.void,
    arch: np.void | None,
    lo: int,
) -> None:
    n = len(table)
    if n == 0:
        return
    rows, cols = descs["rows"], descs["cols"]
    d_model = int(header["d_model"])
    up_ok = (rows[:, 1] == rows[:, 0]) & (cols[:, 1] == cols[:, 0])
    down_ok = (rows[:, 2] == cols[:, 0]) & (cols[:, 2] == rows[:, 0])
    shape_ok = up_ok & down_ok
    entries: np.ndarray = lo + np.arange(n)
    rows_at = layout.TENSOR_DESCRIPTOR_OFFSETS["rows"]
    gate = layout.descriptor_offset(geo.total, entries, np.zeros_like(entries))  # gate_proj
    bad_t = np.where(up_ok, 2, 1)  # the first tensor that does not fit the gate (D3)
    c.many(
        Rule.DESCRIPTOR_SHAPE,
        ~shape_ok,
        layout.descriptor_offset(geo.total, entries, bad_t) + rows_at,
        lambda i: f"experts[{lo + i}].tensors[{bad_t[i]}].rows",
        lambda i: (
            f"shapes gate {rows[i, 0]}x{cols[i, 0]}, up {rows[i, 1]}x{cols[i, 1]}, "
            f"down {rows[i, 2]}x{cols[i, 2]}: up must equal gate and down its transpose"
        ),
    )
    c.many(
        Rule.DESCRIPTOR_SHAPE,
        shape_ok & (cols[:, 0] != d_model),
        gate + layout.TENSOR_DESCRIPTOR_OFFSETS["cols"],
        lambda i: f"experts[{lo + i}].tensors[0].cols",
        "gate_proj columns must equal d_model",
        d_model,
        cols[:, 0],
    )
    layer = table["layer_id"]
    first = np.r_[True, layer[1:] != layer[:-1]]
    # Compare each entry with the first entry of its (sorted) layer run.
    run = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    differ = (rows[:, 0] != rows[run, 0]) | (cols[:, 0] != cols[run, 0])
    c.many(
        Rule.LAYER_SHAPE,
        differ,
        gate + rows_at,
        lambda i: f"experts[{lo + i}].tensors[0].rows",
        lambda i: (
            f"layer {layer[i]}: shape {rows[i, 0]}x{cols[i, 0]} differs from the "
            f"layer's first expert {rows[run[i], 0]}x{cols[run[i], 0]}"
        ),
    )
    if arch is not None and bytes(arch["magic"]) == layout.ARCH_MAGIC:
        moe = int(arch["moe_ffn_dim"])
        mism = np.flatnonzero(shape_ok & (rows[:, 0] != moe))
        if len(mism):
            i = int(mism[0])
            c.one(
                Rule.ARCH_MOE_FFN_DIM,
                geo.reserved_ext + _ARCH_AT["moe_ffn_dim"],
                "arch.moe_ffn_dim",
                f"disagrees with the descriptors ({len(mism)} experts); shapes win",
                int(rows[i, 0]),
                moe,
            )


def _check_ffn_dim(c: _Collector, header: np.void, arch: np.void | None) -> None:
    """D5: warn on vaults whose ffn_dim looks like the reference Sculptor's d_model mistake."""
    ffn, d_model = int(header["ffn_dim"]), int(header["d_model"])
    want = None
    if arch is not None and bytes(arch["magic"]) == layout.ARCH_MAGIC:
        want = int(arch["dense_ffn_dim"]) or int(arch["shared_expert_ffn_dim"]) or None
    if want is not None and ffn != want:
        c.one(
            Rule.HEADER_FFN_DIM,
            _HEADER_AT["ffn_dim"],
            "header.ffn_dim",
            "differs from the arch block's dense/shared FFN size (D5)",
            want,
            ffn,
        )
    elif want is None and ffn == d_model:
        c.one(
            Rule.HEADER_FFN_DIM,
            _HEADER_AT["ffn_dim"],
            "header.ffn_dim",
            "equals d_model, as the reference Sculptor wrote it; routed-expert shapes come "
            "from the descriptors (D5)",
            "dense/shared FFN size",
            ffn,
        )


# ---------------------------------------------------------------------------- blobs (deep)
def _check_blobs(
    data: Data,
    table: np.ndarray,
    descs: np.ndarray,
    geo: Geometry,
    report: Report,
    sound: np.ndarray,
) -> None:
    """Zero padding, finite scales, zero unused code bits, zero metadata gap.

    Reads expert by expert, only those regions, each in pieces of at most ``view.CHUNK``.
    """
    c = _Collector(report)
    gap_start = (
        geo.reserved_ext + layout.ARCH_BLOCK_SIZE
        if geo.version >= layout.VERSION_WITH_ARCH
        else geo.descriptors_end
    )
    for lo, hi in (
        (geo.descriptors_end, min(geo.reserved_ext, geo.data_offset))
        if geo.version >= layout.VERSION_WITH_ARCH
        else (0, 0),
        (gap_start, min(geo.data_offset, geo.size)),
    ):
        hit = first_nonzero(data, lo, hi) if hi > lo else None
        if hit:
            c.one(
                Rule.HEADER_GAP, hit[0], "gap", "the gap before data_offset is not zero", 0, hit[1]
            )
    per = layout.codes_per_byte(geo.bits) if geo.bits in layout.SUPPORTED_BITS else 0
    pad_bad, scale_bad, tail_bad = [], [], []
    for i in np.flatnonzero(sound):
        off, raw, pad = (
            int(table["byte_offset"][i]),
            int(table["raw_size"][i]),
            int(table["padded_size"][i]),
        )
        hit = first_nonzero(data, off + raw, off + pad)
        if hit:
            pad_bad.append((i, *hit))
        for t in range(layout.TENSORS_PER_EXPERT):
            d = descs[i, t]
            s0 = off + int(d["scales_offset"])
            nonfinite = first_nonfinite_f16(data, s0, s0 + int(d["scales_size"]))
            if nonfinite:
                scale_bad.append((i, t, *nonfinite))
            n = int(d["rows"]) * int(d["cols"])
            if per and n % per:
                last = off + int(d["packed_offset"]) + int(d["packed_size"]) - 1
                byte = int(data[last])
                if byte >> ((n % per) * geo.bits):
                    tail_bad.append((i, t, last, byte))
    for i, at, value in pad_bad[:MAX_PER_CODE]:
        c.one(Rule.BLOB_PADDING, at, f"experts[{i}].padding", "blob padding must be zero", 0, value)
    for i, t, at, scale in scale_bad[:MAX_PER_CODE]:
        c.one(
            Rule.BLOB_SCALES,
            at,
            f"experts[{i}].tensors[{t}].scales",
            "scales must be finite float16",
            "finite",
            scale,
        )
    for i, t, at, value in tail_bad[:MAX_PER_CODE]:
        c.one(
            Rule.BLOB_PACKED_TAIL,
            at,
            f"experts[{i}].tensors[{t}].packed",
            "unused high bits of the last code byte must be zero",
            0,
            value,
        )
    for rule, items in (
        (Rule.BLOB_PADDING, pad_bad),
        (Rule.BLOB_SCALES, scale_bad),
        (Rule.BLOB_PACKED_TAIL, tail_bad),
    ):
        if len(items) > MAX_PER_CODE:
            c.one(
                rule,
                items[MAX_PER_CODE][-2],
                "blobs",
                f"and {len(items) - MAX_PER_CODE} more like the above",
            )


# ---------------------------------------------------------------------------- all
def verify(data: Data, deep: bool = False, manifest: dict[str, Any] | None = None) -> Report:
    """All rules over the whole file (a :class:`FileView` or a uint8 array).

    With ``deep``, blob contents are read too and, given a manifest loaded by
    ``smoe.format.manifest.load``, every blob is checked against it. A file that shrinks while
    it is read raises :class:`SmoeError`.

    >>> from smoe.format import manifest
    >>> data = np.fromfile("fixtures/q4_v2.smoe", np.uint8)
    >>> doc = manifest.load("fixtures/q4_v2.smoe.manifest.json", entries=8)
    >>> verify(data, deep=True, manifest=doc).ok
    True
    >>> data[16384] ^= 1  # a bit of the first blob
    >>> [(f.code, f.path) for f in verify(data, deep=True, manifest=doc).errors]
    [('manifest.checksum', 'manifest/experts/0/crc32c')]
    """
    report = Report(size=len(data))
    if len(data) < layout.HEADER_SIZE:
        report.add(
            Finding.of(
                Rule.HEADER_SIZE,
                0,
                "header",
                f"file of {len(data)} bytes is shorter than the {layout.HEADER_SIZE}-byte header",
                layout.HEADER_SIZE,
                len(data),
            )
        )
        return report
    geo = check_header(data, report)
    report.geometry = geo
    if geo is None:
        return report
    header = header_view(data)
    arch = None
    if geo.version >= layout.VERSION_WITH_ARCH and geo.arch_readable:
        check_arch(data, geo, report)
        arch = arch_view(data, geo)
    _check_ffn_dim(_Collector(report), header, arch)
    if not geo.table_readable:
        report.sort()
        return report
    table, descs = table_views(data, geo)
    inside = check_table(table, geo, report, header)
    sound = check_descriptors(table, descs, geo, report, header, arch) & inside
    if deep:
        _check_blobs(data, table, descs, geo, report, sound)
        if manifest is not None and inside.all():  # every blob can be read
            report.add(
                *manifests.check(manifest, geo.size, table, lambda off, n: data[off : off + n])
            )
    report.sort()
    return report


def _manifest_path(
    vault: str | os.PathLike, deep: bool, manifest: str | os.PathLike | None = "auto"
) -> Path | None:
    """The manifest to check: "auto" = the sidecar when it exists (and ``deep``), a path =
    that file (when ``deep``), None = none."""
    if not deep or manifest is None:
        return None
    if isinstance(manifest, str) and manifest == "auto":
        side = manifests.path_for(vault)
        return side if os.path.lexists(side) else None
    return Path(manifest)


def verify_file(
    data: Data,
    path: str | os.PathLike,
    deep: bool = False,
    manifest: str | os.PathLike | None = "auto",
) -> Report:
    """:func:`verify` of the vault at ``path`` already opened as ``data``, with its manifest
    (``manifest``: "auto" = the sidecar ``<vault>.manifest.json`` when it exists, a path =
    that file, None = none; checked only with ``deep``); a manifest that cannot be read is a
    ``manifest.malformed`` finding.

    >>> other = "fixtures/q2_v2.smoe.manifest.json"  # the manifest of another vault
    >>> with FileView.open("fixtures/q4_v2.smoe") as view:
    ...     report = verify_file(view, "fixtures/q4_v2.smoe", deep=True, manifest=other)
    >>> [f.code for f in report.errors]
    ['manifest.expert']
    """
    where = _manifest_path(path, deep, manifest)
    doc, problem = None, None
    if where is not None:
        entries = 0
        if len(data) >= layout.HEADER_SIZE:
            entries = int(header_view(data)["total_experts"])
        try:
            doc = manifests.load(where, entries)
        except manifests.ManifestError as e:
            problem = e.finding
        except SmoeError as e:  # missing, not a regular file, unreadable
            problem = Finding.of(Rule.MANIFEST_MALFORMED, 0, "manifest", str(e))
    report = verify(data, deep=deep, manifest=doc)
    if problem is not None:
        report.add(problem)
        report.sort()
    return report


def verify_path(
    path: str | os.PathLike, deep: bool = False, manifest: str | os.PathLike | None = "auto"
) -> Report:
    """Open ``path`` (``fileio.NotRegular`` for FIFOs, folders, devices, missing files) and
    :func:`verify_file` it.

    >>> report = verify_path("fixtures/partial_vault.smoe")
    >>> report.ok, [(f.severity, f.code) for f in report.findings]
    (True, [('warning', 'arch.rms_norm_eps'), ('info', 'header.partial')])
    >>> print(report.findings[1].line())
    info: header.partial at offset 0x14 (header.total_experts): partial: 4 of 32 experts
    """
    with FileView.open(path) as view:
        return verify_file(view, path, deep=deep, manifest=manifest)
