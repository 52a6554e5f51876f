"""Importance-weighted quantisation (``quant.encode(..., importance=...)``).

Uniform importance gives today's bytes; Q2 finds the exact weighted optimum (checked against
a brute force over every split); Q4 gets near a dense search of the weighted error; groups
whose weighted signal is 0 keep their plain scale; the weighted SNR statistic is what a
decode gives; bad importance is refused. Both encoders where numba is installed (the
byte-for-byte comparison of the two is in test_quant_fast.py).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from smoe import quant
from smoe.quant.importance import prepare_importance
from smoe_gen.layout import GROUP_SIZE, SUPPORTED_BITS

KERNELS = ["numpy"] + (["fast"] if importlib.util.find_spec("numba") else [])


def heavy(rows: int, cols: int, seed: int) -> np.ndarray:
    """Student-t(4) weights, scale 0.02."""
    return (np.random.default_rng(seed).standard_t(4, (rows, cols)) * 0.02).astype(np.float32)


def channel_importance(cols: int, seed: int) -> np.ndarray:
    """Lognormal channel mean squares with 1 % outlier channels at 100x."""
    rng = np.random.default_rng(seed)
    return rng.lognormal(0, 1, cols) * np.where(rng.random(cols) < 0.01, 100.0, 1.0)


def prepared(imp: np.ndarray) -> np.ndarray:
    """The importance as the encoders use it (max 1, bfloat16 precision), float64."""
    prepared = prepare_importance(imp, (1, imp.size))
    assert prepared is not None
    return prepared[0].astype(np.float64)


def decoded(w: np.ndarray, bits: int, **kw) -> np.ndarray:
    packed, scales = quant.encode(w, bits, **kw)
    return quant.decode(packed, scales, bits, w.shape)


def weighted_error(w: np.ndarray, w_hat: np.ndarray, h: np.ndarray) -> float:
    return float((h * np.square(w.astype(np.float64) - w_hat)).sum())


def fixture_weights() -> list[np.ndarray]:
    """A few tensors of fixture-like data: outliers, zeros, partial groups."""
    rng = np.random.default_rng(5)
    a = rng.normal(0, 0.02, (48, 200)).astype(np.float32)
    a[:, 7] *= 9
    b = np.zeros((3, 64), np.float32)
    c = heavy(33, 129, 2)
    c[5] = 0
    return [a, b, c, heavy(1, 1, 3), heavy(70, 64, 4)]


# ---------------------------------------------------------------------------- uniform


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("mode", ["optimal", "absmax"])
def test_uniform_importance_gives_the_plain_bytes(kernel: str, bits: int, mode: str) -> None:
    tensors = [*fixture_weights(), heavy(300, 448, 7), heavy(2, 1000, 8).astype(np.float16)]
    for w in tensors:
        plain = quant.encode(w, bits, mode, kernel=kernel)
        for value in (0.0, 1.0, 3.7, 1e-30, 1e30):
            same = quant.encode(
                w, bits, mode, kernel=kernel, importance=np.full(w.shape[-1], value)
            )
            np.testing.assert_array_equal(same[0], plain[0])
            np.testing.assert_array_equal(same[1].view(np.uint16), plain[1].view(np.uint16))
    # values that round to the same bfloat16 are uniform too
    w = tensors[0]
    near = 1.0 + np.arange(w.shape[-1]) * 1e-7
    np.testing.assert_array_equal(
        quant.encode(w, bits, mode, kernel=kernel, importance=near)[0],
        quant.encode(w, bits, mode, kernel=kernel)[0],
    )


# ---------------------------------------------------------------------------- quality


def q2_brute_force(g: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Per group (float64): the scale of the least weighted error over all scales (every
    split of the sorted magnitudes at its weighted least-squares scale), rounded to fp16."""
    out = np.empty(len(g))
    for i, (row, wt) in enumerate(zip(g.astype(np.float64), h)):
        a = np.abs(row)
        best, scale = np.inf, 0.0
        for thr in np.concatenate([np.unique(a), [np.inf]]):  # outer: a >= thr
            lev = np.where(a >= thr, 1.0, 1 / 3)
            den = (wt * lev * lev).sum()
            s = (wt * a * lev).sum() / den if den else 0.0
            err = (wt * np.square(a - s * lev)).sum()
            if err < best:
                best, scale = err, s
        out[i] = float(np.float16(min(scale, 65504.0)))
    return out


