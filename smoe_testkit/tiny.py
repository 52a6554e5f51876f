"""Tiny checkpoints that transformers itself writes, for every model type it has.

A model type's default config is shrunk key by key (widths to a few dozen, two to four
layers, four experts, top-2), the model is built from it with random weights and saved
with ``save_pretrained``: the tensor names, layouts and config spellings are the library's
own, never written by hand. :data:`OVERRIDES` holds the few settings a family needs beyond
the generic shrink (so that its config validates, or that it has an MoE layer at all).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from pathlib import Path
from typing import Any

__all__ = ["MODEL_CLASSES", "OVERRIDES", "build", "shrink", "tiny_config", "write"]

# generic sizes, by config key (every sub-config: text, vision, audio)
_SIZES: dict[str, Any] = {
    "hidden_size": 64,
    "d_model": 64,
    "n_embd": 64,
    "intermediate_size": 96,
    "ffn_hidden_size": 96,
    "ffn_dim": 96,
    "moe_intermediate_size": 24,  # 2 x 24 != 64: a fused [E, 2I, H] is not square
    "expert_intermediate_size": 24,
    "moe_ffn_hidden_size": 24,
    "shared_expert_intermediate_size": 48,
    "dense_intermediate_size": 96,
    "num_attention_heads": 4,
    "num_heads": 4,
    "n_head": 4,
    "num_key_value_heads": 2,
    "num_kv_heads": 2,
    "head_dim": 16,
    "attention_head_dim": 16,
    "num_experts": 4,
    "n_routed_experts": 4,
    "num_local_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "moe_k": 2,
    "num_experts_per_token": 2,
    "top_k": 2,
    "moe_top_k": 2,
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "moe_num_shared_experts": 1,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "kv_lora_rank": 40,  # no q/k width: a latent norm is not a q/k norm to the probes
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "n_group": 1,
    "topk_group": 1,
    "num_nextn_predict_layers": 0,
    "depth": 2,
    "num_layers": 2,
    "encoder_layers": 2,
    "out_hidden_size": 64,
    "projection_dim": 64,
    "text_hidden_size": 64,
    "vision_hidden_size": 64,
    "image_size": 32,
    "patch_size": 8,
    "spatial_merge_size": 2,
    "sliding_window": 64,
}
_LAYERS = 2


def _shrink_list(value: list, layers: int) -> list:
    return value[:layers] if len(value) >= layers else value


def shrink(d: dict[str, Any], layers: int = _LAYERS) -> dict[str, Any]:
    """A config dict with every size key set small, sub-configs included (in place)."""
    n_old = d.get("num_hidden_layers")
    for key, value in list(d.items()):
        if isinstance(value, dict) and key not in ("rope_parameters", "rope_scaling"):
            shrink(value, layers)
        elif key == "num_hidden_layers" and isinstance(value, int):
            d[key] = min(value, layers)
        elif key in _SIZES and isinstance(value, int) and not isinstance(value, bool):
            d[key] = min(value, _SIZES[key]) if key not in ("n_group", "topk_group") else 1
    vocab = d.get("vocab_size")
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        ids = d.get(key)
        if isinstance(vocab, int) and isinstance(ids, int) and ids >= vocab:
            d[key] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}[key]
        elif isinstance(vocab, int) and isinstance(ids, list):
            d[key] = [i if i < vocab else 2 for i in ids]
    if isinstance(d.get("kv_lora_rank"), int) and isinstance(d.get("num_attention_heads"), int):
        d["num_key_value_heads"] = d["num_attention_heads"]  # MLA: a key per query head
    n_new = d.get("num_hidden_layers")
    if isinstance(n_old, int) and isinstance(n_new, int):
        for key, value in list(d.items()):
            if isinstance(value, list) and len(value) == n_old:
                d[key] = value[:n_new]
    return d


OVERRIDES: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "tiny_overrides.json").read_text()
)
"""Per model type: config values set after the shrink (dotted keys reach sub-configs), so
that its config validates and it has routed-MoE layers (found reading each family's code)."""

MODEL_CLASSES = (  # a multimodal wrapper is built whole, as the Hub ships it
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
    "MODEL_MAPPING_NAMES",
)


def _set(d: dict[str, Any], dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    for p in path:
        d = d.setdefault(p, {})
    d[last] = value


def tiny_config(model_type: str, overrides: dict[str, Any] | None = None) -> Any:
    """The shrunk config of ``model_type`` (a transformers ``PretrainedConfig``), with
    ``overrides`` set last."""
    from transformers import AutoConfig

    d = AutoConfig.for_model(model_type).to_dict()
    shrink(d)
    for key, value in {**OVERRIDES.get(model_type, {}), **(overrides or {})}.items():
        _set(d, key, value)
    d.pop("model_type", None)
    d.pop("transformers_version", None)
    return AutoConfig.for_model(model_type, **d)


def model_class(model_type: str) -> Any:
    """The class transformers maps ``model_type`` to (multimodal first, then causal LM)."""
    import transformers
    from transformers.models.auto import modeling_auto

    for table in MODEL_CLASSES:
        name = getattr(modeling_auto, table, {}).get(model_type)
        if name:
            return getattr(transformers, name)
    raise LookupError(f"transformers has no model class for {model_type!r}")


def build(model_type: str, seed: int = 0, overrides: dict[str, Any] | None = None) -> Any:
    """A tiny model of ``model_type`` with random weights (float32, eval mode)."""
    import torch

    cfg = tiny_config(model_type, overrides)
    torch.manual_seed(seed)
    with _quiet():
        model = model_class(model_type)._from_config(cfg, dtype=torch.float32)
    return model.eval()


@contextlib.contextmanager
def _quiet() -> Any:
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def write(
    model_type: str,
    folder: Path,
    dtype: str = "bfloat16",
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> Any:
    """Build a tiny ``model_type`` model and ``save_pretrained`` it (``dtype`` weights)
    into ``folder``; the model (float32) is returned."""
    import torch

    model = build(model_type, seed, overrides)
    with _quiet():
        model.to(getattr(torch, dtype)).save_pretrained(folder)
    return model.float()
