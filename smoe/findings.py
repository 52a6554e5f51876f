"""Findings: what the verifier reports about one rule broken (or noted) at one place."""

from __future__ import annotations

from dataclasses import dataclass

SEVERITIES = ("error", "warning", "info")


def _num(v: int | float | str | None) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        return str(v)
    return f"{v:#x} ({v})"


@dataclass(frozen=True)
class Finding:
    """One rule's verdict at one place of the file.

    ``code`` is stable (tests and the C++ harness use the same codes, see
    fixtures/corrupt/EXPECTED.json); ``offset`` is absolute; ``path`` names the field,
    e.g. ``experts[17].tensors[2].scales_offset``.
    """

    severity: str
    code: str
    offset: int
    path: str
    message: str
    expected: int | float | str | None = None
    actual: int | float | str | None = None

    def to_dict(self) -> dict:
        return {"severity": self.severity, "code": self.code, "offset": self.offset,
                "path": self.path, "message": self.message,
                "expected": _num(self.expected), "actual": _num(self.actual)}

    def line(self) -> str:
        """One line for terminals and error messages."""
        text = (f"{self.severity}: {self.code} at offset {self.offset:#x} ({self.path}): "
                f"{self.message}")
        if self.expected is not None or self.actual is not None:
            text += f" [expected {_num(self.expected)}, got {_num(self.actual)}]"
        return text
