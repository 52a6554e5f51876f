"""What the README offers to run from a clone only (issue 33): ``python -m smoe_testkit.synth``
is a checkout's tool, not in the wheel (tests/package/test_installed.py checks the wheel
lacks it), so every README mention says where it runs, and it runs there."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from fixtures_data import ROOT
from helpers import run

README = (ROOT / "README.md").read_text(encoding="utf-8")


def paragraphs_naming(text: str, what: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if what in p]


def test_every_readme_mention_of_the_testkit_says_it_runs_from_a_clone() -> None:
    found = paragraphs_naming(README, "python -m smoe_testkit")
    assert found  # the README offers it
    for paragraph in found:
        assert "From a clone" in paragraph or "from a clone" in paragraph, paragraph


def test_the_synth_tool_runs_from_a_clones_root_and_not_elsewhere(tmp_path: Path) -> None:
    here = run("-m", "smoe_testkit.synth", "--help", command=[sys.executable], cwd=ROOT)
    assert here.returncode == 0 and "sparse-vault" in here.stdout, here.stderr
    elsewhere = run("-m", "smoe_testkit.synth", "--help", command=[sys.executable], cwd=tmp_path)
    assert elsewhere.returncode != 0 and "No module named 'smoe_testkit'" in elsewhere.stderr
