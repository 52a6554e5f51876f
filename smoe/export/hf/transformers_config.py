"""The ``config.json`` of an exported checkpoint: a copy of the model's own, or rebuilt.

A copy (``--config``, or ``<stem>.config.json`` staged beside the vault) keeps its bytes,
except that an explicit ``--dtype`` sets its ``dtype`` (``torch_dtype``) so that
``from_pretrained`` loads the model at the precision asked for, and that a vault whose
experts were dequantised from FP8 drops its ``quantization_config`` (:func:`dequantised`).
Without one, the config is rebuilt from the vault's arch block and header and the scout's
shapes, for the families of the registry (:mod:`smoe.families.registry`) that name their
transformers class (``Family.architecture``) and have a recipe here (:data:`RECIPES`);
every value that neither records (rope scaling, group-limited routing, the routed scaling
factor, ...) is an assumption, and :func:`rebuild` names each. A family whose config
cannot be rebuilt exactly (``Family.rebuild`` false: what matters beyond the arch block is
not in the vault) is refused unless the caller accepts the assumptions (``inexact``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from smoe.errors import RefusedInput
from smoe.families.config import read_json
from smoe.families.registry import Family, family_of
from smoe.format.records import model_type_str
from smoe.interop.fp8 import declared_block
from smoe.interop.safetensors_io import TensorInfo
from smoe.plumbing import fileio
from smoe.vault.reader import Vault
from smoe_gen import layout

__all__ = [
    "DTYPES",
    "RECIPES",
    "check_quantization",
    "copied",
    "dequantised",
    "json_bytes",
    "rebuild",
    "rebuildable",
    "unrecorded",
]

DTYPES = {"bf16": "BF16", "f16": "F16", "f32": "F32"}
"""``--dtype`` -> safetensors dtype."""
TORCH_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
RECIPES = ("deepseek_v2", "deepseek_v3", "mixtral", "olmoe", "qwen2_moe", "qwen3_moe")
"""The families whose own fields a rebuild knows (:func:`_family_fields`); the class it
writes comes from the registry (``Family.architecture``)."""
EXPERT_COUNT_KEY = {
    "mixtral": "num_local_experts",
    "deepseek_v2": "n_routed_experts",
    "deepseek_v3": "n_routed_experts",
}  # others: num_experts
DENSE_MLP = re.compile(r"^model\.layers\.(\d+)\.mlp\.gate_proj\.weight$")
MAX_POSITIONS = 4096


def json_bytes(doc: object) -> bytes:
    """``doc`` as the JSON files of a checkpoint folder are written (``save_pretrained``'s
    style): indented by 2, keys sorted, a final newline; ASCII (other characters escaped).

    >>> json_bytes({"b": [1], "a": None})
    b'{\\n  "a": null,\\n  "b": [\\n    1\\n  ]\\n}\\n'
    """
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _config_dtype(cfg: dict[str, Any]) -> str | None:
    """The safetensors dtype a config names (``dtype`` or ``torch_dtype``), if any."""
    for key in ("dtype", "torch_dtype"):
        name = cfg.get(key)
        for st, torch_name in TORCH_NAMES.items():
            if name == torch_name:
                return st
    return None


def copied(path: Path, dtype: str | None, *, unquantised: bool = False) -> tuple[bytes, list[str]]:
    """The bytes of ``path`` (checked: UTF-8 JSON, an object, no key twice), with ``dtype``
    (a safetensors dtype) set when given and different, and with ``unquantised`` its
    ``quantization_config`` removed (the checkpoint written holds no quantised tensor:
    :func:`dequantised`); and the notes to print.

    >>> import json
    >>> from pathlib import Path
    >>> path = Path("fixtures/checkpoints/qwen3_moe/config.json")
    >>> data, notes = copied(path, "F32")
    >>> json.loads(data)["dtype"]
    'float32'
    >>> print(*notes)
    config.json: dtype set to 'float32' (was "bfloat16") to match --dtype
    >>> copied(path, "BF16") == (path.read_bytes(), [])  # already bfloat16: the bytes as they are
    True
    >>> copied(path, None, unquantised=True) == (path.read_bytes(), [])  # nothing to remove
    True
    """
    cfg = read_json(path)
    if not isinstance(cfg, dict):
        raise RefusedInput(f"{path}: not a JSON object")
    notes = dequantised(cfg) if unquantised else []
    if dtype is not None and _config_dtype(cfg) != dtype:
        keys = [k for k in ("dtype", "torch_dtype") if k in cfg] or ["dtype"]
        was = json.dumps(cfg[keys[0]]) if keys[0] in cfg else "absent"
        for key in keys:
            cfg[key] = TORCH_NAMES[dtype]
        notes.append(
            f"config.json: {keys[0]} set to {TORCH_NAMES[dtype]!r} (was {was}) to match --dtype"
        )
    if not notes:
        with fileio.reading():
            return path.read_bytes(), []
    return json_bytes(cfg), notes


def dequantised(cfg: dict[str, Any]) -> list[str]:
    """Remove ``cfg``'s ``quantization_config`` (in place) for a checkpoint whose FP8
    experts were dequantised when sculpted and whose scout holds no FP8 tensor: nothing
    written is quantised, and transformers would otherwise load it as an FP8 model. The
    note to print (none when there was nothing to remove).

    >>> cfg = {"model_type": "deepseek_v3", "quantization_config": {"quant_method": "fp8"}}
    >>> print(*dequantised(cfg))  # doctest: +NORMALIZE_WHITESPACE
    config.json: quantization_config (quant_method 'fp8') removed: the vault's experts were \
dequantised from FP8 when sculpted and the scout holds no FP8 tensor, so nothing written is \
quantised
    >>> cfg, dequantised(cfg)
    ({'model_type': 'deepseek_v3'}, [])
    """
    if "quantization_config" not in cfg:
        return []
    quant = cfg.pop("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    how = f" (quant_method {method!r})" if isinstance(method, str) else ""
    return [
        f"config.json: quantization_config{how} removed: the vault's experts were "
        "dequantised from FP8 when sculpted and the scout holds no FP8 tensor, so nothing "
        "written is quantised"
    ]


def check_quantization(
    path: Path, doc: dict[str, Any] | None, manifest_path: Path, scout_fp8: bool
) -> None:
    """Refuse a copied config ``path`` whose ``quantization_config`` the vault's manifest
    ``doc`` (read from ``manifest_path``) contradicts: a quantisation that nothing written
    uses (no ``experts[].tensors[].fp8`` record and, ``scout_fp8`` False, no FP8 tensor in
    the scout: the export would write unquantised weights under a quantised config), or an
    ``fp8`` record whose ``block`` differs from the block size the config declares
    (:func:`smoe.interop.fp8.declared_block`). Each refusal names the manifest field.

    >>> import tempfile
    >>> cfg = Path(tempfile.mkdtemp()) / "config.json"
    >>> _ = cfg.write_text('{"quantization_config": {"quant_method": "fp8"}}')
    >>> check_quantization(cfg, {"experts": [{"tensors": [{"source": "w"}]}]},
    ...                    Path("v.smoe.manifest.json"), False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    smoe.errors.RefusedInput: ...config.json: quantization_config declares quant_method 'fp8', \
but v.smoe.manifest.json records no FP8 source (experts[].tensors[].fp8) and the scout holds \
no FP8 tensor: ...
    """
    cfg = read_json(path)
    qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if qc is None or not isinstance(cfg, dict):
        return
    records = [
        (i, j, t["fp8"])
        for i, row in enumerate((doc or {}).get("experts") or [])
        for j, t in enumerate(row.get("tensors") or [])
        if isinstance(t, dict) and t.get("fp8") is not None
    ]
    if not records and not scout_fp8:
        method = qc.get("quant_method") if isinstance(qc, dict) else None
        what = f"quant_method {method!r}" if isinstance(method, str) else "a quantisation"
        raise RefusedInput(
            f"{path}: quantization_config declares {what}, but {manifest_path.name} records "
            "no FP8 source (experts[].tensors[].fp8) and the scout holds no FP8 tensor: the "
            "export would write unquantised weights under a quantised config; refused"
        )
    declared = declared_block(cfg, str(path))
    for i, j, record in records:
        block = record.get("block") if isinstance(record, dict) else None
        if declared is None or not isinstance(record, dict) or record.get("kind") != "fp8-block":
            continue
        if block != list(declared):
            raise RefusedInput(
                f"{manifest_path}: experts[{i}].tensors[{j}].fp8.block is {block}, but "
                f"{path} declares {list(declared)} ({declared.key}): the manifest "
                "contradicts the config"
            )


def _f32(value: float) -> float:
    """A float32 field of the arch block as the decimal it was written from (7 digits)."""
    return float(f"{float(np.float32(value)):.7g}")


def _rows(scout: dict[str, TensorInfo], name: str) -> int | None:
    info = scout.get(name)
    return int(info.shape[0]) if info is not None else None


def rebuildable() -> list[str]:
    """The model types a config can be rebuilt for: a registry entry naming its
    transformers class, and a recipe here.

    >>> rebuildable()
    ['deepseek_v2', 'deepseek_v3', 'mixtral', 'olmoe', 'qwen2_moe', 'qwen3_moe']
    """
    out = []
    for model_type in RECIPES:
        family = family_of(model_type)
        if family is not None and family.architecture and family.model_type == model_type:
            out.append(model_type)
    return sorted(out)


def rebuild(
    vault: Vault, scout: dict[str, TensorInfo], dtype: str, *, inexact: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """A config.json for ``vault`` + ``scout`` (arch block, header, tensor shapes) and the
    fields it had to assume. Refused: a v1 vault (no arch block), a family without a
    recipe, and unless ``inexact`` a family whose config the vault cannot give exactly
    (``Family.rebuild`` false), naming the keys that would be assumed.

    >>> from smoe.interop.safetensors_io import read_header
    >>> scout = read_header("fixtures/checkpoints/qwen3_moe/model.safetensors")
    >>> with Vault.open("fixtures/qwen3_v2.smoe") as vault:
    ...     cfg, assumed = rebuild(vault, scout, "BF16")
    >>> cfg["architectures"], cfg["hidden_size"], cfg["num_experts"], cfg["moe_intermediate_size"]
    (['Qwen3MoeForCausalLM'], 64, 4, 48)
    >>> assumed[:2]
    ["rope_type 'default' (no rope scaling)", 'max_position_embeddings 4096']
    """
    a, family, emb = _rebuild_inputs(vault, scout)
    dense = sorted(int(m.group(1)) for n in scout if (m := DENSE_MLP.match(n)))
    layer0 = f"model.layers.{dense[0] if dense else sorted(vault.layers())[0]}"
    assumed = [
        "rope_type 'default' (no rope scaling)",
        f"max_position_embeddings {MAX_POSITIONS}",
        "no bos/eos/pad token ids (the tokenizer's config has them)",
    ]
    cfg = _common_fields(vault, a, family, emb, scout, dtype)
    _family_fields(cfg, family.model_type, a, scout, dense, layer0, assumed)
    if not family.rebuild and not inexact:
        keys = ", ".join(unrecorded(family, cfg, assumed)) or "what its config holds"
        raise RefusedInput(
            f"{vault.path}: no config.json beside it, and a {cfg['model_type']} config "
            f"cannot be rebuilt exactly: the vault does not record {keys}, "
            "which a rebuild would have to assume; pass --config MODEL/config.json, or "
            "--rebuild-config to rebuild it anyway"
        )
    return cfg, assumed


def unrecorded(family: Family, cfg: dict[str, Any], assumed: list[str]) -> list[str]:
    """The keys beyond the arch block (``family.beyond``) that a rebuilt ``cfg`` does not
    take from the vault or the scout: absent from it, or set to a value it assumed (each
    of ``assumed`` starts with the key it sets).

    >>> from smoe.families.registry import FAMILIES
    >>> cfg = {"first_k_dense_replace": 1, "routed_scaling_factor": 1.0, "kv_lora_rank": 16}
    >>> unrecorded(FAMILIES["deepseek_v3"], cfg, ["routed_scaling_factor 1.0"])[:3]
    ['rope_scaling', 'rope_interleave', 'q_lora_rank']
    """
    guessed = {a.split()[0] for a in assumed}
    return [k for k in family.beyond if k not in cfg or k in guessed]


def _rebuild_inputs(
    vault: Vault, scout: dict[str, TensorInfo]
) -> tuple[np.void, Family, TensorInfo]:
    """The arch block, its family and the scout's embedding, which a rebuild needs;
    refused, naming what is missing."""
    a = vault.arch_record
    if a is None:
        raise RefusedInput(
            f"{vault.path}: no config.json beside it and no arch block (a v1 "
            "vault) to rebuild one from; pass --config MODEL/config.json"
        )
    model_type = model_type_str(a["model_type"])
    family = family_of(model_type)
    known = rebuildable()
    if family is None or family.model_type not in known:
        raise RefusedInput(
            f"{vault.path}: no config.json beside it, and model_type "
            f"{model_type!r} has no recipe to rebuild one (known: "
            f"{', '.join(known)}); pass --config"
        )
    emb = scout.get("model.embed_tokens.weight")
    if emb is None or len(emb.shape) != 2:
        raise RefusedInput(
            f"{vault.path}: the scout has no 2-D model.embed_tokens.weight to "
            "take hidden_size and vocab_size from; pass --config"
        )
    return a, family, emb


def _common_fields(
    vault: Vault,
    a: np.void,
    family: Family,
    emb: TensorInfo,
    scout: dict[str, TensorInfo],
    dtype: str,
) -> dict[str, Any]:
    """The fields of every family's config: from the arch block, the header (expert
    count) and the scout (embedding shape, tied lm_head); the registry's class for the
    family; ``dtype``'s torch name."""
    model_type = family.model_type
    return {
        "architectures": [family.architecture],
        "model_type": model_type_str(a["model_type"]),
        "hidden_size": int(emb.shape[1]),
        "vocab_size": int(emb.shape[0]),
        "num_hidden_layers": int(a["num_hidden_layers"]),
        "num_attention_heads": int(a["num_heads"]),
        "num_key_value_heads": int(a["num_kv_heads"]),
        "rms_norm_eps": _f32(a["rms_norm_eps"]),
        "rope_parameters": {"rope_theta": _f32(a["rope_theta"]), "rope_type": "default"},
        "hidden_act": "silu",
        "num_experts_per_tok": int(a["moe_top_k"]),
        EXPERT_COUNT_KEY.get(model_type, "num_experts"): int(vault.header["max_experts_per_layer"]),
        "tie_word_embeddings": "lm_head.weight" not in scout,
        "max_position_embeddings": MAX_POSITIONS,
        "dtype": TORCH_NAMES[dtype],
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }


