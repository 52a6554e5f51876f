"""HF ``config.json`` -> arch block facts, accepting every transformers spelling (D8).

Every field read is type-checked (a JSON boolean is not the string ``"false"``, a count is
not ``true`` or ``2.0``); a wrong type is refused naming the file, key, value and the type
expected. A JSON ``null`` counts as absent, as in transformers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from smoe.errors import RefusedInput
from smoe.families.registry import Family, Flag, Refusal, Renorm, family_of, generic
from smoe.format.records import ArchInfo, model_type_problem
from smoe.interop.safetensors_io import json_excerpt
from smoe.plumbing import fileio

__all__ = [
    "Structure",
    "arch_from_config",
    "config_object",
    "get_int",
    "get_str",
    "is_mla",
    "load_config",
    "parse_json",
    "qk_norm_of",
    "read_json",
    "read_small",
    "refuse_unsupported",
]

_MAX_JSON = 64 << 20  # config.json and index files are kilobytes to a few megabytes


def _get(
    cfg: dict,
    where: str,
    keys: tuple[str, ...],
    test: Callable[[object], bool],
    expected: str,
    prefix: str = "",
) -> object:
    """The value of the first spelling present and not null (None if none), checked."""
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            if not test(value):
                raise RefusedInput(
                    f"{where}: {prefix}{key} is {json_excerpt(value)}, expected {expected}"
                )
            return value
    return None


def get_int(cfg: dict, where: str, *keys: str, minimum: int = 1) -> int | None:
    """A count: a JSON integer (not a boolean, not 2.0) of at least ``minimum`` (0 or 1).

    The first of ``keys`` present and not null is read; None if none is.

    >>> get_int({"num_experts": None, "n_routed_experts": 64}, "config.json",
    ...         "num_experts", "n_routed_experts")
    64
    >>> get_int({"num_experts": 2.0}, "config.json", "num_experts")
    Traceback (most recent call last):
    smoe.errors.RefusedInput: config.json: num_experts is 2.0, expected a positive integer
    """
    expected = "a positive integer" if minimum else "a non-negative integer"
    value = _get(cfg, where, keys, lambda v: type(v) is int and v >= minimum, expected)
    return value if isinstance(value, int) else None


def _finite(v: object, positive: bool) -> bool:
    # exactly int or float, not bool (isinstance only narrows the type for the checker)
    if type(v) not in (int, float) or not isinstance(v, (int, float)):
        return False
    try:
        f = float(v)
    except OverflowError:
        return False
    return math.isfinite(f) and (f > 0 if positive else f >= 0)


def _get_float(
    cfg: dict, where: str, *keys: str, positive: bool = True, prefix: str = ""
) -> float | None:
    """A finite JSON number (integers allowed), > 0 (or >= 0 unless ``positive``)."""
    value = _get(
        cfg,
        where,
        keys,
        lambda v: _finite(v, positive),
        f"a finite number {'>' if positive else '>='} 0",
        prefix,
    )
    return float(value) if isinstance(value, (int, float)) else None


def _get_bool(cfg: dict, where: str, key: str) -> bool | None:
    """A JSON boolean: ``"false"`` or ``0`` is refused, not read as a flag."""
    value = _get(cfg, where, (key,), lambda v: type(v) is bool, "a JSON boolean (true or false)")
    return value if isinstance(value, bool) else None


def get_str(cfg: dict, where: str, *keys: str, default: str = "") -> str:
    """A string; one with a lone surrogate (a ``\\ud800`` escape) is refused.

    >>> get_str({"model_type": "olmoe"}, "config.json", "model_type")
    'olmoe'
    >>> get_str({}, "config.json", "hidden_act", default="silu")
    'silu'
    """
    value = _get(cfg, where, keys, lambda v: isinstance(v, str), "a string")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            key = next(k for k in keys if cfg.get(k) is not None)
            raise RefusedInput(
                f"{where}: {key} is {json_excerpt(value)}, which is not valid Unicode "
                "(a lone surrogate)"
            ) from None
    return value if isinstance(value, str) else default


def _get_object(cfg: dict, where: str, key: str) -> dict | None:
    value = _get(cfg, where, (key,), lambda v: isinstance(v, dict), "a JSON object")
    return value if isinstance(value, dict) else None


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def read_small(path: Path) -> bytes:
    """The bytes of a small input (config.json, an index): a regular file of at most
    16 MiB, read whole. FIFOs, folders and devices are refused without blocking
    (``fileio.open_input``).

    >>> from pathlib import Path
    >>> read_small(Path("fixtures/checkpoints/qwen3_moe/config.json"))[:1]
    b'{'
    """
    return fileio.read_whole(
        path,
        _MAX_JSON,
        lambda size: RefusedInput(
            f"{path}: {size} bytes is too large for a JSON file (over {_MAX_JSON >> 20} MiB)"
        ),
    )


def parse_json(raw: bytes, path: Path) -> object:
    """``raw`` (the bytes of ``path``) as JSON: UTF-8, no key twice in one object.

    >>> from pathlib import Path
    >>> parse_json(b'{"a": 1, "a": 2}', Path("x.json"))
    Traceback (most recent call last):
    smoe.errors.RefusedInput: x.json: the key 'a' appears twice in one object
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RefusedInput(
            f"{path}: not valid UTF-8 at offset {e.start} (byte 0x{raw[e.start]:02x})"
        ) from None
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except _Duplicate as e:
        raise RefusedInput(f"{path}: the key {e.key!r} appears twice in one object") from None
    except json.JSONDecodeError as e:
        at = len(text[: e.pos].encode("utf-8"))
        raise RefusedInput(
            f"{path}: not valid JSON at offset {at} ({e.msg.removesuffix(' at').lower()})"
        ) from None
    except RecursionError:
        raise RefusedInput(f"{path}: JSON nested too deeply") from None
    except ValueError:  # an integer literal of more than 4300 digits
        raise RefusedInput(f"{path}: has an integer too long to read") from None


