"""Hessian-aware rounding (``quant.encode_hessian``, issue 24).

The result is the encoder's format exactly (sizes, dtypes, decodable, the same packing);
with ``H = I`` it is no worse than the plain encoder, on correlated inputs with outlier
channels its output error on held-out inputs is lower (much lower at Q2); it is
deterministic; degenerate ``H`` (zero, rank-deficient, dead inputs, indefinite) is handled;
bad arguments are refused word for word; the factorisation works in place.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from smoe import quant
from smoe.errors import RefusedInput, UsageError
from smoe.quant import HessianReport, encode_hessian, encode_hessian_into, hessian_error
from smoe_gen.layout import SUPPORTED_BITS


def weights(rows: int, cols: int, seed: int) -> np.ndarray:
    """Student-t(4) weights, scale 0.02 (trained weights are heavy-tailed)."""
    return (np.random.default_rng(seed).standard_t(4, (rows, cols)) * 0.02).astype(np.float32)


def inputs(cols: int, n: int, seed: int, *, draw: int = 0) -> np.ndarray:
    """``n`` inputs of dimension ``cols`` with correlated channels (``cols // 4`` shared
    factors plus noise), lognormal channel scales and 2 % outlier channels at 10x. The
    distribution is fixed by ``seed``; ``draw`` picks independent samples of it."""
    rng = np.random.default_rng(seed)
    k = cols // 4
    mix = rng.normal(0, 1, (k, cols)) / np.sqrt(k)
    scale = rng.lognormal(0, 0.5, cols) * np.where(rng.random(cols) < 0.02, 10.0, 1.0)
    r = np.random.default_rng([seed, draw])
    return (r.normal(0, 1, (n, k)) @ mix + r.normal(0, 0.5, (n, cols))) * scale


def moments(x: np.ndarray) -> np.ndarray:
    return x.T @ x / len(x)


def decoded(packed: np.ndarray, scales: np.ndarray, bits: int, shape) -> np.ndarray:
    return quant.decode(packed, scales, bits, shape)


def plain(w: np.ndarray, bits: int) -> np.ndarray:
    return decoded(*quant.encode(w, bits), bits, w.shape)


def held_out_error(w: np.ndarray, w_hat: np.ndarray, x: np.ndarray) -> float:
    """Mean ``|(W - W_hat) x|^2`` over the rows of ``x``."""
    d = (w.astype(np.float64) - w_hat) @ x.T
    return float(np.square(d).sum() / len(x))


# ---------------------------------------------------------------------------- layout


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("shape", [(64, 128), (33, 100), (3, 64), (1, 1), (130, 65)])
def test_the_encoders_layout_and_decodable(bits: int, shape: tuple[int, int]) -> None:
    rows, cols = shape
    w = weights(rows, cols, 1)
    h = moments(inputs(cols, 512, 2))
    packed, scales = encode_hessian(w, h, bits)
    ref_packed, ref_scales = quant.encode(w, bits)
    assert packed.dtype == ref_packed.dtype and packed.shape == ref_packed.shape
    assert scales.dtype == ref_scales.dtype == np.dtype("<f2")
    assert scales.shape == ref_scales.shape
    assert np.isfinite(scales.astype(np.float32)).all() and (scales >= 0).all()
    n = w.size
    if n * bits % 8:  # the unused high bits of the last byte are zero (ruling D2)
        assert packed[-1] >> (n * bits % 8) == 0
    w_hat = decoded(packed, scales, bits, w.shape)
    assert w_hat.shape == w.shape
    err, base = hessian_error(w, w_hat, h), hessian_error(w, plain(w, bits), h)
    assert err <= base * (1 + 1e-12)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_into_caller_buffers_gives_the_same_bytes(bits: int) -> None:
    w = weights(70, 192, 3)
    h = moments(inputs(192, 1024, 4))
    packed, scales = encode_hessian(w, h, bits)
    blob = np.zeros(quant.packed_size(w.size, bits) + quant.scales_size(w.size), np.uint8)
    cut = quant.packed_size(w.size, bits)
    encode_hessian_into(w, h, bits, blob[:cut], blob[cut:])
    assert bytes(blob) == bytes(packed) + bytes(scales)
    fp16 = np.empty(quant.num_groups(w.size), np.float16)
    out = np.empty(cut, np.uint8)
    encode_hessian_into(w, h, bits, out, fp16)
    assert bytes(out) == bytes(packed) and bytes(fp16) == bytes(scales)


def test_the_report_is_what_a_decode_measures() -> None:
    w = weights(64, 256, 5)
    h = moments(inputs(256, 2048, 6))
    report = HessianReport()
    packed, scales = encode_hessian(w, h, 2, report=report)
    w_hat = decoded(packed, scales, 2, w.shape)
    assert report.error == pytest.approx(hessian_error(w, w_hat, h), rel=1e-9)
    assert report.plain_error == pytest.approx(hessian_error(w, plain(w, 2), h), rel=1e-9)
    assert report.signal == pytest.approx(hessian_error(w, np.zeros_like(w), h), rel=1e-9)
    assert report.rows == 64 and 0 <= report.rows_plain < 64 and report.fallback is None
    assert report.damp == 0.03
    assert report.ratio == pytest.approx(report.error / report.plain_error)
    assert report.gain_db == pytest.approx(-10 * np.log10(report.ratio))
    assert report.output_snr_db == pytest.approx(10 * np.log10(report.signal / report.error))


def test_hessian_error_is_the_trace() -> None:
    rng = np.random.default_rng(7)
    w = rng.normal(size=(5, 300)).astype(np.float32)
    w_hat = w + rng.normal(0, 0.1, w.shape)
    h = moments(inputs(300, 400, 8))
    e = w.astype(np.float64) - w_hat
    assert hessian_error(w, w_hat, h) == pytest.approx(np.trace(e @ h @ e.T), rel=1e-10)


# ---------------------------------------------------------------------------- quality


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_identity_h_is_no_worse_than_the_plain_encoder(bits: int) -> None:
    w = weights(96, 256, 9)
    h = np.eye(256)
    report = HessianReport()
    w_hat = decoded(*encode_hessian(w, h, bits, report=report), bits, w.shape)
    err, base = hessian_error(w, w_hat, h), hessian_error(w, plain(w, bits), h)
    assert err <= base, f"Q{bits} H = I: error ratio {err / base:.4f} against the plain encoder"
    assert report.error == pytest.approx(err)


@pytest.mark.parametrize(("bits", "most"), [(4, 0.6), (2, 0.4)])
def test_correlated_inputs_lower_the_held_out_output_error(bits: int, most: float) -> None:
    rows, cols = 128, 256
    w = weights(rows, cols, 10)
    h = moments(inputs(cols, 8192, 11))
    x_test = inputs(cols, 8192, 11, draw=1)  # held out: the same distribution, other samples
    base = held_out_error(w, plain(w, bits), x_test)
    imat = held_out_error(
        w, decoded(*quant.encode(w, bits, importance=np.diag(h)), bits, w.shape), x_test
    )
    got = {}
    for name, kw in {
        "defaults": {},
        "no act-order": {"act_order": False},
        "no refit": {"refit": False},
        "descent 2": {"descent": 2},
        "one start": {"starts": (1.0,)},
        "plain GPTQ": {"act_order": False, "refit": False, "descent": 0, "starts": (1.0,)},
    }.items():
        w_hat = decoded(*encode_hessian(w, h, bits, **kw), bits, w.shape)
        got[name] = held_out_error(w, w_hat, x_test) / base
    ratios = ", ".join(f"{k} {v:.3f}" for k, v in got.items())
    msg = f"Q{bits} held-out output error / plain: {ratios}; importance matrix {imat / base:.3f}"
    assert all(r <= 1.0 for r in got.values()), msg
    assert got["defaults"] <= most, msg
    assert got["defaults"] <= got["plain GPTQ"], msg
    assert got["defaults"] < imat / base, msg


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_groups_straddling_rows(bits: int) -> None:
    w = weights(130, 100, 12)  # 100 columns: groups of 64 run across rows
    h = moments(inputs(100, 4096, 13))
    report = HessianReport()
    w_hat = decoded(*encode_hessian(w, h, bits, descent=1, report=report), bits, w.shape)
    base = hessian_error(w, plain(w, bits), h)
    assert hessian_error(w, w_hat, h) == pytest.approx(report.error)
    assert report.error < base, f"Q{bits}: ratio {report.error / base:.3f}"


def test_every_start_is_a_candidate_row_by_row() -> None:
    """More starts never make a row worse on ``H`` than its plain encoding, and the
    defaults' error is at most that of the best single start of theirs run first."""
    w = weights(128, 256, 31)
    h = moments(inputs(256, 4096, 32))
    for bits in SUPPORTED_BITS:
        rep, first = HessianReport(), HessianReport()
        encode_hessian(w, h, bits, report=rep)
        encode_hessian(w, h, bits, starts=quant.SCALE_STARTS[:1], report=first)
        assert rep.error <= first.error <= rep.plain_error, (bits, rep.error, first.error)


