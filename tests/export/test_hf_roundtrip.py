"""`smoe export --hf` round trip through transformers itself (issue 15).

Every checkpoint the sculptor converts (fixtures/checkpoints, ``"expect": "convert"``;
tiny models written by transformers' ``save_pretrained``) is sculpted at Q4 and Q2,
exported with ``--hf`` and loaded with ``AutoModelForCausalLM.from_pretrained``: no missing,
unexpected or mismatched weights and no warning; the same architecture and parameter names
as the original; logits on fixed input ids that differ from the original's as the vault's
SNR says (Q4 clearly closer than Q2), and that are bit-equal (float32) to the original's
once its experts are replaced by their own dequantisation.
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from smoe.errors import SmoeError
from smoe.export.hf import output as hf_output
from smoe.export.hf.checkpoint import export_hf
from smoe.families.registry import family_of
from smoe.format import manifest
from smoe.interop.safetensors_io import read_header
from smoe.sculpt import SculptOptions, companions, sculpt
from smoe.vault.reader import Vault

from fixtures_data import CKPTS, CONVERT
from helpers import run

torch = pytest.importorskip("torch", reason="the hf extra (torch, transformers) is not installed")
transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

FAMILIES = CONVERT
ASSUMES_ROUTING = {"deepseek_v3"}  # n_group 2, topk_group 1, routed_scaling 2.5: not in a vault
INEXACT = {"deepseek_v2", "deepseek_v3"}  # rebuilt only with rebuild_config (--rebuild-config)
IDS = [[(i * 37 + 3 + 11 * row) % 128 for i in range(16)] for row in range(2)]
TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers.utils.logging.disable_progress_bar()
    return tmp_path_factory.mktemp("hf")


@pytest.fixture(scope="module")
def sculpted(work: Path) -> Callable[[str, int], Path]:
    """(family, bits) -> the vault, sculpted once; the Q2 folder has the model's config.json
    staged as ``<stem>.config.json`` (as the sculptor stages it), the Q4 folder none."""
    done: dict[tuple[str, int], Path] = {}

    def get(family: str, bits: int) -> Path:
        if (family, bits) not in done:
            result = sculpt(
                CKPTS / family, work / f"{family}-q{bits}", SculptOptions(bits=bits, jobs=1)
            )
            if bits == 4:  # the Q2 folder keeps the config.json the sculptor commits
                companions(result.vault)[1].unlink()
            done[(family, bits)] = result.vault
        return done[(family, bits)]

    return get


def load(path: Path, dtype: object = "float32") -> tuple[object, list[str]]:
    """The model (float32 unless ``dtype``), and every warning or log record of the load."""
    handler = Records()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    gc.collect()  # an earlier test's unclosed file is its own, not a warning of this load
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kw = {} if dtype is None else {"dtype": getattr(torch, dtype)}
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                path, output_loading_info=True, **kw
            )
    finally:
        logger.removeHandler(handler)
    problems = [f"{k}: {sorted(v)}" for k, v in info.items() if v]
    problems += [r.getMessage() for r in handler.records] + [str(w.message) for w in caught]
    return model.eval(), problems


def logits(model: object) -> object:
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits


def params(model: object) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def replace_experts(model: object, vault: Path, dtype: str) -> None:
    """Put each expert's dequantisation (rounded to ``dtype``) into the fused in-memory
    parameters transformers keeps for every family: gate_up_proj [E, 2I, H], down_proj."""
    p = dict(model.named_parameters())
    with Vault.open(vault) as v, torch.no_grad():
        for (layer, e), ex in v.items():
            w = {
                k: torch.from_numpy(a).to(getattr(torch, dtype)).float()
                for k, a in ex.dequantize().items()
            }
            gate_up = p[f"model.layers.{layer}.mlp.experts.gate_up_proj"]
            inter = w["gate_proj"].shape[0]
            gate_up[e, :inter] = w["gate_proj"]
            gate_up[e, inter:] = w["up_proj"]
            p[f"model.layers.{layer}.mlp.experts.down_proj"][e] = w["down_proj"]


def rel(a: object, b: object) -> float:
    return float((a - b).norm() / b.norm())


def snr_median(vault: Path) -> float:
    doc = json.loads(manifest.path_for(vault).read_text())
    return float(np.median([t["snr_db"] for r in doc["experts"] for t in r["tensors"]]))


def source_tensors(family: str) -> dict[str, object]:
    out = {}
    for shard in sorted((CKPTS / family).glob("*.safetensors")):
        out.update(read_header(shard))
    return out


def exported_tensors(folder: Path) -> dict[str, object]:
    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(read_header(shard))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip(family: str, sculpted: Callable[[str, int], Path], work: Path) -> None:
    original, problems = load(CKPTS / family)
    assert problems == []
    base = logits(original)
    q4, q2 = sculpted(family, 4), sculpted(family, 2)
    hf4, hf2 = work / f"{family}-hf4", work / f"{family}-hf2"
    r4 = export_hf(q4, hf4, config=CKPTS / family / "config.json")
    r2 = export_hf(q2, hf2, dtype="f32", threads=1)  # config: the staged <stem>.config.json
    assert (r2.config, r2.config_path, r2.assumed) == ("copied", companions(q2)[1], [])

    # the files: the source's names, shapes and (outside the experts) bytes
    src, got = source_tensors(family), exported_tensors(hf4)
    assert sorted(got) == sorted(src)
    assert all(got[n].shape == src[n].shape for n in src)
    scout = read_header(q4.with_name(f"{family}.scout.safetensors"))
    for name, info in scout.items():
        out = got[name]
        assert (out.dtype, out.shape) == (info.dtype, info.shape)
        with open(info.path, "rb") as a, open(out.path, "rb") as b:
            a.seek(info.offset)
            b.seek(out.offset)
            assert a.read(info.nbytes) == b.read(out.nbytes), name
    assert json.loads((hf4 / "config.json").read_text()) == json.loads(
        (CKPTS / family / "config.json").read_text()
    )
    cfg2 = json.loads((hf2 / "config.json").read_text())
    assert cfg2.get("dtype", cfg2.get("torch_dtype")) == "float32"  # old spelling kept

    m4, problems4 = load(hf4)
    m2, problems2 = load(hf2, dtype=None)  # config.json says float32 now
    assert problems4 == [] and problems2 == []
    assert m2.dtype == torch.float32
    assert type(m4) is type(original) and params(m4) == params(original) == params(m2)

    # quality as the SNR says: the logit error is within the weights' relative error, and
    # Q2's exceeds Q4's about as much as their SNRs differ
    l4, l2 = logits(m4), logits(m2)
    e4, e2 = rel(l4, base), rel(l2, base)
    s4, s2 = snr_median(q4), snr_median(q2)
    assert 0 < e4 < 10 ** (-s4 / 20) and 0 < e2 < 10 ** (-s2 / 20), (e4, e2, s4, s2)
    predicted = 10 ** ((s4 - s2) / 20)
    assert 0.5 * predicted < e2 / e4 < 2 * predicted, (e4, e2, predicted)

    # exact: the original with its experts replaced by their own dequantisation
    replace_experts(original, q4, TORCH_DTYPES[r4.dtype])
    assert torch.equal(logits(original), l4)
    replace_experts(original, q2, "float32")
    assert torch.equal(logits(original), l2)


@pytest.mark.parametrize("family", FAMILIES)
def test_rebuilt_config(family: str, sculpted: Callable[[str, int], Path], work: Path) -> None:
    """No config.json beside the vault and no --config: rebuilt from the arch block and the
    scout, naming what it assumed (for DeepSeek only when asked: rebuild_config); the same
    model wherever the assumptions hold."""
    q4 = sculpted(family, 4)
    out = work / f"{family}-rebuilt"
    model_type = json.loads((CKPTS / family / "config.json").read_text())["model_type"]
    family_entry = family_of(model_type)
    assert family_entry is not None and family_entry.rebuild == (family not in INEXACT)
    result = export_hf(q4, out, rebuild_config=family in INEXACT)
    assert result.config == "rebuilt" and result.config_path is None
    note = next(n for n in result.notes if n.startswith("config.json rebuilt"))
    assert "assumed: rope_type 'default' (no rope scaling)" in note
    assert note.endswith("assumed: " + ", ".join(result.assumed))
    staged = companions(q4)[1].name
    why = "--rebuild-config" if family in INEXACT else f"no {staged} beside the vault, no --config"
    assert f"scout's shapes ({why}); assumed: " in note
    model, problems = load(out)
    assert problems == []
    copied = work / f"{family}-hf4"
    if not copied.exists():
        export_hf(q4, copied, config=CKPTS / family / "config.json")
    reference, _ = load(copied)
    assert params(model) == params(reference)
    if family in ASSUMES_ROUTING:
        assert "routed_scaling_factor 1.0, n_group 1, topk_group 1" in note
    else:
        assert torch.equal(logits(model), logits(reference))


@pytest.mark.parametrize("family", sorted(INEXACT))
def test_an_inexact_rebuild_is_refused_unless_asked(
    family: str, sculpted: Callable[[str, int], Path], work: Path
) -> None:
    """DeepSeek's routing knobs are not in a vault: without a config copy and without
    rebuild_config, refused naming them; nothing written."""
    q4 = sculpted(family, 4)
    out = work / f"{family}-refused"
    with pytest.raises(SmoeError) as info:
        export_hf(q4, out)
    keys = {
        "deepseek_v2": "topk_method, rope_scaling, routed_scaling_factor, n_group, topk_group",
        "deepseek_v3": "rope_scaling, rope_interleave, routed_scaling_factor, n_group, topk_group",
    }[family]
    assert str(info.value) == (
        f"{q4}: no config.json beside it, and a {family} config cannot be rebuilt exactly: "
        f"the vault does not record {keys}, which a rebuild would have to assume; pass "
        "--config MODEL/config.json, or --rebuild-config to rebuild it anyway"
    )
    assert not out.exists() and leftovers(work) == []


def test_shards_and_index(sculpted: Callable[[str, int], Path], work: Path) -> None:
    q4 = sculpted("qwen3_moe_fused", 4)
    out = work / "sharded"
    result = export_hf(
        q4, out, config=CKPTS / "qwen3_moe_fused" / "config.json", max_shard_size=150_000
    )
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    n = len(shards)
    assert n > 1 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert result.files == [
        *shards,
        "model.safetensors.index.json",
        "config.json",
        "smoe-export.json",  # the marker, last
    ]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    tensors = exported_tensors(out)
    assert index["weight_map"] == {n: t.path.name for n, t in sorted(tensors.items())}
    assert index["metadata"] == {
        "total_size": sum(t.nbytes for t in tensors.values()),
        "total_parameters": sum(int(np.prod(t.shape)) for t in tensors.values()),
    }
    assert all(p.stat().st_size < 150_000 + 4096 for p in out.glob("*.safetensors"))
    assert tensors["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 96, 64)  # fused
    model, problems = load(out)
    assert problems == []
    export_hf(q4, work / "unsharded", config=CKPTS / "qwen3_moe_fused" / "config.json")
    assert torch.equal(logits(model), logits(load(work / "unsharded")[0]))


def test_without_a_manifest_the_family_names(
    sculpted: Callable[[str, int], Path], work: Path
) -> None:
    """No manifest: Mixtral's w1/w3/w2, per-expert names for a fused source; both load."""
    for family, name in (
        ("mixtral", "model.layers.1.block_sparse_moe.experts.3.w3.weight"),
        ("qwen3_moe_fused", "model.layers.1.mlp.experts.7.up_proj.weight"),
    ):
        folder = work / f"{family}-nomanifest"
        folder.mkdir()
        q4 = sculpted(family, 4)
        for p in (q4, q4.with_name(f"{family}.scout.safetensors")):
            shutil.copyfile(p, folder / p.name)
        result = export_hf(folder / q4.name, folder / "hf", config=CKPTS / family / "config.json")
        assert result.notes[0].startswith(
            "no manifest beside the vault: experts named as the family's checkpoints name them"
        )
        assert name in exported_tensors(folder / "hf")
        model, problems = load(folder / "hf")
        assert problems == []
        replace_experts(model, q4, "bfloat16")  # already these values: nothing changes
        assert torch.equal(logits(model), logits(load(folder / "hf")[0]))


