"""Every MoE family of the installed transformers, as transformers itself writes it (issue 22).

For each model type in the family registry that the installed transformers has, a tiny
checkpoint is built from its shrunk default config and saved with ``save_pretrained``
(``smoe_testkit.tiny``; no tensor name is written by hand). A refused family is refused
with its reason, word for word; a converted one sculpts, passes ``verify --deep``, and its
arch block says what the config and the model mean: head counts from the config, the
norm_topk flag against what the family's own router module outputs (its top-k weights sum
to one constant for every token, or not), the dense-layer flag and shared-expert width
against the model's modules. The round trip through ``export --hf``
and transformers loads with no missing or unexpected weight, keeps every
non-expert tensor bit for bit, and gives expert weights and logits within Q4's error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from smoe.errors import SmoeError
from smoe.families.registry import FAMILIES
from smoe.format.records import model_type_str
from smoe.format.verify import verify_path
from smoe.sculpt import SculptOptions, sculpt
from smoe.vault.reader import Vault

torch = pytest.importorskip("torch", reason="the hf extra (torch, transformers) is not installed")
transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # noqa: E402

from smoe_testkit import probes, tiny  # noqa: E402


def _buildable(mt: str) -> bool:
    try:
        tiny.model_class(mt)
    except LookupError:  # a text sub-config only (step3p5): no checkpoint has it outermost
        return False
    return True


INSTALLED = sorted(
    mt
    for mt, f in FAMILIES.items()
    if f.model_type == mt and mt in CONFIG_MAPPING_NAMES and _buildable(mt)
)
CONVERTED = [mt for mt in INSTALLED if FAMILIES[mt].converted]
REFUSED = [mt for mt in INSTALLED if not FAMILIES[mt].converted]
IDS = [[(i * 37 + 3 + 11 * row) % 100 + 3 for i in range(12)] for row in range(2)]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """model_type -> the folder of its tiny checkpoint (written once per module)."""
    root = tmp_path_factory.mktemp("families")
    done: dict[str, Path] = {}

    def get(mt: str) -> Path:
        if mt not in done:
            MODELS[mt] = tiny.write(mt, root / mt)
            done[mt] = root / mt
        return done[mt]

    return get


MODELS: dict[str, Any] = {}
"""model_type -> the model ``written`` saved (float32), as transformers holds it in memory."""


# a router whose output is not (…, top-k weights, indices) (llama4: sigmoid scores scattered
# over every expert): the registry's reading of its modeling code stands for the flag
ROUTER_NOT_A_MODULE = {"llama4"}
# Phi-MoE's sparsemixer weighs each pick by a masked softmax (often exactly 1 each): its sums
# can look constant without any renormalisation, so the probe cannot tell; the flag is 0
SPARSEMIXER = {"phimoe"}


def _router_renormalises(model: Any) -> bool | None:
    """Run the first text router module on random hidden states: its top-k weights sum to
    one constant for every token (renormalised, perhaps times a routed scaling factor) or
    not; None when no module takes hidden states and gives (…, weights, indices)."""
    hidden = model.config.get_text_config().hidden_size
    x = torch.randn(16, hidden, generator=torch.Generator().manual_seed(0)) * 3
    for name, module in model.named_modules():
        if "vision" in name or "visual" in name:
            continue
        if not re.search(r"Router|Gate$|TopK", type(module).__name__):
            continue
        out = None
        for hidden_states in (x, x[None]):  # [tokens, hidden], or [batch, tokens, hidden]
            try:
                with torch.no_grad():
                    out = module(hidden_states, *_bias_argument(model, module))
                break
            except Exception:  # not a router of hidden states (or another signature)
                continue
        if not isinstance(out, tuple):
            continue
        tensors = [o for o in out if torch.is_tensor(o) and o.dim() == 2 and o.shape[0] == 16]
        ints = [o for o in tensors if not o.is_floating_point()]
        floats = [o for o in tensors if o.is_floating_point()]
        if not ints or not floats:
            continue
        k = ints[0].shape[1]
        picked = [o for o in floats if o.shape[1] == k] or [torch.gather(floats[-1], 1, ints[0])]
        sums = picked[-1].double().sum(1)
        return bool(sums.std() / sums.mean().abs() < 1e-4)
    return None


def _bias_argument(model: Any, router: Any) -> list[Any]:
    """A router whose forward takes its selection bias from the MoE block (afmoe, hy_v3,
    lfm2_moe, minimax_m2: ``expert_bias``, ``e_score_correction_bias``) gets a zero bias."""
    import inspect

    params = list(inspect.signature(router.forward).parameters)
    if len(params) < 2 or "bias" not in params[1]:
        return []
    c = model.config.get_text_config()
    experts = next(
        getattr(c, k)
        for k in ("num_experts", "num_local_experts", "n_routed_experts")
        if getattr(c, k, None)
    )
    return [torch.zeros(experts)]


def _layer_0_is_dense(model: Any) -> bool:
    """Whether the language model's layer 0 has a dense MLP and no routed experts (from the
    model's modules)."""
    names = [
        n
        for n, _ in model.named_parameters()
        if re.search(r"(^|\.)(layers|blocks)\.0\.", n) and "vision" not in n and "visual" not in n
    ]
    return not any("experts" in n for n in names) and any(
        re.search(r"\.(mlp|feed_forward|ffn)\.(gate_proj|w1|gate_up_proj)", n) for n in names
    )


