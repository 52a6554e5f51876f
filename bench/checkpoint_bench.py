"""Reading a checkpoint's experts: our reader (:class:`smoe.sculpt.expert_reader.ExpertReader`,
positioned reads into reused buffers) against the ``safetensors`` library
(:class:`smoe_testkit.library_reader.LibraryReader`, ``safe_open`` + ``get_slice`` over mmap),
on the sculpt benchmark's checkpoint (Qwen3-30B-A3B expert shapes, BF16, one shard).

Each reader reads every expert once (``read``, CRC-32C included, as the sculptor does) in
a process of its own, the shard page-cached; the process reports its reading seconds
(start-up and opening the checkpoint left out) and its peak RSS is ``ru_maxrss``. The
memory figure holds the library's peak RSS against ours (goal: within 10 %); the
interpreter's own floor (a process that opens the checkpoint and reads nothing) is in the
detail. Throughput of each is held against the page-cached read limit of the shard
(:func:`bench.machine_bench.read_limit`, best of 1 and 2 threads).

The sculpt as a whole (``smoe sculpt --bits 4 --jobs`` = the usable cores, page-cached) is
also run with each reader (the library's put in place of ``smoe.sculpt.workers.ExpertReader`` in
the child before it forks its workers): peak RSS of the process tree, as the sculpt
section measures it, and MB/s.

    python -m bench.checkpoint_bench [--quick] [WORKDIR]     # the figures, standalone
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.figures import figure, peak_rss_of
from bench.machine_bench import describe, read_limit, warm
from bench.sculpt_bench import checkpoint, remove_tree, run_tree
from smoe.plumbing.cpus import usable_cores
from smoe_testkit.library_reader import LibraryReader

READERS = {"smoe": "ExpertReader", "safetensors": "LibraryReader"}
GOAL = 1.10  # the library's peak RSS at most this times ours
REPEAT = 3


def _decision(lib: float, ours: float) -> str:
    """What the memory figure decides: the safetensors library reads checkpoints by default
    only if its peak RSS is within 10 % of our reader's (issue: keep the bounded memory)."""
    if lib <= GOAL * ours:
        return "within 10 %: the library could be the default reader"
    return (
        f"{lib / ours:.2f}x ours, over the 10 % allowed: our ExpertReader stays the default "
        "(LibraryReader is also exposed to SIGBUS when a shard shrinks)"
    )


def child(reader: str, ckpt: Path) -> dict:
    """In the measured process: read every expert with ``reader`` ("smoe",
    "safetensors" or "none" for the floor); bytes and seconds of the reads."""
    from smoe.sculpt.source.checkpoint import Checkpoint

    ck = Checkpoint.open(ckpt)
    refs = list(ck.experts.values())
    if reader == "none":
        return {"bytes": 0, "seconds": 0.0, "experts": 0}
    from smoe.sculpt.expert_reader import ExpertReader

    total = 0
    with ExpertReader() if reader == "smoe" else LibraryReader() as r:
        t = time.perf_counter()
        for ref in refs:
            mats, _ = r.read(ref)
            total += sum(a.nbytes for a, _ in mats)
            del mats
        seconds = time.perf_counter() - t
    return {"bytes": total, "seconds": seconds, "experts": len(refs)}


def measure(reader: str, ckpt: Path) -> dict:
    """One child process: MB/s of its reads and its peak RSS (bytes)."""
    cmd = [sys.executable, "-m", "bench.checkpoint_bench", "--child", reader, str(ckpt)]
    _, rss, out = peak_rss_of(cmd)
    info = json.loads(out)
    info["rss"] = rss
    info["mb_s"] = info["bytes"] / 1e6 / info["seconds"] if info["seconds"] else 0.0
    return info


