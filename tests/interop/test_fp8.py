"""FP8 weights (smoe.interop.fp8): the code tables and the dequantisation against torch, bit
for bit; the block-size ruling; which scheme a weight has, and every refused format's
message; non-finite results refused by position; chunks bounded in memory, same bits."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from smoe.errors import RefusedInput
from smoe.interop import fp8
from smoe.interop.fp8 import (
    Scheme,
    block_size,
    declared_block,
    dequantize_bf16,
    dequantize_f32,
    fp8_table,
    read_scale,
    scale_f32,
    scheme_of,
)
from smoe.interop.safetensors_io import read_header, write_file
from smoe.plumbing import fileio

NEEDS_TORCH = "the hf extra (torch, transformers) is not installed"


def torch_module() -> Any:
    """torch, or the test is skipped (the hf extra is optional)."""
    return pytest.importorskip("torch", reason=NEEDS_TORCH)


def torch_dtype(dtype: str) -> Any:
    torch = torch_module()
    return {"F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}[dtype]


def finite_codes(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random FP8 bytes of ``shape`` whose values are finite (no NaN, no infinity)."""
    ok = np.flatnonzero(np.isfinite(fp8_table(dtype))).astype(np.uint8)
    return np.random.default_rng(seed).choice(ok, size=shape)


