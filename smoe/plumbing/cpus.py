"""What this process may use of the machine's processors."""

from __future__ import annotations

import os

__all__ = ["limit_blas_threads", "usable_cores"]


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


def limit_blas_threads(n: int) -> bool:
    """Cap the BLAS libraries loaded in this process (numpy's OpenBLAS, ...) at ``n``
    threads, through threadpoolctl where it is installed (the ``calibrate`` extra brings
    it); whether a cap was set. Forked workers that each run matrix products would
    otherwise each start a thread per core, and on small matrices the threads cost more
    than they gain: the calibrated Q2 sculpt of ``tiny-moe-py`` (matrices of 128 x 256)
    took 88 s on 2 cores with numpy's default threads (151 s on 16 cores) and 48 s with one
    thread a worker.

    >>> limit_blas_threads(usable_cores()) in (True, False)
    True
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # no cap: correct, only slower with many workers
        return False
    threadpool_limits(limits=max(1, int(n)), user_api="blas")
    return True
