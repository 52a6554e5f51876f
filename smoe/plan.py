"""Vault layout planning: shapes and bits in, every offset and size out (D3, D4).

A plan depends only on the experts' shapes, the bit depth and the format version,
never on weight values, so it can be made before anything is quantised and shared
with parallel workers that write blobs at their planned offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

from smoe_gen import layout
from smoe_gen.layout import num_groups, packed_size, scales_size

# Re-exported while smoe.sculpt, smoe.imatrix and smoe.hf.names import it from here; new
# code imports smoe_gen.layout.TENSOR_NAMES.
TENSOR_NAMES = layout.TENSOR_NAMES

Shape = tuple[int, int]


@dataclass(frozen=True)
class TensorSlot:
    """Where one weight matrix lies within its expert blob."""

    rows: int
    cols: int
    packed_offset: int
    packed_size: int
    scales_offset: int
    scales_size: int

    @property
    def num_weights(self) -> int:
        return self.rows * self.cols

    @property
    def num_groups(self) -> int:
        return num_groups(self.num_weights)


@dataclass(frozen=True)
class ExpertSlot:
    """One expert's table entry: its blob's place and its three tensors."""

    layer_id: int
    expert_id: int
    byte_offset: int
    raw_size: int
    padded_size: int
    tensors: tuple[TensorSlot, TensorSlot, TensorSlot]

    @property
    def key(self) -> tuple[int, int]:
        return (self.layer_id, self.expert_id)

    @property
    def num_groups(self) -> int:
        return sum(t.num_groups for t in self.tensors)


@dataclass(frozen=True)
class Plan:
    """The complete layout of a vault (ruling D4)."""

    bits: int
    version: int
    descriptors_offset: int
    descriptors_end: int
    reserved_ext: int
    data_offset: int
    file_size: int
    experts: tuple[ExpertSlot, ...]

    def index(self) -> dict[tuple[int, int], int]:
        return {e.key: i for i, e in enumerate(self.experts)}


def blob_layout(
    shapes: tuple[Shape, Shape, Shape], bits: int
) -> tuple[tuple[TensorSlot, ...], int]:
    """Tensor slots of one blob (D3: packed then scales, gate, up, down) and its raw size."""
    pos = 0
    slots = []
    for rows, cols in shapes:
        n = rows * cols
        p = packed_size(n, bits)
        s = scales_size(n)
        slots.append(TensorSlot(rows, cols, pos, p, pos + p, s))
        pos += p + s
    return tuple(slots), pos


def make_plan(
    experts: dict[tuple[int, int], tuple[Shape, Shape, Shape]], bits: int, version: int
) -> Plan:
    """Plan a vault holding ``experts`` ((layer, expert) -> shapes), in table order."""
    n = len(experts)
    reserved_ext = layout.writer_reserved_ext(n) if version >= layout.VERSION_WITH_ARCH else 0
    data_offset = layout.writer_data_offset(n, version)
    slots = []
    offset = data_offset
    for key in sorted(experts):
        tensors, raw = blob_layout(experts[key], bits)
        padded = layout.round_up(raw, layout.PAGE_SIZE)
        slots.append(ExpertSlot(key[0], key[1], offset, raw, padded, tensors))  # type: ignore[arg-type]
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