def random_scales(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """float32 scales with every mantissa bit in use, from 2^-20 to 2^10."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(1, 2, shape) * 2.0 ** rng.integers(-20, 10, shape)
    return np.asarray(values, dtype=np.float32)


def torch_reference(raw: np.ndarray, dtype: str, scale: np.ndarray, block: tuple) -> tuple:
    """DeepSeek's fp8_cast_bf16 arithmetic: ``(w.float() * scale) -> bfloat16``, the scales
    repeated over their blocks; (bfloat16 bits as uint16, float32 product)."""
    torch = torch_module()
    rows, cols = raw.shape
    w = torch.from_numpy(raw.copy()).view(torch_dtype(dtype)).to(torch.float32)
    s = torch.from_numpy(scale.reshape(scale.shape[0] if scale.ndim else 1, -1).copy())
    s = s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:rows, :cols]
    product = w * s
    bf16 = product.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return bf16, product.numpy()


# ---------------------------------------------------------------------------- the codes


@pytest.mark.parametrize("dtype", ["F8_E4M3", "F8_E5M2"])
def test_all_256_codes_decode_as_torch_does(dtype: str) -> None:
    torch = torch_module()
    codes = np.arange(256, dtype=np.uint8)
    want = torch.from_numpy(codes).view(torch_dtype(dtype)).to(torch.float32).numpy()
    got = fp8_table(dtype)
    assert got.dtype == np.float32 and got.shape == (256,)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_the_formats_special_values() -> None:
    e4m3, e5m2 = fp8_table("F8_E4M3"), fp8_table("F8_E5M2")
    assert np.flatnonzero(np.isnan(e4m3)).tolist() == [0x7F, 0xFF]  # "fn": no infinities
    assert not np.isinf(e4m3).any() and np.nanmax(e4m3) == 448 and np.nanmin(e4m3) == -448
    assert e4m3[0x80].view(np.uint32) == 0x80000000  # -0
    assert e4m3[1] == 2.0**-9 and e4m3[8] == 2.0**-6  # least subnormal, least normal
    assert np.flatnonzero(np.isinf(e5m2)).tolist() == [0x7C, 0xFC]
    assert np.flatnonzero(np.isnan(e5m2)).tolist() == [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]
    assert np.nanmax(e5m2[np.isfinite(e5m2)]) == 57344 and e5m2[1] == 2.0**-16
    assert not e4m3.flags.writeable and not e5m2.flags.writeable
    with pytest.raises(ValueError) as e:
        fp8_table("BF16")
    assert str(e.value) == "not an FP8 dtype: 'BF16' (expected one of ('F8_E4M3', 'F8_E5M2'))"


# ---------------------------------------------------------------------------- dequantising


@pytest.mark.parametrize("dtype", ["F8_E4M3", "F8_E5M2"])
def test_block_scaled_equals_torch_bit_for_bit(dtype: str) -> None:
    """[200, 300] in blocks of 128: the last block row and column are partial."""
    raw = finite_codes(dtype, (200, 300), seed=1)
    scale = random_scales((2, 3), seed=2)
    want16, want32 = torch_reference(raw, dtype, scale, (128, 128))
    got = dequantize_bf16(raw, dtype, scale, (128, 128))
    assert got.dtype == np.uint16 and got.shape == (200, 300)
    np.testing.assert_array_equal(got, want16)
    f32 = dequantize_f32(raw, dtype, scale, (128, 128))
    np.testing.assert_array_equal(f32.view(np.uint32), want32.view(np.uint32))


def test_rounding_to_bfloat16_is_to_nearest_even_as_torch() -> None:
    """Products whose low 16 bits are exactly half way: ties go to the even pattern."""
    raw = np.full((1, 4), 0x38, np.uint8)  # 1.0
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x3F80C000], np.uint32)
    for bits, want in zip(ties, [0x3F80, 0x3F82, 0xBF80, 0x3F81]):
        scale = np.array([[bits]], np.uint32).view(np.float32)
        got = dequantize_bf16(raw, "F8_E4M3", scale, (1, 4))
        assert got.tolist() == [[want] * 4]
        np.testing.assert_array_equal(got, torch_reference(raw, "F8_E4M3", scale, (1, 4))[0])


@pytest.mark.parametrize(
    "scale_shape, block",
    [((200, 1), (1, 300)), ((200,), (1, 300)), ((), (200, 300)), ((1,), (200, 300))],
    ids=["channel-2d", "channel-1d", "tensor-0d", "tensor-1d"],
)
@pytest.mark.parametrize("scale_dtype", ["F32", "BF16", "F16"])
def test_per_channel_and_per_tensor_scales(
    scale_shape: tuple, block: tuple, scale_dtype: str
) -> None:
    torch = torch_module()
    raw = finite_codes("F8_E4M3", (200, 300), seed=3)
    f32 = random_scales(scale_shape, seed=4)
    typed = {
        "F32": f32,
        "F16": np.asarray(f32, np.float16),
        "BF16": np.asarray(f32.view(np.uint32) >> 16, np.uint16),  # truncated to bfloat16
    }[scale_dtype]
    scale = scale_f32(typed, scale_dtype)
    assert scale.dtype == np.float32 and scale.shape == scale_shape
    t = torch.from_numpy(typed.copy())
    if scale_dtype == "BF16":
        t = torch.from_numpy(typed.view(np.int16).copy()).view(torch.bfloat16)
    w = torch.from_numpy(raw.copy()).view(torch.float8_e4m3fn).to(torch.float32)
    t = t.reshape(-1, 1) if len(scale_shape) < 2 else t
    want = (w * t).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)  # f32 * s
    np.testing.assert_array_equal(dequantize_bf16(raw, "F8_E4M3", scale, block), want)


def test_scale_f32_widens_exactly_and_checks_its_input() -> None:
    bits = np.array([0x3F80, 0x0001, 0xFF80], np.uint16)
    assert scale_f32(bits, "BF16").view(np.uint32).tolist() == [0x3F800000, 0x10000, 0xFF800000]
    assert scale_f32(np.float32([0.1]), "F32").tolist() == [np.float32(0.1)]
    for values, dtype, message in [
        (np.zeros(2, np.float32), "BF16", "BF16 scales must be given as uint16, not float32"),
        (np.zeros(2, np.uint16), "F16", "F16 scales must be given as float16, not uint16"),
        (np.zeros(2, np.uint8), "F8_E4M3", "scales must be F32, BF16 or F16, not F8_E4M3"),
    ]:
        with pytest.raises(ValueError) as e:
            scale_f32(values, dtype)
        assert str(e.value) == message


def test_out_is_filled_and_returned() -> None:
    raw = finite_codes("F8_E4M3", (5, 7), seed=5)
    scale = random_scales((1, 1), seed=6)
    out = np.zeros((5, 7), np.uint16)
    assert dequantize_bf16(raw, "F8_E4M3", scale, (5, 7), out) is out
    np.testing.assert_array_equal(out, dequantize_bf16(raw, "F8_E4M3", scale, (5, 7)))
    out32 = np.zeros((5, 7), np.float32)
    assert dequantize_f32(raw, "F8_E4M3", scale, (5, 7), out32) is out32
    np.testing.assert_array_equal(out32, fp8_table("F8_E4M3")[raw] * scale[0, 0])


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: dequantize_bf16(np.zeros((2, 2), np.int8), "F8_E4M3", np.ones(1, "f4"), (2, 2)),
            "raw must be a 2-D uint8 array, got int8 [2, 2]",
        ),
        (
            lambda: dequantize_bf16(np.zeros(4, np.uint8), "F8_E4M3", np.ones(1, "f4"), (2, 2)),
            "raw must be a 2-D uint8 array, got uint8 [4]",
        ),
        (
            lambda: dequantize_bf16(np.zeros((2, 2), np.uint8), "BF16", np.ones(1, "f4"), (2, 2)),
            "not an FP8 dtype: 'BF16' (expected one of ('F8_E4M3', 'F8_E5M2'))",
        ),
        (
            lambda: dequantize_bf16(np.zeros((2, 2), np.uint8), "F8_E4M3", np.ones(1), (2, 2)),
            "scale must be float32 (see scale_f32), got float64",
        ),
        (
            lambda: dequantize_bf16(
                np.zeros((200, 300), np.uint8), "F8_E4M3", np.ones((2, 2), "f4"), (128, 128)
            ),
            "scale of shape [2, 2] does not fit a weight [200, 300] in blocks of [128, 128]: "
            "[2, 3] needed",
        ),
        (
            lambda: dequantize_bf16(
                np.zeros((2, 2), np.uint8), "F8_E4M3", np.ones(1, "f4"), (0, 2)
            ),
            "block sizes must be positive, got [0, 2]",
        ),
        (
            lambda: dequantize_bf16(
                np.zeros((2, 2), np.uint8), "F8_E4M3", np.ones(1, "f4"), (2, 2), np.zeros((2, 2))
            ),
            "out must be a C-contiguous uint16 array of shape [2, 2]",
        ),
        (
            lambda: dequantize_f32(
                np.zeros((2, 2), np.uint8),
                "F8_E4M3",
                np.ones(1, "f4"),
                (2, 2),
                np.zeros((2, 4), np.float32)[:, ::2],
            ),
            "out must be a C-contiguous float32 array of shape [2, 2]",
        ),
    ],
    ids=["raw-dtype", "raw-1d", "dtype", "scale-dtype", "scale-shape", "block", "out", "out-f32"],
)
def test_misuse_is_a_value_error(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value) == message


# ---------------------------------------------------------------------------- non-finite


def refusal(raw: np.ndarray, dtype: str, scale: np.ndarray, block: tuple, f32: bool = False) -> str:
    with pytest.raises(RefusedInput) as e:
        (dequantize_f32 if f32 else dequantize_bf16)(
            raw, dtype, scale, block, where="w.safetensors: tensor 'x'"
        )
    return str(e.value)


def test_non_finite_results_are_refused_naming_row_and_column() -> None:
    raw = np.full((3, 260), 0x38, np.uint8)  # 1.0
    ones = np.ones((1, 3), np.float32)
    tail = "; refused: FP8 weights must dequantise to finite values"
    raw[2, 259] = 0xFF  # E4M3 -NaN
    raw[2, 258] = 0x7F  # +NaN, earlier in the row: reported first
    assert refusal(raw, "F8_E4M3", ones, (128, 128)) == (
        "w.safetensors: tensor 'x': weight at row 2 col 258 is not finite once dequantised "
        "(F8_E4M3 code 0x7f = nan, times scale 1.0 = nan)" + tail
    )
    raw = np.full((3, 260), 0x3C, np.uint8)  # E5M2 1.0
    raw[1, 5] = 0xFC  # -inf
    assert refusal(raw, "F8_E5M2", ones, (128, 128)) == (
        "w.safetensors: tensor 'x': weight at row 1 col 5 is not finite once dequantised "
        "(F8_E5M2 code 0xfc = -inf, times scale 1.0 = -inf)" + tail
    )


def test_non_finite_scales_and_overflow_are_refused() -> None:
    raw = np.full((4, 256), 0x38, np.uint8)
    raw[:, :3] = 0  # zeros: 0 x inf is NaN
    tail = "; refused: FP8 weights must dequantise to finite values"
    scale = np.array([[1.0, 1.0], [np.inf, 1.0]], np.float32)
    assert refusal(raw, "F8_E4M3", scale, (2, 128)) == (
        "w.safetensors: tensor 'x': weight at row 2 col 0 is not finite once dequantised "
        "(F8_E4M3 code 0x00 = 0.0, times scale inf = nan)" + tail
    )
    nan = np.array([[0xFFFFFFFF]], np.uint32).view(np.float32)  # -NaN, all payload bits set
    assert refusal(raw, "F8_E4M3", nan, (4, 256)) == (
        "w.safetensors: tensor 'x': weight at row 0 col 0 is not finite once dequantised "
        "(F8_E4M3 code 0x00 = 0.0, times scale nan = nan)" + tail
    )
    # finite in float32, inf in bfloat16: 1.0 x 0x7F7F8000 rounds up to 0x7F80
    big = np.array([[0x7F7F8000]], np.uint32).view(np.float32)
    assert refusal(raw, "F8_E4M3", big, (4, 256)) == (
        "w.safetensors: tensor 'x': weight at row 0 col 3 is not finite once dequantised "
        "(F8_E4M3 code 0x38 = 1.0, times scale 3.3961775e+38 = 3.3961775e+38, inf in "
        "bfloat16)" + tail
    )
    assert dequantize_f32(raw, "F8_E4M3", big, (4, 256))[0, 3] == big[0, 0]  # finite in f32
    just_below = np.array([[0x7F7F7FFF]], np.uint32).view(np.float32)
    assert dequantize_bf16(raw, "F8_E4M3", just_below, (4, 256))[0, 3] == 0x7F7F
    raw[0, 3] = 0x7E  # 448 x 3.4e38 overflows float32
    assert refusal(raw, "F8_E4M3", big, (4, 256), f32=True) == (
        "w.safetensors: tensor 'x': weight at row 0 col 3 is not finite once dequantised "
        "(F8_E4M3 code 0x7e = 448.0, times scale 3.3961775e+38 = inf)" + tail
    )


# ---------------------------------------------------------------------------- chunks


@pytest.mark.parametrize("chunk", [1, 7, 300, 1000, 128 * 300, 1 << 30])
@pytest.mark.parametrize(
    "scale_shape, block",
    [((3, 3), (128, 128)), ((300, 1), (1, 300)), ((1, 1), (300, 300)), ((100, 2), (3, 256))],
    ids=["block", "channel", "tensor", "small-blocks"],
)
def test_chunks_give_the_bits_of_one_pass(
    monkeypatch: pytest.MonkeyPatch, chunk: int, scale_shape: tuple, block: tuple
) -> None:
    """Chunks of one row (chunk below C), of a few rows across block rows, of whole block
    rows, and the whole matrix in one."""
    raw = finite_codes("F8_E4M3", (300, 300), seed=7)
    scale = random_scales(scale_shape, seed=8)
    whole = dequantize_bf16(raw, "F8_E4M3", scale, block)
    whole32 = dequantize_f32(raw, "F8_E4M3", scale, block)
    expect = (
        fp8_table("F8_E4M3")[raw]
        * np.repeat(np.repeat(scale, block[0], 0), block[1], 1)[:300, :300]
    )
    np.testing.assert_array_equal(whole32, expect)
    monkeypatch.setattr(fp8, "CHUNK_ELEMENTS", chunk)
    np.testing.assert_array_equal(dequantize_bf16(raw, "F8_E4M3", scale, block), whole)
    np.testing.assert_array_equal(dequantize_f32(raw, "F8_E4M3", scale, block), whole32)


def test_a_refusal_names_the_position_in_the_whole_matrix_not_the_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fp8, "CHUNK_ELEMENTS", 256)
    raw = np.zeros((10, 100), np.uint8)
    raw[7, 42] = 0x7F
    assert refusal(raw, "F8_E4M3", np.ones((1, 1), np.float32), (128, 128)).startswith(
        "w.safetensors: tensor 'x': weight at row 7 col 42 is not finite"
    )


def test_memory_beyond_the_output_is_bounded_by_the_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """1024 x 1024 weights (a float32 copy: 4 MiB) in chunks of 16 Ki weights: 128 KiB."""
    monkeypatch.setattr(fp8, "CHUNK_ELEMENTS", 1 << 14)
    raw = finite_codes("F8_E4M3", (1024, 1024), seed=9)
    scale = random_scales((8, 8), seed=10)
    out = np.empty((1024, 1024), np.uint16)
    tracemalloc.start()
    try:
        dequantize_bf16(raw, "F8_E4M3", scale, (128, 128), out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a float32 chunk, its uint32 scratch, numpy's 64 KiB buffer for the table look-up
    assert peak < 8 * (1 << 14) + (96 << 10), peak
    np.testing.assert_array_equal(out, dequantize_bf16(raw, "F8_E4M3", scale, (128, 128)))


# ---------------------------------------------------------------------------- block sizes


@pytest.mark.parametrize(
    "shape, scale_shape, block",
    [
        ((7168, 2048), (56, 16), (128, 128)),  # DeepSeek-V3 gate/up
        ((2048, 7168), (16, 56), (128, 128)),  # and down
        ((200, 300), (2, 3), (128, 128)),  # partial last blocks: 100..199 and 100..149 fit
        ((256, 256), (2, 2), (128, 128)),  # 128..255 fit: the power of two
        ((100, 7168), (1, 56), (128, 128)),  # one block row: any b >= 100 is the same
        ((10, 256), (4, 2), (3, 128)),  # only 3 rows per block give 4 blocks of 10
        ((2048, 7168), (2048, 1), (1, 8192)),  # per row
        ((1, 1), (1, 1), (1, 1)),
    ],
)
def test_block_size_inference(shape: tuple, scale_shape: tuple, block: tuple) -> None:
    assert block_size(shape, scale_shape) == block


def test_a_declared_block_size_wins_when_it_fits() -> None:
    assert block_size((200, 300), (2, 3), (100, 100)) == (100, 100)  # inferred: 128
    assert block_size((7168, 2048), (56, 16), (128, 128)) == (128, 128)


@pytest.mark.parametrize(
    "shape, scale_shape, declared, message",
    [
        (
            (256, 256),
            (2, 2),
            (100, 128),
            "w: scale shape [2, 2] does not fit weight shape [256, 256] in the declared blocks "
            "[100, 128] (quantization_config.weight_block_size), which need [3, 2]; refused: "
            "the scales would be applied to the wrong weights",
        ),
        (
            (7168, 2048),
            (56, 16),
            (64, 128),
            "w: scale shape [56, 16] does not fit weight shape [7168, 2048] in the declared "
            "blocks [64, 128] (quantization_config.weight_block_size), which need [112, 16]; "
            "refused: the scales would be applied to the wrong weights",
        ),
        (
            (10, 256),
            (6, 2),
            None,
            "w: scale shape [6, 2] fits weight shape [10, 256] with no block size (10 rows "
            "cannot form 6 blocks); refused: the scales cannot be matched to the weights",
        ),
        (
            (4, 256),
            (1, 300),
            None,
            "w: scale shape [1, 300] fits weight shape [4, 256] with no block size (256 "
            "columns cannot form 300 blocks); refused: the scales cannot be matched to the "
            "weights",
        ),
        (
            (30, 256),
            (3, 2),
            None,
            "w: scale shape [3, 2] fits weight shape [30, 256] with blocks of 10 to 14 rows, "
            "none a power of two; refused: the block size is ambiguous (config.json declares "
            "none in quantization_config.weight_block_size)",
        ),
    ],
    ids=["declared-rows", "declared-64", "no-fit", "more-scales-than-columns", "ambiguous"],
)
def test_block_size_refusals(
    shape: tuple, scale_shape: tuple, declared: tuple | None, message: str
) -> None:
    with pytest.raises(RefusedInput) as e:
        block_size(shape, scale_shape, declared, what="w")
    assert str(e.value) == message


def test_the_ambiguous_shape_reads_once_declared() -> None:
    assert block_size((30, 256), (3, 2), (10, 128)) == (10, 128)
    assert block_size((30, 256), (3, 2), (14, 128)) == (14, 128)


@pytest.mark.parametrize(
    "config, block",
    [
        ({}, None),
        ({"quantization_config": None}, None),
        ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}, None),
        ({"quantization_config": {"weight_block_size": None}}, None),
        ({"quantization_config": {"weight_block_size": [128, 128]}}, (128, 128)),
        ({"quantization_config": {"weight_block_size": [1, 64]}}, (1, 64)),
    ],
)
def test_declared_block(config: dict, block: tuple | None) -> None:
    assert declared_block(config) == block


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"quantization_config": "fp8"},
            'm/config.json: quantization_config is "fp8", expected an object',
        ),
        (
            {"quantization_config": {"weight_block_size": 128}},
            "m/config.json: quantization_config.weight_block_size is 128, expected two "
            "positive integers",
        ),
        (
            {"quantization_config": {"weight_block_size": [128, 128, 1]}},
            "m/config.json: quantization_config.weight_block_size is [128, 128, 1], expected "
            "two positive integers",
        ),
        (
            {"quantization_config": {"weight_block_size": [True, 128]}},
            "m/config.json: quantization_config.weight_block_size is [true, 128], expected two "
            "positive integers",
        ),
        (
            {"quantization_config": {"weight_block_size": [128.0, 128]}},
            "m/config.json: quantization_config.weight_block_size is [128.0, 128], expected two "
            "positive integers",
        ),
    ],
)
def test_declared_block_refusals(config: dict, message: str) -> None:
    with pytest.raises(RefusedInput) as e:
        declared_block(config, "m/config.json")
    assert str(e.value) == message


def ct(*groups: dict, **extra: object) -> dict:
    """A config whose compressed-tensors quantization_config has ``groups`` (the weights of
    each config group, named group_0, group_1...)."""
    return {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {
                f"group_{i}": {"targets": ["Linear"], "weights": w} for i, w in enumerate(groups)
            },
            **extra,
        }
    }


BLOCK = {"num_bits": 8, "type": "float", "strategy": "block"}
G0 = "quantization_config.config_groups.group_0.weights"


@pytest.mark.parametrize(
    "config, block, key",
    [
        (ct({**BLOCK, "block_structure": [128, 64]}), (128, 64), f"{G0}.block_structure"),
        (ct({**BLOCK, "strategy": "group", "group_size": 96}), (1, 96), f"{G0}.group_size"),
        (ct({**BLOCK, "strategy": "channel"}), None, None),
        (ct(None), None, None),  # type: ignore[arg-type]
        (  # two declarations that agree
            ct({**BLOCK, "block_structure": [128, 128]}, weight_block_size=[128, 128]),
            (128, 128),
            "quantization_config.weight_block_size",
        ),
    ],
)
def test_compressed_tensors_declarations_are_read(config: dict, block: tuple, key: str) -> None:
    """Issue #31: block_structure (and a group strategy's group_size) was ignored."""
    got = declared_block(config)
    assert got == block and getattr(got, "key", None) == key


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"quantization_config": {"weight_block_size": [2**63, 128]}},
            "m/config.json: quantization_config.weight_block_size is [9223372036854775808, 128], "
            "expected two positive integers of at most 2147483647 (2^31 - 1)",
        ),
        (
            {"quantization_config": {"weight_block_size": [128, -1]}},
            "m/config.json: quantization_config.weight_block_size is [128, -1], expected two "
            "positive integers",
        ),
        (
            ct({**BLOCK, "block_structure": "128x128"}),
            f'm/config.json: {G0}.block_structure is "128x128", expected two positive integers',
        ),
        (
            ct({**BLOCK, "block_structure": [2**31, 1]}),
            f"m/config.json: {G0}.block_structure is [2147483648, 1], expected two positive "
            "integers of at most 2147483647 (2^31 - 1)",
        ),
        (
            ct({**BLOCK, "strategy": "group", "group_size": True}),
            f"m/config.json: {G0}.group_size is true, expected a positive integer of at most "
            "2147483647 (2^31 - 1)",
        ),
        (
            ct({**BLOCK, "block_structure": [128, 128]}, weight_block_size=[64, 64]),
            "m/config.json: quantization_config.weight_block_size declares blocks [64, 64], but "
            f"{G0}.block_structure declares [128, 128]; refused: which one scales the experts "
            "cannot be told",
        ),
        (
            ct({**BLOCK, "block_structure": [128, 128]}, {**BLOCK, "block_structure": [64, 128]}),
            f"m/config.json: {G0}.block_structure declares blocks [128, 128], but "
            "quantization_config.config_groups.group_1.weights.block_structure declares "
            "[64, 128]; refused: which one scales the experts cannot be told",
        ),
        (
            {"quantization_config": {"config_groups": [1]}},
            "m/config.json: quantization_config.config_groups is [1], expected an object",
        ),
        (
            ct("block"),  # type: ignore[arg-type]
            f'm/config.json: {G0} is "block", expected an object',
        ),
    ],
)
def test_absurd_or_conflicting_declarations_are_refused_naming_the_key(
    config: dict, message: str
) -> None:
    with pytest.raises(RefusedInput) as e:
        declared_block(config, "m/config.json")
    assert str(e.value) == message


