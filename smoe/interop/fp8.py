"""FP8 weights of HuggingFace checkpoints: which scheme scales them, and their values as
bfloat16 (or float32), row chunk by row chunk, in bounded memory.

Two ways of shipping FP8 weights are read, both ``weight = float32(fp8) * float32(scale)``:

* **block-scaled**, as DeepSeek-V3/R1/V3.1/V3.2, Kimi-K2 and MiniMax-M2 ship it: ``X.weight``
  ``F8_E4M3`` (or ``F8_E5M2``) ``[R, C]`` and ``X.weight_scale_inv``
  ``[ceil(R/br), ceil(C/bc)]``, one scale per ``br x bc`` block (despite its name the scale
  multiplies); compressed-tensors' block and group strategies spell it ``X.weight_scale``;
* **per output channel** or **per tensor** (compressed-tensors / llm-compressor, fbgemm,
  ModelOpt FP8): ``X.weight_scale`` ``[R, 1]`` or ``[R]``, or ``[]``, ``[1]``, ``[1, 1]``.

Both are one arithmetic: a channel scale is a block of ``1 x C``, a tensor scale one of
``R x C``, so :class:`Scheme` resolves every scheme to a block and :func:`dequantize_bf16`
knows only blocks. Its result is bit for bit what DeepSeek's ``fp8_cast_bf16.py`` writes
(``weight.float() * scale``, rounded to bfloat16 to nearest even, as torch rounds).

Everything else quantised (MXFP4, NVFP4, INT4/INT8 packs, GPTQ, AWQ, bitsandbytes, HQQ) is
refused by :func:`scheme_of`, naming the format: its values are not weights until decoded
by rules this module does not implement, and must never be read as if they were.

Rulings:

* **block size**: the declared one (``quantization_config.weight_block_size`` of
  config.json, or compressed-tensors' ``config_groups.*.weights.block_structure``, or
  ``(1, group_size)`` for its ``group`` strategy: :func:`declared_block`, which refuses
  declarations that differ and values that are not two positive integers below 2^31) must
  give the scale shape exactly, else the weight is refused. Without one, each axis of ``n``
  weights and ``s`` scales takes the smallest power of two ``b >= ceil(n/s)`` with
  ``ceil(n/b) == s``; if there is none, the single ``b`` that
  gives ``s`` blocks; if several do and none is a power of two, the weight is refused as
  ambiguous. (With ``s >= 2`` at most one power of two fits; with ``s == 1`` every fitting
  ``b`` gives the same values.) See :func:`block_size`.
* **non-finite results** (an FP8 NaN code, an E5M2 infinity, a NaN or huge scale, a product
  beyond bfloat16's range) are refused by the dequantiser, naming the weight's row and
  column: the sculptor stores finite weights only, and the first one found is the useful
  message.
* **FP8 without scales** is refused, not read with scale 1: a scale tensor missing from a
  shard would otherwise go unnoticed.

Memory: a chunk of :data:`CHUNK_ELEMENTS` weights (at least one row) is decoded at a time,
so beyond the output about ``8 * max(CHUNK_ELEMENTS, C)`` bytes are used (a float32 chunk
and its uint32 scratch; 8 MiB by default), never a float32 copy of the matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from smoe.errors import RefusedInput
from smoe.interop.safetensors_io import FLOAT_DTYPES, TensorInfo, json_excerpt, read_array

__all__ = [
    "CHUNK_ELEMENTS",
    "FP8_DTYPES",
    "MAX_DECLARED_BLOCK",
    "DeclaredBlock",
    "Scheme",
    "block_size",
    "declared_block",
    "dequantize_bf16",
    "dequantize_f32",
    "fp8_table",
    "read_scale",
    "scale_f32",
    "scheme_of",
]

CHUNK_ELEMENTS = 1 << 20
"""Weights decoded at a time (rounded down to whole rows, at least one): 4 MiB of float32."""

FP8_DTYPES = ("F8_E4M3", "F8_E5M2")
"""The safetensors dtypes of the FP8 weights read here."""

SchemeKind = Literal["none", "fp8-block", "fp8-channel", "fp8-tensor"]

_WHY = "only BF16, F16 and F32 weights, and FP8 ones with their scales, can be read"
_SCALE_DTYPES = ("F32", "BF16", "F16")
_WEIGHT_BLOCK_SIZE = "quantization_config.weight_block_size"


# ---------------------------------------------------------------------------- the codes


def _e4m3_table() -> np.ndarray:
    """E4M3 "fn" (OCP FP8, as torch.float8_e4m3fn): bias 7, no infinities, S.1111.111 NaN."""
    code = np.arange(256, dtype=np.uint32)
    sign = (code & 0x80) << 24
    exp = (code >> 3) & 0xF
    man = code & 0x7
    normal = ((exp + (127 - 7)) << 23) | (man << 20)
    sub = np.ldexp(man.astype(np.float32), -9).view(np.uint32)  # 0.man x 2^-6, exact
    bits = np.where(exp == 0, sub, normal) | sign
    bits[(code & 0x7F) == 0x7F] = (sign | 0x7FC00000)[(code & 0x7F) == 0x7F]
    return bits.view(np.float32)


def _e5m2_table() -> np.ndarray:
    """E5M2 (as torch.float8_e5m2): IEEE-like, bias 15, infinities and NaNs."""
    code = np.arange(256, dtype=np.uint32)
    sign = (code & 0x80) << 24
    exp = (code >> 2) & 0x1F
    man = code & 0x3
    normal = ((exp + (127 - 15)) << 23) | (man << 21)
    sub = np.ldexp(man.astype(np.float32), -16).view(np.uint32)  # 0.man x 2^-14, exact
    special = np.where(man == 0, 0x7F800000, 0x7FC00000 | (man << 21))  # inf, quiet NaN
    bits = np.where(exp == 0, sub, np.where(exp == 31, special, normal)) | sign
    return bits.astype(np.uint32).view(np.float32)


_TABLES = {"F8_E4M3": _e4m3_table(), "F8_E5M2": _e5m2_table()}
for _table in _TABLES.values():
    _table.setflags(write=False)


def fp8_table(dtype: str) -> np.ndarray:
    """The 256 float32 values of an FP8 dtype's codes (read-only), indexed by the byte.

    >>> fp8_table("F8_E4M3")[[0x7E, 0x01, 0xB8, 0x7F]]  # max, least subnormal, -1, NaN
    array([ 4.480000e+02,  1.953125e-03, -1.000000e+00,           nan], dtype=float32)
    >>> fp8_table("F8_E5M2")[[0x7B, 0x7C, 0xFC]]
    array([57344.,    inf,   -inf], dtype=float32)
    """
    try:
        return _TABLES[dtype]
    except KeyError:
        raise ValueError(f"not an FP8 dtype: {dtype!r} (expected one of {FP8_DTYPES})") from None


def scale_f32(values: np.ndarray, dtype: str) -> np.ndarray:
    """A scale tensor's values, as :func:`~smoe.interop.safetensors_io.read_array` gives
    them (``F32``, ``F16``, or ``BF16`` bit patterns as uint16), widened to float32 exactly
    (the product is taken in float32 whatever the scales' dtype, as torch promotes).

    >>> scale_f32(np.array([0x3F80, 0xC040], np.uint16), "BF16")
    array([ 1., -3.], dtype=float32)
    >>> scale_f32(np.array(0.25, np.float16), "F16")
    array(0.25, dtype=float32)
    """
    if dtype not in _SCALE_DTYPES:
        raise ValueError(f"scales must be F32, BF16 or F16, not {dtype}")
    a = np.asarray(values)
    if a.dtype.itemsize != FLOAT_DTYPES[dtype].itemsize or a.dtype.kind != (
        "u" if dtype == "BF16" else "f"
    ):
        raise ValueError(f"{dtype} scales must be given as {FLOAT_DTYPES[dtype]}, not {a.dtype}")
    if dtype == "BF16":
        wide = a.astype(np.uint32)
        wide <<= 16
        return wide.view(np.float32)
    return a.astype(np.float32)


def read_scale(info: TensorInfo, fd: int | None = None) -> np.ndarray:
    """A scale tensor read with positioned reads, as float32 in its own shape.

    >>> from pathlib import Path
    >>> from smoe.interop.safetensors_io import read_header
    >>> shard = Path("fixtures/checkpoints/qwen3_moe/model.safetensors")
    >>> norm = read_scale(read_header(shard)["model.norm.weight"])  # any float tensor reads
    >>> norm.dtype, norm.shape
    (dtype('float32'), (64,))
    """
    return scale_f32(read_array(info, fd), info.dtype)


# ---------------------------------------------------------------------------- block sizes


def _axis(n: int, s: int) -> tuple[int, int | None] | None:
    """The block lengths ``b`` with ``ceil(n/b) == s``: ``(lo, hi)`` (hi None: unbounded),
    or None when there is none."""
    if n < 1 or s < 1 or s > n:
        return None
    lo = -(-n // s)
    hi = None if s == 1 else -(-n // (s - 1)) - 1
    return None if hi is not None and lo > hi else (lo, hi)


def _need(shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, int]:
    return -(-shape[0] // block[0]), -(-shape[1] // block[1])


def block_size(
    shape: tuple[int, ...],
    scale_shape: tuple[int, ...],
    declared: tuple[int, int] | None = None,
    *,
    what: str = "FP8 weight",
) -> tuple[int, int]:
    """The ``(rows, columns)`` of weights one scale covers, for a weight of ``shape`` and
    block scales of ``scale_shape`` (both 2-D), by the module's ruling: ``declared`` (from
    :func:`declared_block`) must fit exactly; else the smallest fitting power of two per
    axis, else the only fitting length. ``what`` names the weight in refusals.

    >>> block_size((7168, 2048), (56, 16))
    (128, 128)
    >>> block_size((200, 300), (2, 3))  # 100..199 rows and 100..149 columns fit: 128 each
    (128, 128)
    >>> block_size((10, 256), (4, 2))  # only 3 rows give 4 blocks of 10
    (3, 128)
    >>> block_size((256, 256), (2, 2), (100, 128))
    Traceback (most recent call last):
    smoe.errors.RefusedInput: FP8 weight: scale shape [2, 2] does not fit weight shape \
