"""``export --hf`` refuses another model's scout or config (issue 23, case 3).

Before anything is written, the config (copied, given with ``--config`` or rebuilt) and the
scout are checked against the vault, and a contradiction is refused naming both values:

* **config**: ``model_type`` (a wrapper's outer one) against the arch block's; hidden and
  vocab size against the header; ``num_hidden_layers``, the head counts and ``head_dim``
  (MLA: ``qk_nope_head_dim + qk_rope_head_dim``, ruling R3) and top-k against the arch
  block; the expert count (the family's spellings) and top-k against the experts per
  layer; the experts' width against their descriptors;
* **scout**: the token embedding ``[vocab_size, d_model]``, a tensor of each of the model's
  layers and none beyond them (but the config's multi-token-prediction layers), and each
  MoE layer's router ``[experts per layer, d_model]`` in the MoE block the experts go to.

Every message is checked word for word, with every input unchanged and no output folder.
The 53 converted families keep exporting with their own scout and config copy
(``tests/families/test_families.py``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from smoe.errors import RefusedInput
from smoe.export.hf.checkpoint import export_hf
from smoe.sculpt import SculptOptions, companions, sculpt

from fixtures_data import CKPTS
from helpers import refused

torch = pytest.importorskip("torch", reason="the hf extra (torch, transformers) is not installed")
from safetensors.torch import load_file, save_file  # noqa: E402

ANOTHER = "the config describes another model"
OTHER_SCOUT = "the scout belongs to another model"


@pytest.fixture(scope="module")
def sculpted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """checkpoint name -> its Q4 vault (scout and config copy beside it), sculpted once."""
    base = tmp_path_factory.mktemp("binding")
    done: dict[str, Path] = {}

    def get(name: str, version: int = 2) -> Path:
        key = f"{name}-v{version}"
        if key not in done:
            options = SculptOptions(bits=4, jobs=1, version=version)
            done[key] = sculpt(CKPTS / name, base / key, options).vault
        return done[key]

    return get


def moved(vault: Path, folder: Path) -> Path:
    """A copy of ``vault`` with its manifest, scout and config copy, in ``folder``."""
    folder.mkdir()
    for p in vault.parent.iterdir():
        shutil.copy(p, folder / p.name)
    return folder / vault.name


def refused_export(vault: Path, tmp_path: Path, *args: object) -> str:
    """The one line ``export VAULT OUT --hf ARGS`` fails with (exit 1), checked to leave the
    vault's folder (and every file named in ``args``) unchanged and no output folder."""
    out = tmp_path / "hf"
    inputs = [vault.parent, *(a for a in args if isinstance(a, Path))]
    return refused(["export", vault, out, "--hf", *args], 1, unchanged=inputs, absent=out)


def edited_config(src: Path, dst: Path, **changes: Any) -> Path:
    doc = json.loads(src.read_text())
    doc.update(changes)
    dst.write_text(json.dumps(doc, indent=2))
    return dst