def test_a_block_structure_that_does_not_fit_is_refused_naming_it() -> None:
    declared = declared_block(ct({**BLOCK, "block_structure": [100, 128]}))
    with pytest.raises(RefusedInput) as e:
        block_size((256, 256), (2, 2), declared)
    assert str(e.value) == (
        "FP8 weight: scale shape [2, 2] does not fit weight shape [256, 256] in the declared "
        f"blocks [100, 128] ({G0}.block_structure), which need [3, 2]; refused: the scales "
        "would be applied to the wrong weights"
    )


# ---------------------------------------------------------------------------- schemes


class T(NamedTuple):
    dtype: str
    shape: tuple


W = "model.layers.3.mlp.experts.7.gate_proj.weight"
WHY = "refused: only BF16, F16 and F32 weights, and FP8 ones with their scales, can be read"


def ck(**companions: T) -> dict[str, T]:
    """An FP8 [256, 512] weight ``W`` and ``companions`` named by their suffix to W."""
    return {W: T("F8_E4M3", (256, 512)), **{W + k: v for k, v in companions.items()}}


@pytest.mark.parametrize(
    "tensors, declared, scheme",
    [
        (
            ck(_scale_inv=T("F32", (2, 4))),
            None,
            Scheme("fp8-block", "F8_E4M3", W + "_scale_inv", (128, 128)),
        ),
        (
            ck(_scale_inv=T("BF16", (2, 4))),
            (128, 128),
            Scheme("fp8-block", "F8_E4M3", W + "_scale_inv", (128, 128)),
        ),
        (
            ck(_scale_inv=T("F32", (2, 4))),
            (200, 128),  # declared wins over the inferred 128 rows
            Scheme("fp8-block", "F8_E4M3", W + "_scale_inv", (200, 128)),
        ),
        (
            ck(_scale=T("F32", (256, 1))),
            None,
            Scheme("fp8-channel", "F8_E4M3", W + "_scale", (1, 512)),
        ),
        (
            ck(_scale=T("BF16", (256,))),
            (128, 128),  # a declared block is for block scales
            Scheme("fp8-channel", "F8_E4M3", W + "_scale", (1, 512)),
        ),
        (ck(_scale=T("F32", ())), None, Scheme("fp8-tensor", "F8_E4M3", W + "_scale", (256, 512))),
        (
            ck(_scale=T("F32", (1,))),
            None,
            Scheme("fp8-tensor", "F8_E4M3", W + "_scale", (256, 512)),
        ),
        (
            ck(_scale=T("F16", (1, 1))),
            None,
            Scheme("fp8-tensor", "F8_E4M3", W + "_scale", (256, 512)),
        ),
        (  # compressed-tensors block strategy: weight_scale of blocks
            ck(_scale=T("F32", (2, 4))),
            None,
            Scheme("fp8-block", "F8_E4M3", W + "_scale", (128, 128)),
        ),
        (  # compressed-tensors group strategy: groups of 128 along each row
            ck(_scale=T("F32", (256, 4))),
            None,
            Scheme("fp8-block", "F8_E4M3", W + "_scale", (1, 128)),
        ),
        (
            {W: T("F8_E5M2", (256, 512)), W + "_scale_inv": T("F32", (2, 4))},
            None,
            Scheme("fp8-block", "F8_E5M2", W + "_scale_inv", (128, 128)),
        ),
        ({W: T("BF16", (256, 512))}, None, Scheme("none", "BF16")),
        ({W: T("F32", (256, 512)), W + ".bias": T("F32", (256,))}, None, Scheme("none", "F32")),
    ],
    ids=[
        "block",
        "block-bf16-declared",
        "block-declared",
        "channel-2d",
        "channel-1d",
        "tensor-0d",
        "tensor-1d",
        "tensor-2d",
        "ct-block",
        "ct-group",
        "e5m2",
        "bf16",
        "f32",
    ],
)
def test_schemes(tensors: dict, declared: tuple | None, scheme: Scheme) -> None:
    assert scheme_of(W, tensors, declared) == scheme