def _has_shared_expert(model: Any) -> bool:
    """Whether the model's modules (not the checkpoint's names) hold a shared expert."""
    return any(
        "shared" in name
        and ("gate" in name or "w1" in name or "input_linear" in name)
        and "experts.gate_up_proj" not in name
        and name.endswith("weight")
        for name, _ in model.named_parameters()
        if "vision" not in name and "visual" not in name
    )


_EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOWER = re.compile(r"Vision|Audio|Speech|CodePredictor")
"""A config class of a model's vision, audio or speech tower (its experts, if any, stay in
the scout with the rest of the tower), not a language model's."""


def _modeling_sources(mt: str) -> list[str]:
    """The source text of the modules defining the classes transformers maps ``mt`` to (a
    model type may run another's classes: param2moe runs GLM-4-MoE's), else of its package's
    modeling module (a sub-config such as inkling_text has no class of its own); read from
    the files, not imported (transformers' lazy table names each class's module)."""
    import importlib.util

    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    where = transformers._class_to_module
    modules = set()
    for table in tiny.MODEL_CLASSES:
        name = getattr(modeling_auto, table, {}).get(mt)
        for n in name if isinstance(name, (list, tuple)) else [name] if name else []:
            if n in where:
                modules.add(f"transformers.{where[n]}")
    if not modules:
        pkg = model_type_to_module_name(mt)
        modules.add(f"transformers.models.{pkg}.modeling_{pkg}")
    sources = []
    for module in sorted(modules):
        try:
            spec = importlib.util.find_spec(module)
        except ImportError:
            continue
        if spec is not None and spec.origin:
            sources.append(Path(spec.origin).read_text(encoding="utf-8"))
    return sources


def _routes_experts(mt: str) -> bool:
    """Whether ``mt`` is a language model with routed experts: its modeling code defines an
    experts or sparse-MoE class, and its (text) config declares an expert count."""
    if not any(
        re.search(r"class \w*(Experts|SparseMoe)\w*\(", src) for src in _modeling_sources(mt)
    ):
        return False
    config = transformers.AutoConfig.for_model(mt).get_text_config()
    if _TOWER.search(type(config).__name__):
        return False
    d = config.to_dict()
    nested = d.get("ffn_config") if isinstance(d.get("ffn_config"), dict) else {}  # dbrx
    return any(k in d or k in nested for k in _EXPERT_COUNTS)


def test_the_registry_covers_every_moe_family_installed() -> None:
    """Every model type of the installed transformers whose modeling code has routed experts
    is in the registry (converted, refused with a reason, or an alias): a new release's
    families cannot slip by unnoticed."""
    missing = [
        mt for mt in sorted(CONFIG_MAPPING_NAMES) if mt not in FAMILIES and _routes_experts(mt)
    ]
    assert missing == [], f"register these model types (smoe/families/registry.py): {missing}"
    for mt in ("ergo", "param2moe", "inkling_text", "qwen3_omni_moe_thinker"):  # the rule sees them
        if mt in CONFIG_MAPPING_NAMES:
            assert _routes_experts(mt), mt


@pytest.mark.parametrize("mt", REFUSED)
def test_refused_with_its_reason(mt: str, written: Any, tmp_path: Path) -> None:
    folder = written(mt)
    with pytest.raises(SmoeError) as info:
        sculpt(folder, tmp_path, SculptOptions(jobs=1))
    assert str(info.value) == f"{folder}: model_type {mt!r} refused: {FAMILIES[mt].refused}"
    assert list(tmp_path.iterdir()) == []


def _config(folder: Path) -> Any:
    return transformers.AutoConfig.from_pretrained(folder).get_text_config()


