"""`make bench`: run every benchmark, end with one table, write build/bench.json.

    python -m bench [--quick] [--only machine,quant,imatrix,sculpt,checkpoint,export,reader,harness]

The table has one line per figure: its value, the limit or baseline it is held against
(measured in the same run), the ratio, the goal and whether it passes. The full figure
names and every number are in build/bench.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("machine", "quant", "imatrix", "sculpt", "checkpoint", "export", "reader", "harness")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def summary_table(figures: list[dict], width: int) -> Table:
    """One line per figure: section: name (cut to fit), value, limit, ratio, goal, pass."""
    table = Table(
        title="smoe benchmarks: each figure against a limit or baseline measured in the same run",
        title_justify="left",
        box=None,
        pad_edge=False,
        show_edge=False,
    )
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
    passed = sum(f["pass"] is True for f in figures)
    failed = sum(f["pass"] is False for f in figures)
    table.caption = (
        f"{passed} pass, {failed} fail, {len(figures) - passed - failed} "
        "informative; full names and numbers in build/bench.json"
    )
    table.caption_justify = "left"
    return table


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
        if section == "machine":
            from bench import machine_bench as m

            figs = m.run(work / "machine", args.quick)
        elif section == "quant":
            from bench import quant_bench as m

            figs = m.run(args.quick)
        elif section == "sculpt":
            from bench import sculpt_bench as m

            figs = m.run(work / "sculpt", args.quick)
        elif section == "checkpoint":
            from bench import checkpoint_bench as m

            figs = m.run(work / "sculpt", args.quick)  # the sculpt section's checkpoint
        elif section == "reader":
            from bench import reader_bench as m

            figs = m.run(work / "reader", args.quick)
        elif section == "harness":
            from bench import harness_bench as m

            figs = m.run(work / "harness", args.quick)
        elif section == "export":
            from bench import export_bench as m

            figs = m.run(work / "export", args.quick)
        elif section == "imatrix":
            from bench import imatrix_bench as m

            figs = m.run(work / "imatrix", args.quick)
        else:
            raise SystemExit(f"unknown section {section!r}; choose from {', '.join(SECTIONS)}")
        for f in figs:
            f["section"] = section
        figures.extend(figs)
        console.print(f"      {len(figs)} figures in {time.perf_counter() - t:.1f} s")
    console.print(summary_table(figures, console.width))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"quick": args.quick, "figures": figures}, indent=1) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
