"""The C++ streaming harness: expert reads vs the raw read bandwidth of the same file, and
the vectorised dequant+SwiGLU kernel vs a scalar loop, all measured in the same run.

Each ``smoe-stream bench`` run first searches, round-robin, three runs each: plain reads of
the file with 1, 2, 4 and 8 threads in three patterns (8 MiB preads of contiguous shares,
blob-sized preads in file order from a shared counter, and the stream's own reads, the same
experts in the same order, as plain preads), and the stream with 1, 2, 4 and 8 threads.
Then the stream's fastest thread count and the fastest plain reader of its own reads take
turns, twelve runs each, and each figure is the median of its side's runs: like for like,
at the same moments of a shared disk. The fastest plain read of any pattern is reported as
the file's read limit. Page-cached (the file warmed first) and O_DIRECT.

The vault has Qwen3-30B-A3B expert shapes (d_model 2048, ffn 768, Q4: 2.36 MB per expert),
48 layers x 32 experts = 3.6 GB, with random codes and finite scales.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

from bench.figures import figure
from smoe import quant
from smoe.format.records import ArchInfo, ModelInfo
from smoe.vault.writer import VaultWriter

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "build" / "smoe-stream"


def make_vault(path: Path, layers: int, experts: int, d_model: int = 2048, ffn: int = 768) -> Path:
    if path.exists():
        return path
    model = ModelInfo(
        num_moe_layers=layers,
        max_experts_per_layer=experts,
        d_model=d_model,
        vocab_size=151936,
        ffn_dim=6144,
    )
    arch = ArchInfo(
        rope_theta=1e6,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        moe_top_k=8,
        moe_ffn_dim=ffn,
        num_hidden_layers=layers,
        rms_norm_eps=1e-6,
        model_type="qwen3_moe",
        norm_topk_prob=True,
        has_qk_norm=True,
    )
    shapes = [(ffn, d_model), (ffn, d_model), (d_model, ffn)]
    rng = np.random.default_rng(0)
    n = ffn * d_model
    packed = rng.integers(0, 256, n // 2, dtype=np.uint8)
    scales = np.full(quant.num_groups(n), 0.02, "<f2")
    with VaultWriter(path, model, bits=4, arch=arch) as w:
        for lay in range(layers):
            for e in range(experts):
                w.add_expert(lay, e, shapes)
        w.begin()
        for lay in range(layers):
            for e in range(experts):
                w.write_encoded(lay, e, [(np.roll(packed, lay * 131 + e), scales)] * 3)
        w.commit()
    return path


def warm(path: Path) -> None:
    """Read the whole file once so that "page-cached" means what it says."""
    with path.open("rb", buffering=0) as f:
        buf = bytearray(8 << 20)
        while f.readinto(buf):
            pass


def bench(vault: Path, *args: str) -> dict:
    proc = subprocess.run(
        [str(BIN), "bench", str(vault), *args], capture_output=True, text=True, check=True
    )
    out = json.loads(proc.stdout)
    out["stderr"] = proc.stderr.strip()
    return out


def run(workdir: Path, quick: bool = False) -> list[dict]:
    if not BIN.exists():
        subprocess.run(["make", "-s", "build"], cwd=ROOT, check=True)
    workdir.mkdir(parents=True, exist_ok=True)
    vault = make_vault(
        workdir / ("q4-small.smoe" if quick else "q4-qwen3-30b-shapes.smoe"), 8 if quick else 48, 32
    )
    seconds = "1.5" if quick else "6"  # the reads take twice this: the search, then the duel
    figs = []
    warm(vault)
    for direct in (False, True):
        mode = "O_DIRECT" if direct else "page-cached"
        extra = ["--direct"] if direct else []
        for pattern, goal in (("seq", 0.9), ("random", 0.8)):
            r = bench(
                vault,
                "--threads",
                "auto",
                "--pattern",
                pattern,
                "--topk",
                "8",
                "--seconds",
                seconds,
                *extra,
            )
            s, raw = r["stream"], r["raw_read"]
            ours, limit = s["gb_per_s"], raw["gb_per_s"]
            search = ", ".join(
                f"{x['pattern']} {x['threads']}x{x['chunk_bytes'] / 2**20:.3g} MiB "
                f"{x['gb_per_s']:.2f}"
                for x in raw["runs"]
            )
            streams = ", ".join(f"{x['threads']} {x['gb_per_s']:.2f}" for x in s["search"])
            note = " (fell back: O_DIRECT refused)" if direct and r.get("direct") is False else ""
            what = "seq" if pattern == "seq" else "random top-8"
            figs.append(
                figure(
                    f"stream {what}, {mode}, vs raw reads of the same experts{note}",
                    ours,
                    limit,
                    "GB/s",
                    f">= {goal:.0%} of raw",
                    ours >= goal * limit,
                    detail=f"smoe-stream bench --threads auto --pattern {pattern} --topk 8"
                    f"{' --direct' if direct else ''}: medians of {len(s['runs_gb_per_s'])} "
                    f"alternating runs each, the stream with {r['threads']} threads (search: "
                    f"{streams} GB/s) against plain reads of its experts with "
                    f"{raw['threads']} threads; the file's read limit, the fastest plain read "
                    f"of any pattern: {raw['file_limit']['gb_per_s']:.2f} GB/s (search: "
                    f"{search} GB/s)",
                )
            )
            if pattern == "random":
                figs.append(
                    figure(
                        f"stream random top-8, {mode}: expert read latency p50",
                        s["latency_p50_us"],
                        None,
                        "us",
                        "reported",
                        None,
                        detail=f"p99 {s['latency_p99_us']:.0f} us, {r['threads']} threads",
                    )
                )
    c = bench(vault, "--threads", "1", "--pattern", "seq", "--seconds", "1")["compute"]
    figs.append(
        figure(
            f"dequant+SwiGLU ({c['simd']}) vs scalar loop",
            c["gb_per_s"],
            c["scalar_gb_per_s"],
            "GB/s",
            ">= 4x scalar",
            c["speedup"] >= 4,
            ratio=c["speedup"],
            detail="GB/s of packed weights, one thread",
        )
    )
    return figs
