"""The compiled kernels' first run (issue 25): numba compiles each kernel on its first call
(seconds to a minute each) and keeps the machine code in its disk cache (``__pycache__``
beside the kernel modules, or ``$NUMBA_CACHE_DIR``), from which later processes load it in
a fraction of a second.

:func:`run_kernels` calls a list of kernels once each (:class:`KernelCall`: the encoder's
from :func:`smoe.quant.encoder.encoder_kernels`, the decoder's from
:func:`smoe.quant.decoder.decoder_kernels`), compiling or loading them, and when numba
actually compiles (it broadcasts an event for a compilation, never for a load from its
cache) says so through the logger :data:`LOGGER`, at level INFO, before the compile starts:
``compiling kernels for this machine, once: about N s``, then ``kernel K of M: NAME`` as each
kernel starts compiling, then how long it took. A warm cache says nothing. The ``smoe``
command prints these lines on stderr; a library caller sees them only if it configures
logging (``logging.basicConfig(level=logging.INFO)``).

The estimate N is the sum of :data:`COMPILE_S` (constants measured here, see there) over
the kernels the cache does not hold (:attr:`KernelCall.cached`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "COMPILE_S",
    "DEFAULT_COMPILE_S",
    "LOAD_S",
    "LOGGER",
    "KernelCall",
    "Warmed",
    "about",
    "cold_seconds",
    "run_kernels",
]

LOGGER = "smoe.quant.compiling"
"""The logger the compile notices go to (INFO)."""

_LOG = logging.getLogger(LOGGER)

COMPILE_S: dict[str, float] = {
    "einsum order check (Q4 optimal)": 1.2,
    "encode Q4 optimal": 26.0,
    "encode Q4 optimal weighted": 32.0,
    "encode Q2 optimal": 48.0,
    "encode Q2 optimal weighted": 91.0,
    "encode absmax": 19.0,
    "encode absmax weighted": 12.0,
    "decode to float32": 2.1,
    "decode to bfloat16": 1.9,
    "decode to float32, read-only input": 1.8,
    "decode to bfloat16, read-only input": 1.7,
}
"""Seconds each kernel takes to compile into an empty cache: the CPU seconds measured here
(a 2-core AMD EPYC shared with other work, numba 0.68.1, Python 3.11), each kernel set in
a fresh process with an empty ``NUMBA_CACHE_DIR``, in the order a sculpt compiles it
(plain before weighted: the weighted kernel reuses the callees the plain one compiled).
CPU seconds, not wall: on a busy machine the wall time is longer (here up to twice), on a
faster one shorter. The figure only sizes the ``about N s`` notice and the small-job rule
(:mod:`smoe.quant.first_run`); ``make bench`` measures a first sculpt again
(:func:`bench.quant_bench.first_run_figures`)."""

DEFAULT_COMPILE_S = 10.0
"""The estimate for a kernel :data:`COMPILE_S` does not name."""

LOAD_S = 0.8
"""Seconds a fresh process spends before its first compiled encode on a warm cache:
importing numba and the kernel module (0.4 s) and loading the first kernel from the disk
cache (0.4 s: numba's code generator starts; the next kernels take 0.01-0.1 s each),
CPU seconds measured here as :data:`COMPILE_S`."""


@dataclass(frozen=True)
class KernelCall:
    """One compiled kernel (one entry point at one set of argument types): ``run`` calls it
    once on a small sample (compiling it, or loading it from the cache); ``cached`` says,
    without compiling or loading anything, whether that would find it compiled (in this
    process or on disk; None: cannot tell, counted as not).

    >>> call = KernelCall("encode absmax", run=lambda: None, cached=lambda: True)
    >>> call.cached(), call.estimate_s == COMPILE_S[call.name]
    (True, True)
    """

    name: str
    run: Callable[[], object]
    cached: Callable[[], bool | None]

    @property
    def estimate_s(self) -> float:
        """Seconds to compile it into an empty cache (:data:`COMPILE_S`; a kernel it does not
        name: :data:`DEFAULT_COMPILE_S`).

        >>> KernelCall("a kernel of another version", print, print).estimate_s
        10.0
        """
        return COMPILE_S.get(self.name, DEFAULT_COMPILE_S)


@dataclass(frozen=True)
class Warmed:
    """What :func:`run_kernels` did with one kernel: compiled it now (``compiled``) or
    found it (in its disk cache, or this process), in ``seconds``.

    >>> Warmed("decode to float32", compiled=False, seconds=0.01).compiled
    False
    """

    name: str
    compiled: bool
    seconds: float


def cold_seconds(calls: Sequence[KernelCall]) -> float:
    """The estimated seconds to compile those of ``calls`` the cache does not hold (0: all
    of them are compiled already, in this process or on disk).

    >>> warm = KernelCall("encode absmax", lambda: None, lambda: True)
    >>> cold = KernelCall("encode Q4 optimal", lambda: None, lambda: False)
    >>> cold_seconds([warm]), cold_seconds([warm, cold]) == COMPILE_S[cold.name]
    (0.0, True)
    """
    return float(sum(c.estimate_s for c in calls if c.cached() is not True))


def about(seconds: float) -> int:
    """``seconds`` as the notice rounds it: whole seconds, to 5 s from 20 s on, at least 1.

    >>> about(0.2), about(7.4), about(43.0), about(128.0)
    (1, 7, 45, 130)
    """
    if seconds >= 20:
        return int(5 * round(seconds / 5))
    return max(1, round(seconds))


def run_kernels(calls: Sequence[KernelCall]) -> list[Warmed]:
    """Call every kernel of ``calls`` once (compiling it or loading it from the cache), in
    order; what happened to each. The first compile announces itself through
    :data:`LOGGER` before it starts, with the estimate for the kernels the cache lacks,
    each kernel that compiles is counted as it starts, and the end says how long it took:

    >>> import logging
    >>> class Shown(logging.Handler):
    ...     def emit(self, record):
    ...         print(record.getMessage())
    >>> log = logging.getLogger(LOGGER)
    >>> log.addHandler(shown := Shown()); log.setLevel(logging.INFO)
    >>> kernels = [KernelCall(f"kernel {i}", lambda: None, lambda: True) for i in (1, 2)]
    >>> [w.compiled for w in run_kernels(kernels)]  # all cached: not a word
    [False, False]
    >>> log.removeHandler(shown); log.setLevel(logging.NOTSET)

    Needs numba when ``calls`` is not empty (the calls come from the kernel modules).
    """
    if not calls:
        return []
    from smoe.quant.kernels import jit  # (the kernels exist, so numba imports)

    notices = _Notices(list(calls), [c.cached() is not True for c in calls])
    done = []
    with jit.compiles_watched(notices.compiling):
        for i, call in enumerate(calls):
            notices.current, notices.hit = i, False
            t = time.perf_counter()
            call.run()
            done.append(Warmed(call.name, notices.hit, time.perf_counter() - t))
    notices.finish()
    return done


@dataclass
class _Notices:
    """The notices of one :func:`run_kernels`: ``calls``, which of them the cache lacks
    (``cold``, as predicted), the kernel being called (``current``) and whether it has
    compiled (``hit``), how many have (``count``), since when (``t0``)."""

    calls: list[KernelCall]
    cold: list[bool]
    current: int = 0
    hit: bool = False
    count: int = 0
    t0: float | None = None

    def compiling(self) -> None:
        """numba starts compiling something (the current kernel, or a callee of it)."""
        if self.hit:
            return
        self.hit = True
        self.count += 1
        later = sum(self.cold[self.current + 1 :])
        if self.t0 is None:
            self.t0 = time.perf_counter()
            left = [
                c
                for i, c in enumerate(self.calls[self.current :])
                if i == 0 or self.cold[self.current + i]
            ]
            seconds = sum(c.estimate_s for c in left)
            _LOG.info("compiling kernels for this machine, once: about %d s", about(seconds))
        name = self.calls[self.current].name
        _LOG.info("  kernel %d of %d: %s", self.count, self.count + later, name)

    def finish(self) -> None:
        """Every kernel called: how long the compiles took, if any ran."""
        if self.t0 is not None:
            from smoe.quant.kernels.disk_cache import notes  # (kernels compiled: numba is in)

            seconds = time.perf_counter() - self.t0
            kernels = f"{self.count} kernel{'s' if self.count > 1 else ''}"
            later = (
                "numba's cache could not keep them (smoe warmup says why)"
                if notes().not_kept
                else "later runs load them from the cache"
            )
            _LOG.info("compiled %s in %.1f s; %s", kernels, seconds, later)
