"""Benchmark of importance-weighted quantisation (issue 14) on a synthetic MoE model.

The model: ``E`` experts of gate, up ``[F, D]`` and down ``[D, F]``, Student-t(4) weights
(scale 0.02). Each input space (d_model for gate/up, the expert FFN width for down) has
channel variances lognormal(0, 1) with 1 % outlier channels at 100x, scaled per expert by
lognormal(0, 0.3). A calibration set of activations drawn from those variances gives the
importance as ``llama-imatrix`` does (mean ``x^2`` per channel and expert); a held-out set
from the same variances measures the output ``W x``: output SNR
``10 log10(sum |W x|^2 / sum |(W - W_hat) x|^2)`` over every tensor of the model.

Figures, per bit width: output SNR of the imatrix encode against the plain one (goal
+1 dB); against a dense weighted scale search (every group's best of 600 fp16 scales in
``[0.2, 1.6]`` times its absmax for the calibration-weighted error, nearest codes; goal
within 0.25 dB), on the first rows of each tensor; the weight SNR (informative: the
expected trade); the importance-weighted SNR that sculpt records against the held-out
output SNR (informative); the encode time with importance against without (goal at most
1.5x), as sculpt encodes (``encode_into`` with statistics, bfloat16 input, the compiled
encoder when numba is installed), best CPU time of several interleaved runs; the same
for float32 input and for the numpy encoder (informative).

Run ``python -m bench.imatrix_bench [--quick]``; :func:`run` returns the figures.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.figures import figure
from smoe import quant
from smoe.quant import Kernel, SrcDtype
from smoe_gen.layout import GROUP_SIZE

SIGMA = 0.02
OUTLIERS, OUTLIER_GAIN = 0.01, 100.0
GAIN_DB, DENSE_GAP_DB, TIME_RATIO = 1.0, 0.25, 1.5


@dataclass
class Tensor:
    """One expert matrix ``w`` [rows, cols], its importance (calibration mean ``x^2`` per
    column) and held-out activations ``x`` [tokens, cols]."""

    name: str
    w: np.ndarray
    importance: np.ndarray
    x: np.ndarray


def channel_variances(cols: int, rng: np.random.Generator) -> np.ndarray:
    """Lognormal(0, 1) channel variances, 1 % of the channels at 100x."""
    return rng.lognormal(0, 1, cols) * np.where(rng.random(cols) < OUTLIERS, OUTLIER_GAIN, 1.0)


def build_model(d: int, f: int, experts: int, calib: int, held: int, seed: int = 0) -> list[Tensor]:
    """The synthetic model's expert tensors with their importance and held-out inputs."""
    rng = np.random.default_rng(seed)
    spaces = {"gate_up": channel_variances(d, rng), "down": channel_variances(f, rng)}
    out: list[Tensor] = []
    for e in range(experts):
        for name, rows, cols, space in (
            ("gate_proj", f, d, "gate_up"),
            ("up_proj", f, d, "gate_up"),
            ("down_proj", d, f, "down"),
        ):
            if name == "up_proj":  # the same inputs as gate_proj
                imp, x = out[-1].importance, out[-1].x
            else:
                var = spaces[space] * rng.lognormal(0, 0.3, cols)
                cal = rng.standard_normal((calib, cols)) * np.sqrt(var)
                imp = np.mean(cal * cal, axis=0)
                x = (rng.standard_normal((held, cols)) * np.sqrt(var)).astype(np.float32)
            w = (rng.standard_t(4, (rows, cols)) * SIGMA).astype(np.float32)
            out.append(Tensor(f"expert {e} {name}", w, imp, x))
    return out


def output_snr(tensors: list[Tensor], decoded: list[np.ndarray], rows: int | None = None) -> float:
    """Output SNR (dB) of the decoded weights over the held-out inputs, all tensors
    together (``rows``: only each tensor's first rows)."""
    sig = err = 0.0
    for t, w_hat in zip(tensors, decoded):
        w = t.w[:rows]
        y = t.x @ w.T
        e = t.x @ (w - w_hat[:rows]).T
        sig += float(np.square(y, dtype=np.float64).sum())
        err += float(np.square(e, dtype=np.float64).sum())
    return float(10 * np.log10(sig / err))