def read_json(path: Path) -> object:
    """A small JSON input (config.json, an index): :func:`read_small`, then
    :func:`parse_json`.

    >>> from pathlib import Path
    >>> read_json(Path("fixtures/checkpoints/qwen3_moe/config.json"))["model_type"]
    'qwen3_moe'
    >>> read_json(Path("fixtures/q4_v2.smoe"))
    Traceback (most recent call last):
    smoe.errors.RefusedInput: fixtures/q4_v2.smoe: not valid UTF-8 at offset 4 (byte 0xde)
    """
    return parse_json(read_small(path), path)


def config_object(doc: object, path: Path) -> dict:
    """The model's settings in a parsed config.json: the object itself, or its
    ``text_config`` for multimodal wrappers.

    >>> config_object({"text_config": {"model_type": "qwen3_moe"}}, Path("config.json"))
    {'model_type': 'qwen3_moe'}
    """
    if not isinstance(doc, dict):
        raise RefusedInput(f"{path}: not a JSON object")
    thinker = doc.get("thinker_config")  # Qwen3-Omni: the text model is the thinker's
    outer = thinker if isinstance(thinker, dict) else doc
    inner = outer.get("text_config")
    return inner if isinstance(inner, dict) else doc


def load_config(path: Path) -> dict:
    """config.json as a dict (its ``text_config`` for multimodal wrappers).

    >>> from pathlib import Path
    >>> cfg = load_config(Path("fixtures/checkpoints/qwen3_moe/config.json"))
    >>> cfg["model_type"], cfg["num_experts_per_tok"]
    ('qwen3_moe', 2)
    """
    return config_object(read_json(path), path)


@dataclass(frozen=True)
class Structure:
    """Structural facts; from the tensors when available (they win), else from the config.

    >>> Structure(has_qk_norm=True, dense_ffn_dim=0, shared_expert_ffn_dim=0)
    Structure(has_qk_norm=True, dense_ffn_dim=0, shared_expert_ffn_dim=0)
    """

    has_qk_norm: bool
    dense_ffn_dim: int
    shared_expert_ffn_dim: int


