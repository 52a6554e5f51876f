"""`smoe sculpt ORG/NAME OUT`: model ids resolved through a HuggingFace cache the tests build
themselves (huggingface_hub's layout: refs, snapshots of symlinks into blobs), offline."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from smoe.errors import SmoeError
from smoe.sculpt import SculptOptions, sculpt
from smoe.sculpt.source import hub

from fixtures_data import CKPTS
from helpers import python, run

SINGLE = CKPTS / "qwen3_moe"  # config.json + model.safetensors
SHARDED = CKPTS / "qwen3_moe_sharded"  # the same weights in 3 shards + index
COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


# ---- a HuggingFace cache, as huggingface_hub lays it out -----------------------------------
def cache_model(
    cache: Path,
    repo_id: str,
    src: Path,
    commit: str,
    refs: tuple[str, ...] = (),
    skip: tuple[str, ...] = (),
) -> Path:
    """``src``'s files as the snapshot ``commit`` of ``repo_id``: symlinks into ``blobs/``
    (named by content hash), ``refs/REF`` holding the commit. Returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.name in skip:
            continue
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snap


def tree_state(root: Path) -> dict[str, tuple[int, ...]]:
    """lstat of everything under ``root`` (not the access times, which reading changes)."""
    out = {}
    for p in [root, *sorted(root.rglob("*"))]:
        st = p.lstat()
        out[str(p)] = (
            st.st_mode,
            st.st_ino,
            st.st_size,
            st.st_nlink,
            st.st_mtime_ns,
            st.st_ctime_ns,
        )
    return out


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HF_HOME (cache in ``hub/``), offline, for this process and its children."""
    home = tmp_path / "hf"
    (home / "hub").mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    pytest.importorskip("huggingface_hub", reason="needs the smoe[hub] extra")
    from huggingface_hub import constants

    # huggingface_hub read the environment when first imported: point this process there too
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home


def sources(manifest: Path) -> list[str]:
    """The checkpoint files a vault's manifest was made from."""
    return [f["name"] for f in json.loads(manifest.read_text())["source"]["files"]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The vault of the bundled checkpoint, sculpted from its folder."""
    out = tmp_path_factory.mktemp("ref")
    return sculpt(SINGLE, out, SculptOptions(jobs=1)).vault.read_bytes()


# ---- the command line ----------------------------------------------------------------------
def test_model_id_from_the_cache_offline(hf_home: Path, tmp_path: Path, reference: bytes) -> None:
    """Named after the model, the same bytes as from the folder, nothing written in the cache."""
    cache_model(hf_home / "hub", "org/name", SINGLE, COMMIT_A, refs=("main",))
    before = tree_state(hf_home)
    out = tmp_path / "out"
    proc = run("sculpt", "org/name", out, "--jobs", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no progress bar or warning in a pipe
    summary = json.loads(proc.stdout)
    assert summary["vault"] == str(out / "name.smoe")
    assert sorted(p.name for p in out.iterdir()) == [
        "name.config.json",
        "name.scout.safetensors",
        "name.smoe",
        "name.smoe.manifest.json",
    ]
    assert (out / "name.smoe").read_bytes() == reference
    assert tree_state(hf_home) == before


def test_name_overrides_the_model_name(hf_home: Path, tmp_path: Path) -> None:
    cache_model(hf_home / "hub", "org/name", SINGLE, COMMIT_A, refs=("main",))
    out = tmp_path / "out"
    proc = run("sculpt", "org/name", out, "--jobs", "1", "--name", "q4-test")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "q4-test.config.json",
        "q4-test.scout.safetensors",
        "q4-test.smoe",
        "q4-test.smoe.manifest.json",
    ]


@pytest.mark.parametrize("stem", ["", ".", "..", "a/b"])
def test_a_name_that_is_no_file_name_is_a_usage_error(stem: str, tmp_path: Path) -> None:
    proc = run("sculpt", SINGLE, tmp_path / "out", "--name", stem)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"error: argument --name: output name {stem!r}: not a file name")
    assert not (tmp_path / "out").exists()


def test_revision_picks_another_snapshot(hf_home: Path, tmp_path: Path) -> None:
    """``--revision`` as a tag (refs/TAG) or a commit hash; the default is refs/main."""
    cache = hf_home / "hub"
    cache_model(cache, "org/name", SINGLE, COMMIT_A, refs=("main",))
    cache_model(cache, "org/name", SHARDED, COMMIT_B, refs=("v2",))
    before = tree_state(hf_home)
    runs = {"main": (), "tag": ("--revision", "v2"), "hash": ("--revision", COMMIT_B)}
    for name, extra in runs.items():
        proc = run("sculpt", "org/name", tmp_path / name, "--jobs", "1", *extra)
        assert proc.returncode == 0, proc.stderr
    assert sources(tmp_path / "main" / "name.smoe.manifest.json") == ["model.safetensors"]
    shards = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    for name in ("tag", "hash"):
        assert sources(tmp_path / name / "name.smoe.manifest.json") == shards
    assert tree_state(hf_home) == before


def test_a_snapshot_folder_given_as_a_path_is_named_after_the_model(
    hf_home: Path, tmp_path: Path
) -> None:
    snap = cache_model(hf_home / "hub", "org/name", SINGLE, COMMIT_A, refs=("main",))
    before = tree_state(hf_home)
    proc = run("sculpt", snap, tmp_path / "out", "--jobs", "1")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "name.smoe").is_file()
    assert not (tmp_path / "out" / f"{COMMIT_A}.smoe").exists()
    assert tree_state(hf_home) == before


def test_an_uncached_id_offline_is_refused_in_one_line(hf_home: Path, tmp_path: Path) -> None:
    cache_model(hf_home / "hub", "org/name", SINGLE, COMMIT_A, refs=("main",))
    where = f"the HuggingFace cache ({hf_home / 'hub'})"
    for args, what in (
        (["org/other"], "org/other"),
        (["org/name", "--revision", "v9"], "org/name (revision v9)"),
    ):
        proc = run("sculpt", *args, tmp_path / "out")
        assert proc.returncode == 1
        assert proc.stderr.splitlines() == [
            f"error: {what}: no such folder, and the model is not in {where}, while the "
            "network is off (HF_HUB_OFFLINE)"
        ]
    assert not (tmp_path / "out").exists()


def test_neither_a_folder_nor_a_model_id_is_not_a_checkpoint_directory(
    hf_home: Path, tmp_path: Path
) -> None:
    for arg in ("no/such/folder", "bad-/id", "org/na--me"):
        proc = run("sculpt", arg, tmp_path / "out")
        assert proc.returncode == 1
        assert proc.stderr.splitlines() == [f"error: {arg}: not a checkpoint directory"]


def test_without_huggingface_hub_an_id_asks_for_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['huggingface_hub'] = None; from smoe.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    proc = python(code, "sculpt", "org/name", tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: a HuggingFace model id needs huggingface_hub: pip install 'smoe[hub]'"
    ]
    # a folder needs no extra
    proc = python(code, "sculpt", "--dry-run", SINGLE, tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_cached_files_keep_the_strict_input_rules(hf_home: Path, tmp_path: Path) -> None:
    """A cached shard is a symlink into blobs/: followed, and its content checked as strictly
    as any checkpoint's (here: a blob cut short)."""
    snap = cache_model(hf_home / "hub", "org/name", SINGLE, COMMIT_A, refs=("main",))
    blob = (snap / "model.safetensors").resolve()
    blob.write_bytes(blob.read_bytes()[:-100])
    proc = run("sculpt", "org/name", tmp_path / "out")
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"error: {snap / 'model.safetensors'}: ")
    assert not (tmp_path / "out").exists()