def weight_snr(tensors: list[Tensor], decoded: list[np.ndarray]) -> float:
    sig = sum(float(np.square(t.w, dtype=np.float64).sum()) for t in tensors)
    err = sum(float(np.square(t.w - d, dtype=np.float64).sum()) for t, d in zip(tensors, decoded))
    return float(10 * np.log10(sig / err))


def encode(
    w: np.ndarray,
    bits: int,
    importance: np.ndarray | None = None,
    kernel: Kernel | None = None,
    stats: quant.QuantStats | None = None,
    src_dtype: SrcDtype | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """As sculpt encodes: into caller buffers, with statistics."""
    packed = np.empty(quant.packed_size(w.size, bits), np.uint8)
    scales = np.empty(quant.num_groups(w.size), "<f2")
    quant.encode_into(
        w,
        bits,
        packed,
        scales,
        stats=stats or quant.QuantStats(),
        kernel=kernel,
        importance=importance,
        src_dtype=src_dtype,
    )
    return packed, scales


def decode(w: np.ndarray, enc: tuple[np.ndarray, np.ndarray], bits: int) -> np.ndarray:
    return quant.decode(enc[0], enc[1], bits, w.shape)


def dense_weighted(
    w: np.ndarray, importance: np.ndarray, bits: int, steps: int = 600
) -> np.ndarray:
    """Decoded weights with every group's best fp16 scale among ``steps`` geometric factors
    in [0.2, 1.6] times its absmax, for the importance-weighted error (nearest codes)."""
    c = np.float32(((1 << bits) - 1) / 2)
    g = w.reshape(-1, GROUP_SIZE)
    h = np.broadcast_to(importance.astype(np.float32), w.shape).reshape(-1, GROUP_SIZE)
    a = np.abs(g).max(axis=1)
    best = np.full(len(g), np.inf, np.float32)
    out = np.zeros_like(g)
    for f in np.geomspace(0.2, 1.6, steps, dtype=np.float32):
        s = (a * f).astype(np.float16).astype(np.float32)
        inv = np.where(s > 0, c / np.where(s > 0, s, 1), 0).astype(np.float32)
        rec = np.floor(g * inv[:, None])
        np.clip(rec, -c - 0.5, c - 0.5, out=rec)
        rec += 0.5
        rec *= (s / c)[:, None]
        e = np.einsum("ij,ij->i", h, np.square(g - rec))
        better = e < best
        best[better] = e[better]
        out[better] = rec[better]
    return out.reshape(w.shape)


def _best_cpu(fns: list, repeat: int) -> list[float]:
    """Best CPU time of each function over ``repeat`` interleaved rounds (after a warm-up)."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t = time.process_time()
            fn()
            best[i] = min(best[i], time.process_time() - t)
    return best


def _bf16(w: np.ndarray) -> np.ndarray:
    return (w.view(np.uint32) >> 16).astype(np.uint16)


def run(workdir: Path, quick: bool) -> list[dict]:
    """The figures (``workdir`` is unused: everything stays in memory)."""
    d, f, experts = (1024, 512, 1) if quick else (2048, 768, 2)
    calib, held, dense_rows = 512, 1024 if quick else 2048, 64 if quick else 128
    model = build_model(d, f, experts, calib, held)
    shape = f"{experts} experts, d {d}, ffn {f}"
    figs = []
    for bits in (2, 4):
        plain = [decode(t.w, encode(t.w, bits), bits) for t in model]
        stats = [quant.QuantStats() for _ in model]
        ours = [
            decode(t.w, encode(t.w, bits, t.importance, stats=s), bits)
            for t, s in zip(model, stats)
        ]
        snr_p, snr_o = output_snr(model, plain), output_snr(model, ours)
        figs.append(
            figure(
                f"Q{bits} output SNR, imatrix vs plain encode ({shape})",
                snr_o,
                snr_p,
                "dB",
                f"imatrix - plain >= +{GAIN_DB:g} dB",
                bool(snr_o - snr_p >= GAIN_DB),
                ratio=snr_o - snr_p,
                detail="held-out activations; ratio = difference in dB",
            )
        )
        dense = [dense_weighted(t.w[:dense_rows], t.importance, bits) for t in model]
        sub_o = output_snr(model, ours, dense_rows)
        sub_d = output_snr(model, dense, dense_rows)
        figs.append(
            figure(
                f"Q{bits} imatrix output SNR vs dense weighted scale search "
                f"(first {dense_rows} rows per tensor)",
                sub_o,
                sub_d,
                "dB",
                f"dense - ours <= {DENSE_GAP_DB:g} dB",
                bool(sub_d - sub_o <= DENSE_GAP_DB),
                ratio=sub_d - sub_o,
                detail="600 fp16 scales in [0.2, 1.6] x absmax per group; "
                "ratio = dense - ours in dB",
            )
        )
        wp, wo = weight_snr(model, plain), weight_snr(model, ours)
        figs.append(
            figure(
                f"Q{bits} weight SNR, imatrix vs plain (the trade)",
                wo,
                wp,
                "dB",
                "informative",
                None,
                ratio=wo - wp,
            )
        )
        sig = sum(s.wsums[0] for s in stats)
        err = sum(s.wsums[1] for s in stats)
        stat = float(10 * np.log10(sig / err))
        figs.append(
            figure(
                f"Q{bits} importance-weighted SNR (manifest) vs held-out output SNR",
                stat,
                snr_o,
                "dB",
                "informative",
                None,
                ratio=stat - snr_o,
            )
        )
    figs += _throughput(model, quick)
    return figs


def _throughput(model: list[Tensor], quick: bool) -> list[dict]:
    """Encode time with importance vs without, per source and encoder."""
    figs = []
    fast = quant.fast_kernels(4, "optimal", 1 << 30) is not None
    cases = [
        ("bf16", "fast" if fast else "numpy", True),
        ("f32", "fast" if fast else "numpy", False),
    ]
    if fast:
        cases.append(("bf16", "numpy", False))
    mb = sum(t.w.size for t in model) * 2 / 1e6
    for bits in (2, 4):
        for src, kernel, goal in cases:
            ws = [_bf16(t.w) if src == "bf16" else t.w for t in model]
            kw = {"src_dtype": "bf16"} if src == "bf16" else {}

            def plain(ws=ws, kw=kw, kernel=kernel, bits=bits) -> None:
                for w in ws:
                    encode(w, bits, kernel=kernel, **kw)

            def weighted(ws=ws, kw=kw, kernel=kernel, bits=bits) -> None:
                for w, t in zip(ws, model):
                    encode(w, bits, t.importance, kernel=kernel, **kw)

            t_p, t_w = _best_cpu([plain, weighted], 3 if quick else 7)
            name = "compiled" if kernel == "fast" else "numpy"
            figs.append(
                figure(
                    f"Q{bits} encode with imatrix vs without, {src} in, {name} encoder, "
                    "MB/s of BF16 per core",
                    mb / t_w,
                    mb / t_p,
                    "MB/s",
                    f"time <= {TIME_RATIO:g}x plain" if goal else "informative",
                    bool(t_w / t_p <= TIME_RATIO) if goal else None,
                    ratio=t_w / t_p,
                    detail="ratio = weighted / plain CPU time (best of interleaved runs)",
                )
            )
    return figs


def main(argv: list[str] | None = None) -> int:
    """Print the figures; exit status 1 if any misses its goal."""
    argv = sys.argv[1:] if argv is None else argv
    figs = run(Path("."), quick="--quick" in argv)
    for fig in figs:
        verdict = {True: "pass", False: "FAIL", None: "-"}[fig["pass"]]
        print(
            f"{fig['name']}: {fig['ours']:.4g} vs {fig['baseline']:.4g} {fig['unit']} "
            f"(ratio {fig['ratio']:.3g}; {fig['goal']}) {verdict}"
        )
    return 1 if any(fig["pass"] is False for fig in figs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
