"""A vault whose blobs a manifest cannot vouch for is still never exported as NaN weights
(issue 23, case 11): a non-finite scale is refused, naming the expert and tensor."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from smoe.format import manifest
from smoe.vault.reader import Vault

from fixtures_data import CKPTS
from helpers import refused, run


def test_a_nan_scale_without_a_manifest_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "v"
    assert run("sculpt", CKPTS / "qwen3_moe", out, "--jobs", "1").returncode == 0
    vault = out / "qwen3_moe.smoe"
    manifest.path_for(vault).unlink()  # nothing to check the blobs against
    with Vault.open(vault) as v:
        d = v.descriptors[v.index(1, 2)][2]  # layer 1 expert 2 down_proj
        at = int(v.table[v.index(1, 2)]["byte_offset"]) + int(d["scales_offset"])
    raw = bytearray(vault.read_bytes())
    raw[at : at + 2] = np.array([np.nan], "<f2").tobytes()
    vault.write_bytes(bytes(raw))
    hf = tmp_path / "hf"
    line = refused(["export", vault, hf, "--hf"], 1, unchanged=[out], absent=hf)
    assert line == (
        f"error: {vault}: layer 1 expert 2 down_proj: a scale is not finite (NaN or inf), so "
        "its weights would be; refused (smoe verify --deep names the damage)"
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hf")]
    shutil.rmtree(out)
