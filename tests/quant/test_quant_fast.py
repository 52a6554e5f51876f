"""The compiled encoder (smoe.quant.kernels.encode) gives the numpy reference's bytes, errors and
SNR.

Every comparison encodes the same input twice, ``kernel="fast"`` against ``kernel="numpy"``:
the committed fixtures (regenerated with the compiled encoder), their weights at both widths
and scales, and random tensors with partial groups, zeros, subnormals, huge and tiny
groups, every source dtype, refusals (NaN/Inf, |w| > 65504) and Q2 optima above 65504;
each also with per-column importance (outlier channels, zero channels and zero blocks).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smoe import quant
from smoe.errors import SmoeError
from smoe.quant import dispatch
from smoe_gen.layout import GROUP_SIZE, SUPPORTED_BITS

pytest.importorskip("numba", reason="the compiled encoder is optional: pip install 'smoe[fast]'")

from smoe.quant.kernels import encode as quant_kernels  # (needs numba)

from fixtures_data import FIXTURES
from helpers import plain_env, run

MODES = ("optimal", "absmax")
WIDTHS_AND_MODES = [(b, m) for b in SUPPORTED_BITS for m in MODES]


def encode_both(w: np.ndarray, bits: int, mode: str, **kw) -> tuple:
    """(packed, scales, stats) of the compiled and of the reference encoder."""
    out = []
    for kernel in ("fast", "numpy"):
        n = w.size
        packed = np.empty(quant.packed_size(n, bits), np.uint8)
        scales = np.empty(quant.num_groups(n), "<f2")
        stats = quant.QuantStats()
        quant.encode_into(w, bits, packed, scales, mode, stats=stats, kernel=kernel, **kw)
        out.append((packed, scales, stats))
    return out[0], out[1]


def assert_same(w: np.ndarray, bits: int, mode: str, **kw) -> None:
    (p1, s1, st1), (p2, s2, st2) = encode_both(w, bits, mode, **kw)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(s1.view(np.uint16), s2.view(np.uint16))  # also -0 vs 0
    assert st1.n == st2.n
    if np.isfinite(st2.snr_db):  # the same but for float32 rounding in the sums, mostly
        # the reference's (BLAS dot products over a whole chunk): 2e-5 dB per dB, at least 1
        assert abs(st1.snr_db - st2.snr_db) <= 2e-5 * max(1.0, abs(st2.snr_db))
    else:
        assert st1.snr_db == st2.snr_db
    assert st1.weighted_n == st2.weighted_n
    a, b = st1.weighted_snr_db, st2.weighted_snr_db
    assert (a is None) == (b is None)
    if b is not None:
        assert abs(a - b) <= 2e-5 * max(1.0, abs(b))


def importance(cols: int, kind: str, seed: int) -> np.ndarray:
    """Per-column importance: lognormal with 1 % outliers at 100x, plus ``kind``'s quirks."""
    rng = np.random.default_rng(seed)
    imp = rng.lognormal(0, 1, cols) * np.where(rng.random(cols) < 0.01, 100.0, 1.0)
    if kind == "zeros":  # a quarter of the channels never seen
        imp[rng.random(cols) < 0.25] = 0
    elif kind == "block":  # a whole group's worth of zero channels
        imp[: min(cols, GROUP_SIZE + 7)] = 0
    elif kind == "steps":  # few distinct values: ties in the Q2 keys
        imp = np.floor(imp).clip(0, 3)
    elif kind == "one":  # a single channel carries all of it
        imp = np.zeros(cols)
        imp[rng.integers(cols)] = 5.0
    elif kind == "wide":  # 60 orders of magnitude
        imp = 10.0 ** rng.uniform(-40, 20, cols)
    return imp


IMPORTANCE_KINDS = ["lognormal", "zeros", "block", "steps", "one", "wide"]