# ---- resolve(): the rules, in process ------------------------------------------------------
def test_a_local_path_wins_over_an_id(
    hf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_model(hf_home / "hub", "org/name", SHARDED, COMMIT_A, refs=("main",))
    local = tmp_path / "org" / "name"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert hub.resolve("org/name") == (Path("org/name"), "name")
    with pytest.raises(SmoeError, match=r"^org/name: --revision 'v2' applies to a model id"):
        hub.resolve("org/name", revision="v2")


def test_resolve_an_id_to_its_snapshot(hf_home: Path) -> None:
    snap = cache_model(hf_home / "hub", "org/name", SHARDED, COMMIT_A, refs=("main",))
    assert hub.resolve("org/name") == (snap, "name")
    assert hub.resolve("org/name", revision=COMMIT_A) == (snap, "name")


def test_a_partly_cached_snapshot_offline_names_what_is_missing(hf_home: Path) -> None:
    shard = "model-00002-of-00003.safetensors"
    cache_model(hf_home / "hub", "org/name", SHARDED, COMMIT_A, refs=("main",), skip=(shard,))
    with pytest.raises(SmoeError) as e:
        hub.resolve("org/name")
    assert str(e.value) == (
        f"org/name: no such folder, and the model is only partly in the HuggingFace cache "
        f"({hf_home / 'hub'}): no {shard}, while the network is off (HF_HUB_OFFLINE)"
    )


def test_a_missing_blob_is_a_missing_file(hf_home: Path) -> None:
    snap = cache_model(hf_home / "hub", "org/name", SINGLE, COMMIT_A, refs=("main",))
    (snap / "model.safetensors").resolve().unlink()
    assert hub.missing_files(snap) == ["model.safetensors"]
    with pytest.raises(SmoeError, match=r"only partly in the HuggingFace cache .*: no model"):
        hub.resolve("org/name")


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("Qwen/Qwen3-30B-A3B", True),
        ("deepseek-ai/DeepSeek-V3", True),
        ("a/b", True),
        ("gpt2", False),
        ("a/b/c", False),
        ("/abs/path", False),
        ("./x", False),
        ("x/", False),
        ("a--b/c", False),
        ("a/b..c", False),
        ("a/-b", False),
        ("a/b.", False),
        ("a/b.git", False),
        ("a/" + "b" * 95, False),
        ("a/b c", False),
        ("a/bé", False),
    ],
)
def test_what_is_a_model_id(text: str, ok: bool) -> None:
    assert hub.is_repo_id(text) is ok