FUSED = "model.layers.0.mlp.experts.gate_up_proj"


@pytest.mark.parametrize(
    "scale_name, scale_shape, scheme",
    [
        ("_scale_inv", (8, 2, 4), Scheme("fp8-block", "F8_E4M3", "s", (128, 128), True)),
        ("_scale_inv", (2, 4), Scheme("fp8-block", "F8_E4M3", "s", (128, 128), False)),
        ("_scale", (8, 256, 1), Scheme("fp8-channel", "F8_E4M3", "s", (1, 512), True)),
        ("_scale", (8, 256), Scheme("fp8-channel", "F8_E4M3", "s", (1, 512), True)),
        ("_scale", (256, 1), Scheme("fp8-channel", "F8_E4M3", "s", (1, 512), False)),
        ("_scale", (8,), Scheme("fp8-tensor", "F8_E4M3", "s", (256, 512), True)),
        ("_scale", (8, 1, 1), Scheme("fp8-tensor", "F8_E4M3", "s", (256, 512), True)),
        ("_scale", (), Scheme("fp8-tensor", "F8_E4M3", "s", (256, 512), False)),
    ],
)
def test_stacked_experts(scale_name: str, scale_shape: tuple, scheme: Scheme) -> None:
    """A fused [E, R, C] weight: scales with its leading dimension are one per matrix."""
    name = FUSED + scale_name
    tensors = {FUSED: T("F8_E4M3", (8, 256, 512)), name: T("F32", scale_shape)}
    got = scheme_of(FUSED, tensors)
    assert got == Scheme(scheme.kind, scheme.dtype, name, scheme.block, scheme.stacked)


