"""The generated numpy layout and C++ header agree with the Kaitai parser."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from smoe_gen import layout
from smoe_gen.smoe_kaitai import Smoe

import golden as g
from fixtures_data import ROOT
from helpers import run
from kaitai_names import kaitai_field


def _same(dtype: np.dtype, raw: np.ndarray, ks: object) -> None:
    """Every field of one numpy record equals the Kaitai object's attribute."""
    for name in dtype.names:
        value = raw[name]
        want = kaitai_field(ks, name)
        if name == "model_type":
            assert value.decode() == want
        elif hasattr(want, "value"):  # Kaitai enum
            assert int(value) == want.value
        elif isinstance(want, bytes):
            assert bytes(value) == want
        elif hasattr(want, "bytes"):  # zero_fill
            assert list(value) == want.bytes
        else:
            assert value == want, name


def test_struct_sizes_match_spec() -> None:
    assert layout.HEADER_DTYPE.itemsize == layout.HEADER_SIZE == 64
    assert layout.ARCH_BLOCK_DTYPE.itemsize == layout.ARCH_BLOCK_SIZE == 128
    assert layout.EXPERT_ENTRY_DTYPE.itemsize == layout.EXPERT_ENTRY_SIZE == 48
    assert layout.TENSOR_DESCRIPTOR_DTYPE.itemsize == layout.TENSOR_DESCRIPTOR_SIZE == 44
    assert layout.EXPERT_ENTRY_DTYPE.fields["num_groups"][1] == 36  # D1: unaligned
    assert layout.TENSOR_DESCRIPTOR_DTYPE.fields["packed_offset"][1] == 12


def test_dtypes_agree_with_kaitai_field_by_field() -> None:
    data = bytes(g.vault())
    s = Smoe.from_bytes(data)
    _same(layout.HEADER_DTYPE, np.frombuffer(data, layout.HEADER_DTYPE, 1)[0], s.header)
    arch = np.frombuffer(data, layout.ARCH_BLOCK_DTYPE, 1, offset=s.header.ofs_arch)[0]
    _same(layout.ARCH_BLOCK_DTYPE, arch, s.arch)
    table = np.frombuffer(data, layout.EXPERT_ENTRY_DTYPE, s.header.num_experts, offset=64)
    descs = np.frombuffer(
        data,
        layout.TENSOR_DESCRIPTOR_DTYPE,
        3 * s.header.num_experts,
        offset=s.header.ofs_descriptors,
    )
    for i, e in enumerate(s.experts):
        _same(layout.EXPERT_ENTRY_DTYPE, table[i], e)
        for t, d in enumerate(e.tensors):
            _same(layout.TENSOR_DESCRIPTOR_DTYPE, descs[3 * i + t], d)


def test_constants_agree_with_kaitai_instances() -> None:
    s = Smoe.from_bytes(bytes(g.vault()))
    assert layout.PAGE_SIZE == s.len_page == 16384
    assert layout.GROUP_SIZE == s.quant_group_size == 64
    assert layout.SUPPORTED_BITS == (s.bits_q2, s.bits_q4) == (2, 4)
    assert (layout.VERSION_MIN, layout.VERSION_MAX) == (s.version_min, s.version_max) == (1, 2)
    assert s.header.magic == layout.MAGIC
    assert layout.ARCH_MAGIC == s.arch.magic == b"SARC"
    assert [t.value for t in layout.TensorType] == [t.value for t in Smoe.TensorType] == [0, 1, 2]
    flags = (layout.FLAG_NORM_TOPK_PROB, layout.FLAG_HAS_QK_NORM, layout.FLAG_HAS_DENSE_LAYER_0)
    assert flags == (1, 2, 4)


@pytest.fixture(scope="module")
def layout_test_binary(make: Callable[..., None]) -> Path:
    make("build/layout_test")
    return ROOT / "build" / "layout_test"


def test_cpp_reads_what_python_wrote(layout_test_binary: Path, tmp_path: Path) -> None:
    path = tmp_path / "golden.smoe"
    path.write_bytes(g.vault())
    proc = run(path, command=[layout_test_binary])
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    s = Smoe.from_bytes(path.read_bytes())
    for name, value in got["header"].items():
        assert kaitai_field(s.header, name) == value, name
    e = s.experts[0]
    for name, value in got["expert0"].items():
        assert kaitai_field(e, name) == value, name
    down = e.tensors[2]
    assert got["expert0_down"]["tensor_type"] == down.tensor_type.value == 2
    for name in ("rows", "cols", "packed_offset", "packed_size", "scales_offset", "scales_size"):
        assert kaitai_field(down, name) == got["expert0_down"][name], name
    arch = got["arch"]
    assert arch["model_type"] == s.arch.model_type.text
    assert arch["rope_theta"] == pytest.approx(s.arch.rope_theta)
    for name in ("flags", "num_heads", "num_kv_heads", "head_dim", "moe_top_k"):
        assert kaitai_field(s.arch, name) == arch[name], name


def test_cpp_refuses_bad_magic(layout_test_binary: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.smoe"
    path.write_bytes(g.patch(g.vault(), 0, "B", 0))
    proc = run(path, command=[layout_test_binary])
    assert proc.returncode == 1
    assert proc.stderr == f"{path}: short file or bad magic at offset 0\n"
