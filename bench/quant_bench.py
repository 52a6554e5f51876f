"""Benchmark of :mod:`smoe.quant` against the reference Sculptor encoders (ruling D2).

The reference encoders live only here: plain absmax for SMOE-Q4 and the 64-candidate grid
search (``linspace(0.1, 1.0, 64) * absmax``, minimum squared error) for SMOE-Q2. The grid
rounds every candidate to fp16 before scoring it, which makes it a slightly stronger
baseline than scoring unrounded scales. The Q4 "bound" is a dense search: every fp16 value
in ``[0.5, 1.5] * absmax`` is tried for every group and the best kept.

Data: seeded ``[1536, 4096]`` float32 tensors, "realistic" (``normal(0, 0.02)`` with four
8-10x outliers per row) and "plain" (``normal(0, 0.02)``). The dense bound (and in quick
mode the quality figures) use fewer rows; figure names say so. Throughput is the best of a
few runs, one process, weights already in memory.

Per-core encode rate (issue 13): the realistic tensor as bfloat16 bits, encoded as sculpt
does (``encode_into`` with SNR statistics, caller buffers) by the compiled encoder
(``kernel="fast"``, :mod:`smoe.quant.kernels.encode`) against the numpy encoder (``kernel="numpy"``)
in the same run, in MB/s of bf16 input per CPU second of the process (the best of several
runs: per core, and unmoved by other processes taking turns on the machine's cores); then
the two encoders compared byte for byte, and the compiled encoder's first-call cost
(compiling into an empty cache, and loading from the cache) in fresh processes.

First run (issue 25, :func:`first_run_figures`): ``smoe sculpt`` of a 50 MB checkpoint in
fresh processes, the kernel cache empty (compiling) against filled, and the small-job rule's
choice on an empty cache held against what was sooner, numpy or compiling.

Run ``python -m bench.quant_bench [--quick]``; :func:`run` returns the figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np

from bench.figures import figure
from smoe import quant
from smoe.quant import Kernel, ScaleMode
from smoe_gen.layout import GROUP_SIZE

SIGMA = 0.02

T = TypeVar("T")


# ---------------------------------------------------------------------------- data


def realistic_weights(rows: int = 1536, cols: int = 4096, seed: int = 0) -> np.ndarray:
    """``normal(0, 0.02)`` with four outliers of 8-10 sigma (random sign) per row."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0.0, SIGMA, size=(rows, cols)).astype(np.float32)
    k = 4
    idx = rng.integers(0, cols, size=(rows, k))
    mag = rng.uniform(8.0, 10.0, size=(rows, k)) * SIGMA * rng.choice([-1.0, 1.0], (rows, k))
    np.put_along_axis(w, idx, mag.astype(np.float32), axis=1)
    return w


def plain_weights(rows: int = 1536, cols: int = 4096, seed: int = 1) -> np.ndarray:
    """``normal(0, 0.02)``."""
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, SIGMA, size=(rows, cols)).astype(np.float32)


# ---------------------------------------------------------------------------- references


def _f16(x: np.ndarray) -> np.ndarray:
    return np.minimum(x, 65504.0).astype(np.float16).astype(np.float32)


def _codes(g: np.ndarray, s: np.ndarray, bits: int) -> np.ndarray:
    """Reference nearest-level codes ``clip(rint(w / s * c + c))`` (0 for zero scales)."""
    c = np.float32(((1 << bits) - 1) / 2)
    safe = np.where(s > 0, s, np.float32(1))  # a zero scale decodes to 0 whatever the code
    u = g / safe[:, None] * c + c
    return np.clip(np.rint(u), 0, (1 << bits) - 1)


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    q = q.astype(np.uint8).reshape(-1)
    per = 8 // bits
    if len(q) % per:
        q = np.concatenate([q, np.zeros(-len(q) % per, np.uint8)])
    out = q[0::per].copy()
    for j in range(1, per):
        out |= q[j::per] << (bits * j)
    return out


