"""Structure-aware mutations of the three sidecars, each with the verdict every reader owes it.

* the manifest ``<vault>.manifest.json`` (docs/MANIFEST.md), parsed into a document and
  written back by hand (``fuzz.st_mutators.dump``), so that a mutation can keep a key twice,
  put raw JSON text (``NaN``, ``1e400``, 5000 digits, ``\\ud800``) where a value goes, permute
  entries or lie about counts;
* the resume journal ``.<stem>.smoe.journal`` (``smoe.sculpt.journal``), as lines: forged,
  edited, permuted, duplicated, cut, padded with NULs, of the wrong field count;
* the importance matrix, GGUF (``GgufFile``: built field by field, so that a count, a length,
  a type or an offset can lie) or legacy ``.dat`` (``DatFile``), and its values.

Every mutator is ``(rng, base) -> Mutation``; ``Mutation.expect`` maps each reader of the
sidecar to what it owes the input:

* ``same``: the input means what the unmutated one means: exit 0 and the very same output;
* ``valid``: a valid input (another value of a field no check can contradict): exit 0;
* ``refuse``: a clean refusal (exit 1 or 2, one line on stderr), never exit 0;
* ``any``: a clean refusal or exit 0 with outputs that hold up.

Readers: ``verify`` (``verify --deep``), ``report`` (``report --deep``), ``export``
(``export --hf``), ``upgrade`` (``upgrade --out``, v1 vaults), ``resume`` (``sculpt
--resume``), ``imatrix`` (``sculpt --imatrix``).
"""

from __future__ import annotations

import copy
import json
import random
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np

from fuzz.st_mutators import Pairs, Raw, dump

MANIFEST_READERS = ("verify", "report", "export", "upgrade")
SPECIALS = ("fifo", "dir", "devzero", "devnull", "selflink", "tail")


@dataclass(frozen=True)
class Mutation:
    """One mutated sidecar: its bytes (or a ``special`` file), the verdicts, a description."""

    raw: bytes | None
    expect: dict[str, str]
    what: str
    special: str | None = None  # see SPECIALS; "tail": ``raw`` then a sparse NUL tail
    form: Any = None  # imatrix: the mutated structure, when it still is one (see must_weigh)


def _all(verdict: str, readers: tuple[str, ...] = MANIFEST_READERS, **over: str) -> dict[str, str]:
    return {r: over.get(r, verdict) for r in readers}


# ---- JSON text ---------------------------------------------------------------------------
def pretty(
    value: object, indent: int | None, rng: random.Random | None = None, level: int = 0
) -> str:
    """``value`` as JSON (``dump``'s spelling), indented; ``rng``: object members shuffled."""
    if isinstance(value, (dict, Pairs)):
        items = list(value.items if isinstance(value, Pairs) else value.items())
        if rng is not None:
            rng.shuffle(items)
        parts = [
            f"{json.dumps(k)}:{' ' if indent else ''}{pretty(v, indent, rng, level + 1)}"
            for k, v in items
        ]
        return _wrap("{", parts, "}", indent, level)
    if isinstance(value, list):
        return _wrap("[", [pretty(v, indent, rng, level + 1) for v in value], "]", indent, level)
    return dump(value)


def _wrap(open_: str, parts: list[str], close: str, indent: int | None, level: int) -> str:
    if not parts:
        return open_ + close
    if indent is None:
        return open_ + ",".join(parts) + close
    pad = "\n" + " " * indent * (level + 1)
    return open_ + pad + ("," + pad).join(parts) + "\n" + " " * indent * level + close


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _set(doc: Any, path: tuple, value: object) -> Any:
    out = copy.deepcopy(doc)
    _get(out, path[:-1])[path[-1]] = value
    return out


def _delete(doc: Any, path: tuple) -> Any:
    out = copy.deepcopy(doc)
    del _get(out, path[:-1])[path[-1]]
    return out