def qk_norm_of(cfg: dict, where: str, family: Family) -> bool | None:
    """Whether the family's attention normalises q and k, when its registry entry says (by
    construction or by a config key); None: the tensors tell.

    >>> from smoe.families.registry import FAMILIES
    >>> qk_norm_of({"use_qk_norm": False}, "config.json", FAMILIES["llama4"])
    False
    >>> qk_norm_of({}, "config.json", FAMILIES["mixtral"]) is None
    True
    """
    rule = family.qk_norm
    if isinstance(rule, Flag):
        said = _get_bool(cfg, where, rule.key)
        return rule.default if said is None else said
    return rule


def _structure_from_config(cfg: dict, where: str, family: Family) -> Structure:
    fixed = qk_norm_of(cfg, where, family)
    qk = fixed if fixed is not None else _get_bool(cfg, where, "use_qk_norm")
    dense = 0
    if get_int(cfg, where, "first_k_dense_replace", minimum=0):
        dense = get_int(cfg, where, "intermediate_size") or 0
    shared = get_int(cfg, where, "shared_expert_intermediate_size", minimum=0)
    if shared is None:
        n_shared = get_int(cfg, where, "n_shared_experts", minimum=0) or 0
        shared = n_shared * (get_int(cfg, where, "moe_intermediate_size") or 0)
    return Structure(bool(qk), dense, shared)


def is_mla(cfg: dict, where: str) -> bool:
    """DeepSeek multi-head latent attention: q/k widths instead of one head_dim (R3).

    >>> is_mla({"qk_nope_head_dim": 128, "qk_rope_head_dim": 64}, "config.json")
    True
    >>> is_mla({"head_dim": 128}, "config.json")
    False
    """
    nope = get_int(cfg, where, "qk_nope_head_dim", minimum=0)
    rope = get_int(cfg, where, "qk_rope_head_dim", minimum=0)
    return nope is not None and rope is not None


_FULL_ATTENTION = ("full_attention", "attention", "global_attention", "default")


def _no_rope(cfg: dict, where: str, family: Family) -> bool:
    """Whether the model has no rotary embedding (rope_theta 0, ruling R6): by construction,
    or by the family's switch (granitemoehybrid's ``position_embedding_type``)."""
    if family.rope_switch:
        key, value = family.rope_switch
        return get_str(cfg, where, key) != value
    return family.nope


def _layer_rope_theta(cfg: dict, where: str) -> float | None:
    """``layer_rope_theta`` (granitemoe_swa): one RoPE base per layer, overriding the global
    one in every layer (0: no RoPE in that layer). The same in every layer: that value;
    different: refused (one rope_theta per model can be represented)."""
    value = cfg.get("layer_rope_theta")
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(_finite(v, False) for v in value):
        raise RefusedInput(
            f"{where}: layer_rope_theta is {json_excerpt(value)}, expected a list of finite "
            "numbers >= 0"
        )
    if len(set(value)) > 1:
        raise RefusedInput(
            f"{where}: layer_rope_theta is {json_excerpt(value)}: the layers have different "
            "RoPE bases (0: none); one rope_theta per model can be represented"
        )
    return float(value[0])


def _rope_theta(cfg: dict, where: str) -> tuple[float, list[str]]:
    """``rope_theta``: per layer (:func:`_layer_rope_theta`, which overrides the rest),
    top-level (old spelling), in ``rope_parameters``/``rope_scaling``, or in
    ``rope_parameters`` keyed by layer type (then the full-attention layers' value, with a
    warning when other layer types use another); and the warnings."""
    per_layer = _layer_rope_theta(cfg, where)
    if per_layer is not None:
        return per_layer, []
    theta = _get_float(cfg, where, "rope_theta")
    for nested in ("rope_parameters", "rope_scaling"):
        sub = _get_object(cfg, where, nested)
        if theta is None and sub is not None:
            theta = _get_float(sub, where, "rope_theta", prefix=f"{nested}.")
            if theta is None:
                return _rope_theta_by_layer_type(sub, where, nested)
    if theta is None:
        raise RefusedInput(f"{where}: no rope_theta (top-level or in rope_parameters)")
    return theta, []