def test_deterministic() -> None:
    w = weights(128, 192, 14)
    h = moments(inputs(192, 2048, 15))
    for bits in SUPPORTED_BITS:
        first = encode_hessian(w, h, bits)
        again = encode_hessian(w.copy(order="F"), np.array(h, order="F"), bits)
        assert bytes(first[0]) == bytes(again[0]) and bytes(first[1]) == bytes(again[1])


def test_float32_h_and_float16_w_are_read_as_their_values() -> None:
    w = weights(64, 128, 16)
    h = moments(inputs(128, 1024, 17))
    ref = encode_hessian(w, h, 4)
    assert all(
        bytes(a) == bytes(b) for a, b in zip(ref, encode_hessian(w.astype(np.float64), h, 4))
    )
    p, s = encode_hessian(w, h.astype(np.float32), 4)
    assert hessian_error(w, decoded(p, s, 4, w.shape), h) <= hessian_error(w, plain(w, 4), h)


# ---------------------------------------------------------------------------- degenerate h


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_zero_h_gives_the_plain_encoding(bits: int) -> None:
    w = weights(64, 128, 18)
    report = HessianReport()
    packed, scales = encode_hessian(w, np.zeros((128, 128)), bits, report=report)
    ref = quant.encode(w, bits)
    assert bytes(packed) == bytes(ref[0]) and bytes(scales) == bytes(ref[1])
    assert report.fallback == "h is zero: no calibration input reached this matrix"
    assert report.rows_plain == 64 and report.error == report.plain_error == 0.0


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_rank_deficient_h_and_dead_inputs(bits: int) -> None:
    w = weights(64, 256, 19)
    x = inputs(256, 4096, 20)
    few = moments(x[:40])  # 40 samples of 256 channels: rank 40
    x[:, 10:30] = 0  # 20 inputs no token used
    x[:, 40] = x[:, 41]  # two identical channels
    for h in (few, moments(x)):
        report = HessianReport()
        packed, scales = encode_hessian(w, h, bits, report=report)
        w_hat = decoded(packed, scales, bits, w.shape)
        assert np.isfinite(w_hat).all() and report.fallback is None
        assert report.error <= report.plain_error
        assert report.error == pytest.approx(hessian_error(w, w_hat, h))
    dead = w_hat[:, 10:30]  # kept, not zeroed: rounded to the nearest level
    assert np.abs(dead - w[:, 10:30]).max() < np.abs(w).max()
    assert np.corrcoef(dead.ravel(), w[:, 10:30].ravel())[0, 1] > 0.7


