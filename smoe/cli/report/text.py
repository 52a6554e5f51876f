"""Numbers and counts as the page writes them."""

from __future__ import annotations

import math

__all__ = ["human"]


def fmt_db(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if math.isinf(v):
        return "exact"
    return f"{v:.2f} dB"


def experts_text(n: int) -> str:
    return f"{fmt_num(n)} expert{'' if n == 1 else 's'}"


def fmt_num(v: int | float) -> str:
    return f"{int(v):,}"


def human(n: int | float, digits: int = 1) -> str:
    """Bytes in IEC units.

    >>> human(64), human(16384), human(120_647_139_328)
    ('64 B', '16.0 KiB', '112.4 GiB')
    """
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1024
    return f"{n:.{digits}f} TiB"
