"""What quantisation costs a trained model: bits per byte on held-out text.

The model is ``tiny-moe-py`` (``shared/models/tiny-moe-py`` beside the repository, see its
README.md): a trained byte-level Qwen3-MoE (4 layers, 16 experts of width 128, vocab 256,
no tokenizer), its BF16 checkpoint in ``model/``, ``calib_ids.npy`` and ``eval_ids.npy``
(int32 [1020, 257], disjoint held-out Python source) and ``imatrix.gguf`` (llama-imatrix's
layout, measured over the calibration text). Without that folder the section says so in one
line and records nothing.

Each variant is sculpted by the CLI in a fresh process (``smoe sculpt --bits B ...``, its
wall time and peak RSS measured by :func:`bench.figures.peak_rss_of`), exported back with
``smoe export VAULT OUT --hf``, and loaded with transformers
(``AutoModelForCausalLM.from_pretrained``, float32, CPU, the usable cores): bits per byte is
the mean next-byte cross-entropy over ``eval_ids`` (inputs ``[:, :256]``, targets
``[:, 1:]``, batches of :data:`BATCH` rows) in nats over ln 2. The variants: the BF16
checkpoint itself (the baseline, 1.2142 on CPU float32 in the model's README), Q4 and Q2
plain, with ``--imatrix imatrix.gguf``, and with ``--calibrate calib_ids.npy``. The last two
need a ``--calibrate`` option of ``smoe sculpt``; when its ``--help`` has none they are
recorded as not measured (value null, no pass or fail).

Figures: bits/byte of each variant against BF16's (informative); its loss, bits/byte less
BF16's (informative; ratio = the loss as a fraction of BF16's bits/byte); the goals, each
limit measured in the same run: Q2 ``--calibrate`` loss <= 0.5x plain Q2's, Q4
``--calibrate`` loss <= 0.85x plain Q4's, and the Q2 ``--calibrate`` sculpt's wall time
(interpreter start to exit) < 120 s, a goal set for 2 cores; informative: that sculpt's time
and peak RSS against the plain Q2 sculpt's, and the imatrix's loss against plain.

``quick`` runs BF16, Q2 and Q2 ``--calibrate`` only (no Q4 or imatrix figures).

Run ``python -m bench --only quality [--quick]``; :func:`run` returns the figures.
Temporary outputs (vaults, exported checkpoints) go under the workdir, one folder per
variant, removed once it is measured.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.figures import figure, peak_rss_of
from smoe.plumbing.cpus import usable_cores

ROOT = Path(__file__).resolve().parent.parent
MODEL_HOME = ROOT.parent / "shared" / "models" / "tiny-moe-py"
"""The trained model's folder: ``model/``, ``calib_ids.npy``, ``eval_ids.npy``,
``imatrix.gguf``."""

INPUTS = 256
"""Inputs per row of ``eval_ids`` (its 257th column is the last target only)."""
BATCH = 64
"""Rows of ``eval_ids`` per forward pass."""
BF16_README = 1.2142
"""The BF16 checkpoint's CPU float32 bits/byte in the model's README (a cross-check)."""

CALIB_LOSS_GOAL = {2: 0.5, 4: 0.85}
"""Per bit width, the most loss ``--calibrate`` may keep, as a fraction of plain's."""
CALIB_SECONDS_GOAL = 120.0
"""Wall seconds the Q2 ``--calibrate`` sculpt may take (a goal set for 2 cores)."""

NO_CALIBRATE = "sculpt has no --calibrate"


@dataclass(frozen=True)
class Variant:
    """One way of making the model: the BF16 checkpoint (``bits`` None) or a vault."""

    label: str
    bits: int | None = None
    how: str = "plain"  # plain, imatrix, calibrate

    @property
    def folder(self) -> str:
        return self.label.replace(" ", "-").replace("--", "")


@dataclass
class Result:
    """A variant's measurements; ``bpb`` None when it was not measured (``why``)."""

    variant: Variant
    bpb: float | None = None
    why: str | None = None
    sculpt_s: float | None = None
    sculpt_own_s: float | None = None
    rss: int | None = None
    eval_s: float | None = None


BF16 = Variant("BF16")
VARIANTS = (
    BF16,
    Variant("Q4", 4),
    Variant("Q2", 2),
    Variant("Q4 --imatrix", 4, "imatrix"),
    Variant("Q2 --imatrix", 2, "imatrix"),
    Variant("Q4 --calibrate", 4, "calibrate"),
    Variant("Q2 --calibrate", 2, "calibrate"),
)
QUICK = ("BF16", "Q2", "Q2 --calibrate")