def _where(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _text(doc: object, rng: random.Random) -> bytes:
    return pretty(doc, rng.choice([None, 2])).encode("utf-8", "surrogatepass") + b"\n"


# ---- the manifest --------------------------------------------------------------------------
@dataclass(frozen=True)
class ManifestBase:
    """A sculpted vault's manifest: its document and what the mutators need to know."""

    doc: dict
    raw: bytes
    fused: bool  # the sources are fused 3-D tensors (index and rows recorded)
    heights: tuple[int, int, int]  # rows of the gate, up and down tensors in the vault
    experts_per_layer: int
    upgradable: bool  # a v1 vault: upgrade --out reads it

    @property
    def rows(self) -> list[dict]:
        rows: list[dict] = self.doc["experts"]
        return rows


CHECKED_ROW = ("layer", "expert", "offset", "raw_size", "crc32c")
U32, U64 = 2**32 - 1, 2**64 - 1


def wrong_ints(rng: random.Random, v: int, top: int) -> list[object]:
    """Values a checked integer ``v`` (in [0, top]) must not be read as: other integers,
    out of range, other types and spellings."""
    return [
        v + 1,
        v - 1 if v else v + 2,
        v ^ (1 << rng.randrange(32)),
        0 if v else 1,
        -1,
        -(2**63),
        top + 1,
        2**64,
        10**30,
        Raw("9" * 5000),
        Raw(f"{v}.0"),
        Raw(f"{v}e0"),
        float(v) + 0.5,
        True,
        False,
        str(v),
        None,
        [v],
        {"v": v},
        Raw("NaN"),
        Raw("Infinity"),
        Raw("-Infinity"),
        Raw("1e400"),
    ]


def _checked_paths(base: ManifestBase) -> list[tuple[tuple, int]]:
    """(path, range top) of every integer a check compares with the vault."""
    out: list[tuple[tuple, int]] = [(("vault", "size"), U64), (("vault", "experts"), U64)]
    for i in range(len(base.rows)):
        for key in CHECKED_ROW:
            out.append((("experts", i, key), U32 if key in ("layer", "expert", "crc32c") else U64))
    return out


def checked_value(rng: random.Random, base: ManifestBase) -> Mutation:
    """A checked integer made wrong (another value, out of range, float, bool, string, null,
    NaN, 5000 digits) or deleted."""
    paths = _checked_paths(base)
    path, top = rng.choice(paths[:2] if rng.random() < 0.25 else paths)  # vault.size/experts
    old = _get(base.doc, path)
    if rng.random() < 0.1:
        return Mutation(
            _text(_delete(base.doc, path), rng), _all("refuse"), f"{_where(path)} deleted"
        )
    value = rng.choice(wrong_ints(rng, old, top))
    doc = _set(base.doc, path, value)
    return Mutation(
        _text(doc, rng), _all("refuse"), f"{_where(path)} = {dump(value)[:60]} (was {old})"
    )


def schema_checksum(rng: random.Random, base: ManifestBase) -> Mutation:
    key = rng.choice(["schema", "checksum"])
    value = rng.choice(
        [
            "smoe-manifest/2",
            "smoe-manifest/0",
            "SMOE-MANIFEST/1",
            "smoe-manifest/1 ",
            "crc32",
            "xxh3",
            "",
            1,
            None,
            True,
            ["crc32c"],
            Raw("NaN"),
            "\ud800",
        ]
    )
    if rng.random() < 0.2:
        return Mutation(_text(_delete(base.doc, (key,)), rng), _all("refuse"), f"{key} deleted")
    if value == base.doc[key]:
        value = "other"
    return Mutation(
        _text(_set(base.doc, (key,), value), rng), _all("refuse"), f"{key} = {dump(value)}"
    )


def rows_array(rng: random.Random, base: ManifestBase) -> Mutation:
    """The experts array cut, padded, permuted, a row duplicated or replaced."""
    rows = copy.deepcopy(base.rows)
    n = len(rows)
    i, j = rng.sample(range(n), 2)
    how = rng.choice(
        ["drop-last", "drop-one", "duplicate", "swap", "append-junk", "not-array", "crc-of-other"]
    )
    value: object = rows
    if how == "drop-last":
        rows.pop()
    elif how == "drop-one":
        rows.pop(i)
    elif how == "duplicate":
        rows.insert(i, copy.deepcopy(rows[i]))
    elif how == "swap":
        rows[i], rows[j] = rows[j], rows[i]
    elif how == "append-junk":
        count = rng.choice([1, 1000, 200_000])
        value = Raw(
            "["
            + ",".join([dump(r) for r in rows] + [rng.choice(["0", "{}", "null"])] * count)
            + "]"
        )
        how += f" x{count}"
    elif how == "not-array":
        value = rng.choice([{}, None, 16, "[]", {"0": rows[0]}])
    else:  # another blob's CRC, the row otherwise right
        if rows[i]["crc32c"] == rows[j]["crc32c"]:
            rows[i]["crc32c"] ^= 1
        else:
            rows[i]["crc32c"] = rows[j]["crc32c"]
    doc = dict(base.doc, experts=value)
    return Mutation(_text(doc, rng), _all("refuse"), f"experts: {how} (rows {i}, {j})")


def _tensor_paths(base: ManifestBase) -> list[tuple[int, int]]:
    return [
        (i, t)
        for i, r in enumerate(base.rows)
        if isinstance(r.get("tensors"), list)
        for t in range(3)
    ]


def permute_sources(rng: random.Random, base: ManifestBase) -> Mutation:
    """Sources bound to the wrong blobs: swapped between experts, between gate and up, a
    fused slab's index or a gate/up half's rows exchanged (issue 23, case 4)."""
    rows = copy.deepcopy(base.rows)
    hows = ["swap-tensors", "swap-source", "swap-gate-up", "swap-gate-down", "copy-tensors"]
    if base.fused:
        hows += ["swap-rows", "swap-index", "swap-rows", "swap-index"]
    how = rng.choice(hows)
    i, j = rng.sample(range(len(rows)), 2)
    ti, tj = rows[i]["tensors"], rows[j]["tensors"]
    t = rng.randrange(3)
    if how == "swap-tensors":
        rows[i]["tensors"], rows[j]["tensors"] = tj, ti
    elif how == "copy-tensors":
        rows[i]["tensors"] = copy.deepcopy(tj)
    elif how == "swap-source":
        ti[t]["source"], tj[t]["source"] = tj[t]["source"], ti[t]["source"]
    elif how == "swap-gate-up":
        ti[0], ti[1] = ti[1], ti[0]
    elif how == "swap-gate-down":
        ti[0], ti[2] = ti[2], ti[0]
    elif how == "swap-rows":  # the gate half read as up and the up half as gate
        ti[0]["rows"], ti[1]["rows"] = ti[1]["rows"], ti[0]["rows"]
    else:  # swap-index: two experts' slabs of the same fused tensors exchanged
        for u in range(3):
            ti[u]["index"], tj[u]["index"] = tj[u]["index"], ti[u]["index"]
    if rows == base.rows:  # two experts with the same sources (cannot be): say so
        return Mutation(_text(base.doc, rng), _all("same"), f"{how}: unchanged")
    doc = dict(base.doc, experts=rows)
    # upgrade --out copies the sources as they are: whatever it does, its output must verify
    return Mutation(
        _text(doc, rng), _all("refuse", upgrade="any"), f"{how} (experts[{i}], [{j}], tensor {t})"
    )


def source_fields(rng: random.Random, base: ManifestBase) -> Mutation:
    """One tensor entry's index, rows or source out of bounds, of another type or naming
    another tensor; the tensors list of the wrong length or content."""
    i, t = rng.choice(_tensor_paths(base))
    row = base.rows[i]
    entry = row["tensors"][t]
    heights = base.heights
    h = heights[t]
    total = sum(heights)
    layer, expert = row["layer"], row["expert"]
    key = rng.choice(["index", "rows", "source", "tensors"])
    expect = _all("refuse", upgrade="any")
    if key == "index":
        value: object = rng.choice(
            [
                (expert + 1) % base.experts_per_layer if base.fused else expert + 1,
                base.experts_per_layer,
                10**12,
                -1,
                float(expert),
                str(expert),
                True,
                [expert],
                Raw("9" * 5000),
                Raw("NaN"),
            ]
        )
        path: tuple = ("experts", i, "tensors", t, "index")
    elif key == "rows":
        start = entry["rows"][0] if entry.get("rows") else 0
        value = rng.choice(
            [
                [start, start + h + 1],
                [start + 1, start + h + 1] if start + h + 1 > total else [total - h + 1, total + 1],
                [10**12, 10**12 + h],
                [-1, h - 1],
                [start + h, start],
                [start],
                [start, start + h, start + 2 * h],
                f"{start}:{start + h}",
                [float(start), float(start + h)],
                [True, h],
                {"start": start},
                Raw(f"[{start}, 1e400]"),
            ]
        )
        path = ("experts", i, "tensors", t, "rows")
    elif key == "source":
        src = entry["source"]
        other_layer = src.replace(f"layers.{layer}.", f"layers.{layer + 1}.")
        swaps = (  # each role named as another one, as the family names them
            [("gate_up_proj", "down_proj"), ("down_proj", "gate_up_proj")]
            if base.fused
            else [("gate_proj", "up_proj"), ("up_proj", "down_proj"), ("down_proj", "gate_proj")]
        )
        other_role = next(
            (src.replace(a, b) for a, b in swaps if src.endswith((a, a + ".weight"))), src
        )
        other_expert = src.replace(f"experts.{expert}.", f"experts.{expert + 1}.")
        choices: list[tuple[object, dict[str, str]]] = [
            (other_layer, expect),
            (other_role, expect),
        ]
        if not base.fused:
            choices.append((other_expert, expect))
        # no family naming to compare with: the reader may take it, verify checks names only
        odd = _all("any", export="any")
        choices += [
            ("", _all("any", export="refuse", report="any")),
            (5, _all("any", export="refuse")),
            (None, _all("any", export="refuse")),
            (["x"], _all("any", export="refuse")),
            ("w\ud800" + src, odd),
            (src + "\u0000", odd),
            ("\u001b]0;x\u0007" + src, odd),
            ("x" * 100_000, odd),
        ]
        value, expect = rng.choice(choices)
        if value == src:
            value, expect = src + ".x", odd
        path = ("experts", i, "tensors", t, "source")
    else:
        tensors = row["tensors"]
        value = rng.choice(
            [
                tensors[:2],
                [*tensors, tensors[0]],
                [],
                [tensors[0], tensors[1], None],
                [tensors[0], tensors[1], "down_proj"],
                {"0": tensors[0]},
                "tensors",
                Raw("[" + ",".join([dump(tensors[0])] * 100_000) + "]"),
            ]
        )
        path = ("experts", i, "tensors")
    doc = _set(base.doc, path, value)
    return Mutation(_text(doc, rng), expect, f"{_where(path)} = {dump(value)[:80]}")


def orientation(rng: random.Random, base: ManifestBase) -> Mutation:
    """``transposed`` and ``dtype`` of a tensor entry: of a wrong type, or another value."""
    i, t = rng.choice(_tensor_paths(base))
    key = rng.choice(["transposed", "dtype"])
    if key == "transposed":
        value: object = rng.choice([1, "true", None, [], True])
    else:
        value = rng.choice(["F8_E4M3", "I32", "bf16", "", 16, None, "F16", "F32"])
    path = ("experts", i, "tensors", t, key)
    if value is None:  # absent and null both mean "not recorded": the default
        return Mutation(
            _text(_set(base.doc, path, None), rng), _all("any"), f"{_where(path)} = null"
        )
    if value is True or value in ("F16", "F32"):
        # a valid value for one entry, contradicting the tensor's other entries: refused by
        # export --hf, or (all agreeing) an output of that orientation/dtype; upgrade copies
        expect = _all("any", verify="any")
    else:
        expect = _all("any", export="refuse")
    return Mutation(
        _text(_set(base.doc, path, value), rng), expect, f"{_where(path)} = {dump(value)}"
    )


INFORMATIVE_STRINGS = ["x", "", "caf\u00e9", "a.smoe", "\U0001f600", " ", "model.smoe"]
ODD_STRINGS = ["\ud800", "a\udc00b", "\u0000", "\u001b[31m", "line\nbreak", "x" * 100_000]


def informative(rng: random.Random, base: ManifestBase) -> Mutation:
    """A field no check can contradict given another value of its type (or deleted): the
    vault's name and bits, the tool, the provenance, an SNR, a source CRC-32C."""
    paths: list[tuple] = [
        ("vault", "name"),
        ("vault", "bits"),
        ("tool",),
        ("tool", "version"),
        ("tool", "command"),
        ("source",),
        ("source", "model_type"),
    ]
    for i, t in _tensor_paths(base):
        paths += [
            ("experts", i, "tensors", t, "snr_db"),
            ("experts", i, "tensors", t, "source_crc32c"),
        ]
    path = rng.choice(paths)
    old = _get(base.doc, path)
    delete = rng.random() < 0.2
    if path[-1] == "snr_db":
        value: object = rng.choice([0.0, 12.5, -3.25, 99.0, 1e300, None, 20, 5e-324, -0.0])
    elif path[-1] == "source_crc32c":
        value = rng.choice([0, U32, (old + 1) % (U32 + 1)])
    elif path[-1] == "bits":
        value = 2 if old == 4 else 4
    elif path in (("tool",), ("source",)):
        value = rng.choice([None, {}, {"model_type": "qwen3_moe"}])
    else:
        value = rng.choice(INFORMATIVE_STRINGS)
    # the page shows the SNR; upgrade --out keeps the provenance, the options, the SNR
    expect = _all("valid", verify="same", export="same")
    if delete:
        doc = _delete(base.doc, path)
        return Mutation(_text(doc, rng), expect, f"{_where(path)} deleted")
    return Mutation(
        _text(_set(base.doc, path, value), rng), expect, f"{_where(path)} = {dump(value)[:60]}"
    )


def odd_value(rng: random.Random, base: ManifestBase) -> Mutation:
    """Extreme or odd values where no check looks: lone surrogates, control characters,
    100,000 characters, 5000-digit and 1e400 numbers, huge integers."""
    paths: list[tuple] = [
        ("vault", "name"),
        ("tool", "version"),
        ("source", "model_type"),
        ("vault", "bits"),
    ]
    for i, t in _tensor_paths(base):
        paths += [
            ("experts", i, "tensors", t, "snr_db"),
            ("experts", i, "tensors", t, "source_crc32c"),
        ]
    path = rng.choice(paths)
    value = rng.choice(
        [
            *ODD_STRINGS,
            Raw("9" * 5000),
            Raw("1e400"),
            Raw("-1e400"),
            2**64,
            -(2**63),
            10**300,
            True,
            [1.5],
            {},
        ]
    )
    return Mutation(
        _text(_set(base.doc, path, value), rng), _all("any"), f"{_where(path)} = {dump(value)[:60]}"
    )


def all_snr(rng: random.Random, base: ManifestBase) -> Mutation:
    """Every SNR of the manifest one extreme value (a report of 1e300 everywhere failed)."""
    value = rng.choice(
        [1e300, -1e300, 1e-300, 0.0, 5e-324, 1.7976931348623157e308, -0.0, 10**300, None]
    )
    rows = copy.deepcopy(base.rows)
    for r in rows:
        for t in r.get("tensors") or []:
            t["snr_db"] = value
    doc = dict(base.doc, experts=rows)
    expect = _all("valid", verify="same", export="same")
    return Mutation(_text(doc, rng), expect, f"every snr_db = {dump(value)[:40]}")


def respell(rng: random.Random, base: ManifestBase) -> Mutation:
    """The same document spelled otherwise: members shuffled, indented or not, floats in
    another notation, ASCII characters of strings as \\u escapes, '/' as '\\/'."""

    def spell(v: object) -> object:
        if isinstance(v, dict):
            return {k: spell(x) for k, x in v.items()}
        if isinstance(v, list):
            return [spell(x) for x in v]
        if isinstance(v, float) and rng.random() < 0.5:
            d = Decimal(repr(v))
            k = rng.choice([-3, -1, 1, 2])
            return Raw(f"{d.scaleb(k)}e{-k}" if "E" not in str(d.scaleb(k)) else repr(v))
        if isinstance(v, str) and rng.random() < 0.3:
            return Raw('"' + "".join(f"\\u{ord(c):04x}" if c.isascii() else c for c in v) + '"')
        if isinstance(v, str) and "/" in v:
            return Raw(json.dumps(v).replace("/", "\\/"))
        return v

    doc = spell(base.doc)
    text = pretty(doc, rng.choice([None, 1, 2, 4, 8]), rng) + rng.choice(["", "\n", " \r\n\t"])
    # upgrade --out rebuilds its manifest: the same bytes; tensors are copied, re-encoded
    return Mutation(text.encode(), _all("same"), "the same document respelled")


def unknown_keys(rng: random.Random, base: ManifestBase) -> Mutation:
    """A key no reader knows (readers must ignore them), at any level, any value."""
    places: list[tuple] = [(), ("vault",), ("tool",), ("source",)]
    places += [("experts", i) for i in range(len(base.rows))]
    places += [("experts", i, "tensors", t) for i, t in _tensor_paths(base)]
    place = rng.choice(places)
    value, verdict = rng.choice(
        [
            (None, "same"),
            ("x", "same"),
            ([1, {"a": [None, 2.5]}], "same"),
            ({"deep": {"er": {"est": [1]}}}, "same"),
            ("\ud800", "any"),
            (Raw("1e400"), "any"),
            (Raw("9" * 5000), "any"),  # beyond Python's int limit: refused or ignored
            (Raw("NaN"), "refuse"),  # not JSON, wherever it is
            (Raw("-Infinity"), "refuse"),
            (Raw("[" * 20 + "]" * 20), "refuse"),  # deeper than 16 levels
            (Raw("[" * 100_000 + "]" * 100_000), "refuse"),
        ]
    )
    doc = copy.deepcopy(base.doc)
    _get(doc, place)["fuzz_unknown_key"] = value
    expect = _all(verdict)
    if verdict == "same" and len(place) == 4:  # in the tensors upgrade --out copies
        expect["upgrade"] = "valid"
    where = _where(place) or "top level"
    return Mutation(_text(doc, rng), expect, f"{where}: fuzz_unknown_key = {dump(value)[:40]}")


def duplicate_key(rng: random.Random, base: ManifestBase) -> Mutation:
    """A checked key written twice in its object (the last one is what json.loads keeps)."""
    path, top = rng.choice([*_checked_paths(base), (("schema",), 0), (("checksum",), 0)])
    old = _get(base.doc, path)
    wrong = rng.choice(wrong_ints(rng, old, top)) if isinstance(old, int) else "other"
    order = rng.choice(["valid-then-wrong", "wrong-then-valid", "same-twice"])
    first, last = {
        "valid-then-wrong": (old, wrong),
        "wrong-then-valid": (wrong, old),
        "same-twice": (old, old),
    }[order]
    doc = copy.deepcopy(base.doc)
    parent = _get(doc, path[:-1])
    items = [(k, v) for k, v in parent.items() if k != path[-1]]
    at = rng.randrange(len(items) + 1)
    items[at:at] = [(path[-1], first), (path[-1], last)]
    pairs = Pairs(tuple(items))
    text: object = pairs
    if len(path) > 1:
        _get(doc, path[:-2])[path[-2]] = pairs
        text = doc
    verdict = "refuse" if order == "valid-then-wrong" else "any"
    return Mutation(
        _text(text, rng),
        _all(verdict),
        f"{_where(path)} twice ({order}: {dump(first)[:30]}, {dump(last)[:30]})",
    )


def whole_file(rng: random.Random, base: ManifestBase) -> Mutation:
    """Not UTF-8, not JSON, not an object, cut short, too big, not a regular file."""
    body = base.raw
    cut = rng.randrange(1, len(body) - 1)
    how = rng.choice(
        [
            "bad-utf8",
            "raw-surrogate",
            "raw-control",
            "not-object",
            "truncated",
            "empty",
            "trailing-comma",
            "trailing-garbage",
            "two-documents",
            "single-quotes",
            "comment",
            "bom",
            "nul-tail",
            "oversized",
            "special",
        ]
    )
    if how == "bad-utf8":
        at = body.index(b'"', cut) + 1 if b'"' in body[cut:] else 1
        raw = body[:at] + rng.choice([b"\xff", b"\xc3(", b"\xe2\x82", b"\xc0\xaf"]) + body[at:]
    elif how == "raw-surrogate":
        raw = body.replace(b'"', b'"\xed\xa0\x80', 1)
    elif how == "raw-control":  # an unescaped control character in a string
        raw = body.replace(b'"', b'"\x01', 1)
    elif how == "not-object":
        raw = rng.choice([b"[]", b'"manifest"', b"1", b"null", b"true", b"[" + body + b"]"])
    elif how == "truncated":
        raw = body[:cut]
    elif how == "empty":
        raw = rng.choice([b"", b" \n"])
    elif how == "trailing-comma":
        raw = body.rstrip()[:-1] + b",}"
    elif how == "trailing-garbage":
        raw = body + rng.choice([b"x", b"}", b"\x00", b"[]"])
    elif how == "two-documents":
        raw = body + body
    elif how == "single-quotes":
        raw = body.replace(b'"', b"'")
    elif how == "comment":
        raw = b"// a comment\n" + body
    elif how == "bom":
        return Mutation(b"\xef\xbb\xbf" + body, _all("any"), "a UTF-8 byte order mark first")
    elif how == "nul-tail":  # a crash left the file longer than what was written
        return Mutation(body, _all("refuse"), "a sparse NUL tail of 1 GiB", special="tail")
    elif how == "oversized":  # valid JSON beyond the bound (64 MiB + 4 KiB per entry)
        pad = b" " * (64 * 2**20 + 4096 * len(base.rows) + 1)
        return Mutation(body[:1] + pad + body[1:], _all("refuse"), "valid JSON of 64 MiB + 1 byte")
    else:
        kind = rng.choice(["fifo", "dir", "devzero", "devnull", "selflink"])
        return Mutation(None, _all("refuse"), f"the manifest is a {kind}", special=kind)
    return Mutation(raw, _all("refuse"), how)


MANIFEST_MUTATORS: dict[str, Callable[[random.Random, ManifestBase], Mutation]] = {
    f.__name__: f
    for f in (
        checked_value,
        schema_checksum,
        rows_array,
        permute_sources,
        source_fields,
        orientation,
        informative,
        odd_value,
        all_snr,
        respell,
        unknown_keys,
        duplicate_key,
        whole_file,
    )
}
MANIFEST_WEIGHTS = {
    "checked_value": 4,
    "schema_checksum": 1,
    "rows_array": 2,
    "permute_sources": 3,
    "source_fields": 3,
    "orientation": 1,
    "informative": 2,
    "odd_value": 2,
    "all_snr": 1,
    "respell": 2,
    "unknown_keys": 2,
    "duplicate_key": 1,
    "whole_file": 3,
}


# ---- the journal ---------------------------------------------------------------------------
@dataclass(frozen=True)
class JournalBase:
    """An interrupted sculpt: its journal (header and lines) and, for every planned expert,
    the line a finished run writes and the size of its blob."""

    header: bytes
    lines: list[bytes]  # as journaled (a prefix of the run's experts)
    full: dict[tuple[int, int], bytes]  # every expert's line from a run that did them all
    raw_sizes: dict[tuple[int, int], int]

    def journaled(self) -> list[tuple[int, int]]:
        return [_key(line) for line in self.lines]

    def pending(self) -> list[tuple[int, int]]:
        done = set(self.journaled())
        return [k for k in sorted(self.full) if k not in done]


def _key(line: bytes) -> tuple[int, int]:
    a, b = line.split(b" ")[:2]
    return int(a), int(b)


def _fields(line: bytes) -> list[bytes]:
    return line.rstrip(b"\n").split(b" ")


def _line(fields: list[bytes]) -> bytes:
    return b" ".join(fields) + b"\n"


def crc32c_zeros(n: int) -> int:
    from smoe.format.manifest import checksum

    return checksum(bytes(n))


def _journal(base: JournalBase, lines: list[bytes], header: bytes | None = None) -> bytes:
    return (base.header if header is None else header) + b"".join(lines)


RESUME = {"resume": "same"}  # a journal only saves work: the result is a fresh run's


def forge_line(rng: random.Random, base: JournalBase) -> Mutation:
    """A line for an expert the partial does not hold: the CRC of its zero bytes with the
    real source CRCs and SNRs (issue 23, case 6), or the very line a later run writes."""
    key = rng.choice(base.pending())
    fields = _fields(base.full[key])
    how = rng.choice(["zero-crc", "future-line", "zero-crc-weighted"])
    if how != "future-line":
        fields[2] = str(crc32c_zeros(base.raw_sizes[key])).encode()
    if how == "zero-crc-weighted":
        fields += fields[6:9]
    lines = list(base.lines)
    lines.insert(rng.randrange(len(lines) + 1), _line(fields))
    return Mutation(_journal(base, lines), RESUME, f"{how} line for pending expert {key}")


def edit_line(rng: random.Random, base: JournalBase) -> Mutation:
    """One journaled line's field edited: an SNR (99.5, nan, inf, 1e308, -), a CRC (another,
    out of range, 5000 digits), the layer or expert (out of range, another's)."""
    i = rng.randrange(len(base.lines))
    fields = _fields(base.lines[i])
    f = rng.randrange(len(fields))
    if f >= 6:
        value = rng.choice(
            [b"99.5", b"nan", b"inf", b"-inf", b"1e308", b"-", b"0", b"1_0", b"-0.0", b"NaN"]
        )
    else:
        old = int(fields[f])
        value = rng.choice(
            [
                str(old + 1).encode(),
                b"0",
                str(2**32 - 1).encode(),
                str(2**32).encode(),
                str(10**30).encode(),
                b"9" * 5000,
                b"-1",
                b"+1",
                b"1.0",
                b"0x10",
                "\uff11".encode(),  # a fullwidth digit
                b"",
            ]
        )
    if value == fields[f]:
        value = b"x" + value
    fields[f] = value
    lines = list(base.lines)
    lines[i] = _line(fields)
    if len(value) > 1000:  # within the bound the journal is read to: put it first
        lines.insert(0, lines.pop(i))
    return Mutation(_journal(base, lines), RESUME, f"line {i} field {f} = {value[:40]!r}")


def field_count(rng: random.Random, base: JournalBase) -> Mutation:
    """A line with fields dropped or added (9 and 12 are the two valid counts)."""
    i = rng.randrange(len(base.lines))
    fields = _fields(base.lines[i])
    how = rng.choice(["drop", "add", "weighted", "empty-field", "tabs", "crlf", "trailing-space"])
    raw: bytes
    if how == "drop":
        del fields[rng.randrange(len(fields))]
        raw = _line(fields)
    elif how == "add":
        fields.insert(rng.randrange(len(fields) + 1), rng.choice([b"0", b"1.5", b"-"]))
        raw = _line(fields)
    elif how == "weighted":  # the weighted SNRs of a run without an importance matrix
        raw = _line(fields + fields[6:9])
    elif how == "empty-field":
        fields.insert(rng.randrange(1, len(fields)), b"")
        raw = _line(fields)
    elif how == "tabs":
        raw = b"\t".join(fields) + b"\n"
    elif how == "crlf":
        raw = _line(fields)[:-1] + b"\r\n"
    else:
        raw = _line(fields)[:-1] + b" \n"
    lines = list(base.lines)
    lines[i] = raw
    return Mutation(_journal(base, lines), RESUME, f"line {i}: {how}")


def permute_lines(rng: random.Random, base: JournalBase) -> Mutation:
    """Lines reordered, duplicated, or two experts' keys exchanged (a line describing one
    expert's blob under another's name)."""
    lines = list(base.lines)
    how = rng.choice(["shuffle", "duplicate", "swap-keys", "later-wins", "all-future"])
    i, j = rng.sample(range(len(lines)), 2)
    if how == "shuffle":
        rng.shuffle(lines)
    elif how == "duplicate":
        lines.insert(j, lines[i])
    elif how == "swap-keys":
        a, b = _fields(lines[i]), _fields(lines[j])
        a[:2], b[:2] = b[:2], a[:2]
        lines[i], lines[j] = _line(a), _line(b)
    elif how == "later-wins":  # a second, edited line for the same expert
        fields = _fields(lines[i])
        fields[6] = b"99.5"
        lines.append(_line(fields))
    else:  # every expert's finished line: the partial holds only the first ones
        lines = [base.full[k] for k in sorted(base.full)]
    return Mutation(_journal(base, lines), RESUME, f"lines: {how} ({i}, {j})")


def damage(rng: random.Random, base: JournalBase) -> Mutation:
    """What a crash or a disk leaves: a NUL tail (sparse, 1 GiB), NULs over a line, a cut
    line, a very long line, bytes that are not ASCII, an edited or missing header."""
    lines = list(base.lines)
    i = rng.randrange(len(lines))
    how = rng.choice(
        [
            "nul-tail",
            "nul-line",
            "cut",
            "long-line",
            "non-ascii",
            "fingerprint",
            "magic",
            "no-header",
            "empty",
            "header-only",
            "no-newline",
            "special",
        ]
    )
    header = None
    if how == "nul-tail":
        return Mutation(_journal(base, lines), RESUME, "a sparse NUL tail of 1 GiB", special="tail")
    if how == "nul-line":
        lines[i] = bytes(len(lines[i]) - 1) + b"\n"
    elif how == "cut":
        lines = [*lines[:i], lines[i][: rng.randrange(1, len(lines[i]))]]
    elif how == "long-line":
        lines.insert(i, rng.choice([b"0 " * 50_000, b"x" * 2_000_000, b"1" * 10_000]) + b"\n")
    elif how == "non-ascii":
        bad = rng.choice([b"\xff", b"\xed\xa0\x80", "\u0663".encode(), b"\x00"])
        fields = _fields(lines[i])
        f = rng.randrange(len(fields))
        fields[f] = fields[f][:1] + bad + fields[f][1:]
        lines[i] = _line(fields)
    elif how == "fingerprint":
        fp = bytearray(base.header)
        at = len(fp) - 2 - rng.randrange(64)
        fp[at] = ord("0") if fp[at] != ord("0") else ord("1")
        header = bytes(fp)
    elif how == "magic":
        header = base.header.replace(
            b"smoe-journal/2", rng.choice([b"smoe-journal/1", b"smoe-journal/3", b"SMOE"])
        )
    elif how == "no-header":
        header = b""
    elif how == "empty":
        header, lines = b"", []
    elif how == "header-only":
        lines = []
    elif how == "no-newline":
        lines[-1] = lines[-1].rstrip(b"\n")
    else:
        kind = rng.choice(["fifo", "dir", "devzero", "devnull", "selflink"])
        return Mutation(None, {"resume": "any"}, f"the journal is a {kind}", special=kind)
    return Mutation(_journal(base, lines, header), RESUME, f"{how} (line {i})")


JOURNAL_MUTATORS: dict[str, Callable[[random.Random, JournalBase], Mutation]] = {
    f.__name__: f for f in (forge_line, edit_line, field_count, permute_lines, damage)
}
JOURNAL_WEIGHTS = {
    "forge_line": 3,
    "edit_line": 4,
    "field_count": 2,
    "permute_lines": 2,
    "damage": 3,
}


# ---- the importance matrix: GGUF -----------------------------------------------------------
VT = {
    "u8": 0,
    "i8": 1,
    "u16": 2,
    "i16": 3,
    "u32": 4,
    "i32": 5,
    "f32": 6,
    "bool": 7,
    "str": 8,
    "arr": 9,
    "u64": 10,
    "i64": 11,
    "f64": 12,
}
SCALAR = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<B",
    10: "<Q",
    11: "<q",
    12: "<d",
}
F32, F16, I32 = 0, 1, 26