def _rope_theta_by_layer_type(sub: dict, where: str, nested: str) -> tuple[float, list[str]]:
    """``rope_parameters`` as ``{layer_type: {rope_theta: ...}}``."""
    thetas: dict[str, float] = {}
    for kind, params in sub.items():
        if isinstance(params, dict):
            value = _get_float(params, where, "rope_theta", prefix=f"{nested}.{kind}.")
            if value is not None:
                thetas[kind] = value
    if not thetas:
        raise RefusedInput(f"{where}: no rope_theta (top-level or in rope_parameters)")
    kind = next((k for k in _FULL_ATTENTION if k in thetas), next(iter(thetas)))
    others = {k: v for k, v in thetas.items() if v != thetas[kind]}
    warnings = []
    if others:
        rest = ", ".join(f"{k} {v:g}" for k, v in others.items())
        warnings.append(
            f"rope_theta: {nested}.{kind}.rope_theta {thetas[kind]:g} is written; other layer "
            f"types use another ({rest}): an engine must read {nested} from the config copy"
        )
    return thetas[kind], warnings


def _attention_from_config(cfg: dict, where: str) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim); head_dim = hidden_size // heads when absent."""
    heads = get_int(cfg, where, "num_attention_heads")
    if heads is None:
        raise RefusedInput(f"{where}: no num_attention_heads")
    kv = get_int(cfg, where, "num_key_value_heads") or heads
    if heads % kv:
        raise RefusedInput(
            f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}"
        )
    if is_mla(cfg, where):
        # Ruling R3: MLA (DeepSeek) has no single head_dim; the block carries the q/k width.
        head_dim = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        if head_dim < 1:
            raise RefusedInput(
                f"{where}: qk_nope_head_dim + qk_rope_head_dim is 0, expected a "
                "positive q/k head width"
            )
        return heads, kv, head_dim
    head_dim = get_int(cfg, where, "head_dim")
    if head_dim is None:
        hidden = get_int(cfg, where, "hidden_size")
        if hidden is None:
            raise RefusedInput(f"{where}: no head_dim, and no hidden_size to derive it from")
        head_dim = hidden // heads
        if head_dim < 1:
            raise RefusedInput(
                f"{where}: head_dim = hidden_size {hidden} // num_attention_heads {heads} is 0"
            )
    return heads, kv, head_dim


_SILU_ACTS = {"silu", "swish", "swiglu"}


def refuse_unsupported(cfg: dict, where: str, subject: str | None = None) -> None:
    """Refuse model families and activations the format cannot represent (D8).

    ``where`` (the config file) is named in type errors, ``subject`` (default ``where``,
    e.g. the model folder) in the refusal.

    >>> refuse_unsupported({"model_type": "qwen3_moe", "hidden_act": "silu"}, "config.json")
    >>> refuse_unsupported({"hidden_act": "gelu"}, "config.json", "ckpt")
    Traceback (most recent call last):
    smoe.errors.RefusedInput: ckpt: hidden_act 'gelu' refused: only SiLU-gated (SwiGLU) \
experts can be represented
    """
    subject = subject or where
    model_type = get_str(cfg, where, "model_type")
    family = family_of(model_type)
    if family is not None and family.refused:
        raise RefusedInput(f"{subject}: model_type {model_type!r} refused: {family.refused}")
    for rule in family.refuse_if if family is not None else ():
        found = _configured(cfg, rule)
        if found is not None:
            raise RefusedInput(
                f"{subject}: model_type {model_type!r} refused: {found}: {rule.reason}"
            )
    act = get_str(cfg, where, "hidden_act", "hidden_activation", default="silu").lower()
    if act not in _SILU_ACTS and not (family is not None and family.silu_fixed):
        raise RefusedInput(
            f"{subject}: hidden_act {act!r} refused: only SiLU-gated (SwiGLU) "
            "experts can be represented"
        )