def edited_scout(vault: Path, dst: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    tensors = load_file(companions(vault)[0])
    change(tensors)
    save_file(tensors, dst, metadata={"format": "pt"})
    return dst


# ---- another model's scout or config --------------------------------------------------------
def test_a_mixtral_scout_on_a_qwen3_vault_is_refused(sculpted: Any, tmp_path: Path) -> None:
    """The case as seen: same widths, same vocabulary, same layer count; transformers loaded
    the folder with the router (and the q/k norms) missing and randomly initialised."""
    qwen3, scout = sculpted("qwen3_moe"), companions(sculpted("mixtral"))[0]
    assert refused_export(qwen3, tmp_path, "--scout", scout) == (
        f"error: {scout}: has no router for MoE layer 0 (a 2-D tensor under model.layers.0.mlp. "
        f"whose name holds 'gate' or 'router', for {qwen3} [8, 64] (8 experts per layer, "
        f"d_model 64)): {OTHER_SCOUT}"
    )
    bare = moved(qwen3, tmp_path / "bare")  # no config copy: the rebuilt config, same check
    companions(bare)[1].unlink()
    line = refused_export(bare, tmp_path, "--scout", scout)
    assert line.startswith(f"error: {scout}: has no router for MoE layer 0 ")


def test_a_mixtral_config_on_a_qwen3_vault_is_refused(sculpted: Any, tmp_path: Path) -> None:
    """Exit 0 before, and transformers then refused the folder."""
    qwen3, config = sculpted("qwen3_moe"), companions(sculpted("mixtral"))[1]
    assert refused_export(qwen3, tmp_path, "--config", config) == (
        f"error: {config}: model_type is 'mixtral', but the arch block of {qwen3} says "
        f"'qwen3_moe': {ANOTHER}"
    )


def test_the_config_beside_the_vault_is_checked_too(sculpted: Any, tmp_path: Path) -> None:
    vault = moved(sculpted("qwen3_moe"), tmp_path / "v")
    staged = companions(vault)[1]
    edited_config(staged, staged, num_local_experts=16)
    assert refused_export(vault, tmp_path) == (
        f"error: {staged}: num_local_experts is 16, but {vault} has 8 experts per layer: {ANOTHER}"
    )


CONFIG_CASES = [
    ({"model_type": "olmoe"}, "model_type is 'olmoe', but the arch block of {v} says 'qwen3_moe'"),
    ({"hidden_size": 128}, "hidden_size is 128, but {v} has d_model 64"),
    ({"vocab_size": 100}, "vocab_size is 100, but {v} has vocab_size 128"),
    (
        {"num_hidden_layers": 3},
        "num_hidden_layers is 3, but the arch block of {v} says num_hidden_layers 2",
    ),
    (
        {"num_attention_heads": 8},
        "num_attention_heads is 8, but the arch block of {v} says num_heads 4",
    ),
    (
        {"num_key_value_heads": 4},
        "num_key_value_heads is 4, but the arch block of {v} says num_kv_heads 2",
    ),
    ({"head_dim": 32}, "head_dim is 32, but the arch block of {v} says head_dim 16"),
    ({"num_local_experts": 4}, "num_local_experts is 4, but {v} has 8 experts per layer"),
    ({"num_experts_per_tok": 16}, "num_experts_per_tok is 16, but {v} has 8 experts per layer"),
    (
        {"num_experts_per_tok": 4},
        "num_experts_per_tok is 4, but the arch block of {v} says moe_top_k 2",
    ),
    (
        {"moe_intermediate_size": 64},
        "moe_intermediate_size is 64, but {v} has moe_ffn_dim 48 (its experts' gate rows)",
    ),
]


@pytest.mark.parametrize(("changes", "fact"), CONFIG_CASES, ids=[str(c) for c, _ in CONFIG_CASES])
def test_a_config_that_contradicts_the_vault_is_refused(
    changes: dict, fact: str, sculpted: Any, tmp_path: Path
) -> None:
    vault = sculpted("qwen3_moe")
    config = edited_config(CKPTS / "qwen3_moe" / "config.json", tmp_path / "c.json", **changes)
    want = f"error: {config}: {fact.format(v=vault)}: {ANOTHER}"
    assert refused_export(vault, tmp_path, "--config", config) == want
    with pytest.raises(RefusedInput) as info:  # the same line from the API
        export_hf(vault, tmp_path / "api", config=config)
    assert f"error: {info.value}" == want and not (tmp_path / "api").exists()


def test_a_multimodal_wrapper_is_checked_by_its_text_config(sculpted: Any, tmp_path: Path) -> None:
    """The arch block records the outer model_type; the counts are the text config's."""
    vault = sculpted("qwen3_moe")
    text = json.loads((CKPTS / "qwen3_moe" / "config.json").read_text())
    config = tmp_path / "wrapped.json"
    config.write_text(
        json.dumps({"model_type": "qwen3_moe", "text_config": {**text, "vocab_size": 7}})
    )
    assert refused_export(vault, tmp_path, "--config", config) == (
        f"error: {config}: vocab_size is 7, but {vault} has vocab_size 128: {ANOTHER}"
    )


def test_mla_is_checked_by_its_q_k_width(sculpted: Any, tmp_path: Path) -> None:
    """Ruling R3: a DeepSeek arch block's head_dim is qk_nope_head_dim + qk_rope_head_dim
    (the config's own head_dim, the rope width, is not what it holds)."""
    vault = sculpted("deepseek_v3")
    config = edited_config(
        CKPTS / "deepseek_v3" / "config.json", tmp_path / "c.json", qk_nope_head_dim=16
    )
    assert refused_export(vault, tmp_path, "--config", config) == (
        f"error: {config}: qk_nope_head_dim + qk_rope_head_dim is 24, but the arch block of "
        f"{vault} says head_dim 16: {ANOTHER}"
    )


def test_a_v1_vault_is_checked_against_its_header_and_table(sculpted: Any, tmp_path: Path) -> None:
    """No arch block: the config's counts against the header and the table."""
    vault = sculpted("qwen3_moe", version=1)
    config = edited_config(
        CKPTS / "qwen3_moe" / "config.json", tmp_path / "c.json", num_hidden_layers=1
    )
    assert refused_export(vault, tmp_path, "--config", config) == (
        f"error: {config}: num_hidden_layers is 1, but {vault} holds experts of layer 1: {ANOTHER}"
    )


# ---- a scout that contradicts the vault -----------------------------------------------------
def _router(layer: int, experts: int) -> Callable[[dict[str, Any]], None]:
    def change(t: dict[str, Any]) -> None:
        t[f"model.layers.{layer}.mlp.gate.weight"] = torch.zeros(experts, 64, dtype=torch.bfloat16)

    return change


def _drop(prefix: str) -> Callable[[dict[str, Any]], None]:
    def change(t: dict[str, Any]) -> None:
        for name in [n for n in t if n.startswith(prefix)]:
            del t[name]

    return change


def _embedding(rows: int, cols: int) -> Callable[[dict[str, Any]], None]:
    def change(t: dict[str, Any]) -> None:
        t["model.embed_tokens.weight"] = torch.zeros(rows, cols, dtype=torch.bfloat16)

    return change


def _extra_layer(t: dict[str, Any]) -> None:
    t["model.layers.2.input_layernorm.weight"] = torch.ones(64, dtype=torch.bfloat16)


SCOUT_CASES = {
    "router of another expert count": (
        _router(0, 4),
        "model.layers.0.mlp.gate.weight is [4, 64], but a router of {v} is [8, 64] "
        "(8 experts per layer, d_model 64)",
    ),
    "router missing": (
        _drop("model.layers.1.mlp.gate."),
        "has no router for MoE layer 1 (a 2-D tensor under model.layers.1.mlp. whose name "
        "holds 'gate' or 'router', for {v} [8, 64] (8 experts per layer, d_model 64))",
    ),
    "embedding of another vocabulary": (
        _embedding(100, 64),
        "model.embed_tokens.weight has 100 rows, but {v} has vocab_size 128",
    ),
    "embedding of another width": (
        _embedding(128, 32),
        "model.embed_tokens.weight has 32 columns, but {v} has d_model 64",
    ),
    "no embedding": (
        _drop("model.embed_tokens."),
        "has no token embedding (looked for model.embed_tokens.weight, "
        "model.word_embeddings.weight, model.embeddings.weight, model.tok_embeddings.weight, "
        "model.wte.weight)",
    ),
    "a layer missing": (
        _drop("model.layers.1."),
        "has no tensor of model.layers.1, but {v} has num_hidden_layers 2",
    ),
    "a layer too many": (
        _extra_layer,
        "has tensors of model.layers.2, but {v} has num_hidden_layers 2",
    ),
}


@pytest.mark.parametrize("case", sorted(SCOUT_CASES))
def test_a_scout_that_contradicts_the_vault_is_refused(
    case: str, sculpted: Any, tmp_path: Path
) -> None:
    vault = sculpted("qwen3_moe")
    change, fact = SCOUT_CASES[case]
    scout = edited_scout(vault, tmp_path / "scout.safetensors", change)
    want = f"error: {scout}: {fact.format(v=vault)}: {OTHER_SCOUT}"
    assert refused_export(vault, tmp_path, "--scout", scout) == want


def test_multi_token_prediction_layers_beyond_num_hidden_layers_are_kept(
    sculpted: Any, tmp_path: Path
) -> None:
    """DeepSeek-V3's config says num_nextn_predict_layers 1: one layer beyond
    num_hidden_layers is the model's own (kept in the scout by the sculptor); two are not."""
    vault = sculpted("deepseek_v3")

    def mtp(layers: int) -> Callable[[dict[str, Any]], None]:
        def change(t: dict[str, Any]) -> None:
            for layer in range(3, 3 + layers):
                t[f"model.layers.{layer}.input_layernorm.weight"] = torch.ones(64)

        return change

    one = edited_scout(vault, tmp_path / "one.safetensors", mtp(1))
    export_hf(vault, tmp_path / "ok", scout=one)
    two = edited_scout(vault, tmp_path / "two.safetensors", mtp(2))
    assert refused_export(vault, tmp_path, "--scout", two) == (
        f"error: {two}: has tensors of model.layers.4, but {vault} has num_hidden_layers 3 "
        f"(and num_nextn_predict_layers 1): {OTHER_SCOUT}"
    )
