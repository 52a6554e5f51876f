"""The verdict on one file (:class:`Report`) and how checks add to it (:class:`Collector`):
findings from vectorised masks, at most :data:`MAX_PER_CODE` of one check listed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from smoe.format.findings import Finding, Value
from smoe.format.view import Geometry
from smoe_gen import layout
from smoe_gen.layout import Rule

__all__ = ["MAX_PER_CODE", "Collector", "EntryOffsets", "Given", "Report", "Values"]

MAX_PER_CODE = 20
"""Findings of one code listed one by one; the rest are summarised in one more (the C++
harness lists as many)."""


@dataclass
class Report:
    """The verdict on one file: its size, the findings, and its geometry (None when the
    header cannot locate anything else).

    >>> from smoe.format.verify import verify_path
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

        >>> from smoe.format.verify import verify_path
        >>> [f.code for f in verify_path("fixtures/corrupt/duplicate_expert.smoe").errors]
        ['table.duplicate']
        """
        return [f for f in self.findings if f.severity == "error"]

    @property
    def ok(self) -> bool:
        """Whether no rule is broken (warnings and info allowed).

        >>> from smoe.format.verify import verify_path
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


class EntryOffsets:
    """Absolute offset of field ``name`` of table entry ``lo + i``, computed only when
    indexed (a check lists at most a few entries of a large table).

    >>> EntryOffsets("raw_size", lo=2)[1] == layout.entry_offset(3) + 16
    True
    """

    def __init__(self, name: str, lo: int = 0) -> None:
        self.field = layout.EXPERT_ENTRY_OFFSETS[name]
        self.lo = lo

    def __getitem__(self, i: int) -> int:
        return layout.entry_offset(self.lo + int(i)) + self.field


Given = Value | np.generic
"""One expected or actual value, as found."""
Values = Given | np.ndarray
"""... or one per item."""


class Collector:
    """Builds a report's findings, one at a time or from vectorised masks, capping how many
    of one call are listed (:data:`MAX_PER_CODE`, then one finding summarising the rest).

    >>> report = Report(size=1 << 20)
    >>> raw = np.array([7, 0, 0], np.uint64)
    >>> Collector(report).many(
    ...     Rule.ENTRY_RAW_SIZE, raw == 0, EntryOffsets("raw_size"), lambda i: f"experts[{i}]",
    ...     "raw_size must be at least 1", ">= 1", raw)
    >>> [(f.offset, f.path, f.actual) for f in report.findings]
    [(128, 'experts[1]', 0), (176, 'experts[2]', 0)]
    """

    def __init__(self, report: Report) -> None:
        self.report = report

    def one(
        self,
        rule: Rule,
        offset: int,
        path: str,
        message: str,
        expected: Given = None,
        actual: Given = None,
    ) -> None:
        """Add one finding of ``rule`` (numpy scalars become Python values).

        >>> report = Report(size=30)
        >>> Collector(report).one(Rule.HEADER_SIZE, 0, "header", "short", 64, np.uint64(30))
        >>> report.findings[0].actual, type(report.findings[0].actual)
        (30, <class 'int'>)
        """
        self.report.add(Finding.of(rule, int(offset), path, message, _py(expected), _py(actual)))

    def many(
        self,
        rule: Rule,
        where: np.ndarray | np.bool,
        offsets: np.ndarray | EntryOffsets,
        paths: Callable[[int], str],
        message: str | Callable[[int], str],
        expected: Values | Callable[[], np.ndarray] = None,
        actual: Values = None,
    ) -> None:
        """Add a finding of ``rule`` per bad item, the first :data:`MAX_PER_CODE` of them.

        ``where``: a mask or the indices of bad items; the other arguments map an index to
        its parts (``expected`` may be a function computing the array, called only when an
        item is bad).

        >>> report = Report(size=1 << 20)
        >>> bad = np.arange(25) >= 0
        >>> Collector(report).many(Rule.TABLE_GAP, bad, EntryOffsets("byte_offset"), str, "gap")
        >>> len(report.findings), report.findings[-1].message
        (21, 'and 5 more like the above')
        """
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


def _py(v: Given) -> Value:
    """A numpy scalar as the Python value a finding holds."""
    if isinstance(v, np.generic):
        return v.item()
    return v
