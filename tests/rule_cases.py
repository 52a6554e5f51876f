"""More broken vaults, one rule each, as data: (code, field, offset, base fixture, patches,
bytes cut from the end; a negative cut appends zero bytes). Read by the C++ harness tests
and the Python verifier tests alike, like fixtures/corrupt/EXPECTED.json (which holds the
rules the issue tracker listed). With them: ``UNREADABLE_CASES`` (files no reader can open,
exit status 2), ``NOTICE_CASES`` (warnings and information: the vault stays valid) and
``MANIFEST_CASES`` (a vault with a damaged integrity manifest beside it)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from smoe_gen import layout

from fixtures_data import FIXTURES, MANIFEST


def _h(name: str) -> int:
    return layout.HEADER_OFFSETS[name]


def _en(i: int, name: str) -> int:
    return layout.entry_offset(i) + layout.EXPERT_ENTRY_OFFSETS[name]


def _ds(base: str, i: int, t: int, name: str) -> int:
    n = MANIFEST[base]["header"]["total_experts"]
    return layout.descriptor_offset(n, i, t) + layout.TENSOR_DESCRIPTOR_OFFSETS[name]


def _ar(base: str, name: str) -> int:
    return MANIFEST[base]["header"]["reserved_ext"] + layout.ARCH_BLOCK_OFFSETS[name]


def _blob(base: str, i: int, t: int, part: str) -> int:
    """Absolute offset of a tensor's packed codes or scales."""
    e = MANIFEST[base]["experts"][i]
    return e["byte_offset"] + e["tensors"][t][f"{part}_offset"]


def _byte(base: str, at: int) -> int:
    with open(FIXTURES / base, "rb") as f:
        f.seek(at)
        return f.read(1)[0]


Q4 = "q4_v2.smoe"


def _reshape_expert_1() -> list[tuple[int, str, int]]:
    """Expert 1 of q4_v2 re-described as a self-consistent [16, 64] / [64, 16] expert
    (in a layer of [32, 64] experts): packed 512 + scales 32 bytes per tensor; the bytes
    past the new raw_size zeroed, as padding must be."""
    e1 = MANIFEST[Q4]["experts"][1]
    patches = [(_en(1, "raw_size"), "Q", 3 * 544), (_en(1, "num_groups"), "Q", 48)]
    patches += [
        (at, "Q", 0)
        for at in range(e1["byte_offset"] + 3 * 544, e1["byte_offset"] + e1["raw_size"], 8)
    ]
    for t, (rows, cols) in enumerate(((16, 64), (16, 64), (64, 16))):
        patches += [
            (_ds(Q4, 1, t, "rows"), "I", rows),
            (_ds(Q4, 1, t, "cols"), "I", cols),
            (_ds(Q4, 1, t, "packed_offset"), "Q", t * 544),
            (_ds(Q4, 1, t, "packed_size"), "Q", 512),
            (_ds(Q4, 1, t, "scales_offset"), "Q", t * 544 + 512),
            (_ds(Q4, 1, t, "scales_size"), "Q", 32),
        ]
    return patches


