"""A config.json checked against the vault it claims to describe (issue 23, cases 3 and 5).

``upgrade --config`` writes an arch block from a config, and ``export --hf`` copies one beside
the experts: a config of another model (another width, vocabulary, layer count, head layout,
expert count, top-k or expert width than the vault's header, table and descriptors hold) is
refused before anything is written, naming the key, its value and the vault's fact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from smoe.errors import RefusedInput
from smoe.families.config import config_object, get_int, get_str, is_mla
from smoe.families.registry import Family, family_of, generic
from smoe.format.records import model_type_str
from smoe.vault.reader import Vault

__all__ = ["refuse_contradictions", "stated"]


def _spellings(family: Family, attr: str) -> tuple[str, ...]:
    """A count's key spellings: the family's (a dotted one, such as Qwen3-Omni's
    ``thinker_config.num_experts_per_tok``, by its last part: the text config holds it),
    then every other spelling known."""
    own = tuple(k.rsplit(".", 1)[-1] for k in getattr(family, attr))
    return own + tuple(k for k in getattr(generic(""), attr) if k not in own)


def _count(cfg: dict[str, Any], where: str, keys: tuple[str, ...]) -> tuple[str, int] | None:
    """(key, value) of the first of ``keys`` present and not null: an integer (type-checked),
    or a list of one integer per layer, all the same (hunyuan's ``moe_topk``); None when
    none is present, or the list differs per layer (the sculptor refuses those)."""
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, list):
            same = bool(value) and all(type(v) is int and v == value[0] for v in value)
            return (key, value[0]) if same else None
        number = get_int(cfg, where, key, minimum=0)
        return None if number is None else (key, number)
    return None


def stated(doc: object, path: Path) -> dict[str, tuple[str, Any]]:
    """What the parsed config.json ``doc`` (read from ``path``) says about what a vault
    records: field -> (the key as the config spells it, its value); a field it does not
    give is left out. The fields: ``model_type`` (a multimodal wrapper's outer one, which
    the arch block records, else its text model's), ``hidden_size``, ``vocab_size``,
    ``num_hidden_layers``, ``mtp_layers`` (``num_nextn_predict_layers``), ``num_heads``,
    ``num_kv_heads``, ``head_dim`` (for MLA the q/k width, ruling R3; else ``head_dim``, or
    ``hidden_size // num_attention_heads``), and under the family's key spellings
    (``Family.experts``, ``top_k``, ``moe_ffn``, then every other known one) ``experts``,
    ``top_k`` and ``moe_ffn``. Values of a wrong type are refused (:func:`get_int`).

    >>> from smoe.families.config import read_json
    >>> doc = read_json(Path("fixtures/checkpoints/mixtral/config.json"))
    >>> facts = stated(doc, Path("config.json"))
    >>> facts["model_type"], facts["experts"], facts["top_k"], facts["moe_ffn"]
    (('model_type', 'mixtral'), ('num_local_experts', 4), ('num_experts_per_tok', 2), \
('intermediate_size', 56))
    >>> doc = read_json(Path("fixtures/checkpoints/deepseek_v3/config.json"))
    >>> stated(doc, Path("config.json"))["head_dim"]  # R3: the q/k width
    ('qk_nope_head_dim + qk_rope_head_dim', 16)
    """
    where = str(path)
    cfg = config_object(doc, path)
    outer = get_str(doc, where, "model_type") if isinstance(doc, dict) else ""
    inner = get_str(cfg, where, "model_type")
    declared = outer or inner
    family = family_of(outer) or family_of(inner) or generic(declared)
    facts: dict[str, tuple[str, Any]] = {}
    if declared:
        facts["model_type"] = ("model_type", declared)
    for name, keys in (
        ("hidden_size", ("hidden_size",)),
        ("vocab_size", ("vocab_size",)),
        ("num_hidden_layers", ("num_hidden_layers", "num_layers")),
        ("mtp_layers", ("num_nextn_predict_layers",)),
        ("num_heads", ("num_attention_heads",)),
        ("num_kv_heads", ("num_key_value_heads",)),
        ("experts", _spellings(family, "experts")),
        ("top_k", _spellings(family, "top_k")),
        ("moe_ffn", _spellings(family, "moe_ffn")),
    ):
        found = _count(cfg, where, keys)
        if found is not None:
            facts[name] = found
    if is_mla(cfg, where):
        facts.pop("num_kv_heads", None)  # R7: MLA has a key per query head, whatever it says
        width = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        facts["head_dim"] = ("qk_nope_head_dim + qk_rope_head_dim", width)
    elif get_int(cfg, where, "head_dim") is not None:
        facts["head_dim"] = ("head_dim", cfg["head_dim"])
    elif "hidden_size" in facts and facts.get("num_heads", ("", 0))[1]:
        width = facts["hidden_size"][1] // facts["num_heads"][1]
        facts["head_dim"] = ("hidden_size / num_attention_heads", width)
    return facts


def _shown(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _refuse(path: Path, key: str, shown: str, fact: str) -> NoReturn:
    raise RefusedInput(f"{path}: {key} is {shown}, but {fact}: the config describes another model")


def refuse_contradictions(doc: object, path: Path, vault: Vault, *, arch: bool = True) -> None:
    """Refuse the parsed config.json ``doc`` (read from ``path``) where it contradicts
    ``vault``, naming the config's key and value and the vault's: ``hidden_size`` and
    ``vocab_size`` against the header's ``d_model`` and ``vocab_size`` (when recorded), the
    expert count against ``max_experts_per_layer``, top-k above it, the experts' width
    against their descriptors' gate rows, ``num_hidden_layers`` (plus
    ``num_nextn_predict_layers``) not above the highest MoE layer in the table; and with
    ``arch`` (when the vault has an arch block) the model type (a wrapper's outer one),
    ``num_hidden_layers``, the head counts, ``head_dim`` (MLA: the q/k width, R3) and top-k
    against the block. A field the config leaves out is not checked.

    >>> cfg = {"model_type": "olmoe", "hidden_size": 64, "vocab_size": 320,
    ...        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    ...        "num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32}
    >>> with Vault.open("fixtures/q4_v2.smoe") as vault:
    ...     refuse_contradictions(cfg, Path("config.json"), vault)  # the vault's own: no finding
    ...     refuse_contradictions({**cfg, "num_experts_per_tok": 16}, Path("c.json"), vault)
    Traceback (most recent call last):
    smoe.errors.RefusedInput: c.json: num_experts_per_tok is 16, but fixtures/q4_v2.smoe \
has 4 experts per layer: the config describes another model
    """
    facts = stated(doc, path)
    block = vault.arch if arch else None
    recorded = f"the arch block of {vault.path} says"

    def check(name: str, want: int, fact: str) -> None:
        if name in facts and facts[name][1] != want:
            _refuse(path, facts[name][0], _shown(facts[name][1]), fact)

    if block is not None:
        model_type = model_type_str(block["model_type"])
        key, declared = facts.get("model_type", ("model_type", None))
        if declared != model_type:
            _refuse(
                path, key, _shown(declared) if declared else "absent", f"{recorded} {model_type!r}"
            )
    h = vault.header
    d_model, vocab = int(h["d_model"]), int(h["vocab_size"])
    check("hidden_size", d_model, f"{vault.path} has d_model {d_model}")
    if vocab:
        check("vocab_size", vocab, f"{vault.path} has vocab_size {vocab}")
    if block is not None:
        layers = int(block["num_hidden_layers"])
        check("num_hidden_layers", layers, f"{recorded} num_hidden_layers {layers}")
    held = vault.layers()
    if "num_hidden_layers" in facts and held:
        key, count = facts["num_hidden_layers"]
        mtp = facts.get("mtp_layers", ("", 0))[1]
        if max(held) >= count + mtp:
            also = f" (and num_nextn_predict_layers {mtp})" if mtp else ""
            _refuse(path, key, f"{count}{also}", f"{vault.path} holds experts of layer {max(held)}")
    if block is not None:
        for name, field in (
            ("num_heads", "num_heads"),
            ("num_kv_heads", "num_kv_heads"),
            ("head_dim", "head_dim"),
        ):
            want = int(block[field])
            check(name, want, f"{recorded} {field} {want}")
    experts = int(h["max_experts_per_layer"])
    check("experts", experts, f"{vault.path} has {experts} experts per layer")
    if "top_k" in facts and facts["top_k"][1] > experts:
        key, top_k = facts["top_k"]
        _refuse(path, key, str(top_k), f"{vault.path} has {experts} experts per layer")
    if block is not None:
        top_k = int(block["moe_top_k"])
        check("top_k", top_k, f"{recorded} moe_top_k {top_k}")
    if "moe_ffn" in facts and len(vault):
        rows = vault.descriptors["rows"][:, 0]
        wrong = np.flatnonzero(rows != facts["moe_ffn"][1])
        if len(wrong):
            width = int(rows[wrong[0]])
            check(
                "moe_ffn", width, f"{vault.path} has moe_ffn_dim {width} (its experts' gate rows)"
            )
