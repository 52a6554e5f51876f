"""The generated Kaitai parser against golden bytes: every field, every `valid`."""

from __future__ import annotations

import math
import struct
import tracemalloc

import kaitaistruct
import pytest

from smoe_gen import layout
from smoe_gen.smoe_kaitai import Smoe

import golden as g

V = kaitaistruct


def parse(data: bytes) -> Smoe:
    return Smoe.from_bytes(bytes(data))


def test_header_fields() -> None:
    h = parse(g.vault()).header
    assert h.magic == bytes.fromhex("534d4f45deea0001")
    assert (h.version, h.num_moe_layers, h.max_experts_per_layer, h.num_experts) == (2, 4, 8, 1)
    assert (h.ofs_table, h.ofs_data, h.group_size, h.bits) == (64, 16384, 64, 4)
    assert (h.d_model, h.vocab_size, h.ffn_dim, h.ofs_arch) == (8, 1000, 16, 256)
    assert (h.ofs_descriptors, h.ofs_descriptors_end, h.has_arch) == (112, 244, True)


def test_arch_fields() -> None:
    a = parse(g.vault()).arch
    assert (a.magic, a.block_version, a.len_block, a.flags) == (b"SARC", 1, 128, 3)
    assert a.rope_theta == 1_000_000.0
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.moe_top_k) == (4, 2, 2, 8)
    assert (a.moe_ffn_dim, a.dense_ffn_dim, a.shared_expert_ffn_dim) == (8, 0, 0)
    assert a.activation == Smoe.Activation.silu
    assert a.num_hidden_layers == 6
    assert a.rms_norm_eps == pytest.approx(1e-6)
    assert a.model_type.text == "qwen3_moe"
    assert len(a.model_type.chars) == len("qwen3_moe") + 1  # the characters and the NUL
    assert a.model_type.padding.bytes == [0] * (24 - 10)
    assert (a.norm_topk_prob, a.has_qk_norm, a.has_dense_layer_0) == (True, True, False)


def test_table_descriptors_and_slices() -> None:
    data = g.vault()
    (e,) = parse(data).experts
    assert (e.layer_id, e.expert_id, e.ofs_blob, e.len_raw) == (1, 2, 16384, 102)
    assert (e.len_padded, e.group_size, e.num_groups, e.len_padded_expected) == (
        16384,
        64,
        3,
        16384,
    )
    types = [d.tensor_type for d in e.tensors]
    assert types == [Smoe.TensorType.gate_proj, Smoe.TensorType.up_proj, Smoe.TensorType.down_proj]
    for t, d in enumerate(e.tensors):
        assert (d.num_dims, d.num_rows, d.num_cols, d.num_weights, d.num_groups) == (2, 8, 8, 64, 1)
        assert (d.ofs_packed, d.len_packed, d.ofs_scales, d.len_scales) == (
            34 * t,
            32,
            34 * t + 32,
            2,
        )
        assert (d.len_packed_expected, d.len_scales_expected) == (32, 2)
        assert d.packed + d.scales == g.tensor_bytes(t)
    assert e.padding.bytes == [0] * (16384 - 102)


def test_v1_has_no_arch() -> None:
    data = g.patch(g.vault(), 8, "I", 1)
    data = g.patch(data, 60, "I", 0)
    s = parse(data)
    assert s.header.version == 1
    assert s.arch is None


def test_open_reads_only_the_header() -> None:
    """Opening parses 64 bytes; tables and arch are lazy instances."""
    s = parse(g.vault())
    assert s._io.pos() == 64
    assert not hasattr(s, "_m_experts") and not hasattr(s, "_m_arch")


def test_names_follow_the_reference_header_through_orig_id() -> None:
    """The Kaitai names are the spec's (num_/ofs_/len_); C++ and numpy keep the header's."""
    assert layout.HEADER_DTYPE.names[4:7] == ("total_experts", "table_offset", "data_offset")
    assert layout.HEADER_DTYPE.names[-1] == "reserved_ext"
    assert "byte_offset" in layout.EXPERT_ENTRY_DTYPE.names
    assert "packed_offset" in layout.TENSOR_DESCRIPTOR_DTYPE.names
    assert layout.ARCH_BLOCK_DTYPE["model_type"] == "S24"


