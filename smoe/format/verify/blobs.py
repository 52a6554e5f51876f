"""The deep rules, which read blob contents (zero padding, finite scales, zero unused code
bits, zero metadata gap), and the integrity manifest beside the vault (docs/MANIFEST.md).

The blobs are read expert by expert, only the regions the rules look at, each in pieces
of at most ``view.CHUNK``; only experts whose table entry and descriptors are sound are
read. The manifest's rules are checked by ``smoe.format.manifest``, beside the document
it reads; here the verifier's two calls of it are registered as their checkers.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from smoe.errors import SmoeError
from smoe.format import manifest as manifests
from smoe.format.findings import Finding
from smoe.format.verify.report import MAX_PER_CODE, Collector, Report
from smoe.format.verify.rules import Section, rule
from smoe.format.view import (
    Data,
    Geometry,
    first_nonfinite_f16,
    first_nonzero,
    header_view,
)
from smoe_gen import layout
from smoe_gen.layout import Rule

__all__ = ["BLOBS", "check_blobs", "check_manifest", "read_manifest"]


class _Blobs:
    """What the deep rules read: the file, its table and descriptors, and which experts'
    blobs are sound enough to read."""

    def __init__(
        self,
        data: Data,
        table: np.ndarray,
        descs: np.ndarray,
        geo: Geometry,
        sound: np.ndarray,
        report: Report,
    ) -> None:
        self.c = Collector(report)
        self.data, self.table, self.descs, self.geo, self.sound = data, table, descs, geo, sound


BLOBS: Section[_Blobs] = Section("blobs")
"""The deep rules, in the order they run."""


def check_blobs(
    data: Data,
    table: np.ndarray,
    descs: np.ndarray,
    geo: Geometry,
    report: Report,
    sound: np.ndarray,
) -> None:
    """Deep rules over the blobs of the experts ``sound`` marks, and the gap before them.

    >>> from smoe.format.verify.header import check_header
    >>> from smoe.format.view import table_views
    >>> data = np.fromfile("fixtures/q4_v2.smoe", np.uint8)
    >>> data[16384 + 3264] = 7  # the first byte of the first blob's padding
    >>> report = Report(size=len(data))
    >>> geo = check_header(data, report)
    >>> table, descs = table_views(data, geo)
    >>> check_blobs(data, table, descs, geo, report, np.ones(len(table), bool))
    >>> [(f.code, f.path) for f in report.findings]
    [('blob.padding', 'experts[0].padding')]
    """
    BLOBS.run(_Blobs(data, table, descs, geo, sound, report))


@BLOBS.rule(Rule.HEADER_GAP)
def _gap(f: _Blobs) -> None:
    geo = f.geo
    with_arch = geo.version >= layout.VERSION_WITH_ARCH
    gap_start = geo.reserved_ext + layout.ARCH_BLOCK_SIZE if with_arch else geo.descriptors_end
    for lo, hi in (
        (geo.descriptors_end, min(geo.reserved_ext, geo.data_offset)) if with_arch else (0, 0),
        (gap_start, min(geo.data_offset, geo.size)),
    ):
        hit = first_nonzero(f.data, lo, hi) if hi > lo else None
        if hit:
            f.c.one(
                Rule.HEADER_GAP, hit[0], "gap", "the gap before data_offset is not zero", 0, hit[1]
            )


_Scan = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]


def _scan(f: _Blobs) -> _Scan:
    """(expert, at, value) of each bad padding, (expert, tensor, at, value) of each bad
    scale and last code byte; one pass, each expert's regions read in turn."""
    data, geo, table = f.data, f.geo, f.table
    per = layout.codes_per_byte(geo.bits) if geo.bits in layout.SUPPORTED_BITS else 0
    pad_bad: list[tuple[Any, ...]] = []
    scale_bad: list[tuple[Any, ...]] = []
    tail_bad: list[tuple[Any, ...]] = []
    for i in np.flatnonzero(f.sound):
        off, raw, pad = (
            int(table["byte_offset"][i]),
            int(table["raw_size"][i]),
            int(table["padded_size"][i]),
        )
        hit = first_nonzero(data, off + raw, off + pad)
        if hit:
            pad_bad.append((i, *hit))
        for t in range(layout.TENSORS_PER_EXPERT):
            d = f.descs[i, t]
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
    return pad_bad, scale_bad, tail_bad


# One checker for the three: one pass reads each expert's regions once; their findings are
# listed rule by rule, then the summaries of those past MAX_PER_CODE.
@BLOBS.rule(Rule.BLOB_PADDING, Rule.BLOB_SCALES, Rule.BLOB_PACKED_TAIL)
def _contents(f: _Blobs) -> None:
    c = f.c
    pad_bad, scale_bad, tail_bad = _scan(f)
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
    for r, items in (
        (Rule.BLOB_PADDING, pad_bad),
        (Rule.BLOB_SCALES, scale_bad),
        (Rule.BLOB_PACKED_TAIL, tail_bad),
    ):
        if len(items) > MAX_PER_CODE:
            c.one(
                r,
                items[MAX_PER_CODE][-2],
                "blobs",
                f"and {len(items) - MAX_PER_CODE} more like the above",
            )


@rule(Rule.MANIFEST_MALFORMED, section="manifest")
def read_manifest(
    data: Data, where: str | os.PathLike
) -> tuple[dict[str, Any] | None, Finding | None]:
    """The manifest at ``where`` for the vault ``data`` (its table bounds how large the
    manifest may be), or the ``manifest.malformed`` finding of why it cannot be read.

    >>> data = np.fromfile("fixtures/q4_v2.smoe", np.uint8)
    >>> doc, problem = read_manifest(data, "fixtures/q4_v2.smoe.manifest.json")
    >>> len(doc["experts"]), problem
    (8, None)
    >>> read_manifest(data, "fixtures/missing.json")[1].message
    'fixtures/missing.json: cannot open: No such file or directory'
    """
    entries = 0
    if len(data) >= layout.HEADER_SIZE:
        entries = int(header_view(data)["total_experts"])
    try:
        return manifests.load(where, entries), None
    except manifests.ManifestError as e:
        return None, e.finding
    except SmoeError as e:  # missing, not a regular file, unreadable
        return None, Finding.of(Rule.MANIFEST_MALFORMED, 0, "manifest", str(e))


@rule(Rule.MANIFEST_VAULT, Rule.MANIFEST_EXPERT, Rule.MANIFEST_CHECKSUM, section="manifest")
def check_manifest(
    doc: dict[str, Any], data: Data, geo: Geometry, table: np.ndarray, report: Report
) -> None:
    """The vault against its loaded manifest (only when every blob lies inside the file):
    its size, its table, every blob's CRC-32C.

    >>> from smoe.format.verify.header import check_header
    >>> from smoe.format.view import table_views
    >>> data = np.fromfile("fixtures/q4_v2.smoe", np.uint8)
    >>> doc, _ = read_manifest(data, "fixtures/q2_v2.smoe.manifest.json")  # another vault's
    >>> report = Report(size=len(data))
    >>> geo = check_header(data, report)
    >>> check_manifest(doc, data, geo, table_views(data, geo)[0], report)
    >>> [f.code for f in report.findings]
    ['manifest.expert']
    """
    report.add(*manifests.check(doc, geo.size, table, lambda off, n: data[off : off + n]))
