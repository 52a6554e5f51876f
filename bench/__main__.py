"""`make bench`: run every benchmark, end with one table, write build/bench.json.

    python -m bench [--quick]
        [--only machine,quant,imatrix,sculpt,checkpoint,export,reader,harness,quality,stream]

Each section ends with a table of its figures, one line each: the value, the limit or
baseline it is held against (measured in the same run), the ratio, the goal and whether it
passes. The closing table fits one screen: every figure with a goal, and the informative
figures that say what bounds one that misses its goal. The full figure names and every
number are in build/bench.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


WORKDIR = {
    "machine": "machine",
    "quant": None,
    "imatrix": "imatrix",
    "sculpt": "sculpt",
    "checkpoint": "sculpt",  # the sculpt section's checkpoint
    "export": "export",
    "reader": "reader",
    "harness": "harness",
    "quality": "quality",  # needs ../shared/models/tiny-moe-py, else says so
    "stream": "stream",  # (c) needs ../shared/models/tiny-moe-py, else says so
}
"""Per section, its folder under build/bench-data (None: it needs none)."""
SECTIONS = tuple(WORKDIR)


def in_summary(f: dict) -> bool:
    """Whether the closing table shows ``f``: every figure with a goal, and the informative
    ones marked ``summary`` (what bounds a figure that misses its goal)."""
    return f["pass"] is not None or bool(f.get("summary"))


def figure_table(figures: list[dict], width: int, title: str) -> Table:
    """One line per figure: section: name (cut to fit), value, limit, ratio, goal, pass."""
    table = Table(title=title, title_justify="left", box=None, pad_edge=False, show_edge=False)
    numbers = 9 * 3 + 10 + 26 + 5 + 7 * 2  # value, limit, ratio, unit, goal, pass, padding
    table.add_column("figure", no_wrap=True, overflow="ellipsis", max_width=width - numbers)
    for col in ("value", "limit", "ratio"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("unit", no_wrap=True, max_width=10, overflow="ellipsis")
    table.add_column("goal", no_wrap=True, max_width=26, overflow="ellipsis")
    table.add_column("pass", no_wrap=True)
    for f in figures:
        verdict = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "-"}[f["pass"]]
        table.add_row(
            f"{f['section']}: {f['name']}",
            _fmt(f["ours"]),
            _fmt(f["baseline"]),
            _fmt(f["ratio"]),
            f["unit"],
            f["goal"],
            verdict,
        )
    return table


def summary_table(figures: list[dict], width: int) -> Table:
    """The closing one-screen table: the figures :func:`in_summary` picks; its caption
    counts them all."""
    table = figure_table(
        [f for f in figures if in_summary(f)],
        width,
        "smoe benchmarks: each figure against a limit or baseline measured in the same run",
    )
    passed = sum(f["pass"] is True for f in figures)
    failed = sum(f["pass"] is False for f in figures)
    left_out = sum(not in_summary(f) for f in figures)
    table.caption = (
        f"{passed} pass, {failed} fail, {len(figures) - passed - failed} informative "
        f"({left_out} of them only in the section tables above); full names and numbers "
        "in build/bench.json"
    )
    table.caption_justify = "left"
    return table


def run_section(section: str, work: Path, quick: bool) -> list[dict]:
    """The figures of one section (its module ``bench.<section>_bench``)."""
    if section not in WORKDIR:
        raise SystemExit(f"unknown section {section!r}; choose from {', '.join(SECTIONS)}")
    module = importlib.import_module(f"bench.{section}_bench")
    folder = WORKDIR[section]
    figs: list[dict] = module.run(quick) if folder is None else module.run(work / folder, quick)
    for f in figs:
        f["section"] = section
    return figs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller inputs, for a smoke run")
    ap.add_argument("--only", help="comma-separated sections: " + ",".join(SECTIONS))
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench.json")
    args = ap.parse_args()
    work = ROOT / "build" / "bench-data"
    work.mkdir(parents=True, exist_ok=True)
    chosen = args.only.split(",") if args.only else list(SECTIONS)
    console = Console(width=max(Console().width, 150))
    figures: list[dict] = []
    for section in chosen:
        t = time.perf_counter()
        console.print(f"[bold]bench:[/] {section} ...")
        figs = run_section(section, work, args.quick)
        figures.extend(figs)
        console.print(f"      {len(figs)} figures in {time.perf_counter() - t:.1f} s")
        console.print(figure_table(figs, console.width, f"{section}: every figure"))
    console.print(summary_table(figures, console.width))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"quick": args.quick, "figures": figures}, indent=1) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
