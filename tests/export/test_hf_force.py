"""``export --hf --force`` deletes only what smoe itself wrote (issue 31).

An export folder is known by its marker ``smoe-export.json`` (every file it wrote, with its
size and SHA-256), never by file names; the checkpoint the vault was sculpted from is refused
first, by name. Files added while the export runs are kept, and a folder swapped for a
symlink meanwhile never has its target emptied: each attack is replayed by a hook between
the export's steps."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from smoe.errors import SmoeError
from smoe.export.hf import folder, source_guard
from smoe.export.hf.checkpoint import export_hf

from fixtures_data import CKPTS
from helpers import refused, run, snapshot

MODEL = "qwen3_moe"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of a tiny checkpoint (with a generation_config.json) and its sculpted vault."""
    base = tmp_path_factory.mktemp("force")
    ckpt = base / MODEL
    shutil.copytree(CKPTS / MODEL, ckpt)
    (ckpt / "generation_config.json").write_text('{"do_sample": false}')
    assert run("sculpt", ckpt, base / "out", "--jobs", "1").returncode == 0
    return ckpt, base / "out" / f"{MODEL}.smoe"


@pytest.fixture
def earlier(source: tuple[Path, Path], tmp_path: Path) -> Path:
    """An earlier export's folder."""
    hf = tmp_path / "hf"
    export_hf(source[1], hf, threads=1)
    return hf


def export_again(vault: Path, hf: Path) -> list[str]:
    """``--force`` in process (so that a test can hook its steps); the result's notes."""
    return export_hf(vault, hf, threads=1, replace=True).notes


def inodes(path: Path) -> dict[str, int]:
    return {n: (path / n).stat().st_ino for n in sorted(os.listdir(path))}


def test_the_source_checkpoint_is_refused_first_by_name(source: tuple[Path, Path]) -> None:
    """The attack: DIR is the checkpoint the vault came from; its BF16 shards would be
    replaced and generation_config.json deleted. Refused with and without --force."""
    ckpt, vault = source
    for force in ([], ["--force"]):
        line = refused(["export", vault, ckpt, "--hf", *force], 1, unchanged=[ckpt])
        assert line == (
            f"error: {ckpt}: is the checkpoint the vault was sculpted from (model.safetensors "
            "has the size and header SHA-256 the vault's manifest records of its source, and "
            "a source tensor's bytes); refusing to replace a source, with or without --force"
        )
    assert not [p for p in ckpt.parent.iterdir() if p.name.startswith(f".{MODEL}.")]


def test_an_export_of_the_same_header_is_not_the_source(
    source: tuple[Path, Path], earlier: Path
) -> None:
    """An export writes the source's very header (same names, dtypes, offsets): its bytes,
    dequantised, are what tell it from the source, so it is replaced."""
    assert source_guard.source_checkpoint(earlier, None) is None
    old = inodes(earlier)
    assert export_again(source[1], earlier) == []
    assert sorted(os.listdir(earlier)) == sorted(old) and inodes(earlier) != old