H, E, D, A = 0, g.ENTRY_AT, g.DESCRIPTORS_AT, g.ARCH_AT
NE, LT, GT = V.ValidationNotEqualError, V.ValidationLessThanError, V.ValidationGreaterThanError
ANY, EXPR = V.ValidationNotAnyOfError, V.ValidationExprError
U8_TOP = (1 << 64) - 16384

# (name, absolute offset, struct format, value, what to touch, error class, ksy path)
VIOLATIONS = [
    ("bad magic", H + 4, "B", 0xAD, "header", NE, "/types/file_header/seq/0"),
    ("version 0", H + 8, "I", 0, "header", LT, "/types/file_header/seq/1"),
    ("version 3", H + 8, "I", 3, "header", GT, "/types/file_header/seq/1"),
    ("version 2^31 + 1", H + 8, "I", 0x8000_0001, "header", GT, "/types/file_header/seq/1"),
    (
        "more experts than layers x width",
        H + 20,
        "I",
        33,
        "header",
        EXPR,
        "/types/file_header/seq/4",
    ),
    ("table_offset 128", H + 24, "Q", 128, "header", NE, "/types/file_header/seq/5"),
    (
        "table_offset 2^32 + 64",
        H + 24,
        "Q",
        (1 << 32) + 64,
        "header",
        NE,
        "/types/file_header/seq/5",
    ),
    ("data_offset misaligned", H + 32, "Q", 8192, "header", EXPR, "/types/file_header/seq/6"),
    ("data_offset beyond EOF", H + 32, "Q", 3 * 16384, "header", EXPR, "/types/file_header/seq/6"),
    (
        "data_offset 2^63 + 16384",
        H + 32,
        "Q",
        (1 << 63) + 16384,
        "header",
        EXPR,
        "/types/file_header/seq/6",
    ),
    ("group_size 32", H + 40, "I", 32, "header", NE, "/types/file_header/seq/7"),
    ("bits 3", H + 44, "I", 3, "header", ANY, "/types/file_header/seq/8"),
    ("d_model 0", H + 48, "I", 0, "header", LT, "/types/file_header/seq/9"),
    ("reserved_ext misaligned", H + 60, "I", 260, "header", EXPR, "/types/file_header/seq/12"),
    (
        "reserved_ext inside descriptors",
        H + 60,
        "I",
        192,
        "header",
        EXPR,
        "/types/file_header/seq/12",
    ),
    ("arch overlaps data_offset", H + 60, "I", 16320, "header", EXPR, "/types/file_header/seq/12"),
    (
        "expert_id >= max_experts_per_layer",
        E + 4,
        "I",
        8,
        "experts",
        EXPR,
        "/types/expert_entry/seq/1",
    ),
    ("byte_offset misaligned", E + 8, "Q", 16400, "experts", EXPR, "/types/expert_entry/seq/2"),
    ("byte_offset before data_offset", E + 8, "Q", 0, "experts", EXPR, "/types/expert_entry/seq/2"),
    ("byte_offset near 2^64", E + 8, "Q", U8_TOP, "experts", EXPR, "/types/expert_entry/seq/2"),
    ("raw_size 0", E + 16, "Q", 0, "experts", EXPR, "/types/expert_entry/seq/3"),
    ("blob beyond EOF", E + 16, "Q", 16385, "experts", EXPR, "/types/expert_entry/seq/3"),
    ("raw_size 2^63", E + 16, "Q", 1 << 63, "experts", EXPR, "/types/expert_entry/seq/3"),
    ("padded_size wrong", E + 24, "Q", 32768, "experts", EXPR, "/types/expert_entry/seq/4"),
    ("entry group_size", E + 32, "I", 128, "experts", NE, "/types/expert_entry/seq/5"),
    ("num_groups wrong", E + 36, "Q", 4, "experts", EXPR, "/types/expert_entry/seq/6"),
    ("entry reserved", E + 44, "B", 1, "experts", NE, "/types/expert_entry/seq/7"),
    ("tensor_type out of slot", D + 0, "B", 2, "experts", NE, "/types/tensor_descriptor/seq/0"),
    ("ndim 3", D + 1, "B", 3, "experts", NE, "/types/tensor_descriptor/seq/1"),
    ("reserved_0", D + 2, "B", 1, "experts", NE, "/types/tensor_descriptor/seq/2"),
    ("rows 0", D + 4, "I", 0, "experts", EXPR, "/types/tensor_descriptor/seq/3"),
    (
        "cols beyond raw_size",
        D + 8,
        "I",
        100_000,
        "experts",
        EXPR,
        "/types/tensor_descriptor/seq/4",
    ),
    ("cols 2^31", D + 8, "I", 1 << 31, "experts", EXPR, "/types/tensor_descriptor/seq/4"),
    (
        "packed_offset beyond raw_size",
        D + 12,
        "Q",
        103,
        "experts",
        EXPR,
        "/types/tensor_descriptor/seq/5",
    ),
    ("packed_offset 2^63", D + 12, "Q", 1 << 63, "experts", EXPR, "/types/tensor_descriptor/seq/5"),
    (
        "packed_size inconsistent with rows*cols",
        D + 20,
        "Q",
        33,
        "experts",
        EXPR,
        "/types/tensor_descriptor/seq/6",
    ),
    (
        "packed slice outside raw_size",
        D + 12,
        "Q",
        80,
        "experts",
        EXPR,
        "/types/tensor_descriptor/seq/6",
    ),
    (
        "scales_offset 2^64 - 1",
        D + 28,
        "Q",
        (1 << 64) - 1,
        "experts",
        EXPR,
        "/types/tensor_descriptor/seq/7",
    ),
    ("scales_size inconsistent", D + 36, "Q", 4, "experts", EXPR, "/types/tensor_descriptor/seq/8"),
    (
        "scales slice outside raw_size",
        D + 28,
        "Q",
        101,
        "experts",
        EXPR,
        "/types/tensor_descriptor/seq/8",
    ),
    (
        "gate cols differ from d_model",
        D + 8,
        "I",
        4,
        "experts",
        EXPR,
        "/types/tensor_descriptor/seq/4",
    ),
    (
        "up rows differ from gate rows",
        D + 44 + 4,
        "I",
        4,
        "experts",
        EXPR,
        "/types/tensor_descriptor/seq/3",
    ),
    (
        "up cols differ from gate cols",
        D + 44 + 8,
        "I",
        4,
        "experts",
        EXPR,
        "/types/tensor_descriptor/seq/4",
    ),
    (
        "down rows differ from gate cols",
        D + 88 + 4,
        "I",
        4,
        "experts",
        EXPR,
        "/types/tensor_descriptor/seq/3",
    ),
    ("bad SARC magic", A + 0, "B", ord("X"), "arch", NE, "/types/arch_block/seq/0"),
    ("block_version 2", A + 4, "I", 2, "arch", NE, "/types/arch_block/seq/1"),
    ("block_size 64", A + 8, "I", 64, "arch", NE, "/types/arch_block/seq/2"),
    ("unknown flag bit 3", A + 12, "I", 8, "arch", GT, "/types/arch_block/seq/3"),
    ("unknown flag bit 31", A + 12, "I", 1 << 31, "arch", GT, "/types/arch_block/seq/3"),
    ("num_heads 0", A + 20, "I", 0, "arch", LT, "/types/arch_block/seq/5"),
    (
        "num_heads not divisible by num_kv_heads",
        A + 24,
        "I",
        3,
        "arch",
        EXPR,
        "/types/arch_block/seq/6",
    ),
    ("num_kv_heads 0", A + 24, "I", 0, "arch", EXPR, "/types/arch_block/seq/6"),
    ("head_dim 0", A + 28, "I", 0, "arch", EXPR, "/types/arch_block/seq/7"),
    ("head_dim 300", A + 28, "I", 300, "arch", EXPR, "/types/arch_block/seq/7"),
    ("head_dim 2^31", A + 28, "I", 1 << 31, "arch", EXPR, "/types/arch_block/seq/7"),
    ("moe_top_k 0", A + 32, "I", 0, "arch", LT, "/types/arch_block/seq/8"),
    ("moe_top_k 17", A + 32, "I", 17, "arch", GT, "/types/arch_block/seq/8"),
    ("activation 1", A + 48, "I", 1, "arch", NE, "/types/arch_block/seq/12"),
    ("model_type not UTF-8", A + 60, "B", 0xFF, "arch", EXPR, "/types/utf8_char/seq/0"),
    ("model_type bytes after the NUL", A + 70, "B", ord("x"), "arch", NE, "/types/zero_fill/seq/0"),
    ("arch reserved", A + 100, "B", 1, "arch", NE, "/types/zero_fill/seq/0"),
    ("non-zero blob padding", 16384 + 5000, "B", 1, "padding", NE, "/types/zero_fill/seq/0"),
]