@pytest.mark.parametrize(
    "name, tensors, message",
    [
        (
            FUSED,
            {
                FUSED + "_blocks": T("U8", (32, 5760, 90, 16)),
                FUSED + "_scales": T("U8", (32, 5760, 90)),
            },
            f"tensor {FUSED!r} is MXFP4 (gpt-oss style _blocks/_scales: found "
            f"'{FUSED}_blocks'); " + WHY,
        ),
        (
            W,
            {W + "_packed": T("I32", (256, 64)), W + "_scale": T("BF16", (256, 4))},
            f"tensor {W!r} is INT4/INT8 packed (compressed-tensors pack-quantized "
            f"weight_packed: found '{W}_packed'); " + WHY,
        ),
        (
            W,
            {
                W + "_packed": T("U8", (256, 256)),
                W + "_scale": T("F8_E4M3", (256, 32)),
                W + "_global_scale": T("F32", (1,)),
            },
            f"tensor {W!r} is NVFP4 (compressed-tensors nvfp4-pack-quantized: found "
            f"'{W}_global_scale'); " + WHY,
        ),
        (
            W,
            {
                W: T("U8", (256, 256)),
                W + "_scale": T("F8_E4M3", (256, 32)),
                W + "_scale_2": T("F32", ()),
            },
            f"tensor {W!r} is NVFP4 (ModelOpt style weight_scale_2: found '{W}_scale_2'); " + WHY,
        ),
        (
            W,
            {W[:-7] + ".qweight": T("I32", (64, 256)), W[:-7] + ".qzeros": T("I32", (4, 32))},
            f"tensor {W!r} is GPTQ or AWQ (qweight/qzeros/scales: found '{W[:-7]}.qweight'); "
            + WHY,
        ),
        (
            W,
            {W[:-7] + ".scales": T("F16", (4, 256))},
            f"tensor {W!r} is GPTQ or AWQ (qweight/qzeros/scales: found '{W[:-7]}.scales'); " + WHY,
        ),
        (
            W,
            {
                W: T("U8", (65536, 1)),
                W + ".absmax": T("F32", (2048,)),
                W + ".quant_map": T("F32", (16,)),
            },
            f"tensor {W!r} is bitsandbytes 4-bit (absmax/quant_map: found '{W}.absmax'); " + WHY,
        ),
        (
            W,
            {W: T("U8", (65536, 1)), W + ".quant_state.bitsandbytes__nf4": T("U8", (100,))},
            f"tensor {W!r} is bitsandbytes 4-bit (absmax/quant_map: found "
            f"'{W}.quant_state.bitsandbytes__nf4'); " + WHY,
        ),
        (
            W,
            {W: T("I8", (256, 512)), W[:-7] + ".SCB": T("F32", (256,))},
            f"tensor {W!r} is bitsandbytes 8-bit (SCB: found '{W[:-7]}.SCB'); " + WHY,
        ),
        (
            W,
            {W[:-7] + ".W_q": T("U8", (65536, 1))},
            f"tensor {W!r} is HQQ (W_q/meta: found '{W[:-7]}.W_q'); " + WHY,
        ),
        (
            W,
            ck(_scale=T("F32", (256, 1)), _zero_point=T("F32", (256, 1))),
            f"tensor {W!r} is asymmetric (weight_zero_point: found '{W}_zero_point'); " + WHY,
        ),
        (
            W,
            ck(_scale=T("F32", (256, 4)), _g_idx=T("I32", (512,))),
            f"tensor {W!r} is activation-ordered (weight_g_idx: found '{W}_g_idx'); " + WHY,
        ),
        (
            W,
            ck(),
            f"tensor {W!r} is F8_E4M3 without scales (neither '{W}_scale_inv' nor "
            f"'{W}_scale' is in the checkpoint); refused: FP8 weights are read only with "
            "their scales",
        ),
        (
            W,
            ck(_scale_inv=T("F32", (2, 4)), _scale=T("F32", ())),
            f"tensor {W!r} is F8_E4M3 with two scale tensors, '{W}_scale_inv' and "
            f"'{W}_scale'; refused: which one applies is ambiguous",
        ),
        (
            W,
            {W: T("BF16", (256, 512)), W + "_scale_inv": T("F32", (2, 4))},
            f"tensor {W!r} is BF16 with scales in '{W}_scale_inv'; refused: its values are not "
            "the weights without the scales; only FP8 weights are read with scales",
        ),
        (
            W,
            {W: T("I8", (256, 512)), W + "_scale": T("F32", (256, 1))},
            f"tensor {W!r} is I8 with scales in '{W}_scale' (integer or packed 4-bit "
            "quantisation); " + WHY,
        ),
        (W, {W: T("I8", (256, 512))}, f"tensor {W!r} is I8; " + WHY),
        (
            W,
            ck(_scale_inv=T("U8", (2, 4))),
            f"tensor {W!r} is F8_E4M3 with scales '{W}_scale_inv' of dtype U8; refused: FP8 "
            "scales must be F32, BF16 or F16",
        ),
        (
            W,
            {W: T("F8_E4M3", (512,)), W + "_scale": T("F32", ())},
            f"tensor {W!r} is F8_E4M3 [512]; refused: FP8 weights are dequantised as 2-D "
            "matrices (or stacks of them)",
        ),
        (
            W,
            {W: T("F8_E4M3", (0, 512)), W + "_scale": T("F32", ())},
            f"tensor {W!r} is F8_E4M3 [0, 512]; refused: FP8 weights are dequantised as 2-D "
            "matrices (or stacks of them)",
        ),
        (
            W,
            ck(_scale=T("F32", (512,))),
            f"tensor {W!r} is F8_E4M3 [256, 512] with scales '{W}_scale' of shape [512]; "
            "refused: the scales are neither per tensor, per channel nor per 2-D block",
        ),
        (
            W,
            ck(_scale_inv=T("F32", (256,))),
            f"tensor {W!r} is F8_E4M3 [256, 512] with scales '{W}_scale_inv' of shape [256]; "
            "refused: the scales are neither per tensor, per channel nor per 2-D block",
        ),
        (
            W,
            ck(_scale_inv=T("F32", (3, 4))),
            f"tensor {W!r} (scales '{W}_scale_inv'): scale shape [3, 4] fits weight shape "
            "[256, 512] with blocks of 86 to 127 rows, none a power of two; refused: the block "
            "size is ambiguous (config.json declares none in "
            "quantization_config.weight_block_size)",
        ),
        (W, {}, f"tensor {W!r} is not in the checkpoint"),
    ],
    ids=[
        "mxfp4",
        "int4-packed",
        "nvfp4-ct",
        "nvfp4-modelopt",
        "gptq",
        "awq-scales",
        "bnb-4bit",
        "bnb-quant-state",
        "bnb-8bit",
        "hqq",
        "zero-point",
        "g-idx",
        "fp8-unscaled",
        "two-scales",
        "bf16-scaled",
        "int8-scaled",
        "int8",
        "scale-dtype",
        "fp8-1d",
        "fp8-empty",
        "scale-shape",
        "scale-inv-1d",
        "ambiguous-block",
        "missing",
    ],
)
def test_refused_schemes(name: str, tensors: dict, message: str) -> None:
    with pytest.raises(RefusedInput) as e:
        scheme_of(name, tensors, where="m/model-00001.safetensors")
    assert str(e.value) == f"m/model-00001.safetensors: {message}"


