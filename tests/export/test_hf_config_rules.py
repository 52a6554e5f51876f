"""The config.json ``export --hf`` writes, by rule (issue 22).

* **Rebuilt only where exact, unless asked**: without a config copy (``<stem>.config.json``
  beside the vault, or ``--config``) the config is rebuilt from the arch block for the
  families of the registry that name their transformers class and have a recipe; a family
  whose config the vault cannot give exactly (``Family.rebuild`` false: DeepSeek's routing
  knobs) is refused naming the keys a rebuild would assume, unless ``--rebuild-config``
  (which, with ``--config``, is a usage error).
* **FP8 sources**: a vault sculpted from an FP8 checkpoint holds its experts dequantised;
  the export is an unquantised checkpoint (the copy loses ``quantization_config``, the
  experts are BF16) that transformers loads, or, when the scout still holds FP8 tensors,
  a refusal.

Every message is checked word for word; ``--json`` stays valid on success and on error.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from smoe.errors import RefusedInput, SmoeError, UsageError
from smoe.export.hf import transformers_config as hf_config
from smoe.export.hf.checkpoint import export_hf
from smoe.families.registry import family_of
from smoe.interop.safetensors_io import read_header
from smoe.sculpt import SculptOptions, companions, sculpt

from fixtures_data import CKPTS
from helpers import refused, run, strict_json

torch = pytest.importorskip("torch", reason="the hf extra (torch, transformers) is not installed")
transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

from safetensors.torch import load_file, save_file  # noqa: E402

from smoe_testkit import tiny  # noqa: E402

KNOWN = "deepseek_v2, deepseek_v3, mixtral, olmoe, qwen2_moe, qwen3_moe"
UNRECORDED = {
    "deepseek_v2": "topk_method, rope_scaling, routed_scaling_factor, n_group, topk_group",
    "deepseek_v3": "rope_scaling, rope_interleave, routed_scaling_factor, n_group, topk_group",
}
IDS = [[(i * 37 + 3 + 11 * row) % 128 for i in range(16)] for row in range(2)]


def inexact(vault: Path, model_type: str, keys: str) -> str:
    return (
        f"{vault}: no config.json beside it, and a {model_type} config cannot be rebuilt "
        f"exactly: the vault does not record {keys}, which a rebuild would have to assume; "
        "pass --config MODEL/config.json, or --rebuild-config to rebuild it anyway"
    )


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """checkpoint folder -> its Q4 vault, sculpted once, its staged config copy removed."""
    base = tmp_path_factory.mktemp("bare")
    done: dict[Path, Path] = {}

    def get(model: Path) -> Path:
        if model not in done:
            vault = sculpt(model, base / f"v{len(done)}", SculptOptions(bits=4, jobs=1)).vault
            companions(vault)[1].unlink()
            done[model] = vault
        return done[model]

    return get


# ---- rebuilt only where exact, unless asked ------------------------------------------------
@pytest.mark.parametrize("family", sorted(UNRECORDED))
def test_deepseek_is_refused_without_a_config_copy(family: str, bare: Any, tmp_path: Path) -> None:
    vault = bare(CKPTS / family)
    entry = family_of(family)
    assert entry is not None and not entry.rebuild
    want = inexact(vault, family, UNRECORDED[family])
    out = tmp_path / "hf"
    assert refused(lambda: export_hf(vault, out), absent=out) == want
    assert refused(["export", vault, out, "--hf"], 1, absent=out) == f"error: {want}"
    proc = run("export", vault, out, "--hf", "--json")
    assert proc.returncode == 1 and not out.exists()
    doc = strict_json(proc.stdout)
    assert doc["ok"] is False and doc["error"] == {"message": want, "exit_code": 1}


@pytest.mark.parametrize("family", sorted(UNRECORDED))
def test_rebuild_config_rebuilds_it_anyway(family: str, bare: Any, tmp_path: Path) -> None:
    vault = bare(CKPTS / family)
    out = tmp_path / "hf"
    proc = run("export", vault, out, "--hf", "--rebuild-config", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = strict_json(proc.stdout)
    assert (summary["config"], summary["config_path"]) == ("rebuilt", None)
    assumed = summary["assumed"]
    assert "routed_scaling_factor 1.0" in assumed and "n_group 1" in assumed
    assert summary["notes"] == [
        f"config.json rebuilt from {vault.name}'s arch block and the scout's shapes "
        f"(--rebuild-config); assumed: {', '.join(assumed)}"
    ]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [family_of(family).architecture]  # type: ignore[union-attr]
    _, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert all(not v for v in info.values()), info
    # the text output: the notes, then the summary line saying where config.json came from
    proc = run("export", vault, tmp_path / "hf2", "--hf", "--rebuild-config")
    assert proc.returncode == 0, proc.stderr
    assert "config.json rebuilt from the arch block and the scout" in proc.stdout


def test_rebuild_config_and_config_together_are_a_usage_error(bare: Any, tmp_path: Path) -> None:
    vault = bare(CKPTS / "deepseek_v3")
    cfg = CKPTS / "deepseek_v3" / "config.json"
    want = (
        "--rebuild-config and --config: choose one (the config.json to copy, or one rebuilt "
        "from the vault)"
    )
    out = tmp_path / "hf"
    with pytest.raises(UsageError) as info:
        export_hf(vault, out, config=cfg, rebuild_config=True)
    assert str(info.value) == want
    argv = ["export", vault, out, "--hf", "--rebuild-config", "--config", cfg]
    assert refused(argv, 2, absent=out) == f"error: {want}"
    proc = run(*argv, "--json")
    assert proc.returncode == 2
    assert strict_json(proc.stdout)["error"] == {"message": want, "exit_code": 2}
    line = refused(["export", vault, tmp_path / "x.safetensors", "--rebuild-config"], 2)
    assert line == "error: --rebuild-config needs --hf (see smoe export --help)"


def test_an_exact_family_is_rebuilt_without_the_flag(bare: Any, tmp_path: Path) -> None:
    vault = bare(CKPTS / "qwen3_moe")
    proc = run("export", vault, tmp_path / "hf", "--hf", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = strict_json(proc.stdout)
    assert summary["config"] == "rebuilt" and summary["assumed"][0].startswith("rope_type")
    staged = companions(vault)[1].name
    assert summary["notes"] == [
        f"config.json rebuilt from {vault.name}'s arch block and the scout's shapes (no "
        f"{staged} beside the vault, no --config); assumed: {', '.join(summary['assumed'])}"
    ]


def test_the_registry_decides(bare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The class written, whether a rebuild is exact, and which families have one at all
    come from the registry's entry (here replaced)."""
    vault = bare(CKPTS / "qwen3_moe")
    real = family_of("qwen3_moe")
    assert real is not None

    def entry(**changes: Any) -> None:
        changed = dataclasses.replace(real, **changes)
        monkeypatch.setattr(
            hf_config, "family_of", lambda mt: changed if mt == "qwen3_moe" else family_of(mt)
        )

    entry(architecture="SomeOtherForCausalLM")
    export_hf(vault, tmp_path / "a")
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["architectures"] == ["SomeOtherForCausalLM"]

    entry(rebuild=False, beyond=("sliding_window", "rope_scaling", "moe_intermediate_size"))
    with pytest.raises(RefusedInput) as info:
        export_hf(vault, tmp_path / "b")
    assert str(info.value) == inexact(vault, "qwen3_moe", "sliding_window, rope_scaling")
    assert export_hf(vault, tmp_path / "b", rebuild_config=True).config == "rebuilt"

    entry(architecture="")
    with pytest.raises(RefusedInput) as info:
        export_hf(vault, tmp_path / "c")
    assert str(info.value) == (
        f"{vault}: no config.json beside it, and model_type 'qwen3_moe' has no recipe to "
        "rebuild one (known: deepseek_v2, deepseek_v3, mixtral, olmoe, qwen2_moe); pass --config"
    )


