"""The rulings of issue 32, each on a checkpoint transformers itself writes.

- A clamp, limit, softcap or scale configured on the expert path is a refusal naming its
  key, per-layer lists included (bailing_hybrid's ``expert_swiglu_limit_list``); a family
  whose clamp is configurable but not configured (every limit null or 0) computes plain
  SwiGLU and converts. The expert probe shows why: with a limit, the model's own expert is
  not ``down(silu(gate x) * up x)``.
- A per-layer setting the arch block cannot hold is refused naming it (dots3_note's
  ``per_layer_config`` widths; granitemoe_swa's ``layer_rope_theta`` when the layers
  differ); the same value in every layer is honoured.
- ``rope_theta`` is 0 when the model has no rotary embedding by a config switch
  (granitemoehybrid's ``position_embedding_type``), whatever ``rope_parameters`` says.
- ``norm_topk_prob`` follows the router as configured (cohere2_moe: a softmax over the top-k
  sums to one; sigmoid scores are divided only with ``norm_topk_prob``), with no warning
  saying otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from smoe.errors import SmoeError
from smoe.families.config import refuse_unsupported
from smoe.families.registry import CLAMP, CLAMP_SHARED, FAMILIES
from smoe.sculpt import SculptOptions, sculpt
from smoe.vault.reader import Vault

torch = pytest.importorskip("torch", reason="the hf extra (torch, transformers) is not installed")
transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

from smoe_testkit import probes, tiny  # noqa: E402

IDS = torch.tensor([[(i * 37 + 3) % 100 + 3 for i in range(10)]])


def _arch(result: Any) -> dict:
    with Vault.open(result.vault) as v:
        return dict(v.arch)


def _refused(folder: Path, out: Path) -> str:
    with pytest.raises(SmoeError) as info:
        sculpt(folder, out, SculptOptions(jobs=1))
    assert not out.exists() or not any(out.iterdir())
    return str(info.value)


@pytest.mark.parametrize(
    "key, reason",
    [("expert_swiglu_limit_list", CLAMP), ("share_expert_swiglu_limit_list", CLAMP_SHARED)],
)
def test_a_configured_per_layer_clamp_is_refused_naming_it(
    key: str, reason: str, tmp_path: Path
) -> None:
    folder = tmp_path / "bailing_hybrid"
    model = tiny.write("bailing_hybrid", folder, overrides={key: [0, 7.0]})
    assert json.loads((folder / "config.json").read_text())[key] == [0, 7.0]
    assert _refused(folder, tmp_path / "out") == (
        f"{folder}: model_type 'bailing_hybrid' refused: {key} is [0, 7.0]: {reason}"
    )
    if key == "expert_swiglu_limit_list":  # the model clamps layer 1's experts indeed
        gate = model.model.layers[1].mlp.experts.gate_up_proj.detach()[0, :24]
        x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
        x *= 50 / float((x @ gate.T).abs().max())
        got = probes.expert_output(model, 1, 0, x)
        up = model.model.layers[1].mlp.experts.gate_up_proj.detach()[0, 24:]
        down = model.model.layers[1].mlp.experts.down_proj.detach()[0]
        plain = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
        assert got is not None and not torch.allclose(got, plain, rtol=1e-3)


def test_an_unconfigured_clamp_is_plain_swiglu(tmp_path: Path) -> None:
    folder = tmp_path / "bailing_hybrid"
    tiny.write(
        "bailing_hybrid",
        folder,
        overrides={"expert_swiglu_limit_list": [0, 0], "share_expert_swiglu_limit_list": None},
    )
    result = sculpt(folder, tmp_path / "out", SculptOptions(jobs=1))
    assert _arch(result)["activation"] == 0


def test_per_layer_widths_are_refused_naming_them() -> None:
    """dots3_note's default config (its Hub layout): sliding-window layers with another
    attention width, in per_layer_config."""
    cfg = transformers.AutoConfig.for_model("dots3_note").to_dict()["text_config"]
    assert cfg["per_layer_config"]
    with pytest.raises(SmoeError) as info:
        refuse_unsupported(cfg, "config.json", "ckpt")
    message = str(info.value)
    assert message.startswith("ckpt: model_type 'dots3_note_text' refused: per_layer_config.")
    assert message.endswith(FAMILIES["dots3_note"].refuse_if[0].reason)


def test_the_same_width_in_every_layer_converts() -> None:
    cfg = {"model_type": "dots3_note_text", "num_attention_heads": 4}
    refuse_unsupported({**cfg, "per_layer_config": {"1": {"num_attention_heads": 4}}}, "c")


def test_per_layer_rope_bases_that_differ_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "granitemoe_swa"
    tiny.write("granitemoe_swa", folder, overrides={"layer_rope_theta": [10000.0, 0]})
    assert _refused(folder, tmp_path / "out") == (
        f"{folder}/config.json: layer_rope_theta is [10000.0, 0]: the layers have different "
        "RoPE bases (0: none); one rope_theta per model can be represented"
    )


def test_one_per_layer_rope_base_overrides_the_global_one(tmp_path: Path) -> None:
    folder = tmp_path / "granitemoe_swa"
    model = tiny.write("granitemoe_swa", folder, overrides={"layer_rope_theta": [0, 0]})
    result = sculpt(folder, tmp_path / "out", SculptOptions(jobs=1))
    assert float(_arch(result)["rope_theta"]) == 0.0
    assert not probes.attention(model, lambda: model(input_ids=IDS)).rotary


@pytest.mark.parametrize("switch, rotary", [(None, False), ("rope", True)])
def test_rope_by_config_switch(switch: str | None, rotary: bool, tmp_path: Path) -> None:
    folder = tmp_path / "granitemoehybrid"
    model = tiny.write("granitemoehybrid", folder, overrides={"position_embedding_type": switch})
    result = sculpt(folder, tmp_path / "out", SculptOptions(jobs=1))
    assert (float(_arch(result)["rope_theta"]) > 0) == rotary
    assert probes.attention(model, lambda: model(input_ids=IDS)).rotary == rotary


def _renormalises(model: Any) -> bool:
    """The cohere2_moe router's own top-k weights on random hidden states sum to one."""
    router = model.model.layers[0].mlp.gate
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0)) * 3
    with torch.no_grad():
        _, weights, _ = router(x)
    return bool(torch.allclose(weights.double().sum(1), torch.ones(16, dtype=torch.float64)))


