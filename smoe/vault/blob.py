"""One expert's blob (D3) encoded from its matrices: what the vault writer and the
sculptor's workers both write (:func:`encode_blob`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import numpy as np

from smoe import quant
from smoe.format.plan import ExpertSlot
from smoe_gen.layout import TENSOR_NAMES

__all__ = ["MatrixInput", "encode_blob", "expert_name"]


def expert_name(layer: int, expert: int) -> str:
    """How messages name an expert.

    >>> expert_name(3, 5)
    'layer 3 expert 5'
    """
    return f"layer {layer} expert {expert}"


_Out = TypeVar("_Out", bytearray, np.ndarray)


@dataclass(frozen=True)
class MatrixInput:
    """One matrix of an expert to encode: its weights (read as ``src_dtype``: None for a
    float array, ``"bf16"`` for uint16 bfloat16 bits, ...), its per-column ``importance``
    (or None; see ``quant.encode``), and, calibrated (``--calibrate``), the second moments
    of its inputs (``hessian``): then it is encoded by :func:`smoe.quant.encode_hessian_into`
    (the same codes and scales the format always holds, chosen for the least output error)
    and its :class:`~smoe.quant.HessianReport` filled into ``report``, ``stats`` left
    untouched (the caller measures them from the codes); else ``stats``, when given, gathers
    the SNR sums of its encoding.

    >>> [m.src_dtype for m in MatrixInput.each([np.ones((2, 64))] * 3, "f32")]
    ['f32', 'f32', 'f32']
    """

    weights: np.ndarray
    src_dtype: str | None = None
    importance: np.ndarray | None = None
    hessian: np.ndarray | None = None
    stats: quant.QuantStats | None = None
    report: quant.HessianReport | None = None

    @classmethod
    def each(cls, weights: Sequence[np.ndarray], src_dtype: str | None = None) -> list[MatrixInput]:
        """Each matrix of ``weights``, read as ``src_dtype``, unweighted.

        >>> len(MatrixInput.each([np.ones((2, 64))] * 3))
        3
        """
        return [cls(weights=w, src_dtype=src_dtype) for w in weights]


def encode_blob(
    slot: ExpertSlot,
    matrices: Sequence[MatrixInput],
    bits: int,
    scale: str,
    out: _Out | None = None,
) -> _Out | bytearray:
    """One expert's blob (D3): each of its ``matrices`` quantised straight into its planned
    slices (see :class:`MatrixInput`: its source dtype, importance, Hessian, and where its
    statistics or report go).

    ``out``: a blob of ``slot.raw_size`` bytes to reuse (a ``bytearray`` or a ``uint8``
    array, e.g. the previous expert's): encoded in place and returned, byte for byte the
    blob a fresh call gives (every byte the tensors do not cover is zeroed); None: a new
    ``bytearray``.
    Weights the format cannot hold are refused, never clipped: ``quant.NonFiniteWeights``
    (NaN/Inf) or ``quant.ScaleOverflow`` (``|w| > 65504``), a SmoeError naming the layer,
    expert and tensor, e.g. ``layer 3 expert 5 down_proj: 2 weights are inf or nan, ...``.

    >>> from smoe.format.manifest import checksum
    >>> from smoe.format.plan import make_plan
    >>> slot = make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, bits=4, version=2).experts[0]
    >>> mats = [np.full((32, 64), 0.5), np.full((32, 64), -0.25), np.eye(64, 32)]
    >>> matrices = MatrixInput.each(mats)
    >>> blob = encode_blob(slot, matrices, 4, "optimal")
    >>> len(blob), bytes(blob[:4]).hex(), checksum(blob)
    (3264, 'ffffffff', 3141431214)
    >>> encode_blob(slot, matrices, 4, "optimal", out=bytearray([170]) * 3264) == blob
    True
    >>> bytes(encode_blob(slot, matrices, 4, "optimal", out=np.full(3264, 170, np.uint8))) == blob
    True
    """
    mode = cast("quant.ScaleMode", scale)  # encode_into refuses any other value
    blob: _Out | bytearray
    if out is None:
        blob = bytearray(slot.raw_size)
    elif len(out) != slot.raw_size:
        raise ValueError(f"out has {len(out)} bytes, the blob has {slot.raw_size}")
    else:
        blob = out
    view = np.frombuffer(blob, np.uint8)  # the same bytes, writable, whichever ``out`` is
    if out is not None:  # the encoder writes every byte of its slices; zero the rest
        at = 0
        for lo, hi in sorted(
            (o, o + n)
            for t in slot.tensors
            for o, n in ((t.packed_offset, t.packed_size), (t.scales_offset, t.scales_size))
        ):
            view[at:lo] = 0
            at = max(at, hi)
        view[at:] = 0
    for i, (t, m) in enumerate(zip(slot.tensors, matrices)):
        kind = cast("quant.SrcDtype | None", m.src_dtype)  # encode_into refuses any other
        try:
            if m.hessian is not None:
                quant.encode_hessian_into(
                    quant.as_float32(m.weights, kind),
                    m.hessian,
                    bits,
                    view[t.packed_offset : t.packed_offset + t.packed_size],
                    view[t.scales_offset : t.scales_offset + t.scales_size],
                    overflow="raise",
                    report=m.report,
                )
                continue
            quant.encode_into(
                m.weights,
                bits,
                view[t.packed_offset : t.packed_offset + t.packed_size],
                view[t.scales_offset : t.scales_offset + t.scales_size],
                mode,
                src_dtype=kind,
                stats=m.stats,
                overflow="raise",
                importance=m.importance,
            )
        except quant.UnrepresentableWeights as e:
            where = f"{expert_name(slot.layer_id, slot.expert_id)} {TENSOR_NAMES[i]}"
            raise e.within(where) from None
    return blob
