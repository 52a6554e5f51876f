"""HuggingFace MoE checkpoints: config, tensor index and expert naming (ruling D8).

Opening a checkpoint reads ``config.json`` and the safetensors headers only. The
routed experts are located under one of the naming schemes ``transformers`` writes:

* per expert: ``model.layers.{L}.mlp.experts.{E}.{gate,up,down}_proj.weight``
  (qwen2_moe, qwen3_moe, olmoe, deepseek_v2/v3, ...);
* Mixtral: ``model.layers.{L}.block_sparse_moe.experts.{E}.{w1,w3,w2}.weight``
  (w1 = gate, w3 = up, w2 = down);
* fused 3-D: ``model.layers.{L}.mlp.experts.gate_up_proj`` ``[E, 2I, H]`` (gate rows,
  then up rows) and ``model.layers.{L}.mlp.experts.down_proj`` ``[E, H, I]``.

Shapes are the authority for structural facts (q/k norm, dense layer 0, shared expert),
the layer count, d_model and, where one explanation fits, head counts and head_dim;
disagreements with config.json are reported as warnings naming both values, or refused
where the tensors cannot say which value is right.

Index shard names must be relative paths inside the folder (checked by name: the files
themselves may be symlinks elsewhere, as in a HuggingFace cache snapshot); every shard
header is validated by ``read_header``.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from smoe.errors import RefusedInput
from smoe.families.config import (
    Structure,
    arch_from_config,
    config_object,
    get_int,
    get_str,
    is_mla,
    qk_norm_of,
    read_json,
    refuse_unsupported,
)
from smoe.families.registry import (
    CONTAINERS,
    EMBEDDINGS,
    FUSED_NAMES,
    PER_EXPERT_ROLES,
    PREFIXES,
    QK_NORMS,
    STACKED_ROLES,
    Family,
    Layout,
    assumptions,
    family_of,
    generic,
    split_layer,
)
from smoe.format.records import ArchInfo, ModelInfo
from smoe.interop.fp8 import declared_block
from smoe.interop.safetensors_io import (
    DTYPE_SIZES,
    FLOAT_DTYPES,
    TensorInfo,
    read_array,
    read_header,
)
from smoe.sculpt.source.fp8 import Fp8Scale, read_raw, scale_of

__all__ = ["Checkpoint", "ExpertRef", "src_dtype"]

_CONTAINER = "(?:(?:" + "|".join(CONTAINERS) + r")\.)?"
_PER_EXPERT = re.compile(
    "^" + _CONTAINER + r"experts\.(\d+)\.(" + "|".join(PER_EXPERT_ROLES) + r")\.weight$"
)
_FUSED = [(re.compile("^" + _CONTAINER + re.escape(gu) + "$"), dn) for gu, dn in FUSED_NAMES]
_STACKED = re.compile(  # one 3-D tensor per role (step3p7), told from a dense MLP by its rank
    "^(" + "|".join(CONTAINERS) + r")\.(" + "|".join(re.escape(n) for n in STACKED_ROLES) + ")$"
)
_BIAS = re.compile(  # the experts' own biases; not a router's e_score_correction_bias
    "^" + _CONTAINER + r"experts\.(?:\d+\.\w+\.bias|(?:gate_up|down|gate|up)_proj_bias|\w+\.bias)$"
)
_ATTENTION = re.compile(
    r"^(?:self_attn|attention|attn|self_attention)\.(q_proj|k_proj|q_norm|k_norm)\.weight$"
)
_DENSE_GATE = re.compile(
    r"^(?:mlp|feed_forward|ffn|block_sparse_moe|mixer|moe)\.(?:gate_proj|w1)\.weight$"
)
_Q_NORMS = tuple(f"{a}.{n}" for a in ("attn", "attention") for n in QK_NORMS)  # self_attn too
_ROLE_NAMES = {"gate_proj": 0, "up_proj": 1, "down_proj": 2}
_SHARED_GATE = re.compile(r"^(?:\w+\.)*shared?_\w+\.(?:gate_proj|w1)\.weight$")  # share_expert
_SHARED_FUSED = re.compile(  # gate and up in one tensor, gate rows first (Granite)
    r"^(?:\w+\.)*shared_\w+\.(?:input_linear\.weight|gate_up_proj(?:\.weight)?)$"
)


@dataclass(frozen=True)
class ExpertRef:
    """Where one expert's three matrices come from: a 2-D tensor, or a slice of a 3-D one
    (an expert's index, and for gate and up a half of ``gate_up_proj``'s rows). In a
    transposed layout (``[E, H, 2I]``) each slab is read whole and a matrix is the
    transpose of its columns ``rows``.

    >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe_fused").experts[(0, 1)]
    >>> for info, idx, rows in ref.sources:
    ...     print(info.name, idx, rows)
    model.layers.0.mlp.experts.gate_up_proj 1 slice(0, 48, None)
    model.layers.0.mlp.experts.gate_up_proj 1 slice(48, 96, None)
    model.layers.0.mlp.experts.down_proj 1 None
    """

    layer: int
    expert: int
    sources: tuple[tuple[TensorInfo, int | None, slice | None], ...]  # (tensor, index, rows)
    transposed: bool = False
    scales: tuple[Fp8Scale | None, ...] = (None, None, None)
    """Per matrix, the scales of an FP8 source (None: a float tensor)."""

    def _slab(self, info: TensorInfo, idx: int | None) -> tuple[int, ...]:
        return info.shape if idx is None else info.shape[1:]

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """The 2-D shape of gate, up and down (as the vault holds them).

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").experts[(0, 1)].shapes
        ((48, 64), (48, 64), (64, 48))
        """
        out = []
        for info, idx, rows in self.sources:
            shape = self._slab(info, idx)
            if self.transposed:
                c = shape[1] if rows is None else rows.stop - rows.start
                out.append((c, shape[0]))
            else:
                r = shape[0] if rows is None else rows.stop - rows.start
                out.append((r, shape[1]))
        return tuple(out)

    @property
    def nbytes(self) -> int:
        """Bytes of the three matrices as the encoder reads them (FP8 dequantised: BF16).

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").experts[(0, 1)].nbytes
        18432
        """
        total = 0
        for (r, c), (info, _, _) in zip(self.shapes, self.sources):
            total += r * c * np.dtype(FLOAT_DTYPES.get(info.dtype, np.uint16)).itemsize
        return total

    @property
    def source_bytes(self) -> int:
        """Bytes of the three matrices as the checkpoint stores them: each weight at its
        stored width (one byte for FP8) plus, for FP8, the scales applied to it
        (:meth:`~smoe.sculpt.source.fp8.Fp8Scale.applied_bytes`); what a sculpt counts as
        its expert bytes in, whatever the encoder reads them as.

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").experts[(0, 1)].source_bytes
        18432
        """
        total = 0
        for (r, c), (info, _, rows), scale in zip(self.shapes, self.sources, self.scales):
            total += r * c * DTYPE_SIZES[info.dtype]
            if scale is not None:
                total += scale.applied_bytes(rows, self.transposed)
        return total

    def ranges(self) -> tuple[tuple[Path, int, int], ...]:
        """(shard, absolute offset, size) of the bytes read for each matrix, gate, up, down:
        a row slice of a fused tensor is the contiguous run of just its rows; a matrix of a
        transposed layout is read as its whole slab.

        >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe_fused").experts[(0, 1)]
        >>> [(offset, n) for path, offset, n in ref.ranges()]
        [(96912, 6144), (103056, 6144), (41616, 6144)]
        """
        out = []
        for info, idx, rows in self.sources:
            shape = self._slab(info, idx)
            row = math.prod(shape[1:]) * DTYPE_SIZES[info.dtype]
            start = info.offset + (0 if idx is None else idx * shape[0] * row)
            r0, r1 = (0, shape[0]) if rows is None or self.transposed else (rows.start, rows.stop)
            out.append((info.path, start + r0 * row, (r1 - r0) * row))
        return tuple(out)

    def parts(self) -> tuple[TensorInfo, ...]:
        """What is read for each matrix, as a tensor of its own: its shard, offset, size,
        dtype and 2-D shape (a transposed layout's whole slab).

        >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe_fused").experts[(0, 1)]
        >>> gate = ref.parts()[0]
        >>> gate.dtype, gate.shape, gate.offset, gate.nbytes
        ('BF16', (48, 64), 96912, 6144)
        """
        out = []
        for (info, idx, rows), (path, offset, n) in zip(self.sources, self.ranges()):
            slab = self._slab(info, idx)
            if self.transposed or rows is None:
                shape = (slab[0], slab[1])
            else:
                shape = (rows.stop - rows.start, slab[1])
            out.append(TensorInfo(info.name, path, info.dtype, shape, offset, n))
        return tuple(out)

    def finish(self, k: int, read: np.ndarray) -> np.ndarray:
        """Matrix ``k`` from the array of what :meth:`parts` reads for it: FP8 dequantised
        to BF16 patterns, a transposed layout's columns transposed (fresh, contiguous).

        >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe").experts[(0, 1)]
        >>> raw = read_array(ref.parts()[0])
        >>> ref.finish(0, raw) is raw  # a float matrix in the vault's orientation: as read
        True
        """
        info, idx, rows = self.sources[k]
        scale = self.scales[k]
        if scale is not None:
            read = scale.dequantize(
                read, idx, f"{info.path}: {info.name}", None if self.transposed else rows
            )
        if not self.transposed:
            return read
        cols = read if rows is None else read[:, rows.start : rows.stop]
        return np.ascontiguousarray(cols.T)

    def load(self) -> list[tuple[np.ndarray, str | None]]:
        """The three matrices as (array, src_dtype): fresh arrays, each filled by positioned
        reads of just its bytes (:class:`smoe.sculpt.expert_reader.ExpertReader` reuses buffers).

        >>> ref = Checkpoint.open("fixtures/checkpoints/olmoe_mixed_dtype").experts[(0, 0)]
        >>> [(str(a.dtype), a.shape, src) for a, src in ref.load()]
        [('uint16', (32, 64), 'bf16'), ('float16', (32, 64), None), ('float32', (64, 32), None)]
        """
        out = []
        for k, part in enumerate(self.parts()):
            raw = read_array(part) if part.dtype in FLOAT_DTYPES else read_raw(part)
            out.append((self.finish(k, raw), src_dtype(part)))
        return out


def src_dtype(info: TensorInfo) -> str | None:
    """What the raw 16-bit patterns of a matrix are, for :func:`smoe.quant.encode_into`
    (``"bf16"``, also for FP8 dequantised to BF16; None: the array's own dtype says it).

    >>> ref = Checkpoint.open("fixtures/checkpoints/olmoe_mixed_dtype").experts[(0, 0)]
    >>> [src_dtype(p) for p in ref.parts()]
    ['bf16', None, None]
    """
    return "bf16" if info.dtype == "BF16" or info.dtype.startswith("F8") else None


def _weight_map(index_path: Path) -> dict[str, str]:
    """The index's ``weight_map``: a JSON object of tensor name -> shard file name."""
    index = read_json(index_path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise RefusedInput(
            f"{index_path}: no weight_map (expected a JSON object of tensor name "
            "-> shard file name)"
        )
    if not weight_map:
        raise RefusedInput(f"{index_path}: weight_map is empty")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise RefusedInput(
                f"{index_path}: tensor {name!r} maps to {json.dumps(shard)[:60]}, "
                "expected a shard file name (a string)"
            )
    return weight_map


def _shard_name(index_path: Path, tensor: str, shard: str) -> PurePosixPath:
    """A shard name from an index: relative, inside the checkpoint folder (checked by name;
    the file may be a symlink elsewhere, as in a HuggingFace cache snapshot)."""
    rel = PurePosixPath(shard)
    reason = None
    if not shard:
        reason = "is empty"
    elif "\0" in shard:
        reason = "has a NUL byte"
    elif rel.is_absolute():
        reason = "is an absolute path"
    elif ".." in rel.parts:
        reason = "has a '..' component"
    elif not rel.parts:
        reason = "is the checkpoint folder itself"
    else:
        try:
            shard.encode("utf-8")
        except UnicodeEncodeError:
            reason = "is not valid Unicode"
    if reason:
        raise RefusedInput(
            f"{index_path}: tensor {tensor!r} maps to shard {shard!r}, which "
            f"{reason}; refused: shards must be relative paths inside the "
            "checkpoint folder"
        )
    return rel


Roles = dict[int, TensorInfo]  # gate (0), up (1), down (2) -> tensor


@dataclass
class _Found:
    """The expert tensors of a checkpoint, by layout: per (layer, expert) its roles' 2-D
    tensors, per layer its fused pair or its stacked 3-D tensor per role; every such name,
    and the language model's prefix."""

    parts: dict[tuple[int, int], Roles] = field(default_factory=dict)
    fused: dict[int, tuple[TensorInfo, TensorInfo]] = field(default_factory=dict)
    stacked: dict[int, Roles] = field(default_factory=dict)  # per layer, a 3-D tensor per role
    names: set[str] = field(default_factory=set)
    prefixes: set[str] = field(default_factory=set)
    stems: set[str] = field(default_factory=set)  # the prefix and layers./blocks.

    def note(self, prefix: str, stem: str, *names: str) -> None:
        """Record where expert tensors ``names`` were found."""
        self.names.update(names)
        self.prefixes.add(prefix)
        self.stems.add(stem)


def _put_role(root: Path, roles: Roles, role: int, info: TensorInfo, where: str) -> None:
    """``info`` as ``role`` of ``roles``; a role already held is one matrix under two names."""
    if role in roles:
        raise _stored_twice(root, roles[role].name, info.name, where)
    roles[role] = info


def _find_experts(root: Path, tensors: dict[str, TensorInfo]) -> _Found:
    """Every routed-expert tensor under a known prefix and layout; an expert bias is refused."""
    found = _Found()
    for name, info in tensors.items():
        split = split_layer(name)
        if split is None or split[0] not in PREFIXES:
            continue
        prefix, layer, rest = split
        stem = name[: len(name) - len(rest) - len(str(layer)) - 1]
        if _BIAS.match(rest):
            raise RefusedInput(
                f"{root}: expert bias {name!r} refused: only bias-free "
                "SiLU-gated (SwiGLU) experts can be represented"
            )
        m = _STACKED.match(rest)
        if m and len(info.shape) == 3:
            roles = found.stacked.setdefault(layer, {})
            _put_role(root, roles, STACKED_ROLES[m.group(2)], info, f"layer {layer}")
            found.note(prefix, stem, name)
            continue
        m = _PER_EXPERT.match(rest)
        if m:
            key = (layer, int(m.group(1)))
            roles = found.parts.setdefault(key, {})
            where = f"layer {layer} expert {key[1]}"
            _put_role(root, roles, PER_EXPERT_ROLES[m.group(2)], info, where)
            found.note(prefix, stem, name)
            continue
        for (pattern, down), (gu_name, _) in zip(_FUSED, FUSED_NAMES):
            if pattern.match(rest):
                down_name = name[: len(name) - len(gu_name)] + down
                if down_name not in tensors:
                    raise RefusedInput(
                        f"{root}: layer {layer} has fused experts {name!r} but no {down_name!r}"
                    )
                if layer in found.fused:
                    raise _stored_twice(root, found.fused[layer][0].name, name, f"layer {layer}")
                found.fused[layer] = (info, tensors[down_name])
                found.note(prefix, stem, name, down_name)
    for layer, e in sorted(found.parts):
        if layer in found.fused:  # a layer's experts are in one layout
            first = min(t.name for t in found.parts[(layer, e)].values())
            raise _stored_twice(root, first, found.fused[layer][0].name, f"layer {layer}")
    if len(found.stems) > 1:
        raise RefusedInput(
            f"{root}: routed experts under more than one prefix "
            f"({', '.join(repr(p) for p in sorted(found.stems))}); refused: one language "
            "model per checkpoint"
        )
    return found


def _stored_twice(root: Path, a: str, b: str, what: str) -> RefusedInput:
    """The refusal of two tensors that both claim ``what``'s expert weights: which one the
    vault (and, for the other, the scout) should take cannot be told."""
    first, second = sorted((a, b))
    return RefusedInput(
        f"{root}: {first!r} and {second!r} both hold {what}'s expert weights; refused: one "
        "expert matrix stored under two names (which copy is the model's cannot be told)"
    )


def _per_expert_refs(
    root: Path, parts: dict[tuple[int, int], Roles]
) -> dict[tuple[int, int], ExpertRef]:
    """The experts stored one 2-D tensor per matrix: all three roles, each 2-D."""
    experts: dict[tuple[int, int], ExpertRef] = {}
    for key, roles in parts.items():
        missing = [n for n, r in _ROLE_NAMES.items() if r not in roles]
        if missing:
            raise RefusedInput(
                f"{root}: layer {key[0]} expert {key[1]} has no {' or '.join(missing)} tensor"
            )
        for info in roles.values():
            if len(info.shape) != 2:
                raise RefusedInput(
                    f"{root}: {info.name} has shape {list(info.shape)}, expected 2-D"
                )
        experts[key] = ExpertRef(key[0], key[1], tuple((roles[r], None, None) for r in range(3)))
    return experts


def _orientation(root: Path, layer: int, gu: TensorInfo, down: TensorInfo, family: Family) -> bool:
    """Whether a layer's fused pair is transposed (``[E, H, 2I]``, ``[E, I, H]``): the one
    of the family's layouts the pair's shapes fit (never both: that would need I = 2I)."""
    fits = set()
    if len(gu.shape) == 3 and len(down.shape) == 3 and gu.shape[0] == down.shape[0]:
        _, a, b = gu.shape
        _, c, d = down.shape
        if a % 2 == 0 and a // 2 == d and b == c:
            fits.add(Layout.FUSED)
        if b % 2 == 0 and b // 2 == c and a == d:
            fits.add(Layout.FUSED_T)
    allowed = fits & set(family.layouts)
    if not allowed:
        expect = " or ".join(
            {Layout.FUSED: "[E, 2I, H] and [E, H, I]", Layout.FUSED_T: "[E, H, 2I] and [E, I, H]"}[
                x
            ]
            for x in family.layouts
            if x is not Layout.PER_EXPERT
        )
        raise RefusedInput(
            f"{root}: layer {layer} fused experts {gu.name} {list(gu.shape)}, "
            f"{down.name} {list(down.shape)}: expected {expect or 'per-expert tensors'}"
        )
    return allowed == {Layout.FUSED_T}


def _add_fused_refs(
    root: Path,
    fused: dict[int, tuple[TensorInfo, TensorInfo]],
    experts: dict[tuple[int, int], ExpertRef],
    family: Family,
) -> None:
    """Add the experts of each layer's fused gate_up and down tensors (shapes that fit the
    family's orientation, no expert stored twice); gate is the first half."""
    for layer, (gu, down) in fused.items():
        transposed = _orientation(root, layer, gu, down, family)
        inter = (gu.shape[2] if transposed else gu.shape[1]) // 2
        for e in range(gu.shape[0]):
            if (layer, e) in experts:
                raise RefusedInput(
                    f"{root}: layer {layer} expert {e} is stored both fused and per expert"
                )
            experts[(layer, e)] = ExpertRef(
                layer,
                e,
                ((gu, e, slice(0, inter)), (gu, e, slice(inter, 2 * inter)), (down, e, None)),
                transposed,
            )


def _add_stacked_refs(
    root: Path,
    stacked: dict[int, Roles],
    experts: dict[tuple[int, int], ExpertRef],
    family: Family,
) -> None:
    """Add the experts of each layer's stacked tensors (gate_proj and up_proj [E, I, H],
    down_proj [E, H, I]): expert e is slab e of each; a layer with fused or per-expert
    tensors too is refused, as is a family whose checkpoints never stack."""
    for layer, roles in stacked.items():
        missing = [n for n, r in STACKED_ROLES.items() if r not in roles]
        if missing:
            raise RefusedInput(
                f"{root}: layer {layer} has stacked experts but no {' or '.join(missing)} tensor"
            )
        if Layout.STACKED not in family.layouts:
            raise RefusedInput(
                f"{root}: layer {layer} stores its experts stacked per role "
                f"({roles[0].name} {list(roles[0].shape)}), not a layout of "
                f"{family.model_type} checkpoints"
            )
        gate, up, down = roles[0], roles[1], roles[2]
        if len({gate.shape[0], up.shape[0], down.shape[0]}) != 1:
            raise RefusedInput(
                f"{root}: layer {layer} stacked experts {gate.name} {list(gate.shape)}, "
                f"{up.name} {list(up.shape)}, {down.name} {list(down.shape)}: expected one "
                "expert count"
            )
        for e in range(gate.shape[0]):
            if (layer, e) in experts:
                raise RefusedInput(
                    f"{root}: layer {layer} expert {e} is stored both stacked and otherwise"
                )
            experts[(layer, e)] = ExpertRef(
                layer, e, ((gate, e, None), (up, e, None), (down, e, None))
            )


def _check_expert(
    root: Path,
    key: tuple[int, int],
    ref: ExpertRef,
    tensors: dict[str, TensorInfo],
    declared: tuple[int, int] | None = None,
) -> ExpertRef:
    """gate and up of one shape, down its transpose; every matrix readable: a float tensor,
    or FP8 with the scales it needs (:func:`smoe.sculpt.source.fp8.scale_of`)."""
    g, u, d = ref.shapes
    if u != g or d != (g[1], g[0]):
        raise RefusedInput(
            f"{root}: layer {key[0]} expert {key[1]} has inconsistent "
            f"shapes gate {list(g)}, up {list(u)}, down {list(d)}"
        )
    scales = tuple(scale_of(info, tensors, declared) for info, _, _ in ref.sources)
    return replace(ref, scales=scales) if any(s is not None for s in scales) else ref


@dataclass
class Checkpoint:
    """An opened HF checkpoint directory: config, tensor index, routed experts.

    >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe_sharded")
    >>> len(ck.tensors), len(ck.experts), len({t.path for t in ck.tensors.values()})
    (69, 16, 3)
    """

    root: Path
    config: dict
    tensors: dict[str, TensorInfo]
    experts: dict[tuple[int, int], ExpertRef]
    expert_tensor_names: set[str]
    family: Family = field(default_factory=lambda: generic("unknown"))
    stem: str = "model.layers."
    """The language model's layers' name stem before ``{L}.`` (``model.layers.``,
    ``model.language_model.layers.``, ``backbone.layers.``, ...)."""
    declared_type: str = ""
    """config.json's ``model_type`` (a multimodal wrapper's outer one)."""
    warnings: list[str] = field(default_factory=list)

    # ---- opening -----------------------------------------------------------------------
    @classmethod
    def open(cls, root: str | Path) -> Checkpoint:
        """Read config.json and every shard header (validated by ``read_header``), find the
        routed experts; refusals are one SmoeError line.

        >>> from smoe.errors import SmoeError
        >>> Checkpoint.open("fixtures/checkpoints/mixtral").model_type
        'mixtral'
        >>> try:
        ...     Checkpoint.open("fixtures/checkpoints/gpt_oss")
        ... except SmoeError as e:
        ...     print(e)
        fixtures/checkpoints/gpt_oss: model_type 'gpt_oss' refused: ...
        """
        root = Path(root)
        if not root.is_dir():
            raise RefusedInput(f"{root}: not a checkpoint directory")
        cfg_path = root / "config.json"
        if not os.path.lexists(cfg_path):  # a FIFO or a dangling link is refused, not "absent"
            raise RefusedInput(
                f"{root}: no config.json (a HuggingFace checkpoint directory needs "
                "config.json and *.safetensors)"
            )
        doc = read_json(cfg_path)
        config = config_object(doc, cfg_path)
        where = str(cfg_path)
        outer = get_str(doc, where, "model_type") if isinstance(doc, dict) else ""
        inner = get_str(config, where, "model_type")
        family = family_of(outer) or family_of(inner)
        warnings = []
        if family is None:
            family = generic(outer or inner or "unknown")
            warnings.append(assumptions(outer or inner or "unknown"))
        if family.refused:
            raise RefusedInput(f"{root}: model_type {(outer or inner)!r} refused: {family.refused}")
        tensors = cls._index(root)
        refuse_unsupported(config, where, str(root))
        block = declared_block(doc if isinstance(doc, dict) else config, where)
        experts, names, stem = cls._experts(root, tensors, family, block)
        given = [
            c for c in (doc, config) if isinstance(c, dict) and c.get("model_type") is not None
        ]
        declared = get_str(given[0], where, "model_type") if given else "unknown"
        return cls(root, config, tensors, experts, names, family, stem, declared, warnings)

    @staticmethod
    def _index(root: Path) -> dict[str, TensorInfo]:
        index_path = root / "model.safetensors.index.json"
        places: dict[str, Path] | None = None  # tensor -> shard, from the index
        if os.path.lexists(index_path):  # a FIFO or a dangling link is refused, not skipped
            places = {
                name: root.joinpath(*_shard_name(index_path, name, shard).parts)
                for name, shard in _weight_map(index_path).items()
            }
            first_user: dict[Path, str] = {}
            for name, shard in places.items():
                first_user.setdefault(shard, name)
            for shard, name in first_user.items():
                try:
                    os.stat(shard)
                except FileNotFoundError:
                    raise RefusedInput(
                        f"{index_path}: tensor {name!r} is in shard "
                        f"{str(shard.relative_to(root))!r}, which does not "
                        "exist"
                    ) from None
                except OSError:
                    pass  # read_header names the error
            shards = sorted(first_user)
        else:
            shards = sorted(
                p for p in root.glob("*.safetensors") if not p.name.endswith(".scout.safetensors")
            )
        if not shards:
            raise RefusedInput(f"{root}: no *.safetensors files")
        tensors: dict[str, TensorInfo] = {}
        for shard in shards:
            for name, info in read_header(shard).items():
                if name in tensors:
                    raise RefusedInput(
                        f"{root}: tensor {name!r} is in both "
                        f"{tensors[name].path.name} and {shard.name}"
                    )
                tensors[name] = info
        for name, shard in (places or {}).items():
            if name not in tensors or tensors[name].path != shard:
                raise RefusedInput(
                    f"{index_path}: tensor {name!r} is not in {str(shard.relative_to(root))!r}"
                )
        return tensors

    @staticmethod
    def _experts(
        root: Path,
        tensors: dict[str, TensorInfo],
        family: Family,
        declared: tuple[int, int] | None = None,
    ) -> tuple[dict[tuple[int, int], ExpertRef], set[str], str]:
        """The routed experts (per expert and fused, sorted), the names of their tensors
        and the language model's prefix."""
        found = _find_experts(root, tensors)
        experts = _per_expert_refs(root, found.parts)
        _add_fused_refs(root, found.fused, experts, family)
        _add_stacked_refs(root, found.stacked, experts, family)
        if not experts:
            raise RefusedInput(
                f"{root}: no routed expert tensors found (looked for "
                "[prefix.]layers.{L}.<mlp|block_sparse_moe|feed_forward|...>.experts.{E}."
                "<gate_proj|up_proj|down_proj|w1|w3|w2>.weight and the fused gate_up/down "
                "pairs smoe families lists)"
            )
        checked = {
            key: _check_expert(root, key, ref, tensors, declared) for key, ref in experts.items()
        }
        scales = {s.scale.name for ref in checked.values() for s in ref.scales if s is not None}
        return dict(sorted(checked.items())), found.names | scales, next(iter(found.stems))

    # ---- facts -----------------------------------------------------------------------------
    @property
    def model_type(self) -> str:
        """config.json's ``model_type`` ("unknown" when absent; a multimodal wrapper's
        outer type, not its text model's).

        >>> Checkpoint.open("fixtures/checkpoints/deepseek_v3").model_type
        'deepseek_v3'
        """
        return self.declared_type or get_str(
            self.config, self.where, "model_type", default="unknown"
        )

    @property
    def where(self) -> str:
        """config.json's path, as messages name it.

        >>> Checkpoint.open("fixtures/checkpoints/olmoe").where
        'fixtures/checkpoints/olmoe/config.json'
        """
        return f"{self.root}/config.json"

    @property
    def moe_layers(self) -> list[int]:
        """The layers that have routed experts, in order.

        >>> Checkpoint.open("fixtures/checkpoints/deepseek_v2").moe_layers
        [1, 2]
        """
        return sorted({lay for lay, _ in self.experts})

    def layer_experts(self, layer: int) -> list[int]:
        """The expert numbers of ``layer``, in order.

        >>> Checkpoint.open("fixtures/checkpoints/mixtral").layer_experts(0)
        [0, 1, 2, 3]
        """
        return [e for lay, e in self.experts if lay == layer]

    def _shape(self, name: str) -> tuple[int, ...] | None:
        info = self.tensors.get(name)
        return info.shape if info else None

    def _warn(self, line: str) -> None:
        if line not in self.warnings:
            self.warnings.append(line)

    def _warn_if(self, what: str, config_value: object, shape_value: object, why: str = "") -> None:
        if config_value is not None and config_value != shape_value:
            self._warn(
                f"{what}: config.json says {config_value!r}, the tensors say "
                f"{shape_value!r}{why}; using the tensors"
            )

    @property
    def prefix(self) -> str:
        """The language model's prefix: the stem without ``layers.`` (``model.``, ...).

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").prefix
        'model.'
        """
        return self.stem[: self.stem.rstrip(".").rfind(".") + 1]

    def layer(self, n: int) -> str:
        """The name prefix of layer ``n``'s tensors (``model.layers.3.``).

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").layer(3)
        'model.layers.3.'
        """
        return f"{self.stem}{n}."

    @property
    def embedding_name(self) -> str:
        """The token embedding's tensor name (the first of the known names present under
        the prefix; the standard one when none is).

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").embedding_name
        'model.embed_tokens.weight'
        """
        names = [self.prefix + e for e in EMBEDDINGS]
        return next((n for n in names if n in self.tensors), names[0])

    def _embedding(self) -> tuple[int, int]:
        """(vocab_size, d_model): the embedding's shape."""
        emb = self._shape(self.embedding_name)
        if emb is None or len(emb) != 2:
            raise RefusedInput(
                f"{self.root}: no 2-D {self.embedding_name}; d_model and vocab_size come from it"
            )
        return emb[0], emb[1]

    def _check_hidden_size(self, d_model: int) -> None:
        """hidden_size must match the embedding's columns: a warning, or refused where
        head_dim is derived from it and the two values give different head_dims."""
        cfg, where = self.config, self.where
        hidden = get_int(cfg, where, "hidden_size")
        heads = get_int(cfg, where, "num_attention_heads")
        if (
            hidden is not None
            and hidden != d_model
            and heads
            and not is_mla(cfg, where)
            and get_int(cfg, where, "head_dim") is None
            and hidden // heads != d_model // heads
        ):
            raise RefusedInput(
                f"{self.root}: hidden_size: config.json says {hidden}, "
                f"{self.embedding_name} has {d_model} columns; refused: "
                "config.json has no head_dim, and hidden_size / num_attention_heads "
                f"would be {hidden // heads} by the config, {d_model // heads} by the "
                "tensors"
            )
        self._warn_if("hidden_size", hidden, d_model)

    def model_info(self) -> ModelInfo:
        """Header facts (D5) for the whole model, whatever subset is written.

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").model_info()
        ModelInfo(num_moe_layers=2, max_experts_per_layer=8, d_model=64, vocab_size=128, ffn_dim=96)
        """
        vocab, d_model = self._embedding()
        self._check_hidden_size(d_model)
        widths = {lay: len(self.layer_experts(lay)) for lay in self.moe_layers}
        n_experts = get_int(
            self.config, self.where, "num_experts", "num_local_experts", "n_routed_experts"
        )
        width = max(widths.values())
        self._warn_if("num_experts", n_experts, width)
        return ModelInfo(
            num_moe_layers=len(widths),
            max_experts_per_layer=width,
            d_model=d_model,
            vocab_size=vocab,
            ffn_dim=self.ffn_dim(),
        )

    def dense_ffn_dim(self) -> int:
        """Rows of a dense layer 0's gate_proj (0 when layer 0 is MoE).

        >>> Checkpoint.open("fixtures/checkpoints/deepseek_v2").dense_ffn_dim()
        96
        """
        if 0 in self.moe_layers:
            return 0
        for name, info in self.tensors.items():
            if name.startswith(self.layer(0)) and _DENSE_GATE.match(name[len(self.layer(0)) :]):
                return int(info.shape[0])
        return 0

    def shared_expert_ffn_dim(self) -> int:
        """The first MoE layer's shared expert width: its gate's rows (gate_proj or w1), or
        half of a fused gate/up's (Granite's ``shared_mlp.input_linear``); 0 without one.

        >>> Checkpoint.open("fixtures/checkpoints/deepseek_v2").shared_expert_ffn_dim()
        64
        """
        for lay in self.moe_layers:
            head = self.layer(lay)
            for name, info in sorted(self.tensors.items()):
                rest = name[len(head) :] if name.startswith(head) else ""
                if _SHARED_GATE.match(rest):
                    return int(info.shape[0])
                if _SHARED_FUSED.match(rest) and len(info.shape) == 2:
                    return int(info.shape[0]) // 2
        return 0

    def ffn_dim(self) -> int:
        """D5: dense layer-0 rows, else shared expert rows, else config intermediate_size.

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").ffn_dim()
        96
        """
        return (
            self.dense_ffn_dim()
            or self.shared_expert_ffn_dim()
            or get_int(self.config, self.where, "intermediate_size")
            or 0
        )

    def has_qk_norm(self) -> bool:
        """Whether the attention has q/k norm weights.

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").has_qk_norm()
        True
        """
        fixed = qk_norm_of(self.config, self.where, self.family)
        if fixed is not None:
            return fixed
        return any(n.startswith(self.stem) and n.endswith(_Q_NORMS) for n in self.tensors)

    def structure(self) -> Structure:
        """Structural facts from the tensors present (shapes win over config.json).

        >>> Checkpoint.open("fixtures/checkpoints/deepseek_v2").structure()
        Structure(has_qk_norm=False, dense_ffn_dim=96, shared_expert_ffn_dim=64)
        """
        return Structure(self.has_qk_norm(), self.dense_ffn_dim(), self.shared_expert_ffn_dim())

    def arch_info(self) -> ArchInfo:
        """The arch block (D6) from config.json, with shapes as the authority: structure,
        layer count, head counts and head_dim (refused where the tensors are ambiguous).

        >>> a = Checkpoint.open("fixtures/checkpoints/qwen3_moe").arch_info()
        >>> a.num_heads, a.num_kv_heads, a.head_dim, a.moe_top_k, a.num_hidden_layers
        (4, 2, 16, 2, 2)
        """
        gate_rows = next(iter(self.experts.values())).shapes[0][0]
        emb = self._shape(self.embedding_name)
        if emb is not None and len(emb) == 2:
            self._check_hidden_size(emb[1])
        arch, warnings = arch_from_config(
            self.config, self.where, gate_rows, self.structure(), self.family, self.model_type
        )
        self.warnings.extend(w for w in warnings if w not in self.warnings)
        arch = self._attention(self._layers(arch))
        if len(self.moe_layers) > arch.num_hidden_layers:  # MTP layers beyond the count
            raise RefusedInput(
                f"{self.root}: the tensors have {len(self.moe_layers)} MoE layers, more than "
                f"num_hidden_layers {arch.num_hidden_layers}; refused: the arch block counts "
                "every MoE layer in num_hidden_layers and has no field for "
                "multi-token-prediction layers"
            )
        if self.family.beyond:
            self._warn(
                f"the arch block cannot carry {self.model_type}'s "
                f"{', '.join(self.family.beyond)}: an engine must read them from the config "
                "copy (the manifest's source.family.config_keys lists them)"
            )
        width = max(len(self.layer_experts(lay)) for lay in self.moe_layers)
        if arch.moe_top_k > width:
            raise RefusedInput(
                f"{self.where}: num_experts_per_tok is {arch.moe_top_k}, but the "
                f"tensors have at most {width} experts per layer"
            )
        return arch

    def _layers(self, arch: ArchInfo) -> ArchInfo:
        """num_hidden_layers: the tensors' count (highest model.layers.{L} + 1) wins over a
        smaller config value; a larger one, or a layer missing in between, is refused."""
        present = {
            int(n[len(self.stem) :].split(".", 1)[0])
            for n in self.tensors
            if n.startswith(self.stem) and n[len(self.stem) :].split(".", 1)[0].isdigit()
        }
        count = max(present) + 1
        said = get_int(self.config, self.where, "num_hidden_layers")
        if said is not None and said > count:
            raise RefusedInput(
                f"{self.root}: num_hidden_layers: config.json says {said}, but the "
                f"tensors have layers 0..{count - 1} only (no {self.stem}{count}); "
                "refused"
            )
        gaps = sorted(set(range(count)) - present)
        if gaps:
            raise RefusedInput(
                f"{self.root}: the tensors have {self.stem}{count - 1} but no "
                f"tensor of {self.stem}{gaps[0]}; refused"
            )
        mtp = get_int(self.config, self.where, "num_nextn_predict_layers", minimum=0) or 0
        if said is not None and mtp and said + mtp == count:
            extra = (
                f"{self.stem}{said} is a multi-token-prediction layer"
                if mtp == 1
                else f"{self.stem}{said}..{count - 1} are multi-token-prediction layers"
            )
            self._warn(
                f"num_hidden_layers: config.json says {said}; the tensors' {extra} "
                f"(num_nextn_predict_layers {mtp}), kept beyond num_hidden_layers"
            )
            return arch
        if said is None:
            self._warn(
                f"num_hidden_layers: config.json has none, the tensors say {count}; "
                "using the tensors"
            )
        self._warn_if("num_hidden_layers", said, count)
        return replace(arch, num_hidden_layers=count)

    def _attention_shapes(self) -> dict[str, tuple[int, tuple[int, ...]]]:
        """Per role (q_proj, k_proj, q_norm, k_norm): (first layer, shape), the same in all
        layers (else refused)."""
        seen: dict[str, tuple[int, tuple[int, ...]]] = {}
        for name, info in sorted(self.tensors.items()):
            split = split_layer(name)
            if split is None or not name.startswith(self.stem):
                continue
            m = _ATTENTION.match(split[2])
            if not m:
                continue
            layer, role = split[1], m.group(1)
            first = seen.setdefault(role, (layer, info.shape))
            if first[1] != info.shape:
                raise RefusedInput(
                    f"{self.root}: {name} has shape {list(info.shape)}, but "
                    f"{self.layer(first[0])}self_attn.{role}.weight has "
                    f"{list(first[1])}; per-layer attention shapes are not "
                    "representable"
                )
        return seen

    def _attention(self, arch: ArchInfo) -> ArchInfo:
        """Head counts and head_dim against the q/k projections' rows (not for MLA, R3):
        q_proj rows = num_heads × head_dim, k_proj rows = num_kv_heads × head_dim."""
        if is_mla(self.config, self.where):
            return arch
        shapes = self._attention_shapes()
        if "q_proj" not in shapes or len(shapes["q_proj"][1]) != 2:
            return arch
        heads, kv, hd = arch.num_heads, arch.num_kv_heads, arch.head_dim
        layer, (rows_q, _) = shapes["q_proj"]
        if self.family.gated_q:  # half of q_proj's rows are the attention output's gate
            if rows_q % 2:
                raise RefusedInput(
                    f"{self.root}: {self.layer(layer)}self_attn.q_proj.weight has {rows_q} "
                    f"rows, but {self.model_type}'s q_proj also holds the output gate "
                    "(2 x num_attention_heads x head_dim rows)"
                )
            rows_q //= 2
        k = shapes.get("k_proj")
        rows_k = k[1][0] if k and len(k[1]) == 2 else None
        if rows_q == heads * hd and rows_k in (None, kv * hd):
            return arch
        norm = shapes.get("q_norm")  # a per-head q_norm [head_dim] says head_dim outright
        witness = norm[1][0] if norm and len(norm[1]) == 1 and norm[1][0] != rows_q else None
        fits = []
        if (
            rows_q % heads == 0
            and rows_k in (None, kv * (rows_q // heads))
            and witness in (None, rows_q // heads)
        ):
            fits.append(replace(arch, head_dim=rows_q // heads))
        if rows_q % hd == 0 and (rows_k is None or rows_k % hd == 0) and witness in (None, hd):
            h, k_heads = rows_q // hd, kv if rows_k is None else rows_k // hd
            if k_heads and h % k_heads == 0:
                fits.append(replace(arch, num_heads=h, num_kv_heads=k_heads))
        seen = f"{self.layer(layer)}self_attn.q_proj.weight has {rows_q} rows" + (
            "" if rows_k is None else f", k_proj.weight {rows_k}"
        )
        if len(fits) != 1:
            reason = (
                "either head_dim or the head counts could be wrong"
                if fits
                else "no change of head_dim alone or of the head counts alone explains them"
            )
            raise RefusedInput(
                f"{self.root}: {seen}, but config.json says num_attention_heads "
                f"{heads} × head_dim {hd} = {heads * hd} and num_key_value_heads {kv} "
                f"× head_dim {hd} = {kv * hd}; refused: {reason}"
            )
        new = fits[0]
        for attr, key in (
            ("num_heads", "num_attention_heads"),
            ("num_kv_heads", "num_key_value_heads"),
            ("head_dim", "head_dim"),
        ):
            self._warn_if(key, getattr(arch, attr), getattr(new, attr), f" ({seen})")
        return new

    def family_record(self) -> dict | None:
        """What the manifest's ``source.family`` says (docs/MANIFEST.md): the config keys an
        engine must read from the config copy (``config_keys``), what it must compute that
        no key announces (``semantics``, present when the registry lists any: a sigmoid
        router with a correction bias, a routed scaling), whether the registry knows the
        family, and the language model's layer stem when it is not ``model.layers.``; None
        when there is nothing beyond the arch block to say.

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").family_record() is None
        True
        >>> record = Checkpoint.open("fixtures/checkpoints/deepseek_v3").family_record()
        >>> "routed_scaling_factor" in record["config_keys"], record["semantics"][0][:33]
        (True, 'router scores are sigmoid(logits)')
        """
        registered = (
            self.family.model_type != ""
            and bool(family_of(self.family.model_type))
            and not self.warnings_of_assumption()
        )
        plain = not self.family.beyond and not self.family.semantics
        if registered and plain and self.stem == "model.layers.":
            return None
        record: dict = {"registered": registered, "config_keys": list(self.family.beyond)}
        if self.family.semantics:
            record["semantics"] = list(self.family.semantics)
        if self.stem != "model.layers.":
            record["layers"] = self.stem
        return record

    def warnings_of_assumption(self) -> bool:
        """Whether the family was assumed (a model type the registry does not know).

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").warnings_of_assumption()
        False
        """
        return any("is not in smoe's family registry" in w for w in self.warnings)

    def placement(self) -> dict[str, Any]:
        """What went where: the routed experts' tensors (to the vault), and the scout's
        tensors grouped by part of the model: the language model's own (under its prefix),
        and everything else by its leading name (a vision tower, a projector, an audio
        encoder, MTP layers kept beyond ``num_hidden_layers``, ``lm_head``...), unchanged.

        >>> Checkpoint.open("fixtures/checkpoints/qwen3_moe").placement()
        {'vault': {'tensors': 48, 'under': 'model.layers.'}, 'scout': {'lm_head': 1, 'model.': 20}}
        """
        scout: dict[str, int] = {}
        for t in self.non_expert_tensors():
            if self.prefix and t.name.startswith(self.prefix):
                group = self.prefix
            else:
                head = t.name.split(".")
                group = ".".join(head[:2]) if head[0] == "model" and len(head) > 2 else head[0]
            scout[group] = scout.get(group, 0) + 1
        return {
            "vault": {"tensors": len(self.expert_tensor_names), "under": self.stem},
            "scout": scout,
        }

    def non_expert_tensors(self) -> list[TensorInfo]:
        """Every tensor that is not a routed-expert weight: the scout's contents (D8).

        >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
        >>> [t.name for t in ck.non_expert_tensors()][:2]
        ['lm_head.weight', 'model.embed_tokens.weight']
        """
        return [t for n, t in sorted(self.tensors.items()) if n not in self.expert_tensor_names]
