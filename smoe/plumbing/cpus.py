"""What this process may use of the machine's processors."""

from __future__ import annotations

import os

__all__ = ["usable_cores"]


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count), at
    least 1: the default of every ``--jobs`` and ``threads``.

    >>> usable_cores() >= 1
    True
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
