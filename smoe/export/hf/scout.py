"""The scout checked against the vault: embedding, layers and each MoE layer's router, so
that another model's scout is refused before anything is written.
"""

from __future__ import annotations

from typing import Any

from smoe.errors import RefusedInput
from smoe.export.hf.names import OutTensor
from smoe.export.hf.plan import Sources
from smoe.families.registry import CONTAINERS, EMBEDDINGS, family_of, generic, split_layer
from smoe.format.records import model_type_str
from smoe.vault.names import natural_key
from smoe.vault.reader import Vault

__all__ = ["OTHER_MODEL"]


OTHER_MODEL = "the scout belongs to another model"


def _moe_blocks(experts: dict[str, OutTensor]) -> tuple[str, dict[int, str]]:
    """The language model's layer stem (``model.layers.``) and, per layer, the prefix of
    its MoE block (``model.layers.3.mlp.``): where the expert tensors written go, so where
    the scout must hold that layer's router."""
    stem, blocks = "", dict[int, str]()
    for name in sorted(experts, key=natural_key):
        split = split_layer(name)
        if split is None:
            continue
        _, layer, rest = split
        head = name[: len(name) - len(rest)]
        stem = stem or head[: -len(f"{layer}.")]
        first = rest.split(".", 1)[0]
        blocks.setdefault(layer, head + (f"{first}." if first in CONTAINERS else ""))
    return stem, blocks


def _check_embedding(vault: Vault, src: Sources, stem: str) -> None:
    """The token embedding beside the layers (``model.embed_tokens.weight`` or another
    known spelling) is ``[vocab_size, d_model]`` of the vault (vocab_size when recorded)."""
    prefix = stem.removesuffix("layers.").removesuffix("blocks.")
    names = [prefix + e for e in EMBEDDINGS]
    name = next((n for n in names if n in src.scout), None)
    where, vault_path = src.scout_path, src.vault_path
    if name is None:
        raise RefusedInput(
            f"{where}: has no token embedding (looked for {', '.join(names)}): {OTHER_MODEL}"
        )
    shape = src.scout[name].shape
    d_model, vocab = int(vault.header["d_model"]), int(vault.header["vocab_size"])
    if len(shape) != 2:
        raise RefusedInput(
            f"{where}: {name} has shape {list(shape)}, but {vault_path} needs [vocab_size, "
            f"d_model {d_model}]: {OTHER_MODEL}"
        )
    if shape[1] != d_model:
        raise RefusedInput(
            f"{where}: {name} has {shape[1]} columns, but {vault_path} has d_model "
            f"{d_model}: {OTHER_MODEL}"
        )
    if vocab and shape[0] != vocab:
        raise RefusedInput(
            f"{where}: {name} has {shape[0]} rows, but {vault_path} has vocab_size "
            f"{vocab}: {OTHER_MODEL}"
        )


def _check_layers(src: Sources, stem: str, count: int | None, mtp: int) -> None:
    """The scout holds tensors of each of the model's ``count`` layers under ``stem``, and
    of no layer beyond them but ``mtp`` multi-token-prediction layers."""
    if count is None:
        return
    present = set()
    for name in src.scout:
        head = name[len(stem) :].split(".", 1)[0] if name.startswith(stem) else ""
        if head.isdigit():
            present.add(int(head))
    said = f"{src.vault_path} has num_hidden_layers {count}"
    missing = sorted(set(range(count)) - present)
    if missing:
        raise RefusedInput(
            f"{src.scout_path}: has no tensor of {stem}{missing[0]}, but {said}: {OTHER_MODEL}"
        )
    beyond = max(present, default=-1)
    if beyond >= count + mtp:
        also = f" (and num_nextn_predict_layers {mtp})" if mtp else ""
        raise RefusedInput(
            f"{src.scout_path}: has tensors of {stem}{beyond}, but {said}{also}: {OTHER_MODEL}"
        )


def _router_like(rest: str) -> bool:
    return "gate" in rest or "router" in rest


def _check_routers(vault: Vault, src: Sources, blocks: dict[int, str], mlp_router: bool) -> None:
    """Each MoE layer's router is in its MoE block: a 2-D tensor there whose name holds
    ``gate`` or ``router``, ``[experts per layer, d_model]``; a family whose router is a
    small MLP of its own width (``router_hidden_size`` beyond the arch block: zaya) needs
    only a tensor there so named."""
    experts, d_model = int(vault.header["max_experts_per_layer"]), int(vault.header["d_model"])
    want = (experts, d_model)
    found: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    for name in sorted(src.scout, key=natural_key):
        split = split_layer(name)
        at = blocks.get(split[1], "") if split is not None else ""
        if split is not None and at and name.startswith(at) and _router_like(name[len(at) :]):
            found.setdefault(split[1], []).append((name, src.scout[name].shape))
    for layer in sorted(vault.layers()):
        block = blocks.get(layer)
        if block is None:
            continue
        near = found.get(layer, [])
        if any(tuple(shape) == want for _, shape in near) or (mlp_router and near):
            continue
        router = f"[{experts}, {d_model}] ({experts} experts per layer, d_model {d_model})"
        other = [
            (n, shape)
            for n, shape in near
            if len(shape) == 2
            and "shared" not in n[len(block) :]
            and "_proj" not in n[len(block) :]
        ]
        if other:
            name, shape = other[0]
            raise RefusedInput(
                f"{src.scout_path}: {name} is {list(shape)}, but a router of "
                f"{src.vault_path} is {router}: {OTHER_MODEL}"
            )
        raise RefusedInput(
            f"{src.scout_path}: has no router for MoE layer {layer} (a 2-D tensor under "
            f"{block} whose name holds 'gate' or 'router', for {src.vault_path} "
            f"{router}): {OTHER_MODEL}"
        )


def check_scout(
    vault: Vault, src: Sources, experts: dict[str, OutTensor], facts: dict[str, tuple[str, Any]]
) -> None:
    """Refuse a scout that belongs to another model, naming its tensor and the vault's
    value: the token embedding ``[vocab_size, d_model]``, a tensor of every one of the
    model's layers and of none beyond them (but the config's multi-token-prediction
    layers), and each MoE layer's router ``[experts per layer, d_model]`` where the experts
    written go (``facts``: what the config says, :func:`smoe.vault.contradictions.stated`)."""
    stem, blocks = _moe_blocks(experts)
    _check_embedding(vault, src, stem)
    count: int | None = facts.get("num_hidden_layers", ("", None))[1]
    model_type: str = facts.get("model_type", ("", ""))[1]
    if vault.arch is not None:
        count = int(vault.arch["num_hidden_layers"])
        model_type = model_type_str(vault.arch["model_type"])
    _check_layers(src, stem, count, facts.get("mtp_layers", ("", 0))[1])
    family = family_of(model_type) or generic(model_type)
    _check_routers(vault, src, blocks, "router_hidden_size" in family.beyond)