def test_an_h_no_dampening_rescues_falls_back() -> None:
    h = np.eye(64)
    h[0, 1] = h[1, 0] = 1e6  # indefinite, far beyond any dampening
    w = weights(4, 64, 21)
    report = HessianReport()
    packed, scales = encode_hessian(w, h, 4, report=report)
    ref = quant.encode(w, 4)
    assert bytes(packed) == bytes(ref[0]) and bytes(scales) == bytes(ref[1])
    assert report.fallback == (
        "h is not positive semi-definite: its factorisation failed at every dampening up to 300"
    )
    assert report.rows_plain == 4


def test_the_fallback_is_told_without_encoding() -> None:
    """``hessian_fallback`` says what the encoder's report says (a resumed calibration
    counts its kept tensors' fallbacks by it, issue 31)."""
    indefinite = np.eye(64)
    indefinite[0, 1] = indefinite[1, 0] = 1e6
    w = weights(4, 64, 24)
    for h in (np.zeros((64, 64)), indefinite, np.eye(64), moments(inputs(64, 16, 25))):
        report = HessianReport()
        encode_hessian(w, h, 2, report=report)
        assert quant.hessian_fallback(h) == report.fallback
    assert quant.hessian_fallback(indefinite) is not None


def test_zero_damp_on_a_singular_h_retries_with_dampening() -> None:
    w = weights(64, 128, 22)
    h = moments(inputs(128, 16, 23))  # rank 16
    report = HessianReport()
    encode_hessian(w, h, 2, damp=0.0, report=report)
    assert report.fallback is None and report.damp > 0
    assert report.error <= report.plain_error


# ---------------------------------------------------------------------------- memory


