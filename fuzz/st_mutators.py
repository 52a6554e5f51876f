"""Structure-aware mutations of one safetensors shard (8-byte length, JSON header, data).

The header is parsed into an ordered list of members and written back by hand, so a
mutation can keep a key twice, put raw JSON text (``NaN``, ``1e2``, ``\\ud800``) where a
value goes, or make the length prefix lie. Every mutator is ``(rng, shard) -> (bytes, what)``:
the whole mutated file and a one-line description of the change.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smoe.interop.safetensors_io import DTYPE_SIZES

SIZES = DTYPE_SIZES  # one table of safetensors dtype sizes
HUGE = [2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30]


@dataclass(frozen=True)
class Raw:
    """JSON text written as is (an invalid escape, a number spelling, a bare word)."""

    text: str


@dataclass(frozen=True)
class Pairs:
    """A JSON object as ordered (key, value) members: keys may repeat."""

    items: tuple[tuple[str, object], ...]


def dump(value: object) -> str:
    """``value`` as JSON text; ``Raw`` and ``Pairs`` are written verbatim / member by member."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{dump(v)}" for k, v in value.items) + "}"
    if isinstance(value, dict):
        return dump(Pairs(tuple(value.items())))
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


def assemble(
    header: str | bytes, data: bytes, length: int | None = None, pad: bool = True
) -> bytes:
    """A shard file: length prefix (the true one unless ``length``), header, data."""
    raw = header.encode("utf-8", "surrogatepass") if isinstance(header, str) else header
    if pad:
        raw += b" " * (-len(raw) % 8)
    n = len(raw) if length is None else length
    return struct.pack("<Q", n) + raw + data


@dataclass
class Shard:
    """A parsed shard: header members in file order (``__metadata__`` included), data."""

    items: list[tuple[str, Any]]
    data: bytes

    @classmethod
    def parse(cls, raw: bytes) -> Shard:
        (n,) = struct.unpack("<Q", raw[:8])
        return cls(list(json.loads(raw[8 : 8 + n]).items()), raw[8 + n :])

    def tensors(self) -> list[int]:
        """Indices of the tensor members, in data order."""
        idx = [i for i, (k, _) in enumerate(self.items) if k != "__metadata__"]
        return sorted(idx, key=lambda i: self.entry(i)["data_offsets"][0])

    def entry(self, i: int) -> dict:
        return self.items[i][1]

    def text(self, items: list[tuple[str, object]] | None = None) -> str:
        return dump(Pairs(tuple(self.items if items is None else items)))

    def build(
        self, items: list[tuple[str, object]] | None = None, data: bytes | None = None
    ) -> bytes:
        return assemble(self.text(items), self.data if data is None else data)

    def replace(self, i: int, name: str | None = None, **fields: object) -> list:
        """The members with member i renamed and/or some of its fields replaced."""
        items = list(self.items)
        old_name, entry = items[i]
        items[i] = (old_name if name is None else name, {**entry, **fields})
        return items


Mutator = Callable[[random.Random, Shard], tuple[bytes, str]]


def _pick(rng: random.Random, s: Shard, pred: Callable[[dict], bool] = lambda e: True) -> int:
    choices = [i for i in s.tensors() if pred(s.entry(i))] or s.tensors()
    return rng.choice(choices)


def _nbytes(entry: dict) -> int:
    b, e = entry["data_offsets"]
    return e - b


