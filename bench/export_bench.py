"""`smoe export --hf` on a synthetic checkpoint with Qwen3-30B-A3B expert shapes.

d_model 2048, expert ffn 768, 128 experts per layer, 2 layers (1 with ``quick``), BF16;
sculpted at Q4 once (kept between runs), then exported back to a BF16 checkpoint folder
by the CLI in a fresh process. Throughput is MB/s of BF16 expert weights out (the
``expert_bytes_out`` of the export's own summary over its own seconds, best of 2 runs);
the baselines, measured in the same run, are the cached-read limit (the best of 1- and
2-thread positioned reads of a file of the export's size held in the page cache) and the
write limit (writing a file of that size, fsynced, buffered or O_DIRECT), which bounds an
export that decodes faster than the disk takes its output. Peak RSS is
the export process's own (``ru_maxrss``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import cast

import numpy as np

from bench.figures import figure, peak_rss_of
from bench.machine_bench import describe, describe_ways, read_limit, write_limit
from bench.sculpt_bench import checkpoint
from smoe.sculpt import SculptOptions, SculptResult, sculpt

RSS_GOAL = 256 << 20
"""Peak RSS the export may use whatever the model's size (one tensor is ~6 MB of f32)."""


def vault(workdir: Path, layers: int) -> Path:
    """The Q4 vault of the synthetic checkpoint (made once, kept)."""
    name = f"qwen3-30b-a3b-shapes-{layers}l"
    out = workdir / f"{name}-q4"
    path = out / f"{name}.smoe"
    if path.exists():
        return path
    # not a dry run: sculpt returns a SculptResult
    result = cast(
        SculptResult, sculpt(checkpoint(workdir, layers), out, SculptOptions(bits=4, jobs=2))
    )
    return result.vault


def scratch(workdir: Path, nbytes: int) -> Path:
    """A file of ``nbytes`` (random bytes) to measure the cached-read limit on."""
    path = workdir / "export-size.bin"
    if not path.exists() or path.stat().st_size != nbytes:
        block = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
        with path.open("wb") as f:
            for at in range(0, nbytes, len(block)):
                f.write(block[: min(len(block), nbytes - at)])
    return path


def run(workdir: Path, quick: bool = False) -> list[dict]:
    workdir.mkdir(parents=True, exist_ok=True)
    src = vault(workdir, 1 if quick else 2)
    out = workdir / "export-hf"
    best_mb_s, peak, summary = 0.0, 0, {}
    for _ in range(2):
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "smoe", "export", str(src), str(out), "--hf", "--json"]
        _, rss, stdout = peak_rss_of(cmd)
        summary = json.loads(stdout)
        best_mb_s = max(best_mb_s, summary["expert_bytes_out"] / 1e6 / summary["seconds"])
        peak = max(peak, rss)
    total = summary["bytes_out"]
    shutil.rmtree(out, ignore_errors=True)
    limit, per = read_limit([scratch(workdir, total)], "cached", threads=(1, 2))
    limit_mb_s = limit * 1e3
    write, ways = write_limit(workdir, total)
    gb = summary["expert_bytes_out"] / 1e9
    return [
        figure(
            f"export --hf: MB/s of BF16 expert weights out ({gb:.2f} GB, Q4 in) vs the "
            f"cached-read limit of a file of the same size ({describe(per)})",
            best_mb_s,
            limit_mb_s,
            "MB/s",
            "informative",
            None,
            summary=True,
        ),
        figure(
            "export --hf vs writing a file of its size, fsynced",
            best_mb_s,
            write * 1e3,
            "MB/s",
            "informative: the write limit",
            None,
            summary=True,
            detail=f"the limit: best of {describe_ways(ways)}; {total / 1e9:.2f} GB written "
            "by the export (its commit fsyncs it)",
        ),
        figure(
            "export --hf: peak RSS of the export process",
            peak / 2**20,
            RSS_GOAL / 2**20,
            "MiB",
            f"<= {RSS_GOAL >> 20} MiB whatever the model's size",
            peak <= RSS_GOAL,
            ratio=peak / RSS_GOAL,
        ),
    ]