def has_calibrate() -> bool:
    """Whether ``smoe sculpt`` has a ``--calibrate`` option (its ``--help`` names one)."""
    proc = subprocess.run(
        [sys.executable, "-m", "smoe", "sculpt", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return "--calibrate" in proc.stdout


def bits_per_byte(model_dir: Path, ids: np.ndarray, batch: int = BATCH) -> float:
    """Mean next-byte cross-entropy (bits) of the checkpoint in ``model_dir``, float32 on
    the CPU, over ``ids`` (inputs ``[:, :INPUTS]``, targets ``[:, 1:]``)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    threads = torch.get_num_threads()
    torch.set_num_threads(usable_cores())
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        model.eval()
        x = torch.from_numpy(ids[:, :INPUTS].astype(np.int64))
        y = torch.from_numpy(ids[:, 1 : INPUTS + 1].astype(np.int64))
        nats = 0.0
        with torch.no_grad():
            for at in range(0, len(x), batch):
                logits = model(input_ids=x[at : at + batch]).logits
                nats += float(
                    F.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]),
                        y[at : at + batch].reshape(-1),
                        reduction="sum",
                    )
                )
        del model
    finally:
        hf_logging.enable_progress_bar()
        torch.set_num_threads(threads)
    return nats / y.numel() / math.log(2)


def sculpt_cmd(v: Variant, out: Path) -> list[str]:
    assert v.bits is not None
    cmd = [sys.executable, "-m", "smoe", "sculpt", str(MODEL_HOME / "model"), str(out)]
    cmd += ["--bits", str(v.bits), "--json"]
    if v.how == "imatrix":
        cmd += ["--imatrix", str(MODEL_HOME / "imatrix.gguf")]
    elif v.how == "calibrate":
        cmd += ["--calibrate", str(MODEL_HOME / "calib_ids.npy")]
    return cmd


def measure(v: Variant, workdir: Path, ids: np.ndarray) -> Result:
    """Sculpt, export and evaluate one variant (the BF16 checkpoint: evaluate only)."""
    if v.bits is None:
        t = time.perf_counter()
        bpb = bits_per_byte(MODEL_HOME / "model", ids)
        return Result(v, bpb, eval_s=time.perf_counter() - t)
    folder = workdir / v.folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        seconds, rss, stdout = peak_rss_of(sculpt_cmd(v, folder / "vault"))
        summary = json.loads(stdout)
        hf = folder / "hf"
        export = [sys.executable, "-m", "smoe", "export", summary["vault"], str(hf), "--hf"]
        proc = subprocess.run(export, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(export)} failed ({proc.returncode}): {proc.stderr[-2000:]}"
            )
        t = time.perf_counter()
        bpb = bits_per_byte(hf, ids)
        eval_s = time.perf_counter() - t
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Result(v, bpb, None, seconds, summary["seconds"], rss, eval_s)


def not_measured(name: str, unit: str, goal: str, why: str, summary: bool = False) -> dict:
    """A figure that could not be measured: no value, no verdict, the reason in the name."""
    out = figure(
        f"{name} (not measured: {why})",
        0.0,
        None,
        unit,
        goal,
        None,
        detail=f"not measured: {why}",
        summary=summary,
    )
    out["ours"] = None
    return out


def figures(results: dict[str, Result], cores: int) -> list[dict]:
    bf16 = results["BF16"].bpb
    assert bf16 is not None
    figs = [
        figure(
            "BF16 checkpoint: bits/byte on eval_ids (the baseline)",
            bf16,
            None,
            "bits/byte",
            "informative",
            None,
            detail=f"float32 on the CPU; the model's README says {BF16_README} "
            f"({bf16 - BF16_README:+.4f} here)",
            summary=True,
        )
    ]

    def loss(label: str) -> float | None:
        bpb = results[label].bpb if label in results else None
        return None if bpb is None else bpb - bf16

    for label, r in results.items():
        if label == "BF16":
            continue
        if r.bpb is None:
            assert r.why is not None
            figs.append(not_measured(f"{label}: bits/byte", "bits/byte", "informative", r.why))
            continue
        figs.append(
            figure(
                f"{label}: bits/byte vs BF16",
                r.bpb,
                bf16,
                "bits/byte",
                "informative",
                None,
                detail=f"sculpt {r.sculpt_s:.1f} s wall, evaluation {r.eval_s:.1f} s",
            )
        )
        lost = r.bpb - bf16
        figs.append(
            figure(
                f"{label}: loss (bits/byte - BF16's)",
                lost,
                bf16,
                "bits/byte",
                "informative",
                None,
                ratio=lost / bf16,
                detail="baseline: BF16's bits/byte; ratio: the loss as a fraction of it",
                summary=r.variant.how == "plain",
            )
        )
    for bits in (2, 4):
        plain, imat = loss(f"Q{bits}"), loss(f"Q{bits} --imatrix")
        if plain is not None and imat is not None:
            figs.append(
                figure(
                    f"Q{bits} --imatrix loss vs plain Q{bits} loss",
                    imat,
                    plain,
                    "bits/byte",
                    "informative: the imatrix's gain",
                    None,
                    detail=f"gain {plain - imat:+.4f} bits/byte; ratio = imatrix / plain loss",
                )
            )
    for bits in (2, 4):
        label = f"Q{bits} --calibrate"
        if f"Q{bits}" not in results:
            continue  # --quick: no Q4
        frac = CALIB_LOSS_GOAL[bits]
        name = f"Q{bits} --calibrate loss vs {frac:g}x plain Q{bits} loss"
        goal = f"<= {frac:g}x plain Q{bits} loss"
        plain, calib = loss(f"Q{bits}"), loss(label)
        if calib is None or plain is None:
            why = results[label].why or "not run"
            figs.append(not_measured(name, "bits/byte", goal, why, summary=True))
            continue
        figs.append(
            figure(
                name,
                calib,
                frac * plain,
                "bits/byte",
                goal,
                bool(calib <= frac * plain),
                detail=f"limit: {frac:g} x plain Q{bits}'s loss {plain:.4f} measured in this "
                f"run; calibrated loss / plain loss = {calib / plain:.3f}",
                summary=True,
            )
        )
    figs += calibration_cost(results, cores)
    return figs


def calibration_cost(results: dict[str, Result], cores: int) -> list[dict]:
    """The Q2 ``--calibrate`` sculpt's wall time (goal) and its time and peak RSS against
    the plain Q2 sculpt's (informative)."""
    cal, plain = results["Q2 --calibrate"], results["Q2"]
    name = f"Q2 --calibrate: sculpt wall time on {cores} cores (goal set for 2 cores)"
    goal = f"< {CALIB_SECONDS_GOAL:g} s on 2 cores"
    if cal.sculpt_s is None or cal.rss is None:
        why = cal.why or "not run"
        return [not_measured(name, "s", goal, why, summary=True)]
    assert plain.sculpt_s is not None and plain.rss is not None
    return [
        figure(
            name,
            cal.sculpt_s,
            CALIB_SECONDS_GOAL,
            "s",
            goal,
            bool(cal.sculpt_s < CALIB_SECONDS_GOAL),
            detail="the smoe sculpt process from start to exit (peak_rss_of); "
            f"its own summary says {cal.sculpt_own_s:.1f} s",
            summary=True,
        ),
        figure(
            "Q2 --calibrate sculpt vs plain Q2 sculpt: wall time",
            cal.sculpt_s,
            plain.sculpt_s,
            "s",
            "informative: what calibration adds",
            None,
            detail=f"process wall times; their own summaries: {cal.sculpt_own_s:.1f} s and "
            f"{plain.sculpt_own_s:.1f} s",
            summary=True,
        ),
        figure(
            "Q2 --calibrate sculpt vs plain Q2 sculpt: peak RSS",
            cal.rss / 2**20,
            plain.rss / 2**20,
            "MiB",
            "informative",
            None,
            detail="ru_maxrss of the sculpt's processes (the largest one), both runs",
            summary=True,
        ),
    ]


def run(workdir: Path, quick: bool = False) -> list[dict]:
    if not MODEL_HOME.is_dir():
        print(f"quality: {MODEL_HOME} is absent: nothing measured")
        return []
    workdir.mkdir(parents=True, exist_ok=True)
    ids = np.load(MODEL_HOME / "eval_ids.npy")
    if ids.ndim != 2 or ids.shape[1] < INPUTS + 1:
        raise RuntimeError(f"eval_ids.npy: shape {ids.shape}, expected [rows, {INPUTS + 1}]")
    chosen = [v for v in VARIANTS if not quick or v.label in QUICK]
    if quick:
        print(f"quality: --quick: {', '.join(QUICK)} only")
    calibrate = has_calibrate()
    results: dict[str, Result] = {}
    for v in chosen:
        if v.how == "calibrate" and not calibrate:
            results[v.label] = Result(v, why=NO_CALIBRATE)
            print(f"quality: {v.label}: not measured ({NO_CALIBRATE})")
            continue
        r = results[v.label] = measure(v, workdir, ids)
        sculpt = "" if r.sculpt_s is None else f"sculpt {r.sculpt_s:.1f} s, "
        print(f"quality: {v.label}: {r.bpb:.4f} bits/byte ({sculpt}evaluation {r.eval_s:.1f} s)")
    return figures(results, usable_cores())


def main(argv: list[str] | None = None) -> int:
    """Print the figures; exit status 1 if any misses its goal."""
    argv = sys.argv[1:] if argv is None else argv
    figs = run(ROOT / "build" / "bench-data" / "quality", quick="--quick" in argv)
    for fig in figs:
        verdict = {True: "pass", False: "FAIL", None: "-"}[fig["pass"]]
        print(f"{fig['name']}: {fig['ours']} vs {fig['baseline']} {fig['unit']} ({verdict})")
    return 1 if any(fig["pass"] is False for fig in figs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