def offsets_overlap(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    i = _pick(rng, s, lambda e: e["data_offsets"][0] > 0)
    b, e = s.entry(i)["data_offsets"]
    k = rng.randint(1, max(1, min(b, 64) if rng.random() < 0.7 else b))
    new = [b - k, e - k]
    return s.build(
        s.replace(i, data_offsets=new)
    ), f"{s.items[i][0]}: data_offsets {[b, e]} -> {new} (overlaps its predecessor)"


def offsets_hole(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    """k spare bytes before one tensor; every later tensor moves by k (sizes stay right)."""
    i = _pick(rng, s)
    at = s.entry(i)["data_offsets"][0]
    k = rng.choice([1, 2, 7, 8, 64, 4096])
    items = list(s.items)
    for j in s.tensors():
        b, e = s.entry(j)["data_offsets"]
        if b >= at:
            items[j] = (items[j][0], {**s.entry(j), "data_offsets": [b + k, e + k]})
    data = s.data[:at] + bytes(rng.randrange(256) for _ in range(k)) + s.data[at:]
    return s.build(items, data), f"{k}-byte hole before {s.items[i][0]} at data offset {at}"


def offsets_reversed(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    i = _pick(rng, s, lambda e: _nbytes(e) > 0)
    b, e = s.entry(i)["data_offsets"]
    return s.build(s.replace(i, data_offsets=[e, b])), f"{s.items[i][0]}: data_offsets [{e}, {b}]"


def offsets_huge(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    i = _pick(rng, s)
    b, e = s.entry(i)["data_offsets"]
    h = rng.choice([*HUGE, len(s.data) + 1, len(s.data) + 8])
    new = rng.choice([[b, h], [h, h + e - b], [h, e], [b, e + h]])
    return s.build(s.replace(i, data_offsets=new)), f"{s.items[i][0]}: data_offsets {new}"


def offsets_malformed(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    i = _pick(rng, s)
    b, e = s.entry(i)["data_offsets"]
    new = rng.choice(
        [
            [b, e, e],
            [b],
            [],
            f"{b},{e}",
            [float(b), float(e)],
            [-1, e],
            [True, e],
            None,
            {"0": b, "1": e},
            [b, -e],
            [str(b), str(e)],
            [[b], [e]],
            [Raw(f"{b}.0"), e],
            [b, Raw(f"{e}e0")],
            [Raw("-0"), e],
            [b, Raw("NaN")],
        ]
    )
    return s.build(s.replace(i, data_offsets=new)), f"{s.items[i][0]}: data_offsets {dump(new)}"


def shape_mismatch(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    """The shape's element count no longer matches the data_offsets."""
    i = _pick(rng, s)
    shape = list(s.entry(i)["shape"])
    d = rng.randrange(len(shape)) if shape else 0
    choices = [[*shape, 2], shape[1:], [], [0], [*shape, 0]]
    if shape:
        choices += [
            [*shape[:d], shape[d] + 1, *shape[d + 1 :]],
            [*shape[:d], max(shape[d] - 1, 0), *shape[d + 1 :]],
            [*shape[:d], shape[d] * 2, *shape[d + 1 :]],
        ]
    new = rng.choice([c for c in choices if _numel(c) != _numel(shape)] or [[*shape, 2]])
    return s.build(s.replace(i, shape=new)), f"{s.items[i][0]}: shape {shape} -> {new}"


def shape_reshape(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    """Same element count, another shape: valid safetensors (the experts may not fit)."""
    i = _pick(rng, s, lambda e: len(e["shape"]) >= 1)
    shape = list(s.entry(i)["shape"])
    new = rng.choice(
        [
            shape[::-1],
            [_numel(shape)],
            [1, *shape],
            [*shape, 1],
            [_numel(shape), 1],
            [*shape[:-1], 1, shape[-1]] if shape else [1],
        ]
    )
    return s.build(s.replace(i, shape=new)), f"{s.items[i][0]}: shape {shape} -> {new}"


def dims_bad_type(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    i = _pick(rng, s, lambda e: len(e["shape"]) >= 1)
    shape = list(s.entry(i)["shape"])
    d = rng.randrange(len(shape))
    bad = rng.choice(
        [
            -1,
            -shape[d],
            True,
            False,
            float(shape[d]),
            str(shape[d]),
            None,
            2**64,
            2**64 + shape[d],
            [shape[d]],
            Raw(f"{shape[d]}.0"),
            Raw(f"{shape[d]}e0"),
            Raw("NaN"),
            Raw("Infinity"),
            Raw("-0"),
        ]
    )
    new = [*shape[:d], bad, *shape[d + 1 :]]
    if rng.random() < 0.2:  # a product past 2**64 with honest-looking factors
        new = [2**32, 2**32, *shape]
    return s.build(s.replace(i, shape=new)), f"{s.items[i][0]}: shape {dump(new)}"


def dtype_mismatch(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    i = _pick(rng, s)
    old = s.entry(i)["dtype"]
    new = rng.choice([d for d, n in SIZES.items() if n != SIZES.get(old)])
    return s.build(s.replace(i, dtype=new)), f"{s.items[i][0]}: dtype {old} -> {new} (size)"


def dtype_same_size(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    """Another dtype of the same width: valid safetensors, the bytes reinterpreted."""
    i = _pick(rng, s)
    old = s.entry(i)["dtype"]
    new = rng.choice([d for d, n in SIZES.items() if n == SIZES.get(old) and d != old] or [old])
    return s.build(s.replace(i, dtype=new)), f"{s.items[i][0]}: dtype {old} -> {new}"


def dtype_unknown(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    i = _pick(rng, s)
    new = rng.choice(
        [
            "F128",
            "bf16",
            "BF16 ",
            "",
            "F8",
            "F4",
            "F6_E2M3",
            "F8_E8M0",
            "C64",
            "float32",
            "__metadata__",
            None,
            2,
            ["BF16"],
            {"dtype": "BF16"},
            True,
        ]
    )
    return s.build(s.replace(i, dtype=new)), f"{s.items[i][0]}: dtype {dump(new)}"


def duplicate_key(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    """A member given twice in the header text (json.loads alone would keep only the last)."""
    i, j = rng.choice(s.tensors()), rng.choice(s.tensors())
    name = s.items[i][0]
    items = list(s.items)
    how = rng.choice(["exact-next", "exact-end", "other-first", "other-last", "metadata"])
    if how == "exact-next":
        items.insert(i + 1, items[i])
    elif how == "exact-end":
        items.append(items[i])
    elif how == "other-first":
        items.insert(i, (name, s.entry(j)))
    elif how == "other-last":
        items.insert(i + 1, (name, s.entry(j)))
    else:
        items.append(("__metadata__", {"format": "pt"}))
        name = "__metadata__"
    return s.build(items), f"key {name!r} twice ({how})"


NAMES = [
    "",
    "a\ud800",
    "\udc00",
    "\ud800\ud800",
    "x\udfffy",
    "\ud83d\ude00",
    "\u0000",
    "../../outside",
    "/abs",
    "caf\u00e9",
    "model.layers.0.mlp.experts.0",
    " ",
    "a" * 5000,
    "__metadata__ ",
    "model.layers.99999999999999999999.mlp.experts.0.gate_proj.weight",
]


def name_invalid(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    """A tensor renamed: lone surrogates (escaped or raw bytes), empty, odd but valid names."""
    i = _pick(rng, s)
    new = rng.choice(NAMES)
    items = s.replace(i, name=new)
    mode = rng.choice(["escaped", "escaped", "raw"])
    if mode == "escaped":
        return s.build(items), f"{s.items[i][0]} renamed {json.dumps(new)}"
    body = "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{dump(v)}" for k, v in items)
    return assemble(body + "}", s.data), f"{s.items[i][0]} renamed {json.dumps(new)} (raw UTF-8)"


def metadata_types(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    new: object = rng.choice(
        [
            [],
            "pt",
            5,
            None,
            True,
            {"format": 1},
            {"format": None},
            {"a": {"b": "c"}},
            {"a": ["x"]},
            {},
            {"format": "pt", "x": "y"},
            {"\ud800": "x"},
            {"format": "\udc00"},
        ]
    )
    items = [(k, v) for k, v in s.items if k != "__metadata__"]
    items.insert(rng.randrange(len(items) + 1), ("__metadata__", new))
    return s.build(items), f"__metadata__ = {json.dumps(new)}"


def header_length(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    """The length prefix lies (or, honestly, the header is padded to a length not a multiple
    of 8)."""
    text = s.text().encode()
    size = 8 + len(text) + len(s.data)
    how = rng.choice(["lie", "lie", "repad"])
    if how == "repad":
        raw = text + b" " * rng.choice([k for k in range(1, 16) if (len(text) + k) % 8])
        return assemble(raw, s.data, pad=False), f"header padded to {len(raw)} bytes"
    padded = len(text) + (-len(text) % 8)
    n = rng.choice(
        [
            padded + 1,
            padded - 1,
            padded + 8,
            padded - 8,
            size - 8,
            size - 7,
            size,
            0,
            1,
            2,
            7,
            2**63,
            2**64 - 1,
            100_000_001,
            padded + rng.randrange(1, 64),
        ]
    )
    return assemble(text, s.data, length=n), f"length prefix {n} (true {padded}, file {size})"


def data_truncated(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    full = s.build()
    k = rng.choice(
        [1, 2, 7, 8, rng.randint(1, len(s.data)), len(s.data), len(full) - rng.randint(0, 8)]
    )
    return full[: len(full) - k], f"last {k} of {len(full)} bytes cut"


def data_trailing(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    k = rng.choice([1, 2, 8, 4096])
    return s.build() + bytes(rng.randrange(256) for _ in range(k)), f"{k} bytes appended"


def header_flips(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    """1-4 random bytes of the header text changed (flipped bits or JSON punctuation)."""
    raw = bytearray(s.build())
    n = struct.unpack("<Q", raw[:8])[0]
    where = []
    for _ in range(rng.randint(1, 4)):
        p = 8 + rng.randrange(n)
        raw[p] = (
            (raw[p] ^ rng.randint(1, 255))
            if rng.random() < 0.5
            else ord(rng.choice('{}[]":,0123456789-.e \\'))
        )
        where.append(p)
    return bytes(raw), f"header bytes changed at offsets {sorted(where)}"


def header_not_object(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    text = rng.choice(["[]", '"x"', "1", "null", "true", "{}", "[" + s.text() + "]", ""])
    data = rng.choice([s.data, b""])
    return assemble(text, data), f"header {text[:20]!r} with {len(data)} data bytes"


def entry_malformed(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    i = _pick(rng, s)
    name, entry = s.items[i]
    how = rng.choice(
        [
            "list",
            "string",
            "null",
            "number",
            "no-dtype",
            "no-shape",
            "no-offsets",
            "extra-field",
            "empty",
        ]
    )
    new: object = {"list": [], "string": "x", "null": None, "number": 1, "empty": {}}.get(how)
    if how.startswith("no-"):
        drop = {"no-dtype": "dtype", "no-shape": "shape", "no-offsets": "data_offsets"}[how]
        new = {k: v for k, v in entry.items() if k != drop}
    elif how == "extra-field":
        new = {**entry, "extra": rng.choice([1, "x", None, [1]])}
    items = list(s.items)
    items[i] = (name, new)
    return s.build(items), f"{name}: entry {how}"


def header_whitespace(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    text = s.text().encode()
    how = rng.choice(
        [
            "leading-space",
            "leading-newline",
            "bom",
            "nul-pad",
            "tab-pad",
            "trailing-garbage",
            "pretty",
        ]
    )
    raw = {
        "leading-space": b" " + text,
        "leading-newline": b"\n" + text,
        "bom": b"\xef\xbb\xbf" + text,
        "nul-pad": text + b"\x00" * 3,
        "tab-pad": text + b"\t\n\r ",
        "trailing-garbage": text + b"x",
        "pretty": json.dumps(dict(s.items), indent=1).encode(),
    }[how]
    return assemble(raw, s.data), f"header {how}"


def drop_tensor(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    """A tensor and its bytes removed, later offsets moved back: valid safetensors."""
    i = _pick(rng, s)
    b, e = s.entry(i)["data_offsets"]
    items = []
    for j, (k, v) in enumerate(s.items):
        if j == i:
            continue
        if k != "__metadata__" and v["data_offsets"][0] >= e:
            ob, oe = v["data_offsets"]
            v = {**v, "data_offsets": [ob - (e - b), oe - (e - b)]}
        items.append((k, v))
    return s.build(items, s.data[:b] + s.data[e:]), f"{s.items[i][0]} removed"


def swap_offsets(rng: random.Random, s: Shard) -> tuple[bytes, str]:
    """Two tensors of the same byte size swap places: valid safetensors, other values."""
    i = _pick(rng, s)
    same = [j for j in s.tensors() if j != i and _nbytes(s.entry(j)) == _nbytes(s.entry(i))]
    if not same:
        return s.build(), "unchanged (no tensor of the same size)"
    j = rng.choice(same)
    items = s.replace(i, data_offsets=s.entry(j)["data_offsets"])
    items[j] = (items[j][0], {**s.entry(j), "data_offsets": s.entry(i)["data_offsets"]})
    return s.build(items), f"{s.items[i][0]} and {s.items[j][0]} swap data_offsets"


def _numel(shape: list) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


MUTATORS: dict[str, Mutator] = {
    f.__name__: f
    for f in (
        offsets_overlap,
        offsets_hole,
        offsets_reversed,
        offsets_huge,
        offsets_malformed,
        shape_mismatch,
        shape_reshape,
        dims_bad_type,
        dtype_mismatch,
        dtype_same_size,
        dtype_unknown,
        duplicate_key,
        name_invalid,
        metadata_types,
        header_length,
        data_truncated,
        data_trailing,
        header_flips,
        header_not_object,
        entry_malformed,
        header_whitespace,
        drop_tensor,
        swap_offsets,
    )
}
