"""The vault's fixed records: model facts in, packed header/table/descriptors/arch bytes out.

Everything is packed through the generated numpy dtypes (``smoe_gen.layout``), so the
byte layout has exactly one source: the .ksy.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields

import numpy as np

from smoe.errors import FormatError
from smoe.format.plan import Plan
from smoe.interop.safetensors_io import json_excerpt
from smoe.plumbing.atomic import Signature
from smoe_gen import layout

__all__ = [
    "U32_MAX",
    "ArchInfo",
    "ModelInfo",
    "arch_record",
    "header_record",
    "metadata_bytes",
    "model_type_problem",
    "model_type_str",
    "plain",
    "plain_rows",
    "table_records",
]

U32_MAX = 0xFFFFFFFF
"""The largest value of a uint32 field."""

_PRINTABLE = range(0x20, 0x7F)  # printable ASCII: space to tilde


def model_type_problem(name: str) -> str | None:
    """Why ``name`` cannot be an arch block's ``model_type``, or None when it can.

    A writer holds it to 1..24 printable ASCII characters: every such name passes ruling R2
    (UTF-8, NUL-padded) and prints as it is; anything else is refused, never cut (a cut or
    a NUL inside would change the name, a control character would reach a terminal).

    >>> model_type_problem("qwen3_moe") is None
    True
    >>> model_type_problem("a\\0b")
    'has U+0000 at character 1; it must be 1 to 24 printable ASCII characters'
    """
    bad = next((i for i, ch in enumerate(name) if ord(ch) not in _PRINTABLE), None)
    if bad is not None:
        why = f"has U+{ord(name[bad]):04X} at character {bad}"
    elif not name:
        why = "is empty"
    elif len(name) > layout.MODEL_TYPE_SIZE:
        why = f"is {len(name)} characters long"
    else:
        return None
    return f"{why}; it must be 1 to {layout.MODEL_TYPE_SIZE} printable ASCII characters"


def _as_float(value: float) -> float:
    """``value`` as a float; an integer too large for one (10**400) as infinity."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


@dataclass(frozen=True)
class ModelInfo:
    """Header facts about the model (ruling D5), the same for full and partial vaults.

    >>> ModelInfo(num_moe_layers=2, max_experts_per_layer=4, d_model=64, vocab_size=320, ffn_dim=32)
    ModelInfo(num_moe_layers=2, max_experts_per_layer=4, d_model=64, vocab_size=320, ffn_dim=32)
    """

    num_moe_layers: int
    max_experts_per_layer: int
    d_model: int
    vocab_size: int
    ffn_dim: int

    def check(self) -> None:
        """Refuse values a header cannot hold, naming the field.

        >>> ModelInfo(1, 8, d_model=0, vocab_size=0, ffn_dim=0).check()
        Traceback (most recent call last):
        smoe.errors.FormatError: header.d_model: must be at least 1, got 0
        """
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or not 0 <= value <= U32_MAX:
                raise FormatError(f"header.{f.name}: {value!r} is not a uint32")
        if self.d_model < 1:
            raise FormatError("header.d_model: must be at least 1, got 0")