@dataclass(frozen=True)
class Field:
    """A number in the built file: what it is, where, how it is packed, its value."""

    kind: str  # a key of KIND_CLASS (n_tensors, str_len, dim, ttype, offset, ...)
    where: str
    at: int
    fmt: str
    value: int


@dataclass
class Kv:
    key: str
    vtype: int
    value: Any
    sub: int | None = None  # the item type of an array


@dataclass
class Tensor:
    name: str
    ne: tuple[int, ...]
    data: bytes
    ttype: int = F32


@dataclass
class GgufFile:
    """A GGUF file as llama-imatrix writes one, built field by field (``build``)."""

    kvs: list[Kv]
    tensors: list[Tensor]
    version: int = 3
    alignment: int = 32

    def build(self) -> tuple[bytes, list[Field]]:
        out = bytearray(b"GGUF")
        fields: list[Field] = []

        def num(kind: str, where: str, fmt: str, value: int | float) -> None:
            if kind:
                fields.append(Field(kind, where, len(out), fmt, int(value)))
            out.extend(struct.pack(fmt, value))

        def string(kind: str, where: str, s: str | bytes) -> None:
            raw = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
            num(kind, where, "<Q", len(raw))
            out.extend(raw)

        def value(where: str, vtype: int, v: Any, sub: int | None) -> None:
            if vtype == VT["str"]:
                string("str_len", where, v)
            elif vtype == VT["arr"]:
                assert sub is not None
                num("arr_type", where, "<I", sub)
                num("arr_len", where, "<Q", len(v))
                for j, x in enumerate(v):
                    value(f"{where}[{j}]", sub, x, None)
            else:
                num("", where, SCALAR[vtype], v)

        num("version", "version", "<I", self.version)
        num("n_tensors", "tensor count", "<Q", len(self.tensors))
        num("n_kv", "key-value count", "<Q", len(self.kvs))
        for kv in self.kvs:
            string("key_len", kv.key, kv.key)
            num("vtype", kv.key, "<I", kv.vtype)
            value(kv.key, kv.vtype, kv.value, kv.sub)
        offset = 0
        for t in self.tensors:
            string("name_len", t.name, t.name)
            num("n_dims", t.name, "<I", len(t.ne))
            for j, d in enumerate(t.ne):
                num("dim", f"{t.name} ne[{j}]", "<Q", d)
            num("ttype", t.name, "<I", t.ttype)
            num("offset", t.name, "<Q", offset)
            offset += -(-len(t.data) // self.alignment) * self.alignment
        out.extend(bytes(-len(out) % self.alignment))
        for t in self.tensors:
            out.extend(t.data)
            out.extend(bytes(-len(t.data) % self.alignment))
        return bytes(out), fields

    def bytes(self) -> bytes:
        return self.build()[0]

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def copy(self) -> GgufFile:
        return copy.deepcopy(self)


def imatrix_gguf(
    entries: dict[str, tuple[np.ndarray, np.ndarray]], datasets: list[str]
) -> GgufFile:
    """llama-imatrix's GGUF: general.type, the dataset names, chunk count and size; per
    weight (in name order) ``in_sum2`` ne [cols, n_mat], ``counts`` ne [1, n_mat], ``in_sum``."""
    kvs = [
        Kv("general.type", VT["str"], "imatrix"),
        Kv("imatrix.datasets", VT["arr"], datasets, VT["str"]),
        Kv("imatrix.chunk_count", VT["u32"], 10),
        Kv("imatrix.chunk_size", VT["u32"], 512),
    ]
    tensors = []
    for name, (sums, counts) in sorted(entries.items()):
        n_mat, cols = sums.shape
        tensors.append(Tensor(f"{name}.in_sum2", (cols, n_mat), sums.astype("<f4").tobytes()))
        tensors.append(Tensor(f"{name}.counts", (1, n_mat), counts.astype("<f4").tobytes()))
        tensors.append(Tensor(f"{name}.in_sum", (cols, n_mat), (sums / 2).astype("<f4").tobytes()))
    return GgufFile(kvs, tensors)


@dataclass
class DatEntry:
    name: str
    ncall: int
    values: np.ndarray  # float32: mean(x^2) * ncall


@dataclass
class DatFile:
    """A legacy ``.dat`` importance matrix, built field by field (``build``)."""

    entries: list[DatEntry]
    chunk_count: int | None = 10
    dataset: bytes | None = b"calibration.txt"

    def build(self) -> tuple[bytes, list[Field]]:
        out = bytearray()
        fields: list[Field] = []

        def i32(kind: str, where: str, v: int) -> None:
            fields.append(Field(kind, where, len(out), "<i", v))
            out.extend(struct.pack("<i", v))

        i32("n", "entry count", len(self.entries))
        for e in self.entries:
            raw = e.name.encode("utf-8", "surrogatepass")
            i32("name_len", e.name, len(raw))
            out.extend(raw)
            i32("ncall", e.name, e.ncall)
            i32("nval", e.name, e.values.size)
            out.extend(e.values.astype("<f4").tobytes())
        if self.chunk_count is not None:
            i32("chunk_count", "chunk count", self.chunk_count)
            if self.dataset is not None:
                i32("ds_len", "dataset name", len(self.dataset))
                out.extend(self.dataset)
        return bytes(out), fields

    def bytes(self) -> bytes:
        return self.build()[0]

    def copy(self) -> DatFile:
        return copy.deepcopy(self)


@dataclass(frozen=True)
class ImatrixBase:
    """An importance matrix of a checkpoint, GGUF or legacy, as its structure."""

    form: GgufFile | DatFile
    experts: int  # per layer

    @property
    def gguf(self) -> bool:
        return isinstance(self.form, GgufFile)


LIE: dict[str, list[int | str]] = {  # "-1" / "+1": the true value off by one
    "version": [1, 2, 4, 0, 0x03000000, 2**32 - 1],
    "count": [2**64 - 1, 2**63, 2**32, (1 << 30) + 1, 10**6, "-1", "+1", 0],
    "length": [2**64 - 1, 2**63, (1 << 30) + 1, 1 << 30, 10**6, "-1", "+1", 0],
    "type": [99, 2**32 - 1, 13, "-1", "+1"],
}
KIND_CLASS = {
    "version": "version",
    "n_tensors": "count",
    "n_kv": "count",
    "arr_len": "count",
    "n_dims": "count",
    "dim": "count",
    "n": "count",
    "nval": "count",
    "key_len": "length",
    "str_len": "length",
    "name_len": "length",
    "ds_len": "length",
    "offset": "length",
    "vtype": "type",
    "arr_type": "type",
    "ttype": "type",
}


def _packed(f: Field, value: int) -> int:
    """``value`` as the field's packing stores it (wrapped to its width and sign)."""
    bits = 8 * struct.calcsize(f.fmt)
    value %= 2**bits
    if f.fmt[-1].islower() and value >= 2 ** (bits - 1):  # signed
        value -= 2**bits
    return value


def _patch(raw: bytes, f: Field, value: int) -> bytes:
    size = struct.calcsize(f.fmt)
    return raw[: f.at] + struct.pack(f.fmt, _packed(f, value)) + raw[f.at + size :]


def field_lie(rng: random.Random, base: ImatrixBase) -> Mutation:
    """A count, length, type, offset or version in the file lies (huge, off by one, zero,
    negative): the rest no longer parses as what it is."""
    raw, fields = base.form.build()
    f = rng.choice([f for f in fields if f.kind in KIND_CLASS])
    pick = rng.choice(LIE[KIND_CLASS[f.kind]])
    value = _packed(f, f.value + int(pick) if isinstance(pick, str) else pick)
    if value == f.value:
        value = _packed(f, f.value + 2)
    # GGUF 2 is read as 3 (the same layout for little-endian files)
    expect = "same" if f.kind == "version" and value == 2 else "refuse"
    return Mutation(
        _patch(raw, f, value),
        {"imatrix": expect},
        f"{f.kind} of {f.where} at offset {f.at}: {f.value} -> {value}",
    )


def _values_of(base: ImatrixBase, experts_only: bool = False) -> list[tuple[str, np.ndarray]]:
    """(name, float32 values) of every in_sum2 (GGUF) or entry (legacy); ``experts_only``:
    of the routed experts' weights only."""
    if isinstance(base.form, GgufFile):
        out = [
            (t.name, np.frombuffer(t.data, "<f4"))
            for t in base.form.tensors
            if t.name.endswith(".in_sum2")
        ]
    else:
        out = [(e.name, e.values) for e in base.form.entries]
    return [(n, v) for n, v in out if "_exps." in n or not experts_only]


def _with_values(base: ImatrixBase, name: str, values: np.ndarray) -> GgufFile | DatFile:
    form = base.form.copy()
    if isinstance(form, GgufFile):
        form.tensor(name).data = values.astype("<f4").tobytes()
    else:
        next(e for e in form.entries if e.name == name).values = values.astype(np.float32)
    return form


def _mutation(form: GgufFile | DatFile, expect: str, what: str) -> Mutation:
    return Mutation(form.bytes(), {"imatrix": expect}, what, form=form)


def bad_value(rng: random.Random, base: ImatrixBase) -> Mutation:
    """A sum that is NaN, infinite or negative; a count that is not a whole number >= 0
    (legacy: an ncall below 0)."""
    name, values = rng.choice(_values_of(base))
    form = base.form.copy()
    if isinstance(form, GgufFile) and rng.random() < 0.4:
        cname = name.replace(".in_sum2", ".counts")
        c = np.frombuffer(form.tensor(cname).data, "<f4").copy()
        i = rng.randrange(c.size)
        c[i] = rng.choice([np.nan, -1.0, 1.5, np.inf, 0.25, -0.5])
        form.tensor(cname).data = c.tobytes()
        return _mutation(form, "refuse", f"{cname}[{i}] = {c[i]}")
    if isinstance(form, DatFile) and rng.random() < 0.3:
        e = rng.choice(form.entries)
        e.ncall = rng.choice([-1, -(2**31)])
        return _mutation(form, "refuse", f"{e.name}: ncall {e.ncall}")
    v = values.copy()
    i = rng.randrange(v.size)
    v[i] = rng.choice([np.nan, np.inf, -np.inf, -1.0, -1e-45, -3e38])
    return _mutation(_with_values(base, name, v), "refuse", f"{name}[{i}] = {v[i]}")


def same_importance(rng: random.Random, base: ImatrixBase) -> Mutation:
    """The same importance written otherwise: sums and counts scaled by one power of two
    (importance = sum / count, exactly the same), the unused in_sum changed or dropped, the
    dataset names, chunk count and size changed, keys or tensors reordered, an unknown key,
    a dense weight more, another alignment, the optional trailer of a legacy file dropped."""
    form = base.form.copy()
    hows = ["scale", "datasets", "chunks", "dense"]
    if isinstance(form, GgufFile):
        hows += ["in_sum", "reorder-keys", "unknown-key", "alignment", "no-in_sum"]
        hows += ["reorder-tensors"]
    else:
        hows += ["no-trailer", "reorder-entries"]
    how = rng.choice(hows)
    if isinstance(form, GgufFile):
        if how == "scale":
            k = np.float32(rng.choice([2.0, 4.0]))
            for t in form.tensors:
                if t.name.endswith((".in_sum2", ".counts")):
                    t.data = (np.frombuffer(t.data, "<f4") * k).astype("<f4").tobytes()
        elif how == "datasets":
            names = rng.choice(
                [[], ["a.txt", "b.txt"], ["\u00e9\u00e8"], ["x" * 10000], ["\ud800"]]
            )
            form.kvs[1] = Kv("imatrix.datasets", VT["arr"], names, VT["str"])
        elif how == "chunks":
            form.kvs[2].value = rng.choice([0, 1, 2**32 - 1])
            form.kvs[3].value = rng.choice([0, 1, 2**32 - 1])
        elif how == "in_sum":
            for t in form.tensors:
                if t.name.endswith(".in_sum"):
                    t.data = np.full(len(t.data) // 4, -1e30, "<f4").tobytes()
        elif how == "reorder-keys":
            rng.shuffle(form.kvs)
        elif how == "unknown-key":
            kv = rng.choice(
                [
                    Kv("fuzz.u8s", VT["arr"], [1] * 100_000, VT["u8"]),
                    Kv("fuzz.f64", VT["f64"], float("nan")),
                    Kv("fuzz.str", VT["str"], "\ud800\u0000"),
                    Kv("fuzz.bool", VT["bool"], 7),
                    Kv("fuzz.strs", VT["arr"], ["a"] * 1000, VT["str"]),
                ]
            )
            form.kvs.insert(rng.randrange(len(form.kvs) + 1), kv)
            how += f" {kv.key}"
        elif how == "alignment":
            form.alignment = rng.choice([8, 64, 4096])
            form.kvs.append(Kv("general.alignment", VT["u32"], form.alignment))
            how += f" {form.alignment}"
        elif how == "no-in_sum":
            form.tensors = [t for t in form.tensors if not t.name.endswith(".in_sum")]
        elif how == "reorder-tensors":
            rng.shuffle(form.tensors)
        else:  # dense
            ones = np.ones(64, "<f4").tobytes()
            form.tensors += [
                Tensor("blk.9.attn_k.weight.in_sum2", (64, 1), ones),
                Tensor("blk.9.attn_k.weight.counts", (1, 1), np.ones(1, "<f4").tobytes()),
            ]
    else:
        if how == "scale":
            for e in form.entries:
                e.values = (e.values * np.float32(2.0)).astype(np.float32)
                e.ncall *= 2
        elif how == "datasets":
            form.dataset = rng.choice([b"", b"a.txt", b"\xff\xfe", b"x" * 10000, b"a\x00b"])
        elif how == "chunks":
            form.chunk_count = rng.choice([0, 1, 2**31 - 1])
        elif how == "no-trailer":
            form.dataset = None
            if rng.random() < 0.5:
                form.chunk_count = None
        elif how == "reorder-entries":
            rng.shuffle(form.entries)
        else:  # dense
            form.entries.append(DatEntry("blk.9.attn_k.weight", 3, np.ones(64, np.float32)))
    return _mutation(form, "same", f"the same importance: {how}")


def other_importance(rng: random.Random, base: ImatrixBase) -> Mutation:
    """Other valid importance: an expert's count 0 or its row all zero (then quantised
    unweighted), an extreme range (raised to the bound, with a warning: issue 23, case 8),
    one weight's entry missing, values near float32's limits."""
    name, values = rng.choice(_values_of(base, experts_only=True))
    v = values.copy()
    how = rng.choice(["range", "tiny", "huge", "zero-row", "missing", "count-zero", "denormal"])
    cols = v.size // base.experts
    e = rng.randrange(base.experts)
    form = base.form.copy()
    if how == "missing":
        if isinstance(form, GgufFile):
            stem = name[: -len(".in_sum2")]
            form.tensors = [t for t in form.tensors if not t.name.startswith(stem + ".")]
        else:
            form.entries = [x for x in form.entries if x.name != name]
        return _mutation(form, "valid", f"{name}: no entry")
    if how == "count-zero":
        if isinstance(form, GgufFile):
            cname = name.replace(".in_sum2", ".counts")
            c = np.frombuffer(form.tensor(cname).data, "<f4").copy()
            c[e] = 0
            form.tensor(cname).data = c.tobytes()
        else:
            next(x for x in form.entries if x.name == name).ncall = 0
        return _mutation(form, "valid", f"{name}: expert {e} count 0")
    if how == "range":
        v[e * cols : (e + 1) * cols] = np.float32(1e-30)
        v[e * cols + rng.randrange(cols)] = np.float32(3e38)
    elif how == "tiny":
        v = (v * np.float32(1e-35)).astype(np.float32)
    elif how == "huge":
        v = np.minimum(v.astype(np.float64) * 1e34, 3e38).astype(np.float32)
    elif how == "denormal":
        v[e * cols : (e + 1) * cols] = np.float32(1e-45) * np.arange(1, cols + 1, dtype=np.float32)
    else:  # zero-row
        v[e * cols : (e + 1) * cols] = 0
    return _mutation(_with_values(base, name, v), "valid", f"{name}: {how} (expert {e})")


def structure(rng: random.Random, base: ImatrixBase) -> Mutation:
    """The structure wrong while every number is honest: another model's shapes, a tensor
    not F32, a key missing, twice, of another type or another general.type, a name twice,
    empty or not UTF-8, the file cut short or followed by bytes, not a regular file."""
    form = base.form.copy()
    gguf = isinstance(form, GgufFile)
    hows = ["truncated", "trailing", "special", "cols", "experts", "duplicate-name", "empty-name"]
    hows += ["not-f32", "key-type", "key"] if gguf else ["bad-name", "negative-chunks"]
    how = rng.choice(hows)
    if how in ("truncated", "trailing"):
        raw = form.bytes()
        if how == "truncated":
            raw = raw[: rng.randrange(1, len(raw))]
        else:
            raw += rng.choice([b"\x00", b"x" * 7, bytes(4096), bytes(32)])
        return Mutation(raw, {"imatrix": "refuse"}, how)
    if how == "special":
        kind = rng.choice(["fifo", "dir", "devzero", "devnull", "selflink"])
        return Mutation(
            None, {"imatrix": "refuse"}, f"the importance matrix is a {kind}", special=kind
        )
    if isinstance(form, GgufFile):
        t = rng.choice(
            [
                x
                for x in form.tensors
                if x.name.endswith((".in_sum2", ".counts")) and "_exps" in x.name
            ]
        )
        stem = t.name.rsplit(".", 1)[0]
        if how == "cols":  # another model: one input channel fewer
            s = form.tensor(stem + ".in_sum2")
            cols, n_mat = s.ne
            arr = np.frombuffer(s.data, "<f4").reshape(n_mat, cols)[:, :-1].copy()
            for x in form.tensors:
                if x.name in (stem + ".in_sum2", stem + ".in_sum"):
                    x.ne, x.data = (cols - 1, n_mat), arr.tobytes()
        elif how == "experts":  # one matrix fewer
            for x in form.tensors:
                if x.name.startswith(stem + "."):
                    per = len(x.data) // x.ne[1]
                    x.ne, x.data = (x.ne[0], x.ne[1] - 1), x.data[:-per]
        elif how == "duplicate-name":
            rng.choice([x for x in form.tensors if x is not t]).name = t.name
        elif how == "empty-name":
            t.name = ""
        elif how == "not-f32":
            t.ttype = rng.choice([F16, I32])
            if t.ttype == F16:
                t.data = np.frombuffer(t.data, "<f4").clip(-6e4, 6e4).astype("<f2").tobytes()
        elif how == "key-type":
            kv = rng.choice(form.kvs)
            kv.vtype, kv.value, kv.sub = rng.choice(
                [
                    (VT["i32"], 5, None),
                    (VT["f32"], 5.0, None),
                    (VT["u64"], 5, None),
                    (VT["str"], "5", None),
                ]
            )
            how += f" {kv.key}"
        else:  # key
            which = rng.choice(["drop", "twice", "general.type"])
            if which == "drop":
                form.kvs.pop(rng.randrange(len(form.kvs)))
            elif which == "twice":
                form.kvs.append(copy.deepcopy(rng.choice(form.kvs)))
            else:
                form.kvs[0].value = rng.choice(["model", "", "IMATRIX", "imatrix\u0000"])
            how += f" {which}"
    else:
        e = rng.choice([x for x in form.entries if "_exps" in x.name])
        if how == "cols":
            e.values = e.values[: -base.experts]
        elif how == "experts":
            e.values = e.values[: -(e.values.size // base.experts)]
        elif how == "duplicate-name":
            rng.choice([x for x in form.entries if x is not e]).name = e.name
        elif how == "empty-name":
            e.name = ""
        elif how == "bad-name":
            e.name += rng.choice(["\u0000", "\udcff"])
        else:
            form.chunk_count = -5
    return Mutation(form.bytes(), {"imatrix": "refuse"}, f"{how}")


IMATRIX_MUTATORS: dict[str, Callable[[random.Random, ImatrixBase], Mutation]] = {
    f.__name__: f for f in (field_lie, bad_value, same_importance, other_importance, structure)
}
IMATRIX_WEIGHTS = {
    "field_lie": 4,
    "bad_value": 2,
    "same_importance": 3,
    "other_importance": 2,
    "structure": 3,
}

_ROLE_ENTRIES = (  # the entries llama.cpp names for each tensor's inputs, in smoe's order
    ("ffn_gate_exps", "ffn_gate_up_exps", "ffn_up_exps"),
    ("ffn_up_exps", "ffn_gate_up_exps", "ffn_gate_exps"),
    ("ffn_down_exps",),
)


def must_weigh(form: GgufFile | DatFile, experts: int) -> set[tuple[int, int, int]]:
    """(layer, expert, tensor) whose importance row is in the file, of a non-zero count and
    not uniform: each must be quantised weighted and record a non-null weighted SNR."""
    rows: dict[str, np.ndarray] = {}
    if isinstance(form, GgufFile):
        for t in form.tensors:
            if t.name.endswith(".in_sum2"):
                stem = t.name[: -len(".in_sum2")]
                counts = next((x for x in form.tensors if x.name == stem + ".counts"), None)
                if counts is None:
                    continue
                c = np.frombuffer(counts.data, "<f4").astype(np.float64)
                s = np.frombuffer(t.data, "<f4").astype(np.float64).reshape(c.size, -1)
                with np.errstate(divide="ignore", invalid="ignore"):
                    rows[stem] = np.where(c[:, None] > 0, s / c[:, None], 0.0)
    else:
        for e in form.entries:
            if e.values.size % experts == 0:
                rows[e.name] = e.values.astype(np.float64).reshape(experts, -1) / (e.ncall or 1)
    out: set[tuple[int, int, int]] = set()
    layers = {int(name.split(".")[1]) for name in rows if name.startswith("blk.")}
    for layer in layers:
        for role, names in enumerate(_ROLE_ENTRIES):
            entry = next(
                (rows[n] for n in (f"blk.{layer}.{x}.weight" for x in names) if n in rows), None
            )
            if entry is None or entry.shape[0] != experts:
                continue
            for x in range(experts):
                row = entry[x]
                if np.all(np.isfinite(row)) and row.max() > 0 and row.max() != row.min():
                    out.add((layer, x, role))
    return out


TABLES: dict[str, tuple[Mapping[str, Callable[[random.Random, Any], Mutation]], dict[str, int]]] = {
    "manifest": (MANIFEST_MUTATORS, MANIFEST_WEIGHTS),
    "journal": (JOURNAL_MUTATORS, JOURNAL_WEIGHTS),
    "imatrix": (IMATRIX_MUTATORS, IMATRIX_WEIGHTS),
}  # each sidecar's mutators and how often each is chosen


def choose(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]
