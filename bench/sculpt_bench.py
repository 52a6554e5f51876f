"""Sculpt end to end on a synthetic checkpoint with Qwen3-30B-A3B expert shapes, against
the rate at which this machine can read the checkpoint, measured in the same run.

d_model 2048, expert ffn 768, 128 experts per layer, 2 layers (2.4 GB), BF16, one shard.

* **Read limits**, measured the same way as :mod:`bench.machine_bench`: page-cached (the
  shard warmed, best of 1 and 2 threads of positioned reads) and cold (the shard dropped
  from the page cache with ``POSIX_FADV_DONTNEED`` before every read, best of 1 and 2;
  measured again next to every cold run, as this disk's rate varies). Each limit is the
  best of all its measurements in the run.
* **Sculpt** (``smoe sculpt``, Q4 and Q2): ``--jobs 1`` and ``--jobs`` = the usable cores
  on the page-cached shard (the best of :data:`REPEAT` runs each), and ``--jobs`` = cores
  on the cold shard in :data:`COLD_ROUNDS` rounds of (cold read limit, cold sculpt), the
  shard dropped before each: this disk's rate drifts from minute to minute, so each cold
  run is held against the limit measured just before it, and the median round counts.
  Throughput is MB/s of expert weights in over the sculpt's own time (its JSON summary:
  from opening the checkpoint to the commit, outputs fsynced; the interpreter's start-up
  is left out); ``--jobs`` = cores is held against the read limit of the same cache
  state. The summary's phases also give the rate of the experts phase alone (informative:
  the setup, mostly loading the compiled kernels, costs the same for any checkpoint).
  ``--jobs 1`` is also compared with the straightforward sequential baseline (load each
  expert, quantise it with the reference encoder, append).
* **What bounds a sculpt** (informative): page-cached, the CPU — ``--jobs`` = cores
  against as many processes doing nothing but encode experts already in memory
  (:func:`encoder_limit`); cold, the disk — against reading the dropped checkpoint while
  a file of the vault's size is written beside it and fsynced, measured in each round
  (:func:`bench.machine_bench.read_write_limit`): the least data a cold sculpt must move
  through the one device.
* **Peak RSS** of the process tree (the sum over the processes, sampled every 10 ms; the
  PSS, which counts pages shared after fork once, is in the figure's detail), every run;
  and the full page-cached Q4 run's against a run of 8 experts per layer: memory does not
  grow with the size of the job (:func:`rss_growth_figure`).
* ``--resume`` when every expert is already done (a run stopped after its last expert,
  before the commit): it re-reads and hashes every source byte and recomputes every kept
  tensor's SNR from its blob (a journal is a hint, never trusted: issue 23), so it costs
  most of an encode's code pass; the goal is 0.8x a clean sculpt (it was 0.25x when the
  journal's SNRs were copied).
* ``smoe verify --deep`` and ``smoe export`` of the Q4 vault, in-process, vault warmed,
  against the page-cached read limit of the vault; the export's float32 output also
  against writing a file of its size, fsynced (:func:`bench.machine_bench.write_limit`).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

from bench.figures import best_time, figure
from bench.machine_bench import (
    describe,
    describe_ways,
    drop_cache,
    read_limit,
    read_write_limit,
    warm,
    write_limit,
)
from bench.quant_bench import ref_absmax_q4, ref_grid_q2
from smoe import quant
from smoe.export.float32 import export
from smoe.format.plan import Shape, make_plan
from smoe.format.verify import verify_path
from smoe.plumbing.cpus import usable_cores
from smoe.sculpt import Job, SculptOptions, quantise_expert, sculpt, select
from smoe.sculpt.source.checkpoint import Checkpoint
from smoe.vault.reader import Vault
from smoe_gen import layout
from smoe_testkit.synth import write_checkpoint

GEOMETRY = {"d_model": 2048, "ffn": 768, "experts": 128, "vocab": 1024}
SCULPT = [sys.executable, "-m", "smoe", "sculpt"]
GOAL = 0.7  # of the read limit, at --jobs = cores
REPEAT = 2  # page-cached sculpt runs per configuration (the best counts)
COLD_ROUNDS = 3  # rounds of (cold read limit, cold sculpt) per bit width


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return out


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants, summed (pages that forked
    workers share with their parent are counted in each)."""
    total = 0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


