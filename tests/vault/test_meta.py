"""`smoe meta` (issue 25): a vault's free-form metadata, shown and edited in its manifest
atomically, under the vault's lock, the blobs and checksums untouched; every refusal one line,
word for word, with nothing written."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from smoe import cli
from smoe.errors import SmoeError, UsageError
from smoe.format import manifest
from smoe.format.verify import verify_path
from smoe.plumbing.lock import Lock
from smoe.vault.meta import edit_meta, read_meta
from smoe.vault.upgrade import lock_path, upgrade

from fixtures_data import FIXTURES
from fixtures_data import OLMOE_ARCH as ARCH
from helpers import one_line, run

KEY_RULE = (
    "expected lower-case letters, digits and '_', in parts joined by '.' or '-', starting "
    "with a letter, at most 64 characters (e.g. name, license, general.source_url)"
)


def copy_vault(folder: Path, name: str = "q4_v2.smoe") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / name, folder / name)
    shutil.copy(FIXTURES / f"{name}.manifest.json", folder / f"{name}.manifest.json")
    return folder / name


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    return copy_vault(tmp_path / "v")


def meta_of(vault: Path) -> Path:
    return manifest.path_for(vault)


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def smoe(capsys: pytest.CaptureFixture, *args: object) -> tuple[int, str, str]:
    """``smoe ARGS`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = cli.main([os.fspath(a) if isinstance(a, Path) else str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def refusal(fn: Callable[[], object]) -> str:
    with pytest.raises(SmoeError) as info:
        fn()
    return str(info.value)


# ---- show, set, unset --------------------------------------------------------------------
def test_show_set_unset_and_json(vault: Path, capsys: pytest.CaptureFixture) -> None:
    m = meta_of(vault)
    assert smoe(capsys, "meta", vault) == (
        0,
        "",
        f"note: {vault}: no metadata (smoe meta VAULT --set KEY=VALUE adds some)\n",
    )
    code, out, err = smoe(
        capsys, "meta", vault, "--set", "name=OLMoE tiny, Q4", "--set", "license=Apache-2.0"
    )
    assert (code, out, err) == (0, f"{m}: updated: set license, name\n", "")
    assert smoe(capsys, "meta", vault) == (0, "license: Apache-2.0\nname: OLMoE tiny, Q4\n", "")
    code, out, _ = smoe(capsys, "meta", vault, "--set", "quantized-by=me", "--unset", "license")
    assert (code, out) == (0, f"{m}: updated: set quantized-by; unset license\n")
    code, out, _ = smoe(capsys, "meta", vault, "--json")
    assert code == 0 and json.loads(out) == {
        "schema": "smoe-meta/1",
        "vault": str(vault),
        "manifest": str(m),
        "metadata": {"name": "OLMoE tiny, Q4", "quantized-by": "me"},
        "changed": False,
        "set": [],
        "unset": [],
        "absent": [],
    }
    code, out, _ = smoe(capsys, "meta", vault, "--set", "name=x", "--json")
    doc = json.loads(out)
    assert (doc["changed"], doc["set"], doc["metadata"]["name"]) == (True, ["name"], "x")


def test_an_edit_that_changes_nothing_writes_nothing(
    vault: Path, capsys: pytest.CaptureFixture
) -> None:
    edit_meta(vault, {"name": "x"})
    before = os.stat(meta_of(vault))
    assert smoe(capsys, "meta", vault, "--set", "name=x") == (
        0,
        f"{meta_of(vault)}: unchanged\n",
        "",
    )
    after = os.stat(meta_of(vault))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_only_the_metadata_changes_and_verify_deep_passes(vault: Path) -> None:
    """Every other key byte for byte; set then unset everything: the original bytes."""
    original = meta_of(vault).read_bytes()
    blobs = vault.read_bytes()
    edit_meta(vault, {"name": "Tiny", "description": "line one\nline two\tend", "license": "MIT"})
    doc = json.loads(meta_of(vault).read_text())
    assert doc.pop("metadata") == {
        "description": "line one\nline two\tend",
        "license": "MIT",
        "name": "Tiny",
    }
    assert doc == json.loads(original)
    assert verify_path(vault, deep=True).ok
    assert vault.read_bytes() == blobs
    edit_meta(vault, unset=["name", "description", "license"])
    assert meta_of(vault).read_bytes() == original
    assert read_meta(vault).metadata == {}


def test_verify_deep_command_passes_after_an_edit(vault: Path, capsys) -> None:
    before = smoe(capsys, "verify", "--deep", vault)
    edit_meta(vault, {"name": "Tiny"})
    code, out, err = smoe(capsys, "verify", "--deep", vault)
    assert (code, out, err) == before
    assert code == 0 and out.endswith(f"{vault}: valid (0 errors, 1 warnings, deep)\n")


def test_the_manifest_keeps_its_mode_and_a_symlinked_one_is_edited_at_its_target(
    tmp_path: Path,
) -> None:
    real = copy_vault(tmp_path / "real")
    os.chmod(meta_of(real), 0o640)
    link_dir = tmp_path / "links"
    link_dir.mkdir()
    shutil.copy(real, link_dir / real.name)
    (link_dir / meta_of(real).name).symlink_to(meta_of(real))
    edit_meta(link_dir / real.name, {"name": "x"})
    assert (link_dir / meta_of(real).name).is_symlink()
    assert json.loads(meta_of(real).read_text())["metadata"] == {"name": "x"}
    assert os.stat(meta_of(real)).st_mode & 0o777 == 0o640


def test_dump_shows_the_metadata(vault: Path, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = smoe(capsys, "dump", vault)
    assert code == 0 and "provenance" not in out  # the fixture's manifest says no origin
    edit_meta(vault, {"name": "Tiny <b>", "license": "MIT"})
    code, out, _ = smoe(capsys, "dump", vault)
    lines = out.splitlines()
    assert lines[1] == f"├── provenance (from {meta_of(vault).name})"
    assert re.search(r"^│\s+(└──)?\s*metadata\.license\s+MIT$", out, re.M), out
    assert re.search(r"^│\s+metadata\.name\s+Tiny <b>$", out, re.M), out
    code, out, _ = smoe(capsys, "dump", vault, "--field", "provenance.metadata.name")
    assert (code, out) == (0, "Tiny <b>\n")


def test_upgrade_out_keeps_the_metadata(tmp_path: Path) -> None:
    v1 = copy_vault(tmp_path / "old", "q4_v1.smoe")
    edit_meta(v1, {"name": "Tiny", "license": "MIT"})
    new = upgrade(v1, ARCH, out=tmp_path / "new" / "v2.smoe").path
    assert read_meta(new).metadata == {"license": "MIT", "name": "Tiny"}
    assert verify_path(new, deep=True).ok


# ---- refusals, word for word, nothing written ----------------------------------------------
@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--set", "Name=x"], f"argument --set: metadata key 'Name': {KEY_RULE}"),
        (["--set", "name"], "argument --set: expected KEY=VALUE, got 'name'"),
        (["--set", "a..b=x"], f"argument --set: metadata key 'a..b': {KEY_RULE}"),
        (["--set", "k" * 65 + "=x"], f"argument --set: metadata key '{'k' * 65}': {KEY_RULE}"),
        (["--unset", "9lives"], f"argument --unset: metadata key '9lives': {KEY_RULE}"),
        (
            ["--set", "name="],
            "argument --set: metadata name: the value is empty (--unset name removes a key)",
        ),
        (
            ["--set", "name=caf\udce9"],
            "argument --set: metadata name: the value is not UTF-8 text (undecodable bytes)",
        ),
        (
            ["--set", "description=a\x1b[31mred"],
            "argument --set: metadata description: the value holds the control character "
            "U+001B; text only (tab and line feed allowed)",
        ),
        (
            ["--set", "name=" + "n" * 257],
            "argument --set: metadata name: the value is 257 characters, more than the 256 allowed",
        ),
        (
            ["--set", "note=" + "n" * 4097],
            "argument --set: metadata note: the value is 4097 characters, more than the 4096 "
            "allowed",
        ),
        (
            ["--set", "license=MIT; rm -rf /"],
            "argument --set: metadata license: 'MIT; rm -rf /' is not a license id (an SPDX "
            "identifier or expression such as Apache-2.0 or 'MIT OR Apache-2.0', or a Hub id "
            "such as llama3.1: letters, digits, '.', '+', '-', '_', ':', parentheses and spaces)",
        ),
        (
            ["--set", "name=x", "--unset", "name"],
            "metadata key 'name': both set and unset",
        ),
    ],
)
def test_refused_command_lines(
    vault: Path, capsys: pytest.CaptureFixture, argv: list[str], line: str
) -> None:
    before = meta_of(vault).read_bytes()
    code, out, err = smoe(capsys, "meta", vault, *argv)
    assert (code, out) == (2, "")
    assert (
        err == f"error: {line}" + (" (see smoe meta --help)" if "argument" in line else "") + "\n"
    )
    assert meta_of(vault).read_bytes() == before
    assert listing(vault.parent) == ["q4_v2.smoe", "q4_v2.smoe.manifest.json"]


def test_values_that_are_not_text_are_refused(vault: Path) -> None:
    for value, what in ((3, "a number"), (True, "a boolean"), (None, "null"), (["x"], "a list")):
        with pytest.raises(UsageError) as info:
            edit_meta(vault, {"name": value})
        assert str(info.value) == f"metadata name: the value is {what}, expected text"
    assert "metadata" not in json.loads(meta_of(vault).read_text())


def test_a_vault_without_a_manifest(vault: Path, capsys: pytest.CaptureFixture) -> None:
    meta_of(vault).unlink()
    code, out, err = smoe(capsys, "meta", vault, "--set", "name=x")
    assert (code, out) == (1, "")
    assert err == (
        f"error: {vault}: has no manifest (q4_v2.smoe.manifest.json beside it), where the "
        "metadata is kept; smoe sculpt writes one with every vault, and smoe upgrade VAULT "
        "--out NEW --config CONFIG writes a copy of the vault with one\n"
    )
    assert listing(vault.parent) == ["q4_v2.smoe"]  # no manifest, no lock file


def test_a_manifest_of_another_vault(vault: Path) -> None:
    shutil.copy(FIXTURES / "q2_v2.smoe.manifest.json", meta_of(vault))
    before = meta_of(vault).read_bytes()
    assert refusal(lambda: edit_meta(vault, {"name": "x"})) == (
        f"{meta_of(vault)}: does not match {vault}: table entry 0 (layer 0 expert 0) has "
        f"raw_size 3264, the manifest says 1728 (smoe verify --deep {vault} checks both)"
    )
    assert refusal(lambda: read_meta(vault)).startswith(f"{meta_of(vault)}: does not match")
    assert meta_of(vault).read_bytes() == before


def test_a_manifest_for_another_size(vault: Path) -> None:
    with open(vault, "ab") as f:
        f.write(bytes(16384))
    assert refusal(lambda: edit_meta(vault, {"name": "x"})) == (
        f"{meta_of(vault)}: does not match {vault}: the manifest describes a vault with size "
        f"147456, this one has 163840 (it belongs to another file) (smoe verify --deep "
        f"{vault} checks both)"
    )


def test_a_manifest_that_is_not_json(vault: Path) -> None:
    meta_of(vault).write_text("{not json")
    assert refusal(lambda: edit_meta(vault, {"name": "x"})) == (
        f"{meta_of(vault)}: the vault's manifest is unusable (manifest: {meta_of(vault)} is not "
        "UTF-8 JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
        "(char 1)))"
    )


def test_a_manifest_that_is_not_a_regular_file(vault: Path, capsys) -> None:
    meta_of(vault).unlink()
    os.mkfifo(meta_of(vault))
    code, _, err = smoe(capsys, "meta", vault)
    assert (code, err) == (2, f"error: {meta_of(vault)}: not a regular file (a FIFO)\n")


def test_a_vault_that_cannot_be_opened(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "none.smoe"
    code, _, err = smoe(capsys, "meta", missing, "--set", "name=x")
    assert (code, err) == (2, f"error: {missing}: cannot open: No such file or directory\n")
    assert listing(tmp_path) == []


def test_stored_metadata_that_breaks_the_rules(vault: Path) -> None:
    doc = json.loads(meta_of(vault).read_text())
    for bad, why in (
        ([1], "manifest/metadata is [1], expected an object of text"),
        (
            {"name": 7},
            "manifest/metadata breaks the rules: metadata name: the value is a number, "
            "expected text",
        ),
        (
            {"Bad Key": "x"},
            f"manifest/metadata breaks the rules: metadata key 'Bad Key': {KEY_RULE}",
        ),
    ):
        meta_of(vault).write_bytes(manifest.encode({**doc, "metadata": bad}))
        assert refusal(lambda: read_meta(vault)) == f"{meta_of(vault)}: {why}"
        assert refusal(lambda: edit_meta(vault, {"name": "x"})) == f"{meta_of(vault)}: {why}"


def test_unsetting_a_key_it_does_not_hold_is_idempotent(vault: Path) -> None:
    """Issue 33: the key is already absent, as asked: exit 0 with a note, nothing written."""
    edit_meta(vault, {"name": "x"})
    before = meta_of(vault).read_bytes()
    r = edit_meta(vault, unset=["licence"])
    assert (r.changed, r.unset, r.absent, r.metadata) == (False, [], ["licence"], {"name": "x"})
    assert meta_of(vault).read_bytes() == before
    proc = run("meta", vault, "--unset", "licence")
    assert proc.returncode == 0 and meta_of(vault).read_bytes() == before
    assert proc.stdout == f"{meta_of(vault)}: unchanged\n"
    assert one_line(proc) == (f"note: {meta_of(vault)}: no key 'licence' to unset (it has: name)")
    doc = json.loads(run("meta", vault, "--unset", "licence", "--json").stdout)
    assert (doc["changed"], doc["unset"], doc["absent"]) == (False, [], ["licence"])


def test_too_many_keys(vault: Path) -> None:
    edit_meta(vault, {f"k{i}": "v" for i in range(64)})
    assert refusal(lambda: edit_meta(vault, {"one_more": "v"})) == (
        f"{meta_of(vault)}: the metadata would hold 65 keys, more than the 64 allowed"
    )


def test_a_concurrent_edit_is_refused(vault: Path, capsys: pytest.CaptureFixture) -> None:
    """Another writer (smoe sculpt, upgrade or meta) holds the vault's lock."""
    before = meta_of(vault).read_bytes()
    with Lock(lock_path(vault), vault):
        code, out, err = smoe(capsys, "meta", vault, "--set", "name=x")
        assert (code, out) == (1, "")
        assert err == (
            f"error: {vault}: another smoe process (pid {os.getpid()}) is writing it; wait for "
            "it to finish (lock .q4_v2.smoe.lock)\n"
        )
        assert smoe(capsys, "meta", vault)[0] == 0  # reading needs no lock
    assert meta_of(vault).read_bytes() == before
    assert listing(vault.parent) == ["q4_v2.smoe", "q4_v2.smoe.manifest.json"]


def test_json_refusal_is_the_error_document(vault: Path, capsys) -> None:
    meta_of(vault).unlink()
    code, out, _ = smoe(capsys, "meta", vault, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["error"]["exit_code"] == 1
    assert doc["error"]["message"].startswith(f"{vault}: has no manifest")


# ---- atomicity: a failed write leaves the old manifest, no temporary file, no lock -----------
def _on_temp(fd: int) -> bool:
    return os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp")


@pytest.mark.parametrize("step", ["write", "fsync", "rename"])
def test_a_failed_write_leaves_the_manifest_as_it_was(
    vault: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    edit_meta(vault, {"name": "before"})
    before = meta_of(vault).read_bytes()
    real = {"write": os.pwrite, "fsync": os.fsync, "rename": os.replace}[step]

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if _on_temp(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, offset)  # type: ignore[call-arg]

    def fsync(fd: int) -> None:
        if _on_temp(fd):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)  # type: ignore[call-arg]

    def replace(src: str, dst: str) -> None:
        if os.fspath(src).endswith(".tmp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(src, dst)  # type: ignore[call-arg]

    name = {"write": "pwrite", "fsync": "fsync", "rename": "replace"}[step]
    monkeypatch.setattr(os, name, {"write": pwrite, "fsync": fsync, "rename": replace}[step])
    with pytest.raises(SmoeError) as info:
        edit_meta(vault, {"name": "after", "license": "MIT"})
    monkeypatch.undo()
    target = os.path.realpath(meta_of(vault))
    why = {
        "write": r"cannot write \d+ bytes at offset 0: No space left on device",
        "fsync": r"cannot flush to disk \(fsync\): Input/output error",
        "rename": r"cannot rename \.q4_v2\.smoe\.manifest\.json\.[0-9a-f]{8}\.tmp onto it: "
        r"Input/output error",
    }[step]
    assert re.fullmatch(f"{re.escape(target)}: {why}", str(info.value)), str(info.value)
    assert meta_of(vault).read_bytes() == before
    assert listing(vault.parent) == ["q4_v2.smoe", "q4_v2.smoe.manifest.json"]
    assert verify_path(vault, deep=True).ok
    assert read_meta(vault).metadata == {"name": "before"}


def test_a_killed_edit_s_temporary_file_is_swept_by_the_next(vault: Path) -> None:
    stale = vault.parent / ".q4_v2.smoe.manifest.json.0123abcd.tmp"
    stale.write_bytes(b'{"half": ')
    edit_meta(vault, {"name": "x"})
    assert listing(vault.parent) == ["q4_v2.smoe", "q4_v2.smoe.manifest.json"]