def test_a_folder_without_the_marker_is_refused(source: tuple[Path, Path], tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        (hf / name).write_text("mine")  # the names an export writes, but not its files
    line = refused(["export", source[1], hf, "--hf", "--force"], 1, unchanged=[hf])
    assert line == (
        f"error: {hf}: has no smoe-export.json, the marker every export writes, so smoe did "
        f"not write it; {folder.FORCE}"
    )


@pytest.mark.parametrize("damage", ["changed", "resized", "added", "folder", "link"])
def test_a_folder_unlike_its_marker_is_refused_naming_the_entry(
    source: tuple[Path, Path], earlier: Path, damage: str
) -> None:
    config = earlier / "config.json"
    data = config.read_bytes()
    if damage == "changed":  # the same size, other bytes: only the hash tells
        config.write_bytes(data.replace(b"{", b"[", 1))
        why = "'config.json' changed since the export wrote it (its SHA-256 is not the one"
    elif damage == "resized":
        config.write_bytes(data + b"\n")
        why = f"'config.json' is {len(data) + 1} bytes, not the {len(data)} its smoe-export"
    elif damage == "added":
        (earlier / "tokenizer.json").write_text("{}")
        why = "holds 'tokenizer.json', which its smoe-export.json does not list"
    elif damage == "folder":
        (earlier / "extra").mkdir()
        why = "holds 'extra', which its smoe-export.json does not list"
    else:
        config.unlink()
        config.symlink_to(source[0] / "config.json")
        why = "'config.json' is not a regular file"
    line = refused(["export", source[1], earlier, "--hf", "--force"], 1, unchanged=[earlier])
    assert line.startswith(f"error: {earlier}: {why}") and line.endswith(folder.FORCE)


@pytest.mark.parametrize(
    "marker",
    [b"{not json", b'{"schema": "other"}', b'{"schema": "smoe-export/1", "files": {}}', None],
)
def test_a_marker_that_is_not_one_is_refused(
    source: tuple[Path, Path], earlier: Path, marker: bytes | None
) -> None:
    path = earlier / folder.MARKER
    if marker is None:  # larger than any marker: refused unread
        os.truncate(path, folder.MARKER_BYTES + 1)
    else:
        path.write_bytes(marker)
    line = refused(["export", source[1], earlier, "--hf", "--force"], 1, unchanged=[earlier])
    assert line.startswith(f"error: {path}: ") and line.endswith(folder.FORCE)


@pytest.mark.parametrize("shard", [None, 50_000], ids=["one-shard", "sharded"])
def test_the_marker_lists_every_file_with_its_size_and_hash(
    source: tuple[Path, Path], tmp_path: Path, shard: int | None
) -> None:
    """Hashed as written (each tensor's bytes read back while the next is written): the
    digests are those of the files as they are on disk."""
    hf = tmp_path / "hf"
    kw = {} if shard is None else {"max_shard_size": shard}
    export_hf(source[1], hf, threads=2, **kw)  # type: ignore[arg-type]
    doc = json.loads((hf / folder.MARKER).read_text())
    listed = {f["name"]: (f["size"], f["sha256"]) for f in doc["files"]}
    assert doc["schema"] == folder.SCHEMA and doc["vault"] == f"{MODEL}.smoe"
    files = [n for n in os.listdir(hf) if n != folder.MARKER]
    assert len(files) > (1 if shard is None else 3)
    assert listed == {
        n: ((hf / n).stat().st_size, hashlib.sha256((hf / n).read_bytes()).hexdigest())
        for n in files
    }
    assert folder.check_earlier(hf).path == hf


# ---- attacks while the export runs ----------------------------------------------------------
def hook(monkeypatch: pytest.MonkeyPatch, name: str, attack: Callable[[], None]) -> None:
    """Run ``attack`` just before ``folder.<name>`` does its work."""
    real = getattr(folder, name)

    def hooked(*args: object, **kw: object) -> object:
        attack()
        return real(*args, **kw)

    monkeypatch.setattr(folder, name, hooked)


def no_temporaries(parent: Path) -> bool:
    return not [p for p in parent.iterdir() if p.name.startswith(".hf.")]


def test_a_file_added_while_the_export_runs_is_kept(
    source: tuple[Path, Path], earlier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Added while the new folder is written: the check right before the move refuses;
    the earlier export and the new file stay as they are."""
    old = snapshot(earlier)
    hook(monkeypatch, "write_marker", lambda: (earlier / "notes.txt").write_text("mine"))
    with pytest.raises(SmoeError) as e:
        export_again(source[1], earlier)
    assert str(e.value) == (
        f"{earlier}: 'notes.txt' appeared in it while the export ran; nothing deleted, the "
        "new export not put in place"
    )
    assert (earlier / "notes.txt").read_text() == "mine"
    assert {k: v for k, v in snapshot(earlier).items() if "notes" not in k} == old
    assert no_temporaries(earlier.parent)


def test_a_file_added_at_the_last_instant_is_kept(
    source: tuple[Path, Path], earlier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Added between that check and the move: only the names the marker lists are
    deleted; the folder moved aside keeps the new file and a note names it."""
    hook(monkeypatch, "_rename_aside", lambda: (earlier / "notes.txt").write_text("mine"))
    notes = export_again(source[1], earlier)
    kept = [p for p in earlier.parent.iterdir() if p.name.startswith(".hf.")]
    assert len(kept) == 1 and os.listdir(kept[0]) == ["notes.txt"]
    assert (kept[0] / "notes.txt").read_text() == "mine"
    assert notes == [
        f"{kept[0]}: the earlier export, moved aside, is kept: it holds 'notes.txt', which "
        "appeared in it while this export ran"
    ]
    assert folder.MARKER in os.listdir(earlier)  # the new export in place


@pytest.mark.parametrize("when", ["write_marker", "_rename_aside"])
def test_a_folder_swapped_for_a_symlink_never_has_its_target_emptied(
    source: tuple[Path, Path],
    earlier: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    """The folder becomes a symlink to another folder holding the very files the marker
    lists (and one more): while the new folder is written, or between the last check and
    the move. Refused; the target is untouched, the link left where it was."""
    victim = tmp_path / "victim"

    def swap() -> None:
        earlier.rename(victim)
        (victim / "precious.txt").write_text("mine")
        earlier.symlink_to(victim)

    hook(monkeypatch, when, swap)
    with pytest.raises(SmoeError) as e:
        export_again(source[1], earlier)
    assert str(e.value) == (
        f"{earlier}: was replaced (by a symlink or another folder) while the export ran; "
        "nothing deleted, the new export not put in place"
    )
    assert earlier.is_symlink() and os.readlink(earlier) == str(victim)
    assert "precious.txt" in os.listdir(victim) and folder.MARKER in os.listdir(victim)
    assert no_temporaries(earlier.parent)


def test_the_sweep_removes_only_what_an_export_wrote(
    source: tuple[Path, Path], earlier: Path
) -> None:
    """Folders a killed export left: an earlier export moved aside is removed only as its
    marker allows; a temporary folder loses only the names an export writes."""
    parent = earlier.parent
    aside = parent / ".hf.0123abcd.old"
    shutil.copytree(earlier, aside)
    (aside / "notes.txt").write_text("mine")  # not the marker's: the folder is kept whole
    clean = parent / ".hf.4567cdef.old"
    shutil.copytree(earlier, clean)
    tmp = parent / ".hf.89abcdef.tmp"
    shutil.copytree(earlier, tmp)
    (tmp / "notes.txt").write_text("mine")
    export_again(source[1], earlier)
    assert sorted(os.listdir(aside)) == sorted([*os.listdir(earlier), "notes.txt"])
    assert not clean.exists()
    assert os.listdir(tmp) == ["notes.txt"]


@pytest.mark.parametrize("ranges", [[(0, 40), (40, 100)], [(8, 100), (0, 8)]], ids=["in", "out"])
def test_a_file_hashed_as_written_gives_its_digest(tmp_path: Path, ranges: list) -> None:
    """Ranges reported in file order are hashed as they come; one out of order makes the
    file be read back whole once complete: the digest is the file's either way."""
    data = bytes(range(100))
    path = tmp_path / "model.safetensors"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    with folder.Hashes(tmp_path) as hashes:
        for start, end in ranges:
            os.pwrite(fd, data[start:end], start)
            hashes.written(path.name, fd, start, end)
        os.close(fd)  # as a commit closes it
        hashes.complete(path.name)
        (entry,) = hashes.files([path.name])
    assert entry == {"name": path.name, "size": 100, "sha256": hashlib.sha256(data).hexdigest()}