# (code, field, offset of the report, base, [(offset, struct format, value)], truncate by)
RULE_CASES = [
    ("header.bits", "header.bits", _h("bits"), Q4, [(_h("bits"), "I", 3)], 0),
    (
        "header.group_size",
        "header.group_size",
        _h("group_size"),
        Q4,
        [(_h("group_size"), "I", 32)],
        0,
    ),
    (
        "header.table_offset",
        "header.table_offset",
        _h("table_offset"),
        Q4,
        [(_h("table_offset"), "Q", 128)],
        0,
    ),
    (
        "header.total_experts",
        "header.total_experts",
        _h("total_experts"),
        Q4,
        [(_h("total_experts"), "I", 9)],
        0,
    ),
    (
        "header.data_offset_bounds",
        "header.data_offset",
        _h("data_offset"),
        Q4,
        [(_h("data_offset"), "Q", 147456 + 16384)],
        0,
    ),
    ("header.d_model", "header.d_model", _h("d_model"), Q4, [(_h("d_model"), "I", 0)], 0),
    (
        "arch.placement",
        "header.reserved_ext",
        _h("reserved_ext"),
        Q4,
        [(_h("reserved_ext"), "I", 1540)],
        0,
    ),
    (
        "arch.block_version",
        "arch.block_version",
        _ar(Q4, "block_version"),
        Q4,
        [(_ar(Q4, "block_version"), "I", 2)],
        0,
    ),
    (
        "arch.block_size",
        "arch.block_size",
        _ar(Q4, "block_size"),
        Q4,
        [(_ar(Q4, "block_size"), "I", 64)],
        0,
    ),
    ("arch.flags", "arch.flags", _ar(Q4, "flags"), Q4, [(_ar(Q4, "flags"), "I", 8)], 0),
    (
        "arch.num_heads",
        "arch.num_heads",
        _ar(Q4, "num_heads"),
        Q4,
        [(_ar(Q4, "num_heads"), "I", 0)],
        0,
    ),
    (
        "arch.num_kv_heads",
        "arch.num_kv_heads",
        _ar(Q4, "num_kv_heads"),
        Q4,
        [(_ar(Q4, "num_kv_heads"), "I", 0)],
        0,
    ),
    (
        "arch.model_type",
        "arch.model_type",
        _ar(Q4, "model_type"),
        Q4,
        [(_ar(Q4, "model_type"), "B", 0xFF)],
        0,
    ),
    (
        "arch.model_type",
        "arch.model_type",
        _ar(Q4, "model_type") + 10,
        Q4,
        [(_ar(Q4, "model_type") + 10, "B", ord("x"))],
        0,
    ),
    (
        "arch.reserved",
        "arch.reserved",
        _ar(Q4, "reserved") + 5,
        Q4,
        [(_ar(Q4, "reserved") + 5, "B", 1)],
        0,
    ),
    (
        "entry.expert_id",
        "experts[3].expert_id",
        _en(3, "expert_id"),
        Q4,
        [(_en(3, "expert_id"), "I", 4)],
        0,
    ),
    (
        "table.order",
        "experts[7].layer_id",
        _en(7, "layer_id"),
        Q4,
        [(_en(7, "layer_id"), "I", 0)],
        0,
    ),
    (
        "entry.byte_offset_align",
        "experts[2].byte_offset",
        _en(2, "byte_offset"),
        Q4,
        [(_en(2, "byte_offset"), "Q", 49152 + 4096)],
        0,
    ),
    (
        "entry.byte_offset",
        "experts[0].byte_offset",
        _en(0, "byte_offset"),
        Q4,
        [(_en(0, "byte_offset"), "Q", 0)],
        0,
    ),
    (
        "entry.raw_size",
        "experts[0].raw_size",
        _en(0, "raw_size"),
        Q4,
        [(_en(0, "raw_size"), "Q", 0)],
        0,
    ),
    (
        "entry.padded_size",
        "experts[0].padded_size",
        _en(0, "padded_size"),
        Q4,
        [(_en(0, "padded_size"), "Q", 32768)],
        0,
    ),
    ("entry.blob_bounds", "experts[7].padded_size", _en(7, "padded_size"), Q4, [], 100),
    (
        "entry.group_size",
        "experts[0].group_size",
        _en(0, "group_size"),
        Q4,
        [(_en(0, "group_size"), "I", 32)],
        0,
    ),
    (
        "entry.num_groups",
        "experts[0].num_groups",
        _en(0, "num_groups"),
        Q4,
        [(_en(0, "num_groups"), "Q", 95)],
        0,
    ),
    (
        "entry.reserved",
        "experts[0].reserved",
        _en(0, "reserved") + 2,
        Q4,
        [(_en(0, "reserved") + 2, "B", 1)],
        0,
    ),
    (
        "descriptor.tensor_type",
        "experts[0].tensors[1].tensor_type",
        _ds(Q4, 0, 1, "tensor_type"),
        Q4,
        [(_ds(Q4, 0, 1, "tensor_type"), "B", 0)],
        0,
    ),
    (
        "descriptor.ndim",
        "experts[0].tensors[0].ndim",
        _ds(Q4, 0, 0, "ndim"),
        Q4,
        [(_ds(Q4, 0, 0, "ndim"), "B", 3)],
        0,
    ),
    (
        "descriptor.reserved",
        "experts[0].tensors[0].reserved_0",
        _ds(Q4, 0, 0, "reserved_0") + 1,
        Q4,
        [(_ds(Q4, 0, 0, "reserved_0") + 1, "B", 1)],
        0,
    ),
    (
        "descriptor.rows",
        "experts[0].tensors[0].rows",
        _ds(Q4, 0, 0, "rows"),
        Q4,
        [(_ds(Q4, 0, 0, "rows"), "I", 0)],
        0,
    ),
    (
        "descriptor.cols",
        "experts[0].tensors[0].cols",
        _ds(Q4, 0, 0, "cols"),
        Q4,
        [(_ds(Q4, 0, 0, "cols"), "I", 100_000)],
        0,
    ),
    (
        "descriptor.scales_size",
        "experts[0].tensors[0].scales_size",
        _ds(Q4, 0, 0, "scales_size"),
        Q4,
        [(_ds(Q4, 0, 0, "scales_size"), "Q", 66)],
        0,
    ),
    (
        "descriptor.slice_overlap",
        "experts[0].tensors[1].packed_offset",
        _ds(Q4, 0, 1, "packed_offset"),
        Q4,
        [(_ds(Q4, 0, 1, "packed_offset"), "Q", 1000)],
        0,
    ),
    (
        "descriptor.shape",
        "experts[0].tensors[1].rows",
        _ds(Q4, 0, 1, "rows"),
        Q4,
        [(_ds(Q4, 0, 1, "rows"), "I", 64), (_ds(Q4, 0, 1, "cols"), "I", 32)],
        0,
    ),
    (
        "descriptor.shape",
        "experts[0].tensors[0].cols",
        _ds(Q4, 0, 0, "cols"),
        Q4,
        [(_h("d_model"), "I", 32)],
        0,
    ),
    (
        "layer.shape",
        "experts[1].tensors[0].rows",
        _ds(Q4, 1, 0, "rows"),
        Q4,
        _reshape_expert_1(),
        0,
    ),
    (
        "blob.scales",
        "experts[2].tensors[1].scales",
        _blob(Q4, 2, 1, "scales") + 6,
        Q4,
        [(_blob(Q4, 2, 1, "scales") + 6, "H", 0x7C00)],
        0,
    ),
    (
        "blob.packed_tail",
        "experts[0].tensors[0].packed",
        _blob("partial_groups.smoe", 0, 0, "packed") + 512,
        "partial_groups.smoe",
        [
            (
                _blob("partial_groups.smoe", 0, 0, "packed") + 512,
                "B",
                0x10
                | _byte("partial_groups.smoe", _blob("partial_groups.smoe", 0, 0, "packed") + 512),
            )
        ],
        0,
    ),
    (
        "table.layers",
        "header.num_moe_layers",
        _h("num_moe_layers"),
        Q4,
        [(_h("num_moe_layers"), "I", 1), (_h("max_experts_per_layer"), "I", 8)],
        0,
    ),
]


