"""The exit status and the one ``error:`` line of every command on inputs that cannot be read.

Each input of ``verify``, ``dump``, ``sculpt``, ``export``, ``upgrade`` and ``report`` is
replaced in turn by a path that cannot be read: a missing file, a folder, a FIFO (opened
with ``O_NONBLOCK``, so nothing blocks), a path through a file (ENOTDIR) and a symlink loop
(ELOOP); the tests run as root, where ``chmod 000`` denies nothing. The expected lines and
codes are what the CLI printed before its failures were typed (issue 21): exit 2 for an
input that cannot be opened, 1 for one read and refused, 0 where a missing manifest only
means no SNR.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fixtures_data import CKPTS, FIXTURES
from helpers import refused, run, strict_json

KINDS = ("missing", "folder", "fifo", "notdir", "loop")
OPEN = {  # fileio.open_input's words for each kind
    "missing": "cannot open: No such file or directory",
    "folder": "not a regular file (a folder)",
    "fifo": "not a regular file (a FIFO)",
    "notdir": "cannot open: Not a directory",
    "loop": "cannot open: Too many levels of symbolic links",
}


def failed(proc: subprocess.CompletedProcess, code: int) -> str:
    """Exit ``code`` and exactly one stderr line, which is returned; with ``--json`` stdout
    is the error document with the same message and code, else empty."""
    line = refused(proc, code)
    if "--json" in proc.args:
        assert strict_json(proc.stdout) == {
            "schema": "smoe-findings/1",
            "ok": False,
            "error": {"message": line.removeprefix("error: "), "exit_code": code},
        }
    else:
        assert proc.stdout == ""
    return line


def make_bad(kind: str, path: Path) -> Path:
    """A path of ``kind`` that cannot be read, at ``path`` (notdir: below it)."""
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "notdir":
        path.write_text("a file, not a folder")
        return path / "x"
    elif kind == "loop":
        os.symlink(path.name, path)
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``ck`` (a checkpoint) and ``s/ck.smoe`` sculpted from it (with its
    scout, config.json copy and manifest)."""
    root = tmp_path_factory.mktemp("exit_status")
    shutil.copytree(FIXTURES / "checkpoints" / "qwen3_moe", root / "ck")
    proc = run("sculpt", root / "ck", root / "s", "--jobs", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture
def bad(tmp_path: Path) -> Callable[[str], Path]:
    return lambda kind: make_bad(kind, tmp_path / kind)


# ---- an input that cannot be opened: exit 2, FILE: WHY --------------------------------------
Argv = Callable[[Path, Path, Path], list[str | Path]]  # (bad input, work folder, tmp) -> argv
OPENED: dict[str, Argv] = {
    "verify VAULT": lambda b, w, t: ["verify", b],
    "dump VAULT": lambda b, w, t: ["dump", b],
    "sculpt --imatrix": lambda b, w, t: ["sculpt", w / "ck", t / "o", "--imatrix", b],
    "export VAULT": lambda b, w, t: ["export", b, t / "x.safetensors"],
    "export VAULT --hf": lambda b, w, t: ["export", b, t / "hf", "--hf"],
    "export --hf --scout": lambda b, w, t: [
        "export",
        w / "s/ck.smoe",
        t / "hf",
        "--hf",
        "--scout",
        b,
    ],
    "export --hf --config": lambda b, w, t: [
        *("export", w / "s/ck.smoe", t / "hf", "--hf", "--config", b)
    ],
    "upgrade VAULT": lambda b, w, t: ["upgrade", b, "--config", w / "ck/config.json"],
    "upgrade VAULT --out": lambda b, w, t: [
        *("upgrade", b, "--config", w / "ck/config.json", "--out", t / "v2.smoe")
    ],
    "upgrade --config": lambda b, w, t: [
        *("upgrade", FIXTURES / "q4_v1.smoe", "--config", b, "--out", t / "v2.smoe")
    ],
    "report VAULT": lambda b, w, t: ["report", b, "-o", t / "r.html"],
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("role", OPENED)
def test_an_input_that_cannot_be_opened(
    work: Path, tmp_path: Path, bad: Callable[[str], Path], role: str, kind: str
) -> None:
    """(With --json for two of the kinds: the same line, and the error document.)"""
    b = bad(kind)
    argv = OPENED[role](b, work, tmp_path) + (["--json"] if kind in ("folder", "notdir") else [])
    assert failed(run(*argv), 2) == f"error: {b}: {OPEN[kind]}"
    assert not (tmp_path / "o").exists() and not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kind", ["folder", "fifo", "loop"])
@pytest.mark.parametrize("member", ["config.json", "model.safetensors"])
@pytest.mark.parametrize("command", ["sculpt", "upgrade"])
def test_a_checkpoint_file_that_cannot_be_opened(
    work: Path, tmp_path: Path, command: str, member: str, kind: str
) -> None:
    model = shutil.copytree(work / "ck", tmp_path / "m")
    (model / member).unlink()
    b = make_bad(kind, model / member)
    argv: list[str | Path] = (
        ["sculpt", model, tmp_path / "o"]
        if command == "sculpt"
        else ["upgrade", FIXTURES / "q4_v1.smoe", "--model", model, "--out", tmp_path / "v2.smoe"]
    )
    assert failed(run(*argv), 2) == f"error: {b}: {OPEN[kind]}"


@pytest.mark.parametrize("command", ["export", "export --hf"])
def test_a_companion_beside_the_vault_that_cannot_be_opened(
    work: Path, tmp_path: Path, command: str
) -> None:
    """The scout, config.json copy and (for --hf) manifest found beside the vault."""
    names = ["ck.scout.safetensors", "ck.config.json", "ck.smoe.manifest.json"]
    for name in names if command == "export --hf" else names[2:]:
        folder = shutil.copytree(work / "s", tmp_path / name)
        (folder / name).unlink()
        os.mkfifo(folder / name)
        if command == "export":  # a float32 export reads no manifest
            assert run("export", folder / "ck.smoe", tmp_path / f"{name}.st").returncode == 0
            continue
        proc = run("export", folder / "ck.smoe", tmp_path / f"{name}.hf", "--hf")
        assert failed(proc, 2) == f"error: {folder / name}: not a regular file (a FIFO)"


# ---- a model folder that is not one: exit 1 ---------------------------------------------------
def _not_a_model(kind: str, b: Path) -> str:
    if kind == "folder":
        return (
            f"{b}: no config.json (a HuggingFace checkpoint directory needs config.json and "
            "*.safetensors)"
        )
    return f"{b}: not a checkpoint directory"


@pytest.mark.parametrize("kind", KINDS)
def test_upgrade_model_that_cannot_be_read(
    tmp_path: Path, bad: Callable[[str], Path], kind: str
) -> None:
    b = bad(kind)
    argv = ["upgrade", FIXTURES / "q4_v1.smoe", "--model", b, "--out", tmp_path / "v2.smoe"]
    assert failed(run(*argv), 1) == f"error: {_not_a_model(kind, b)}"


@pytest.mark.parametrize("kind", KINDS)
def test_sculpt_model_that_cannot_be_read(
    tmp_path: Path, bad: Callable[[str], Path], kind: str
) -> None:
    b = bad(kind)
    message = _not_a_model(kind, b)
    assert failed(run("sculpt", b, tmp_path / "o"), 1) == f"error: {message}"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("member", ["config.json", "model.safetensors"])
@pytest.mark.parametrize("command", ["sculpt", "upgrade"])
def test_a_checkpoint_file_that_is_missing(
    work: Path, tmp_path: Path, command: str, member: str
) -> None:
    model = shutil.copytree(work / "ck", tmp_path / "m")
    (model / member).unlink()
    argv: list[str | Path] = (
        ["sculpt", model, tmp_path / "o"]
        if command == "sculpt"
        else ["upgrade", FIXTURES / "q4_v1.smoe", "--model", model, "--out", tmp_path / "v2.smoe"]
    )
    want = (
        _not_a_model("folder", model)
        if member == "config.json"
        else f"{model}: no *.safetensors files"
    )
    assert failed(run(*argv), 1) == f"error: {want}"


def test_upgrade_with_an_old_manifest_that_cannot_be_opened(tmp_path: Path) -> None:
    vault = Path(shutil.copy(FIXTURES / "q4_v1.smoe", tmp_path))
    where = make_bad("fifo", tmp_path / "q4_v1.smoe.manifest.json")
    config = FIXTURES / "checkpoints" / "qwen3_moe" / "config.json"
    proc = run("upgrade", vault, "--config", config, "--out", tmp_path / "v2.smoe")
    assert failed(proc, 1) == (
        f"error: {where}: the old vault's manifest is unusable ({where}: not a regular file "
        "(a FIFO)); move it aside to upgrade without it"
    )


# ---- a manifest that cannot be read: a finding (exit 1) or no SNR (exit 0) ----------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["verify", "dump"])
def test_deep_check_against_a_manifest_that_cannot_be_read(
    work: Path, bad: Callable[[str], Path], command: str, kind: str
) -> None:
    b = bad(kind)
    proc = run(command, work / "s/ck.smoe", "--deep", "--manifest", b, "--json")
    assert (proc.returncode, proc.stderr) == (1, "")
    (finding,) = strict_json(proc.stdout)["findings"]
    assert (finding["code"], finding["message"]) == ("manifest.malformed", f"{b}: {OPEN[kind]}")


@pytest.mark.parametrize("deep", [False, True], ids=["shallow", "deep"])
@pytest.mark.parametrize("kind", KINDS)
def test_report_with_a_manifest_that_cannot_be_read(
    work: Path, tmp_path: Path, bad: Callable[[str], Path], kind: str, deep: bool
) -> None:
    """A manifest named with --manifest is an input: one that cannot be opened is refused
    (exit 2, issue 31), never a page saying there is no manifest."""
    b = bad(kind)
    argv = ["report", work / "s/ck.smoe", "-o", tmp_path / "r.html", "--manifest", b, "--json"]
    proc = run(*argv, *(["--deep"] if deep else []))
    assert (proc.returncode, proc.stderr) == (2, f"error: {b}: {OPEN[kind]}\n")
    assert strict_json(proc.stdout)["error"] == {"message": f"{b}: {OPEN[kind]}", "exit_code": 2}
    assert not (tmp_path / "r.html").exists()


# ---- a vault too short for a header -------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 10])
def test_a_vault_shorter_than_a_header(tmp_path: Path, size: int) -> None:
    vault = tmp_path / "short.smoe"
    vault.write_bytes(b"SMOE\xde\x00"[:size] + bytes(max(0, size - 6)))
    why = f"file of {size} bytes is shorter than the 64-byte header"
    config = FIXTURES / "checkpoints" / "qwen3_moe" / "config.json"
    for argv in (["verify", vault], ["dump", vault], ["report", vault, "-o", tmp_path / "r.html"]):
        proc = run(*argv, "--json")
        assert (proc.returncode, proc.stderr) == (2, ""), argv
    assert why in run("verify", vault).stdout
    for argv in (
        ["export", vault, tmp_path / "x.safetensors"],
        ["export", vault, tmp_path / "hf", "--hf"],
        ["upgrade", vault, "--config", config],
        ["upgrade", vault, "--config", config, "--out", tmp_path / "v2.smoe"],
    ):
        assert failed(run(*argv), 1) == f"error: {vault}: header.size at offset 0 (header): {why}"


@pytest.mark.parametrize("option", ["--jobs", "--max-layers", "--max-experts"])
def test_counts_below_one_are_usage_errors(option: str, tmp_path: Path) -> None:
    """Every count option of sculpt is refused alike: exit 2 (issue 23, case 11)."""
    proc = run("sculpt", CKPTS / "qwen3_moe", tmp_path / "o", option, "0")
    assert failed(proc, 2) == (
        f"error: argument {option}: expected a whole number >= 1, got '0' (see smoe sculpt --help)"
    )
