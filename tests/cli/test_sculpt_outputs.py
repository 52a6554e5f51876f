"""What ``smoe sculpt``'s OUT names (issue 33): a folder, or with ``.smoe`` the vault itself;
and the runs that write nothing (a dry run, ``--resume`` of a finished run) are not refused
for an output that exists."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_sculpt_json import documented

from smoe.cli.sculpt_output import finished, target
from smoe.errors import UsageError, WriteFailed
from smoe.sculpt.paths import Paths

from fixtures_data import CKPTS, FIXTURES
from helpers import one_line, run, strict_json

MODEL = CKPTS / "qwen3_moe"


def plan(*args: object) -> dict:
    proc = run("sculpt", MODEL, *args, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    return strict_json(proc.stdout)


# ---- OUT ending in .smoe names the vault ---------------------------------------------------
def test_an_out_ending_in_smoe_is_the_vault(tmp_path: Path) -> None:
    doc = plan(tmp_path / "models" / "model-q4.smoe")
    assert doc["vault"] == str(tmp_path / "models" / "model-q4.smoe")
    assert not (tmp_path / "models").exists()  # a dry run writes nothing
    paths = Paths.of(MODEL, *target(tmp_path / "model-q4.smoe", None).__dict__.values())
    assert (paths.vault.name, paths.scout.name, paths.manifest.name, paths.config.name) == (
        "model-q4.smoe",
        "model-q4.scout.safetensors",
        "model-q4.smoe.manifest.json",
        "model-q4.config.json",
    )
    assert paths.vault.parent == tmp_path


def test_a_folder_out_keeps_the_models_stem(tmp_path: Path) -> None:
    assert plan(tmp_path / "out")["vault"] == str(tmp_path / "out" / "qwen3_moe.smoe")
    assert plan(tmp_path / "out", "--name", "q4")["vault"] == str(tmp_path / "out" / "q4.smoe")
    trailing = f"{tmp_path / 'old.smoe'}/"  # a trailing slash: the folder, as written
    assert plan(trailing)["vault"] == str(tmp_path / "old.smoe" / "qwen3_moe.smoe")


@pytest.mark.parametrize("case", ["existing folder", "with --name"])
def test_an_ambiguous_out_is_refused_in_one_line(case: str, tmp_path: Path) -> None:
    out = tmp_path / "x.smoe"
    extra: list[object] = []
    if case == "existing folder":
        out.mkdir()
        want = "is a folder, and OUT ending in .smoe names the vault itself; name the vault "
    else:
        extra = ["--name", "y"]
        want = "OUT ending in .smoe names the vault itself, and --name names it too"
    proc = run("sculpt", MODEL, out, *extra)
    assert proc.returncode == 2 and proc.stdout == ""
    assert one_line(proc).startswith(f"error: {out}: {want}")
    with pytest.raises(UsageError):
        target(out, "y" if extra else None)


# ---- a dry run is not refused for an existing output ---------------------------------------
def test_a_dry_run_prints_the_plan_and_says_the_output_exists(tmp_path: Path) -> None:
    vault = tmp_path / "qwen3_moe.smoe"
    shutil.copy(FIXTURES / "q4_v2.smoe", vault)
    before = sorted(p.name for p in tmp_path.iterdir())
    doc = plan(tmp_path)
    assert doc["vault_exists"] is True and doc["vault"] == str(vault)
    assert set(doc) == documented("Sculpt plan document")
    human = run("sculpt", MODEL, tmp_path, "--dry-run")
    assert human.returncode == 0 and "planned vault" in human.stdout
    assert one_line(human) == f"note: {vault}: exists; the run itself needs --force to replace it"
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert plan(tmp_path / "new")["vault_exists"] is False


# ---- --resume of a finished run ------------------------------------------------------------
def test_resume_of_a_finished_run_says_it_is_complete(tmp_path: Path) -> None:
    vault = tmp_path / "qwen3_moe.smoe"
    shutil.copy(FIXTURES / "q4_v2.smoe", vault)
    before = vault.read_bytes()
    proc = run("sculpt", MODEL, tmp_path, "--resume")
    assert proc.returncode == 0 and proc.stdout == ""
    assert one_line(proc) == (
        f"note: {vault}: complete: the run finished, nothing to resume (--force redoes it)"
    )
    doc = strict_json(run("sculpt", MODEL, tmp_path, "--resume", "--json").stdout)
    assert doc == {"schema": "smoe-sculpt-complete/1", "vault": str(vault), "complete": True}
    assert set(doc) == documented("Sculpt complete document")
    assert vault.read_bytes() == before and sorted(tmp_path.iterdir()) == [vault]


def test_resume_with_a_partial_or_a_foreign_file_is_no_finished_run(tmp_path: Path) -> None:
    paths = Paths.of(MODEL, tmp_path, None)
    assert not finished(paths)  # nothing there: a fresh run
    shutil.copy(FIXTURES / "q4_v2.smoe", paths.vault)
    paths.partial.write_bytes(b"")
    assert not finished(paths)  # a partial waits: the run is resumed
    paths.partial.unlink()
    assert finished(paths)
    paths.vault.write_bytes(b"not a vault")
    with pytest.raises(WriteFailed, match="smoe did not write it"):
        finished(paths)


def test_a_sculpt_into_a_smoe_path_writes_the_vault_there_and_resumes_complete(
    tmp_path: Path,
) -> None:
    out = tmp_path / "q" / "model-q4.smoe"
    proc = run("sculpt", MODEL, out, "--jobs", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert strict_json(proc.stdout)["vault"] == str(out)
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "model-q4.config.json",
        "model-q4.scout.safetensors",
        "model-q4.smoe",
        "model-q4.smoe.manifest.json",
    ]
    assert out.is_file() and run("verify", "--deep", out).returncode == 0
    again = run("sculpt", MODEL, out, "--resume", "--jobs", "1")
    assert again.returncode == 0 and "complete" in one_line(again)