def _touch(s: Smoe, what: str) -> None:
    if what == "experts":
        for e in s.experts:
            _ = e.tensors
    elif what == "arch":
        _ = s.arch
    elif what == "padding":
        _ = s.experts[0].padding


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "what", "error", "path"),
    [v[1:] for v in VIOLATIONS],
    ids=[v[0] for v in VIOLATIONS],
)
def test_each_valid_rejects_its_violation(offset, fmt, value, what, error, path) -> None:
    good = parse(g.vault())
    _touch(good, what)  # the untouched vault passes the same access
    bad = g.patch(g.vault(), offset, fmt, value)
    with pytest.raises(error) as info:
        _touch(parse(bad), what)
    assert info.value.src_path == path


def _model_type(name: bytes) -> bytearray:
    data = g.vault()
    data[A + 60 : A + 84] = name.ljust(24, b"\0")
    return data


@pytest.mark.parametrize(
    ("name", "text"),
    [
        (b"abcdefghijklmnopqrstuvwx", "abcdefghijklmnopqrstuvwx"),  # 24 bytes, no NUL
        ("qwén3_мое_🙂".encode(), "qwén3_мое_🙂"),
        (b"", ""),
    ],
    ids=["24 bytes", "multi-byte", "empty"],
)
def test_model_type_accepts_nul_padded_utf8(name: bytes, text: str) -> None:
    assert parse(_model_type(name)).arch.model_type.text == text


