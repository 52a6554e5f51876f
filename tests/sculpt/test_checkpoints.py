"""The Sculptor on real transformers 5 checkpoints (fixtures/checkpoints, see its README)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from smoe import quant
from smoe.errors import SmoeError
from smoe.families.registry import FAMILIES
from smoe.interop.safetensors_io import read_header
from smoe.sculpt import SculptOptions, sculpt
from smoe.sculpt.source.checkpoint import Checkpoint
from smoe.vault.reader import Vault

from fixtures_data import CKPT_MANIFEST as MANIFEST
from fixtures_data import CKPTS, CONVERT, REFUSE

SAME_AS_QWEN3 = ["qwen3_moe_fused", "qwen3_moe_sharded", "qwen3_moe_old_config"]


@pytest.fixture(scope="module")
def sculpted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("sculpted")
    return {name: sculpt(CKPTS / name, out, SculptOptions()) for name in CONVERT}


def test_manifest_lists_what_is_on_disk() -> None:
    for name, info in MANIFEST.items():
        for fname, meta in info["files"].items():
            data = (CKPTS / name / fname).read_bytes()
            assert hashlib.sha256(data).hexdigest() == meta["sha256"], f"{name}/{fname}"


@pytest.mark.parametrize("name", CONVERT)
def test_header_and_arch_match_the_config(sculpted, name: str) -> None:
    cfg = MANIFEST[name]["config"]
    v = Vault.open(sculpted[name].vault)
    h, a = v.header, v.arch
    assert int(h["d_model"]) == cfg["hidden_size"]
    assert int(h["vocab_size"]) == cfg["vocab_size"]
    assert int(h["num_moe_layers"]) == len(cfg["moe_layers"])
    assert int(h["max_experts_per_layer"]) == cfg["num_experts"]
    assert sorted(v.layers()) == cfg["moe_layers"]
    dense = cfg.get("dense_intermediate_size") if cfg.get("dense_layer_0") else None
    shared = cfg.get("shared_expert_intermediate_size") or 0
    assert int(h["ffn_dim"]) == (dense or shared or cfg["config_intermediate_size"])  # D5
    assert float(a["rope_theta"]) == pytest.approx(cfg["rope_theta"])
    assert int(a["num_heads"]) == cfg["num_attention_heads"]
    assert int(a["num_kv_heads"]) == cfg["num_key_value_heads"]
    mla = cfg.get("mla")
    want_hd = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] if mla else cfg["head_dim"]
    assert int(a["head_dim"]) == want_hd  # R3 for MLA
    assert int(a["moe_top_k"]) == cfg["top_k"]
    assert int(a["moe_ffn_dim"]) == cfg["moe_intermediate_size"]
    assert int(a["num_hidden_layers"]) == cfg["num_layers"]
    assert float(a["rms_norm_eps"]) == pytest.approx(cfg["rms_norm_eps"])
    assert a["model_type"].decode() == MANIFEST[name]["model_type"]
    flags = int(a["flags"])
    assert bool(flags & 1) == cfg["norm_topk_prob"]
    assert bool(flags & 2) == cfg["has_qk_norm"]
    assert bool(flags & 4) == cfg["dense_layer_0"]
    assert int(a["shared_expert_ffn_dim"]) == shared
    assert int(a["dense_ffn_dim"]) == (dense or 0)
    beyond = FAMILIES[cfg_model_type(name)].beyond
    carry = [
        f"the arch block cannot carry {cfg_model_type(name)}'s {', '.join(beyond)}: an engine "
        "must read them from the config copy (the manifest's source.family.config_keys lists "
        "them)"
    ]
    assert sculpted[name].warnings == (carry if beyond else [])


@pytest.mark.parametrize("name", CONVERT)
def test_weights_decode_close_to_the_checkpoint(sculpted, name: str) -> None:
    v = Vault.open(sculpted[name].vault)
    ck = Checkpoint.open(CKPTS / name)
    assert v.keys() == list(ck.experts)
    for key, ref in ck.experts.items():
        got = v.expert(*key)
        for (arr, src), t in zip(ref.load(), got.tensors):
            w = quant.bf16_to_f32(arr) if src == "bf16" else arr.astype(np.float32)
            assert quant.snr_db(w, t.dequantize()) > 18.0  # Q4 on N(0, 0.02) weights


@pytest.mark.parametrize("name", CONVERT)
def test_scout_holds_exactly_the_non_expert_tensors(sculpted, name: str) -> None:
    scout = sculpted[name].scout
    got = read_header(scout)
    tensors = {t["name"]: t for t in MANIFEST[name]["tensors"]}
    expert_names = Checkpoint.open(CKPTS / name).expert_tensor_names
    want = {n for n in tensors if n not in expert_names}
    assert set(got) == want
    assert not any(".experts." in n for n in got)
    with scout.open("rb") as f:
        for n, info in got.items():
            f.seek(info.offset)
            data = f.read(info.nbytes)
            assert info.dtype == tensors[n]["dtype"] and list(info.shape) == tensors[n]["shape"]
            assert hashlib.sha256(data).hexdigest() == tensors[n]["sha256"], n


@pytest.mark.parametrize("name", SAME_AS_QWEN3)
def test_fused_sharded_and_old_config_are_byte_identical(sculpted, name: str) -> None:
    assert sculpted[name].vault.read_bytes() == sculpted["qwen3_moe"].vault.read_bytes()


def test_mixed_dtypes_match_the_single_dtype_twin(sculpted) -> None:
    """Same weights cast per tensor: identical wherever the cast was exact."""
    a = Vault.open(sculpted["olmoe"].vault)
    b = Vault.open(sculpted["olmoe_mixed_dtype"].vault)
    assert a.keys() == b.keys()
    dtypes = {t["name"]: t["dtype"] for t in MANIFEST["olmoe_mixed_dtype"]["tensors"]}
    assert {"BF16", "F16", "F32"} <= set(dtypes.values())
    ck = Checkpoint.open(CKPTS / "olmoe_mixed_dtype")
    for key, ref in ck.experts.items():
        for (arr, src), t in zip(ref.load(), b.expert(*key).tensors):
            w = quant.bf16_to_f32(arr) if src == "bf16" else arr.astype(np.float32)
            assert quant.snr_db(w, t.dequantize()) > 18.0


@pytest.mark.parametrize("name", REFUSE)
def test_refused_families(tmp_path: Path, name: str) -> None:
    with pytest.raises(SmoeError) as info:
        sculpt(CKPTS / name, tmp_path, SculptOptions())
    reason = {
        "gpt_oss": "model_type 'gpt_oss' refused: gpt-oss experts interleave gate/up, "
        "carry biases and clamp the activation",
        "qwen3_moe_gelu": "hidden_act 'gelu' refused: only SiLU-gated (SwiGLU) experts "
        "can be represented",
    }[name]
    assert str(info.value).startswith(f"{CKPTS / name}: {reason}")
    assert list(tmp_path.iterdir()) == []


def test_partial_vault_from_a_real_checkpoint(tmp_path: Path) -> None:
    res = sculpt(CKPTS / "deepseek_v3", tmp_path, SculptOptions(max_layers=1, max_experts=3))
    v = Vault.open(res.vault)
    assert v.keys() == [(1, 0), (1, 1), (1, 2)]
    assert (int(v.header["num_moe_layers"]), int(v.header["max_experts_per_layer"])) == (2, 8)
    assert [f.code for f in v.report.findings] == ["header.partial"]
    assert v.report.findings[0].message == "partial: 3 of 16 experts"


def cfg_model_type(name: str) -> str:
    """The model_type of fixture checkpoint ``name``."""
    return json.loads((CKPTS / name / "config.json").read_text())["model_type"]
