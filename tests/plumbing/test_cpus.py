"""The processor budget: the usable cores, and the BLAS threads an encoding worker may use."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from smoe.format.plan import make_plan
from smoe.plumbing.cpus import usable_cores
from smoe.sculpt.source.checkpoint import Checkpoint
from smoe.sculpt.workers import Job, blas_threads

from fixtures_data import CKPTS


def test_the_cap_reaches_numpys_blas() -> None:
    pytest.importorskip("threadpoolctl", reason="the calibrate extra (threadpoolctl) is missing")
    code = (
        "import json, numpy, threadpoolctl\n"
        "from smoe.plumbing.cpus import limit_blas_threads\n"
        "ok = limit_blas_threads(1)\n"
        "blas = [p['num_threads'] for p in threadpoolctl.threadpool_info()"
        " if p['user_api'] == 'blas']\n"
        "print(json.dumps([ok, blas]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ok, blas = json.loads(proc.stdout)
    assert ok and blas and set(blas) == {1}


def test_without_threadpoolctl_nothing_is_capped() -> None:
    code = (
        "import sys\n"
        "sys.modules['threadpoolctl'] = None  # as if not installed\n"
        "from smoe.plumbing.cpus import limit_blas_threads\n"
        "print(limit_blas_threads(1))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


def test_only_hessian_jobs_share_the_cores() -> None:
    ref = Checkpoint.open(CKPTS / "qwen3_moe").experts[(0, 1)]
    plain = Job(ref, make_plan({(0, 1): ref.shapes}, 4, 2).experts[0], 4, "optimal")
    hessian = replace(plain, hessians=(np.eye(64), np.eye(64), None))
    assert blas_threads([plain], 2) is None
    assert blas_threads([plain, hessian], 2) == max(1, usable_cores() // 2)
    assert blas_threads([hessian], 10 * usable_cores()) == 1
