"""Findings: what the verifier reports about one rule broken (or noted) at one place, and
the JSON documents that carry them (docs/JSON.md, schema ``smoe-findings/1``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from smoe_gen.layout import RULES, SEVERITIES, Rule

__all__ = [
    "SCHEMA",
    "Finding",
    "Value",
    "display",
    "document",
    "error_document",
    "json_value",
]

SCHEMA = "smoe-findings/1"
"""The ``"schema"`` key of every ``--json`` document of ``smoe verify``, ``smoe dump`` and
``smoe-stream check`` (and of every ``--json`` error document)."""

Value = int | float | str | None
"""A finding's expected or actual value."""


def display(v: Value) -> str | None:
    """A value as findings show it: an integer in hex and decimal, anything else as text.

    >>> display(100), display(1e-06), display("1..2"), display(None)
    ('0x64 (100)', '1e-06', '1..2', None)
    """
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        return str(v)
    return f"{v:#x} ({v})"


def json_value(v: Value) -> int | float | str | None:
    """A value as a JSON scalar: a number, or a string for what JSON has no number for.

    >>> json_value(100), json_value(0.5), json_value(float("inf")), json_value("finite")
    (100, 0.5, 'inf', 'finite')
    """
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # "inf", "-inf", "nan"
    return v


@dataclass(frozen=True)
class Finding:
    """One rule's verdict at one place of the file.

    ``code`` is a registered rule's (``smoe_gen.layout.Rule``, the spec's registry, which
    the C++ harness shares) and ``severity`` that rule's; ``offset`` is absolute; ``path``
    names the field, e.g. ``experts[17].tensors[2].scales_offset``.

    >>> f = Finding.of(Rule.HEADER_VERSION, 8, "header.version", "unsupported", "1..2", 3)
    >>> f.line()
    'error: header.version at offset 0x8 (header.version): unsupported [expected 1..2, got 0x3 (3)]'
    """

    severity: str
    code: str
    offset: int
    path: str
    message: str
    expected: Value = None
    actual: Value = None

    def __post_init__(self) -> None:
        rule = RULES.get(self.code)
        if rule is None or rule.severity != self.severity:
            raise ValueError(
                f"finding {self.severity} {self.code}: not a rule of the spec's "
                "registry (smoe_gen.layout.Rule)"
            )

    @classmethod
    def of(
        cls,
        rule: Rule,
        offset: int,
        path: str,
        message: str,
        expected: Value = None,
        actual: Value = None,
    ) -> Finding:
        """A finding of ``rule`` (its code and severity).

        >>> f = Finding.of(Rule.HEADER_PARTIAL, 20, "header.total_experts", "partial")
        >>> f.severity, f.code
        ('info', 'header.partial')
        """
        return cls(rule.severity, rule.code, offset, path, message, expected, actual)

    @property
    def rule(self) -> Rule:
        """The registry's rule of this finding.

        >>> Finding.of(Rule.HEADER_SIZE, 0, "header", "short").rule is Rule.HEADER_SIZE
        True
        """
        return RULES[self.code]

    def to_dict(self) -> dict[str, Any]:
        """The finding as docs/JSON.md says (``path`` is the key ``field``).

        >>> Finding.of(Rule.HEADER_SIZE, 0, "header", "short", 64, 30).to_dict()["actual_text"]
        '0x1e (30)'
        """
        return {
            "code": self.code,
            "severity": self.severity,
            "offset": self.offset,
            "field": self.path,
            "message": self.message,
            "expected": json_value(self.expected),
            "actual": json_value(self.actual),
            "expected_text": display(self.expected),
            "actual_text": display(self.actual),
        }

    def line(self) -> str:
        """One line for terminals and error messages.

        >>> Finding.of(Rule.HEADER_PARTIAL, 20, "header.total_experts", "partial").line()
        'info: header.partial at offset 0x14 (header.total_experts): partial'
        """
        text = (
            f"{self.severity}: {self.code} at offset {self.offset:#x} ({self.path}): {self.message}"
        )
        if self.expected is not None or self.actual is not None:
            text += f" [expected {display(self.expected)}, got {display(self.actual)}]"
        return text


def document(vault: str, size: int, deep: bool, findings: Iterable[Finding]) -> dict[str, Any]:
    """The findings document of ``smoe verify --json`` (and of ``smoe-stream check --json``):
    schema, vault, size, valid, deep, errors, warnings, findings (errors first, as checked).

    >>> doc = document("v.smoe", 30, False, [Finding.of(Rule.HEADER_SIZE, 0, "header", "short")])
    >>> doc["valid"], doc["errors"], doc["warnings"], doc["findings"][0]["code"]
    (False, 1, 0, 'header.size')
    """
    items = sorted(findings, key=lambda f: SEVERITIES.index(f.severity))  # stable
    errors = sum(f.severity == "error" for f in items)
    return {
        "schema": SCHEMA,
        "vault": vault,
        "size": size,
        "valid": errors == 0,
        "deep": deep,
        "errors": errors,
        "warnings": sum(f.severity == "warning" for f in items),
        "findings": [f.to_dict() for f in items],
    }


def error_document(message: str, exit_code: int) -> dict[str, Any]:
    """The ``--json`` document of a command that failed before it could judge its input (an
    input that cannot be read, a refused command line, a failed write ...).

    >>> error_document("v.smoe: No such file or directory", 2)["error"]["exit_code"]
    2
    """
    return {"schema": SCHEMA, "ok": False, "error": {"message": message, "exit_code": exit_code}}