def tree_pss(pid: int) -> int:
    """Proportional set size of the tree: each shared page counted once in all."""
    total = 0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


def run_tree(cmd: list[str]) -> tuple[float, int, str, int]:
    """(seconds, peak tree RSS, stdout, peak tree PSS) of a command; RSS is sampled every
    10 ms, PSS (which costs the kernel a page-table walk) every 100 ms."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = pss = n = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        if n % 10 == 0:
            pss = max(pss, tree_pss(proc.pid))
        n += 1
        time.sleep(0.01)
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {err[-2000:]}")
    return time.perf_counter() - t, peak, out, pss


def checkpoint(root: Path, layers: int) -> Path:
    path = root / f"qwen3-30b-a3b-shapes-{layers}l"
    if not (path / "config.json").exists():
        write_checkpoint(
            path,
            layers=layers,
            experts=GEOMETRY["experts"],
            d_model=GEOMETRY["d_model"],
            ffn=GEOMETRY["ffn"],
            vocab=GEOMETRY["vocab"],
            top_k=8,
            seed=7,
        )
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


ENCODE_EXPERTS = 16  # experts each process of :func:`encoder_limit` encodes, from memory


def _encode_all(ckpt: Path, bits: int, ready: Any, done: Any) -> None:
    """One process of :func:`encoder_limit`: load the experts, wait for the others, encode
    them all as a worker does (:func:`smoe.sculpt.quantise_expert`: blob, SNR statistics,
    blob CRC-32C), report the time it finished."""
    refs = list(Checkpoint.open(ckpt).experts.values())[:ENCODE_EXPERTS]
    loaded = [ref.load() for ref in refs]
    # an ExpertRef has three matrices: gate, up, down
    shapes = {(r.layer, r.expert): cast("tuple[Shape, Shape, Shape]", r.shapes) for r in refs}
    plan = make_plan(shapes, bits, layout.VERSION_MAX)
    slots = {e.key: e for e in plan.experts}
    blob = np.empty(max(e.raw_size for e in plan.experts), np.uint8)
    ready.wait()
    for ref, mats in zip(refs, loaded):
        slot = slots[(ref.layer, ref.expert)]
        quantise_expert(Job(ref, slot, bits, "optimal"), mats, (), blob[: slot.raw_size])
    done.put(time.perf_counter())


def encoder_limit(ckpt: Path, bits: int, processes: int) -> float:
    """MB/s of BF16 in when ``processes`` processes (one per core) do nothing but encode
    experts already in memory, as the sculptor's workers do (compiled kernels loaded
    first): the most a page-cached sculpt could reach on this machine's cores."""
    quant.prepare_fast(bits, "optimal")
    ctx = mp.get_context("fork")
    ready, done = ctx.Barrier(processes + 1), ctx.Queue()
    procs = [
        ctx.Process(target=_encode_all, args=(ckpt, bits, ready, done)) for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    ready.wait()
    start = time.perf_counter()
    end = max(done.get() for _ in procs)
    for proc in procs:
        proc.join()
    refs = list(Checkpoint.open(ckpt).experts.values())[:ENCODE_EXPERTS]
    nbytes = sum(n for ref in refs for _, _, n in ref.ranges())
    return processes * nbytes / 1e6 / (end - start)


def remove_tree(out: Path) -> None:
    for p in out.iterdir():
        p.unlink()
    out.rmdir()


def sculpt_run(ckpt: Path, out: Path, bits: int, jobs: int, extra: list[str]) -> dict:
    """One ``smoe sculpt`` process: MB/s over its own seconds, process wall, peak RSS."""
    cmd = [*SCULPT, str(ckpt), str(out), "--bits", str(bits), "--jobs", str(jobs), "--json"]
    cmd += extra
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, rss, stdout, pss = run_tree(cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    summary = json.loads(stdout)
    mb = summary["expert_bytes_in"] / 1e6
    phases = summary["phases_s"]
    return {
        "mb_s": mb / summary["seconds"],
        "seconds": summary["seconds"],
        "phases": phases,
        "cores_busy": cpu / wall,
        "steady_mb_s": mb / phases["experts"],
        "wall": wall,
        "rss": rss,
        "pss": pss,
        "mb": mb,
        "experts": summary["experts_written"] + summary["experts_resumed"],
    }


def run(workdir: Path, quick: bool = False) -> list[dict]:
    ckpt = checkpoint(workdir, 1 if quick else 2)
    shards = sorted(ckpt.glob("*.safetensors"))
    cores = usable_cores()
    one_expert_f32 = 3 * GEOMETRY["ffn"] * GEOMETRY["d_model"] * 4
    rss_limit = 512 * 2**20 + one_expert_f32
    max_experts = 32 if quick else None
    extra = ["--max-experts", str(max_experts)] if max_experts else []
    encode_limits: dict[int, float] = {}  # MB/s of encoding alone on every core, per bit width
    limits: dict[str, float] = {}  # MB/s
    per_threads: dict[str, dict[int, float]] = {}

    def measure(mode: str, repeat: int) -> float:
        """This measurement's read limit (MB/s); ``limits`` keeps the best of every
        measurement in this run (cold: of buffered reads of the dropped shard and of
        O_DIRECT reads, which sculpt uses)."""
        now = 0.0
        for how in (mode, "direct") if mode == "cold" else (mode,):
            _, per = read_limit(shards, how, threads=(1, 2), repeat=repeat)
            now = max(now, *per.values())
            seen = per_threads.setdefault(how, {})
            for n, v in per.items():
                seen[n] = max(seen.get(n, 0.0), v)
        limits[mode] = max(limits.get(mode, 0.0), now * 1e3)
        return now * 1e3

    for mode in ("cached", "cold"):
        measure(mode, repeat=2)
    q4_vault = workdir / "out-q4-vault"
    clean_seconds = clean_wall = 0.0
    bases: dict[int, float] = {}  # bits -> MB/s of the reference-encoder baseline
    all_runs: dict[int, dict[tuple[int, str], dict]] = {}  # bits -> (jobs, mode) -> run
    cold_rounds: dict[int, list[tuple[float, dict]]] = {}  # bits -> (limit, run) per round
    for bits in (4, 2):
        bases[bits] = baseline_mb_s(ckpt, bits, 32 if bits == 4 else 4)
        runs: dict[tuple[int, str], dict] = {}
        all_runs[bits] = runs
        for jobs in sorted({1, cores}):  # page-cached: the best of REPEAT runs
            for _ in range(REPEAT):
                warm(shards)
                out = workdir / f"out-q{bits}-j{jobs}-cached"
                r = sculpt_run(ckpt, out, bits, jobs, extra)
                if (jobs, "cached") not in runs or r["mb_s"] > runs[(jobs, "cached")]["mb_s"]:
                    runs[(jobs, "cached")] = r
                    if (bits, jobs) == (4, cores):
                        clean_seconds, clean_wall = r["seconds"], r["wall"]
                        if q4_vault.exists():
                            remove_tree(q4_vault)
                        out.rename(q4_vault)
                        continue
                remove_tree(out)
        # cold: rounds of (read limit, then sculpt), each dropped from the page cache just
        # before; this disk's rate drifts, so each run is held against its own round's limit
        cold_rounds[bits] = rounds = []
        dry = SculptOptions(bits=bits, max_experts=max_experts, dry_run=True)
        vault_bytes = cast("dict", sculpt(ckpt, workdir, dry))["vault_bytes"]
        for _ in range(COLD_ROUNDS):
            round_limit = measure("cold", repeat=1)
            rw, rw_ways = read_write_limit(shards, workdir, vault_bytes)
            drop_cache(shards)
            out = workdir / f"out-q{bits}-j{cores}-cold"
            r = sculpt_run(ckpt, out, bits, cores, extra)
            remove_tree(out)
            rounds.append((round_limit, dict(r, rw_limit=rw * 1e3, rw_ways=rw_ways)))
        limit, r = sorted(rounds, key=lambda lr: lr[1]["mb_s"] / lr[0])[len(rounds) // 2]
        r = dict(r, limit=limit)
        runs[(cores, "cold")] = r
        encode_limits[bits] = encoder_limit(ckpt, bits, cores)
    gb = sum(p.stat().st_size for p in shards) / 1e9
    figs = [
        figure(
            f"read limit of the checkpoint, {what}",
            limits[mode],
            None,
            "MB/s",
            "reference limit",
            None,
            detail=f"{gb:.2f} GB in {len(shards)} shard(s), best in this run of "
            f"{describe(per_threads[mode])}"
            + (
                ", dropped from the page cache before each read; O_DIRECT "
                f"{describe(per_threads['direct'])}"
                if mode == "cold"
                else ""
            ),
        )
        for mode, what in (("cached", "page-cached"), ("cold", "cold"))
    ]
    for bits, runs in all_runs.items():
        one, base = runs[(1, "cached")], bases[bits]
        figs.append(
            figure(
                f"sculpt Q{bits} --jobs 1 vs reference-encoder baseline",
                one["mb_s"],
                base,
                "MB/s",
                ">= 1x baseline",
                one["mb_s"] >= base,
                detail="MB/s of BF16 expert weights in, page-cached; the baseline "
                "loads, reference-quantises and appends each expert in turn",
            )
        )
        for mode in ("cached", "cold"):
            r = runs[(cores, mode)]
            limit = r.get("limit", limits[mode])
            how = (
                f"best of {REPEAT} runs against the best page-cached read of the run"
                if mode == "cached"
                else f"the median of {COLD_ROUNDS} rounds (read limit, then a sculpt, each "
                "from a dropped page cache), each run against its own round's limit: "
                + ", ".join(f"{x['mb_s']:.0f}/{lim:.0f}" for lim, x in cold_rounds[bits])
            )
            figs.append(
                figure(
                    f"sculpt Q{bits} --jobs {cores}, {mode}, vs read limit",
                    r["mb_s"],
                    limit,
                    "MB/s",
                    f">= {GOAL:.0%} of the read limit",
                    r["mb_s"] >= GOAL * limit,
                    detail=f"--jobs = the usable cores; {r['mb']:.0f} MB in {r['seconds']:.2f} s "
                    f"in sculpt ({r['wall']:.2f} s for the process, start-up included); {how}",
                )
            )
        r = runs[(cores, "cold")]
        figs.append(
            figure(
                f"sculpt Q{bits} --jobs {cores}, cold: the experts phase alone vs read limit",
                r["steady_mb_s"],
                r["limit"],
                "MB/s",
                "informative: the rate once set up",
                None,
                detail="the run above without its fixed costs: setup {setup:.2f} s (checkpoint, "
                "plan, compiled kernels loaded: the same for any checkpoint size), experts "
                "{experts:.2f} s, commit {commit:.2f} s".format(**r["phases"]),
            )
        )
        cached = runs[(cores, "cached")]
        figs.append(
            figure(
                f"sculpt Q{bits} --jobs {cores}, page-cached, vs encoding alone on {cores} cores",
                cached["mb_s"],
                encode_limits[bits],
                "MB/s",
                "informative: the CPU bound",
                None,
                summary=True,
                detail=f"the limit: {cores} processes doing nothing but encode "
                f"{ENCODE_EXPERTS} experts each from memory, as the workers do; the experts "
                f"phase alone runs at {cached['steady_mb_s']:.0f} MB/s "
                f"({cached['steady_mb_s'] / encode_limits[bits]:.2f} of it), setup "
                f"{cached['phases']['setup']:.2f} s",
            )
        )
        r = runs[(cores, "cold")]
        ways = describe_ways(r["rw_ways"])
        figs.append(
            figure(
                f"sculpt Q{bits} --jobs {cores}, cold, vs read+write limit",
                r["mb_s"],
                r["rw_limit"],
                "MB/s",
                "informative: the disk bound",
                None,
                summary=True,
                detail="the limit: reading the dropped checkpoint while writing a file of "
                f"the vault's size beside it (fsynced), the least a cold sculpt must move, "
                f"measured in the same round as the run above; best of {ways}; the "
                f"experts phase alone runs at {r['steady_mb_s']:.0f} MB/s "
                f"({r['steady_mb_s'] / r['rw_limit']:.2f} of it)",
            )
        )
        if cores > 1:
            scale = runs[(cores, "cached")]["mb_s"] / one["mb_s"]
            figs.append(
                figure(
                    f"sculpt Q{bits} --jobs {cores} vs --jobs 1, page-cached",
                    runs[(cores, "cached")]["mb_s"],
                    one["mb_s"],
                    "MB/s",
                    "informative: --jobs 1 is threaded",
                    None,
                    detail=f"{scale:.2f}x; --jobs 1 already keeps {one['cores_busy']:.2f} "
                    f"cores busy (its reader and blob-writer threads beside the encoder), "
                    f"--jobs {cores} keeps {runs[(cores, 'cached')]['cores_busy']:.2f} busy "
                    "(CPU seconds of the process tree over its wall time)",
                )
            )
        (jobs, mode), r = max(runs.items(), key=lambda kv: kv[1]["rss"])
        figs.append(
            figure(
                f"sculpt Q{bits}: peak RSS of the process tree",
                r["rss"] / 2**20,
                rss_limit / 2**20,
                "MiB",
                "<= 512 MiB + 1 expert f32",
                r["rss"] <= rss_limit,
                ratio=r["rss"] / rss_limit,
                detail=f"the largest of {len(runs)} runs (--jobs {jobs}, {mode}), "
                "the sum of every process's RSS (pages the workers share with the "
                f"parent counted in each; PSS, counting them once: "
                f"{r['pss'] / 2**20:.0f} MiB); limit 512 MiB + one expert's three "
                "f32 tensors",
            )
        )
    figs.append(rss_growth_figure(ckpt, workdir, cores, all_runs[4][(cores, "cached")]))
    figs.extend(
        resume_figures(
            ckpt, workdir, (clean_seconds, clean_wall), limits["cached"], 32 if quick else None
        )
    )
    figs.extend(vault_read_figures(q4_vault, workdir))
    remove_tree(q4_vault)
    return figs


FEW_EXPERTS = 8  # per layer: the small run of :func:`rss_growth_figure`


def rss_growth_figure(ckpt: Path, workdir: Path, cores: int, full: dict) -> dict:
    """Peak RSS of the page-cached Q4 ``--jobs cores`` run (``full``, every expert) against
    a run of the same checkpoint limited to the first :data:`FEW_EXPERTS` experts of each
    layer: memory that does not grow with the number of experts sculpted."""
    warm(sorted(ckpt.glob("*.safetensors")))
    out = workdir / "out-q4-few"
    few = sculpt_run(ckpt, out, 4, cores, ["--max-experts", str(FEW_EXPERTS)])
    remove_tree(out)
    ratio = full["rss"] / few["rss"]
    return figure(
        f"sculpt Q4 --jobs {cores}: peak RSS, {full['experts']} experts vs {few['experts']}",
        full["rss"] / 2**20,
        few["rss"] / 2**20,
        "MiB",
        "<= 1.1x: bounded, whatever the size",
        ratio <= 1.1,
        detail=f"page-cached; the process tree's peak RSS (PSS {full['pss'] / 2**20:.0f} "
        f"and {few['pss'] / 2**20:.0f} MiB)",
    )


def resume_figures(
    ckpt: Path,
    workdir: Path,
    clean: tuple[float, float],
    limit: float,
    max_experts: int | None = None,
) -> list[dict]:
    """Seconds and MB/s of source bytes re-hashed by ``--resume`` when all is done."""
    cores = usable_cores()
    opts = SculptOptions(jobs=cores, max_experts=max_experts)
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
    cmd = [*SCULPT, str(ckpt), str(out), "--resume", "--jobs", str(cores), "--json"]
    if max_experts is not None:
        cmd += ["--max-experts", str(max_experts)]
    # page-cached, as the clean run it is held against: the checkpoint and the partial vault
    # (a sculpt reads a cold checkpoint with O_DIRECT and writes blobs read from the page
    # cache with O_DIRECT: either may have left nothing in the cache)
    warm(sorted(ckpt.glob("*.safetensors")) + sorted(p for p in out.iterdir() if p.is_file()))
    wall, _, stdout, _ = run_tree(cmd)
    summary = json.loads(stdout)
    seconds = summary["seconds"]
    clean_seconds, clean_wall = clean
    if summary["experts_resumed"] != total or summary["experts_written"] != 0:
        raise RuntimeError(f"--resume redid experts: {summary}")
    remove_tree(out)
    gb = source_bytes / 1e9
    rate = source_bytes / 1e6 / summary["seconds"]
    return [
        figure(
            "sculpt --resume, all experts done, vs a clean sculpt",
            seconds,
            clean_seconds,
            "s",
            "<= 0.8x a clean sculpt",
            seconds <= 0.8 * clean_seconds,
            detail=f"a run stopped after its last expert ({total} experts, {gb:.2f} GB of "
            f"sources re-read and hashed, every SNR recomputed from its blob), against the "
            f"clean Q4 --jobs {cores} run, both "
            "the sculpt's own seconds as in every sculpt figure (process wall: "
            f"{wall:.2f} s and {clean_wall:.2f} s)",
        ),
        figure(
            "sculpt --resume: sources re-hashed vs read limit",
            rate,
            limit,
            "MB/s",
            "informative",
            None,
            detail="MB/s of source bytes re-read and hashed (CRC-32C) over the sculpt's own "
            "seconds, against the page-cached read limit of the checkpoint",
        ),
    ]


def vault_read_figures(vault_dir: Path, workdir: Path) -> list[dict]:
    """``smoe verify --deep`` and ``smoe export --layer 0`` against the vault's read limit,
    and the export's float32 output against the write limit."""
    vault = next(vault_dir.glob("*.smoe"))
    size = vault.stat().st_size
    best, per = read_limit([vault], "cached", threads=(1, 2))
    limit = best * 1e3

    def deep() -> None:
        report = verify_path(vault, deep=True)
        if not report.ok:
            raise RuntimeError(f"verify --deep found errors in {vault}")

    t_verify = best_time(deep, repeat=2)
    out = workdir / "export-layer0.safetensors"
    with Vault.open(vault) as v:
        counts = v.layers()
    layer_in = size * counts[0] / sum(counts.values())  # layer 0's share of the blobs

    def one_export() -> None:
        export(vault, out, layer=0)

    t_export = best_time(one_export, repeat=2)
    f32 = out.stat().st_size
    out.unlink()
    write, ways = write_limit(workdir, f32)
    return [
        figure(
            "smoe verify --deep vs read limit of the vault",
            size / 1e6 / t_verify,
            limit,
            "MB/s",
            "informative",
            None,
            summary=True,
            detail=f"the {size / 1e6:.0f} MB Q4 vault with its manifest (CRC-32C of every "
            f"blob), page-cached, in-process; read limit best of {describe(per)}",
        ),
        figure(
            "smoe export --layer 0 vs read limit of the vault",
            layer_in / 1e6 / t_export,
            limit,
            "MB/s",
            "informative",
            None,
            summary=True,
            detail=f"MB/s of vault bytes in; writes {f32 / 1e9:.2f} GB of float32, in-process",
        ),
        figure(
            "smoe export --layer 0: float32 out vs writing a file of its size, fsynced",
            f32 / 1e6 / t_export,
            write * 1e3,
            "MB/s",
            "informative: the write limit",
            None,
            summary=True,
            detail=f"{f32 / 1e9:.2f} GB of float32 out, best of 2 runs, in-process; the limit: "
            f"best of {describe_ways(ways)}",
        ),
    ]
