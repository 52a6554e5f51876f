"""The calibrated run, layer by layer (called by :mod:`smoe.sculpt.driver` under the lock):
statistics of every routed expert from the runner, the blobs by the Hessian-aware encoder
(the driver's workers), then the layer run again on the blobs as the vault holds them, so
that the next layer is calibrated on the quantised model's hidden states."""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from smoe import quant
from smoe.format.plan import ExpertSlot
from smoe.sculpt.calibrate.layers import Estimate, Tally, decode_blob, estimate, partial_fd
from smoe.sculpt.calibrate.runner import (
    ExpertStats,
    LayerRunner,
    import_torch,
    source_weights,
    threads,
)
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef
from smoe.sculpt.workers import Job

__all__ = [
    "RUN_FIGURES",
    "TOKENS_PER_BATCH",
    "CalibrationInputs",
    "calibrate_layers",
]

RUN_FIGURES = ("seconds", "peak_device_bytes", "peak_rss_bytes")
"""The keys of the calibration's record that measure the run (time, memory: they differ
between two runs of one command): the summary's and ``--json``'s, never the manifest's."""

TOKENS_PER_BATCH = 8192
"""Tokens per forward call (whole sequences; at least one): the activations of one call
stay small beside the carried hidden states."""

Key = tuple[int, int]


@dataclass(frozen=True)
class CalibrationInputs:
    """What a calibrated run reads: the checkpoint, the experts chosen (``refs``), the
    calibration's token ``ids``, the code width and device, the experts still to write
    (``todo``) and those a resume kept, every expert's slot and the partial vault.

    >>> from smoe.sculpt.source.checkpoint import Checkpoint
    >>> ckpt = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
    >>> refs = [ckpt.experts[(0, 1)]]
    >>> ids = np.zeros((1, 8), np.int64)
    >>> inputs = CalibrationInputs(
    ...     ckpt=ckpt, refs=refs, ids=ids, bits=4, device="cpu", todo=[], kept=set(),
    ...     slots={}, partial=Path("out/.q4.smoe.partial"))
    >>> inputs.refs[0].layer, inputs.ids.shape
    (0, (1, 8))
    """

    ckpt: Checkpoint
    refs: Sequence[ExpertRef]
    ids: np.ndarray
    bits: int
    device: str
    todo: Sequence[Job]
    kept: Collection[Key]
    slots: Mapping[Key, ExpertSlot]
    partial: Path


class CalibrationSink(Protocol):
    """Where a calibrated run's experts go (the driver's writer and journal).

    >>> class Shown:
    ...     def write(self, jobs): return {}
    ...     def adopt(self, key, estimates): print("adopted", key)
    ...     def annotate(self, key, estimates): print("annotated", key)
    >>> sink: CalibrationSink = Shown()
    >>> sink.adopt((0, 1), [None, None, None])
    adopted (0, 1)
    """

    def write(self, jobs: list[Job]) -> dict[Key, list[Any]]:
        """Encode and write the layer's ``jobs``; the encoder's reports per key."""
        ...

    def adopt(self, key: Key, estimates: list[Estimate | None]) -> None:
        """Record an expert this run wrote, with its estimates."""
        ...

    def annotate(self, key: Key, estimates: list[Estimate | None]) -> None:
        """Add the estimates to an expert a resume kept."""
        ...


def calibrate_layers(inputs: CalibrationInputs, sink: CalibrationSink) -> dict[str, Any]:
    """Every decoder layer up to the last with a chosen expert: collect, ``sink.write`` the
    layer's jobs with their statistics (the encoder's reports per key come back),
    ``sink.adopt`` each new expert with its estimates (``annotate`` a kept one), propagate.
    Returns the calibration's counts, seconds and peak memory. :func:`smoe.sculpt.sculpt`
    calls it with ``--calibrate``:

    >>> import tempfile
    >>> import numpy as np
    >>> from smoe.sculpt import SculptOptions, sculpt
    >>> d = Path(tempfile.mkdtemp())
    >>> np.save(d / "c.npy", np.arange(48).reshape(4, 12) % 128)
    >>> res = sculpt("fixtures/checkpoints/qwen3_moe", d, SculptOptions(calibrate=d / "c.npy"))
    >>> res.calibration["experts_calibrated"] + res.calibration["experts_unrouted"]
    16
    """
    t0 = time.perf_counter()
    torch = import_torch()
    torch.set_num_threads(threads())
    ckpt, bits, partial = inputs.ckpt, inputs.bits, inputs.partial
    seq_len = inputs.ids.shape[1]
    runner = LayerRunner(ckpt, inputs.ids, inputs.device, max(1, TOKENS_PER_BATCH // seq_len))
    runner.start()
    jobs_of: dict[int, list[Job]] = defaultdict(list)
    for job in inputs.todo:
        jobs_of[job.ref.layer].append(job)
    chosen = {(r.layer, r.expert) for r in inputs.refs}
    moe = set(ckpt.moe_layers)
    tally = Tally()
    fd = partial_fd(partial)
    try:
        for n in range(max(r.layer for r in inputs.refs) + 1):
            refs = [ckpt.experts[(n, e)] for e in ckpt.layer_experts(n)] if n in moe else []
            weights = source_weights(refs)
            stats = runner.collect(n, weights)
            jobs = [_with_stats(job, stats.get(job.ref.expert)) for job in jobs_of.get(n, [])]
            reports = sink.write(jobs) if jobs else {}
            tally.failed += sum(
                1 for rows in reports.values() for r in rows if r is not None and r.fallback
            )
            quantised = dict(weights)
            for e in ckpt.layer_experts(n) if n in moe else []:
                key = (n, e)
                if key not in chosen:
                    continue
                quantised[e] = decode_blob(fd, partial, inputs.slots[key], bits)
                st = stats.get(e)
                hs = st.hessians() if st is not None else (None, None, None)
                tokens = st.tokens if st is not None else 0
                _count(tally, key, hs, kept=key in inputs.kept)
                ests = [
                    None if h is None else estimate(w, w_hat, h, bits, tokens)
                    for w, w_hat, h in zip(weights[e], quantised[e], hs)
                ]
                tally.estimates[key] = ests
                (sink.annotate if key in inputs.kept else sink.adopt)(key, ests)
            del stats, jobs, reports
            runner.propagate(n, quantised if n in moe else None)
    finally:
        os.close(fd)
    tally.seconds = time.perf_counter() - t0
    record = tally.record() | {"seconds": round(tally.seconds, 3)}
    record["peak_device_bytes"] = runner.peak_bytes or None
    record["peak_weight_bytes"] = runner.peak_weight_bytes
    record["peak_rss_bytes"] = _peak_rss()
    record["sequential"] = True
    return record


def _with_stats(job: Job, st: ExpertStats | None) -> Job:
    """The job with its expert's statistics (none for an expert no token reached)."""
    return job if st is None or st.tokens == 0 else replace(job, hessians=st.hessians())


def _count(tally: Tally, key: Key, hs: tuple[Any, ...], kept: bool) -> None:
    """Count a chosen expert as calibrated or unrouted, whether this run wrote it or a
    resume kept it; a kept expert's tensors that fell back to the plain encoder are found
    again from their statistics (this run's written ones come in the encoder's reports)."""
    if all(h is None for h in hs):
        tally.unrouted.append(key)
        return
    tally.calibrated += 1
    if kept:
        tally.failed += sum(1 for h in hs if h is not None and quant.hessian_fallback(h))


def _peak_rss() -> int | None:
    """This process's peak resident memory so far (Linux and macOS), or None."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
