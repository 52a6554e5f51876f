"""The processor budget: the BLAS threads a process may start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


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
