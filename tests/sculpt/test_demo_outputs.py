"""What ``make demo`` writes is byte-identical to the committed record (fixtures/DEMO.json),
whichever encoder runs and however many workers share the experts."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from fixtures_data import FIXTURES
from helpers import plain_env, run

DEMO = json.loads((FIXTURES / "DEMO.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(("kernel", "jobs"), [("auto", "2"), ("numpy", "1"), ("fast", "2")])
def test_the_demo_sculpt_writes_the_recorded_bytes(tmp_path: Path, kernel: str, jobs: str) -> None:
    if kernel == "fast" and importlib.util.find_spec("numba") is None:
        pytest.skip("the compiled encoder needs numba (pip install 'smoe[fast]')")
    out = tmp_path / "demo"
    proc = run(
        "sculpt",
        FIXTURES / DEMO["checkpoint"],
        out,
        "--jobs",
        jobs,
        env=plain_env(SMOE_KERNEL=kernel),
    )
    assert proc.returncode == 0, proc.stderr
    written = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}
    assert written == DEMO["sha256"]