def _unset(value: object) -> bool:
    """null, 0, false, or an empty list or object: a limit that is not configured."""
    return value is None or value is False or value == 0 or value in ([], {})


def _configured(cfg: dict, rule: Refusal) -> str | None:
    """What in ``cfg`` makes ``rule`` apply (the key and its value, in words), or None.

    >>> from smoe.families.registry import Refusal
    >>> _configured({"limits": [0, None, 7.0]}, Refusal("limits", ""))
    'limits is [0, null, 7.0]'
    >>> _configured({"limits": [0, None]}, Refusal("limits", "")) is None
    True
    """
    value = cfg.get(rule.key)
    if rule.kind == "differs":
        other = cfg.get(rule.other)
        if value is None or value == other:
            return None
        return f"{rule.key} is {json_excerpt(value)}, {rule.other} {json_excerpt(other)}"
    if rule.kind == "overrides":
        return _overrides(cfg, rule.key, value)
    if _unset(value) or (isinstance(value, list) and all(_unset(v) for v in value)):
        return None
    return f"{rule.key} is {json_excerpt(value)}"


def _overrides(cfg: dict, key: str, value: object) -> str | None:
    """The first per-layer value of ``key`` (``{layer: {name: value}}``) that differs from
    the model's top-level ``name``, in words."""
    if not isinstance(value, dict):
        return None
    for layer, params in value.items():
        for name, v in params.items() if isinstance(params, dict) else ():
            if name in cfg and cfg[name] != v:
                return (
                    f"{key}.{layer}.{name} is {json_excerpt(v)}, the model's {name} "
                    f"{json_excerpt(cfg[name])}"
                )
    return None


def _arch_model_type(cfg: dict, where: str) -> str:
    """``model_type`` for the arch block ("unknown" when absent), refused here, naming the
    file, when the block cannot hold it as it is (:func:`model_type_problem`)."""
    model_type = get_str(cfg, where, "model_type", default="unknown")
    problem = model_type_problem(model_type)
    if problem is not None:
        raise RefusedInput(f"{where}: model_type {json_excerpt(model_type)} {problem}")
    return model_type


def _renorm(cfg: dict, where: str, family: Family) -> tuple[bool, list[str]]:
    """The norm_topk_prob flag: what the family's router does (fixed by its modeling
    code, or a config key with the family's default); a config key the router ignores
    but that says otherwise is a warning."""
    rule = family.renorm
    if isinstance(rule, Renorm):
        if rule.only_when:
            switch, applies, default = rule.only_when
            if get_str(cfg, where, switch, default=default) != applies:
                return True, []  # a softmax over the top-k logits sums to one by itself
        value = _get_bool(cfg, where, rule.key)
        return (rule.default if value is None else value), []
    said = _get_bool(cfg, where, "norm_topk_prob")
    warnings = []
    if said is not None and said != rule:
        does = "always renormalises" if rule else "never renormalises"
        warnings.append(
            f"norm_topk_prob: config.json says {str(said).lower()}, but the "
            f"{family.model_type} router {does} its top-k weights (it ignores the key); "
            f"the flag says {str(rule).lower()}"
        )
    return rule, warnings


def _top_k(cfg: dict, where: str, family: Family) -> int:
    """The routed experts per token, under the family's spelling (or any known one)."""
    keys = family.top_k + tuple(k for k in generic("").top_k if k not in family.top_k)
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, list) and value and all(v == value[0] for v in value):
            value = value[0]  # one value per layer, all the same (hunyuan's moe_topk)
            if type(value) is int and value >= 1:
                return value
        elif isinstance(value, list):
            raise RefusedInput(
                f"{where}: {key} is {json_excerpt(value)}: a different top-k per layer "
                "cannot be represented"
            )
    top_k = get_int(cfg, where, *keys)
    if top_k is None:
        raise RefusedInput(f"{where}: no num_experts_per_tok (nor {', '.join(keys[1:])})")
    return top_k