def weights(n: int, kinds: list[str], seed: int) -> np.ndarray:
    """``n`` float32 weights whose groups follow ``kinds`` (cycled)."""
    rng = np.random.default_rng(seed)
    out = np.empty(n, np.float64)
    for gi, start in enumerate(range(0, n, GROUP_SIZE)):
        m = min(GROUP_SIZE, n - start)
        kind = kinds[gi % len(kinds)]
        if kind == "zero":
            v = np.zeros(m)
        elif kind == "negzero":
            v = np.full(m, -0.0)
        elif kind == "const":
            v = np.full(m, rng.choice([-1, 1]) * 10.0 ** rng.uniform(-7, 4))
        elif kind == "subnormal":  # fp16-subnormal scales, and float32 subnormals
            v = rng.normal(0, 1, m) * 10.0 ** rng.uniform(-44, -5)
        elif kind == "outlier":
            v = rng.normal(0, 0.02, m)
            v[rng.integers(m)] = rng.choice([-1, 1]) * 0.02 * rng.uniform(8, 10)
        elif kind == "edge":  # around the largest representable magnitude
            v = rng.choice([-1, 1], m) * rng.choice([65504.0, 65519.0, 65520.0, 6e4, 1.0], m)
        elif kind == "sparse":
            v = rng.normal(0, 1, m) * (rng.random(m) < 0.1)
        else:
            v = rng.normal(0, 1, m) * float(kind)
        out[start : start + m] = v
    return out.astype(np.float32)


KINDS = st.lists(
    st.sampled_from(
        [
            "0.02",
            "1",
            "1e-3",
            "1e4",
            "outlier",
            "zero",
            "negzero",
            "const",
            "subnormal",
            "edge",
            "sparse",
        ]
    ),
    min_size=1,
    max_size=6,
)


# ---------------------------------------------------------------------------- the switch


def test_kernels_are_used_here() -> None:
    """Every width and scale runs compiled here, so the comparisons below compare."""
    assert quant_kernels.einsum_order_holds()
    for bits, mode in WIDTHS_AND_MODES:
        assert quant.fast_kernels(bits, mode, 1, "fast") is quant_kernels
        assert quant.fast_kernels(bits, mode, 1, "numpy") is None
        assert quant.fast_kernels(bits, mode, quant.FAST_MIN_WEIGHTS - 1, "auto") is None
        assert quant.fast_kernels(bits, mode, quant.FAST_MIN_WEIGHTS, "auto") is quant_kernels


def test_environment_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(quant.KERNEL_ENV, "numpy")
    assert quant.fast_kernels(4, "optimal", 1 << 30) is None
    monkeypatch.setenv(quant.KERNEL_ENV, "fast")
    assert quant.fast_kernels(4, "optimal", 1) is quant_kernels
    assert quant.fast_kernels(4, "optimal", 1, kernel="numpy") is None  # the argument wins
    monkeypatch.setenv(quant.KERNEL_ENV, "turbo")
    with pytest.raises(SmoeError, match="SMOE_KERNEL must be auto, numpy or fast"):
        quant.fast_kernels(4, "optimal", 1)


def test_without_numba_auto_falls_back_and_fast_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(dispatch._FAST, "module", None)  # as if importing the kernels failed
    w = weights(1 << 17, ["0.02"], 0)
    assert quant.fast_kernels(4, "optimal", w.size, "auto") is None
    assert not quant.prepare_fast(4)
    np.testing.assert_array_equal(quant.encode(w, 4)[0], quant.encode(w, 4, kernel="numpy")[0])
    with pytest.raises(SmoeError, match="needs numba"):
        quant.encode(w, 4, kernel="fast")


def test_prepare_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    for bits, mode in WIDTHS_AND_MODES:
        assert quant.prepare_fast(bits, mode)
    monkeypatch.setenv(quant.KERNEL_ENV, "numpy")
    assert not quant.prepare_fast(4)


# ---------------------------------------------------------------------------- fixtures


def test_fixtures_regenerate_identically_with_the_compiled_encoder(tmp_path: Path) -> None:
    env = plain_env(**{quant.KERNEL_ENV: "fast"})
    proc = run(FIXTURES / "generate.py", tmp_path, command=[sys.executable], env=env)
    assert proc.returncode == 0, proc.stderr
    vaults = sorted(tmp_path.glob("*.smoe"))
    assert vaults
    for path in vaults:
        assert path.read_bytes() == (FIXTURES / path.name).read_bytes(), path.name


@functools.cache
def fixture_tensors() -> list[tuple[str, np.ndarray]]:
    """Every weight matrix of the committed fixtures, from fixtures/generate.py."""
    spec = importlib.util.spec_from_file_location("fixture_generate", FIXTURES / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen  # its dataclasses look their module up
    spec.loader.exec_module(gen)
    return [
        (f"{s.name} {key} {t}", w)
        for s in gen.specs()
        for key, mats in sorted(s.experts().items())
        for t, w in enumerate(mats)
    ]


@pytest.mark.parametrize(("bits", "mode"), WIDTHS_AND_MODES)
def test_fixture_weights_at_every_width_and_scale(bits: int, mode: str) -> None:
    for i, (_name, w) in enumerate(fixture_tensors()):
        assert_same(w, bits, mode)
        bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)
        assert_same(bf16, bits, mode, src_dtype="bf16")
        imp = importance(w.shape[-1], IMPORTANCE_KINDS[i % len(IMPORTANCE_KINDS)], i)
        assert_same(w, bits, mode, importance=imp)
        assert_same(bf16, bits, mode, src_dtype="bf16", importance=imp)


