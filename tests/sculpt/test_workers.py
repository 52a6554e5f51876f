"""The encoding workers' share of the processors (smoe.sculpt.workers)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from smoe.format.plan import make_plan
from smoe.plumbing.cpus import usable_cores
from smoe.sculpt.source.checkpoint import Checkpoint
from smoe.sculpt.workers import Job, blas_threads

from fixtures_data import CKPTS


def test_only_hessian_jobs_share_the_cores() -> None:
    ref = Checkpoint.open(CKPTS / "qwen3_moe").experts[(0, 1)]
    plain = Job(ref, make_plan({(0, 1): ref.shapes}, 4, 2).experts[0], 4, "optimal")
    hessian = replace(plain, hessians=(np.eye(64), np.eye(64), None))
    assert blas_threads([plain], 2) is None
    assert blas_threads([plain, hessian], 2) == max(1, usable_cores() // 2)
    assert blas_threads([hessian], 10 * usable_cores()) == 1