def test_the_factor_is_one_cols_x_cols_array() -> None:
    cols = 1024
    w = weights(64, cols, 24)
    h = moments(inputs(cols, 2048, 25))
    encode_hessian(w, h, 4)  # warm up (the plain encoder compiles or loads its kernels once)
    tracemalloc.start()
    try:
        encode_hessian(w, h, 4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    square = cols * cols * 8  # 8 MiB
    assert peak < square + 6 * (1 << 20), f"peak {peak / 2**20:.1f} MiB for an 8 MiB factor"


# ---------------------------------------------------------------------------- refusals


def test_bad_arguments_are_refused_word_for_word() -> None:
    w = weights(4, 64, 26)
    h = np.eye(64)
    cases = [
        ((w.ravel(), h, 4), "w must be a 2-D numpy array [rows, cols], got shape (256,)"),
        (([[1.0]], h, 4), "w must be a 2-D numpy array [rows, cols], got list"),
        ((w.astype(np.int32), h, 4), "w must be a float array, got int32"),
        (
            (w.view(np.uint16)[:, :64], h, 4),
            "w must be a float array, got uint16 (bfloat16 bits: widen them with bf16_to_f32)",
        ),
        ((w, np.eye(32), 4), "h must have shape (64, 64) for w's 64 columns, got (32, 32)"),
        ((w, np.eye(64, dtype=np.int64), 4), "h must be a float array, got int64"),
        ((w, h.tolist(), 4), "h must be a numpy array, got list"),
        ((w, h, 3), "bits must be one of (2, 4), got 3"),
    ]
    for args, message in cases:
        with pytest.raises(UsageError) as e:
            encode_hessian(*args)
        assert str(e.value) == message
    for kw, message in [
        ({"damp": -0.1}, "damp must be a finite number >= 0, got -0.1"),
        ({"damp": float("nan")}, "damp must be a finite number >= 0, got nan"),
        ({"descent": -1}, "descent must be an integer >= 0, got -1"),
        ({"starts": ()}, "starts must be a non-empty sequence of numbers > 0, got ()"),
        ({"starts": (1.0, 0)}, "starts must be a non-empty sequence of numbers > 0, got (1.0, 0)"),
        ({"starts": "1"}, "starts must be a non-empty sequence of numbers > 0, got '1'"),
        (
            {"starts": [float("inf")]},
            "starts must be a non-empty sequence of numbers > 0, got [inf]",
        ),
        ({"overflow": "wrap"}, "overflow must be 'clip' or 'raise', got 'wrap'"),
    ]:
        with pytest.raises(UsageError) as e:
            encode_hessian(w, h, 4, **kw)
        assert str(e.value) == message


def test_bad_buffers_are_refused_word_for_word() -> None:
    w = weights(4, 64, 27)
    h = np.eye(64)
    good_p, good_s = np.empty(128, np.uint8), np.empty(4, np.float16)
    for packed, scales, message in [
        (np.empty(127, np.uint8), good_s, "packed_out has 127 elements, need 128"),
        (good_p, np.empty(7, np.uint8), "scales_out has 7 bytes, need 8"),
        (
            good_p,
            np.empty(4, np.float32),
            "scales_out must be float16 (or uint8 bytes), got float32",
        ),
        (good_p, np.empty(8, np.float16)[::2], "scales_out must be writable and C-contiguous"),
        (bytearray(128), good_s, "packed_out must be a numpy array, got bytearray"),
    ]:
        with pytest.raises(UsageError) as e:
            encode_hessian_into(w, h, 4, packed, scales)  # type: ignore[arg-type]
        assert str(e.value) == message


def test_bad_h_values_are_refused_word_for_word() -> None:
    w = weights(4, 64, 28)
    nan = np.eye(64)
    nan[3, 5] = np.nan
    skew = np.eye(64)
    skew[2, 7] = 0.5
    neg = np.eye(64)
    neg[9, 9] = -1.0
    for h, message in [
        (nan, "h is not finite: h[3, 5] = nan"),
        (skew, "h is not symmetric: h[2, 7] = 0.5 but h[7, 2] = 0.0"),
        (neg, "h must be second moments (positive semi-definite): h[9, 9] = -1.0"),
    ]:
        with pytest.raises(RefusedInput) as e:
            encode_hessian(w, h, 4)
        assert str(e.value) == message


def test_weights_the_format_cannot_hold_are_refused_as_the_encoder_refuses_them() -> None:
    w = weights(4, 64, 29)
    w[1, 2] = np.inf
    with pytest.raises(quant.NonFiniteWeights) as e:
        encode_hessian(w, np.eye(64), 4)
    assert (
        str(e.value)
        == "1 weight is inf or nan (inf) at row 1 col 2; the format stores finite values only"
    )
    w[1, 2] = 7e4
    with pytest.raises(quant.ScaleOverflow):
        encode_hessian(w, np.eye(64), 4, overflow="raise")
    report = HessianReport()
    packed, scales = encode_hessian(w, np.eye(64), 4, report=report)  # clipped scales
    assert float(scales.max()) <= 65504.0 and report.error <= report.plain_error
    assert np.isfinite(decoded(packed, scales, 4, w.shape)).all()


def test_hessian_error_refuses_bad_shapes() -> None:
    w = weights(4, 64, 30)
    with pytest.raises(UsageError) as e:
        hessian_error(w, w[:2], np.eye(64))
    assert str(e.value) == "w_hat must be a real array of w's shape (4, 64), got (2, 64)"
    with pytest.raises(UsageError) as e:
        hessian_error(w, w, np.eye(63))
    assert str(e.value) == "h must have shape (64, 64) for w's 64 columns, got (63, 63)"