@pytest.mark.parametrize(
    "fn, norm, flag",
    [("softmax", False, True), ("sigmoid", False, False), ("sigmoid", True, True)],
)
def test_renormalisation_follows_the_selection_function(
    fn: str, norm: bool, flag: bool, tmp_path: Path
) -> None:
    folder = tmp_path / "cohere2_moe"
    overrides = {"expert_selection_fn": fn, "norm_topk_prob": norm}
    model = tiny.write("cohere2_moe", folder, overrides=overrides)
    assert _renormalises(model) == flag
    result = sculpt(folder, tmp_path / "out", SculptOptions(jobs=1))
    assert bool(int(_arch(result)["flags"]) & 1) == flag
    assert not [w for w in result.warnings if "norm_topk_prob" in w]


@pytest.mark.parametrize(
    "key, reason",
    [("text_config.swiglu_limits", CLAMP), ("text_config.swiglu_limits_shared", CLAMP_SHARED)],
)
def test_a_configured_clamp_of_step3p7_is_refused(key: str, reason: str, tmp_path: Path) -> None:
    folder = tmp_path / "step3p7"
    tiny.write("step3p7", folder, overrides={key: [0, 7.0]})
    inner = json.loads((folder / "config.json").read_text())["text_config"]["model_type"]
    assert _refused(folder, tmp_path / "out") == (
        f"{folder}: model_type {inner!r} refused: {key.split('.')[1]} is [0, 7.0]: {reason}"
    )


def test_step3p7_unclamped_converts_whatever_its_hidden_act_says(tmp_path: Path) -> None:
    """Limits of 0 or null are plain SwiGLU; the Hub's hidden_act 'swigluoai' is what
    transformers' config class replaces by silu (its modeling code computes SiLU)."""
    folder = tmp_path / "step3p7"
    tiny.write("step3p7", folder, overrides={"text_config.swiglu_limits": [0, None]})
    doc = json.loads((folder / "config.json").read_text())
    doc["text_config"]["hidden_act"] = "swigluoai"
    (folder / "config.json").write_text(json.dumps(doc))
    result = sculpt(folder, tmp_path / "out", SculptOptions(jobs=1))
    assert _arch(result)["moe_ffn_dim"] == 24


def test_per_layer_head_counts_that_differ_are_refused() -> None:
    cfg = {"model_type": "step3p7", "num_attention_heads": 64, "num_sliding_attention_heads": 96}
    with pytest.raises(SmoeError) as info:
        refuse_unsupported(cfg, "config.json", "ckpt")
    assert str(info.value) == (
        "ckpt: model_type 'step3p7' refused: num_sliding_attention_heads is 96, "
        f"num_attention_heads 64: {FAMILIES['step3p7'].refuse_if[2].reason}"
    )


def test_latent_attention_has_a_key_per_query_head(tmp_path: Path) -> None:
    """MLA (DeepSeek-V3): the attention expands the latent into one key per query head,
    whatever num_key_value_heads says; the block says what the attention computes."""
    folder = tmp_path / "deepseek_v3"
    tiny.write("deepseek_v3", folder)
    doc = json.loads((folder / "config.json").read_text())
    doc["num_key_value_heads"] = 2
    (folder / "config.json").write_text(json.dumps(doc))
    result = sculpt(folder, tmp_path / "out", SculptOptions(jobs=1))
    assert int(_arch(result)["num_kv_heads"]) == int(doc["num_attention_heads"]) == 4
    assert (
        "num_kv_heads: config.json says num_key_value_heads 2, but multi-head latent attention "
        "has one key per query head; the block says 4"
    ) in result.warnings
    from smoe.export.hf.checkpoint import export_hf

    export_hf(result.vault, tmp_path / "hf")  # the config copy says 2: not a contradiction
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["num_key_value_heads"] == 2


@pytest.mark.parametrize(
    "alias",
    sorted(a for f in set(FAMILIES.values()) if not f.converted for a in f.aliases),
)
def test_a_refused_familys_aliases_are_refused_for_its_reason(alias: str) -> None:
    """A wrapper's text model type (inkling_text) says why its family is refused, not what
    the generic reading stumbles on first (it said "no rope_theta")."""
    with pytest.raises(SmoeError) as info:
        refuse_unsupported({"model_type": alias}, "config.json", "ckpt")
    assert str(info.value) == f"ckpt: model_type {alias!r} refused: {FAMILIES[alias].refused}"
