"""``smoe sculpt --json`` and ``--dry-run --json`` carry their schema, and docs/JSON.md lists
every key of each document."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from fixtures_data import CKPTS, ROOT
from helpers import run, strict_json


def documented(section: str) -> set[str]:
    """Every key named in the first column of the table under ``## section`` of
    docs/JSON.md (a row may name several: `` `a`, `b` ``)."""
    text = (ROOT / "docs" / "JSON.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"^\| ([^|]+) \|", body, re.M)
    return {k for cell in cells for k in re.findall(r"`([a-z_0-9]+)`", cell)}


def test_the_summary_carries_its_schema_and_every_key_is_documented(tmp_path: Path) -> None:
    np.save(tmp_path / "c.npy", np.arange(48).reshape(4, 12) % 128)
    for extra in ([], ["--calibrate", str(tmp_path / "c.npy")]):
        out = tmp_path / f"o{len(extra)}"
        proc = run("sculpt", CKPTS / "qwen3_moe", out, "--jobs", "1", "--json", *extra)
        assert proc.returncode == 0, proc.stderr
        doc = strict_json(proc.stdout)
        assert doc["schema"] == "smoe-sculpt/1"
        assert set(doc) == documented("Sculpt document")
        assert (doc["calibration"] is None) == (not extra)


def test_the_dry_run_plan_carries_its_schema_and_every_key_is_documented(tmp_path: Path) -> None:
    for version in ("1", "2"):
        proc = run("sculpt", CKPTS / "qwen3_moe", tmp_path / version, "--dry-run", "--json",
                   "--format-version", version)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        doc = strict_json(proc.stdout)
        assert doc["schema"] == "smoe-sculpt-plan/1"
        assert set(doc) == documented("Sculpt plan document")
        assert (doc["arch"] is None) == (version == "1")
        assert not (tmp_path / version).exists()
