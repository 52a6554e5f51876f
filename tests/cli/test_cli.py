"""`smoe-dump`, `smoe dump --json`, `smoe export` and `smoe spec` from the command line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from smoe.vault.reader import Vault
from smoe_gen.layout import TENSOR_NAMES

from fixtures_data import CKPTS, CORRUPT, EXPECTED, FIXTURES, GOOD, MANIFEST, OLMOE_CONFIG, ROOT
from helpers import SMOE_DUMP, run, strict_json


@pytest.mark.parametrize("name", GOOD)
def test_dump_json_matches_manifest(name: str) -> None:
    proc = run("dump", "--json", str(FIXTURES / name))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert set(got) == {"schema", "file", "header", "arch", "experts", "findings", "provenance"}
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
    bits = f"Q{want['header']['bits']}"
    for entry in got["experts"]:
        for t, desc in enumerate(entry["tensors"]):  # the two keys derived from the fields
            assert (desc.pop("name"), desc.pop("type_name")) == (TENSOR_NAMES[t], bits)
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
    assert "expert 0  blob" not in out  # collapsed by default
    expanded = run("--experts", str(FIXTURES / "deepseek_v2.smoe"), command=SMOE_DUMP).stdout
    assert "layer 2 expert 3  blob at 0x20000, raw 3,264 B, padded 16,384 B, 96 groups" in expanded
    assert (
        "layer 2 expert 3 down_proj  Q4  [64, 32]  packed +2176 (0x20880) 1,024 B  "
        "scales +3200 (0x20c80) 64 B" in expanded
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


def documented_keys(section: str) -> set[str]:
    """The keys of the table under ``## section`` of docs/JSON.md."""
    text = (ROOT / "docs" / "JSON.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", body, re.M))


def error_document(message: str, code: int) -> dict:
    return {
        "schema": "smoe-findings/1",
        "ok": False,
        "error": {"message": message, "exit_code": code},
    }


def test_export_and_upgrade_json_carry_their_schema(tmp_path: Path) -> None:
    out = tmp_path / "e.safetensors"
    proc = run("export", FIXTURES / "q4_v2.smoe", out, "--layer", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    assert doc["schema"] == "smoe-export/1" and set(doc) == documented_keys("Export document")
    assert doc["out"] == str(out) and len(doc["tensors"]) == 12
    proc = run("export", FIXTURES / "q4_v2.smoe", out, "--dtype", "bf16", "--json")
    assert proc.returncode == 2
    assert strict_json(proc.stdout) == error_document(
        "--dtype needs --hf (see smoe export --help)", 2
    )

    sculpted = tmp_path / "sculpted"
    assert run("sculpt", CKPTS / "qwen3_moe", sculpted, "--jobs", "1").returncode == 0
    proc = run("export", sculpted / "qwen3_moe.smoe", tmp_path / "hf", "--hf", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    assert doc["schema"] == "smoe-export-hf/1"
    assert set(doc) == documented_keys("HF export document")
    proc = run("export", FIXTURES / "q4_v2.smoe", tmp_path / "hf2", "--hf", "--json")
    assert proc.returncode == 1
    assert strict_json(proc.stdout) == error_document(
        f"{FIXTURES / 'q4_v2.smoe'}: no scout beside it (looked for q4_v2.scout.safetensors, "
        "which the sculptor writes); name it with --scout",
        1,
    )

    v1 = tmp_path / "v1.smoe"
    shutil.copyfile(FIXTURES / "q4_v1.smoe", v1)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(OLMOE_CONFIG))
    proc = run("upgrade", v1, "--config", config, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    assert doc["schema"] == "smoe-upgrade/1" and set(doc) == documented_keys("Upgrade document")
    assert (doc["path"], doc["mode"], doc["warnings"]) == (str(v1), "in-place", [])
    proc = run("upgrade", v1, "--config", tmp_path / "missing.json", "--json")
    assert proc.returncode == 2
    assert strict_json(proc.stdout) == error_document(
        f"{tmp_path / 'missing.json'}: cannot open: No such file or directory", 2
    )
