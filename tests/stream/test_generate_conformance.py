"""`smoe-stream generate` equals transformers, family by family.

Each case is a tiny checkpoint that transformers writes (save_pretrained), sculpted into a
vault; transformers then runs the same vault's ``export --hf --dtype f32`` (the same
dequantised weights) on the prompt and the decoder's own tokens (teacher-forced), and at
every one of 32 steps the decoder's greedy token is transformers' argmax (a near-tie within
1e-4 of the top logit may go either way) and its logits are within 1e-3 of the largest
logit's magnitude. The settings a family reads from its config copy are set away from their
defaults (multipliers, partial rotary, groups, routed scaling, a correction bias), so that
a decoder ignoring one fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import SMOE_STREAM, run

torch = pytest.importorskip("torch", reason="the conformance tests need the hf extra (torch)")
pytest.importorskip("transformers", reason="the conformance tests need the hf extra")

from smoe.export.hf.checkpoint import export_hf  # noqa: E402
from smoe.sculpt import SculptOptions, sculpt  # noqa: E402
from smoe_testkit import tiny  # noqa: E402

STEPS = 32
PROMPT = [1, 5, 9, 17, 33, 2, 7, 64, 3]
NEAR_TIE = 1e-4
TOLERANCE = 1e-3

# per family: config overrides away from the defaults the decoder could silently assume
CASES: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"norm_topk_prob": True},
    "mixtral": {},
    "olmoe": {},
    "qwen2_moe": {  # a dense layer between MoE layers too
        "mlp_only_layers": [1],
        "num_hidden_layers": 3,
        "layer_types": ["full_attention"] * 3,
    },
    "granitemoe": {
        "embedding_multiplier": 6.0,
        "attention_multiplier": 0.1,
        "residual_multiplier": 0.5,
        "logits_scaling": 4.0,
    },
    "glm4_moe": {
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "n_routed_experts": 8,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
        "attention_bias": True,
        "use_qk_norm": True,
    },
    "minimax_m2": {"rope_parameters.partial_rotary_factor": 0.5},
}


def checkpoint(model_type: str, folder: Path, overrides: dict[str, Any]) -> Path:
    """A tiny model saved by transformers; a sigmoid router's correction bias made non-zero
    (it is a buffer the random init leaves at zero)."""
    model = tiny.build(model_type, seed=3, overrides=overrides)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.rand(buf.shape, generator=gen) * 0.2)
    with tiny._quiet():
        model.to(torch.bfloat16).save_pretrained(folder)
    return folder


def generate(vault: Path, *extra: object, steps: int = STEPS) -> tuple[list[int], np.ndarray]:
    """The decoder's greedy tokens and every step's logits."""
    out = vault.parent / "logits.f32"
    out.unlink(missing_ok=True)
    proc = run(
        "generate",
        vault,
        "--prompt",
        ",".join(map(str, PROMPT)),
        "--max-new",
        steps,
        "--logits",
        out,
        *extra,
        command=[SMOE_STREAM],
    )
    assert proc.returncode == 0, proc.stderr
    tokens = [int(t) for t in proc.stdout.strip().split(",")]
    return tokens, np.fromfile(out, dtype=np.float32).reshape(steps, -1)


def reference(vault: Path, tokens: list[int]) -> np.ndarray:
    """transformers' logits on the vault's f32 export, teacher-forced with `tokens`."""
    from transformers import AutoModelForCausalLM

    hf = vault.parent / "hf"
    if not hf.exists():
        export_hf(vault, hf, dtype="f32")
    with tiny._quiet():
        model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + tokens[:-1]])).logits[0]
    return logits[len(PROMPT) - 1 :].numpy()


def assert_conforms(tokens: list[int], ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.shape == ref.shape
    for step, (tok, row) in enumerate(zip(tokens, ref, strict=True)):
        best = int(row.argmax())
        assert tok == best or row[best] - row[tok] <= NEAR_TIE, (step, tok, best)
    scale = np.abs(ref).max(axis=1, keepdims=True)
    worst = float((np.abs(ours - ref) / scale).max())
    assert worst <= TOLERANCE, worst


def sculpted(tmp: Path, model_type: str, overrides: dict[str, Any], **options: Any) -> Path:
    folder = checkpoint(model_type, tmp / "ck", overrides)
    return sculpt(folder, tmp / "out", SculptOptions(jobs=1, **options)).vault


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_generate_equals_transformers(smoe_stream: Path, tmp_path: Path, model_type: str) -> None:
    vault = sculpted(tmp_path, model_type, CASES[model_type])
    tokens, ours = generate(vault)
    assert_conforms(tokens, ours, reference(vault, tokens))


def test_q2_vault_equals_transformers(smoe_stream: Path, tmp_path: Path) -> None:
    vault = sculpted(tmp_path, "qwen3_moe", {}, bits=2)
    tokens, ours = generate(vault)
    assert_conforms(tokens, ours, reference(vault, tokens))


def test_cache_below_one_tokens_working_set(smoe_stream: Path, tmp_path: Path) -> None:
    """One layer's top-k slots: every token evicts inside itself, and the numbers stay."""
    vault = sculpted(tmp_path, "mixtral", {"num_hidden_layers": 3})
    tokens, ours = generate(vault, "--cache-slots", 2, "--threads", 2)
    assert_conforms(tokens, ours, reference(vault, tokens))
    again, logits = generate(vault)  # the default cache holds every expert: the same run
    assert again == tokens and np.array_equal(logits, ours)


