"""What huggingface_hub reads of a cache before smoe sees a snapshot (``refs/<revision>``,
``trees/<commit>.json``) and the snapshot's small files (``config.json``, the index) are
checked first (issue 23, item 7): regular files of bounded size, else refused in one line.
A FIFO ref hung ``smoe sculpt ORG/NAME`` forever offline and a ref linked to /dev/zero
exhausted memory, both inside huggingface_hub. Every command runs under a timeout and a cap
on its address space, so a regression fails instead of hanging or eating the machine."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from smoe.sculpt.source.hub import check_revision

from fixtures_data import CKPTS
from helpers import python, refused, run

SINGLE = CKPTS / "qwen3_moe"
SHARDED = CKPTS / "qwen3_moe_sharded"
COMMIT = "a" * 40
GUARD = 120.0  # seconds: only a hang reaches it
CAPPED = (
    "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
    "from smoe.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline HF_HOME whose cache holds ``org/name`` at COMMIT (``refs/main``): the
    repository folder ``models--org--name``."""
    pytest.importorskip("huggingface_hub", reason="needs the smoe[hub] extra")
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    repo = home / "hub" / "models--org--name"
    snap = repo / "snapshots" / COMMIT
    for sub in (snap, repo / "blobs", repo / "refs", repo / "trees"):
        sub.mkdir(parents=True)
    for f in sorted(SHARDED.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (repo / "refs" / "main").write_text(COMMIT)
    return repo


def sculpt_id(cache: Path, tmp_path: Path, *extra: str, code: int) -> str:
    """``smoe sculpt org/name OUT`` refused with ``code``: its one line; nothing written
    under OUT, nothing in the cache changed."""
    out = tmp_path / "out"
    return refused(
        lambda: python(CAPPED, "sculpt", "org/name", out, "--jobs", "1", *extra, timeout=GUARD),
        code,
        unchanged=[cache],
        absent=out,
    )


def test_the_cache_as_built_is_sculpted(cache: Path, tmp_path: Path) -> None:
    proc = python(CAPPED, "sculpt", "org/name", tmp_path / "out", "--jobs", "1", timeout=GUARD)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "name.smoe").is_file()


def test_a_fifo_ref_is_refused_without_hanging(cache: Path, tmp_path: Path) -> None:
    ref = cache / "refs" / "main"
    ref.unlink()
    os.mkfifo(ref)
    assert sculpt_id(cache, tmp_path, code=2) == (
        f"error: org/name: {ref}: not a regular file (a FIFO)"
    )


def test_a_ref_linked_to_dev_zero_is_refused_without_reading_it(
    cache: Path, tmp_path: Path
) -> None:
    ref = cache / "refs" / "main"
    ref.unlink()
    ref.symlink_to("/dev/zero")
    assert sculpt_id(cache, tmp_path, code=2) == (
        f"error: org/name: {ref}: not a regular file (a character device)"
    )


def test_a_ref_larger_than_a_commit_hash_is_refused(cache: Path, tmp_path: Path) -> None:
    ref = cache / "refs" / "v2"
    ref.write_text(COMMIT)
    os.truncate(ref, 1 << 30)  # sparse: 1 GiB of NULs after the hash
    assert sculpt_id(cache, tmp_path, "--revision", "v2", code=1) == (
        f"error: org/name (revision v2): {ref} is 1073741824 bytes, more than the 40 "
        "bytes of the commit hash a ref holds"
    )


def test_a_ref_that_holds_no_commit_hash_is_refused(cache: Path, tmp_path: Path) -> None:
    """huggingface_hub would join it to ``snapshots/`` as it is (``..`` too)."""
    ref = cache / "refs" / "main"
    ref.write_text("../blobs")
    assert sculpt_id(cache, tmp_path, code=1) == (
        f"error: org/name: {ref} holds '../blobs', not a commit hash (40 hex digits)"
    )


@pytest.mark.parametrize("revision", [(), ("--revision", COMMIT)], ids=["ref", "commit"])
def test_a_fifo_tree_listing_is_refused_without_hanging(
    cache: Path, tmp_path: Path, revision: tuple[str, ...]
) -> None:
    """huggingface_hub reads ``trees/<commit>.json`` (its cached listing of the commit)."""
    tree = cache / "trees" / f"{COMMIT}.json"
    os.mkfifo(tree)
    what = "org/name" if not revision else f"org/name (revision {COMMIT})"
    assert sculpt_id(cache, tmp_path, *revision, code=2) == (
        f"error: {what}: {tree}: not a regular file (a FIFO)"
    )


def test_a_tree_listing_linked_to_dev_zero_is_refused(cache: Path, tmp_path: Path) -> None:
    tree = cache / "trees" / f"{COMMIT}.json"
    tree.symlink_to("/dev/zero")
    assert sculpt_id(cache, tmp_path, code=2) == (
        f"error: org/name: {tree}: not a regular file (a character device)"
    )


def test_an_oversized_tree_listing_is_refused(cache: Path, tmp_path: Path) -> None:
    tree = cache / "trees" / f"{COMMIT}.json"
    tree.write_bytes(b"{}")
    os.truncate(tree, 1 << 30)
    line = sculpt_id(cache, tmp_path, code=1)
    assert line == (
        f"error: org/name: {tree} is 1073741824 bytes, more than the 67108864 bytes "
        "allowed for a cached tree listing"
    )


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_snapshot_file_that_is_not_regular_is_refused(
    cache: Path, tmp_path: Path, name: str, kind: str
) -> None:
    target = cache / "snapshots" / COMMIT / name
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    why = "a FIFO" if kind == "fifo" else "a character device"
    assert sculpt_id(cache, tmp_path, code=2) == (
        f"error: org/name: {target}: not a regular file ({why})"
    )


@pytest.mark.parametrize(
    "revision",
    ["{secret}", "../../../../../../../..{secret}", "v1/../../x", "a\\b", "v1.lock", "x y", ".x"],
)
def test_a_revision_that_is_no_ref_name_is_refused_reading_nothing(
    tmp_path: Path, revision: str
) -> None:
    """``--revision`` is joined to the cache's ``refs/``: an absolute path or ``..`` would
    read (and quote) a file elsewhere. A revision is a ref name or a commit hash, else a
    usage error (exit 2) in one line, before anything is read or written."""
    secret = tmp_path / "secret"
    secret.write_text("TOP-SECRET")
    rev = revision.format(secret=secret)
    out = tmp_path / "out"
    line = refused(run("sculpt", "org/name", out, "--revision", rev), 2, absent=out)
    assert line.startswith(f"error: --revision {rev!r}: not a branch, tag or commit hash (")
    assert "TOP-SECRET" not in line


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", COMMIT, "b" * 64])
def test_ref_names_and_commit_hashes_pass_the_check(revision: str) -> None:
    assert check_revision(revision) == revision