[256, 256] in the declared blocks [100, 128] (quantization_config.weight_block_size), which \
need [3, 2]; refused: the scales would be applied to the wrong weights
    """
    if len(shape) != 2 or len(scale_shape) != 2:
        raise ValueError(f"block scales need 2-D shapes, got {list(shape)} and {list(scale_shape)}")
    sh = (int(shape[0]), int(shape[1]))
    ssh = (int(scale_shape[0]), int(scale_shape[1]))
    if declared is not None:
        br, bc = int(declared[0]), int(declared[1])
        key = getattr(declared, "key", _WEIGHT_BLOCK_SIZE)
        if br < 1 or bc < 1:
            raise ValueError(f"block sizes must be positive, got {list(declared)}")
        need = _need(sh, (br, bc))
        if need != ssh:
            raise RefusedInput(
                f"{what}: scale shape {list(ssh)} does not fit weight shape {list(sh)} in the "
                f"declared blocks {[br, bc]} ({key}), which "
                f"need {list(need)}; refused: the scales would be applied to the wrong weights"
            )
        return br, bc
    out = []
    for n, s, axis in ((sh[0], ssh[0], "rows"), (sh[1], ssh[1], "columns")):
        fit = _axis(n, s)
        if fit is None:
            raise RefusedInput(
                f"{what}: scale shape {list(ssh)} fits weight shape {list(sh)} with no block "
                f"size ({n} {axis} cannot form {s} blocks); refused: the scales cannot be "
                "matched to the weights"
            )
        lo, hi = fit
        p = 1 << (lo - 1).bit_length()  # the smallest power of two >= lo
        if hi is None or p <= hi:
            out.append(p)
        elif lo == hi:
            out.append(lo)
        else:
            raise RefusedInput(
                f"{what}: scale shape {list(ssh)} fits weight shape {list(sh)} with blocks of "
                f"{lo} to {hi} {axis}, none a power of two; refused: the block size is "
                "ambiguous (config.json declares none in quantization_config.weight_block_size)"
            )
    return out[0], out[1]


class DeclaredBlock(tuple[int, int]):
    """A block size config.json declares, ``(rows, columns)``, and the key that declares it
    (``key``: ``quantization_config.weight_block_size`` or a compressed-tensors group's
    ``block_structure``), which refusals name.

    >>> b = DeclaredBlock((128, 64), "quantization_config.weight_block_size")
    >>> b, b.key
    ((128, 64), 'quantization_config.weight_block_size')
    """

    key: str

    def __new__(cls, block: tuple[int, int], key: str) -> DeclaredBlock:
        self = super().__new__(cls, block)
        self.key = key
        return self


MAX_DECLARED_BLOCK = (1 << 31) - 1
"""The largest block length per axis a config.json may declare (a larger one is refused,
never carried into index arithmetic)."""


def _pair(value: object, key: str, where: str) -> DeclaredBlock:
    """``value`` as a declared block: two positive integers (not booleans) up to
    :data:`MAX_DECLARED_BLOCK`, else refused naming ``key``."""
    if not (
        isinstance(value, list) and len(value) == 2 and all(type(v) is int and v > 0 for v in value)
    ):
        raise RefusedInput(
            f"{where}: {key} is {json_excerpt(value)}, expected two positive integers"
        )
    if max(value) > MAX_DECLARED_BLOCK:
        raise RefusedInput(
            f"{where}: {key} is {json_excerpt(value)}, expected two positive integers of at "
            f"most {MAX_DECLARED_BLOCK} (2^31 - 1)"
        )
    return DeclaredBlock((value[0], value[1]), key)


def _group_blocks(qc: Mapping[str, object], where: str) -> list[DeclaredBlock]:
    """The blocks compressed-tensors' ``config_groups`` declare for weights: a group's
    ``weights.block_structure`` (strategy ``block``), or ``(1, group_size)`` for strategy
    ``group``; refused where they are not of that shape."""
    groups = qc.get("config_groups")
    if groups is None:
        return []
    if not isinstance(groups, dict):
        raise RefusedInput(
            f"{where}: quantization_config.config_groups is {json_excerpt(groups)}, expected "
            "an object"
        )
    out = []
    for name, group in groups.items():
        at = f"quantization_config.config_groups.{name}"
        if not isinstance(group, dict):
            raise RefusedInput(f"{where}: {at} is {json_excerpt(group)}, expected an object")
        weights = group.get("weights")
        if weights is None:
            continue
        if not isinstance(weights, dict):
            raise RefusedInput(
                f"{where}: {at}.weights is {json_excerpt(weights)}, expected an object"
            )
        if weights.get("block_structure") is not None:
            out.append(_pair(weights["block_structure"], f"{at}.weights.block_structure", where))
        if weights.get("strategy") == "group" and weights.get("group_size") is not None:
            size = weights["group_size"]
            key = f"{at}.weights.group_size"
            if type(size) is not int or not 0 < size <= MAX_DECLARED_BLOCK:
                raise RefusedInput(
                    f"{where}: {key} is {json_excerpt(size)}, expected a positive integer of "
                    f"at most {MAX_DECLARED_BLOCK} (2^31 - 1)"
                )
            out.append(DeclaredBlock((1, size), key))
    return out


def declared_block(
    config: Mapping[str, object], where: str = "config.json"
) -> DeclaredBlock | None:
    """The block size a config.json declares for FP8 weights (None when none is):
    ``quantization_config.weight_block_size`` (DeepSeek, transformers' fine-grained FP8), or
    compressed-tensors' ``config_groups.*.weights.block_structure`` (``(1, group_size)`` for
    a ``group`` strategy). Every declaration is read: several that differ are refused, as
    are values that are not two positive integers below 2^31.

    >>> declared_block({"quantization_config": {"quant_method": "fp8",
    ...                                          "weight_block_size": [128, 128]}})
    (128, 128)
    >>> ct = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
    ...     "weights": {"num_bits": 8, "type": "float", "strategy": "block",
    ...                 "block_structure": [128, 64]}, "targets": ["Linear"]}}}
    >>> b = declared_block({"quantization_config": ct})
    >>> b, b.key
    ((128, 64), 'quantization_config.config_groups.group_0.weights.block_structure')
    >>> declared_block({"model_type": "qwen3_moe"}) is None
    True
    >>> declared_block({"quantization_config": {"weight_block_size": [128, 0]}})
    Traceback (most recent call last):
    smoe.errors.RefusedInput: config.json: quantization_config.weight_block_size is [128, 0], \