def ref_absmax_q4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reference SMOE-Q4 encoder: scale = fp16(absmax) per group."""
    g = w.reshape(-1, GROUP_SIZE)
    s = _f16(np.abs(g).max(axis=1))
    return _pack(_codes(g, s, 4), 4), s.astype(np.float16)


def _sse(g: np.ndarray, s: np.ndarray, bits: int) -> np.ndarray:
    c = ((1 << bits) - 1) / 2
    rec = (_codes(g, s, bits) - c) / c * s[:, None]
    return np.square(rec - g).sum(axis=1)


def ref_grid_q2(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reference SMOE-Q2 encoder: best of 64 scales ``linspace(0.1, 1, 64) * absmax``."""
    g = w.reshape(-1, GROUP_SIZE)
    a = np.abs(g).max(axis=1)
    best_e = np.full(len(g), np.inf, np.float32)
    best_s = np.zeros(len(g), np.float32)
    for f in np.linspace(0.1, 1.0, 64, dtype=np.float32):
        s = _f16(a * f)
        e = _sse(g, s, 2)
        better = e < best_e
        best_e = np.where(better, e, best_e)
        best_s = np.where(better, s, best_s)
    return _pack(_codes(g, best_s, 2), 2), best_s.astype(np.float16)


def dense_bound_q4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4 with every group's best fp16 scale among all fp16 values in [0.5, 1.5] * absmax."""
    g = w.reshape(-1, GROUP_SIZE)
    a = np.abs(g).max(axis=1)
    best_s = _f16(a)
    best_e = _sse(g, best_s, 4)
    lo = _f16(a * 0.5).astype(np.float16).view(np.uint16).astype(np.int64)
    hi = _f16(a * 1.5).astype(np.float16).view(np.uint16).astype(np.int64)
    for step in range(int((hi - lo).max()) + 1):
        s = np.minimum(lo + step, hi).astype(np.uint16).view(np.float16).astype(np.float32)
        e = _sse(g, s, 4)
        better = e < best_e
        best_e = np.where(better, e, best_e)
        best_s = np.where(better, s, best_s)
    return _pack(_codes(g, best_s, 4), 4), best_s.astype(np.float16)


# ---------------------------------------------------------------------------- figures