# Files too short to be read at all: both readers refuse them with exit status 2.
UNREADABLE_CASES = [
    ("header.size", "header", 0, Q4, [], len((FIXTURES / Q4).read_bytes()) - 10),
]

# Warnings and information: the vault stays valid (Python verify --deep reports them).
_E7 = MANIFEST[Q4]["experts"][7]
_GAP = MANIFEST[Q4]["header"]["reserved_ext"] + layout.ARCH_BLOCK_SIZE + 56  # before data_offset
NOTICE_CASES = [
    ("header.partial", "header.total_experts", _h("total_experts"), "partial_vault.smoe", [], 0),
    (
        "header.reserved_ext",
        "header.reserved_ext",
        _h("reserved_ext"),
        "q4_v1.smoe",
        [(_h("reserved_ext"), "I", 1536)],
        0,
    ),
    (
        "header.ffn_dim",
        "header.ffn_dim",
        _h("ffn_dim"),
        Q4,
        [(_h("ffn_dim"), "I", MANIFEST[Q4]["header"]["d_model"])],
        0,
    ),
    ("header.gap", "gap", _GAP, Q4, [(_GAP, "B", 1)], 0),
    (
        "arch.rms_norm_eps",
        "arch.rms_norm_eps",
        _ar(Q4, "rms_norm_eps"),
        Q4,
        [(_ar(Q4, "rms_norm_eps"), "f", 1e-3)],
        0,
    ),
    (
        "arch.rope_theta",
        "arch.rope_theta",
        _ar(Q4, "rope_theta"),
        Q4,
        [(_ar(Q4, "rope_theta"), "f", float("inf"))],
        0,
    ),
    (
        "arch.moe_ffn_dim",
        "arch.moe_ffn_dim",
        _ar(Q4, "moe_ffn_dim"),
        Q4,
        [(_ar(Q4, "moe_ffn_dim"), "I", 33)],
        0,
    ),
    # the last blob moved one page on (the file grows by a page): a gap before it
    (
        "table.gap",
        "experts[7].byte_offset",
        _en(7, "byte_offset"),
        Q4,
        [(_en(7, "byte_offset"), "Q", _E7["byte_offset"] + layout.PAGE_SIZE)],
        -layout.PAGE_SIZE,
    ),
]

