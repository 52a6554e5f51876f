"""`make bench`'s tables: each section shows every figure, the closing table fits a screen."""

from __future__ import annotations

import sys

from rich.console import Console

from fixtures_data import ROOT

sys.path.insert(0, str(ROOT))  # bench/ is not installed
from bench.__main__ import SECTIONS, figure_table, in_summary, summary_table
from bench.figures import figure


def _figures() -> list[dict]:
    figs = [
        figure("encode per core", 1700.0, None, "MB/s", ">= 1000", True),
        figure("sculpt cold vs read limit", 1100.0, 2500.0, "MB/s", ">= 0.70", False),
        figure(
            "cold vs read+write limit", 1100.0, 1800.0, "MB/s", "the disk bound", None, summary=True
        ),
        figure("latency p50", 3.0, None, "ms", "reported", None),
    ]
    for f in figs:
        f["section"] = "sculpt"
    return figs


def _render(table, width: int = 160) -> str:
    console = Console(width=width, color_system=None)
    with console.capture() as out:
        console.print(table)
    return out.get()


def test_summary_has_goals_and_marked_bounds_only():
    figs = _figures()
    assert [in_summary(f) for f in figs] == [True, True, True, False]
    assert "summary" not in figs[0] and figs[2]["summary"] is True
    text = _render(summary_table(figs, 160))
    assert "sculpt: encode per core" in text
    assert "sculpt: cold vs read+write limit" in text
    assert "latency p50" not in text
    assert (
        "1 pass, 1 fail, 2 informative (1 of them only in the section tables above); "
        "full names and numbers in build/bench.json"
    ) in " ".join(text.split())


def test_section_table_shows_every_figure():
    text = _render(figure_table(_figures(), 160, "sculpt: every figure"))
    for name in ("encode per core", "sculpt cold vs read limit", "latency p50"):
        assert f"sculpt: {name}" in text
    assert "FAIL" in text and "pass" in text


def test_every_section_has_a_module_with_run():
    import importlib

    for section in SECTIONS:
        assert callable(importlib.import_module(f"bench.{section}_bench").run)