# ---------------------------------------------------------------------------- random


@settings(max_examples=150, deadline=None)
@given(
    n=st.one_of(st.integers(1, 300), st.integers(4000, 9000)),
    kinds=KINDS,
    seed=st.integers(0, 2**32 - 1),
    bits=st.sampled_from(SUPPORTED_BITS),
    mode=st.sampled_from(MODES),
    src=st.sampled_from(["f32", "bf16", "f16", "f64"]),
    chunk=st.sampled_from([GROUP_SIZE, GROUP_SIZE * 3, GROUP_SIZE * 64, 1 << 18]),
    imp=st.sampled_from([None, *IMPORTANCE_KINDS]),
    cols=st.sampled_from([1, 37, GROUP_SIZE, 200, 4096]),
)
def test_random_tensors(n, kinds, seed, bits, mode, src, chunk, imp, cols) -> None:
    w = weights(n, kinds, seed)
    kw: dict = {"chunk_weights": chunk}
    if imp is not None:  # rows of ``cols`` (or one row), the importance per column
        cols = cols if n % cols == 0 else n
        w = w.reshape(-1, cols)
        kw["importance"] = importance(cols, imp, seed)
    if src == "bf16":
        w, kw["src_dtype"] = (w.view(np.uint32) >> 16).astype(np.uint16), "bf16"
    elif src == "f16":
        with np.errstate(over="ignore"):
            w = w.astype(np.float16)
        w[~np.isfinite(w)] = 0
    elif src == "f64":
        w = w.astype(np.float64)
    assert_same(w, bits, mode, **kw)