def _timed(fn: Callable[[], T], repeats: int, warmup: bool = True) -> tuple[float, T]:
    """Best wall time of ``repeats`` (>= 1) calls (after one warm-up call) and the last
    result."""
    if warmup:
        result = fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def _cpu_timed(fn: Callable[[], object], repeats: int) -> float:
    """Best CPU time of the process over ``repeats`` calls (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _snr(w: np.ndarray, enc: tuple[np.ndarray, np.ndarray], bits: int) -> float:
    packed, scales = enc
    return quant.snr_db(w, quant.decode(packed, scales, bits, w.shape))


def _figure(
    name: str, ours: float, baseline: float, ratio: float, unit: str, goal: str, ok: bool
) -> dict:
    return {
        "name": name,
        "ours": round(ours, 4),
        "baseline": round(baseline, 4),
        "ratio": round(ratio, 4),
        "unit": unit,
        "goal": goal,
        "pass": bool(ok),
    }


def bf16_bits(w: np.ndarray) -> np.ndarray:
    """``w`` truncated to bfloat16, as raw ``uint16`` bits."""
    return (np.ascontiguousarray(w, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _encode_with(kernel: Kernel, w: np.ndarray, bits: int, mode: ScaleMode, **kw) -> tuple:
    """(packed, scales, stats) of one ``encode_into`` with SNR statistics."""
    packed = np.empty(quant.packed_size(w.size, bits), np.uint8)
    scales = np.empty(quant.num_groups(w.size), "<f2")
    stats = quant.QuantStats()
    quant.encode_into(w, bits, packed, scales, mode, stats=stats, kernel=kernel, **kw)
    return packed, scales, stats


_FIRST_CALL = """
import sys, time
import numpy as np
t = time.perf_counter()
from smoe import quant
w = np.zeros(1 << 16, np.uint16)
quant.encode(w, int(sys.argv[1]), sys.argv[2], src_dtype="bf16", kernel="fast")
print(time.perf_counter() - t)
"""


def first_call_seconds(bits: int, mode: str, cache_dir: str) -> float:
    """Seconds for a fresh process to import smoe and encode once with the compiled encoder,
    its cache in ``cache_dir`` (empty: it compiles; filled: it loads)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL, str(bits), mode],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def encoder_figures(quick: bool) -> list[dict]:
    """Per-core bf16 encode rate, compiled vs numpy; byte identity; first-call cost."""
    if quant.fast_kernels(4, "optimal", kernel="auto") is None:
        return [
            _figure(
                "compiled encoder available (pip install 'smoe[fast]')",
                0,
                1,
                0,
                "",
                "numba installed",
                False,
            )
        ]
    w = bf16_bits(realistic_weights())
    shape = f"{list(w.shape)}".replace(" ", "")
    mb = w.nbytes / 1e6
    repeats = 3 if quick else 7
    figs: list[dict] = []
    cases: tuple[tuple[int, ScaleMode, str], ...] = (
        (4, "optimal", "Q4 optimal"),
        (4, "absmax", "Q4 absmax"),
        (2, "optimal", "Q2 optimal"),
        (2, "absmax", "Q2 absmax"),
    )
    kernels: tuple[Kernel, ...] = ("fast", "numpy")
    for bits, mode, label in cases:
        out = {k: _encode_with(k, w, bits, mode, src_dtype="bf16") for k in kernels}
        t_fast = _cpu_timed(partial(_encode_with, "fast", w, bits, mode, src_dtype="bf16"), repeats)
        t_np = _cpu_timed(
            partial(_encode_with, "numpy", w, bits, mode, src_dtype="bf16"), max(2, repeats // 2)
        )
        figs.append(
            _figure(
                f"{label} encode, MB/s of BF16 in, per core, {shape}",
                mb / t_fast,
                mb / t_np,
                t_np / t_fast,
                "MB/s",
                "ours >= 1000 MB/s",
                mb / t_fast >= 1000,
            )
        )
        (p1, s1, st1), (p2, s2, st2) = out["fast"], out["numpy"]
        same = np.array_equal(p1, p2) and np.array_equal(s1.view(np.uint16), s2.view(np.uint16))
        gap = abs(st1.snr_db - st2.snr_db) / max(1.0, abs(st2.snr_db))
        figs.append(
            _figure(
                f"{label}: compiled == numpy bytes (ratio 1); SNR gap, {shape}",
                gap * 1e6,
                0.0,
                float(same),
                "ppm of dB",
                "identical bytes, SNR gap <= 20 ppm",
                same and gap <= 2e-5,
            )
        )
    if not quick:
        with tempfile.TemporaryDirectory() as cache:
            cold = first_call_seconds(4, "optimal", cache)
            warm = first_call_seconds(4, "optimal", cache)
        figs.append(
            _figure(
                "Q4 optimal compiled encoder: first call in a fresh process, "
                "cache filled vs empty (compiling)",
                warm,
                cold,
                warm / cold,
                "s",
                "cached first call <= 2 s",
                warm <= 2.0,
            )
        )
    return figs


FIRST_RUN_MODEL = {"layers": 2, "experts": 8, "d_model": 1024, "ffn": 512}
"""The small checkpoint of :func:`first_run_figures`: 50 MB of BF16 expert weights (25 M
weights in 48 matrices of 0.5 M), the size issue 25 timed."""
COMPILING = "compiling kernels for this machine, once"  # the first line of a compile


def first_sculpt(ckpt: Path, cache: str, kernel: str | None) -> tuple[float, bool]:
    """One ``smoe sculpt CKPT OUT --json`` process with ``cache`` as numba's cache and
    ``$SMOE_KERNEL`` = ``kernel`` (None: unset, the small-job rule decides): its wall
    seconds, interpreter start included, and whether it said it compiled kernels."""
    env = {k: v for k, v in os.environ.items() if k != quant.KERNEL_ENV}
    env["NUMBA_CACHE_DIR"] = cache
    if kernel is not None:
        env[quant.KERNEL_ENV] = kernel
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "smoe", "sculpt", str(ckpt), out, "--json"]
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        return time.perf_counter() - t, COMPILING in proc.stderr


