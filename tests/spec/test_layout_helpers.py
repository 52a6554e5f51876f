"""The generated layout's offset and size helpers (the same as common.hpp's) against the
golden fixtures' recorded layout, for ints and numpy uint64 arrays alike."""

from __future__ import annotations

import numpy as np
import pytest

from smoe_gen import layout

from fixtures_data import FIXTURES, GOOD, MANIFEST


@pytest.mark.parametrize("name", GOOD)
def test_helpers_locate_every_field_of_the_fixtures(name: str) -> None:
    want = MANIFEST[name]
    data = (FIXTURES / name).read_bytes()
    h = want["header"]
    n = h["total_experts"]
    assert layout.writer_data_offset(n, h["version"]) == h["data_offset"]
    if h["version"] >= layout.VERSION_WITH_ARCH:
        assert layout.writer_reserved_ext(n) == h["reserved_ext"]
    for i, e in enumerate(want["experts"]):
        entry = np.frombuffer(data, layout.EXPERT_ENTRY_DTYPE, 1, layout.entry_offset(i))[0]
        assert int(entry["byte_offset"]) == e["byte_offset"]
        assert e["padded_size"] == layout.round_up(e["raw_size"], layout.PAGE_SIZE)
        groups = 0
        for t, d in enumerate(e["tensors"]):
            at = layout.descriptor_offset(n, i, t)
            desc = np.frombuffer(data, layout.TENSOR_DESCRIPTOR_DTYPE, 1, at)[0]
            assert int(desc["tensor_type"]) == t and int(desc["rows"]) == d["rows"]
            weights = d["rows"] * d["cols"]
            assert layout.packed_size(weights, h["bits"]) == d["packed_size"]
            assert layout.scales_size(weights) == d["scales_size"]
            groups += layout.num_groups(weights)
        assert groups == e["num_groups"]
    assert layout.descriptors_end(n) == layout.descriptor_offset(n, n, 0)
    assert data[: len(layout.MAGIC)] == layout.MAGIC
    for name_, offset in layout.HEADER_OFFSETS.items():
        assert layout.HEADER_DTYPE.fields[name_][1] == offset


def test_sizes_on_arrays_equal_sizes_on_ints_without_overflow() -> None:
    biggest = (2**32 - 1) ** 2  # rows * cols of u4 fields
    ns = [0, 1, 7, 8, 63, 64, 65, 1025, 2**40 + 3, biggest]
    arr = np.array(ns, np.uint64)
    for bits in layout.SUPPORTED_BITS:
        assert (
            layout.packed_size(arr, bits).tolist()
            == [layout.packed_size(n, bits) for n in ns]
            == [-(-n * bits // 8) for n in ns]
        )
    assert layout.num_groups(arr).tolist() == [-(-n // layout.GROUP_SIZE) for n in ns]
    assert layout.scales_size(arr).tolist() == [layout.scales_size(n) for n in ns]
    with pytest.raises(ValueError, match="bits"):
        layout.packed_size(8, 3)


def test_bit_width_traits_flags_and_names() -> None:
    assert [
        (layout.codes_per_byte(b), layout.max_code(b), layout.code_centre(b))
        for b in layout.SUPPORTED_BITS
    ] == [(4, 3, 1.5), (2, 15, 7.5)]
    assert tuple(t.name.lower() for t in layout.TensorType) == layout.TENSOR_NAMES
    assert layout.FLAG_NAMES == {"norm_topk_prob": 1, "has_qk_norm": 2, "has_dense_layer_0": 4}
    assert [s.name for s in layout.STRUCTS] == [
        "SmoeHeader",
        "ExpertEntry",
        "TensorDescriptor",
        "SmoeArchBlock",
    ]
    assert all(
        s.dtype.itemsize == max(o + s.dtype.fields[f][0].itemsize for f, o in s.offsets.items())
        for s in layout.STRUCTS
    )
