"""Fuzz target 1: structural mutations of one shard header of a bundled checkpoint.

Oracle: the ``safetensors`` library (``safe_open(path, framework="numpy")``). A shard it
refuses must be refused by ``Checkpoint.open`` or the sculpt, with a SmoeError; whatever
the library says, nothing but a SmoeError may escape. A sculpt that succeeds must leave a
scout ``safe_open`` reads and a vault that verifies (deep).
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from safetensors import safe_open

from fuzz.oracle import CaseReport, attempt, cli_verdict
from fuzz.st_mutators import MUTATORS, Shard

if TYPE_CHECKING:
    from smoe.sculpt import SculptResult

CHECKPOINTS = Path(__file__).resolve().parent.parent / "fixtures" / "checkpoints"


@dataclass(frozen=True)
class Base:
    """A bundled checkpoint that converts, with its shards parsed (fixtures are only read)."""

    name: str
    dir: Path
    shards: dict[str, Shard]


def convertible() -> list[str]:
    """The bundled checkpoints MANIFEST.json says a converter must accept."""
    manifest = json.loads((CHECKPOINTS / "MANIFEST.json").read_text())
    return sorted(n for n, c in manifest["checkpoints"].items() if c.get("expect") == "convert")


def setup(work: Path) -> list[Base]:
    bases = []
    for name in convertible():
        d = CHECKPOINTS / name
        shards = {p.name: Shard.parse(p.read_bytes()) for p in sorted(d.glob("*.safetensors"))}
        bases.append(Base(name, d, shards))
    return bases


def reference(path: Path) -> str | None:
    """None if the safetensors library opens the shard, else its reason."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            f.keys()
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None


def check_outputs(result: SculptResult) -> str | None:
    """A successful sculpt's scout opens with safe_open and its vault verifies (deep)."""
    from smoe.format.verify import verify_path

    scout = reference(result.scout)
    if scout is not None:
        return f"the scout does not open with safetensors: {scout}"
    report = verify_path(result.vault, deep=True)
    if report.errors:
        return f"the vault does not verify: {report.errors[0].line()}"
    return None


def one_case(
    seed: int, case: int, bases: list[Base], work: Path, limit: float, cli: bool
) -> CaseReport:
    from smoe.sculpt import SculptOptions, sculpt
    from smoe.sculpt.source.checkpoint import Checkpoint

    rng = random.Random(f"safetensors:{seed}:{case}")
    base = rng.choice(bases)
    shard = rng.choice(sorted(base.shards))
    mutator = rng.choice(sorted(MUTATORS))
    blob, what = MUTATORS[mutator](rng, base.shards[shard])
    model = work / base.name
    shutil.copytree(base.dir, model)
    (model / shard).write_bytes(blob)
    ref = reference(model / shard)
    rep = CaseReport(
        case, base.name, mutator, f"{shard}: {what}", "", detail={"reference": ref or "accepted"}
    )
    rep.counters["reference_refused" if ref else "reference_accepted"] = 1

    opened = attempt(lambda: Checkpoint.open(model), limit)
    run = opened
    if opened.status == "accepted":
        run = attempt(lambda: sculpt(model, work / "out", SculptOptions()), limit)
    rep.verdict = run.status
    rep.detail["ours"] = run.line()[:400]
    where = "Checkpoint.open" if run is opened else "sculpt"
    if run.failed:
        rep.failures.append(f"{where}: {run.line()}")
    elif ref and run.status == "accepted":
        rep.failures.append(f"accepted a shard the safetensors library refuses ({ref})")
    elif ref and opened.status == "accepted":
        rep.counters["refused_by_sculpt_not_open"] = 1
    elif not ref and run.status == "refused":
        rep.counters["refused_where_reference_accepts"] = 1
    if run.status == "accepted":
        # accepted: run is the sculpt's (not a dry run), its value a SculptResult
        checked = attempt(lambda: check_outputs(cast("SculptResult", run.value)), limit)
        if checked.failed or checked.status == "refused" or checked.value:
            rep.failures.append(f"outputs: {checked.value or checked.line()}")
    if cli:
        rep.counters["cli_runs"] = 1
        problem = cli_verdict(["sculpt", str(model), str(work / "cli-out")], run)
        if problem:
            rep.failures.append(problem)
    return rep
