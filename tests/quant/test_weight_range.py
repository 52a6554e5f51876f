"""Weights the format cannot hold are refused; SNR figures are always finite or null.

Issue 10 case 7: NaN/Inf weights, weights above 65504 (the largest fp16 scale times the
top level 1.0), and the sculpt summary (null SNR for exact encodes, low-SNR warnings).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from smoe import quant
from smoe.errors import SmoeError
from smoe.format.plan import make_plan
from smoe.interop.safetensors_io import read_header
from smoe.sculpt import SculptResult
from smoe.sculpt.outcome import ExpertOutcome, TensorOutcome
from smoe.vault.blob import MatrixInput, encode_blob
from smoe_gen.layout import GROUP_SIZE, SUPPORTED_BITS, TENSOR_NAMES
from smoe_testkit.synth import write_checkpoint

from helpers import run, strict_json

MODES = ("optimal", "absmax")
SOURCES = ("f32", "f16", "bf16")
SHAPE = (40, 70)  # rows straddle groups; 2800 weights = 43 groups + a partial one
CHUNK = GROUP_SIZE * 4  # several chunks, so the bad weights are not in the first one


def exactly(error: type[Exception], message: str):
    return pytest.raises(error, match="^" + re.escape(message) + "$")


def as_source(w: np.ndarray, src: str) -> tuple[np.ndarray, str | None]:
    """``w`` (float32, values exact in every source dtype) as an encoder input."""
    if src == "bf16":
        return (w.view(np.uint32) >> 16).astype(np.uint16), "bf16"
    return (w.astype(np.float16), None) if src == "f16" else (w, None)


def base() -> np.ndarray:
    return np.random.default_rng(7).normal(0, 0.02, SHAPE).astype(np.float32)


# ---------------------------------------------------------------------------- encoder


@pytest.mark.parametrize("src", SOURCES)
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("mode", MODES)
def test_non_finite_weights_counted_and_located(src: str, bits: int, mode: str) -> None:
    w = base()
    w[7, 12], w[30, 3], w[39, 69] = np.nan, np.inf, -np.inf  # the last is in the partial group
    arr, dt = as_source(w, src)
    msg = (
        "3 weights are inf or nan, the first (nan) at row 7 col 12; the format stores "
        "finite values only"
    )
    for overflow in ("clip", "raise"):  # refused either way
        with exactly(quant.NonFiniteWeights, msg) as info:
            quant.encode(arr, bits, mode, src_dtype=dt, chunk_weights=CHUNK, overflow=overflow)
        e = info.value
        assert isinstance(e, SmoeError) and isinstance(e, ValueError)
        assert (e.count, e.position, e.bits) == (3, (7, 12), bits)


@pytest.mark.parametrize("src", SOURCES)
def test_one_non_finite_weight(src: str) -> None:
    w = base()
    w[39, 69] = -np.inf
    arr, dt = as_source(w, src)
    with exactly(
        quant.NonFiniteWeights,
        "1 weight is inf or nan (-inf) at row 39 col 69; the format stores finite values only",
    ):
        quant.encode(arr, 4, src_dtype=dt)


@pytest.mark.parametrize("src", ["f32", "bf16"])  # float16 cannot hold |w| > 65504
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("mode", MODES)
def test_scale_overflow_refused(src: str, bits: int, mode: str) -> None:
    w = base()
    w[0, 5], w[0, 6], w[20, 0] = 2.0**20, -(2.0**17), 2.0**127  # groups 0, 0 and 21
    arr, dt = as_source(w, src)
    msg = (
        f"2 groups need a scale above 65504 (the largest float16): 3 weights have "
        f"|w| > 65504, up to 1.7014118e+38 at row 20 col 0; the largest magnitude Q{bits} "
        "can hold is 65504 (top level 1.0 x scale 65504)"
    )
    with exactly(quant.ScaleOverflow, msg) as info:
        quant.encode(arr, bits, mode, src_dtype=dt, chunk_weights=CHUNK, overflow="raise")
    assert (info.value.count, info.value.groups, info.value.position) == (3, 2, (20, 0))
    _, scales = quant.encode(arr, bits, mode, src_dtype=dt)  # "clip": the module's default
    assert scales.max() == 65504


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_65504_is_the_largest_magnitude_held(bits: int) -> None:
    w = base().astype(np.float16)  # the float16 maximum itself fits: level 1.0 x 65504
    w[3, 4], w[3, 5] = 65504, -65504
    packed, scales = quant.encode(w, bits, "absmax", overflow="raise")
    got = quant.decode(packed, scales, bits, SHAPE)
    assert (got[3, 4], got[3, 5]) == (65504, -65504)
    above = w.astype(np.float32)
    above[3, 4] = np.nextafter(np.float32(65504), np.float32(np.inf))
    with exactly(
        quant.ScaleOverflow,
        "1 group needs a scale above 65504 (the largest "
        "float16): 1 weight has |w| > 65504, up to 65504.004 at row 3 col 4; the largest "
        f"magnitude Q{bits} can hold is 65504 (top level 1.0 x scale 65504)",
    ):
        quant.encode(above, bits, overflow="raise")


def test_non_finite_reported_before_overflow() -> None:
    w = base()
    w[0, 0], w[35, 1] = 1e6, np.nan  # the overflow comes first, in an earlier chunk
    with pytest.raises(quant.NonFiniteWeights) as info:
        quant.encode(w, 4, chunk_weights=CHUNK, overflow="raise")
    assert info.value.position == (35, 1)


def test_error_pickles_with_message_and_fields() -> None:
    e = quant.NonFiniteWeights("msg", count=2, groups=0, position=(7, 12), value=np.nan, bits=4)
    for err in (e, e.within("layer 3 expert 5 down_proj")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is quant.NonFiniteWeights
        assert str(back) == str(err)
        assert (back.count, back.position, back.bits) == (2, (7, 12), 4)
    assert str(e.within("layer 3 expert 5 down_proj")) == "layer 3 expert 5 down_proj: msg"


def test_encode_blob_names_layer_expert_and_tensor() -> None:
    shapes = ((32, 64), (32, 64), (64, 32))
    slot = make_plan({(3, 5): shapes}, 4, 2).experts[0]
    mats = [
        np.random.default_rng(i).normal(0, 0.02, s).astype(np.float32) for i, s in enumerate(shapes)
    ]
    mats[2][7, 12] = mats[2][9, 0] = np.nan
    with exactly(
        quant.NonFiniteWeights,
        "layer 3 expert 5 down_proj: 2 weights are inf or "
        "nan, the first (nan) at row 7 col 12; the format stores finite values only",
    ):
        encode_blob(slot, MatrixInput.each(mats), 4, "optimal")
    mats[2][7, 12] = mats[2][9, 0] = 0
    mats[0][0, 5] = 1e6
    with exactly(
        quant.ScaleOverflow,
        "layer 3 expert 5 gate_proj: 1 group needs a scale above "
        "65504 (the largest float16): 1 weight has |w| > 65504, up to 1e+06 at row 0 "
        "col 5; the largest magnitude Q4 can hold is 65504 (top level 1.0 x scale "
        "65504)",
    ):
        encode_blob(slot, MatrixInput.each(mats), 4, "optimal")


# ---------------------------------------------------------------------------- SNR figures


def test_quant_stats_give_null_for_exact_encodes() -> None:
    for w, exact in ((np.zeros((4, 64), np.float32), True), (base(), False)):
        stats = quant.QuantStats()
        quant.encode_into(
            w,
            4,
            np.empty(quant.packed_size(w.size, 4), np.uint8),
            np.empty(quant.num_groups(w.size), "<f2"),
            stats=stats,
        )
        if exact:
            assert (stats.finite_snr_db, stats.snr_db) == (None, float("inf"))
        else:
            assert stats.finite_snr_db == stats.snr_db > 15


def test_quant_stats_survive_float32_overflow() -> None:
    w = base()
    w[0, 0] = 3e38  # squares overflow float32; the encode itself clips (the default)
    stats = quant.QuantStats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quant.encode_into(
            w,
            4,
            np.empty(quant.packed_size(w.size, 4), np.uint8),
            np.empty(quant.num_groups(w.size), "<f2"),
            stats=stats,
        )
    assert stats.finite_snr_db is not None and np.isfinite(stats.snr_db)


def result(snr: dict, keys: list, bits: int | None = 4) -> SculptResult:
    """A result whose experts ``keys`` have, per tensor name, the SNRs ``snr`` lists (None
    for a tensor it leaves out)."""
    experts = tuple(
        ExpertOutcome(
            key=key,
            blob_crc=0,
            tensors=tuple(
                TensorOutcome(source_crc=0, snr=snr.get(name, [None] * len(keys))[i])
                for name in TENSOR_NAMES
            ),
            source_bytes=0,
        )
        for i, key in enumerate(keys)
    )
    return SculptResult(
        Path("m.smoe"),
        Path("m.scout.safetensors"),
        len(keys),
        0,
        1000,
        500,
        100,
        1.0,
        experts,
        ["from the checkpoint"],
        bits=bits,
    )


def test_summary_counts_exact_tensors_and_stays_json() -> None:
    keys = [(0, 0), (0, 1), (1, 0)]
    s = result(
        {
            "gate_proj": [18.0, float("inf"), 17.0],
            "up_proj": [None, None, None],
            "down_proj": [float("nan"), 19.0, float("-inf")],
        },
        keys,
    ).summary()
    assert s["snr_db"] == {
        "gate_proj": {"min": 17.0, "median": 17.5},
        "up_proj": None,
        "down_proj": {"min": 19.0, "median": 19.0},
    }
    assert (s["snr_exact"], s["snr_floor_db"]) == (6, 10.0)
    assert s["warnings"] == ["from the checkpoint"]
    assert strict_json(json.dumps(s, default=str)) == json.loads(json.dumps(s, default=str))


def test_low_snr_warnings_name_the_tensor_and_collapse() -> None:
    keys = [(0, 0), (0, 1), (2, 7)]
    few = result({"gate_proj": [18.0, 1.5, 17.0], "up_proj": [18.0, 18.0, 9.25]}, keys)
    assert few.summary()["warnings"] == [
        "from the checkpoint",
        "layer 0 expert 1 gate_proj: SNR 1.50 dB is below the Q4 floor of 10 dB",
        "layer 2 expert 7 up_proj: SNR 9.25 dB is below the Q4 floor of 10 dB",
    ]
    many = result({"gate_proj": [0.5, 1.5, 2.0], "down_proj": [1.0, 2.1, 2.6]}, keys, bits=2)
    assert many.summary()["warnings"][1:] == [
        "5 expert tensors have an SNR below the Q2 floor of 2.5 dB; worst: layer 0 expert 0 "
        "gate_proj 0.50 dB, layer 0 expert 0 down_proj 1.00 dB, layer 0 expert 1 gate_proj "
        "1.50 dB"
    ]
    assert result({"gate_proj": [0.5]}, [(0, 0)], bits=None).snr_warnings() == []


# ---------------------------------------------------------------------------- end to end


def patch(root: Path, tensor: str, row: int, col: int, value: float) -> None:
    """Overwrite one weight of a checkpoint tensor in place (F32, F16 or BF16)."""
    info = read_header(root / "model.safetensors")[tensor]
    x = np.array([value], np.float32)
    raw = {
        "F32": lambda: x.astype("<f4"),
        "F16": lambda: x.astype("<f2"),
        "BF16": lambda: (x.view(np.uint32) >> 16).astype("<u2"),
    }[info.dtype]()
    fd = os.open(root / "model.safetensors", os.O_WRONLY)
    try:
        os.pwrite(fd, raw.tobytes(), info.offset + (row * info.shape[1] + col) * raw.itemsize)
    finally:
        os.close(fd)


def expert_tensor(layer: int, expert: int, name: str) -> str:
    return f"model.layers.{layer}.mlp.experts.{expert}.{name}.weight"


CASES = {
    "nan-f32": (
        "F32",
        [(0, 2, "down_proj", 7, 12, np.nan), (0, 2, "down_proj", 30, 0, np.inf)],
        "layer 0 expert 2 down_proj: 2 weights are inf or nan, the first (nan) at row 7 "
        "col 12; the format stores finite values only",
    ),
    "inf-f16": (
        "F16",
        [(1, 0, "up_proj", 3, 63, -np.inf)],
        "layer 1 expert 0 up_proj: 1 weight is inf or nan (-inf) at row 3 col 63; the "
        "format stores finite values only",
    ),
    "big-f32": (
        "F32",
        [(0, 1, "gate_proj", 0, 5, 1e6)],
        "layer 0 expert 1 gate_proj: 1 group needs a scale above 65504 (the largest "
        "float16): 1 weight has |w| > 65504, up to 1e+06 at row 0 col 5; the largest "
        "magnitude Q4 can hold is 65504 (top level 1.0 x scale 65504)",
    ),
    "huge-bf16": (
        "BF16",
        [(1, 3, "gate_proj", 31, 0, 2.0**127)],
        "layer 1 expert 3 gate_proj: 1 group needs a scale above 65504 (the largest "
        "float16): 1 weight has |w| > 65504, up to 1.7014118e+38 at row 31 col 0; the "
        "largest magnitude Q4 can hold is 65504 (top level 1.0 x scale 65504)",
    ),
}


@pytest.mark.parametrize(
    ("case", "jobs"),  # jobs 2: the error crosses a process boundary
    [(c, 1) for c in sorted(CASES)] + [("nan-f32", 2), ("huge-bf16", 2)],
)
def test_cli_refuses_and_writes_nothing(tmp_path: Path, case: str, jobs: int) -> None:
    dtype, edits, message = CASES[case]
    root = write_checkpoint(
        tmp_path / case, layers=2, experts=4, d_model=64, ffn=32, dtype=dtype, seed=1
    )
    for layer, expert, name, row, col, value in edits:
        patch(root, expert_tensor(layer, expert, name), row, col, value)
    out = tmp_path / "out"
    out.mkdir()
    proc = run("sculpt", root, out, "--jobs", jobs)
    assert (proc.returncode, proc.stderr, proc.stdout) == (1, f"error: {message}\n", "")
    left = {p.name: p.stat().st_size for p in out.iterdir()}
    assert set(left) <= {f".{case}.smoe.lock"}  # no vault, scout, partial or journal
    assert sum(left.values()) < 32  # the lock file (kept by design) holds at most a pid


def test_cli_json_summary_with_an_all_zero_expert(tmp_path: Path) -> None:
    root = write_checkpoint(
        tmp_path / "zero", layers=1, experts=3, d_model=64, ffn=32, dtype="F32", seed=2
    )
    header = read_header(root / "model.safetensors")
    fd = os.open(root / "model.safetensors", os.O_WRONLY)
    try:
        for name in ("gate_proj", "up_proj", "down_proj"):
            info = header[expert_tensor(0, 1, name)]
            os.pwrite(fd, bytes(info.nbytes), info.offset)
    finally:
        os.close(fd)
    proc = run("sculpt", root, tmp_path / "out", "--json")
    assert (proc.returncode, proc.stderr) == (0, "")
    s = strict_json(proc.stdout)
    assert s["experts_written"] == 3 and s["snr_exact"] == 3
    for v in s["snr_db"].values():
        assert 10 < v["min"] <= v["median"] < 40