def _expected_heads(c: Any) -> tuple[int, int, int]:
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    nope, rope = getattr(c, "qk_nope_head_dim", None), getattr(c, "qk_rope_head_dim", None)
    if nope is not None and rope is not None:
        return heads, kv, nope + rope
    return heads, kv, getattr(c, "head_dim", None) or c.hidden_size // heads


@pytest.mark.parametrize("mt", CONVERTED)
def test_converted(mt: str, written: Any, tmp_path: Path) -> None:
    folder = written(mt)
    result = sculpt(folder, tmp_path / "out", SculptOptions(bits=4, jobs=1))
    report = verify_path(result.vault, deep=True)
    assert report.ok, [f.line() for f in report.errors]
    c = _config(folder)
    with Vault.open(result.vault) as vault:
        a = vault.arch
        assert a is not None
        assert (
            model_type_str(a["model_type"])
            == json.loads((folder / "config.json").read_text())["model_type"]
        )
        heads, kv, head_dim = _expected_heads(c)
        assert (int(a["num_heads"]), int(a["num_kv_heads"]), int(a["head_dim"])) == (
            heads,
            kv,
            head_dim,
        )
        flags = int(a["flags"])
        renorm = _router_renormalises(MODELS[mt])
        assert (renorm is None) == (mt in ROUTER_NOT_A_MODULE)
        if renorm is not None and mt not in SPARSEMIXER:
            assert bool(flags & 1) == renorm, "norm_topk_prob flag vs the router's own output"
        if mt in SPARSEMIXER:
            assert not flags & 1
        assert bool(flags & 4) == _layer_0_is_dense(MODELS[mt]), flags
        shared = int(a["shared_expert_ffn_dim"])
        assert (shared > 0) == _has_shared_expert(MODELS[mt]), shared
        assert shared == probes.shared_expert_width(MODELS[mt])
        _attention_as_the_model_runs_it(mt, a)
        _expert_as_the_model_computes_it(mt, folder)
        assert int(vault.header["d_model"]) == c.hidden_size
        assert int(vault.header["vocab_size"]) == c.vocab_size
    warned = [w for w in result.warnings if "not in smoe's family registry" in w]
    assert warned == []


def _attention_as_the_model_runs_it(mt: str, a: Any) -> None:
    """The block's attention fields against one forward pass of the model: the heads its
    attention function is given, a q/k norm module run inside an attention module (by
    module, whatever its name), a rotary embedding in use."""
    model = MODELS[mt]
    seen = probes.attention(model, lambda: _logits(model, mt))
    assert seen.heads == {int(a["num_heads"])}, seen
    assert seen.kv_heads == {int(a["num_kv_heads"])}, seen
    assert seen.head_dim == {int(a["head_dim"])}, seen
    assert bool(int(a["flags"]) & 2) == bool(seen.qk_norms), seen.qk_norms
    assert (float(a["rope_theta"]) > 0) == seen.rotary, float(a["rope_theta"])


# experts whose module takes pre-routed tokens ([experts x tokens, hidden], llama4): the
# round trip's logits stand for them
EXPERTS_NOT_A_MODULE = {"llama4"}


def _float32(array: Any, src: str | None) -> Any:
    import numpy as np

    if src == "bf16":
        return torch.from_numpy((array.astype(np.uint32) << 16).view(np.float32))
    return torch.from_numpy(array.astype(np.float32))


def _expert_as_the_model_computes_it(mt: str, folder: Path) -> None:
    """The model's own expert module on random inputs equals down(silu(gate x) * up x)
    with the matrices the sculptor reads (what the vault holds, before quantisation): a
    clamp, softcap, bias, scale or interleaving no key announces fails here."""
    from smoe.sculpt.source.checkpoint import Checkpoint

    (layer, e), ref = next(iter(Checkpoint.open(folder).experts.items()))
    gate, up, down = (_float32(a, src) for a, src in ref.load())
    x = torch.randn(6, gate.shape[1], generator=torch.Generator().manual_seed(5))
    x *= 50 / float((x @ gate.T).abs().max())  # gate x up to 50: past any clamp or softcap
    got = probes.expert_output(MODELS[mt], layer, e, x)
    assert (got is None) == (mt in EXPERTS_NOT_A_MODULE)
    if got is not None:
        want = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
        assert _rel(got, want) < 1e-5


def _load(folder: Path, mt: str) -> tuple[Any, dict[str, list[str]]]:
    with tiny._quiet():
        model, info = tiny.model_class(mt).from_pretrained(
            folder, dtype=torch.float32, output_loading_info=True
        )
    return model.eval(), {k: sorted(v) for k, v in info.items() if v}


