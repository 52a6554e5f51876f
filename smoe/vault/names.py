"""Which checkpoint tensor each vault tensor becomes: names and layout (``export --hf``'s
and :meth:`Vault.tensor_names <smoe.vault.reader.Vault.tensor_names>`'s).

The sculptor's manifest records, per expert tensor, the checkpoint tensor it came from
(``experts[].tensors[].source``), its expert index in a fused 3-D tensor (``index``) and
its row range in a fused gate/up tensor (``rows``): read back, they give the source's own
names and layout, per expert, Mixtral's ``w1/w3/w2`` or fused ``gate_up_proj``/
``down_proj``. Without a manifest (or one without ``tensors``), the family's standard
per-expert names are used (Mixtral's when the scout has ``block_sparse_moe`` routers or the
arch block says ``mixtral``): transformers loads both forms.

Kept in the vault layer so that the reader names tensors exactly as ``smoe export --hf``
writes them, from one copy of the rules (:mod:`smoe.export.hf.names` re-exports them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, SupportsIndex

import numpy as np

from smoe.errors import FormatError, RefusedInput
from smoe.families.registry import Layout, family_of
from smoe.format import manifest
from smoe.format.manifest import source_fault
from smoe.format.records import model_type_str
from smoe.interop.fp8 import FP8_DTYPES
from smoe.interop.safetensors_io import FLOAT_DTYPES, json_excerpt
from smoe_gen.layout import TENSOR_NAMES

__all__ = [
    "OutTensor",
    "Piece",
    "assemble",
    "expert_layout",
    "family_layout",
    "load_manifest",
    "manifest_layout",
    "natural_key",
]

PER_EXPERT = "model.layers.{L}.mlp.experts.{E}.{role}.weight"
MIXTRAL = "model.layers.{L}.block_sparse_moe.experts.{E}.{role}.weight"
MIXTRAL_ROLES = ("w1", "w3", "w2")  # gate, up, down
MIXTRAL_ROUTER = re.compile(r"^model\.layers\.\d+\.block_sparse_moe\.gate\.weight$")


class _Tensor(Protocol):
    def dequantize(self) -> np.ndarray: ...


class _Expert(Protocol):
    @property
    def tensors(self) -> Sequence[_Tensor]: ...


class VaultLike(Protocol):
    """What the naming rules read of a vault (:class:`smoe.vault.reader.Vault` has it): the
    reader names its tensors by these rules, so they see it through this view and never
    import it.

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as vault:  # a Vault is one
    ...     len(vault), vault.index(1, 3), sorted(family_layout(vault, set(), "olmoe"))[0]
    (8, 7, 'model.layers.0.mlp.experts.0.down_proj.weight')
    """

    @property
    def path(self) -> Path: ...
    @property
    def data(self) -> Any: ...  # len(data): the file's size
    @property
    def header_record(self) -> np.void: ...
    @property
    def arch(self) -> Mapping[str, Any] | None: ...
    @property
    def table(self) -> np.ndarray: ...
    @property
    def descriptors(self) -> np.ndarray: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[tuple[int, int]]: ...
    def index(self, layer: SupportsIndex, expert: SupportsIndex) -> int: ...
    def expert(self, layer: SupportsIndex, expert: SupportsIndex) -> _Expert: ...


@dataclass(frozen=True)
class Piece:
    """One vault tensor's place in an output tensor.

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as vault:
    ...     out = family_layout(vault, set(), "olmoe")
    >>> out["model.layers.1.mlp.experts.2.down_proj.weight"].pieces
    [Piece(key=(1, 2), tensor=2, index=None, rows=(0, 64))]
    """

    key: tuple[int, int]  # (layer, expert) in the vault
    tensor: int  # 0 gate, 1 up, 2 down
    index: int | None  # slab of a 3-D tensor, None for a 2-D one
    rows: tuple[int, int]  # row range [start, stop) within the slab (or the 2-D tensor)


@dataclass
class OutTensor:
    """An expert tensor of the output checkpoint and the vault tensors that fill it.

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as vault:
    ...     out = family_layout(vault, set(), "mixtral")
    >>> o = out["model.layers.0.block_sparse_moe.experts.3.w2.weight"]
    >>> o.shape, len(o.pieces), o.dtype
    ((64, 32), 1, None)
    """

    name: str
    shape: tuple[int, ...]
    pieces: list[Piece] = field(default_factory=list)
    dtype: str | None = None  # the source's safetensors dtype, when the manifest records it
    transposed: bool = False  # a slab holds the pieces' transposes side by side ([E, H, 2I])
    fp8: bool = False  # the manifest records the source as FP8 (dequantised when sculpted)

    @property
    def cols(self) -> int:
        """The width of the vault tensors' rows (the tensor's last dimension, or the one
        before it when transposed).

        >>> OutTensor("model.layers.0.mlp.experts.down_proj", (4, 64, 32)).cols
        32
        """
        return self.shape[-2] if self.transposed else self.shape[-1]


def _shape(vault: VaultLike, key: tuple[int, int], t: int) -> tuple[int, int]:
    d = vault.descriptors[vault.index(*key)][t]
    return int(d["rows"]), int(d["cols"])


def family_layout(vault: VaultLike, scout_names: set[str], model_type: str) -> dict[str, OutTensor]:
    """Standard per-expert names: Mixtral's ``w1/w3/w2`` for the mixtral family (by the
    arch block's model_type or the scout's ``block_sparse_moe`` routers), else
    ``mlp.experts.{E}.{gate,up,down}_proj``.

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as vault:
    ...     names = list(family_layout(vault, set(), "mixtral"))
    >>> len(names), names[:3]  # doctest: +NORMALIZE_WHITESPACE
    (24, ['model.layers.0.block_sparse_moe.experts.0.w1.weight',
          'model.layers.0.block_sparse_moe.experts.0.w3.weight',
          'model.layers.0.block_sparse_moe.experts.0.w2.weight'])
    """
    mixtral = model_type == "mixtral" or any(MIXTRAL_ROUTER.match(n) for n in scout_names)
    pattern, roles = (MIXTRAL, MIXTRAL_ROLES) if mixtral else (PER_EXPERT, TENSOR_NAMES)
    out: dict[str, OutTensor] = {}
    for key in vault:
        for t, role in enumerate(roles):
            rows, cols = _shape(vault, key, t)
            name = pattern.format(L=key[0], E=key[1], role=role)
            out[name] = OutTensor(name, (rows, cols), [Piece(key, t, None, (0, rows))])
    return out


def _where(path: Path, i: int, j: int | None = None) -> str:
    return f"{path}: experts[{i}]" + ("" if j is None else f".tensors[{j}]")


def manifest_layout(
    vault: VaultLike, doc: dict[str, Any], path: Path
) -> dict[str, OutTensor] | None:
    """The source's names and layout from a manifest that matches ``vault`` (checked by the
    caller); None when it records no ``tensors`` (e.g. written by ``upgrade --out`` from an
    old manifest). Refused: sources that do not tile their tensor exactly once.

    >>> from smoe.format import manifest
    >>> from smoe.vault.reader import Vault
    >>> vault = Vault.open("fixtures/q4_v2.smoe")
    >>> path = Path("fixtures/q4_v2.smoe.manifest.json")
    >>> doc = manifest.load(path, len(vault))
    >>> manifest_layout(vault, doc, path) is None  # these fixtures record no sources
    True
    >>> for row in doc["experts"]:  # as the sculptor records fused 3-D sources
    ...     p, e = f"model.layers.{row['layer']}.mlp.experts.", row["expert"]
    ...     row["tensors"] = [
    ...         {"source": p + "gate_up_proj", "index": e, "rows": [0, 32]},
    ...         {"source": p + "gate_up_proj", "index": e, "rows": [32, 64]},
    ...         {"source": p + "down_proj", "index": e},
    ...     ]
    >>> out = manifest_layout(vault, doc, path)
    >>> {name: o.shape for name, o in out.items() if ".0." in name}
    {'model.layers.0.mlp.experts.gate_up_proj': (4, 64, 64), \
'model.layers.0.mlp.experts.down_proj': (4, 64, 32)}
    >>> vault.close()
    """
    rows_of = doc["experts"]
    if all(r.get("tensors") is None for r in rows_of):
        return None  # no row records its sources (an old tool's manifest)
    for i, row in enumerate(rows_of):  # some do: every row must, as a list
        if not isinstance(row.get("tensors"), list):
            raise FormatError(
                f"{_where(path, i)}.tensors is {json_excerpt(row.get('tensors'))}, expected "
                "the expert's 3 source tensors, as the other rows record them"
            )
    out: dict[str, OutTensor] = {}
    for i, row in enumerate(rows_of):
        key = (row["layer"], row["expert"])
        tensors = row["tensors"]
        if len(tensors) != len(TENSOR_NAMES):
            raise FormatError(
                f"{_where(path, i)}: {len(tensors)} tensors, expected "
                f"{len(TENSOR_NAMES)} (gate, up, down)"
            )
        for t, entry in enumerate(tensors):
            _place(out, vault, key, t, entry, _where(path, i, t))
        _same_orientation(tensors, _where(path, i))
    for o in out.values():
        _tile(o, path)
    _check_orientation(out, vault, path)
    return out


def _same_orientation(tensors: list[Any], where: str) -> None:
    """An expert's three sources are stored alike: all transposed or none (the sculptor
    records one orientation per expert)."""
    flags = [t.get("transposed", False) for t in tensors]
    if len(set(flags)) > 1:
        j = flags.index(not flags[0])
        raise FormatError(
            f"{where}.tensors[{j}].transposed is {json_excerpt(flags[j])}, but tensors[0]'s "
            f"is {json_excerpt(flags[0])}: an expert's sources are all transposed or none"
        )


def _check_orientation(out: dict[str, OutTensor], vault: VaultLike, path: Path) -> None:
    """The manifest's ``transposed`` against the family the arch block names: a fused slab
    recorded transposed (``[E, H, 2I]``) for a family whose checkpoints have no transposed
    layout, or untransposed (``[E, 2I, H]``) for one whose fused layout is only transposed,
    would export tensors its model cannot load. A family the registry does not know (or a
    v1 vault) is not judged."""
    family = None if vault.arch is None else family_of(model_type_str(vault.arch["model_type"]))
    if family is None:
        return
    layouts = set(family.layouts) - {Layout.PER_EXPERT}
    for o in out.values():
        if not o.pieces or o.pieces[0].index is None:
            continue
        if o.transposed and layouts <= {Layout.FUSED}:
            want, said = "[E, 2I, H] and [E, H, I]", "true"
        elif not o.transposed and layouts <= {Layout.FUSED_T}:
            want, said = "[E, H, 2I] and [E, I, H]", "false"
        else:
            continue
        raise FormatError(
            f"{path}: transposed is {said} for {o.name!r}, but {family.model_type} "
            f"checkpoints (the arch block's model_type) store fused experts as {want}: the "
            "manifest contradicts the vault"
        )


def _place(
    out: dict[str, OutTensor],
    vault: VaultLike,
    key: tuple[int, int],
    t: int,
    entry: object,
    where: str,
) -> None:
    """Add vault tensor ``t`` of expert ``key`` to the output tensor its manifest ``entry``
    (at ``where``) names; refused if its ``index`` or ``rows`` do not fit the vault
    (:func:`smoe.format.manifest.source_fault`) or that tensor was given another index
    kind, width or dtype before."""
    source, index, rows, dtype, transposed, fp8 = _entry_fields(entry, where)
    n_rows, cols = _shape(vault, key, t)
    assert isinstance(entry, dict)  # checked by _entry_fields
    expert_rows = sum(_shape(vault, key, u)[0] for u in range(len(TENSOR_NAMES)))
    experts = int(vault.header_record["max_experts_per_layer"])
    fault = source_fault(entry, n_rows, expert_rows, experts, (key[0], key[1], t))
    if fault is not None:
        raise FormatError(f"{where}.{fault[0]} {fault[1]}")
    span = (0, n_rows) if rows is None else (rows[0], rows[1])
    o = out.setdefault(source, OutTensor(source, ()))
    if o.pieces and (
        (o.pieces[0].index is None) != (index is None)
        or o.shape[-1] != cols
        or o.dtype != dtype
        or o.transposed != transposed
    ):
        raise FormatError(
            f"{where}: {source!r} is given another index kind, width, "
            "dtype or orientation than by an earlier entry"
        )
    if o.pieces and o.fp8 != fp8:
        raise FormatError(
            f"{where}.fp8 is {'present' if fp8 else 'absent'}, but an earlier entry of "
            f"{source!r} has it {'present' if o.fp8 else 'absent'}: one source tensor is "
            "FP8 or not"
        )
    o.shape, o.dtype, o.transposed, o.fp8 = (cols,), dtype, transposed, fp8
    o.pieces.append(Piece(key, t, index, span))


def _entry_fields(entry: object, where: str) -> tuple[str, Any, Any, str | None, bool, bool]:
    """An ``experts[].tensors[]`` entry of the manifest: its source tensor's name and dtype
    (None: not recorded), whether the source holds its transpose (only a fused slab can)
    and whether it was FP8 (its ``fp8`` record, checked by :func:`_fp8_fault`), checked,
    and its ``index`` and ``rows`` as given."""
    if not isinstance(entry, dict):
        raise FormatError(f"{where}: not an object")
    source, index, rows, dtype = (entry.get(k) for k in ("source", "index", "rows", "dtype"))
    transposed = entry.get("transposed", False)
    if type(transposed) is not bool:
        raise FormatError(f"{where}.transposed is {transposed!r}, expected true or false")
    if not isinstance(source, str) or not source:
        raise FormatError(f"{where}.source is {source!r}, expected a tensor name")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise FormatError(f"{where}.dtype is {dtype!r}, expected one of {', '.join(FLOAT_DTYPES)}")
    if transposed and index is None:
        raise FormatError(
            f"{where}.transposed is true, but its source {source!r} is a 2-D tensor (index "
            "null): only a fused 3-D slab is stored transposed"
        )
    fp8 = entry.get("fp8")
    if fp8 is not None:
        fault = _fp8_fault(fp8)
        if fault is None and dtype is not None:
            fault = f"is present, but {where}.dtype says the source was {dtype}"
        if fault is not None:
            raise FormatError(f"{where}.fp8 {fault}")
    return source, index, rows, dtype, transposed, fp8 is not None


_FP8_KINDS = ("fp8-block", "fp8-channel", "fp8-tensor")


def _fp8_fault(record: object) -> str | None:
    """What is wrong with an entry's ``fp8`` record (docs/MANIFEST.md), or None: an object
    of an FP8 ``dtype``, a ``scale`` tensor name, a ``kind`` and a ``block`` of two
    positive integers.

    >>> _fp8_fault({"dtype": "F8_E4M3", "scale": "w_scale_inv", "kind": "fp8-block",
    ...             "block": [128, 128]}) is None
    True
    >>> _fp8_fault({"dtype": "BF16", "scale": "s", "kind": "fp8-block", "block": [1, 1]})
    'dtype is "BF16", expected F8_E4M3 or F8_E5M2'
    """
    if not isinstance(record, dict):
        return f"is {json_excerpt(record)}, expected an object"
    checks = (
        ("dtype", record.get("dtype") in FP8_DTYPES, " or ".join(FP8_DTYPES)),
        ("scale", isinstance(record.get("scale"), str) and record.get("scale"), "a tensor name"),
        ("kind", record.get("kind") in _FP8_KINDS, " or ".join(_FP8_KINDS)),
        (
            "block",
            isinstance(record.get("block"), list)
            and len(record["block"]) == 2
            and all(type(v) is int and v > 0 for v in record["block"]),
            "two positive integers",
        ),
    )
    for key, ok, want in checks:
        if not ok:
            return f"{key} is {json_excerpt(record.get(key))}, expected {want}"
    return None


def _tile(o: OutTensor, path: Path) -> None:
    """Set ``o.shape`` from its pieces; refuse gaps, overlaps and missing slabs."""
    cols = o.shape[-1]
    slabs: dict[int | None, list[tuple[int, int]]] = {}
    for p in o.pieces:
        slabs.setdefault(p.index, []).append(p.rows)
    height = max(stop for spans in slabs.values() for _, stop in spans)
    for index, spans in slabs.items():
        at = 0
        for start, stop in sorted(spans):
            if start != at:  # a gap or an overlap
                at = -1
                break
            at = stop
        if at != height:
            slab = "" if index is None else f" slab {index}"
            raise FormatError(
                f"{path}: the experts' sources do not tile {o.name!r}{slab}: rows "
                f"{sorted(spans)} of {height}"
            )
    if None in slabs:
        o.shape = (cols, height) if o.transposed else (height, cols)
        return
    indices = sorted(i for i in slabs if i is not None)  # all: the pieces are 3-D slabs
    count = indices[-1] + 1
    missing = next((at for at, i in enumerate(indices) if at != i), None)  # no range built
    if missing is not None:
        raise FormatError(
            f"{path}: {o.name!r} would have {count} slabs, but no expert fills slab {missing}"
        )
    o.shape = (count, cols, height) if o.transposed else (count, height, cols)


def natural_key(name: str) -> list[Any]:
    """Sort key putting ``model.layers.10`` after ``model.layers.9`` (numbers compared as
    numbers): the order export writes tensors in.

    >>> sorted(["l.10.w", "l.9.w", "l.9.a"], key=natural_key)
    ['l.9.a', 'l.9.w', 'l.10.w']
    """
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def load_manifest(vault: VaultLike) -> tuple[dict[str, Any] | None, Path]:
    """The manifest beside ``vault`` (None if there is none) and its path, checked to
    describe the vault: size, table entries, offsets and raw sizes (export checks the
    blobs' CRCs while it reads them); refused naming both sides otherwise.

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as vault:
    ...     doc, path = load_manifest(vault)
    >>> path.name, len(doc["experts"])
    ('q4_v2.smoe.manifest.json', 8)
    """
    path = manifest.path_for(vault.path)
    if not os.path.lexists(path):
        return None, path
    try:
        doc = manifest.load(path, len(vault))
    except manifest.ManifestError as e:
        raise FormatError(f"{path}: {e.finding.message}") from None
    rows = doc["experts"]
    size = doc["vault"]["size"]
    said = doc["vault"]["experts"]
    if size != len(vault.data) or len(rows) != len(vault) or said != len(vault):
        raise RefusedInput(
            f"{path}: describes another vault ({size} bytes, {said} experts"
            + ("" if said == len(rows) else f", {len(rows)} rows")
            + "; "
            f"{vault.path} has {len(vault.data)} bytes, {len(vault)} experts)"
        )
    table = vault.table
    for i, row in enumerate(rows):
        t = table[i]
        want = (int(t["layer_id"]), int(t["expert_id"]), int(t["byte_offset"]), int(t["raw_size"]))
        if (row["layer"], row["expert"], row["offset"], row["raw_size"]) != want:
            raise RefusedInput(
                f"{path}: experts[{i}] is layer {row['layer']} expert "
                f"{row['expert']} at offset {row['offset']}, but table entry {i} "
                f"of {vault.path} is layer {want[0]} expert {want[1]} at offset "
                f"{want[2]}: the manifest describes another vault"
            )
    return doc, path


def expert_layout(
    vault: VaultLike,
    doc: dict[str, Any] | None,
    manifest_path: Path,
    scout_names: Callable[[], Iterable[str]],
) -> dict[str, OutTensor]:
    """The output's expert tensors as export decides them: the source's names and layout
    from the manifest ``doc`` (read from ``manifest_path``) when it records them, else the
    family's standard names (``scout_names()``, the scout's tensor names, called only
    then: its routers tell Mixtral's naming).

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as vault:
    ...     doc, path = load_manifest(vault)
    ...     out = expert_layout(vault, doc, path, lambda: ())
    >>> len(out), next(iter(out))
    (24, 'model.layers.0.mlp.experts.0.gate_proj.weight')
    """
    experts = manifest_layout(vault, doc, manifest_path) if doc is not None else None
    if experts is None:
        arch = vault.arch
        model_type = "" if arch is None else str(arch["model_type"])
        experts = family_layout(vault, set(scout_names()), model_type)
    return experts


def assemble(vault: VaultLike, o: OutTensor) -> np.ndarray:
    """Output tensor ``o`` dequantised to float32, laid out as export writes it: each
    piece at its slab and rows, a transposed layout's pieces as their transposes side by
    side (``[E, H, 2I]``).

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as vault:
    ...     out = family_layout(vault, set(), "olmoe")
    ...     w = assemble(vault, out["model.layers.1.mlp.experts.2.down_proj.weight"])
    ...     same = (w == vault[1, 2]["down_proj"].dequantize()).all()
    >>> w.shape, w.dtype, bool(same)
    ((64, 32), dtype('float32'), True)
    """
    out = np.empty(o.shape, np.float32)
    slabs = out.reshape((-1, *o.shape[-2:]))  # a 2-D tensor is one slab
    key, expert = None, None
    for p in o.pieces:
        if p.key != key:  # an expert's pieces are adjacent: each expert read once
            key, expert = p.key, vault.expert(*p.key)
        assert expert is not None
        w = expert.tensors[p.tensor].dequantize()
        slab = slabs[p.index or 0]
        if o.transposed:
            slab[:, p.rows[0] : p.rows[1]] = w.T
        else:
            slab[p.rows[0] : p.rows[1]] = w
    return out