def first_run_figures(quick: bool) -> list[dict]:
    """The first ``smoe sculpt`` with the compiled kernels (issue 25), of a 50 MB checkpoint
    (:data:`FIRST_RUN_MODEL`), each in a fresh process: forced compiled
    (``SMOE_KERNEL=fast``) with an empty kernel cache, so compiling, against the same with
    the cache that filled (informative); and with ``auto`` on an empty cache, where the
    small-job rule (:func:`smoe.quant.run_kernel`) decides, against ``SMOE_KERNEL=numpy``.
    The goal: the rule chose numpy (did not compile) if numpy finished sooner than the
    compiling run, and compiled otherwise. ``quick`` skips the compiling run (a minute):
    the goal then holds the numpy run against the estimated start of the compiled kernels
    on an empty cache (:data:`smoe.quant.compiling.LOAD_S` and
    :data:`~smoe.quant.compiling.COMPILE_S`)."""
    from smoe.quant.compiling import LOAD_S
    from smoe.quant.encoder import encoder_kernels
    from smoe_testkit.synth import write_checkpoint

    if quant.fast_kernels(4, "optimal", kernel="auto") is None:
        return []  # (encoder_figures says numba is missing)
    figs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        m = FIRST_RUN_MODEL
        ckpt = write_checkpoint(
            Path(tmp) / "first-run-50mb",
            layers=m["layers"],
            experts=m["experts"],
            d_model=m["d_model"],
            ffn=m["ffn"],
            seed=25,
        )
        mb = sum(p.stat().st_size for p in ckpt.glob("*.safetensors")) / 1e6
        auto, compiled = first_sculpt(ckpt, tempfile.mkdtemp(dir=tmp), None)
        numpy_s, _ = first_sculpt(ckpt, tempfile.mkdtemp(dir=tmp), "numpy")
        if quick:
            calls = encoder_kernels(4, "optimal", kernel="fast")  # as if none were cached
            fast_cold = LOAD_S + sum(call.estimate_s for call in calls)
            how = "estimated compile (quick)"
        else:
            cache = tempfile.mkdtemp(dir=tmp)
            fast_cold, said = first_sculpt(ckpt, cache, "fast")
            fast_warm, said_again = first_sculpt(ckpt, cache, "fast")
            how = "the compiling run"
            figs.append(
                figure(
                    f"first sculpt of a {mb:.0f} MB checkpoint, SMOE_KERNEL=fast: empty "
                    "kernel cache (compiling) vs the filled cache (loading)",
                    fast_cold,
                    fast_warm,
                    "s",
                    "informative",
                    None,
                    detail=f"said it compiled: {said} (cold), {said_again} (warm); "
                    f"numpy {numpy_s:.2f} s",
                    summary=True,
                )
            )
        figs.append(
            figure(
                f"first sculpt of a {mb:.0f} MB checkpoint, empty kernel cache: auto "
                "(the small-job rule) vs SMOE_KERNEL=numpy",
                auto,
                numpy_s,
                "s",
                "informative",
                None,
            )
        )
        numpy_faster = numpy_s < fast_cold
        figs.append(
            figure(
                f"small-job rule on a first run ({mb:.0f} MB, empty cache): numpy s vs {how}; "
                f"ratio 1 = it chose {'numpy' if not compiled else 'to compile'}",
                numpy_s,
                fast_cold,
                "s",
                "numpy where numpy is sooner",
                compiled != numpy_faster,
                ratio=float(not compiled),
            )
        )
    return figs