def test_scales_that_do_not_fit_the_declared_block_are_refused() -> None:
    with pytest.raises(RefusedInput) as e:
        scheme_of(W, ck(_scale_inv=T("F32", (2, 4))), (64, 128), where="m/model.safetensors")
    assert str(e.value) == (
        f"m/model.safetensors: tensor {W!r} (scales '{W}_scale_inv'): scale shape [2, 4] does "
        "not fit weight shape [256, 512] in the declared blocks [64, 128] "
        "(quantization_config.weight_block_size), which need [4, 4]; refused: the scales "
        "would be applied to the wrong weights"
    )


def test_messages_start_with_the_shard_of_a_tensor_info(tmp_path: Path) -> None:
    shard = tmp_path / "model.safetensors"
    write_file(
        shard,
        [(W, "F8_E4M3", (4, 4))],
        lambda fd, i, at: fileio.pwrite_all(fd, bytes(16), at, shard),
    )
    tensors = read_header(shard)
    with pytest.raises(RefusedInput) as e:
        scheme_of(W, tensors)
    assert str(e.value).startswith(f"{shard}: tensor {W!r} is F8_E4M3 without scales")
    with pytest.raises(RefusedInput) as e:
        scheme_of(W, tensors, where="elsewhere")
    assert str(e.value).startswith(f"elsewhere: tensor {W!r} is F8_E4M3 without scales")