@pytest.mark.parametrize("kernel", KERNELS)
def test_q2_is_the_exact_weighted_optimum(kernel: str) -> None:
    rng = np.random.default_rng(0)
    w = heavy(40, 4 * GROUP_SIZE, 1)
    w[:, ::5] = np.round(w[:, ::5], 2)  # ties in |w|
    imp = channel_importance(w.shape[1], 2)
    imp[rng.random(w.shape[1]) < 0.2] = 0
    hg = np.broadcast_to(prepared(imp), w.shape).reshape(-1, GROUP_SIZE)
    scales = quant.encode(w, 2, kernel=kernel, importance=imp)[1].astype(np.float64)
    brute = q2_brute_force(w.reshape(-1, GROUP_SIZE), hg)
    assert np.mean(scales == brute) > 0.97
    # elsewhere a near tie (the split index rides in the scores' low mantissa bits)
    ours, best = (q2_error(w.reshape(-1, GROUP_SIZE), hg, s) for s in (scales, brute))
    assert (ours <= best * (1 + 1e-4)).all()


def q2_error(g: np.ndarray, h: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Per group, the weighted error of nearest Q2 codes at the scales ``s``."""
    safe = np.where(s > 0, s, 1.0)[:, None]
    v = np.clip(np.floor(g * 1.5 / safe), -2, 1) + 0.5
    return (h * np.square(g - np.where(s[:, None] > 0, v * safe / 1.5, 0))).sum(axis=1)


def dense_weighted(w: np.ndarray, h: np.ndarray, bits: int) -> np.ndarray:
    """Every group's best fp16 scale in [0.2, 1.6] x absmax for the weighted error (a dense
    search), decoded."""
    c = ((1 << bits) - 1) / 2
    g = w.reshape(-1, GROUP_SIZE).astype(np.float64)
    hg = np.broadcast_to(h, w.shape).reshape(-1, GROUP_SIZE)
    a = np.abs(g).max(axis=1)
    best = np.full(len(g), np.inf)
    out = np.zeros_like(g)
    for f in np.geomspace(0.2, 1.6, 600):
        s = np.float16(a * f).astype(np.float64)
        inv = np.where(s > 0, c / np.where(s > 0, s, 1), 0)
        rec = (np.clip(np.floor(g * inv[:, None]), -c - 0.5, c - 0.5) + 0.5) * (s / c)[:, None]
        e = (hg * np.square(g - rec)).sum(axis=1)
        better = e < best
        best[better] = e[better]
        out[better] = rec[better]
    return out.reshape(w.shape)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_weighting_lowers_the_weighted_error(kernel: str, bits: int) -> None:
    """On outlier channels: > 1.5 dB less weighted error than the plain encode, within
    0.3 dB of a dense search of the weighted error, while the plain error grows."""
    w = heavy(96, 1024, 3)
    imp = channel_importance(w.shape[1], 4)
    h = prepared(imp)
    plain = decoded(w, bits, kernel=kernel)
    ours = decoded(w, bits, kernel=kernel, importance=imp)
    gain = 10 * np.log10(weighted_error(w, plain, h) / weighted_error(w, ours, h))
    assert gain > 1.5
    dense = dense_weighted(w, h, bits)
    gap = 10 * np.log10(weighted_error(w, ours, h) / weighted_error(w, dense, h))
    assert gap < 0.3
    assert quant.snr_db(w, ours) < quant.snr_db(w, plain)  # the expected trade


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_groups_without_weighted_signal_keep_the_plain_scale(kernel: str, bits: int) -> None:
    """Zero importance over a whole group, or important weights that are all zero: the
    weighted error is the same at every scale, so the plain scale stands."""
    w = heavy(20, 3 * GROUP_SIZE, 5)
    imp = channel_importance(w.shape[1], 6)
    imp[:GROUP_SIZE] = 0  # the first group of every row: no importance
    w[:, GROUP_SIZE : GROUP_SIZE + 10] = 0  # the second: only its 10 important weights ...
    imp[GROUP_SIZE + 10 : 2 * GROUP_SIZE] = 0  # ... carry importance, and they are zero
    plain = quant.encode(w, bits, kernel=kernel)[1].reshape(20, 3)
    ours = quant.encode(w, bits, kernel=kernel, importance=imp)[1].reshape(20, 3)
    np.testing.assert_array_equal(ours[:, :2].view(np.uint16), plain[:, :2].view(np.uint16))
    assert (ours[:, 2] != plain[:, 2]).any()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_codes_are_nearest_for_the_stored_scale(kernel: str, bits: int) -> None:
    w = heavy(30, 200, 9)
    imp = channel_importance(200, 10)
    packed, scales = quant.encode(w, bits, kernel=kernel, importance=imp)
    c = ((1 << bits) - 1) / 2
    s = np.repeat(scales.astype(np.float32), GROUP_SIZE)[: w.size]
    levels = np.arange(1 << bits) - c
    cand = levels[None, :] / c * s[:, None]  # every level's value, per weight
    best = np.abs(w.reshape(-1, 1) - cand).min(axis=1)
    got = quant.decode(packed, scales, bits, w.shape).reshape(-1)
    assert (np.abs(w.reshape(-1) - got) <= best + s * 1e-6).all()


# ---------------------------------------------------------------------------- invariance


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_chunks_dtypes_and_scaling_do_not_change_results(kernel: str, bits: int) -> None:
    w = heavy(37, 150, 11)  # rows that straddle groups, a partial last group
    imp = channel_importance(150, 12)
    ref = quant.encode(w, bits, kernel=kernel, importance=imp)
    for chunk in (GROUP_SIZE, GROUP_SIZE * 5, 1 << 18):
        got = quant.encode(w, bits, kernel=kernel, importance=imp, chunk_weights=chunk)
        np.testing.assert_array_equal(got[0], ref[0])
    for factor in (1e-20, 2.0, 1e20):  # only relative importance matters (powers of two:
        got = quant.encode(w, bits, kernel=kernel, importance=imp * factor)  # exactly)
        if factor == 2.0:
            np.testing.assert_array_equal(got[0], ref[0])
        else:  # bfloat16 rounding of imp / max may move a last bit
            assert np.mean(got[0] == ref[0]) > 0.99
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)
    as_bits = quant.encode(bf16, bits, kernel=kernel, importance=imp, src_dtype="bf16")
    as_float = quant.encode(
        (bf16.astype(np.uint32) << 16).view(np.float32), bits, kernel=kernel, importance=imp
    )
    np.testing.assert_array_equal(as_bits[0], as_float[0])
    np.testing.assert_array_equal(as_bits[1], as_float[1])
    as_f16 = w.astype(np.float16)
    np.testing.assert_array_equal(
        quant.encode(as_f16, bits, kernel=kernel, importance=imp)[0],
        quant.encode(as_f16.astype(np.float32), bits, kernel=kernel, importance=imp)[0],
    )


@pytest.mark.parametrize("kernel", KERNELS)
def test_absmax_scales_ignore_importance(kernel: str) -> None:
    w = heavy(10, 300, 13)
    imp = channel_importance(300, 14)
    for bits in SUPPORTED_BITS:
        a = quant.encode(w, bits, "absmax", kernel=kernel)
        b = quant.encode(w, bits, "absmax", kernel=kernel, importance=imp)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


# ---------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_weighted_snr_statistic(kernel: str, bits: int) -> None:
    w = heavy(64, 320, 15)
    imp = channel_importance(320, 16)
    h = prepared(imp)
    stats = quant.QuantStats()
    packed = np.empty(quant.packed_size(w.size, bits), np.uint8)
    scales = np.empty(quant.num_groups(w.size), "<f2")
    quant.encode_into(w, bits, packed, scales, stats=stats, kernel=kernel, importance=imp)
    w_hat = quant.decode(packed, scales, bits, w.shape)
    expected = 10 * np.log10(
        (h * np.square(w.astype(np.float64))).sum() / weighted_error(w, w_hat, h)
    )
    assert stats.weighted_snr_db == pytest.approx(expected, abs=1e-3)
    assert stats.weighted_n == w.size
    assert stats.snr_db == pytest.approx(quant.snr_db(w, w_hat), abs=1e-3)
    plain = quant.QuantStats()
    quant.encode_into(w, bits, packed, scales, stats=plain, kernel=kernel)
    assert plain.weighted_snr_db is None and plain.weighted_n == 0
    uniform = quant.QuantStats()  # uniform importance: the plain encode, no weighted figure
    quant.encode_into(
        w, bits, packed, scales, stats=uniform, kernel=kernel, importance=np.ones(320)
    )
    assert uniform.weighted_snr_db is None


@pytest.mark.parametrize("kernel", KERNELS)
def test_weighted_statistics_sum_over_tensors_in_the_callers_units(kernel: str) -> None:
    """One QuantStats over two tensors whose importance differs 1000-fold: the powers add
    in the given units (each encode normalises its importance internally)."""
    ws = [heavy(16, 128, 20), heavy(16, 128, 21)]
    imps = [channel_importance(128, 22), channel_importance(128, 23) * 1000]
    both = quant.QuantStats()
    sig = err = 0.0
    for w, imp in zip(ws, imps):
        packed = np.empty(quant.packed_size(w.size, 4), np.uint8)
        scales = np.empty(quant.num_groups(w.size), "<f2")
        quant.encode_into(w, 4, packed, scales, stats=both, kernel=kernel, importance=imp)
        h = prepared(imp) * imp.max()
        sig += float((h * np.square(w.astype(np.float64))).sum())
        err += weighted_error(w, quant.decode(packed, scales, 4, w.shape), h)
    assert both.wsums == pytest.approx([sig, err], rel=1e-4)
    assert both.weighted_snr_db == pytest.approx(10 * np.log10(sig / err), abs=1e-3)


def test_weighted_snr_is_none_without_error_or_signal() -> None:
    stats = quant.QuantStats()
    stats.add_sums(10, np.array([0.0, 1.0, 0.0, 0.0, 1.0, 0.0]))
    assert stats.weighted_snr_db is None  # exact
    stats.add_sums(10, np.array([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]))
    assert stats.weighted_snr_db == pytest.approx(0.0)
    zero = quant.QuantStats()
    zero.add_sums(4, np.zeros(6))
    assert zero.weighted_snr_db is None


# ---------------------------------------------------------------------------- refusals


def test_bad_importance_is_refused() -> None:
    w = heavy(4, 100, 17)
    with pytest.raises(ValueError, match=r"one value per column \(100,\), got shape \(99,\)"):
        quant.encode(w, 4, importance=np.ones(99))
    with pytest.raises(ValueError, match=r"got shape \(4, 100\)"):
        quant.encode(w, 4, importance=np.ones((4, 100)))
    for bad, text in ((-1.0, "-1.0"), (np.nan, "nan"), (np.inf, "inf")):
        imp = np.ones(100)
        imp[42] = bad
        with pytest.raises(ValueError, match=f"finite and >= 0: column 42 holds {text}"):
            quant.encode(w, 2, importance=imp)
    with pytest.raises(TypeError, match="real numbers"):
        quant.encode(w, 2, importance=np.array(["a"] * 100))


def test_one_dimensional_weights_take_importance_per_weight() -> None:
    w = heavy(1, 4 * GROUP_SIZE + 3, 18).reshape(-1)
    imp = channel_importance(w.size, 19)
    a = quant.encode(w, 2, importance=imp, kernel="numpy")
    b = quant.encode(w.reshape(1, -1), 2, importance=imp, kernel="numpy")
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[1], quant.encode(w, 2, kernel="numpy")[1])
