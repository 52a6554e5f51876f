"""Real scale without real disk: Qwen3-235B-A22B's geometry (94 x 128 experts, ~120 GB
apparent) as a sparse file whose blobs are holes. Every tool must work on it without
reading the holes: a page fault budget far below what touching the blobs would cost."""

from __future__ import annotations

import json
import resource
import subprocess
from pathlib import Path

import numpy as np
import pytest

from smoe.format.verify import verify
from smoe.vault.reader import Vault
from smoe.vault.upgrade import upgrade
from smoe_testkit.synth import qwen3_235b_arch, write_sparse_vault

from helpers import run

PAGE_BUDGET = 20_000  # minor faults (80 MB of 4 KiB pages); touching the blobs needs ~30 M
ARCH = qwen3_235b_arch()


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_sparse_vault(tmp_path_factory.mktemp("scale") / "qwen3-235b.smoe")
    assert path.stat().st_size > 100 * 2**30
    assert path.stat().st_blocks * 512 < 16 * 2**20
    return path


def faults_self() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def run_counting(*args: object, **options: object) -> tuple[subprocess.CompletedProcess, int]:
    """:func:`helpers.run` a command; also return the minor page faults it caused."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    proc = run(*args, **options)
    return proc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before


def test_open_and_verify_in_process_touch_no_blob(big: Path) -> None:
    before = faults_self()
    v = Vault.open(big)
    assert len(v) == 12_032 and v.layers() == {lay: 128 for lay in range(94)}
    e = v.expert(93, 127)
    assert (e.tensors[0].rows, e.tensors[0].cols) == (1536, 4096)
    report = verify(v.data)
    assert report.errors == []
    assert faults_self() - before < PAGE_BUDGET


def test_cli_verify_dump_and_cpp_check(big: Path, smoe_stream: Path) -> None:
    proc, faults = run_counting("verify", "--json", big)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["errors"] == 0
    assert faults < PAGE_BUDGET + 40_000  # plus the interpreter and numpy themselves
    proc, faults = run_counting("dump", big)
    assert proc.returncode == 0
    assert "expert table (12032 entries, 94 layers)" in proc.stdout
    assert len(proc.stdout.splitlines()) < 400  # a line or two per layer, not 36,000 lines
    proc, _ = run_counting("dump", "--json", big)
    out = json.loads(proc.stdout)
    assert len(out["experts"]) == 12_032 and len(out["experts"][-1]["tensors"]) == 3
    proc, faults = run_counting("check", "--json", big, command=[smoe_stream])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["experts"] == 12_032
    assert faults < PAGE_BUDGET


def test_upgrade_of_the_v1_twin_is_in_place(tmp_path: Path) -> None:
    v1 = write_sparse_vault(tmp_path / "v1.smoe", version=1)
    blocks = v1.stat().st_blocks
    before = faults_self()
    res = upgrade(v1, ARCH)
    assert res.mode == "in-place"
    assert faults_self() - before < PAGE_BUDGET
    assert v1.stat().st_blocks == blocks  # nothing written beyond the metadata page(s)
    assert verify(np.memmap(v1, np.uint8, mode="r")).errors == []
    assert Vault.open(v1).geometry.version == 2
