"""Which kernels a run uses when the compiled ones would first have to be compiled, and
``smoe warmup``: every compiled kernel compiled (or loaded) up front.

A small job finishes sooner in numpy than the compiled kernels take to compile (tens of
seconds on a cold cache) or even to load (most of a second on a warm one: numba's import
alone is half of it), so :func:`run_kernel` chooses numpy for a whole run when
:func:`pick_kernel` says the compiled kernels would not make up for starting them. Either
way the output is the same, byte for byte (the compiled kernels repeat numpy's arithmetic).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Literal

from smoe.quant.compiling import LOAD_S, KernelCall, Warmed, cold_seconds, run_kernels
from smoe.quant.decoder import decoder_kernels
from smoe.quant.dispatch import compiled_module
from smoe.quant.encoder import encoder_kernels
from smoe.quant.traits import KERNEL_ENV, ScaleMode

__all__ = ["SAVED_NS", "all_kernels", "cache_notes", "pick_kernel", "run_kernel", "warmup"]

SAVED_NS: dict[tuple[int, str, bool], float] = {
    (4, "optimal", False): 5.1,
    (4, "optimal", True): 10.8,
    (2, "optimal", False): 4.5,
    (2, "optimal", True): 14.3,
    (4, "absmax", False): 2.5,
    (4, "absmax", True): 3.1,
    (2, "absmax", False): 2.6,
    (2, "absmax", True): 3.8,
}
"""Per ``(bits, scale, weighted)``, the nanoseconds of one core the compiled encoder saves
per weight against numpy: encoding bfloat16 bits as a sculpt does (``encode_into`` with SNR
statistics), CPU time, measured here (numpy / compiled: Q4 optimal 7.3 / 2.2, weighted
13.2 / 2.4; Q2 optimal 7.4 / 2.9, weighted 17.8 / 3.5; absmax 3.8 / 1.3, weighted 4.7-5.3 /
1.5-1.6 ns; :mod:`bench.quant_bench` measures the rates)."""


def pick_kernel(
    weights: int, startup_s: float, saved_ns: float, workers: int = 1
) -> Literal["numpy", "fast"]:
    """The encoder a run of ``weights`` weights (in tensors the compiled one would take,
    spread over ``workers`` processes) finishes sooner with: ``numpy`` when the time the
    compiled kernels save (``saved_ns`` per weight and core, :data:`SAVED_NS`) falls short
    of the ``startup_s`` seconds they cost first (compiling them into a cold cache, or
    loading them from a warm one: :data:`~smoe.quant.compiling.LOAD_S`).

    >>> pick_kernel(25_000_000, startup_s=60.0, saved_ns=5.1)  # a 50 MB model, cold cache
    'numpy'
    >>> pick_kernel(25_000_000, startup_s=0.7, saved_ns=5.1)  # warm: numpy is still sooner
    'numpy'
    >>> pick_kernel(1_200_000_000, startup_s=0.7, saved_ns=5.1, workers=2)  # 2.4 GB, warm
    'fast'
    """
    saved_s = weights * saved_ns * 1e-9 / max(1, workers)
    return "numpy" if saved_s < startup_s else "fast"


def run_kernel(
    sets: Iterable[tuple[int, ScaleMode]],
    weights: int,
    *,
    importance: bool = False,
    workers: int = 1,
) -> Literal["numpy"] | None:
    """``numpy`` where a run that encodes ``weights`` weights in large tensors (those of at
    least :data:`~smoe.quant.traits.FAST_MIN_WEIGHTS`, which ``auto`` gives the compiled
    encoder) at each ``(bits, scale)`` of ``sets``, with importance or not, on ``workers``
    processes, finishes sooner with numpy (:func:`pick_kernel`, the start-up being
    :data:`~smoe.quant.compiling.LOAD_S` plus the estimated compile of the kernels the
    cache lacks, :func:`~smoe.quant.compiling.cold_seconds`); None to leave ``auto`` to
    choose per tensor, and always when ``$SMOE_KERNEL`` forces a choice. numba is not
    imported when even a warm start would not pay.

    >>> run_kernel([(4, "optimal")], 25_000_000)  # 50 MB: numpy, whatever the cache holds
    'numpy'
    """
    if os.environ.get(KERNEL_ENV, "auto") not in ("", "auto"):
        return None
    sets = sorted(set(sets))
    saved = max((SAVED_NS.get((b, s, importance), 2.5) for b, s in sets), default=0.0)
    if pick_kernel(weights, LOAD_S, saved, workers) == "numpy":
        return "numpy"
    calls = [c for bits, scale in sets for c in encoder_kernels(bits, scale, importance=importance)]
    if not calls:  # no numba (or another choice made): auto falls back by itself
        return None
    startup = LOAD_S + cold_seconds(calls)
    return "numpy" if pick_kernel(weights, startup, saved, workers) == "numpy" else None


def all_kernels() -> list[KernelCall]:
    """Every compiled kernel (whatever ``$SMOE_KERNEL`` says): the encoder's at every width
    and scale, plain and weighted, from bfloat16 and from float32, then the decoder's;
    none without numba. Nothing is compiled yet.

    >>> names = [call.name for call in all_kernels()]
    >>> names[1:3] if names else ["encode Q4 optimal", "encode Q4 optimal weighted"]  # no numba
    ['encode Q4 optimal', 'encode Q4 optimal weighted']
    """
    if compiled_module("encode") is None or compiled_module("decode") is None:
        return []
    calls: dict[str, KernelCall] = {}
    every: tuple[tuple[int, ScaleMode], ...] = ((4, "optimal"), (2, "optimal"), (4, "absmax"))
    for bits, scale in every:  # (absmax: one kernel for both widths)
        for call in encoder_kernels(bits, scale, importance=True, kernel="fast"):
            calls.setdefault(call.name, call)
    for call in decoder_kernels("fast"):
        calls.setdefault(call.name, call)
    return list(calls.values())


def warmup() -> list[Warmed] | None:
    """Compile (or load from the cache) every compiled kernel now (:func:`all_kernels`),
    saying so when it compiles (:func:`~smoe.quant.compiling.run_kernels`); what happened
    to each, or None without numba (numpy kernels only).

    >>> from unittest import mock
    >>> from smoe.quant import dispatch
    >>> with mock.patch.dict(dispatch._FAST, {"module": None}):  # as if numba were missing
    ...     warmup() is None
    True
    """
    calls = all_kernels()
    if not calls:
        return None
    return run_kernels(calls)


def cache_notes() -> tuple[list[str], list[str]]:
    """What numba's disk cache could not do for this process's kernels, as ``PLACE: WHY``
    lines (:mod:`smoe.quant.kernels.disk_cache`): the damaged entries (compiled afresh and
    rewritten, unless their place is also in the second list) and the places the compiled
    code could not be kept (it ran from memory). Empty lists before any kernel was set up.

    >>> damaged, not_kept = cache_notes()
    >>> isinstance(damaged, list) and isinstance(not_kept, list)
    True
    """
    module = sys.modules.get("smoe.quant.kernels.disk_cache")  # never imported just to ask
    if module is None:
        return [], []
    damaged, not_kept = module.notes().lines()
    return damaged, not_kept
