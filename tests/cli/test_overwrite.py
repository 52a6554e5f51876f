"""One overwrite policy (issue 25): every command that writes a named output refuses one
that exists, in one line and before any work, unless ``--force``; ``--force`` replaces it.
A sculpt's vault that appears while it runs is kept, not replaced."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from unittest import mock

import pytest

from smoe.errors import OutputExists
from smoe.sculpt import SculptOptions, sculpt

from fixtures_data import CKPTS, FIXTURES, OLMOE_CONFIG
from helpers import run, strict_json

MODEL = CKPTS / "qwen3_moe"


@pytest.fixture(scope="module")
def sculpted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sculpted")
    assert run("sculpt", MODEL, out, "--jobs", "1").returncode == 0
    return out / "qwen3_moe.smoe"


def untouched(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_ino


def commands(tmp: Path, vault: Path) -> dict[str, tuple[list[object], Path]]:
    """Per command its arguments and the output they name (put there before the run)."""
    v1 = tmp / "q4_v1.smoe"
    shutil.copy2(FIXTURES / "q4_v1.smoe", v1)
    (tmp / "config.json").write_text(json.dumps(OLMOE_CONFIG))
    return {
        "sculpt": (["sculpt", MODEL, tmp / "s", "--jobs", "1"], tmp / "s" / "qwen3_moe.smoe"),
        "export": (["export", vault, tmp / "e.safetensors"], tmp / "e.safetensors"),
        "upgrade": (
            ["upgrade", v1, "--config", tmp / "config.json", "--out", tmp / "u.smoe"],
            tmp / "u.smoe",
        ),
        "report": (["report", vault, "-o", tmp / "r.html"], tmp / "r.html"),
    }


@pytest.mark.parametrize("name", ["sculpt", "export", "upgrade", "report"])
def test_an_existing_output_is_refused_and_force_replaces_it(
    tmp_path: Path, sculpted: Path, name: str
) -> None:
    args, out = commands(tmp_path, sculpted)[name]
    assert run(*args).returncode == 0  # an earlier run's output: smoe wrote it
    before = untouched(out)
    proc = run(*args)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2,
        "",
        f"error: {out}: exists; --force replaces it\n",
    )
    assert untouched(out) == before
    proc = run(*args, "--json")
    assert proc.returncode == 2 and untouched(out) == before
    assert strict_json(proc.stdout)["error"] == {
        "message": f"{out}: exists; --force replaces it",
        "exit_code": 2,
    }
    proc = run(*args, "--force")
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_ino != before[1]
    assert not [n for n in os.listdir(out.parent) if n.endswith(".tmp")]


FOREIGN = {  # what each command's output is known by, for the refusal
    "sculpt": "a .smoe vault",
    "export": "a float32 file smoe export wrote",
    "upgrade": "a .smoe vault",
    "report": "a page smoe report wrote",
}


@pytest.mark.parametrize("name", ["sculpt", "export", "upgrade", "report"])
def test_force_never_replaces_a_file_smoe_did_not_write(
    tmp_path: Path, sculpted: Path, name: str
) -> None:
    """--force may delete only what smoe wrote: a file of the user's under the output's
    name (a checkpoint shard named like the export, a page, any file) is kept."""
    args, out = commands(tmp_path, sculpted)[name]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"someone else's file")
    before = untouched(out)
    proc = run(*args, "--force")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        f"error: {out}: exists and smoe did not write it (not {FOREIGN[name]}); --force "
        "replaces only what smoe wrote: move it away yourself if it is to go\n"
    )
    assert untouched(out) == before
    assert not [n for n in os.listdir(out.parent) if n.endswith(".tmp")]


def test_export_force_keeps_a_checkpoint_shard(tmp_path: Path, sculpted: Path) -> None:
    """A safetensors file that an export did not write (the source's own shard) is never
    replaced by `export VAULT SHARD --force`."""
    shard = tmp_path / "model.safetensors"
    shutil.copy2(MODEL / "model.safetensors", shard)
    before = untouched(shard)
    proc = run("export", sculpted, shard, "--force")
    assert proc.returncode == 1 and "smoe did not write it" in proc.stderr
    assert untouched(shard) == before


def test_export_hf_refuses_a_folder_and_force_replaces_an_earlier_export(
    tmp_path: Path, sculpted: Path
) -> None:
    hf = tmp_path / "hf"
    assert run("export", sculpted, hf, "--hf").returncode == 0
    before = {n: (hf / n).stat().st_ino for n in os.listdir(hf)}
    proc = run("export", sculpted, hf, "--hf")
    assert (proc.returncode, proc.stderr) == (
        2,
        f"error: {hf}: exists and is not empty; --force replaces it (a folder an earlier export "
        "wrote), or name a new folder (the folder is written whole, never merged)\n",
    )
    assert {n: (hf / n).stat().st_ino for n in os.listdir(hf)} == before
    proc = run("export", sculpted, hf, "--hf", "--force", "--max-shard-size", "100KB")
    assert proc.returncode == 0, proc.stderr
    assert "model.safetensors.index.json" in os.listdir(hf)  # the new export, whole
    assert "model.safetensors" not in os.listdir(hf)  # nothing of the old one merged in
    assert sorted(os.listdir(tmp_path)) == ["hf"]  # the old folder removed, no temporaries


def test_export_hf_force_never_replaces_a_folder_smoe_did_not_write(
    tmp_path: Path, sculpted: Path
) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "notes.txt").write_text("mine")
    proc = run("export", sculpted, hf, "--hf", "--force")
    assert (proc.returncode, proc.stderr) == (
        1,
        f"error: {hf}: has no smoe-export.json, the marker every export writes, so smoe did "
        "not write it; --force replaces only a folder an earlier smoe export wrote, as it "
        "wrote it (remove it yourself, or name a new folder)\n",
    )
    assert sorted(os.listdir(hf)) == ["config.json", "notes.txt"]
    assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_an_empty_folder_is_a_new_export(tmp_path: Path, sculpted: Path) -> None:
    (tmp_path / "hf").mkdir()
    assert run("export", sculpted, tmp_path / "hf", "--hf").returncode == 0


def test_a_dry_run_says_the_vault_exists(tmp_path: Path, sculpted: Path) -> None:
    """A dry run writes nothing, so an existing vault is said, not refused (issue 33)."""
    proc = run("sculpt", MODEL, sculpted.parent, "--dry-run")
    assert (proc.returncode, proc.stderr) == (
        0,
        f"note: {sculpted}: exists; the run itself needs --force to replace it\n",
    )


def test_a_vault_that_appears_during_a_sculpt_is_kept(tmp_path: Path) -> None:
    """Another writer puts a vault in place while the sculpt runs: the commit's no-clobber
    link refuses, the other vault stays, and the companions this run had put in place are
    removed again (the set is all or nothing)."""
    from smoe.vault import writer

    vault = tmp_path / "qwen3_moe.smoe"
    real = writer.commit_together

    def meanwhile(files: list) -> None:
        vault.write_bytes(b"theirs")
        real(files)

    patched = mock.patch.object(writer, "commit_together", meanwhile)
    with patched, pytest.raises(OutputExists) as e:
        sculpt(MODEL, tmp_path, SculptOptions(jobs=1, replace=False))
    assert str(e.value) == f"{vault}: exists; --force replaces it"
    assert vault.read_bytes() == b"theirs"
    assert not (tmp_path / "qwen3_moe.scout.safetensors").exists()
    assert not (tmp_path / "qwen3_moe.smoe.manifest.json").exists()


def test_resume_is_not_an_overwrite(tmp_path: Path) -> None:
    """An interrupted run's partial and journal are its own: --resume continues without
    --force (the vault is not there until the commit)."""
    proc = run("sculpt", MODEL, tmp_path, "--jobs", "1", "--resume", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["experts_written"] == 16
