"""Fuzz target 2: mutations of config.json, read by two consumers.

* ``sculpt``: the whole conversion (first MoE layer, first expert: the config is read in
  full all the same), tensors being the authority for structure;
* ``upgrade --config``: ``arch_from_config`` on the config alone, then ``ArchInfo.check``
  and packing of the arch block, as ``smoe upgrade --config`` does.

Each mutation carries its verdict (see ``fuzz.config_mutators``); ``same`` means the
vault bytes (sculpt) or the arch block (upgrade --config) equal the unmutated config's.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from fuzz.config_mutators import ConfigCase, expectation, mutate
from fuzz.oracle import CaseReport, Outcome, attempt, cli_verdict
from fuzz.st_target import CHECKPOINTS, convertible

if TYPE_CHECKING:
    from smoe.format.records import ArchInfo
    from smoe.sculpt import SculptResult


class _Small(TypedDict):
    """The SculptOptions fields of the small sculpt (first MoE layer, first expert)."""

    max_layers: int
    max_experts: int


SMALL: _Small = {"max_layers": 1, "max_experts": 1}
TYPE_WORDS = ("integer", "boolean", "string", "object", "number")


@dataclass(frozen=True)
class Base:
    """A convertible checkpoint, its config and the outputs of its unmutated config."""

    name: str
    dir: Path
    cfg: dict
    rows: int  # gate rows of the first expert (what upgrade --config takes from the vault)
    ffn_fallback: bool  # no dense layer 0, no shared expert: ffn_dim comes from the config
    vault: bytes
    arch: ArchInfo


def _sculpt(model: Path, out: Path) -> SculptResult:
    from smoe.sculpt import SculptOptions, sculpt

    # not a dry run: sculpt returns a SculptResult
    return cast("SculptResult", sculpt(model, out, SculptOptions(**SMALL)))


def config_only(path: Path, rows: int) -> ArchInfo:
    """What ``smoe upgrade --config PATH`` computes before touching the vault."""
    from smoe.families.config import arch_from_config, load_config
    from smoe.format.records import arch_record

    arch, _ = arch_from_config(load_config(path), str(path), rows)
    arch.check()
    arch_record(arch)
    return arch


def setup(work: Path) -> list[Base]:
    from smoe.sculpt.source.checkpoint import Checkpoint

    bases = []
    for name in convertible():
        model = work / name / name
        shutil.copytree(CHECKPOINTS / name, model)
        ck = Checkpoint.open(model)
        rows = next(iter(ck.experts.values())).shapes[0][0]
        result = _sculpt(model, work / name / "out")
        bases.append(
            Base(
                name,
                CHECKPOINTS / name,
                json.loads((model / "config.json").read_text()),
                rows,
                ck.dense_ffn_dim() == 0 and ck.shared_expert_ffn_dim() == 0,
                result.vault.read_bytes(),
                config_only(model / "config.json", rows),
            )
        )
    return bases


def lenient(raw: bytes) -> dict | None:
    """The config as Python's json module reads it (last duplicate wins), or None."""
    try:
        obj = json.loads(raw.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):
        return None
    if isinstance(obj, dict) and isinstance(obj.get("text_config"), dict):
        obj = obj["text_config"]
    return obj if isinstance(obj, dict) else None


def judge(
    expect: str, case: ConfigCase, out: Outcome, same: Callable[[object], bool]
) -> str | None:
    """A failure text, or None when ``out`` is what ``expect`` allows."""
    if out.failed:
        return out.line()
    msg = out.message
    if expect == "refuse":
        if out.status == "accepted":
            return f"accepted; must be refused naming {case.names()!r}"
        if case.names() not in msg:
            return f"refused without naming {case.names()!r}: {msg}"
    elif expect == "same":
        if out.status == "refused":
            return f"refused the same values spelled differently: {msg}"
        if not same(out.value):
            return "output differs from the unmutated config's"
    elif expect == "valid" and out.status == "refused" and case.key:
        leaf = case.key.rsplit(".", 1)[-1]
        if leaf in msg and "expected" in msg and any(w in msg for w in TYPE_WORDS):
            return f"refused a valid value as a wrong type: {msg}"
    return None


def one_case(
    seed: int, case: int, bases: list[Base], work: Path, limit: float, cli: bool
) -> CaseReport:
    rng = random.Random(f"config:{seed}:{case}")
    base = rng.choice(bases)
    mutator, cc = mutate(rng, base.cfg)
    model = work / base.name
    shutil.copytree(base.dir, model)
    (model / "config.json").write_bytes(cc.raw)
    mutated = lenient(cc.raw)
    rep = CaseReport(case, base.name, mutator, cc.what, "", detail={"key": cc.key})

    sculpted = attempt(lambda: _sculpt(model, work / "out"), limit)
    alone = attempt(lambda: config_only(model / "config.json", base.rows), limit)
    rep.verdict = sculpted.status
    consumers = (
        ("sculpt", sculpted, base.ffn_fallback, lambda r: r.vault.read_bytes() == base.vault),
        ("upgrade --config", alone, None, lambda a: a == base.arch),
    )
    for consumer, out, ffn_fallback, same in consumers:
        expect = expectation(cc, mutated, ffn_fallback)
        rep.detail[consumer] = f"expect {expect}; {out.line()[:300]}"
        rep.counters[f"expect_{expect}"] = rep.counters.get(f"expect_{expect}", 0) + 1
        problem = judge(expect, cc, out, same)
        if problem:
            rep.failures.append(f"{consumer}: {problem}")
    if cli:
        rep.counters["cli_runs"] = 1
        args = [
            "sculpt",
            str(model),
            str(work / "cli-out"),
            "--max-layers",
            "1",
            "--max-experts",
            "1",
        ]
        problem = cli_verdict(args, sculpted)
        if problem:
            rep.failures.append(problem)
    return rep
