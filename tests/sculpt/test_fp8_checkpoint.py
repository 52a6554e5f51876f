"""FP8 checkpoints end to end: a tiny model written by transformers, its expert weights
quantised to F8_E4M3 with scales the way DeepSeek-V3 ships them (``weight_scale_inv``, one
F32 scale per block), sculpted; beside it the BF16 checkpoint DeepSeek's
``fp8_cast_bf16.py`` would make of it (``weight.float() * scale``, rounded to bfloat16).
Both sculpt to the same vault, byte for byte. Refusals are checked word for word."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the hf extra (torch, transformers) is not installed")
pytest.importorskip("transformers", reason="the hf extra (torch, transformers) is not installed")

from safetensors.torch import load_file, save_file  # noqa: E402

from smoe.errors import RefusedInput, SmoeError  # noqa: E402
from smoe.format.manifest import checksum  # noqa: E402
from smoe.format.verify import verify_path  # noqa: E402
from smoe.interop.fp8 import Scheme  # noqa: E402
from smoe.interop.safetensors_io import TensorInfo, read_header  # noqa: E402
from smoe.sculpt import SculptOptions, sculpt  # noqa: E402
from smoe.sculpt.source.checkpoint import Checkpoint  # noqa: E402
from smoe.sculpt.source.fp8 import Fp8Scale, read_raw, scale_of  # noqa: E402
from smoe.vault.reader import Vault  # noqa: E402
from smoe_testkit import tiny  # noqa: E402

from helpers import refused  # noqa: E402

E4M3_MAX = 448.0
ROUTED = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")  # deepseek_v3
FUSED_T = re.compile(r"\.feed_forward\.experts\.(gate_up|down)_proj$")  # llama4: [E, H, 2I]
FUSED = re.compile(r"\.block_sparse_moe\.(input|output)_linear\.weight$")  # granitemoe
SHARD = "model.safetensors"

# ---------------------------------------------------------------------------- the checkpoints


def quantize(w: Any, block: tuple[int, int]) -> tuple[Any, Any]:
    """A 2-D weight as F8_E4M3 codes and one float32 scale per ``block`` (amax / 448, as
    DeepSeek's and transformers' FP8 quantisers: the block's largest weight becomes 448)."""
    (rows, cols), (br, bc) = w.shape, block
    nr, nc = -(-rows // br), -(-cols // bc)
    pad = torch.zeros(nr * br, nc * bc, dtype=torch.float32)
    pad[:rows, :cols] = w.float()
    blocks = pad.view(nr, br, nc, bc)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / E4M3_MAX
    q = (blocks / scale[:, None, :, None]).view(nr * br, nc * bc)[:rows, :cols]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def dequantize(q: Any, scale: Any, block: tuple[int, int]) -> Any:
    """fp8_cast_bf16's arithmetic: ``weight.float() * scale`` (every weight its block's
    scale), rounded to bfloat16."""
    (rows, cols), (br, bc) = q.shape, block
    full = scale.float().repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    return (q.float() * full).to(torch.bfloat16)


def per_slab(w: Any, fn: Callable[[Any], tuple[Any, Any]]) -> tuple[Any, Any]:
    """``fn`` of a 2-D weight, or of each slab of a stack, the results stacked."""
    if w.dim() == 2:
        return fn(w)
    parts = [fn(m) for m in w]
    return torch.stack([a for a, _ in parts]), torch.stack([b for _, b in parts])


def dequantize_all(q: Any, scale: Any, block: tuple[int, int]) -> Any:
    """:func:`dequantize` of a 2-D weight, or of each slab of a stack with its scales."""
    if q.dim() == 2:
        return dequantize(q, scale, block)
    return torch.stack([dequantize(a, b, block) for a, b in zip(q, scale)])


def write(folder: Path, tensors: dict[str, Any], config: dict) -> Path:
    folder.mkdir(parents=True)
    save_file(tensors, folder / SHARD, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def fp8_pair(
    src: Path,
    dest: Path,
    quantised: re.Pattern[str],
    block: tuple[int, int] | None,
    declare: tuple[int, int] | None,
) -> tuple[Path, Path]:
    """``src`` (a transformers-written checkpoint) as FP8 and as its BF16 dequantisation,
    in ``dest/fp8/model`` and ``dest/bf16/model`` (one folder name: the outputs are named
    alike). Every tensor ``quantised`` matches becomes F8_E4M3 with ``weight_scale_inv``
    F32 scales of ``block`` (stacked per expert for a 3-D tensor), or for ``block`` None
    with a compressed-tensors style per-channel ``weight_scale`` BF16 ``[R, 1]``;
    ``declare``: the ``weight_block_size`` config.json says (None: no such key)."""
    config = json.loads((src / "config.json").read_text())
    assert [p.name for p in src.glob("*.safetensors")] == [SHARD]
    fp8: dict[str, Any] = {}
    bf16: dict[str, Any] = {}
    for name, w in load_file(src / SHARD).items():
        if not quantised.search(name):
            fp8[name] = bf16[name] = w
            continue
        shape = block or (1, w.shape[-1])
        q, scale = per_slab(w, partial(quantize, block=shape))
        if block is None:
            scale = scale.to(torch.bfloat16)  # the product is still taken in float32
        fp8[name], bf16[name] = q, dequantize_all(q, scale, shape)
        fp8[name + ("_scale" if block is None else "_scale_inv")] = scale
    quant: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
    if declare is not None:
        quant["weight_block_size"] = list(declare)
    return (
        write(dest / "fp8" / "model", fp8, dict(config, quantization_config=quant)),
        write(dest / "bf16" / "model", bf16, config),
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny.write(model_type)`` once per model type (BF16, as transformers saves it)."""
    base = tmp_path_factory.mktemp("tiny")
    made: dict[str, Path] = {}

    def get(model_type: str) -> Path:
        if model_type not in made:
            made[model_type] = base / model_type
            tiny.write(model_type, made[model_type])
        return made[model_type]

    return get


@pytest.fixture(scope="module")
def deepseek(written: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny deepseek_v3 (routed experts gate/up [24, 64], down [64, 24]) as FP8 with
    16 x 16 blocks (partial blocks at the edges) and as BF16: ``<base>/fp8/model`` and
    ``<base>/bf16/model``."""
    base = tmp_path_factory.mktemp("deepseek")
    fp8_pair(written("deepseek_v3"), base, ROUTED, (16, 16), (16, 16))
    return base


def sculpt_both(base: Path, out: Path) -> tuple[Path, Path]:
    vaults = []
    for kind in ("fp8", "bf16"):
        res = sculpt(base / kind / "model", out / kind, SculptOptions(bits=4, jobs=1))
        assert not isinstance(res, dict)
        vaults.append(res.vault)
    return vaults[0], vaults[1]


def manifest(vault: Path) -> dict:
    return json.loads(Path(f"{vault}.manifest.json").read_text())


def without_source_bytes(doc: dict) -> dict:
    """A manifest less what records the source as stored: each tensor's ``source_crc32c``
    and ``fp8`` record, each shard's ``size`` and ``header_sha256``, and the small files'
    hashes (the FP8 config.json says how its weights are quantised)."""
    doc = json.loads(json.dumps(doc))
    for entry in doc["experts"]:
        for t in entry["tensors"]:
            del t["source_crc32c"]
            t.pop("fp8", None)
    for f in doc["source"]["files"]:
        del f["size"], f["header_sha256"]
    del doc["source"]["small_files"]
    return doc


def assert_same_vault(fp8: Path, bf16: Path) -> None:
    assert fp8.read_bytes() == bf16.read_bytes()
    with Vault.open(fp8) as a, Vault.open(bf16) as b:  # and so, decoded, the same weights
        assert a.keys() == b.keys() and len(a) > 0
        for (key, x), (_, y) in zip(a.items(), b.items()):
            for name, w in x.dequantize().items():
                np.testing.assert_array_equal(w, y.dequantize()[name], err_msg=f"{key} {name}")


# ---------------------------------------------------------------------------- per expert


def test_checkpoint_reads_fp8_experts_as_their_bf16_conversion(deepseek: Path) -> None:
    fp8, bf16 = (
        Checkpoint.open(deepseek / "fp8" / "model"),
        Checkpoint.open(deepseek / "bf16" / "model"),
    )
    assert fp8.experts.keys() == bf16.experts.keys() and len(fp8.experts) == 4
    for key, ref in fp8.experts.items():
        assert [None if s is None else s.scheme for s in ref.scales] == [
            Scheme("fp8-block", "F8_E4M3", f"{info.name}_scale_inv", (16, 16))
            for info, _, _ in ref.sources
        ]
        assert ref.shapes == bf16.experts[key].shapes and ref.nbytes == bf16.experts[key].nbytes
        for (a, src_a), (b, src_b) in zip(ref.load(), bf16.experts[key].load()):
            assert a.dtype == b.dtype == np.uint16 and src_a == src_b == "bf16"
            np.testing.assert_array_equal(a, b, err_msg=str(key))  # bit for bit


def test_fp8_and_bf16_checkpoints_sculpt_to_the_same_vault(deepseek: Path, tmp_path: Path) -> None:
    fp8, bf16 = sculpt_both(deepseek, tmp_path)
    assert fp8.name == bf16.name == "model.smoe"
    assert_same_vault(fp8, bf16)
    assert verify_path(fp8, deep=True).ok  # its manifest's fp8 records included
    # the manifests differ only where they record the source as stored: the CRC of the FP8
    # codes (not of the scales, nor of the BF16 they dequantise to), the FP8 record of each
    # tensor (dtype, scale tensor, block), shard sizes and header hashes, the config's hash
    a, b = manifest(fp8), manifest(bf16)
    assert without_source_bytes(a) == without_source_bytes(b)
    tensors = read_header(deepseek / "fp8" / "model" / SHARD)
    for entry in a["experts"]:
        for t in entry["tensors"]:
            assert t["source_crc32c"] == checksum(read_raw(tensors[t["source"]]).tobytes())
            assert set(t) == {"name", "source", "index", "rows", "source_crc32c", "snr_db", "fp8"}
            assert t["fp8"] == {
                "dtype": "F8_E4M3",
                "scale": t["source"] + "_scale_inv",
                "scale_dtype": "F32",
                "kind": "fp8-block",
                "block": [16, 16],
            }
    # the config copy is config.json byte for byte: quantization_config and all
    for kind, vault in (("fp8", fp8), ("bf16", bf16)):
        copy = vault.with_name("model.config.json").read_bytes()
        assert copy == (deepseek / kind / "model" / "config.json").read_bytes()


def test_the_scouts_hold_the_same_non_expert_tensors(deepseek: Path, tmp_path: Path) -> None:
    fp8, bf16 = sculpt_both(deepseek, tmp_path)
    a = read_header(fp8.with_name("model.scout.safetensors"))
    b = read_header(bf16.with_name("model.scout.safetensors"))
    for name in b:
        assert (a[name].dtype, a[name].shape) == (b[name].dtype, b[name].shape)
        assert read_raw(a[name]).tobytes() == read_raw(b[name]).tobytes()


def test_the_scout_holds_no_expert_scales(deepseek: Path, tmp_path: Path) -> None:
    fp8, bf16 = sculpt_both(deepseek, tmp_path)
    a = read_header(fp8.with_name("model.scout.safetensors"))
    b = read_header(bf16.with_name("model.scout.safetensors"))
    assert sorted(set(a) - set(b)) == []


def test_per_channel_scales_read_too(written: Callable[[str], Path], tmp_path: Path) -> None:
    """compressed-tensors style: ``weight_scale`` BF16 [R, 1], no block size declared."""
    fp8_pair(written("deepseek_v3"), tmp_path, ROUTED, None, None)
    ref = Checkpoint.open(tmp_path / "fp8" / "model").experts[(1, 0)]
    assert [s.scheme.kind for s in ref.scales if s is not None] == ["fp8-channel"] * 3
    assert_same_vault(*sculpt_both(tmp_path, tmp_path / "out"))


def test_the_declared_block_size_is_the_one_applied(
    written: Callable[[str], Path], tmp_path: Path
) -> None:
    """Blocks of 12 x 16: gate/up [24, 64] get scales [2, 4], which 16-row blocks fit too
    (the shapes alone would say 16); down [64, 24] gets [6, 2], which 11 or 12 rows fit
    (ambiguous without the declaration)."""
    fp8_pair(written("deepseek_v3"), tmp_path, ROUTED, (12, 16), (12, 16))
    assert_same_vault(*sculpt_both(tmp_path, tmp_path / "out"))


def test_scale_of_applies_the_declared_block() -> None:
    where = Path("m.safetensors")  # headers only: nothing is read
    gate = TensorInfo("g.weight", where, "F8_E4M3", (24, 64), 8, 1536)
    tensors = {
        gate.name: gate,
        "g.weight_scale_inv": TensorInfo("g.weight_scale_inv", where, "F32", (2, 4), 1544, 32),
    }
    for declared, block in ((None, (16, 16)), ((12, 16), (12, 16)), ((20, 16), (20, 16))):
        scale = scale_of(gate, tensors, declared)
        assert isinstance(scale, Fp8Scale) and scale.block == block
    with pytest.raises(RefusedInput) as e:
        scale_of(gate, tensors, (8, 16))
    assert str(e.value) == (
        "m.safetensors: tensor 'g.weight' (scales 'g.weight_scale_inv'): scale shape [2, 4] "
        "does not fit weight shape [24, 64] in the declared blocks [8, 16] "
        "(quantization_config.weight_block_size), which need [3, 4]; refused: the scales "
        "would be applied to the wrong weights"
    )


def test_expert_bytes_in_count_the_fp8_bytes_and_scales(deepseek: Path, tmp_path: Path) -> None:
    """Issue #31: FP8 experts were counted at their BF16 size. Per expert tensors with their
    own block scales: the bytes in are exactly the experts' weight and scale tensors."""
    results = {}
    for kind in ("fp8", "bf16"):
        model = deepseek / kind / "model"
        res = sculpt(model, tmp_path / kind, SculptOptions(bits=4, jobs=1))
        assert not isinstance(res, dict)
        ck = Checkpoint.open(model)
        assert res.bytes_in == sum(ck.tensors[n].nbytes for n in ck.expert_tensor_names)
        assert res.summary()["expert_bytes_in"] == res.bytes_in
        results[kind] = res.bytes_in
    weights = results["bf16"] // 2  # one byte a weight in FP8, two in BF16
    assert weights < results["fp8"] < results["bf16"]


def test_fused_fp8_bytes_in_count_each_half_s_scales(
    written: Callable[[str], Path], tmp_path: Path
) -> None:
    """granitemoe: gate and up are halves of input_linear [E, 192, 64] in blocks of 64 x 16;
    the block row both halves straddle (64..128) counts for each of them."""
    fp8_pair(written("granitemoe"), tmp_path, FUSED, (64, 16), (64, 16))
    ck = Checkpoint.open(tmp_path / "fp8" / "model")
    ref = ck.experts[(0, 0)]
    (gu, _, _), _, (down, _, _) = ref.sources
    inter, hidden = gu.shape[1] // 2, gu.shape[2]
    assert (inter, hidden) == (96, 64)
    scales = (2 + 2) * (hidden // 16) * 4  # gate: block rows 0-1, up: 1-2; F32
    down_scales = -(-down.shape[1] // 64) * -(-down.shape[2] // 16) * 4
    assert ref.source_bytes == 3 * inter * hidden + scales + down_scales


def compressed_tensors(model: Path, weights: dict) -> Path:
    """``model``'s config.json with a compressed-tensors ``quantization_config`` instead of
    DeepSeek's: one config group whose ``weights`` are ``weights``."""
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "symmetric": True, **weights},
            }
        },
    }
    (model / "config.json").write_text(json.dumps(cfg))
    return model


def test_a_compressed_tensors_block_structure_is_the_block_applied(
    written: Callable[[str], Path], tmp_path: Path
) -> None:
    """Issue #31: blocks of 20 x 16 declared as compressed-tensors' block_structure. The
    shapes alone say 16 rows (gate/up [24, 64] have scales [2, 4], down [64, 24] [4, 2]);
    before, the declaration was ignored and the 16-row reading sculpted wrong weights with
    exit 0."""
    fp8_pair(written("deepseek_v3"), tmp_path, ROUTED, (20, 16), None)  # declared below
    fp8 = compressed_tensors(
        tmp_path / "fp8" / "model", {"strategy": "block", "block_structure": [20, 16]}
    )
    assert Checkpoint.open(fp8).experts[(1, 0)].scales[0].block == (20, 16)  # type: ignore[union-attr]
    assert_same_vault(*sculpt_both(tmp_path, tmp_path / "out"))


def test_a_block_structure_the_scales_contradict_is_refused_naming_it(
    written: Callable[[str], Path], tmp_path: Path
) -> None:
    fp8_pair(written("deepseek_v3"), tmp_path, ROUTED, (16, 16), None)
    fp8 = compressed_tensors(
        tmp_path / "fp8" / "model", {"strategy": "block", "block_structure": [8, 16]}
    )
    out = tmp_path / "out"
    line = refused(["sculpt", fp8, out], 1, unchanged=[fp8], absent=out)
    assert (
        "in the declared blocks [8, 16] (quantization_config.config_groups.group_0.weights"
        ".block_structure), which need [3, 4]; refused: the scales would be applied to the "
        "wrong weights" in line
    )


@pytest.mark.parametrize("value", [2**63, 2**64, 2**31, -128, 0, 128.0, True, "128"])
def test_an_absurd_weight_block_size_is_refused_naming_the_key(
    deepseek: Path, tmp_path: Path, value: object
) -> None:
    """Issue #31: a block size of 2^63 was an internal error (numpy overflow)."""
    model = tmp_path / "model"
    shutil.copytree(deepseek / "fp8" / "model", model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [value, 16]
    (model / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    line = refused(["sculpt", model, out], 1, unchanged=[model], absent=out)
    assert line.startswith(
        f"error: {model}/config.json: quantization_config.weight_block_size is "
        f"[{json.dumps(value)}, 16], expected two positive integers"
    )


# ---------------------------------------------------------------------------- fused experts


def test_fused_transposed_fp8_experts(written: Callable[[str], Path], tmp_path: Path) -> None:
    """llama4: gate_up_proj [E, H, 2I] with stacked scales [E, H/16, 2I/16]; each slab is
    dequantised whole, then its columns taken."""
    fp8_pair(written("llama4"), tmp_path, FUSED_T, (16, 16), (16, 16))
    ck = Checkpoint.open(tmp_path / "fp8" / "model")
    ref = ck.experts[(0, 1)]
    assert ref.transposed and all(s is not None and s.scheme.stacked for s in ref.scales)
    assert_same_vault(*sculpt_both(tmp_path, tmp_path / "out"))


def test_fused_row_slices_straddling_a_block(
    written: Callable[[str], Path], tmp_path: Path
) -> None:
    """granitemoe: input_linear [E, 2I, H] = [4, 192, 64] in blocks of 64 x 16: up's rows
    96..192 start inside block row 1 (64..128), whose scale gate shares."""
    fp8_pair(written("granitemoe"), tmp_path, FUSED, (64, 16), (64, 16))
    fp8 = Checkpoint.open(tmp_path / "fp8" / "model")
    bf16 = Checkpoint.open(tmp_path / "bf16" / "model")
    for key, ref in fp8.experts.items():
        want = bf16.experts[key].load()
        for k, (part, (info, idx, rows)) in enumerate(zip(ref.parts(), ref.sources)):
            scale = ref.scales[k]
            assert scale is not None and scale.scheme.stacked and scale.block == (64, 16)
            got = scale.dequantize(read_raw(part), idx, info.name, rows)
            np.testing.assert_array_equal(got, want[k][0], err_msg=f"{key} {k}")
    ref = fp8.experts[(0, 2)]
    with pytest.raises(RefusedInput) as e:  # rows are needed to find a slice's scales
        ref.scales[1].dequantize(read_raw(ref.parts()[1]), 2, "w")  # type: ignore[union-attr]
    assert str(e.value) == (
        "w: 96 of the 192 rows of slab 2 of a stacked FP8 weight, without their row offset; "
        "refused: the scales of a row slice cannot be matched to its weights"
    )


def test_fused_fp8_experts_sculpt_as_their_bf16_conversion(
    written: Callable[[str], Path], tmp_path: Path
) -> None:
    fp8_pair(written("granitemoe"), tmp_path, FUSED, (64, 16), (64, 16))
    assert_same_vault(*sculpt_both(tmp_path, tmp_path / "out"))


def test_a_non_finite_weight_is_refused_naming_slab_and_rows(
    written: Callable[[str], Path], tmp_path: Path
) -> None:
    fp8_pair(written("granitemoe"), tmp_path, FUSED, (64, 16), (64, 16))
    ref = Checkpoint.open(tmp_path / "fp8" / "model").experts[(1, 3)]
    _, idx, rows = ref.sources[1]
    raw = read_raw(ref.parts()[1])
    raw[40, 5] = 0x7F  # slab row 136: block row 2, past the straddled one
    with pytest.raises(RefusedInput) as e:
        ref.scales[1].dequantize(raw, idx, "w", rows)  # type: ignore[union-attr]
    assert str(e.value).startswith(
        "w[3, 128:192]: weight at row 8 col 5 is not finite once dequantised (F8_E4M3 code "
        "0x7f = nan, times scale "
    )


# ---------------------------------------------------------------------------- refusals


def edited(src: Path, dest: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of checkpoint ``src`` whose tensors ``edit`` changed (in place)."""
    shutil.copytree(src, dest)
    tensors = load_file(src / SHARD)
    edit(tensors)
    save_file(tensors, dest / SHARD, metadata={"format": "pt"})
    return dest


def refusal(model: Path, out: Path) -> str:
    with pytest.raises(SmoeError) as e:
        sculpt(model, out, SculptOptions(bits=4, jobs=1))
    assert not out.exists() or list(out.iterdir()) == []
    return str(e.value)


def test_fp8_without_its_scales_is_refused(deepseek: Path, tmp_path: Path) -> None:
    w = "model.layers.1.mlp.experts.2.up_proj.weight"
    model = edited(
        deepseek / "fp8" / "model", tmp_path / "model", lambda t: t.pop(w + "_scale_inv")
    )
    assert refusal(model, tmp_path / "out") == (
        f"{model / SHARD}: tensor {w!r} is F8_E4M3 without scales (neither "
        f"'{w}_scale_inv' nor '{w}_scale' is in the checkpoint); refused: FP8 weights are "
        "read only with their scales"
    )


def test_mxfp4_blocks_are_refused(deepseek: Path, tmp_path: Path) -> None:
    stem = "model.layers.1.mlp.experts.1.gate_proj"

    def mxfp4(t: dict[str, Any]) -> None:  # gpt-oss style: 32 FP4 codes in 16 bytes a block
        t[stem + "_blocks"] = torch.zeros(24, 2, 16, dtype=torch.uint8)
        t[stem + "_scales"] = torch.full((24, 2), 127, dtype=torch.uint8)

    model = edited(deepseek / "bf16" / "model", tmp_path / "model", mxfp4)
    assert refusal(model, tmp_path / "out") == (
        f"{model / SHARD}: tensor '{stem}.weight' is MXFP4 (gpt-oss style _blocks/_scales: "
        f"found '{stem}_blocks'); refused: only BF16, F16 and F32 weights, and FP8 ones with "
        "their scales, can be read"
    )


def test_a_float_weight_with_scales_is_refused(deepseek: Path, tmp_path: Path) -> None:
    w = "model.layers.1.mlp.experts.3.down_proj.weight"

    def scaled(t: dict[str, Any]) -> None:
        t[w + "_scale_inv"] = torch.ones(4, 2, dtype=torch.float32)

    model = edited(deepseek / "bf16" / "model", tmp_path / "model", scaled)
    assert refusal(model, tmp_path / "out") == (
        f"{model / SHARD}: tensor {w!r} is BF16 with scales in '{w}_scale_inv'; refused: its "
        "values are not the weights without the scales; only FP8 weights are read with scales"
    )