@pytest.mark.parametrize(("bits", "mode"), WIDTHS_AND_MODES)
@pytest.mark.parametrize("weighted", [False, True])
def test_large_realistic_tensor_and_layouts(bits: int, mode: str, weighted: bool) -> None:
    """Many tiles, a partial tile and group; C order, Fortran order, a strided view; with
    importance also float32 weights whose tiles are partly bfloat16 values (Q2's two
    sorts) and rows that do not start at a group (unaligned importance runs)."""
    w = weights(300 * 1000 + 37, ["0.02", "outlier", "0.02", "1e-3", "zero"], 3)
    imp = (
        (lambda cols: {"importance": importance(cols, "zeros", cols)})
        if weighted
        else (lambda cols: {})
    )
    assert_same(w, bits, mode, **imp(w.size))
    m = w[: 600 * 500].reshape(600, 500)
    if weighted:
        for part in (m[:120], m[::7]):  # whole tiles of bfloat16 values, and mixed ones
            part[...] = (part.view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert_same(np.asfortranarray(m), bits, mode, **imp(500))
    assert_same(m[:, ::2], bits, mode, **imp(250))
    bf16 = (m.view(np.uint32) >> 16).astype(np.uint16)
    assert_same(bf16[::3], bits, mode, src_dtype="bf16", **imp(500))
    unaligned = np.frombuffer(b"\0" + bf16.tobytes(), np.uint16, offset=1)
    assert not unaligned.flags.aligned
    assert_same(unaligned, bits, mode, src_dtype="bf16", **imp(unaligned.size))
    if weighted:
        assert_same(w[: 4099 * 61].reshape(4099, 61), bits, mode, **imp(61))


@pytest.mark.parametrize(("bits", "mode"), WIDTHS_AND_MODES)
def test_huge_weights_when_clipping(bits: int, mode: str) -> None:
    """|w| far above 65504 with overflow="clip" (Q2: optima above 65504 take the
    reference's clipped path), and float32 sums of squares that overflow."""
    w = weights(64 * 300 + 5, ["1e5", "0.02", "1e30", "edge", "1e37"], 9)
    w[7] = np.float32(3.4e38)
    assert_same(w, bits, mode, overflow="clip")
    for kind in IMPORTANCE_KINDS:
        assert_same(w, bits, mode, overflow="clip", importance=importance(w.size, kind, 9))


# ---------------------------------------------------------------------------- refusals


def refusal(w: np.ndarray, bits: int, mode: str, kernel: str, **kw) -> quant.UnrepresentableWeights:
    n = w.size
    with pytest.raises(quant.UnrepresentableWeights) as info:
        quant.encode_into(
            w,
            bits,
            np.empty(quant.packed_size(n, bits), np.uint8),
            np.empty(quant.num_groups(n), "<f2"),
            mode,
            kernel=kernel,
            **kw,
        )
    return info.value


@pytest.mark.parametrize(("bits", "mode"), WIDTHS_AND_MODES)
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "big", "mixed"])
@pytest.mark.parametrize("where", [5, 64 * 70 + 3, 64 * 300 - 1, 64 * 300 + 2])
def test_refusals_are_the_same(bits: int, mode: str, bad: str, where: int) -> None:
    w = weights(64 * 300 + 3, ["0.02", "outlier"], 1).reshape(-1, 1)
    if bad == "big":
        w[where] = -1e6
        w[where // 2] = 70000.0
    elif bad == "mixed":
        w[where // 3] = 1e6
        w[where] = np.nan
    else:
        w[where] = float(bad)
    for src in ("f32", "bf16", "f32 weighted"):
        x, kw = (
            (w, {})
            if src == "f32"
            else ((w.view(np.uint32) >> 16).astype(np.uint16), {"src_dtype": "bf16"})
        )
        if src == "f32 weighted":  # rows of 3 columns, of importance 1, 0 and 20
            x, kw = w.reshape(-1, 3), {"importance": np.array([1.0, 0.0, 20.0])}
        for overflow in ("raise", "clip"):
            if bad == "big" and overflow == "clip":
                continue
            fast = refusal(x, bits, mode, "fast", overflow=overflow, chunk_weights=64 * 32, **kw)
            ref = refusal(x, bits, mode, "numpy", overflow=overflow, chunk_weights=64 * 32, **kw)
            assert type(fast) is type(ref)
            assert str(fast) == str(ref)
            assert (fast.count, fast.groups, fast.position, fast.bits) == (
                ref.count,
                ref.groups,
                ref.position,
                ref.bits,
            )
            assert fast.value == ref.value or (np.isnan(fast.value) and np.isnan(ref.value))


# ---------------------------------------------------------------------------- kernels


def test_sorting_network_sorts() -> None:
    """Every comparator network input of 0s and 1s with up to two runs, and random keys."""
    pairs = quant_kernels._sort_network(GROUP_SIZE)
    rng = np.random.default_rng(0)
    cases = [rng.integers(0, 1 << 31, (2000, GROUP_SIZE)), rng.integers(0, 3, (2000, GROUP_SIZE))]
    cases.append(
        np.array(
            [
                [int(i <= j < k) for j in range(GROUP_SIZE)]
                for i in range(GROUP_SIZE)
                for k in range(i, GROUP_SIZE + 1)
            ]
        )
    )
    for keys in cases:
        a = keys.copy()
        for i, j in pairs:
            lo, hi = np.minimum(a[:, i], a[:, j]), np.maximum(a[:, i], a[:, j])
            a[:, i], a[:, j] = lo, hi
        np.testing.assert_array_equal(a, np.sort(keys, axis=1))


def test_memory_stays_bounded() -> None:
    """The compiled path allocates O(chunk) too (after its first, compiling call)."""
    import tracemalloc

    n = 1 << 21
    w = np.random.default_rng(0).normal(0, 0.02, n).astype(np.float32)
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)
    chunk = 1 << 15
    imp = importance(4096, "lognormal", 0)  # with importance: its columns on top
    cases = [
        (w, {}),
        (bf16, {"src_dtype": "bf16"}),
        (w.reshape(-1, 4096), {"importance": imp}),
        (bf16.reshape(-1, 4096), {"src_dtype": "bf16", "importance": imp}),
    ]
    for bits, mode in WIDTHS_AND_MODES:
        packed = np.empty(quant.packed_size(n, bits), np.uint8)
        scales = np.empty(quant.num_groups(n), "<f2")
        for x, kw in cases:
            first = {**kw, "importance": None if "importance" not in kw else imp[: GROUP_SIZE * 4]}
            quant.encode_into(
                x.reshape(-1)[: GROUP_SIZE * 4],
                bits,
                packed[: GROUP_SIZE * bits // 2],
                scales[:4],
                mode,
                kernel="fast",
                **first,
            )  # compile or load first
            tracemalloc.start()
            quant.encode_into(
                x, bits, packed, scales, mode, chunk_weights=chunk, kernel="fast", **kw
            )
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert peak < 8 * chunk * 4, (bits, mode, peak)