def _family_fields(
    cfg: dict[str, Any],
    model_type: str,
    a: np.void,
    scout: dict[str, TensorInfo],
    dense: list[int],
    layer0: str,
    assumed: list[str],
) -> None:
    """The fields of ``cfg``'s family: expert and dense widths, head_dim, biases, shared
    experts, the family's knobs (``dense``: the dense layers' ids; ``layer0``: the first
    layer's tensor prefix); each value assumed is added to ``assumed``."""
    head_dim, moe_ffn = int(a["head_dim"]), int(a["moe_ffn_dim"])
    shared = int(a["shared_expert_ffn_dim"])
    bias = f"{layer0}.self_attn.q_proj.bias" in scout
    if model_type == "mixtral":
        cfg.update(intermediate_size=moe_ffn, head_dim=head_dim, sliding_window=None)
        assumed.append("sliding_window null")
        return
    norm_topk = bool(int(a["flags"]) & layout.FLAG_NORM_TOPK_PROB)
    cfg.update(moe_intermediate_size=moe_ffn, norm_topk_prob=norm_topk)
    if dense:
        cfg["intermediate_size"] = _rows(scout, f"model.layers.{dense[0]}.mlp.gate_proj.weight")
    if model_type.startswith("deepseek"):
        _deepseek(cfg, model_type, scout, layer0, head_dim, moe_ffn, shared, dense, assumed)
        return
    cfg["head_dim"] = head_dim
    if model_type == "olmoe":  # its experts' width is intermediate_size
        del cfg["moe_intermediate_size"]
        cfg.update(intermediate_size=moe_ffn, attention_bias=bias, clip_qkv=None)
        assumed.append("clip_qkv null")
        return
    cfg.update(decoder_sparse_step=1, mlp_only_layers=dense, use_sliding_window=False)
    if model_type == "qwen2_moe":
        cfg.update(qkv_bias=bias, shared_expert_intermediate_size=shared)
    else:
        cfg["attention_bias"] = bias


