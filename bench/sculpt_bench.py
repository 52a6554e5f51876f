"""Sculpt end to end on a synthetic checkpoint with Qwen3-30B-A3B expert shapes.

d_model 2048, expert ffn 768, 128 experts per layer, 2 layers (2.4 GB), BF16. Ours
(`smoe sculpt`, Q4 and Q2, --jobs 1 and 2) against the straightforward sequential
baseline measured in the same run: load each expert, quantise with the reference
encoders (absmax Q4, 64-candidate grid Q2), append. Throughput is MB/s of expert weights
in; peak RSS is the sum over the process tree, sampled every 10 ms.

The cost of ``--resume`` when every expert is already done (a run stopped after its last
expert, before the commit): the resume re-reads and hashes every source byte to decide
by content, then writes the scout and commits. Against the clean Q4 ``--jobs 2`` run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.figures import figure
from bench.quant_bench import ref_absmax_q4, ref_grid_q2
from smoe import quant
from smoe.checkpoint import Checkpoint
from smoe.sculpt import SculptOptions, sculpt, select
from smoe.synth import write_checkpoint
from smoe_gen import layout

GEOMETRY = {"d_model": 2048, "ffn": 768, "experts": 128, "vocab": 1024}


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (Linux /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


def run_tree(cmd: list[str]) -> tuple[float, int, str]:
    """(seconds, peak tree RSS, stdout) of a command."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.01)
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {err[-2000:]}")
    return time.perf_counter() - t, peak, out


def checkpoint(root: Path, layers: int) -> Path:
    path = root / f"qwen3-30b-a3b-shapes-{layers}l"
    if not (path / "config.json").exists():
        write_checkpoint(path, layers=layers, experts=GEOMETRY["experts"],
                         d_model=GEOMETRY["d_model"], ffn=GEOMETRY["ffn"],
                         vocab=GEOMETRY["vocab"], top_k=8, seed=7)
    return path


def baseline_mb_s(ckpt: Path, bits: int, n_experts: int) -> float:
    """The sequential baseline on the first n experts: load, reference-quantise, append."""
    ck = Checkpoint.open(ckpt)
    refs = list(ck.experts.values())[:n_experts]
    out = ckpt.parent / "baseline.bin"
    enc = ref_absmax_q4 if bits == 4 else ref_grid_q2
    t = time.perf_counter()
    bytes_in = 0
    with out.open("wb") as f:
        for ref in refs:
            for arr, src in ref.load():
                bytes_in += arr.nbytes
                w = quant.bf16_to_f32(arr) if src == "bf16" else arr.astype(np.float32)
                packed, scales = enc(w)
                f.write(packed.tobytes())
                f.write(scales.astype("<f2").tobytes())
            f.write(b"\0" * (-f.tell() % layout.PAGE_SIZE))
    seconds = time.perf_counter() - t
    out.unlink()
    return bytes_in / 1e6 / seconds


def run(workdir: Path, quick: bool = False) -> list[dict]:
    ckpt = checkpoint(workdir, 1 if quick else 2)
    expert_bytes = 3 * GEOMETRY["ffn"] * GEOMETRY["d_model"]
    one_expert_f32 = expert_bytes * 4
    figs = []
    max_experts = ["--max-experts", "32"] if quick else []
    clean_seconds = {}
    for bits in (4, 2):
        base = baseline_mb_s(ckpt, bits, 32 if bits == 4 else 4)
        results = {}
        for jobs in (1, 2):
            out = workdir / f"out-q{bits}-j{jobs}"
            cmd = [sys.executable, "-m", "smoe.cli", "sculpt", str(ckpt), str(out), "--bits",
                   str(bits), "--jobs", str(jobs), "--json", *max_experts]
            seconds, rss, stdout = run_tree(cmd)
            clean_seconds[(bits, jobs)] = seconds
            summary = json.loads(stdout)
            mb = summary["expert_bytes_in"] / 1e6
            results[jobs] = (mb / seconds, rss)
            for p in out.iterdir():
                p.unlink()
            out.rmdir()
        for jobs, (mbs, rss) in results.items():
            figs.append(figure(f"sculpt Q{bits} --jobs {jobs}: MB/s of BF16 expert weights in "
                               f"(vs sequential reference-encoder baseline)", mbs, base, "MB/s",
                               ">= 1x baseline", mbs >= base))
            limit = 512 * 2**20 + one_expert_f32
            figs.append(figure(f"sculpt Q{bits} --jobs {jobs}: peak RSS of the process tree",
                               rss / 2**20, limit / 2**20, "MiB",
                               "<= 512 MiB + one expert's f32 tensors", rss <= limit,
                               ratio=rss / limit))
        scale = results[2][0] / results[1][0]
        figs.append(figure(f"sculpt Q{bits}: --jobs 2 vs --jobs 1 throughput", results[2][0],
                           results[1][0], "MB/s", ">= 1.5x on 2 cores", scale >= 1.5))
    figs.extend(resume_figures(ckpt, workdir, clean_seconds[(4, 2)], 32 if quick else None))
    return figs


def resume_figures(ckpt: Path, workdir: Path, clean_seconds: float,
                   max_experts: int | None = None) -> list[dict]:
    """Seconds and MB/s of source bytes re-hashed by ``--resume`` when all is done."""
    opts = SculptOptions(jobs=2, max_experts=max_experts)
    refs = select(Checkpoint.open(ckpt), opts)
    total, source_bytes = len(refs), sum(r.nbytes for r in refs)
    out = workdir / "out-resume"
    stopped = []

    def stop(done: int, n: int, nbytes: int) -> None:
        if done == n:  # stop like Ctrl-C: the partial and the journal are kept
            stopped.append(done)
            raise KeyboardInterrupt

    try:
        sculpt(ckpt, out, opts, progress=stop)
    except KeyboardInterrupt:
        if not stopped:
            raise
    if not stopped:
        raise RuntimeError("the preparatory sculpt was not stopped before its commit")
    cmd = [sys.executable, "-m", "smoe.cli", "sculpt", str(ckpt), str(out), "--resume",
           "--jobs", "2", "--json"]
    if max_experts is not None:
        cmd += ["--max-experts", str(max_experts)]
    seconds, _, stdout = run_tree(cmd)
    summary = json.loads(stdout)
    if summary["experts_resumed"] != total or summary["experts_written"] != 0:
        raise RuntimeError(f"--resume redid experts: {summary}")
    for p in out.iterdir():
        p.unlink()
    out.rmdir()
    gb = source_bytes / 1e9
    return [
        figure(f"sculpt --resume of a run stopped after its last expert ({total} experts, "
               f"{gb:.2f} GB of sources re-hashed): seconds (vs the clean Q4 --jobs 2 run)",
               seconds, clean_seconds, "s", "<= 0.25x a clean sculpt",
               seconds <= 0.25 * clean_seconds),
        figure("sculpt --resume: MB/s of source bytes re-read and hashed (CRC-32C)",
               source_bytes / 1e6 / seconds, None, "MB/s", "informative", None),
    ]
