"""SIGTERM or SIGHUP while a command writes: clean-up as for Ctrl-C, exit 143 (issue 23).

A slow first fsync (harness/tests/slow_fsync_preload.c, loaded with LD_PRELOAD) holds the
command while an output is being written under its temporary name; then the signal comes.
``export --hf`` leaves neither its hidden temporary folder nor its lock; ``sculpt`` keeps
its partial and journal, and ``--resume`` completes the same vault as a clean run.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures_data import CKPTS, ROOT
from helpers import plain_env, run

SMOE = [sys.executable, "-m", "smoe"]


def signalled(
    argv: list[str | Path], slow_fsync: Path, mark: Path, sig: int, match: Path
) -> tuple[int, str]:
    """Run the CLI with ``argv``, send ``sig`` once its first fsync of a file under
    ``match`` started (not a code cache's); (status, stderr)."""
    env = plain_env(
        LD_PRELOAD=str(slow_fsync), SMOE_FSYNC_MARK=str(mark), SMOE_FSYNC_MATCH=str(match)
    )
    proc = subprocess.Popen(
        [*SMOE, *map(str, argv)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no fsync within two minutes"
            time.sleep(0.01)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stderr


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("vault")
    proc = run("sculpt", CKPTS / "qwen3_moe", out, "--jobs", "1")
    assert proc.returncode == 0, proc.stderr
    return out / "qwen3_moe.smoe"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_export_hf_cleans_up_on_sigterm(
    vault: Path, slow_fsync: Path, tmp_path: Path, sig: int
) -> None:
    out = tmp_path / "hf"
    status, stderr = signalled(
        ["export", vault, out, "--hf"], slow_fsync, tmp_path / "m", sig, tmp_path
    )
    assert (status, stderr) == (143, f"terminated ({signal.Signals(sig).name})\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no .hf.*.tmp, no .hf.lock


def test_sculpt_keeps_what_resume_needs_on_sigterm(slow_fsync: Path, tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    assert run("sculpt", CKPTS / "qwen3_moe", clean, "--jobs", "1").returncode == 0
    out = tmp_path / "out"
    status, stderr = signalled(
        ["sculpt", CKPTS / "qwen3_moe", out, "--jobs", "1"],
        slow_fsync,
        tmp_path / "m",
        signal.SIGTERM,
        out,
    )
    assert (status, stderr) == (
        143,
        "terminated (SIGTERM); run the same command with --resume to continue\n",
    )
    assert not (out / "qwen3_moe.smoe").exists()
    assert not [p for p in out.iterdir() if p.name.endswith((".tmp", ".lock"))]
    proc = run("sculpt", CKPTS / "qwen3_moe", out, "--jobs", "1", "--resume")
    assert proc.returncode == 0, proc.stderr
    for name in ("qwen3_moe.smoe", "qwen3_moe.scout.safetensors", "qwen3_moe.smoe.manifest.json"):
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name