_SCULPT_WITH_LIBRARY = (
    "import sys\n"
    "import smoe.sculpt.workers\n"
    "from smoe_testkit.library_reader import LibraryReader\n"
    "smoe.sculpt.workers.ExpertReader = LibraryReader\n"
    "from smoe.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def sculpt_with(reader: str, ckpt: Path, out: Path, extra: list[str]) -> dict:
    """``smoe sculpt`` with ``reader``: MB/s over the sculpt's own seconds, peak tree RSS."""
    head = ["-m", "smoe"] if reader == "smoe" else ["-c", _SCULPT_WITH_LIBRARY]
    args = ["sculpt", str(ckpt), str(out), "--bits", "4", "--jobs", str(usable_cores())]
    _, rss, stdout, _ = run_tree([sys.executable, *head, *args, "--json", *extra])
    remove_tree(out)
    summary = json.loads(stdout)
    return {"rss": rss, "mb_s": summary["expert_bytes_in"] / 1e6 / summary["seconds"]}


def run(workdir: Path, quick: bool = False) -> list[dict]:
    """The figures; ``workdir`` is the sculpt section's (its checkpoint is reused)."""
    ckpt = checkpoint(workdir, 1 if quick else 2)
    shards = sorted(ckpt.glob("*.safetensors"))
    best_gb, per = read_limit(shards, "cached", threads=(1, 2))
    limit = best_gb * 1e3
    runs: dict[str, list[dict]] = {name: [] for name in (*READERS, "none")}
    for _ in range(1 if quick else REPEAT):
        for name in runs:  # interleaved, so that a noisy neighbour hits both
            warm(shards)
            runs[name].append(measure(name, ckpt))
    whole: dict[str, list[dict]] = {name: [] for name in READERS}
    extra = ["--max-experts", "32"] if quick else []
    for _ in range(1 if quick else 2):
        for name in READERS:
            warm(shards)
            whole[name].append(sculpt_with(name, ckpt, workdir / f"out-reader-{name}", extra))
    floor = max(r["rss"] for r in runs["none"])
    rss = {name: max(r["rss"] for r in runs[name]) for name in READERS}
    rate = {name: max(r["mb_s"] for r in runs[name]) for name in READERS}
    mb = runs["smoe"][0]["bytes"] / 1e6
    n = runs["smoe"][0]["experts"]
    ours, lib = rss["smoe"] / 2**20, rss["safetensors"] / 2**20
    figs = [
        figure(
            "library reader peak RSS vs our reader",
            lib,
            ours,
            "MiB",
            "library default if <= 1.1x",
            None,
            detail=f"{_decision(lib, ours)}; ru_maxrss of a process reading all {n} "
            f"experts ({mb:.0f} MB, page-cached) "
            f"with LibraryReader (safe_open + get_slice, reopened every "
            f"{LibraryReader.MAP >> 20} MiB) vs ExpertReader; "
            f"largest of {len(runs['smoe'])} runs each; the interpreter, numpy and the "
            f"opened checkpoint alone: {floor / 2**20:.0f} MiB",
        )
    ]
    tree = {name: max(r["rss"] for r in whole[name]) / 2**20 for name in READERS}
    speed = {name: max(r["mb_s"] for r in whole[name]) for name in READERS}
    figs.append(
        figure(
            "sculpt Q4 with the library reader: peak RSS vs with ours",
            tree["safetensors"],
            tree["smoe"],
            "MiB",
            "informative (see above)",
            None,
            detail=f"smoe sculpt --jobs {usable_cores()}, page-cached, the process tree's "
            f"peak RSS (sum over processes, sampled every 10 ms), largest of "
            f"{len(whole['smoe'])} runs each; MB/s with the library reader "
            f"{speed['safetensors']:.0f}, with ours {speed['smoe']:.0f}",
        )
    )
    for name, what in (
        ("smoe", "our reader (ExpertReader)"),
        ("safetensors", "library reader (safe_open + get_slice)"),
    ):
        figs.append(
            figure(
                f"{what} vs page-cached read limit",
                rate[name],
                limit,
                "MB/s",
                "informative",
                None,
                detail=f"MB/s of expert weights read and CRC-32C hashed, one thread, best of "
                f"{len(runs[name])}; read limit best of {describe(per)}",
            )
        )
    return figs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", choices=[*READERS, "none"], help=argparse.SUPPRESS)
    ap.add_argument("path", type=Path, nargs="?", default=Path("build/bench-data/sculpt"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.path)))
        return 0
    for f in run(args.path, args.quick):
        ratio = f"{f['ratio']:.3f}" if f["ratio"] is not None else "-"
        verdict = {True: "pass", False: "FAIL", None: "-"}[f["pass"]]
        print(
            f"{f['name']}: {f['ours']:,.1f} {f['unit']} (baseline {f['baseline']:,.1f}, ratio "
            f"{ratio}; {f['goal']}: {verdict})\n    {f.get('detail', '')}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
