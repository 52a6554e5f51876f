"""The Sculptor on synthetic checkpoints: outputs, scout, partial vaults, refusals, resume."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from smoe import quant
from smoe.errors import SmoeError
from smoe.interop.safetensors_io import read_header
from smoe.sculpt import SculptOptions, sculpt
from smoe.sculpt.source.checkpoint import Checkpoint
from smoe_gen.smoe_kaitai import Smoe
from smoe_testkit.synth import write_checkpoint

from helpers import python, run


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("ckpt")
    write_checkpoint(base / "qwen", layers=2, experts=4, d_model=64, ffn=32, seed=1)
    write_checkpoint(
        base / "qwen-sharded", layers=2, experts=4, d_model=64, ffn=32, seed=1, shards=4
    )
    write_checkpoint(
        base / "mixtral",
        model_type="mixtral",
        layers=2,
        experts=4,
        d_model=64,
        ffn=48,
        dtype="F16",
        seed=2,
    )
    write_checkpoint(
        base / "olmoe32",
        model_type="olmoe",
        layers=1,
        experts=3,
        d_model=64,
        ffn=40,
        dtype="F32",
        seed=3,
    )
    return base


def experts_of(vault: Path) -> dict[tuple[int, int], list[np.ndarray]]:
    s = Smoe.from_bytes(Path(vault).read_bytes())
    out = {}
    for e in s.experts:
        out[(e.layer_id, e.expert_id)] = [
            quant.decode(
                np.frombuffer(d.packed, np.uint8),
                np.frombuffer(d.scales, "<f2"),
                s.header.bits,
                (d.num_rows, d.num_cols),
            )
            for d in e.tensors
        ]
    return out


def source_weights(ckpt: Path) -> dict[tuple[int, int], list[np.ndarray]]:
    c = Checkpoint.open(ckpt)
    out = {}
    for key, ref in c.experts.items():
        out[key] = [
            quant.bf16_to_f32(a) if src == "bf16" else a.astype(np.float32) for a, src in ref.load()
        ]
    return out


@pytest.mark.parametrize("name", ["qwen", "mixtral", "olmoe32"])
@pytest.mark.parametrize("bits", [4, 2])
def test_families_convert_and_decode_close_to_source(
    ckpts: Path, tmp_path: Path, name: str, bits: int
) -> None:
    res = sculpt(ckpts / name, tmp_path, SculptOptions(bits=bits))
    assert res.vault == tmp_path / f"{name}.smoe"
    src = source_weights(ckpts / name)
    got = experts_of(res.vault)
    assert got.keys() == src.keys()
    floor = 9.0 if bits == 4 else 2.5  # dB, weights with 9x outliers in every row
    for key in src:
        for w, w_hat in zip(src[key], got[key]):
            assert quant.snr_db(w, w_hat) > floor
    summary = res.summary()
    assert summary["experts_written"] == len(src)
    assert all(v["min"] > floor for v in summary["snr_db"].values())
    phases = summary["phases_s"]
    assert list(phases) == ["setup", "experts", "commit"] and min(phases.values()) >= 0
    assert sum(phases.values()) == pytest.approx(summary["seconds"], abs=1e-3)


def test_arch_block_from_config(ckpts: Path, tmp_path: Path) -> None:
    res = sculpt(ckpts / "qwen", tmp_path, SculptOptions())
    s = Smoe.from_bytes(Path(res.vault).read_bytes())
    cfg = json.loads((ckpts / "qwen" / "config.json").read_text())
    a = s.arch
    assert a.rope_theta == cfg["rope_parameters"]["rope_theta"]
    assert (a.num_heads, a.num_kv_heads, a.head_dim) == (4, 4, 16)
    assert (a.moe_top_k, a.moe_ffn_dim, a.num_hidden_layers) == (2, 32, 2)
    assert a.model_type.text == "qwen3_moe"
    assert (a.norm_topk_prob, a.has_qk_norm, a.has_dense_layer_0) == (True, True, False)
    h = s.header
    assert (h.num_moe_layers, h.max_experts_per_layer, h.d_model, h.vocab_size) == (2, 4, 64, 128)
    assert h.ffn_dim == cfg["intermediate_size"]  # no dense layer, no shared expert (D5)
    mix = Smoe.from_bytes(sculpt(ckpts / "mixtral", tmp_path, SculptOptions()).vault.read_bytes())
    assert mix.arch.norm_topk_prob  # Mixtral renormalises without a config key (D8)
    assert not mix.arch.has_qk_norm


def test_scout_holds_exactly_the_non_expert_tensors(ckpts: Path, tmp_path: Path) -> None:
    res = sculpt(ckpts / "mixtral", tmp_path, SculptOptions())
    scout = load_file(str(res.scout))
    source = load_file(str(ckpts / "mixtral" / "model.safetensors"))
    expected = {k: v for k, v in source.items() if ".experts." not in k}
    assert scout.keys() == expected.keys()
    assert "model.layers.0.block_sparse_moe.gate.weight" in scout
    for k, v in expected.items():
        assert scout[k].dtype == v.dtype and scout[k].tobytes() == v.tobytes()


def test_sharded_equals_single_file(ckpts: Path, tmp_path: Path) -> None:
    a = sculpt(ckpts / "qwen", tmp_path / "a", SculptOptions())
    b = sculpt(ckpts / "qwen-sharded", tmp_path / "b", SculptOptions())
    assert a.vault.read_bytes() == b.vault.read_bytes()
    assert a.scout.read_bytes() == b.scout.read_bytes()  # bf16 tensors, copied byte for byte


def test_jobs_give_identical_bytes(ckpts: Path, tmp_path: Path) -> None:
    a = sculpt(ckpts / "qwen", tmp_path / "a", SculptOptions(jobs=1))
    b = sculpt(ckpts / "qwen", tmp_path / "b", SculptOptions(jobs=2))
    assert a.vault.read_bytes() == b.vault.read_bytes()
    assert a.scout.read_bytes() == b.scout.read_bytes()


def test_partial_vault_keeps_model_counts(ckpts: Path, tmp_path: Path) -> None:
    res = sculpt(ckpts / "qwen", tmp_path, SculptOptions(max_layers=1, max_experts=2))
    s = Smoe.from_bytes(Path(res.vault).read_bytes())
    assert [(e.layer_id, e.expert_id) for e in s.experts] == [(0, 0), (0, 1)]
    assert (s.header.num_moe_layers, s.header.max_experts_per_layer) == (2, 4)  # D5
    # The scout still holds no routed expert weight at all.
    assert not any(".experts." in k for k in read_header(res.scout))


def test_v1_output(ckpts: Path, tmp_path: Path) -> None:
    res = sculpt(ckpts / "qwen", tmp_path, SculptOptions(version=1))
    s = Smoe.from_bytes(Path(res.vault).read_bytes())
    assert s.header.version == 1 and s.arch is None


def test_dry_run_writes_nothing(ckpts: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    plan = sculpt(ckpts / "qwen", out, SculptOptions(dry_run=True))
    assert not out.exists()
    assert plan["experts"] == 8 and plan["experts_per_layer"] == {0: 4, 1: 4}
    real = sculpt(ckpts / "qwen", out, SculptOptions())
    assert plan["vault_bytes"] == real.vault.stat().st_size
    assert plan["scout_bytes"] < real.scout.stat().st_size  # the scout adds its header


def _clone(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def _edit_config(root: Path, **changes) -> None:
    cfg = json.loads((root / "config.json").read_text())
    cfg.update(changes)
    (root / "config.json").write_text(json.dumps(cfg))


def _rename_tensor(root: Path, old: str, new: str | None) -> None:
    """Rewrite model.safetensors with one tensor renamed (or dropped when new is None)."""
    from safetensors.numpy import save_file

    t = load_file(str(root / "model.safetensors"))
    v = t.pop(old)
    if new is not None:
        t[new] = v
    save_file(t, str(root / "model.safetensors"))


def test_refusals_name_the_reason_and_write_nothing(ckpts: Path, tmp_path: Path) -> None:
    cases = []
    gelu = _clone(ckpts / "olmoe32", tmp_path / "gelu")
    _edit_config(gelu, hidden_act="gelu")
    cases.append(
        (
            gelu,
            f"{gelu}: hidden_act 'gelu' refused: only SiLU-gated (SwiGLU) experts "
            "can be represented",
        )
    )
    oss = _clone(ckpts / "olmoe32", tmp_path / "oss")
    _edit_config(oss, model_type="gpt_oss")
    cases.append(
        (
            oss,
            f"{oss}: model_type 'gpt_oss' refused: gpt-oss experts interleave "
            "gate/up, carry biases and clamp the activation; only bias-free "
            "SiLU-gated (SwiGLU) experts can be represented",
        )
    )
    noconf = _clone(ckpts / "olmoe32", tmp_path / "noconf")
    (noconf / "config.json").unlink()
    cases.append(
        (
            noconf,
            f"{noconf}: no config.json (a HuggingFace checkpoint directory needs "
            "config.json and *.safetensors)",
        )
    )
    missing = _clone(ckpts / "olmoe32", tmp_path / "missing")
    _rename_tensor(missing, "model.layers.0.mlp.experts.1.up_proj.weight", None)
    cases.append((missing, f"{missing}: layer 0 expert 1 has no up_proj tensor"))
    bias = _clone(ckpts / "olmoe32", tmp_path / "bias")
    _rename_tensor(
        bias, "model.layers.0.input_layernorm.weight", "model.layers.0.mlp.experts.0.gate_proj.bias"
    )
    cases.append(
        (
            bias,
            f"{bias}: expert bias 'model.layers.0.mlp.experts.0.gate_proj.bias' "
            "refused: only bias-free SiLU-gated (SwiGLU) experts can be represented",
        )
    )
    shapes = _clone(ckpts / "olmoe32", tmp_path / "shapes")
    _rename_tensor(shapes, "model.layers.0.mlp.experts.2.down_proj.weight", None)
    _rename_tensor(
        shapes,
        "model.layers.0.mlp.experts.1.gate_proj.weight",
        "model.layers.0.mlp.experts.2.down_proj.weight",
    )
    cases.append((shapes, f"{shapes}: layer 0 expert 1 has no gate_proj tensor"))
    for root, message in cases:
        out = tmp_path / f"out-{root.name}"
        with pytest.raises(SmoeError) as info:
            sculpt(root, out, SculptOptions())
        assert str(info.value) == message
        assert not out.exists()
        proc = run("sculpt", root, out)
        assert proc.returncode == 1
        assert " ".join(proc.stderr.split()) == f"error: {message}"
        assert not out.exists()


def test_inconsistent_shapes_refused(ckpts: Path, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    bad = _clone(ckpts / "olmoe32", tmp_path / "bad")
    t = load_file(str(bad / "model.safetensors"))
    t["model.layers.0.mlp.experts.2.up_proj.weight"] = np.zeros((41, 64), np.float32)
    save_file(t, str(bad / "model.safetensors"))
    with pytest.raises(SmoeError) as info:
        sculpt(bad, tmp_path / "out", SculptOptions())
    assert str(info.value) == (
        f"{bad}: layer 0 expert 2 has inconsistent shapes gate [40, 64], up [41, 64], down [64, 40]"
    )


# A resumed sculpt killed (SIGKILL, no clean-up) once more than ARGV[3] experts are journaled:
# progress() is called right after each expert's journal line, so the moment is exact.
KILL_AFTER_EXPERTS = """
import os, signal, sys
from smoe.sculpt import SculptOptions, sculpt