def test_cli_defaults(sculpted: Callable[[str, int], Path], work: Path) -> None:
    """``smoe export OUT/M.smoe HF --hf`` finds the scout and the staged config itself."""
    q2 = sculpted("mixtral", 2)
    out = work / "cli-hf"
    proc = run("export", q2, out, "--hf", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["files"] == ["model.safetensors", "config.json", "smoe-export.json"]
    assert summary["dtype"] == "BF16" and summary["notes"] == []
    assert (out / "config.json").read_bytes() == (CKPTS / "mixtral" / "config.json").read_bytes()
    proc = run("export", q2, work / "x", "--dtype", "f32")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --dtype needs --hf (see smoe export --help)"
    # --rebuild-config: rebuilt although the staged copy is there, its assumptions listed
    proc = run("export", q2, work / "cli-rebuilt", "--hf", "--rebuild-config", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["config"], summary["config_path"]) == ("rebuilt", None)
    assert summary["assumed"] == [
        "rope_type 'default' (no rope scaling)",
        "max_position_embeddings 4096",
        "no bos/eos/pad token ids (the tokenizer's config has them)",
        "sliding_window null",
    ]
    assert summary["notes"] == [
        f"config.json rebuilt from {q2.name}'s arch block and the scout's shapes "
        f"(--rebuild-config); assumed: {', '.join(summary['assumed'])}"
    ]
    proc = run("export", q2, work / "y", "--hf", "--rebuild-config", "--config", q2)
    assert proc.returncode == 2 and not (work / "y").exists()
    assert proc.stderr.strip() == (
        "error: --rebuild-config and --config: choose one (the config.json to copy, or one "
        "rebuilt from the vault)"
    )


# ---- refusals: one line, nothing written ----------------------------------------------------
def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_partial_vault_refused(tmp_path: Path) -> None:
    for opts, expected in (
        (
            SculptOptions(jobs=1, max_layers=1),
            "a partial vault (sculpted with --max-layers 1): it holds 1 of the model's 2 MoE "
            "layers (layers 0; 1 missing)",
        ),
        (
            SculptOptions(jobs=1, max_experts=2),
            "a partial vault (sculpted with --max-experts 2): layer 0 lacks experts 2..3 of 0..3; "
            "layer 1 lacks experts 2..3 of 0..3",
        ),
    ):
        out = tmp_path / f"p{opts.max_layers}{opts.max_experts}"
        vault = sculpt(CKPTS / "olmoe", out, opts).vault
        with pytest.raises(SmoeError) as info:
            export_hf(vault, out / "hf")
        assert str(info.value) == (
            f"{vault}: {expected}; a checkpoint needs every expert: "
            "sculpt the model again without --max-layers/--max-experts"
        )
        assert not (out / "hf").exists() and leftovers(out) == []


def test_outputs_that_are_or_hold_inputs_are_refused(
    sculpted: Callable[[str, int], Path], tmp_path: Path
) -> None:
    q4 = sculpted("olmoe", 4)
    folder = q4.parent
    before = sorted(p.name for p in folder.iterdir())
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep").write_text("x")
    for out, message in (
        (folder, f"{folder}: the output folder holds the input {q4}; refusing to replace an input"),
        (q4, f"{q4}: the output is the input {q4} itself; refusing to overwrite an input"),
        (
            busy,
            f"{busy}: exists and is not empty; --force replaces it (a folder an earlier export "
            "wrote), or name a new folder (the folder is written whole, never merged)",
        ),
        (busy / "keep", f"{busy / 'keep'}: exists and is not a folder"),
    ):
        with pytest.raises(SmoeError) as info:
            export_hf(q4, out)
        assert str(info.value) == message
    assert sorted(p.name for p in folder.iterdir()) == before
    assert (busy / "keep").read_text() == "x" and leftovers(tmp_path) == []


def test_a_damaged_blob_is_refused(sculpted: Callable[[str, int], Path], tmp_path: Path) -> None:
    q4 = sculpted("qwen2_moe", 4)
    for p in (q4, manifest.path_for(q4), q4.with_name("qwen2_moe.scout.safetensors")):
        shutil.copyfile(p, tmp_path / p.name)
    vault = tmp_path / q4.name
    with Vault.open(vault) as v:
        offset = int(v.table[5]["byte_offset"]) + 100
        key = v.keys()[5]
    data = bytearray(vault.read_bytes())
    data[offset] ^= 0x10
    vault.write_bytes(bytes(data))
    with pytest.raises(SmoeError) as info:
        export_hf(vault, tmp_path / "hf", config=CKPTS / "qwen2_moe" / "config.json")
    assert str(info.value) == (
        f"{vault}: layer {key[0]} expert {key[1]}: the blob at offset {offset - 100} differs "
        f"from its CRC-32C in {manifest.path_for(vault)} (changed or damaged); refused"
    )
    assert not (tmp_path / "hf").exists() and leftovers(tmp_path) == []


def test_a_failed_write_leaves_nothing(
    sculpted: Callable[[str, int], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q4 = sculpted("deepseek_v2", 4)
    calls = []
    real = hf_output.write_expert  # as the folder writer calls it

    def failing(fd, path, out, dtype, offset, decoder) -> None:  # type: ignore[no-untyped-def]
        calls.append(out.name)
        if len(calls) == 7:
            raise SmoeError(f"{path}: cannot write: No space left on device")
        real(fd, path, out, dtype, offset, decoder)

    monkeypatch.setattr(hf_output, "write_expert", failing)
    out = tmp_path / "hf"
    with pytest.raises(SmoeError, match="No space left on device"):
        export_hf(q4, out, config=CKPTS / "deepseek_v2" / "config.json")
    assert len(calls) == 7 and not out.exists() and leftovers(tmp_path) == []


def test_source_dtypes_from_the_manifest(
    sculpted: Callable[[str, int], Path], tmp_path: Path
) -> None:
    """A manifest that records each source tensor's dtype (``experts[].tensors[].dtype``)
    gets each expert tensor back in it: here gate, up and down differ within an expert."""
    family = "olmoe_mixed_dtype"
    q4 = sculpted(family, 4)
    src = source_tensors(family)
    for p in (q4, q4.with_name(f"{family}.scout.safetensors")):
        shutil.copyfile(p, tmp_path / p.name)
    doc = json.loads(manifest.path_for(q4).read_text())
    for row in doc["experts"]:
        for t in row["tensors"]:
            t["dtype"] = src[t["source"]].dtype
    manifest.path_for(tmp_path / q4.name).write_bytes(manifest.encode(doc))
    result = export_hf(tmp_path / q4.name, tmp_path / "hf", config=CKPTS / family / "config.json")
    assert result.dtype == "mixed"
    got = exported_tensors(tmp_path / "hf")
    assert {n: t.dtype for n, t in got.items()} == {n: t.dtype for n, t in src.items()}
    assert (
        len(
            {
                got[f"model.layers.0.mlp.experts.1.{r}.weight"].dtype
                for r in ("gate_proj", "up_proj", "down_proj")
            }
        )
        == 3
    )
    model, problems = load(tmp_path / "hf")
    assert problems == []
    assert rel(logits(model), logits(load(CKPTS / family)[0])) < 10 ** (-snr_median(q4) / 20)