def test_a_family_without_a_recipe_is_refused(bare: Any, tmp_path: Path) -> None:
    """A multimodal wrapper (Qwen3.5-MoE): its config copy is exported as it is, loaded by
    transformers; without the copy, refused naming the families a rebuild knows."""
    model = tmp_path / "qwen3_5_moe"
    tiny.write("qwen3_5_moe", model)
    vault = sculpt(model, tmp_path / "out", SculptOptions(bits=4, jobs=1)).vault
    result = export_hf(vault, tmp_path / "hf")
    assert result.config == "copied" and result.config_path == companions(vault)[1]
    assert (tmp_path / "hf" / "config.json").read_bytes() == (model / "config.json").read_bytes()
    with tiny._quiet():
        _, info = tiny.model_class("qwen3_5_moe").from_pretrained(
            tmp_path / "hf", output_loading_info=True
        )
    assert all(not v for v in info.values()), info
    companions(vault)[1].unlink()
    for flags in ((), ("--rebuild-config",)):
        line = refused(["export", vault, tmp_path / "hf2", "--hf", *flags], 1)
        assert line == (
            f"error: {vault}: no config.json beside it, and model_type 'qwen3_5_moe' has no "
            f"recipe to rebuild one (known: {KNOWN}); pass --config"
        )


# ---- FP8 sources ---------------------------------------------------------------------------
E4M3_MAX = 448.0
EXPERTS = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
ATTENTION = re.compile(r"\.self_attn\.\w+_proj\.weight$")
BLOCK = (16, 16)


