"""What the manifest says of the source (``transposed``, ``fp8``) is checked against the vault,
its arch block, the scout and the config before ``export --hf`` writes anything (issue #31):
a manifest field that would make the export write tensors the model cannot load (or
unquantised weights under a quantised config) is refused in one line naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from smoe.format import manifest

from fixtures_data import CKPTS
from helpers import refused, run

FP8 = {"dtype": "F8_E4M3", "scale": "s_scale_inv", "kind": "fp8-block", "block": [16, 16]}


@pytest.fixture(scope="module")
def sculpted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Path], Path]:
    """A copy (in a test's folder) of the vault, scout, config and manifest the sculptor
    makes of a fixture checkpoint, sculpted once per module."""
    base = tmp_path_factory.mktemp("sculpted")
    made: dict[str, Path] = {}

    def copy(name: str, dest: Path) -> Path:
        if name not in made:
            proc = run("sculpt", CKPTS / name, base / name, "--jobs", "1")
            assert proc.returncode == 0, proc.stderr
            made[name] = base / name
        dest.mkdir()
        for f in made[name].iterdir():
            (dest / f.name).write_bytes(f.read_bytes())
        return dest / f"{name}.smoe"

    return copy


def edit_manifest(vault: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = manifest.path_for(vault)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def edit_config(vault: Path, **changes: Any) -> Path:
    path = vault.with_name(vault.name.removesuffix(".smoe") + ".config.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return path


def refused_export(vault: Path, tmp_path: Path) -> str:
    hf = tmp_path / "hf"
    return refused(["export", vault, hf, "--hf"], 1, unchanged=[vault.parent], absent=hf)


def tensors(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for row in doc["experts"] for t in row["tensors"]]


def test_the_untouched_vaults_export(sculpted: Callable[[str, Path], Path], tmp_path: Path) -> None:
    for name in ("qwen3_moe", "qwen3_moe_fused"):
        vault = sculpted(name, tmp_path / name)
        proc = run("export", vault, tmp_path / f"{name}_hf", "--hf")
        assert proc.returncode == 0, proc.stderr


def test_transposed_on_a_2d_source_is_refused(
    sculpted: Callable[[str, Path], Path], tmp_path: Path
) -> None:
    vault = sculpted("qwen3_moe", tmp_path / "v")
    edit_manifest(vault, lambda doc: [t.update(transposed=True) for t in tensors(doc)])
    mpath = manifest.path_for(vault)
    assert refused_export(vault, tmp_path) == (
        f"error: {mpath}: experts[0].tensors[0].transposed is true, but its source "
        "'model.layers.0.mlp.experts.0.gate_proj.weight' is a 2-D tensor (index null): only a "
        "fused 3-D slab is stored transposed"
    )


def test_transposed_on_part_of_an_expert_is_refused(
    sculpted: Callable[[str, Path], Path], tmp_path: Path
) -> None:
    """Every down_proj slab transposed, gate and up not (each source tensor alike)."""
    vault = sculpted("qwen3_moe_fused", tmp_path / "v")
    edit_manifest(
        vault, lambda doc: [r["tensors"][2].update(transposed=True) for r in doc["experts"]]
    )
    assert refused_export(vault, tmp_path) == (
        f"error: {manifest.path_for(vault)}: experts[0].tensors[2].transposed is true, but "
        "tensors[0]'s is false: an expert's sources are all transposed or none"
    )


def test_transposed_for_a_family_without_that_layout_is_refused(
    sculpted: Callable[[str, Path], Path], tmp_path: Path
) -> None:
    """qwen3_moe checkpoints store fused experts as [E, 2I, H] only: a manifest saying every
    slab is transposed would export [E, H, 2I] tensors transformers cannot load (before:
    exit 0)."""
    vault = sculpted("qwen3_moe_fused", tmp_path / "v")
    edit_manifest(vault, lambda doc: [t.update(transposed=True) for t in tensors(doc)])
    assert refused_export(vault, tmp_path) == (
        f"error: {manifest.path_for(vault)}: transposed is true for "
        "'model.layers.0.mlp.experts.gate_up_proj', but qwen3_moe checkpoints (the arch "
        "block's model_type) store fused experts as [E, 2I, H] and [E, H, I]: the manifest "
        "contradicts the vault"
    )


def test_fp8_on_part_of_a_source_tensor_is_refused(
    sculpted: Callable[[str, Path], Path], tmp_path: Path
) -> None:
    vault = sculpted("qwen3_moe_fused", tmp_path / "v")
    edit_manifest(vault, lambda doc: doc["experts"][1]["tensors"][0].update(fp8=FP8))
    assert refused_export(vault, tmp_path) == (
        f"error: {manifest.path_for(vault)}: experts[1].tensors[0].fp8 is present, but an "
        "earlier entry of 'model.layers.0.mlp.experts.gate_up_proj' has it absent: one source "
        "tensor is FP8 or not"
    )


@pytest.mark.parametrize(
    "record, fault",
    [
        ({**FP8, "dtype": "BF16"}, 'dtype is "BF16", expected F8_E4M3 or F8_E5M2'),
        (
            {**FP8, "kind": "int4"},
            'kind is "int4", expected fp8-block or fp8-channel or fp8-tensor',
        ),
        ({**FP8, "block": [0, 16]}, "block is [0, 16], expected two positive integers"),
        (True, "is true, expected an object"),
    ],
)
def test_a_malformed_fp8_record_is_refused(
    sculpted: Callable[[str, Path], Path], tmp_path: Path, record: object, fault: str
) -> None:
    vault = sculpted("qwen3_moe", tmp_path / "v")
    edit_manifest(vault, lambda doc: [t.update(fp8=record) for t in tensors(doc)])
    assert refused_export(vault, tmp_path) == (
        f"error: {manifest.path_for(vault)}: experts[0].tensors[0].fp8 {fault}"
    )


def test_a_quantised_config_no_fp8_record_uses_is_refused(
    sculpted: Callable[[str, Path], Path], tmp_path: Path
) -> None:
    """The source was FP8 but the manifest's fp8 records are gone: before, the config kept
    its quantization_config and the BF16 experts were written under it (exit 0)."""
    vault = sculpted("qwen3_moe", tmp_path / "v")
    cfg = edit_config(vault, quantization_config={"quant_method": "fp8", "fmt": "e4m3"})
    assert refused_export(vault, tmp_path) == (
        f"error: {cfg}: quantization_config declares quant_method 'fp8', but "
        f"{manifest.path_for(vault).name} records no FP8 source (experts[].tensors[].fp8) and "
        "the scout holds no FP8 tensor: the export would write unquantised weights under a "
        "quantised config; refused"
    )


def test_an_fp8_block_the_config_contradicts_is_refused(
    sculpted: Callable[[str, Path], Path], tmp_path: Path
) -> None:
    vault = sculpted("qwen3_moe", tmp_path / "v")
    edit_manifest(vault, lambda doc: [t.update(fp8=FP8) for t in tensors(doc)])
    quant = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    cfg = edit_config(vault, quantization_config=quant)
    assert refused_export(vault, tmp_path) == (
        f"error: {manifest.path_for(vault)}: experts[0].tensors[0].fp8.block is [16, 16], but "
        f"{cfg} declares [128, 128] (quantization_config.weight_block_size): the manifest "
        "contradicts the config"
    )
    quant["weight_block_size"] = [16, 16]  # the same records under an agreeing config export
    edit_config(vault, quantization_config=quant)
    proc = run("export", vault, tmp_path / "hf", "--hf")
    assert proc.returncode == 0, proc.stderr
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "quantization_config" not in written