def _deepseek(
    cfg: dict[str, Any],
    model_type: str,
    scout: dict[str, TensorInfo],
    layer0: str,
    qk_dim: int,
    moe_ffn: int,
    shared: int,
    dense: list[int],
    assumed: list[str],
) -> None:
    """MLA widths from the attention tensors (R3: the arch block's head_dim is the q/k
    width), shared experts, dense layers; routing knobs a vault does not record."""
    attn = f"{layer0}.self_attn"
    kv_rank = _rows(scout, f"{attn}.kv_a_layernorm.weight")
    kv_a = _rows(scout, f"{attn}.kv_a_proj_with_mqa.weight")
    kv_b = _rows(scout, f"{attn}.kv_b_proj.weight")
    if kv_rank is None or kv_a is None or kv_b is None:
        raise RefusedInput(
            f"the scout has no {attn}.kv_a_layernorm / kv_a_proj_with_mqa / "
            "kv_b_proj weights to take the MLA widths from; pass --config"
        )
    rope = kv_a - kv_rank
    nope = qk_dim - rope
    heads = cfg["num_attention_heads"]
    cfg.update(
        q_lora_rank=_rows(scout, f"{attn}.q_a_layernorm.weight"),
        kv_lora_rank=kv_rank,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=nope,
        qk_head_dim=qk_dim,
        v_head_dim=kv_b // heads - nope,
        head_dim=rope,
        n_shared_experts=shared // moe_ffn if moe_ffn else 0,
        first_k_dense_replace=len(dense),
        routed_scaling_factor=1.0,
        n_group=1,
        topk_group=1,
        attention_bias=False,
    )
    cfg.setdefault("intermediate_size", moe_ffn)
    assumed += ["routed_scaling_factor 1.0", "n_group 1", "topk_group 1"]
    if model_type == "deepseek_v2":
        cfg["topk_method"] = "greedy"
        assumed.append("topk_method 'greedy'")
    else:
        cfg["rope_interleave"] = True
        assumed.append("rope_interleave true")