def test_v1_vault_runs_with_the_qwen3_defaults(smoe_stream: Path, tmp_path: Path) -> None:
    """No arch block: the format document's Qwen3 defaults (top-8, rope_theta 1e6, eps 1e-6,
    top-k renormalised), heads and head_dim from the scout's shapes, with a warning."""
    qwen3 = {
        "num_local_experts": 8,
        "num_experts_per_tok": 8,
        "rope_parameters.rope_theta": 1e6,
        "rms_norm_eps": 1e-6,
        "norm_topk_prob": True,
    }
    vault = sculpted(tmp_path, "qwen3_moe", qwen3, version=1)
    proc = run("generate", vault, "--prompt", "1,2", "--max-new", 1, command=[SMOE_STREAM])
    assert proc.returncode == 0
    assert proc.stderr.startswith(f"smoe-stream: warning: {vault}: a v1 vault (no arch block)")
    tokens, ours = generate(vault)
    assert_conforms(tokens, ours, reference(vault, tokens))


def test_evictions_inside_a_token_are_counted(smoe_stream: Path, tmp_path: Path) -> None:
    """A cache of one layer's top-k on 3 MoE layers: every decoded token misses."""
    vault = sculpted(tmp_path, "mixtral", {"num_hidden_layers": 3})
    proc = run(
        "generate",
        vault,
        "--prompt",
        "1,2,3",
        "--max-new",
        6,
        "--cache-slots",
        2,
        "--json",
        command=[SMOE_STREAM],
    )
    steps = json.loads(proc.stdout)["per_token"]
    assert all(s["misses"] >= 1 and s["hits"] + s["misses"] == 6 for s in steps[1:])


def test_minimax_m2_legacy_rotary_dim(smoe_stream: Path, tmp_path: Path) -> None:
    """Released MiniMax-M2 configs give the rotary share as rotary_dim (transformers turns it
    into partial_rotary_factor): a config copy with only rotary_dim runs the same."""
    folder = checkpoint("minimax_m2", tmp_path / "ck", {})
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["rope_parameters"].pop("partial_rotary_factor", None)
    config["rotary_dim"] = config["head_dim"] // 2
    path.write_text(json.dumps(config))
    vault = sculpt(folder, tmp_path / "out", SculptOptions(jobs=1)).vault
    tokens, ours = generate(vault)
    ref = reference(vault, tokens)
    assert_conforms(tokens, ours, ref)
    copy = vault.with_name(vault.stem + ".config.json")  # without it: the whole head rotates
    without = json.loads(copy.read_text())
    del without["rotary_dim"]
    copy.write_text(json.dumps(without))
    _, whole = generate(vault)
    assert float((np.abs(whole - ref) / np.abs(ref).max(axis=1, keepdims=True)).max()) > TOLERANCE