expected two positive integers
    """
    qc = config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise RefusedInput(
            f"{where}: quantization_config is {json_excerpt(qc)}, expected an object"
        )
    found = _group_blocks(qc, where)
    if qc.get("weight_block_size") is not None:
        found.insert(0, _pair(qc["weight_block_size"], _WEIGHT_BLOCK_SIZE, where))
    for other in found[1:]:
        if tuple(other) != tuple(found[0]):
            raise RefusedInput(
                f"{where}: {found[0].key} declares blocks {list(found[0])}, but {other.key} "
                f"declares {list(other)}; refused: which one scales the experts cannot be told"
            )
    return found[0] if found else None


# ---------------------------------------------------------------------------- schemes


class _Tensor(Protocol):
    """What :func:`scheme_of` needs of a tensor (a TensorInfo has it)."""

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Scheme:
    """How a weight is stored: ``kind`` (``none``: a plain BF16/F16/F32 tensor), its
    ``dtype``, the ``scale`` tensor's name and the ``block`` of ``(rows, columns)`` of a 2-D
    matrix one scale covers (``(1, C)`` per channel, ``(R, C)`` per tensor; None for
    ``none``). ``stacked``: the weight is a stack of matrices (``[E, R, C]``, fused experts)
    and the scales have its leading dimensions: matrix ``i`` takes ``scale[i]``; otherwise
    every matrix of a stack takes the whole scale tensor.

    >>> Scheme("fp8-block", "F8_E4M3", "x.weight_scale_inv", (128, 128)).block
    (128, 128)
    """

    kind: SchemeKind
    dtype: str
    scale: str | None = None
    block: tuple[int, int] | None = None
    stacked: bool = False


_MXFP4 = "MXFP4", "gpt-oss style _blocks/_scales"
_GPTQ = "GPTQ or AWQ", "qweight/qzeros/scales"
_BNB4 = "bitsandbytes 4-bit", "absmax/quant_map"
# (suffix added to the weight's name or, with a leading "~", to its module's; format, detail)
_OTHER_FORMATS: tuple[tuple[str, tuple[str, str]], ...] = (
    ("_blocks", _MXFP4),
    ("~_blocks", _MXFP4),
    ("_global_scale", ("NVFP4", "compressed-tensors nvfp4-pack-quantized")),
    ("_scale_2", ("NVFP4", "ModelOpt style weight_scale_2")),
    ("_packed", ("INT4/INT8 packed", "compressed-tensors pack-quantized weight_packed")),
    ("~.qweight", _GPTQ),
    ("~.qzeros", _GPTQ),
    ("~.scales", _GPTQ),
    (".absmax", _BNB4),
    (".quant_map", _BNB4),
    (".quant_state.bitsandbytes__nf4", _BNB4),
    (".quant_state.bitsandbytes__fp4", _BNB4),
    ("~.SCB", ("bitsandbytes 8-bit", "SCB")),
    ("~.W_q", ("HQQ", "W_q/meta")),
    ("_zero_point", ("asymmetric", "weight_zero_point")),
    ("_g_idx", ("activation-ordered", "weight_g_idx")),
)


def scheme_of(
    name: str,
    tensors: Mapping[str, _Tensor],
    declared: tuple[int, int] | None = None,
    *,
    where: str | None = None,
) -> Scheme:
    """How the weight ``name`` (``X.weight``; gpt-oss style fused experts have no
    ``.weight``) is stored, from the names, dtypes and shapes of every tensor of the
    checkpoint (``tensors``: name -> TensorInfo, or anything with dtype and shape), or
    RefusedInput naming the tensor and its format when it cannot be read. ``declared``: the
    block size config.json declares (:func:`declared_block`). Messages start with
    ``where``, else with the path of the weight's TensorInfo when it has one.

    The companions of other formats are looked for by exact name (no scan of the names):
    a call costs a few dictionary lookups.

    >>> from typing import NamedTuple
    >>> class T(NamedTuple):
    ...     dtype: str
    ...     shape: tuple
    >>> ck = {"e.weight": T("F8_E4M3", (200, 300)), "e.weight_scale_inv": T("F32", (2, 3)),
    ...       "c.weight": T("F8_E4M3", (200, 300)), "c.weight_scale": T("BF16", (200, 1)),
    ...       "g.gate_up_proj_blocks": T("U8", (32, 90, 16)), "n.weight": T("BF16", (4,))}
    >>> scheme_of("e.weight", ck)
    Scheme(kind='fp8-block', dtype='F8_E4M3', scale='e.weight_scale_inv', block=(128, 128), \
stacked=False)
    >>> s = scheme_of("c.weight", ck)
    >>> s.kind, s.scale, s.block
    ('fp8-channel', 'c.weight_scale', (1, 300))
    >>> scheme_of("n.weight", ck).kind
    'none'
    >>> scheme_of("g.gate_up_proj", ck, where="m/model.safetensors")
    Traceback (most recent call last):
    smoe.errors.RefusedInput: m/model.safetensors: tensor 'g.gate_up_proj' is MXFP4 (gpt-oss \
style _blocks/_scales: found 'g.gate_up_proj_blocks'); refused: only BF16, F16 and F32 weights, \
and FP8 ones with their scales, can be read
    """
    info = tensors.get(name)
    if where is None:
        path = getattr(info, "path", None)
        where = None if path is None else str(path)
    prefix = "" if where is None else f"{where}: "

    def refuse(what: str, why: str = _WHY) -> RefusedInput:
        return RefusedInput(f"{prefix}tensor {name!r} is {what}; refused: {why}")

    stem = name.removesuffix(".weight")
    for suffix, (fmt, detail) in _OTHER_FORMATS:
        other = stem + suffix[1:] if suffix.startswith("~") else name + suffix
        if other in tensors:
            raise refuse(f"{fmt} ({detail}: found {other!r})")
    if info is None:
        raise RefusedInput(f"{prefix}tensor {name!r} is not in the checkpoint")
    dtype, shape = info.dtype, tuple(int(d) for d in info.shape)
    scales = [name + s for s in ("_scale_inv", "_scale") if name + s in tensors]
    if len(scales) == 2:
        raise refuse(
            f"{dtype} with two scale tensors, {scales[0]!r} and {scales[1]!r}",
            "which one applies is ambiguous",
        )
    if not scales:
        if dtype in FLOAT_DTYPES:
            return Scheme("none", dtype)
        if dtype in FP8_DTYPES:
            raise refuse(
                f"{dtype} without scales (neither {name + '_scale_inv'!r} nor "
                f"{name + '_scale'!r} is in the checkpoint)",
                "FP8 weights are read only with their scales",
            )
        raise refuse(dtype)
    scale = scales[0]
    if dtype in FLOAT_DTYPES:
        raise refuse(
            f"{dtype} with scales in {scale!r}",
            "its values are not the weights without the scales; only FP8 weights are read "
            "with scales",
        )
    if dtype not in FP8_DTYPES:
        raise refuse(f"{dtype} with scales in {scale!r} (integer or packed 4-bit quantisation)")
    sinfo = tensors[scale]
    if sinfo.dtype not in _SCALE_DTYPES:
        raise refuse(
            f"{dtype} with scales {scale!r} of dtype {sinfo.dtype}",
            "FP8 scales must be F32, BF16 or F16",
        )
    if len(shape) < 2 or 0 in shape:
        raise refuse(
            f"{dtype} {list(shape)}",
            "FP8 weights are dequantised as 2-D matrices (or stacks of them)",
        )
    sshape = tuple(int(d) for d in sinfo.shape)
    lead, (rows, cols) = shape[:-2], shape[-2:]
    stacked = bool(lead) and sshape[: len(lead)] == lead
    stacked = stacked and (scale.endswith("_scale") or len(sshape) == len(shape))
    slab = sshape[len(lead) :] if stacked else sshape
    if scale.endswith("_scale"):
        if slab in ((), (1,), (1, 1)):
            return Scheme("fp8-tensor", dtype, scale, (rows, cols), stacked)
        if slab in ((rows,), (rows, 1)):
            return Scheme("fp8-channel", dtype, scale, (1, cols), stacked)
    if len(slab) != 2:
        raise refuse(
            f"{dtype} {list(shape)} with scales {scale!r} of shape {list(sshape)}",
            "the scales are neither per tensor, per channel nor per 2-D block",
        )
    what = f"{prefix}tensor {name!r} (scales {scale!r})"
    block = block_size((rows, cols), slab, declared, what=what)
    return Scheme("fp8-block", dtype, scale, block, stacked)


# ---------------------------------------------------------------------------- dequantising

_BF16_INF_FROM = 0x7F7F8000  # |x| bits from which float32 rounds to bfloat16 inf (or is NaN)
_F32_INF = 0x7F800000


def dequantize_bf16(
    raw: np.ndarray,
    dtype: str,
    scale: np.ndarray,
    block: tuple[int, int],
    out: np.ndarray | None = None,
    *,
    where: str = "FP8 weight",
) -> np.ndarray:
    """``float32(fp8) * scale`` of a weight, rounded to bfloat16 to nearest even: the bit
    patterns as uint16 ``[R, C]`` (into ``out`` if given: uint16, C-contiguous, ``[R, C]``).

    ``raw``: the weight's bytes as uint8 ``[R, C]`` (``dtype`` ``F8_E4M3`` or ``F8_E5M2``);
    ``scale``: float32 (:func:`scale_f32`) ``[ceil(R/br), ceil(C/bc)]`` for ``block`` ``(br,
    bc)`` (a per-tensor ``[]``/``[1]`` or per-channel ``[R]`` scale is taken as one column);
    :class:`Scheme` gives the block. A non-finite result (or one beyond bfloat16's range)
    raises RefusedInput naming ``where``, the row and the column.

    >>> raw = np.array([[0x38, 0xC0], [0x7E, 0x01]], np.uint8)  # 1, -2, 448, 2^-9
    >>> [hex(v) for v in dequantize_bf16(raw, "F8_E4M3", np.float32([[0.5]]), (128, 128)).flat]
    ['0x3f00', '0xbf80', '0x4360', '0x3a80']
    >>> raw[1, 0] = 0x7F  # NaN
    >>> dequantize_bf16(raw, "F8_E4M3", np.float32([[0.5]]), (128, 128), where="t 'w'")
    Traceback (most recent call last):
    smoe.errors.RefusedInput: t 'w': weight at row 1 col 0 is not finite once dequantised \
(F8_E4M3 code 0x7f = nan, times scale 0.5 = nan); refused: FP8 weights must dequantise to \
finite values
    """
    return _dequantize(raw, dtype, scale, block, out, np.dtype(np.uint16), where)


def dequantize_f32(
    raw: np.ndarray,
    dtype: str,
    scale: np.ndarray,
    block: tuple[int, int],
    out: np.ndarray | None = None,
    *,
    where: str = "FP8 weight",
) -> np.ndarray:
    """:func:`dequantize_bf16` without the rounding: float32 ``[R, C]`` (a product
    overflowing float32 is refused; bfloat16's narrower top is not checked).

    >>> raw = np.array([[0x38, 0x39], [0x3A, 0x3B]], np.uint8)  # 1, 1.125, 1.25, 1.375
    >>> dequantize_f32(raw, "F8_E4M3", np.float32([2, 4]), (1, 2))  # per channel
    array([[2.  , 2.25],
           [5.  , 5.5 ]], dtype=float32)
    """
    return _dequantize(raw, dtype, scale, block, out, np.dtype(np.float32), where)


def _check_args(
    raw: np.ndarray,
    scale: np.ndarray,
    block: tuple[int, int],
    out: np.ndarray | None,
    kind: np.dtype,
) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """``(scale as 2-D, out, (br, bc))``, every argument checked (ValueError: a misuse)."""
    if raw.dtype != np.uint8 or raw.ndim != 2:
        raise ValueError(f"raw must be a 2-D uint8 array, got {raw.dtype} {list(raw.shape)}")
    shape = (int(raw.shape[0]), int(raw.shape[1]))
    br, bc = int(block[0]), int(block[1])
    if br < 1 or bc < 1:
        raise ValueError(f"block sizes must be positive, got {list(block)}")
    sc = np.asarray(scale)
    if sc.dtype != np.float32:
        raise ValueError(f"scale must be float32 (see scale_f32), got {sc.dtype}")
    sc = sc.reshape(-1, 1) if sc.ndim < 2 else sc
    need = _need(shape, (br, bc))
    if sc.shape != need:
        raise ValueError(
            f"scale of shape {list(np.shape(scale))} does not fit a weight {list(shape)} in "
            f"blocks of {[br, bc]}: {list(need)} needed"
        )
    if out is None:
        out = np.empty(shape, kind)
    elif out.shape != shape or out.dtype != kind or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {kind.name} array of shape {list(shape)}")
    return sc, out, (br, bc)


def _dequantize(
    raw: np.ndarray,
    dtype: str,
    scale: np.ndarray,
    block: tuple[int, int],
    out: np.ndarray | None,
    kind: np.dtype,
    where: str,
) -> np.ndarray:
    """Decode, scale, check and (for uint16 ``kind``) round, :data:`CHUNK_ELEMENTS` at a
    time; chunks start at block rows when a chunk holds several."""
    table = fp8_table(dtype)
    sc, out, (br, bc) = _check_args(raw, scale, block, out, kind)
    n_rows, n_cols = out.shape
    step = max(1, CHUNK_ELEMENTS // max(n_cols, 1))
    step -= step % br if step >= br else 0
    scratch = np.empty(step * n_cols, np.uint32)
    limit = _BF16_INF_FROM if kind == np.uint16 else _F32_INF
    for r0 in range(0, n_rows, step):
        r1 = min(r0 + step, n_rows)
        f = table[raw[r0:r1]]  # float32 [r1 - r0, C], exact
        with np.errstate(invalid="ignore", over="ignore"):  # refused below, by position
            _scale_rows(f, sc, r0, br, bc, n_cols)
        bits = f.reshape(-1).view(np.uint32)
        s = scratch[: bits.size]
        np.bitwise_and(bits, 0x7FFFFFFF, out=s)
        if s.size and int(s.max()) >= limit:
            raise _non_finite(raw, dtype, sc, (br, bc), f, r0, limit, where)
        if kind == np.uint16:  # c10::BFloat16's round_to_nearest_even (no NaN left here)
            np.right_shift(bits, 16, out=s)
            np.bitwise_and(s, 1, out=s)
            s += 0x7FFF
            s += bits
            s >>= 16
            np.copyto(out[r0:r1].reshape(-1), s, casting="unsafe")
        else:
            out[r0:r1] = f
        del f, bits  # freed before the next chunk is decoded: one at a time
    return out


def _scale_rows(f: np.ndarray, sc: np.ndarray, r0: int, br: int, bc: int, n_cols: int) -> None:
    """``f`` (rows ``r0..`` of the weight, float32) times each weight's scale, in place."""
    rows = f.shape[0]
    if sc.shape[1] == 1:  # one scale per row (channel, tensor, or blocks spanning all columns)
        per_row = sc[np.arange(r0, r0 + rows) // br, 0]
        np.multiply(f, per_row[:, None], out=f)
        return
    for b in range(r0 // br, (r0 + rows - 1) // br + 1):
        a, z = max(b * br, r0) - r0, min((b + 1) * br, r0 + rows) - r0
        np.multiply(f[a:z], np.repeat(sc[b], bc)[:n_cols], out=f[a:z])


def _non_finite(
    raw: np.ndarray,
    dtype: str,
    sc: np.ndarray,
    block: tuple[int, int],
    f: np.ndarray,
    r0: int,
    limit: int,
    where: str,
) -> RefusedInput:
    """The refusal of the first weight of chunk ``f`` (from row ``r0``) at or over ``limit``."""
    mag = f.reshape(-1).view(np.uint32) & 0x7FFFFFFF
    i = int(np.argmax(mag >= limit))
    r, c = r0 + i // f.shape[1], i % f.shape[1]
    code = int(raw[r, c])
    value, scale, product = (
        str(v) for v in (fp8_table(dtype)[code], sc[r // block[0], c // block[1]], f[r - r0, c])
    )  # float32's shortest repr ("0.1", not f-string's 0.10000000149011612)
    note = ", inf in bfloat16" if np.isfinite(f[r - r0, c]) else ""
    return RefusedInput(
        f"{where}: weight at row {r} col {c} is not finite once dequantised ({dtype} code "
        f"0x{code:02x} = {value}, times scale {scale} = {product}{note}); refused: FP8 weights "
        "must dequantise to finite values"
    )
