"""`smoe-dump`, `smoe dump --json`, `smoe export` and `smoe spec` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from smoe.vault.reader import Vault

from fixtures_data import CORRUPT, EXPECTED, FIXTURES, GOOD, MANIFEST
from helpers import SMOE_DUMP, run


@pytest.mark.parametrize("name", GOOD)
def test_dump_json_matches_manifest(name: str) -> None:
    proc = run("dump", "--json", str(FIXTURES / name))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert set(got) == {"schema", "file", "header", "arch", "experts", "findings"}
    assert got["schema"] == "smoe-findings/1"
    want = MANIFEST[name]
    assert got["header"] == want["header"]
    if want["arch"] is None:
        assert got["arch"] is None
    else:
        arch = {k: v for k, v in got["arch"].items() if k != "flag_names"}
        assert arch.keys() == want["arch"].keys()
        for k, v in want["arch"].items():
            assert arch[k] == (pytest.approx(v, rel=1e-7) if isinstance(v, float) else v), k
    assert got["experts"] == want["experts"]
    assert all(f["severity"] != "error" for f in got["findings"])


def test_dump_text_tree() -> None:
    proc = run(str(FIXTURES / "deepseek_v2.smoe"), command=SMOE_DUMP)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    lines = out.splitlines()
    assert lines[0].startswith(
        f"{FIXTURES / 'deepseek_v2.smoe'}  147,456 bytes  v2  Q4  "
        "group 64  data_offset 0x4000  full vault, 8 experts"
    )
    for text in (
        "header (64 bytes at 0)",
        "arch block (128 bytes at 1536)",
        "flags                  0x4 = has_dense_layer_0",
        "model_type             deepseek_v3",
        "expert table (8 entries, 2 layers)",
        "layer 1: 4 experts (ids 0-3), gate_proj 32x64 up_proj 32x64 down_proj 64x32, "
        "blobs 0x4000..0x14000",
        "(--experts to list every expert",
        "findings (0)",
    ):
        assert text in out, text
    assert "expert 0: blob" not in out  # collapsed by default
    expanded = run("--experts", str(FIXTURES / "deepseek_v2.smoe"), command=SMOE_DUMP).stdout
    assert "expert 3: blob at 0x20000, raw 3,264 B, padded 16,384 B, 96 groups" in expanded
    assert (
        "down_proj [64, 32]  packed +2176 (0x20880) 1,024 B  scales +3200 (0x20c80) 64 B"
        in expanded
    )
    one = run("--layer", "2", str(FIXTURES / "deepseek_v2.smoe"), command=SMOE_DUMP).stdout
    assert "layer 2: 4 experts" in one and "layer 1:" not in one


def test_dump_of_broken_and_v1_vaults() -> None:
    proc = run(str(CORRUPT / "duplicate_expert.smoe"), command=SMOE_DUMP)
    assert proc.returncode == 1
    assert (
        "error: table.duplicate at 0x74 (experts[1].expert_id): (layer 0, expert 0) appears "
        "twice" in " ".join(proc.stdout.split())
    )
    v1 = run(str(FIXTURES / "q4_v1.smoe"), command=SMOE_DUMP)
    assert "arch block: none (version 1)" in v1.stdout
    bad = run(str(CORRUPT / "bad_magic.smoe"), command=SMOE_DUMP)
    assert bad.returncode == 1 and "header.magic" in bad.stdout
    assert run(str(FIXTURES / "missing.smoe"), command=SMOE_DUMP).returncode == 2


def test_dump_json_of_every_corrupt_fixture_is_well_formed() -> None:
    for name, exp in EXPECTED.items():
        proc = run("dump", "--json", "--deep", str(CORRUPT / name))
        assert proc.returncode == 1, name
        got = json.loads(proc.stdout)
        assert any(
            (f["code"], f["field"], f["offset"]) == (exp["code"], exp["field"], exp["offset"])
            for f in got["findings"]
        ), name
        assert "Traceback" not in proc.stderr


def test_export_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "experts.safetensors"
    proc = run("export", str(FIXTURES / "qwen3_v2.smoe"), str(out), "--layer", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    names = json.loads(proc.stdout)["tensors"]
    assert len(names) == 12
    tensors = load_file(str(out))
    assert sorted(tensors) == sorted(names)
    v = Vault.open(FIXTURES / "qwen3_v2.smoe")
    for e in range(4):
        view = v.expert(1, e)
        for t in view.tensors:
            got = tensors[f"model.layers.1.mlp.experts.{e}.{t.name}.weight"]
            assert got.dtype == np.float32 and np.array_equal(got, t.dequantize())
    one = tmp_path / "one.safetensors"
    assert (
        run(
            "export", str(FIXTURES / "qwen3_v2.smoe"), str(one), "--layer", "0", "--expert", "2"
        ).returncode
        == 0
    )
    assert sorted(load_file(str(one))) == [
        f"model.layers.0.mlp.experts.2.{n}.weight" for n in ("down_proj", "gate_proj", "up_proj")
    ]
    none = run(
        "export", str(FIXTURES / "qwen3_v2.smoe"), str(tmp_path / "x.safetensors"), "--layer", "9"
    )
    assert none.returncode == 1
    assert " ".join(none.stderr.split()) == (
        f"error: {FIXTURES / 'qwen3_v2.smoe'}: no expert matches layer 9"
    )
    assert not (tmp_path / "x.safetensors").exists()


def test_spec_command() -> None:
    got = json.loads(run("spec", "--json").stdout)
    assert got["page_size"] == 16384 and got["supported_bits"] == [2, 4]
    assert got["structs"]["ExpertEntry"]["size"] == 48
