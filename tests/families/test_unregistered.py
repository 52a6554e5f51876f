"""What the sculptor does beyond the registry's families, and what it reports (issue 22).

A model type the registry does not know, whose tensors follow a known layout, is sculpted
with one warning naming every assumption, and its manifest says the family was not
registered. A multimodal wrapper's summary says what went where: the language model's
routed experts to the vault, its other tensors and every other part (vision tower,
projector, lm_head) to the scout unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from smoe.families.registry import assumptions
from smoe.format import manifest
from smoe.interop.safetensors_io import read_header
from smoe.sculpt import SculptOptions, sculpt

from fixtures_data import CKPTS


def test_an_unknown_model_type_is_sculpted_with_its_assumptions_named(tmp_path: Path) -> None:
    folder = tmp_path / "my_moe"
    shutil.copytree(CKPTS / "qwen3_moe", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "my_moe"
    (folder / "config.json").write_text(json.dumps(cfg))
    result = sculpt(folder, tmp_path / "out", SculptOptions(jobs=1))
    assert result.warnings[:1] == [assumptions("my_moe")]
    assert assumptions("my_moe") == (
        "model_type 'my_moe' is not in smoe's family registry (smoe families lists it); "
        "assumed: the routed experts compute down(silu(gate x) * up x) with no bias or clamp, "
        "the router renormalises its top-k weights only if norm_topk_prob is true, q_proj has "
        "num_attention_heads x head_dim rows; check the modeling code before using the vault"
    )
    doc = json.loads(manifest.path_for(result.vault).read_text())
    assert doc["source"]["family"] == {"registered": False, "config_keys": []}


def test_a_multimodal_summary_says_what_went_where(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the hf extra (torch, transformers) is not installed")
    from smoe_testkit import tiny

    folder = tmp_path / "qwen3_5_moe"
    tiny.write("qwen3_5_moe", folder)
    result = sculpt(folder, tmp_path / "out", SculptOptions(jobs=1))
    placement = result.summary()["placement"]
    source = {}
    for shard in folder.glob("*.safetensors"):
        source.update(read_header(shard))
    stem = "model.language_model.layers."
    experts = [n for n in source if n.startswith(stem) and ".mlp.experts." in n]
    assert placement["vault"] == {"tensors": len(experts), "under": stem}
    scout = read_header(result.scout)
    assert sorted(scout) == sorted(set(source) - set(experts))
    assert placement["scout"]["model.visual"] == sum(n.startswith("model.visual.") for n in scout)
    assert sum(placement["scout"].values()) == len(scout)
    for name, info in scout.items():  # unchanged
        assert (info.dtype, info.shape) == (source[name].dtype, source[name].shape)