def arch_from_config(
    cfg: dict,
    where: str,
    moe_ffn_dim: int,
    shapes: Structure | None = None,
    family: Family | None = None,
    model_type: str | None = None,
) -> tuple[ArchInfo, list[str]]:
    """The arch block from config values; ``shapes`` (from tensors) override structure.
    ``family``: the registry's entry (default: the config's model_type's, else generic);
    ``model_type``: the name the block records (a multimodal wrapper's outer type).

    Returns the block and the warnings for every disagreement between config and shapes.

    >>> from pathlib import Path
    >>> cfg = load_config(Path("fixtures/checkpoints/qwen3_moe/config.json"))
    >>> arch, warnings = arch_from_config(cfg, "config.json", moe_ffn_dim=48)
    >>> arch.rope_theta, arch.num_heads, arch.head_dim, arch.moe_top_k, arch.has_qk_norm
    (1000000.0, 4, 16, 2, True)
    >>> arch_from_config(cfg, "config.json", moe_ffn_dim=32)[1]
    ['moe_ffn_dim: config.json says 48, the tensors say 32; using the tensors']
    """
    refuse_unsupported(cfg, where)
    name = _arch_model_type(cfg, where) if model_type is None else model_type
    if model_type is not None:
        problem = model_type_problem(model_type)
        if problem is not None:
            raise RefusedInput(f"{where}: model_type {json_excerpt(model_type)} {problem}")
    family = family or family_of(name) or generic(name)
    theta, warnings = (0.0, []) if _no_rope(cfg, where, family) else _rope_theta(cfg, where)
    heads, kv, head_dim = _attention_from_config(cfg, where)
    if is_mla(cfg, where) and kv != heads:  # R7: MLA expands one key per query head
        warnings.append(
            f"num_kv_heads: config.json says num_key_value_heads {kv}, but multi-head latent "
            f"attention has one key per query head; the block says {heads}"
        )
        kv = heads
    top_k = _top_k(cfg, where, family)
    moe_cfg = get_int(cfg, where, *family.moe_ffn)
    if moe_cfg is not None and moe_cfg != moe_ffn_dim:
        warnings.append(
            f"moe_ffn_dim: config.json says {moe_cfg}, the tensors say "
            f"{moe_ffn_dim}; using the tensors"
        )
    from_cfg = _structure_from_config(cfg, where, family)
    facts = shapes or from_cfg
    if shapes is not None:
        for field_name in ("has_qk_norm", "dense_ffn_dim", "shared_expert_ffn_dim"):
            c, s = getattr(from_cfg, field_name), getattr(shapes, field_name)
            cfg_has = (
                field_name != "has_qk_norm" or "use_qk_norm" in cfg or family.qk_norm is not None
            )
            if cfg_has and c != s:
                warnings.append(
                    f"{field_name}: config.json says {c!r}, the tensors say {s!r}; "
                    "using the tensors"
                )
    norm_topk, notes = _renorm(cfg, where, family)
    warnings += notes
    eps = _get_float(cfg, where, "rms_norm_eps", "layer_norm_eps", "norm_eps", positive=False)
    arch = ArchInfo(
        rope_theta=theta,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        moe_top_k=top_k,
        moe_ffn_dim=int(moe_ffn_dim),
        num_hidden_layers=get_int(cfg, where, "num_hidden_layers", "num_layers") or 0,
        rms_norm_eps=1e-6 if eps is None else eps,
        model_type=name,
        norm_topk_prob=norm_topk,
        has_qk_norm=facts.has_qk_norm,
        has_dense_layer_0=facts.dense_ffn_dim > 0,
        dense_ffn_dim=facts.dense_ffn_dim,
        shared_expert_ffn_dim=facts.shared_expert_ffn_dim,
    )
    return arch, warnings