def test_stem_of_a_cache_snapshot_even_through_a_symlink(tmp_path: Path) -> None:
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-30B-A3B" / "snapshots" / COMMIT_A
    snap.mkdir(parents=True)
    (tmp_path / "link").symlink_to(snap)
    assert hub.stem_of(snap) == hub.stem_of(tmp_path / "link") == "Qwen3-30B-A3B"
    assert hub.stem_of(tmp_path / "hub") == "hub"
    assert hub.stem_of(CKPTS / "qwen3_moe") == "qwen3_moe"
    assert hub.output_stem(snap, name="mine") == "mine"


# ---- downloading: huggingface_hub's snapshot_download against a stand-in Hub --------------
REMOTE_EXTRAS = {
    "README.md": b"# a model\n",
    "original/consolidated.safetensors": b"x" * 64,
    "pytorch_model.bin": b"y" * 64,
}


def stand_in_hub(
    hf_home: Path, monkeypatch: pytest.MonkeyPatch, src: Path, calls: list[dict]
) -> Callable[..., str]:
    """``snapshot_download``: the real one for cache look-ups, and for downloads a Hub whose
    repository holds ``src``'s files plus REMOTE_EXTRAS at COMMIT_B (files filtered by
    huggingface_hub's own pattern rules, written the cache's way)."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import filter_repo_objects

    real = huggingface_hub.snapshot_download
    files = {f.name: f.read_bytes() for f in src.iterdir()} | REMOTE_EXTRAS

    def download(repo_id: str, **kw: object) -> str:
        if kw.get("local_files_only"):
            return real(repo_id, **kw)
        calls.append(kw)
        wanted = set(
            filter_repo_objects(
                files,
                allow_patterns=kw.get("allow_patterns"),
                ignore_patterns=kw.get("ignore_patterns"),
            )
        )
        repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
        snap = repo / "snapshots" / COMMIT_B
        for name in sorted(wanted):
            blob = repo / "blobs" / hashlib.sha256(files[name]).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(files[name])
            (snap / name).parent.mkdir(parents=True, exist_ok=True)
            if not (snap / name).is_symlink():
                (snap / name).symlink_to(os.path.relpath(blob, (snap / name).parent))
        if kw.get("revision") in (None, "main"):
            (repo / "refs").mkdir(exist_ok=True)
            (repo / "refs" / "main").write_text(COMMIT_B)
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    return download


def test_online_a_complete_cache_is_used_without_the_hub(
    hf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = cache_model(hf_home / "hub", "org/name", SHARDED, COMMIT_A, refs=("main",))
    calls: list[dict] = []
    stand_in_hub(hf_home, monkeypatch, SHARDED, calls)
    before = tree_state(hf_home)
    assert hub.resolve("org/name") == (snap, "name")
    assert calls == []
    assert tree_state(hf_home) == before


@pytest.mark.parametrize("src", [SINGLE, SHARDED], ids=["single", "sharded"])
def test_download_fetches_only_config_index_and_shards(
    hf_home: Path, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """... and the model card, README.md (its license goes into the manifest, issue 25)."""
    calls: list[dict] = []
    stand_in_hub(hf_home, monkeypatch, src, calls)
    folder, stem = hub.resolve("org/name")
    assert (folder, stem) == (
        hf_home / "hub" / "models--org--name" / "snapshots" / COMMIT_B,
        "name",
    )
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*(f.name for f in src.iterdir() if f.name != "generation_config.json"), "README.md"]
    )
    assert calls[0]["revision"] is None
    assert calls[1]["revision"] == COMMIT_B  # the second call cannot see another commit
    # cached now: served from the cache, no more downloads
    assert hub.resolve("org/name") == (folder, "name")
    assert len(calls) == 2


def test_no_progress_bars_when_stderr_is_not_a_terminal(
    hf_home: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    if are_progress_bars_disabled():  # another test (e.g. transformers) turned them off
        enable_progress_bars()
        request.addfinalizer(disable_progress_bars)
    seen: list[bool] = []
    calls: list[dict] = []
    download = stand_in_hub(hf_home, monkeypatch, SINGLE, calls)

    def watching(repo_id: str, **kw: object) -> str:
        if not kw.get("local_files_only"):
            seen.append(are_progress_bars_disabled())
        return download(repo_id, **kw)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", watching)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    assert not are_progress_bars_disabled()
    hub.resolve("org/name")  # pytest captures stderr: not a terminal
    assert seen == [True, True]
    assert not are_progress_bars_disabled()  # restored


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            "RepositoryNotFoundError",
            "org/name: no such folder, and no such model on the "
            "HuggingFace Hub (or it is private: log in with hf auth login)",
        ),
        (
            "GatedRepoError",
            "org/name: a gated model; accept its terms on huggingface.co and log "
            "in (hf auth login)",
        ),
    ],
)
def test_hub_errors_are_one_line(
    hf_home: Path, monkeypatch: pytest.MonkeyPatch, error: str, message: str
) -> None:
    import huggingface_hub
    from huggingface_hub import utils

    calls: list[dict] = []
    download = stand_in_hub(hf_home, monkeypatch, SINGLE, calls)
    response = SimpleNamespace(headers={}, request=None)  # what the errors read of a response

    def failing(repo_id: str, **kw: object) -> str:
        if kw.get("local_files_only"):
            return download(repo_id, **kw)
        raise getattr(utils, error)("404 Client Error.\n\nRepository Not Found", response=response)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
    with pytest.raises(SmoeError) as e:
        hub.resolve("org/name")
    assert str(e.value) == message


def test_a_model_folder_that_is_a_symlink_loop_is_not_a_checkpoint(tmp_path: Path) -> None:
    """``a -> b -> a``: one line, exit 1 as for any path that is no checkpoint folder, never
    an internal error (issue 23, case 7)."""
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    r = run("sculpt", "a", "out", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "error: a: not a checkpoint directory\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