def quantize(w: Any) -> tuple[Any, Any]:
    """A 2-D weight as F8_E4M3 codes and one float32 scale per 16 x 16 block (amax / 448),
    as tests/sculpt/test_fp8_checkpoint.py makes them."""
    (rows, cols), (br, bc) = w.shape, BLOCK
    nr, nc = -(-rows // br), -(-cols // bc)
    pad = torch.zeros(nr * br, nc * bc, dtype=torch.float32)
    pad[:rows, :cols] = w.float()
    blocks = pad.view(nr, br, nc, bc)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / E4M3_MAX
    q = (blocks / scale[:, None, :, None]).view(nr * br, nc * bc)[:rows, :cols]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def dequantize(q: Any, scale: Any) -> Any:
    (rows, cols), (br, bc) = q.shape, BLOCK
    full = scale.float().repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    return (q.float() * full).to(torch.bfloat16)


def fp8_pair(src: Path, dest: Path, *patterns: re.Pattern[str]) -> tuple[Path, Path]:
    """``src`` with every 2-D tensor a pattern matches as FP8 (``weight_scale_inv`` blocks,
    ``quantization_config`` in config.json), and its BF16 dequantisation."""
    config = json.loads((src / "config.json").read_text())
    fp8: dict[str, Any] = {}
    bf16: dict[str, Any] = {}
    for name, w in load_file(src / "model.safetensors").items():
        if w.dim() != 2 or not any(p.search(name) for p in patterns):
            fp8[name] = bf16[name] = w
            continue
        q, scale = quantize(w)
        fp8[name], fp8[name + "_scale_inv"], bf16[name] = q, scale, dequantize(q, scale)
    quant = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(BLOCK),
    }
    out = []
    for kind, tensors, cfg in (
        ("fp8", fp8, dict(config, quantization_config=quant)),
        ("bf16", bf16, config),
    ):
        folder = dest / kind / "model"
        folder.mkdir(parents=True)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
        out.append(folder)
    return out[0], out[1]


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny deepseek_v3 as transformers saves it (BF16)."""
    folder = tmp_path_factory.mktemp("tiny") / "deepseek_v3"
    tiny.write("deepseek_v3", folder)
    return folder


def logits(folder: Path) -> tuple[Any, dict[str, Any]]:
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, output_loading_info=True, dtype=torch.float32
    )
    with torch.no_grad():
        return model.eval()(torch.tensor(IDS)).logits, info


def test_an_fp8_vault_exports_an_unquantised_checkpoint(deepseek: Path, tmp_path: Path) -> None:
    fp8, bf16 = fp8_pair(deepseek, tmp_path, EXPERTS)
    vault = sculpt(fp8, tmp_path / "out", SculptOptions(bits=4, jobs=1)).vault
    doc = json.loads(Path(f"{vault}.manifest.json").read_text())
    assert all(t.get("fp8") for r in doc["experts"] for t in r["tensors"])
    assert b"quantization_config" in companions(vault)[1].read_bytes()  # the copy as it was
    out = tmp_path / "hf"
    proc = run("export", vault, out, "--hf", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = strict_json(proc.stdout)
    assert summary["notes"] == [
        "config.json: quantization_config (quant_method 'fp8') removed: the vault's experts "
        "were dequantised from FP8 when sculpted and the scout holds no FP8 tensor, so "
        "nothing written is quantised"
    ]
    assert (summary["config"], summary["dtype"]) == ("copied", "BF16")
    want = json.loads((fp8 / "config.json").read_text())
    del want["quantization_config"]
    assert json.loads((out / "config.json").read_text()) == want
    tensors = read_header(out / "model.safetensors")
    assert {t.dtype for t in tensors.values()} == {"BF16"}
    assert sorted(tensors) == sorted(read_header(bf16 / "model.safetensors"))
    got, info = logits(out)
    assert all(not v for v in info.values()), info
    ref, _ = logits(bf16)
    assert float((got - ref).norm() / ref.norm()) < 0.3
    # --dtype f32: the experts in float32, and config.json says so
    result = export_hf(vault, tmp_path / "hf32", dtype="f32")
    assert result.dtype == "F32" and len(result.notes) == 2
    assert result.notes[1] == (
        "config.json: dtype set to 'float32' (was \"bfloat16\") to match --dtype"
    )
    cfg = json.loads((tmp_path / "hf32" / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["dtype"] == "float32"


def test_an_fp8_scout_is_refused(deepseek: Path, tmp_path: Path) -> None:
    """A DeepSeek-V3 FP8 checkpoint quantises attention too: its scout keeps those tensors
    in FP8, which a checkpoint with BF16 experts cannot pair with."""
    fp8, _ = fp8_pair(deepseek, tmp_path, EXPERTS, ATTENTION)
    vault = sculpt(fp8, tmp_path / "out", SculptOptions(bits=4, jobs=1)).vault
    scout = companions(vault)[0]
    first = "model.layers.0.self_attn.kv_b_proj.weight"  # the first FP8 one, by name
    assert read_header(scout)[first].dtype == "F8_E4M3"
    out = tmp_path / "hf"
    want = (
        f"{scout}: holds the FP8 tensor {first!r} (F8_E4M3), while the vault's experts were "
        "dequantised from FP8: a checkpoint of both would need the experts requantised to "
        "FP8, which export --hf does not do; convert the scout's FP8 tensors to BF16 first "
        "(dequantised with their scales, the scale tensors removed), then export it "
        "unquantised"
    )
    with pytest.raises(SmoeError) as info:
        export_hf(vault, out)
    assert str(info.value) == want
    for flags in ((), ("--rebuild-config",)):
        assert refused(["export", vault, out, "--hf", *flags], 1, absent=out) == f"error: {want}"
    proc = run("export", vault, out, "--hf", "--json")
    assert strict_json(proc.stdout)["error"] == {"message": want, "exit_code": 1}