@pytest.mark.parametrize(
    ("name", "error", "path"),
    [
        (b"\xc0\xaf", EXPR, "/types/utf8_char/seq/0"),  # overlong "/"
        (b"\xed\xa0\x80", GT, "/types/utf8_char/seq/1"),  # a surrogate
        (b"\xf4\x90\x80\x80", GT, "/types/utf8_char/seq/1"),  # above U+10FFFF
        (b"\xe2\x82", LT, "/types/utf8_char/seq/2"),  # a continuation byte missing
        (b"a" * 23 + b"\xc3", EXPR, "/types/utf8_char/seq/0"),
    ],  # a character cut at byte 24
    ids=["overlong", "surrogate", "above U+10FFFF", "short sequence", "cut at the end"],
)
def test_model_type_rejects_invalid_utf8_alike_in_every_target(name, error, path) -> None:
    """R2 is checked byte by byte, so no target decodes U+FFFD where another fails."""
    with pytest.raises(error) as info:
        _ = parse(_model_type(name)).arch
    assert info.value.src_path == path


def _with_second_entry(key: tuple[int, int], rows: int, cols: int) -> bytearray:
    """The golden vault with a second entry whose three tensors are [rows, cols] (gate, up)
    and [cols, rows] (down), its slices laid out back to back in the same blob."""
    data = g.vault()
    data = g.patch(data, 20, "I", 2)  # total_experts = 2 -> table and descriptors grow
    # New geometry: descriptors at 64 + 96 = 160, end 160 + 264 = 424, arch at 448.
    data = g.patch(data, 60, "I", 448)
    n = rows * cols
    packed, scales = math.ceil(n * 4 / 8), math.ceil(n / 64) * 2
    descs = b"".join(
        struct.pack(
            "<BB2sIIQQQQ",
            t,
            2,
            b"\0\0",
            *((cols, rows) if t == 2 else (rows, cols)),
            (packed + scales) * t,
            packed,
            (packed + scales) * t + packed,
            scales,
        )
        for t in range(3)
    )
    raw = 3 * (packed + scales)
    entry = struct.pack(
        "<IIQQQIQ4s", *key, g.PAGE, raw, g.PAGE, 64, 3 * math.ceil(n / 64), b"\0\0\0\0"
    )
    two = bytearray(data)
    two[64:112] = g.ENTRY
    two[112:160] = entry
    two[160:292] = g.DESCRIPTORS
    two[292:424] = descs
    two[448:576] = g.ARCH
    return two