# the text model to run where the wrapper's own forward cannot take text alone: Llama 4's
# fails in transformers 5.24 itself (image_outputs), Qwen3-Omni's only generates
TEXT_MODEL = {"llama4": "language_model", "qwen3_omni_moe": "thinker"}


def _logits(model: Any, mt: str) -> Any:
    runner = getattr(model, TEXT_MODEL[mt]) if mt in TEXT_MODEL else model
    with torch.no_grad():
        return runner(input_ids=torch.tensor(IDS)).logits


def _rel(a: Any, b: Any) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


ROUND_TRIP_DEFAULT = {
    "qwen3_moe",  # per expert
    "qwen3_vl_moe",  # fused [E, 2I, H] in a multimodal wrapper
    "aria",  # fused [E, H, 2I], written back transposed
    "granitemoeshared",  # input_linear/output_linear, a fused shared expert
    "deepseek_v3",  # MLA, a dense layer 0, shared experts
    "qwen3_5_moe",  # gated q, linear attention layers
    "llama4",  # a language model inside a wrapper, run alone
    "minicpm5_moe",  # new in transformers 5.25
    "step3p7",  # stacked per role, gate_proj/up_proj [E, I, H], down_proj [E, H, I]
}
"""Round-tripped in every ``make test`` (one of each layout and kind); the other families are
marked slow (``make test-all``), their arch fields and expert math checked above."""


@pytest.mark.parametrize(
    "mt",
    [
        mt if mt in ROUND_TRIP_DEFAULT else pytest.param(mt, marks=pytest.mark.slow)
        for mt in CONVERTED
    ],
)
def test_round_trip_through_transformers(mt: str, written: Any, tmp_path: Path) -> None:
    from smoe.export.hf.checkpoint import export_hf

    folder = written(mt)
    result = sculpt(folder, tmp_path / "out", SculptOptions(bits=4, jobs=1))
    export_hf(result.vault, tmp_path / "hf")
    original, _ = _load(folder, mt)
    back, problems = _load(tmp_path / "hf", mt)
    assert problems == {}
    before, after = dict(original.named_parameters()), dict(back.named_parameters())
    assert sorted(before) == sorted(after)
    for name, p in before.items():
        if "experts" in name and p.dim() >= 2:
            assert _rel(after[name], p) < 0.2, name
        else:
            assert torch.equal(after[name], p), name
    assert _rel(_logits(back, mt), _logits(original, mt)) < 0.3


_NO_WEIGHT = "--calibrate: the checkpoint has no weight for "
# --calibrate runs transformers' own modeling code layer by layer; these families cannot be
# run so, each for its reason (the refusal's words after the checkpoint's path)
CALIBRATE_REFUSED = {
    "bailing_hybrid": _NO_WEIGHT + "model.layers.0.self_attn.conv1d",
    "kimi_linear": _NO_WEIGHT + "model.layers.0.self_attn.conv1d",
    "lara_mini": _NO_WEIGHT + "model.layers.0.linear_attn.",
    "llama4": _NO_WEIGHT + "model.embed_tokens.weight",
    "zaya": "--calibrate: the model's embedding pass failed: ",
}


CALIBRATE_DEFAULT = {"qwen3_moe", "mixtral", "deepseek_v3", "qwen2_moe", "qwen3_vl_moe", "llama4"}
"""Calibrated in every ``make test``; the other families are marked slow (``make test-all``)."""


@pytest.mark.parametrize(
    "mt",
    [
        mt if mt in CALIBRATE_DEFAULT else pytest.param(mt, marks=pytest.mark.slow)
        for mt in CONVERTED
    ],
)
def test_calibrated(mt: str, written: Any, tmp_path: Path) -> None:
    """Every converted family sculpts with --calibrate (its own forward pass, one layer at
    a time) to a vault that verifies, its routed experts calibrated; or is refused in one
    line naming what it lacks, with nothing written."""
    import numpy as np

    np.save(tmp_path / "c.npy", np.array(IDS, np.int64))
    opts = SculptOptions(bits=4, jobs=1, calibrate=tmp_path / "c.npy")
    if mt in CALIBRATE_REFUSED:
        with pytest.raises(SmoeError) as err:
            sculpt(written(mt), tmp_path / "o", opts)
        assert str(err.value).startswith(f"{written(mt)}: {CALIBRATE_REFUSED[mt]}")
        assert len(str(err.value).splitlines()) == 1
        assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
        return
    res = sculpt(written(mt), tmp_path / "o", opts)
    assert verify_path(res.vault, deep=True).ok
    assert res.calibration["experts_calibrated"] > 0
