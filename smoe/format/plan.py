"""Vault layout planning: shapes and bits in, every offset and size out (D3, D4).

A plan depends only on the experts' shapes, the bit depth and the format version,
never on weight values, so it can be made before anything is quantised and shared
with parallel workers that write blobs at their planned offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

from smoe_gen import layout
from smoe_gen.layout import num_groups, packed_size, scales_size

__all__ = ["TENSOR_NAMES", "ExpertSlot", "Plan", "Shape", "TensorSlot", "make_plan"]

# Re-exported while smoe.sculpt imports it from here; new code imports
# smoe_gen.layout.TENSOR_NAMES.
TENSOR_NAMES = layout.TENSOR_NAMES

Shape = tuple[int, int]
"""(rows, cols) of a weight matrix."""


@dataclass(frozen=True)
class TensorSlot:
    """Where one weight matrix lies within its expert blob (offsets from the blob's start).

    >>> plan = make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, bits=4, version=2)
    >>> plan.experts[0].tensors[2]  # down_proj: after gate's and up's packed codes and scales
    TensorSlot(rows=64, cols=32, packed_offset=2176, packed_size=1024, scales_offset=3200,
               scales_size=64)
    """

    rows: int
    cols: int
    packed_offset: int
    packed_size: int
    scales_offset: int
    scales_size: int

    @property
    def num_weights(self) -> int:
        """``rows * cols``.

        >>> gate = make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, 4, 2).experts[0].tensors[0]
        >>> gate.num_weights
        2048
        """
        return self.rows * self.cols

    @property
    def num_groups(self) -> int:
        """Quantisation groups (one fp16 scale each; the last may be partial).

        >>> gate = make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, 4, 2).experts[0].tensors[0]
        >>> gate.num_groups
        32
        """
        return num_groups(self.num_weights)


@dataclass(frozen=True)
class ExpertSlot:
    """One expert's table entry: its blob's place and its three tensors.

    >>> plan = make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, bits=4, version=2)
    >>> e = plan.experts[0]
    >>> e.byte_offset, e.raw_size, e.padded_size, len(e.tensors)
    (16384, 3264, 16384, 3)
    """

    layer_id: int
    expert_id: int
    byte_offset: int
    raw_size: int
    padded_size: int
    tensors: tuple[TensorSlot, TensorSlot, TensorSlot]

    @property
    def key(self) -> tuple[int, int]:
        """(layer_id, expert_id).

        >>> make_plan({(3, 5): ((32, 64), (32, 64), (64, 32))}, 4, 2).experts[0].key
        (3, 5)
        """
        return (self.layer_id, self.expert_id)

    @property
    def num_groups(self) -> int:
        """Quantisation groups of the three tensors together.

        >>> make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, 4, 2).experts[0].num_groups
        96
        """
        return sum(t.num_groups for t in self.tensors)


@dataclass(frozen=True)
class Plan:
    """The complete layout of a vault (ruling D4).

    >>> shapes = ((32, 64), (32, 64), (64, 32))
    >>> plan = make_plan({(0, 0): shapes, (0, 1): shapes}, bits=4, version=2)
    >>> plan.data_offset, plan.file_size, [e.byte_offset for e in plan.experts]
    (16384, 49152, [16384, 32768])
    """

    bits: int
    version: int
    descriptors_offset: int
    descriptors_end: int
    reserved_ext: int
    data_offset: int
    file_size: int
    experts: tuple[ExpertSlot, ...]

    def index(self) -> dict[tuple[int, int], int]:
        """(layer, expert) -> table index.

        >>> shapes = ((32, 64), (32, 64), (64, 32))
        >>> make_plan({(1, 0): shapes, (0, 7): shapes}, bits=4, version=2).index()
        {(0, 7): 0, (1, 0): 1}
        """
        return {e.key: i for i, e in enumerate(self.experts)}


def _blob_layout(
    shapes: tuple[Shape, Shape, Shape], bits: int
) -> tuple[tuple[TensorSlot, TensorSlot, TensorSlot], int]:
    """Tensor slots of one blob (D3: packed then scales, gate, up, down) and its raw size."""
    pos = 0
    slots = []
    for rows, cols in shapes:
        n = rows * cols
        p = packed_size(n, bits)
        s = scales_size(n)
        slots.append(TensorSlot(rows, cols, pos, p, pos + p, s))
        pos += p + s
    gate, up, down = slots
    return (gate, up, down), pos


def make_plan(
    experts: dict[tuple[int, int], tuple[Shape, Shape, Shape]], bits: int, version: int
) -> Plan:
    """Plan a vault holding ``experts`` ((layer, expert) -> gate, up and down shapes), in
    table order: every blob page-aligned after the metadata (see :class:`Plan`).

    >>> shapes = ((32, 64), (32, 64), (64, 32))
    >>> plan = make_plan({(1, 0): shapes, (0, 0): shapes}, bits=2, version=2)
    >>> [(e.key, e.byte_offset, e.raw_size) for e in plan.experts]
    [((0, 0), 16384, 1728), ((1, 0), 32768, 1728)]
    """
    n = len(experts)
    reserved_ext = layout.writer_reserved_ext(n) if version >= layout.VERSION_WITH_ARCH else 0
    data_offset = layout.writer_data_offset(n, version)
    slots = []
    offset = data_offset
    for key in sorted(experts):
        tensors, raw = _blob_layout(experts[key], bits)
        padded = layout.round_up(raw, layout.PAGE_SIZE)
        slots.append(ExpertSlot(key[0], key[1], offset, raw, padded, tensors))
        offset += padded
    return Plan(
        bits,
        version,
        layout.descriptors_offset(n),
        layout.descriptors_end(n),
        reserved_ext,
        data_offset,
        offset,
        tuple(slots),
    )