def run(quick: bool = False) -> list[dict]:
    """Measure all figures and return them as dicts.

    Each figure: ``name``, ``ours``, ``baseline``, ``ratio``, ``unit``, ``goal``, ``pass``.
    For dB figures ``ratio`` is ``ours - baseline`` (a ratio of error powers, in dB); for
    throughput it is ``ours / baseline``. Throughput is always measured on the realistic
    ``[1536, 4096]`` tensor (``quick``: best of two timed runs instead of three).
    Quality uses the full tensors, or 192 rows when ``quick``; the dense Q4 bound uses the
    first 128 rows (16 when ``quick``).
    """
    rows = 192 if quick else 1536
    sub = 16 if quick else 128
    repeats = 2 if quick else 3
    figs: list[dict] = encoder_figures(quick) + first_run_figures(quick)

    # throughput: single process, float32 input already in memory, outputs allocated
    w = realistic_weights()
    shape = f"{list(w.shape)}".replace(" ", "")
    mw = w.size / 1e6
    t_ours, ours4 = _timed(lambda: quant.encode(w, 4), repeats)
    t_ref, ref4 = _timed(lambda: ref_absmax_q4(w), repeats)
    figs.append(
        _figure(
            f"q4 encode throughput vs absmax, realistic {shape}",
            mw / t_ours,
            mw / t_ref,
            t_ref / t_ours,
            "M weights/s",
            "ours / absmax >= 1",
            t_ref >= t_ours,
        )
    )
    t_ours2, ours2 = _timed(lambda: quant.encode(w, 2), repeats)
    t_grid, grid2 = _timed(lambda: ref_grid_q2(w), 1, warmup=False)
    figs.append(
        _figure(
            f"q2 encode throughput vs 64-candidate grid, realistic {shape}",
            mw / t_ours2,
            mw / t_grid,
            t_grid / t_ours2,
            "M weights/s",
            "ours / grid >= 50",
            t_grid / t_ours2 >= 50,
        )
    )

    for label, make in (("realistic", realistic_weights), ("plain", plain_weights)):
        if quick or label != "realistic":
            w = make(rows)
            ours4, ref4 = quant.encode(w, 4), ref_absmax_q4(w)
            ours2, grid2 = quant.encode(w, 2), ref_grid_q2(w)
        shape = f"[{rows},4096]"
        snr_o, snr_r = _snr(w, ours4, 4), _snr(w, ref4, 4)
        figs.append(
            _figure(
                f"q4 snr vs absmax, {label} {shape}",
                snr_o,
                snr_r,
                snr_o - snr_r,
                "dB",
                "ours - absmax >= +0.3 dB",
                snr_o - snr_r >= 0.3,
            )
        )
        ws = w[:sub]
        snr_os = _snr(ws, quant.encode(ws, 4), 4)
        snr_b = _snr(ws, dense_bound_q4(ws), 4)
        figs.append(
            _figure(
                f"q4 snr gap to dense fp16 bound, {label} first {sub} rows",
                snr_os,
                snr_b,
                snr_b - snr_os,
                "dB",
                "bound - ours <= 0.1 dB",
                snr_b - snr_os <= 0.1,
            )
        )
        snr_o2, snr_g = _snr(w, ours2, 2), _snr(w, grid2, 2)
        figs.append(
            _figure(
                f"q2 snr vs 64-candidate grid, {label} {shape}",
                snr_o2,
                snr_g,
                snr_o2 - snr_g,
                "dB",
                "ours - grid >= 0 dB",
                snr_o2 >= snr_g,
            )
        )
    return figs


def main(argv: list[str] | None = None) -> int:
    """Print the figures; exit status 1 if any misses its goal (informative ones have none)."""
    argv = sys.argv[1:] if argv is None else argv
    figs = run(quick="--quick" in argv)
    width = max(len(f["name"]) for f in figs)
    for f in figs:
        mark = {True: "ok  ", False: "MISS", None: "info"}[f["pass"]]
        print(
            f"{mark} {f['name']:<{width}}  ours {f['ours']:>9.3f}  base {f['baseline']:>9.3f}"
            f"  ratio {f['ratio']:>8.3f}  {f['unit']:<12} goal: {f['goal']}"
        )
    return 0 if all(f["pass"] is not False for f in figs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
