"""One benchmark figure: ours next to a baseline measured in the same run, and the goal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable


def figure(
    name: str,
    ours: float,
    baseline: float | None,
    unit: str,
    goal: str,
    passed: bool | None,
    ratio: float | None = None,
    detail: str | None = None,
    summary: bool = False,
) -> dict:
    """``ratio`` defaults to ours / baseline (for times, pass baseline / ours yourself).

    ``baseline`` is the limit or baseline measured in the same run; ``detail`` says how
    (kept in build/bench.json, left out of the tables). An informative figure
    (``passed`` None) is in the closing one-screen table only with ``summary``: what bounds
    a figure that misses its goal.
    """
    if ratio is None and baseline:
        ratio = ours / baseline
    out = {
        "name": name,
        "ours": ours,
        "baseline": baseline,
        "ratio": ratio,
        "unit": unit,
        "goal": goal,
        "pass": passed,
    }
    if detail:
        out["detail"] = detail
    if summary:
        out["summary"] = True
    return out


def best_time(fn: Callable[[], object], repeat: int = 5, min_time: float = 0.0) -> float:
    """Best wall time of ``repeat`` calls (at least until ``min_time`` seconds have passed)."""
    best = float("inf")
    start = time.perf_counter()
    runs = 0
    while runs < repeat or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        runs += 1
    return best


def peak_rss_of(cmd: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """Run ``cmd``; (seconds, peak RSS in bytes of ``cmd`` alone, stdout).

    A fresh wrapper process waits for ``cmd`` only, so RUSAGE_CHILDREN is ``cmd``'s own.
    """
    wrapper = [
        sys.executable,
        "-c",
        "import resource, subprocess, sys, time, json\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "dt = time.perf_counter() - t\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024\n"
        "sys.stderr.write(p.stderr)\n"
        "print(json.dumps({'rc': p.returncode, 's': dt, 'rss': rss, 'out': p.stdout}))\n",
    ]
    proc = subprocess.run(wrapper + cmd, capture_output=True, text=True, env=env or os.environ)
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    if info["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({info['rc']}): {proc.stderr[-2000:]}")
    return info["s"], info["rss"], info["out"]
