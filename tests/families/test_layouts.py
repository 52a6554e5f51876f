"""A family's experts in each layout its checkpoints come in give the same vault (issue 22).

Qwen3-VL-MoE checkpoints on the Hub hold ``gate_up_proj`` as ``[E, H, 2I]`` and
``down_proj`` as ``[E, I, H]``; transformers 5.24 saves ``[E, 2I, H]`` and ``[E, H, I]``.
Both are read (the registry allows both for this family; the pair's shapes tell them apart,
even when gate_up is square, as ``down`` is not), give
the same vault bytes, and ``export --hf`` writes each back in its own layout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from smoe.sculpt import SculptOptions, sculpt

torch = pytest.importorskip("torch", reason="the hf extra (torch, transformers) is not installed")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="the hf extra is not installed")

from smoe_testkit import tiny  # noqa: E402


def _transpose_experts(folder: Path, out: Path) -> None:
    """``folder``'s checkpoint with every fused expert tensor stored transposed."""
    out.mkdir()
    for f in folder.iterdir():
        if f.suffix != ".safetensors":
            (out / f.name).write_bytes(f.read_bytes())
            continue
        tensors = safetensors_torch.load_file(f)
        for name, t in tensors.items():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                tensors[name] = t.transpose(1, 2).contiguous()
        safetensors_torch.save_file(tensors, out / f.name, metadata={"format": "pt"})


@pytest.mark.parametrize("inter", [24, 32])  # 32: gate_up is square, down tells them apart
def test_hub_layout_gives_the_same_vault(tmp_path: Path, inter: int) -> None:
    from smoe.export.hf.checkpoint import export_hf

    saved = tmp_path / "saved"
    tiny.write("qwen3_vl_moe", saved, overrides={"text_config.moe_intermediate_size": inter})
    hub = tmp_path / "hub"
    _transpose_experts(saved, hub)
    a = sculpt(saved, tmp_path / "a", SculptOptions(bits=4, jobs=1))
    b = sculpt(hub, tmp_path / "b", SculptOptions(bits=4, jobs=1))
    assert a.vault.read_bytes() == b.vault.read_bytes()
    export_hf(b.vault, tmp_path / "hf")
    back = {}
    for f in (tmp_path / "hf").glob("*.safetensors"):
        back.update(safetensors_torch.load_file(f))
    original = {}
    for f in hub.glob("*.safetensors"):
        original.update(safetensors_torch.load_file(f))
    name = "model.language_model.layers.0.mlp.experts.gate_up_proj"
    assert back[name].shape == original[name].shape
    rel = (back[name].float() - original[name].float()).norm() / original[name].float().norm()
    assert rel < 0.2


def test_stacked_experts_without_a_role_are_refused(tmp_path: Path) -> None:
    """step3p7 stacks every expert in one 3-D tensor per role; a layer missing one role is
    refused naming it, nothing written."""
    from smoe.errors import SmoeError

    saved = tmp_path / "saved"
    tiny.write("step3p7", saved)
    for f in saved.glob("*.safetensors"):
        tensors = safetensors_torch.load_file(f)
        tensors.pop("model.layers.1.moe.up_proj.weight")
        safetensors_torch.save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(SmoeError) as info:
        sculpt(saved, tmp_path / "out", SculptOptions(bits=4, jobs=1))
    assert str(info.value) == f"{saved}: layer 1 has stacked experts but no up_proj.weight tensor"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
