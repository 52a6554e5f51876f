"""Mutations of a HuggingFace ``config.json``, each with the verdict the tools must reach.

Every key the tools read has a kind (``KINDS``). A mutation gives one key a value of
another JSON type, a non-finite number or a non-positive count (``refuse``: a SmoeError
naming the key), another valid value (``valid``: never refused for a type reason), the same
value spelled differently (``same``: the very same output), or something debatable
(``any``: a SmoeError or success, nothing else). Whole-file faults (invalid UTF-8, not an
object, not JSON) must be refused naming ``config.json``.

``refuse`` holds only where the key is read: a later spelling of an aliased key
(``num_local_experts`` after ``num_experts``), ``hidden_size`` beside ``head_dim``, and so on,
are ignored by transformers too; ``reads`` decides.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from fuzz.st_mutators import Raw, dump

KINDS = {
    "model_type": "str",
    "hidden_act": "str",
    "hidden_activation": "str",
    "num_experts": "count",
    "num_local_experts": "count",
    "n_routed_experts": "count",
    "num_experts_per_tok": "count",
    "moe_top_k": "count",
    "top_k": "count",
    "num_attention_heads": "count",
    "num_key_value_heads": "count",
    "hidden_size": "count",
    "head_dim": "count",
    "intermediate_size": "count",
    "moe_intermediate_size": "count",
    "num_hidden_layers": "count",
    "qk_nope_head_dim": "count0",
    "qk_rope_head_dim": "count0",
    "first_k_dense_replace": "count0",
    "shared_expert_intermediate_size": "count0",
    "n_shared_experts": "count0",
    "rms_norm_eps": "float",
    "layer_norm_eps": "float",
    "rope_theta": "float",
    "rope_parameters": "object",
    "rope_scaling": "object",
    "rope_parameters.rope_theta": "float",
    "rope_scaling.rope_theta": "float",
    "norm_topk_prob": "bool",
    "use_qk_norm": "bool",
}
CHECKPOINT_ONLY = {
    "hidden_act",
    "hidden_activation",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
}  # read when opening a checkpoint, not by upgrade --config
ALIASES = [
    ("hidden_act", "hidden_activation"),
    ("num_experts", "num_local_experts", "n_routed_experts"),
    ("num_experts_per_tok", "moe_top_k", "top_k"),
    ("rms_norm_eps", "layer_norm_eps"),
]

WRONG: dict[str, list[object]] = {  # refused wherever the key is read
    "bool": ["false", "true", "False", "0", "", 1, 0, 1.0, [], {}, [True], Raw("NaN")],
    "count": [
        "4",
        "",
        4.5,
        Raw("4.0"),
        Raw("4e0"),
        Raw("-0.0"),
        -1,
        -(2**40),
        0,
        Raw("-0"),
        True,
        False,
        [4],
        {"v": 4},
        Raw("NaN"),
        Raw("Infinity"),
        Raw("-Infinity"),
        Raw("1e400"),
    ],
    "count0": ["0", "", 1.5, Raw("1.0"), -1, True, False, [1], {}, Raw("NaN"), Raw("Infinity")],
    "float": [
        Raw("NaN"),
        Raw("Infinity"),
        Raw("-Infinity"),
        Raw("1e400"),
        Raw("-1e400"),
        "1e6",
        "",
        "NaN",
        True,
        False,
        [1.0],
        {},
    ],
    "str": [5, 1.5, True, False, [], {}, ["silu"], Raw("NaN")],
    "object": ["x", 5, 1.5, True, [], [{}], Raw("Infinity")],
}
ODD: dict[str, list[object]] = {  # type-valid but extreme: refused or accepted, nothing else
    "bool": [],
    "count": [2**31, 2**32, 2**32 + 2, 2**53 + 1, 2**64, 10**30, 1025, 65537],
    "count0": [2**32, 10**30],
    "float": [0, 0.0, -1.0, -1e-6, 1e300, 3.5e38, 1e-320, 5e-324, Raw("1e-400"), 2**70],
    "str": ["", "\ud800", "sil\udc00", "x" * 10000, "\u0000", "caf\u00e9" * 10, "\U0001f600"],
    "object": [{}, {"rope_type": "yarn"}, {"rope_theta": None}],
}


Mutation = tuple[str | bytes, str, str | None, str]  # text, expect, key path, description


@dataclass(frozen=True)
class ConfigCase:
    """One mutated config.json and what the tools must make of it."""

    raw: bytes
    expect: str  # refuse | same | valid | any
    key: str | None  # the key path mutated ("rope_parameters.rope_theta"), if one
    what: str
    nested: bool = False

    def names(self) -> str:
        """What a refusal must name: the key (its last part), else the file."""
        return self.key.rsplit(".", 1)[-1] if self.key else "config.json"


def _present(cfg: dict, key: str) -> bool:
    return cfg.get(key) is not None


def reads(cfg: dict, key: str, ffn_fallback: bool | None) -> bool:
    """Whether a tool consults ``key`` of the (inner, mutated) config.

    ``ffn_fallback`` is None for ``upgrade --config`` (the config alone), else whether the
    tensors have no dense layer 0 and no shared expert, so that the header's ffn_dim comes
    from ``intermediate_size``.
    """
    if ffn_fallback is None and key in CHECKPOINT_ONLY:
        return False
    for group in ALIASES:
        if key in group:
            return not any(_present(cfg, k) for k in group[: group.index(key)])
    mla = _present(cfg, "qk_nope_head_dim") and _present(cfg, "qk_rope_head_dim")
    top_theta = _present(cfg, "rope_theta")
    params = cfg.get("rope_parameters")
    params_theta = isinstance(params, dict) and _present(params, "rope_theta")
    conditions: dict[str, Callable[[], bool]] = {
        "hidden_size": lambda: not mla and not _present(cfg, "head_dim"),
        "head_dim": lambda: not mla,
        "intermediate_size": lambda: (
            bool(ffn_fallback)
            or (cfg.get("model_type") == "mixtral" and not _present(cfg, "moe_intermediate_size"))
            or (type(cfg.get("first_k_dense_replace")) is int and cfg["first_k_dense_replace"] > 0)
        ),
        "n_shared_experts": lambda: not _present(cfg, "shared_expert_intermediate_size"),
        "rope_parameters": lambda: not top_theta,
        "rope_parameters.rope_theta": lambda: not top_theta,
        "rope_scaling": lambda: not top_theta and not params_theta,
        "rope_scaling.rope_theta": lambda: not top_theta and not params_theta,
    }
    return conditions.get(key, lambda: True)()


def _set(cfg: dict, key: str, value: object) -> dict:
    """A copy of cfg with ``key`` (``a`` or ``a.b``) set; a missing parent is created."""
    out = dict(cfg)
    if "." in key:
        parent, leaf = key.split(".")
        sub = out.get(parent)
        out[parent] = {**(sub if isinstance(sub, dict) else {}), leaf: value}
    else:
        out[key] = value
    return out


def _get(cfg: dict, key: str) -> object:
    if "." in key:
        parent, leaf = key.split(".")
        sub = cfg.get(parent)
        return sub.get(leaf) if isinstance(sub, dict) else None
    return cfg.get(key)


def _delete(cfg: dict, key: str) -> dict:
    out = dict(cfg)
    if "." in key:
        parent, leaf = key.split(".")
        if isinstance(out.get(parent), dict):
            out[parent] = {k: v for k, v in out[parent].items() if k != leaf}
    else:
        out.pop(key, None)
    return out


def _text(cfg: dict, indent: int | None = 2) -> str:
    if indent is None:
        return dump(cfg)
    return _pretty(cfg, indent, 0)


def _pretty(value: object, indent: int, level: int) -> str:
    """``dump`` with indentation, as transformers writes config.json."""
    if isinstance(value, dict) and value:
        pad = " " * indent * (level + 1)
        body = ",\n".join(
            f"{pad}{json.dumps(k)}: {_pretty(v, indent, level + 1)}" for k, v in value.items()
        )
        return "{\n" + body + "\n" + " " * indent * level + "}"
    return dump(value)


def _pick_key(rng: random.Random, cfg: dict) -> str:
    """A key to mutate: mostly one the config has, sometimes one it lacks."""
    have = [k for k in KINDS if _get(cfg, k) is not None]
    return rng.choice(have) if have and rng.random() < 0.8 else rng.choice(list(KINDS))


def _value_case(cfg: dict, key: str, value: object, expect: str, what: str) -> Mutation:
    return _text(_set(cfg, key, value)), expect, key, f"{key} = {dump(value)} ({what})"


def wrong_type(rng: random.Random, cfg: dict) -> Mutation:
    key = _pick_key(rng, cfg)
    return _value_case(cfg, key, rng.choice(WRONG[KINDS[key]]), "refuse", "wrong")


def odd_value(rng: random.Random, cfg: dict) -> Mutation:
    key = rng.choice([k for k in KINDS if ODD[KINDS[k]]])
    return _value_case(cfg, key, rng.choice(ODD[KINDS[key]]), "any", "extreme")


def valid_value(rng: random.Random, cfg: dict) -> Mutation:
    key = _pick_key(rng, cfg)
    kind, old = KINDS[key], _get(cfg, key)
    value: object = {
        "bool": lambda: not old if isinstance(old, bool) else rng.random() < 0.5,
        "count": lambda: rng.choice([rng.randint(1, 256), 2 * old if type(old) is int else 1]),
        "count0": lambda: rng.randint(0, 8),
        "float": lambda: rng.choice([1e-6, 1e-5, 5e5, 10000, 1.5, 1]),
        "str": lambda: rng.choice(
            ["qwen3_moe", "mixtral", "llama", "silu", "SiLU", "swish", "gelu", "x"]
        ),
        "object": lambda: rng.choice([{"rope_type": "default", "rope_theta": 5e5}, {}]),
    }[kind]()
    return _value_case(cfg, key, value, "valid", "another valid value")


def respell(rng: random.Random, cfg: dict) -> Mutation:
    """The same value in another JSON spelling: the output must not change at all."""
    have = [
        k
        for k in KINDS
        if isinstance(_get(cfg, k), (float, int, str)) and not isinstance(_get(cfg, k), bool)
    ]
    key = rng.choice(have)
    old = _get(cfg, key)
    if isinstance(old, str):
        raw = Raw('"' + "".join(f"\\u{ord(c):04x}" for c in old) + '"')
    elif isinstance(old, float) and old.is_integer() and abs(old) < 1e15:
        raw = Raw(str(int(old)) if rng.random() < 0.5 else f"{int(old)}.000")
    elif isinstance(old, float):
        raw = Raw(rng.choice([f"{old!r}".upper(), format(old, ".17e"), format(old, ".17g")]))
    else:
        raw = Raw(f" {old}\n")
    return _value_case(cfg, key, raw, "same", "same value")


def delete_or_null(rng: random.Random, cfg: dict) -> Mutation:
    key = rng.choice([k for k in KINDS if _get(cfg, k) is not None] or list(KINDS))
    if rng.random() < 0.5:
        return _text(_delete(cfg, key)), "valid", key, f"{key} deleted"
    return _value_case(cfg, key, None, "valid", "null")


def duplicate_key(rng: random.Random, cfg: dict) -> Mutation:
    """A top-level key written twice; a wrong type last is what json.loads would keep."""
    key = rng.choice([k for k in KINDS if "." not in k and k in cfg] or ["model_type"])
    wrong = rng.choice(WRONG[KINDS[key]])
    order = rng.choice(["valid-then-wrong", "wrong-then-valid", "same-twice"])
    first, last = {
        "valid-then-wrong": (cfg[key], wrong),
        "wrong-then-valid": (wrong, cfg[key]),
        "same-twice": (cfg[key], cfg[key]),
    }[order]
    body = _text({k: v for k, v in cfg.items() if k != key})
    text = (
        body[:-2] + f",\n  {json.dumps(key)}: {dump(first)},\n  {json.dumps(key)}: {dump(last)}\n}}"
    )
    return (
        text,
        "refuse" if order == "valid-then-wrong" else "any",
        key,
        f"{key} twice ({order}: {dump(first)}, {dump(last)})",
    )


def unknown_keys(rng: random.Random, cfg: dict) -> Mutation:
    """Keys the tools do not read, any value, keys shuffled and re-indented: same output."""
    items = list(cfg.items())
    rng.shuffle(items)
    extra = rng.choice(
        [None, "x", 1, [1, {"a": None}], {"deep": {"er": [1.5]}}, True, Raw("NaN"), "\ud83d\ude00"]
    )
    items.insert(rng.randrange(len(items) + 1), ("fuzz_unknown_key", extra))
    text = _text(dict(items), rng.choice([None, 1, 2, 4]))
    return text, "same", None, f"keys shuffled, fuzz_unknown_key = {dump(extra)}"


def whole_file(rng: random.Random, cfg: dict) -> Mutation:
    """Not UTF-8, not JSON, not an object: refused naming config.json."""
    body = _text(cfg).encode()
    how = rng.choice(
        [
            "bad-utf8",
            "raw-surrogate",
            "not-object",
            "truncated",
            "empty",
            "trailing-comma",
            "long-int",
            "bom",
            "deep-nesting",
            "single-quotes",
        ]
    )
    cut = rng.randrange(1, len(body))
    if how == "bad-utf8":
        at = body.index(b'"', cut) + 1 if b'"' in body[cut:] else 1
        raw = (
            body[:at]
            + rng.choice([b"\xff", b"\xc3(", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf"])
            + body[at:]
        )
    elif how == "raw-surrogate":
        raw = body.replace(b'"silu"', b'"sil\xed\xa0\x80u"', 1)
        raw = raw if raw != body else body.replace(b'"', b'"\xed\xa0\x80', 2)
    elif how == "not-object":
        raw = rng.choice([b"[]", b'"config"', b"1", b"null", b"true", b"[" + body + b"]"])
    elif how == "truncated":
        raw = body[:cut]
    elif how == "empty":
        raw = rng.choice([b"", b" \n"])
    elif how == "trailing-comma":
        raw = body[:-2] + b",\n}"
    elif how == "long-int":
        raw = body[:-2] + b',\n  "fuzz_long_int": ' + b"9" * 5000 + b"\n}"
    elif how == "bom":
        return b"\xef\xbb\xbf" + body, "any", None, "UTF-8 byte order mark first"
    elif how == "deep-nesting":
        raw = body[:-2] + b',\n  "fuzz_unknown_key": ' + b"[" * 100000 + b"]" * 100000 + b"\n}"
        return raw, "any", None, "an unknown key nested 100000 deep"
    else:
        raw = body.replace(b'"', b"'")
    return raw, "refuse", None, how


def text_config(rng: random.Random, cfg: dict) -> Mutation:
    """``text_config`` of another type than an object (transformers would fail too)."""
    value = rng.choice(["x", 5, [], [cfg], True])
    return (
        _text({"model_type": "fuzz_vl", "text_config": value, **cfg}),
        "any",
        "text_config",
        f"text_config = {dump(value)[:40]}",
    )


MUTATORS: dict[str, Callable[[random.Random, dict], Mutation]] = {
    f.__name__: f
    for f in (
        wrong_type,
        odd_value,
        valid_value,
        respell,
        delete_or_null,
        duplicate_key,
        unknown_keys,
        whole_file,
        text_config,
    )
}
WEIGHTS = {
    "wrong_type": 4,
    "odd_value": 1,
    "valid_value": 2,
    "respell": 2,
    "delete_or_null": 2,
    "duplicate_key": 1,
    "unknown_keys": 1,
    "whole_file": 2,
    "text_config": 1,
}


def mutate(rng: random.Random, cfg: dict) -> tuple[str, ConfigCase]:
    """A seeded mutation of ``cfg`` (sometimes nested under text_config): (mutator, case)."""
    name = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    nested = name not in ("text_config", "whole_file") and rng.random() < 0.15
    text, expect, key, what = MUTATORS[name](rng, cfg)
    if nested:
        inner = text if isinstance(text, str) else text.decode("utf-8", "surrogatepass")
        # the wrapper is named as its text model (the arch block records the outer type,
        # ruling R6): the mutation, not the wrapper's name, must decide the output
        outer = json.dumps(cfg.get("model_type", "fuzz_vl"))
        text = '{"model_type": ' + outer + ', "architectures": ["X"], "text_config": ' + inner + "}"
        what += " (inside text_config)"
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return name, ConfigCase(raw, expect, key, what, nested)


def expectation(case: ConfigCase, mutated: dict | None, ffn_fallback: bool | None) -> str:
    """The verdict for one consumer: ``refuse`` becomes ``any`` where the key is not read."""
    if (
        case.expect == "refuse"
        and case.key
        and mutated is not None
        and not reads(mutated, case.key, ffn_fallback)
    ):
        return "any"
    return case.expect