# A good vault with a damaged manifest beside it: (code, field, offset, base, patches of the
# vault, the manifest's edits: [(key path, new value)], or a str that replaces the whole text).
MANIFEST_CASES: list[tuple[str, str, int, str, list, list | str]] = [
    ("manifest.malformed", "manifest", 0, Q4, [], "not a manifest"),
    ("manifest.vault", "manifest/vault/size", 0, Q4, [], [(("vault", "size"), 1)]),
    (
        "manifest.expert",
        "manifest/experts/1/offset",
        MANIFEST[Q4]["experts"][1]["byte_offset"],
        Q4,
        [],
        [(("experts", 1, "offset"), 0)],
    ),
    (
        "manifest.checksum",
        "manifest/experts/2/crc32c",
        MANIFEST[Q4]["experts"][2]["byte_offset"],
        Q4,
        [(_blob(Q4, 2, 0, "packed"), "B", _byte(Q4, _blob(Q4, 2, 0, "packed")) ^ 0x11)],
        [],
    ),
]


def apply(base: str, patches: list, cut: int) -> bytes:
    """The broken file: base fixture, patched little-endian fields, ``cut`` bytes removed
    (or ``-cut`` zero bytes appended)."""
    data = bytearray((FIXTURES / base).read_bytes())
    if cut < 0:
        data += bytes(-cut)
    for at, fmt, value in patches:
        struct.pack_into("<" + fmt, data, at, value)
    return bytes(data[: len(data) - max(cut, 0)])


def write_with_manifest(case: tuple, folder: Path) -> Path:
    """A ``MANIFEST_CASES`` entry as files in ``folder``: the vault and its damaged sidecar."""
    _code, _field, _offset, base, patches, edits = case
    vault = folder / base
    vault.write_bytes(apply(base, patches, 0))
    side = FIXTURES / f"{base}.manifest.json"
    if isinstance(edits, str):
        text = edits
    else:
        doc: Any = json.loads(side.read_text())
        for keys, value in edits:
            node = doc
            for k in keys[:-1]:
                node = node[k]
            node[keys[-1]] = value
        text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    (folder / f"{base}.manifest.json").write_text(text)
    return vault