# ---------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("scale_dtype", ["F32", "BF16"])
def test_a_deepseek_style_shard_reads_as_torch_converts_it(
    tmp_path: Path, scale_dtype: str
) -> None:
    """A shard with an FP8 weight and its block scales: header -> scheme -> positioned
    reads -> bfloat16, equal to fp8_cast_bf16's arithmetic."""
    raw = finite_codes("F8_E4M3", (200, 300), seed=11)
    scale32 = random_scales((2, 3), seed=12)
    if scale_dtype == "BF16":
        scale_bytes = (scale32.view(np.uint32) >> 16).astype("<u2")
        scale32 = scale_f32(scale_bytes, "BF16")
    else:
        scale_bytes = scale32.astype("<f4")
    shard = tmp_path / "model.safetensors"
    items = [(W, "F8_E4M3", (200, 300)), (W + "_scale_inv", scale_dtype, (2, 3))]
    data = {W: raw, W + "_scale_inv": scale_bytes}
    write_file(shard, items, lambda fd, i, at: fileio.pwrite_all(fd, data[items[i][0]], at, shard))
    tensors = read_header(shard)
    scheme = scheme_of(
        W, tensors, declared_block({"quantization_config": {"weight_block_size": [128, 128]}})
    )
    assert scheme == Scheme("fp8-block", "F8_E4M3", W + "_scale_inv", (128, 128))
    assert scheme.scale is not None and scheme.block is not None
    info = tensors[W]
    back = np.fromfile(shard, np.uint8, count=info.nbytes, offset=info.offset).reshape(info.shape)
    scale = read_scale(tensors[scheme.scale])
    np.testing.assert_array_equal(scale, scale32)
    got = dequantize_bf16(back, scheme.dtype, scale, scheme.block, where=f"{shard}: tensor {W!r}")
    np.testing.assert_array_equal(got, torch_reference(raw, "F8_E4M3", scale32, (128, 128))[0])