def test_unsorted_and_duplicate_table() -> None:
    """Two entries: the second must have a strictly greater (layer_id, expert_id)."""
    for second_key, ok in [
        ((1, 3), True),
        ((2, 0), True),
        ((1, 2), False),
        ((1, 1), False),
        ((0, 7), False),
    ]:
        s = parse(_with_second_entry(second_key, 8, 8))
        if ok:
            assert [(e.layer_id, e.expert_id) for e in s.experts] == [(1, 2), second_key]
        else:
            with pytest.raises(EXPR) as info:
                _ = s.experts
            assert info.value.src_path == "/types/expert_entry/seq/1"


def test_experts_of_a_layer_share_one_shape() -> None:
    """Gate rows (moe_ffn_dim) may change only where the layer changes."""
    other_layer = parse(_with_second_entry((2, 0), 4, 8))
    assert [d.num_rows for d in other_layer.experts[1].tensors] == [4, 4, 8]
    with pytest.raises(EXPR) as info:
        _ = parse(_with_second_entry((1, 3), 4, 8)).experts
    assert info.value.src_path == "/types/tensor_descriptor/seq/3"


def test_valid_bounds_are_the_named_constants() -> None:
    """The `valid` clauses spell bounds as literals (portable to every target); the generated
    constants must be those values: the largest accepted value is the constant."""
    cases = [
        (H + 8, "I", layout.VERSION_MAX, "header"),
        (H + 40, "I", layout.GROUP_SIZE, "header"),
        (H + 44, "I", max(layout.SUPPORTED_BITS), "header"),
        (A + 4, "I", layout.ARCH_BLOCK_VERSION, "arch"),
        (A + 12, "I", layout.FLAGS_KNOWN_MASK, "arch"),
        (A + 28, "I", layout.MAX_HEAD_DIM, "arch"),
        (A + 32, "I", layout.MAX_MOE_TOP_K, "arch"),
        (D + 1, "B", layout.TENSOR_NDIM, "experts"),
    ]
    for offset, fmt, limit, what in cases:
        _touch(parse(g.patch(g.vault(), offset, fmt, limit)), what)
        with pytest.raises(V.ValidationFailedError):
            _touch(parse(g.patch(g.vault(), offset, fmt, limit + 1)), what)
    assert min(layout.SUPPORTED_BITS) == layout.BITS_Q2 and layout.VERSION_MIN == 1
    assert parse(g.vault()).header.ofs_table == layout.HEADER_SIZE


def test_huge_total_experts_fails_at_open_without_allocating() -> None:
    data = g.vault()
    for off in (12, 16, 20):  # layers, width and total all 0xFFFFFFFF
        data = g.patch(data, off, "I", 0xFFFFFFFF)
    tracemalloc.start()
    with pytest.raises(EXPR) as info:
        parse(data)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert info.value.src_path == "/types/file_header/seq/6"  # data_offset < end of descriptors
    assert peak < 1 << 20


def test_truncated_files() -> None:
    with pytest.raises(EOFError):
        parse(g.vault()[:20])  # inside the header
    for size in (40, 1000, 16383):  # the header's data_offset lies beyond the end
        with pytest.raises(EXPR) as info:
            parse(g.vault()[:size])
        assert info.value.src_path == "/types/file_header/seq/6"
