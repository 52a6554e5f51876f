"""HF ``config.json`` -> arch block facts, accepting every transformers spelling (D8)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from smoe.errors import SmoeError
from smoe.records import ArchInfo

# transformers' default of norm_topk_prob per model type when config.json has no key (D8)
NORM_TOPK_DEFAULT = {"mixtral": True, "deepseek_v3": True, "qwen3_moe": False,
                     "qwen2_moe": False, "olmoe": False, "deepseek_v2": False}
QK_NORM_FAMILIES = {"qwen3_moe", "olmoe"}  # attention with q/k RMS norms by construction


def first(cfg: dict, *keys: str, default: object = None) -> object:
    """The value of the first spelling present (transformers renamed keys over versions)."""
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def load_config(path: Path) -> dict:
    try:
        cfg = json.loads(path.read_text())
    except OSError as e:
        raise SmoeError(f"{path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise SmoeError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise SmoeError(f"{path}: not a JSON object")
    return cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg


@dataclass(frozen=True)
class Structure:
    """Structural facts; from the tensors when available (they win), else from the config."""

    has_qk_norm: bool
    dense_ffn_dim: int
    shared_expert_ffn_dim: int


def structure_from_config(cfg: dict) -> Structure:
    model_type = str(cfg.get("model_type", ""))
    qk = cfg.get("use_qk_norm")
    dense = int(cfg.get("intermediate_size", 0) or 0) if int(
        cfg.get("first_k_dense_replace", 0) or 0) > 0 else 0
    shared = cfg.get("shared_expert_intermediate_size")
    if shared is None and cfg.get("n_shared_experts"):
        shared = int(cfg["n_shared_experts"]) * int(cfg.get("moe_intermediate_size", 0) or 0)
    return Structure(bool(qk) if qk is not None else model_type in QK_NORM_FAMILIES, dense,
                     int(shared or 0))


def arch_from_config(cfg: dict, where: str, moe_ffn_dim: int,
                     shapes: Structure | None = None) -> tuple[ArchInfo, list[str]]:
    """The arch block from config values; ``shapes`` (from tensors) override structure.

    Returns the block and the warnings for every disagreement between config and shapes.
    """
    warnings = []
    rope_theta = first(cfg, "rope_theta")
    for nested in ("rope_parameters", "rope_scaling"):
        if rope_theta is None and isinstance(cfg.get(nested), dict):
            rope_theta = cfg[nested].get("rope_theta")
    if rope_theta is None:
        raise SmoeError(f"{where}: no rope_theta (top-level or in rope_parameters)")
    heads = int(first(cfg, "num_attention_heads", default=0))
    hidden = int(first(cfg, "hidden_size", default=0))
    kv = int(first(cfg, "num_key_value_heads", default=heads))
    if "qk_nope_head_dim" in cfg and "qk_rope_head_dim" in cfg:
        # Ruling R3: MLA (DeepSeek) has no single head_dim; the block carries the q/k width.
        head_dim = int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])
    else:
        head_dim = int(first(cfg, "head_dim", default=hidden // heads if heads else 0))
    top_k = first(cfg, "num_experts_per_tok", "moe_top_k", "top_k")
    if top_k is None:
        raise SmoeError(f"{where}: no num_experts_per_tok")
    model_type = str(cfg.get("model_type", "unknown"))
    moe_cfg = first(cfg, "moe_intermediate_size")
    if moe_cfg is None and model_type == "mixtral":
        moe_cfg = cfg.get("intermediate_size")
    if moe_cfg is not None and int(moe_cfg) != moe_ffn_dim:
        warnings.append(f"moe_ffn_dim: config.json says {moe_cfg}, the tensors say "
                        f"{moe_ffn_dim}; using the tensors")
    from_cfg = structure_from_config(cfg)
    facts = shapes or from_cfg
    if shapes is not None:
        for name in ("has_qk_norm", "dense_ffn_dim", "shared_expert_ffn_dim"):
            c, s = getattr(from_cfg, name), getattr(shapes, name)
            cfg_has = name != "has_qk_norm" or "use_qk_norm" in cfg or \
                model_type in QK_NORM_FAMILIES
            if cfg_has and c != s:
                warnings.append(f"{name}: config.json says {c!r}, the tensors say {s!r}; "
                                "using the tensors")
    norm_topk = cfg.get("norm_topk_prob")
    if norm_topk is None:
        norm_topk = NORM_TOPK_DEFAULT.get(model_type, False)
    arch = ArchInfo(
        rope_theta=float(rope_theta), num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        moe_top_k=int(top_k), moe_ffn_dim=int(moe_ffn_dim),
        num_hidden_layers=int(first(cfg, "num_hidden_layers", default=0)),
        rms_norm_eps=float(first(cfg, "rms_norm_eps", "layer_norm_eps", default=1e-6)),
        model_type=model_type, norm_topk_prob=bool(norm_topk), has_qk_norm=facts.has_qk_norm,
        has_dense_layer_0=facts.dense_ffn_dim > 0, dense_ffn_dim=facts.dense_ffn_dim,
        shared_expert_ffn_dim=facts.shared_expert_ffn_dim,
    )
    return arch, warnings