def progress(done, total, nbytes):
    if done > int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)

sculpt(sys.argv[1], sys.argv[2], SculptOptions(resume=True), progress=progress)
"""


def test_kill_and_resume_gives_identical_bytes(tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / "big", layers=2, experts=48, d_model=256, ffn=128, seed=5)
    ref = sculpt(ck, tmp_path / "ref", SculptOptions())
    out = tmp_path / "out"
    journal = out / ".big.smoe.journal"
    for kill_after in (3, 40, 70):
        killed = python(KILL_AFTER_EXPERTS, ck, out, kill_after)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert not (out / "big.smoe").exists()
        assert journal.read_text().count("\n") > kill_after
    done = run("sculpt", ck, out, "--resume", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["experts_resumed"] > 0
    assert summary["experts_resumed"] + summary["experts_written"] == 96
    assert (out / "big.smoe").read_bytes() == ref.vault.read_bytes()
    assert (out / "big.scout.safetensors").read_bytes() == ref.scout.read_bytes()
    assert sorted(p.name for p in out.iterdir()) == [
        "big.config.json",
        "big.scout.safetensors",
        "big.smoe",
        "big.smoe.manifest.json",
    ]


def test_a_shard_name_that_is_not_utf8_is_recorded_escaped(tmp_path: Path) -> None:
    """The manifest is UTF-8 JSON: a file name's other bytes as ``\\xNN`` text, never a lone
    surrogate (issue 23, case 11)."""
    import os

    from smoe.format import manifest

    from fixtures_data import CKPTS

    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_bytes((CKPTS / "qwen3_moe" / "config.json").read_bytes())
    odd = os.fsdecode(b"model-caf\xe9.safetensors")
    (folder / odd).write_bytes((CKPTS / "qwen3_moe" / "model.safetensors").read_bytes())
    result = sculpt(folder, tmp_path / "out", SculptOptions(jobs=1))
    raw = manifest.path_for(result.vault).read_bytes()
    raw.decode("utf-8")  # strict
    assert b"\\ud" not in raw
    doc = json.loads(raw)
    assert [f["name"] for f in doc["source"]["files"]] == ["model-caf\\xe9.safetensors"]
