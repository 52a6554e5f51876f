"""Structure-aware fuzzing of the sculptor's inputs: safetensors shard headers and config.json.

    python -m fuzz.inputs_target {safetensors,config} [--seed N] [--cases N] [--seconds S]
    python -m fuzz.inputs_target safetensors --seed 1 --case 17   # replay one case

Seeded (case i of seed s is always the same mutation) and time-boxed. Each case runs
in-process under a time limit; every ``cli_every``-th case also through ``python -m
smoe``. A failing case is copied to ``REPRO/<target>/s<seed>-c<case>/`` with a
``case.json`` saying what was mutated, what each side said and how to replay it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fuzz import config_target, st_target
from fuzz.oracle import ROOT, CaseReport

REPRO = ROOT / "build" / "fuzz"
CASE_LIMIT = 20.0  # seconds per in-process call; a sculpt of a bundled checkpoint takes ~30 ms
MAX_REPROS = 25
MAX_LISTED = 20
TARGETS: dict[str, tuple[Callable, Callable]] = {
    "safetensors": (st_target.setup, st_target.one_case),
    "config": (config_target.setup, config_target.one_case),
}


def scratch() -> str | None:
    """A RAM-backed temp folder if there is one: each accepted case fsyncs its outputs."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def _bump(d: dict, key: str, n: int = 1) -> None:
    d[key] = d.get(key, 0) + n


def run(
    target: str,
    cases: int,
    seconds: float,
    seed: int,
    work: Path,
    repro: Path | None = REPRO,
    cli_every: int = 40,
    first: int = 0,
    limit: float = CASE_LIMIT,
    clean: bool = True,
) -> dict:
    """Cases ``first``.. until ``cases`` are done or ``seconds`` have passed; the summary.

    ``clean``: first remove the reproducers an earlier run left for this target.
    """
    setup, one_case = TARGETS[target]
    work.mkdir(parents=True, exist_ok=True)
    bases = setup(work / "bases")
    if repro is not None and clean:
        shutil.rmtree(repro / target, ignore_errors=True)
    totals: dict[str, int] = {}
    by_mutator: dict[str, dict[str, int]] = {}
    failures: list[str] = []
    failed = 0
    t0 = time.perf_counter()
    for case in range(first, first + cases):
        if time.perf_counter() - t0 > seconds:
            break
        cdir = work / f"c{case}"
        cdir.mkdir()
        rep = one_case(seed, case, bases, cdir, limit, bool(cli_every) and case % cli_every == 0)
        _bump(totals, "cases")
        _bump(totals, rep.verdict)
        for k, v in rep.counters.items():
            _bump(totals, k, v)
        m = by_mutator.setdefault(rep.mutator, {})
        _bump(m, "cases")
        _bump(m, rep.verdict)
        if rep.failures:
            failed += 1
            _bump(m, "failures")
            saved = _save(rep, target, seed, cdir, repro) if failed <= MAX_REPROS else None
            if len(failures) < MAX_LISTED:
                failures.append(_describe(rep, seed, saved))
        shutil.rmtree(cdir, ignore_errors=True)
    return {
        "cases": totals.pop("cases", 0),
        "refused": totals.pop("refused", 0),
        "accepted": totals.pop("accepted", 0),
        "failure_count": failed,
        "failures": failures,
        **dict(sorted(totals.items())),
        "by_mutator": dict(sorted(by_mutator.items())),
        "first_case": first,
        "seed": seed,
        "ok": failed == 0,
    }


def _describe(rep: CaseReport, seed: int, saved: Path | None) -> str:
    where = f"; reproducer {saved}" if saved else ""
    return (
        f"seed {seed} case {rep.case} ({rep.mutator} on {rep.base}: {rep.what[:160]}): "
        f"{' | '.join(rep.failures)[:500]}{where}"
    )


def _save(rep: CaseReport, target: str, seed: int, cdir: Path, repro: Path | None) -> Path | None:
    if repro is None:
        return None
    dest = repro / target / f"s{seed}-c{rep.case}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copytree(cdir / rep.base, dest / rep.base)
    info = {
        "target": target,
        "seed": seed,
        "case": rep.case,
        "base": rep.base,
        "mutator": rep.mutator,
        "mutation": rep.what,
        "failures": rep.failures,
        **rep.detail,
        "replay": f"python -m fuzz.inputs_target {target} --seed {seed} --case {rep.case}",
        "cli": f"python -m smoe sculpt {dest / rep.base} OUT_DIR",
    }
    (dest / "case.json").write_text(json.dumps(info, indent=1) + "\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", choices=sorted(TARGETS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--case", type=int, help="replay this one case (and save it if it fails)")
    ap.add_argument("--cli-every", type=int, default=40, help="0: never run the CLI")
    ap.add_argument("--repro", type=Path, default=REPRO)
    args = ap.parse_args(argv)
    first, cases = (args.case, 1) if args.case is not None else (0, args.cases)
    cli_every = 1 if args.case is not None else args.cli_every
    with tempfile.TemporaryDirectory(prefix="smoe-fuzz-inputs-", dir=scratch()) as tmp:
        result = run(
            args.target,
            cases,
            args.seconds if args.case is None else 1e9,
            args.seed,
            Path(tmp),
            args.repro,
            cli_every,
            first,
            clean=args.case is None,
        )
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
