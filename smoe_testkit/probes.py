"""What a transformers model computes, measured by running its own modules (issue 32).

The arch block states facts an engine trusts: the attention's head counts, whether q and k
are normalised, whether a rotary embedding is in use, the shared expert's width, what one
routed expert computes. The family tests hold each vault's block to what these probes
measure on the tiny model that wrote the checkpoint, never to tensor names or config keys.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Attention", "attention", "expert_output", "shared_expert_width", "text_modules"]

_TOWERS = re.compile(r"(^|\.)(vision|visual|audio|talker|code2wav|vision_tower|vqmodel)")


def text_modules(model: Any) -> Iterator[tuple[str, Any]]:
    """The language model's modules (not a vision, audio or speech tower's), by name."""
    for name, module in model.named_modules():
        if not _TOWERS.search(name):
            yield name, module


@dataclass(frozen=True)
class Attention:
    """What the softmax attention layers did in one forward pass."""

    heads: frozenset[int]
    """The query heads the attention function was given, per layer (one value: uniform)."""
    kv_heads: frozenset[int]
    head_dim: frozenset[int]
    """The query/key width per head."""
    qk_norms: tuple[str, ...]
    """The norm modules inside an attention module that ran on a per-head (or whole) q or k
    before its attention function: their names (none: no q/k norm)."""
    rotary: bool
    """A rotary embedding module of the language model ran."""


@contextlib.contextmanager
def _attention_function(model: Any, record: Callable[..., None]) -> Iterator[None]:
    """Every attention module of ``model`` calls ``record(module, query, key)`` first, then
    transformers' SDPA attention, for the duration."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    def probe(module: Any, query: Any, key: Any, value: Any, *args: Any, **kw: Any) -> Any:
        record(module, query, key)
        return sdpa_attention_forward(module, query, key, value, *args, **kw)

    AttentionInterface.register("smoe_probe", probe)
    AttentionMaskInterface.register("smoe_probe", eager_mask)  # a 4-D mask, as eager has
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    configs[id(model.config)] = model.config
    before = {k: getattr(c, "_attn_implementation", None) for k, c in configs.items()}
    for c in configs.values():
        with contextlib.suppress(AttributeError, ValueError):
            c._attn_implementation = "smoe_probe"
    try:
        yield
    finally:
        for k, c in configs.items():
            with contextlib.suppress(AttributeError, ValueError):
                c._attn_implementation = before[k]


def attention(model: Any, run: Callable[[], Any]) -> Attention:
    """Run ``run()`` (a forward pass of ``model``) and measure its softmax attention: the
    shapes its attention function is given, the norms an attention module runs before it
    (not on its own input, not inside a sparse-attention indexer), the rotary embedding."""
    calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    pending: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    norms: list[tuple[str, tuple[int, ...]]] = []
    inputs: dict[int, Any] = {}
    rotary: list[str] = []
    hooks = []
    names = dict(text_modules(model))

    def attn_pre(module: Any, args: Any, kwargs: Any) -> None:
        inputs[id(module)] = kwargs.get("hidden_states", args[0] if args else None)
        pending[id(module)] = []

    def norm_hook(name: str, owner: Any) -> Callable[..., None]:
        def hook(module: Any, args: Any, out: Any) -> None:
            x = args[0] if args else None
            if x is not None and id(owner) in pending and x is not inputs.get(id(owner)):
                pending[id(owner)].append((name, tuple(x.shape)))

        return hook

    for a, owner in names.items():
        if not a or not re.search(r"Attention$|Attn$", type(owner).__name__):
            continue
        hooks.append(owner.register_forward_pre_hook(attn_pre, with_kwargs=True))
        for sub, m in _own_norms(owner):
            hooks.append(m.register_forward_hook(norm_hook(f"{a}.{sub}", owner)))
    for n, m in names.items():
        if "Rotary" in type(m).__name__:
            hooks.append(m.register_forward_hook(lambda *_, n=n: rotary.append(n)))

    def record(module: Any, query: Any, key: Any) -> None:
        calls.append((tuple(query.shape), tuple(key.shape)))
        norms.extend(pending.pop(id(module), []))  # ran before this module's attention

    try:
        with _attention_function(model, record):
            run()
    finally:
        for h in hooks:
            h.remove()
    heads = frozenset(q[1] for q, _ in calls)
    kv = frozenset(k[1] for _, k in calls)
    dims = frozenset(q[-1] for q, _ in calls)
    widths = {d * h for d in dims for h in heads | kv} | set(dims)
    qk = sorted({n for n, shape in norms if shape and shape[-1] in widths})
    return Attention(heads, kv, dims, tuple(qk), bool(rotary))


def _own_norms(owner: Any) -> Iterator[tuple[str, Any]]:
    """The norm modules of an attention module, not those of a sparse-attention indexer it
    holds (which scores keys of its own)."""
    skip: list[str] = []
    for sub, m in owner.named_modules():
        if not sub or any(sub.startswith(p + ".") for p in skip):
            continue
        if "Indexer" in type(m).__name__:
            skip.append(sub)
        elif "norm" in type(m).__name__.lower():
            yield sub, m


def shared_expert_width(model: Any) -> int:
    """The shared expert's intermediate width from its modules (0: none): the rows of its
    gate (or half of a fused gate/up), all shared experts together."""
    for name, p in text_modules_params(model):
        if "shared" not in name or "experts.gate_up_proj" in name:
            continue
        if re.search(r"\.(gate_proj|w1)\.weight$", name):
            return int(p.shape[0])
        if re.search(r"\.(input_linear\.weight|gate_up_proj(\.weight)?)$", name) and p.dim() == 2:
            return int(p.shape[0]) // 2
    return 0


def text_modules_params(model: Any) -> Iterator[tuple[str, Any]]:
    """The language model's parameters, by name."""
    for name, p in model.named_parameters():
        if not _TOWERS.search(name):
            yield name, p


def expert_output(model: Any, layer: int, expert: int, x: Any) -> Any | None:
    """The model's own routed-expert module of ``layer`` applied to ``x`` ([tokens, hidden])
    with every token sent to ``expert`` at weight 1; None when the module takes another
    call (a block that routes inside its own forward)."""
    import torch

    pattern = re.compile(rf"(^|\.)(layers|blocks)\.{layer}\.(\w+\.)*experts$")
    for name, module in text_modules(model):
        if not pattern.search(name):
            continue
        with torch.no_grad():
            if isinstance(module, torch.nn.ModuleList):
                return module[expert](x)
            index = torch.full((x.shape[0], 1), expert, dtype=torch.long)
            weights = torch.ones(x.shape[0], 1, dtype=x.dtype)
            try:
                return module(x, index, weights)
            except (TypeError, RuntimeError, ValueError, IndexError):
                return None
    return None