@dataclass(frozen=True)
class ArchInfo:
    """The v2 arch block's model constants (ruling D6).

    >>> arch = ArchInfo(1e6, 4, 2, 16, moe_top_k=2, moe_ffn_dim=32, num_hidden_layers=2,
    ...                 rms_norm_eps=1e-6, model_type="qwen3_moe", has_qk_norm=True)
    >>> arch.head_dim, arch.flags, arch.activation
    (16, 2, 0)
    """

    rope_theta: float
    num_heads: int
    num_kv_heads: int
    head_dim: int
    moe_top_k: int
    moe_ffn_dim: int
    num_hidden_layers: int
    rms_norm_eps: float
    model_type: str
    norm_topk_prob: bool = False
    has_qk_norm: bool = False
    has_dense_layer_0: bool = False
    dense_ffn_dim: int = 0
    shared_expert_ffn_dim: int = 0
    activation: int = int(layout.Activation.SILU)

    @property
    def flags(self) -> int:
        """The arch block's ``flags``: one bit per boolean fact.

        >>> ArchInfo(1e6, 4, 2, 16, 2, 32, 2, 1e-6, "mixtral", norm_topk_prob=True).flags
        1
        """
        return (
            (layout.FLAG_NORM_TOPK_PROB if self.norm_topk_prob else 0)
            | (layout.FLAG_HAS_QK_NORM if self.has_qk_norm else 0)
            | (layout.FLAG_HAS_DENSE_LAYER_0 if self.has_dense_layer_0 else 0)
        )

    def check(self) -> None:
        """Refuse values the engine refuses (D6), naming the field.

        >>> ArchInfo(1e6, 4, 2, 16, moe_top_k=0, moe_ffn_dim=32, num_hidden_layers=2,
        ...          rms_norm_eps=1e-6, model_type="qwen3_moe").check()
        Traceback (most recent call last):
        smoe.errors.FormatError: arch.moe_top_k: 0 is outside 1..16
        """
        for name in (
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "moe_top_k",
            "moe_ffn_dim",
            "num_hidden_layers",
            "dense_ffn_dim",
            "shared_expert_ffn_dim",
            "activation",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value <= U32_MAX:
                raise FormatError(f"arch.{name}: {value!r} is not a uint32")
        if self.activation != layout.Activation.SILU:
            raise FormatError(
                f"arch.activation: {self.activation} is not 0 (SiLU), the only "
                "activation the kernels implement"
            )
        if not 1 <= self.moe_top_k <= layout.MAX_MOE_TOP_K:
            raise FormatError(
                f"arch.moe_top_k: {self.moe_top_k} is outside 1..{layout.MAX_MOE_TOP_K}"
            )
        if not 1 <= self.head_dim <= layout.MAX_HEAD_DIM:
            raise FormatError(f"arch.head_dim: {self.head_dim} is outside 1..{layout.MAX_HEAD_DIM}")
        if self.num_heads < 1:
            raise FormatError("arch.num_heads: must be at least 1, got 0")
        if self.num_kv_heads < 1:
            raise FormatError("arch.num_kv_heads: must be at least 1, got 0")
        if self.num_heads % self.num_kv_heads:
            raise FormatError(
                f"arch.num_heads: {self.num_heads} is not divisible by "
                f"num_kv_heads {self.num_kv_heads}"
            )
        for name in ("rope_theta", "rms_norm_eps"):
            raw = getattr(self, name)
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise FormatError(f"arch.{name}: {raw!r} is not a number")
            value = _as_float(raw)
            if not math.isfinite(value) or abs(value) > float(np.finfo(np.float32).max):
                raise FormatError(f"arch.{name}: {value!r} is not a finite float32")
            if value != 0 and float(np.float32(value)) == 0:
                raise FormatError(f"arch.{name}: {value!r} underflows to 0 as a float32")
        self._check_model_type()

    def _check_model_type(self) -> None:
        if not isinstance(self.model_type, str):
            raise FormatError(f"arch.model_type: {self.model_type!r} is not a string")
        problem = model_type_problem(self.model_type)
        if problem is not None:
            raise FormatError(f"arch.model_type: {json_excerpt(self.model_type)} {problem}")

    def model_type_bytes(self) -> bytes:
        """``model_type`` as the field's bytes (before the NUL padding); a name the field
        cannot hold as it is is refused, never cut.

        >>> ArchInfo(1e6, 4, 2, 16, 2, 32, 2, 1e-6, "qwen3_moe").model_type_bytes()
        b'qwen3_moe'
        >>> ArchInfo(1e6, 4, 2, 16, 2, 32, 2, 1e-6, "y" * 25).model_type_bytes()
        Traceback (most recent call last):
        smoe.errors.FormatError: arch.model_type: "yyyyyyyyyyyyyyyyyyyyyyyyy" is 25 characters \
long; it must be 1 to 24 printable ASCII characters
        """
        self._check_model_type()
        return self.model_type.encode("ascii")


def header_record(plan: Plan, model: ModelInfo) -> np.ndarray:
    """The 64-byte file header of a vault laid out by ``plan`` (a 0-d array of
    ``layout.HEADER_DTYPE``).

    >>> from smoe.format.plan import make_plan
    >>> plan = make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, bits=4, version=2)
    >>> h = header_record(plan, ModelInfo(1, 1, d_model=64, vocab_size=0, ffn_dim=0))
    >>> bytes(h["magic"][:4]), int(h["total_experts"]), int(h["data_offset"])
    (b'SMOE', 1, 16384)
    """
    h = np.zeros((), layout.HEADER_DTYPE)
    h["magic"] = np.frombuffer(layout.MAGIC, np.uint8)
    h["version"] = plan.version
    h["num_moe_layers"] = model.num_moe_layers
    h["max_experts_per_layer"] = model.max_experts_per_layer
    h["total_experts"] = len(plan.experts)
    h["table_offset"] = layout.TABLE_OFFSET
    h["data_offset"] = plan.data_offset
    h["group_size"] = layout.GROUP_SIZE
    h["bits"] = plan.bits
    h["d_model"] = model.d_model
    h["vocab_size"] = model.vocab_size
    h["ffn_dim"] = model.ffn_dim
    h["reserved_ext"] = plan.reserved_ext
    return h


def arch_record(arch: ArchInfo) -> np.ndarray:
    """The 128-byte arch block of ``arch`` (a 0-d array of ``layout.ARCH_BLOCK_DTYPE``);
    every value checked first (:meth:`ArchInfo.check`), so no block is made that the
    verifier rejects.

    >>> block = arch_record(ArchInfo(1e6, 4, 2, 16, 2, 32, 2, 1e-6, "qwen3_moe"))
    >>> len(block.tobytes()), bytes(block["magic"]), int(block["num_kv_heads"])
    (128, b'SARC', 2)
    """
    arch.check()
    a = np.zeros((), layout.ARCH_BLOCK_DTYPE)
    a["magic"] = np.frombuffer(layout.ARCH_MAGIC, np.uint8)
    a["block_version"] = layout.ARCH_BLOCK_VERSION
    a["block_size"] = layout.ARCH_BLOCK_SIZE
    a["flags"] = arch.flags
    for name in (
        "rope_theta",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "moe_top_k",
        "moe_ffn_dim",
        "dense_ffn_dim",
        "shared_expert_ffn_dim",
        "activation",
        "num_hidden_layers",
        "rms_norm_eps",
    ):
        a[name] = getattr(arch, name)
    a["model_type"] = arch.model_type_bytes()
    return a


def model_type_str(raw: bytes | np.bytes_ | np.ndarray) -> str:
    """The arch block's ``model_type`` field (its 24 bytes, or the record's value, which
    numpy has already cut at the trailing NULs) as text: NUL padding dropped, bytes that
    are not UTF-8 replaced (a reader shows what a damaged vault holds, it does not refuse).

    >>> model_type_str(b"qwen3_moe" + bytes(15))
    'qwen3_moe'
    >>> model_type_str(bytes([98, 97, 100, 0xFF])) == "bad\\ufffd"  # not UTF-8: replaced
    True
    >>> block = arch_record(ArchInfo(1e6, 4, 2, 16, 2, 32, 2, 1e-6, "olmoe"))
    >>> model_type_str(block["model_type"])
    'olmoe'
    """
    return bytes(raw).rstrip(b"\0").decode("utf-8", "replace")


def table_records(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """The expert table and the descriptors, as structured arrays in table order.

    >>> from smoe.format.plan import make_plan
    >>> shapes = ((32, 64), (32, 64), (64, 32))
    >>> table, descs = table_records(make_plan({(0, 0): shapes, (0, 1): shapes}, 4, 2))
    >>> table["byte_offset"].tolist(), descs["rows"].tolist()
    ([16384, 32768], [32, 32, 64, 32, 32, 64])
    """
    n = len(plan.experts)
    table = np.zeros(n, layout.EXPERT_ENTRY_DTYPE)
    descs = np.zeros(n * layout.TENSORS_PER_EXPERT, layout.TENSOR_DESCRIPTOR_DTYPE)
    if n == 0:
        return table, descs
    table["layer_id"] = [e.layer_id for e in plan.experts]
    table["expert_id"] = [e.expert_id for e in plan.experts]
    table["byte_offset"] = [e.byte_offset for e in plan.experts]
    table["raw_size"] = [e.raw_size for e in plan.experts]
    table["padded_size"] = [e.padded_size for e in plan.experts]
    table["group_size"] = layout.GROUP_SIZE
    table["num_groups"] = [e.num_groups for e in plan.experts]
    slots = [t for e in plan.experts for t in e.tensors]
    descs["tensor_type"] = np.tile(np.arange(layout.TENSORS_PER_EXPERT), n)
    descs["ndim"] = layout.TENSOR_NDIM
    for name in ("rows", "cols", "packed_offset", "packed_size", "scales_offset", "scales_size"):
        descs[name] = [getattr(t, name) for t in slots]
    return table, descs


def metadata_bytes(plan: Plan, model: ModelInfo, arch: ArchInfo | None) -> bytes:
    """Everything before ``data_offset``: header, table, descriptors, arch block, zero gap.

    >>> from smoe.format.plan import make_plan
    >>> plan = make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, bits=4, version=2)
    >>> model = ModelInfo(1, 1, d_model=64, vocab_size=0, ffn_dim=0)
    >>> meta = metadata_bytes(plan, model, ArchInfo(1e6, 4, 2, 16, 2, 32, 2, 1e-6, "qwen3_moe"))
    >>> len(meta) == plan.data_offset, meta[:4], meta[plan.reserved_ext :][:4]
    (True, b'SMOE', b'SARC')
    """
    out = bytearray(plan.data_offset)
    out[: layout.HEADER_SIZE] = header_record(plan, model).tobytes()
    table, descs = table_records(plan)
    out[layout.TABLE_OFFSET : plan.descriptors_offset] = table.tobytes()
    out[plan.descriptors_offset : plan.descriptors_end] = descs.tobytes()
    if plan.version >= layout.VERSION_WITH_ARCH:
        if arch is None:
            raise FormatError(f"a v{plan.version} vault needs an arch block")
        out[plan.reserved_ext : plan.reserved_ext + layout.ARCH_BLOCK_SIZE] = arch_record(
            arch
        ).tobytes()
    return bytes(out)


def plain(rec: np.void | np.ndarray) -> dict:
    """One structured record as JSON-ready values: ints, floats, strings, hex for bytes.

    >>> from smoe.format.view import FileView, header_view
    >>> with FileView.open("fixtures/q4_v2.smoe") as view:
    ...     header = plain(header_view(view))
    >>> header["magic"], header["version"], header["total_experts"], header["data_offset"]
    ('534d4f45deea0001', 2, 8, 16384)
    """
    if isinstance(rec, np.ndarray):
        rec = rec[()]
    out = {}
    for name in rec.dtype.names or ():  # a structured record: names is set
        v = rec[name]
        if isinstance(v, bytes):
            out[name] = v.decode("utf-8", "replace")
        elif getattr(v, "shape", ()) != ():
            out[name] = bytes(np.asarray(v, np.uint8)).hex()
        else:
            out[name] = v.item()
    return out


def plain_rows(arr: np.ndarray) -> list[dict]:
    """A structured array as a list of ``plain`` dicts, converted per field (fast).

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as vault:
    ...     rows = plain_rows(vault.table)
    >>> len(rows), rows[1]
    (8, {'layer_id': 0, 'expert_id': 1, 'byte_offset': 32768, 'raw_size': 3264, \
'padded_size': 16384, 'group_size': 64, 'num_groups': 96, 'reserved': '00000000'})
    """
    cols = {}
    for name in arr.dtype.names or ():  # a structured array: names is set
        col = arr[name]
        cols[name] = [bytes(r).hex() for r in col] if col.ndim > 1 else col.tolist()
    return [dict(zip(cols, vals)) for vals in zip(*cols.values())]


def _starts_with_magic(fd: int) -> bool:
    return os.pread(fd, len(layout.MAGIC), 0) == layout.MAGIC


# a vault is known again by its magic: what sculpt --force and upgrade --out --force replace
VAULT_SIGNATURE = Signature("a .smoe vault", _starts_with_magic)
