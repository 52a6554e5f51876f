"""Provenance in the manifest (issue 25): where a vault's weights came from (model id,
revision, the files and their hashes, the model card's license), the metadata given on the
command line (``--title/--description/--license``), and ``smoe dump`` / ``smoe report``
showing it. The model card is untrusted: a lying, huge or unreadable one is a warning."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from pathlib import Path

import pytest

from smoe import cli
from smoe.errors import UsageError
from smoe.format import manifest
from smoe.format.verify import verify_path
from smoe.sculpt import SculptOptions, sculpt
from smoe.sculpt.source.card import MAX_BYTES, front_matter

from fixtures_data import CKPTS

SINGLE = CKPTS / "qwen3_moe"
SHARDED = CKPTS / "qwen3_moe_sharded"
COMMIT = "c0ffee" + "0" * 34
CARD = (
    "---\n"
    "license: apache-2.0\n"
    "license_link: https://huggingface.co/org/name/blob/main/LICENSE  # the terms\n"
    "model_name: 'Tiny Qwen3 MoE'\n"
    "base_model:\n"
    "  - org/base\n"
    "tags: [moe, test]\n"
    "---\n"
    "# Tiny\n"
)


def smoe(capsys: pytest.CaptureFixture, *args: object) -> tuple[int, str, str]:
    """``smoe ARGS`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = cli.main([os.fspath(a) if isinstance(a, Path) else str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def manifest_of(vault: Path) -> dict:
    return json.loads(manifest.path_for(vault).read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def header_sha256(shard: Path) -> str:
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return hashlib.sha256(data[: 8 + n]).hexdigest()


def with_card(src: Path, folder: Path, card: str | bytes | None = CARD) -> Path:
    shutil.copytree(src, folder)
    if card is not None:
        data = card.encode() if isinstance(card, str) else card
        (folder / "README.md").write_bytes(data)
    return folder


# ---- a checkpoint folder ------------------------------------------------------------------
def test_a_folder_records_its_files_their_hashes_and_the_card(tmp_path: Path) -> None:
    model = with_card(SINGLE, tmp_path / "m")
    res = sculpt(model, tmp_path / "out", SculptOptions(jobs=1))
    assert res.warnings == []
    doc = manifest_of(res.vault)
    source = doc["source"]
    assert source["files"] == [
        {
            "name": "model.safetensors",
            "size": (model / "model.safetensors").stat().st_size,
            "header_sha256": header_sha256(model / "model.safetensors"),
        }
    ]
    assert source["small_files"] == [
        {"name": n, "size": (model / n).stat().st_size, "sha256": sha256(model / n)}
        for n in ("config.json", "README.md")
    ]
    assert source["card"] == {
        "license": "apache-2.0",
        "license_link": "https://huggingface.co/org/name/blob/main/LICENSE",
        "model_name": "Tiny Qwen3 MoE",
        "base_model": ["org/base"],
    }
    assert "model_id" not in source and "revision" not in source  # not a cache snapshot
    assert "metadata" not in doc  # none given
    assert verify_path(res.vault, deep=True).ok


def test_a_sharded_folder_hashes_each_shard_header_and_the_index(tmp_path: Path) -> None:
    res = sculpt(SHARDED, tmp_path / "out", SculptOptions(jobs=1))
    source = manifest_of(res.vault)["source"]
    shards = sorted(SHARDED.glob("*.safetensors"))
    assert [f["header_sha256"] for f in source["files"]] == [header_sha256(s) for s in shards]
    assert [(f["name"], f["sha256"]) for f in source["small_files"]] == [
        ("config.json", sha256(SHARDED / "config.json")),
        ("model.safetensors.index.json", sha256(SHARDED / "model.safetensors.index.json")),
    ]
    assert "card" not in source


def test_title_description_license_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--name`` still names the files; ``--title`` is the human-readable name."""
    out = tmp_path / "out"
    code, _, err = smoe(
        capsys,
        *("sculpt", SINGLE, out, "--jobs", "1", "--name", "q4-test", "--json"),
        *("--title", "Qwen3 MoE — tiny, Q4", "--description", "for tests\nsecond line"),
        *("--license", "Apache-2.0 OR MIT"),
    )
    assert (code, err) == (0, "")
    assert sorted(p.name for p in out.iterdir())[-1] == "q4-test.smoe.manifest.json"
    assert manifest_of(out / "q4-test.smoe")["metadata"] == {
        "description": "for tests\nsecond line",
        "license": "Apache-2.0 OR MIT",
        "name": "Qwen3 MoE — tiny, Q4",
    }
    raw = manifest.path_for(out / "q4-test.smoe").read_bytes()
    assert raw.isascii() and b"\\u2014" in raw  # the manifest's JSON escapes non-ASCII


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [
        ("--title", "", "metadata name: the value is empty (--unset name removes a key)"),
        (
            "--title",
            "x" * 257,
            "metadata name: the value is 257 characters, more than the 256 allowed",
        ),
        (
            "--description",
            "bell\x07",
            "metadata description: the value holds the control character U+0007; text only "
            "(tab and line feed allowed)",
        ),
        (
            "--license",
            "<MIT>",
            "metadata license: '<MIT>' is not a license id (an SPDX identifier or expression "
            "such as Apache-2.0 or 'MIT OR Apache-2.0', or a Hub id such as llama3.1: letters, "
            "digits, '.', '+', '-', '_', ':', parentheses and spaces)",
        ),
    ],
)
def test_bad_metadata_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture, flag: str, value: str, why: str
) -> None:
    out = tmp_path / "out"
    code, stdout, err = smoe(capsys, "sculpt", SINGLE, out, flag, value)
    assert (code, stdout) == (2, "")
    assert err == f"error: argument {flag}: {why} (see smoe sculpt --help)\n"
    assert not out.exists()


def test_the_library_refuses_bad_metadata_too(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        sculpt(SINGLE, tmp_path / "out", SculptOptions(jobs=1, title="caf\udce9"))
    assert str(info.value) == "metadata name: the value is not UTF-8 text (undecodable bytes)"
    assert not (tmp_path / "out").exists()


# ---- a HuggingFace cache snapshot -----------------------------------------------------------
def cache_model(cache: Path, repo_id: str, src: Path, commit: str) -> Path:
    """``src`` as huggingface_hub caches it: the safetensors (LFS files) as blobs named by
    their SHA-256, the small files by their git blob hash (40 hex digits), refs/main."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    for sub in (snap, repo / "blobs", repo / "refs"):
        sub.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        data = f.read_bytes()
        if f.suffix == ".safetensors":
            name = hashlib.sha256(data).hexdigest()
        else:
            name = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (repo / "blobs" / name).write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(repo / "blobs" / name, snap))
    (repo / "refs" / "main").write_text(commit)
    return snap


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline HF cache (this process's huggingface_hub pointed at it too)."""
    pytest.importorskip("huggingface_hub", reason="needs the smoe[hub] extra")
    from huggingface_hub import constants

    home = tmp_path / "hf"
    (home / "hub").mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home / "hub"


def test_a_model_id_records_the_id_the_commit_and_the_hub_hashes(
    hf_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src = with_card(SHARDED, tmp_path / "src")
    snap = cache_model(hf_cache, "org/name", src, COMMIT)
    out = tmp_path / "out"
    code, _, err = smoe(capsys, "sculpt", "org/name", out, "--jobs", "1", "--title", "Tiny")
    assert (code, err) == (0, ""), err
    doc = manifest_of(out / "name.smoe")
    source = doc["source"]
    assert (source["model_id"], source["revision"]) == ("org/name", COMMIT)
    shards = sorted(src.glob("*.safetensors"))
    assert [(f["name"], f["lfs_sha256"]) for f in source["files"]] == [
        (s.name, sha256(s)) for s in shards
    ]
    assert [f["name"] for f in source["small_files"]] == [
        "config.json",
        "model.safetensors.index.json",
        "README.md",
    ]
    assert all("lfs_sha256" not in f for f in source["small_files"])
    assert source["card"]["license"] == "apache-2.0"
    assert doc["metadata"] == {"name": "Tiny"}
    # the snapshot folder given as a path: the same provenance
    res = sculpt(snap, tmp_path / "out2", SculptOptions(jobs=1))
    assert manifest_of(res.vault)["source"] == source


# ---- a model card that lies ---------------------------------------------------------------
def test_a_huge_card_is_read_bounded(tmp_path: Path) -> None:
    """Its front matter never ends within the bound: a warning, no card, no SHA-256 above
    64 MiB (a sparse file: nothing is read past the bound)."""
    model = with_card(SINGLE, tmp_path / "m", "---\nlicense: mit\n")
    with open(model / "README.md", "r+b") as f:
        f.truncate((64 << 20) + 1)
    res = sculpt(model, tmp_path / "out", SculptOptions(jobs=1))
    assert res.warnings == [
        f"{model / 'README.md'}: its front matter (between '---' lines) does not end within "
        f"the first {MAX_BYTES} bytes; the model card's license is not recorded"
    ]
    source = manifest_of(res.vault)["source"]
    assert "card" not in source
    assert source["small_files"][-1] == {
        "name": "README.md",
        "size": (64 << 20) + 1,
        "sha256": None,
    }


@pytest.mark.parametrize("kind", ["fifo", "device", "binary", "folder"])
def test_an_unreadable_card_is_a_warning(tmp_path: Path, kind: str) -> None:
    model = with_card(SINGLE, tmp_path / "m", None)
    card = model / "README.md"
    if kind == "fifo":
        os.mkfifo(card)
    elif kind == "device":
        card.symlink_to("/dev/zero")
    elif kind == "folder":
        card.mkdir()
    else:
        card.write_bytes(b"---\nlicense: \xff\xfe\n---\n")
    res = sculpt(model, tmp_path / "out", SculptOptions(jobs=1))
    why = {
        "fifo": "not a regular file (a FIFO)",
        "device": "not a regular file (a character device)",
        "folder": "not a regular file (a folder)",
        "binary": "not UTF-8 text (byte 13)",
    }[kind]
    assert res.warnings == [f"{card}: {why}; the model card's license is not recorded"]
    source = manifest_of(res.vault)["source"]
    assert "card" not in source
    assert [f["name"] for f in source["small_files"]] == (
        ["config.json", "README.md"] if kind == "binary" else ["config.json"]
    )


def test_front_matter_is_read_line_by_line_without_yaml() -> None:
    lines = [
        "---",
        "license: &l mit",  # an anchor: left out
        "model_name: *l",  # an alias: left out
        'license_name: "quoted \\"name\\""',
        "base_model: [a/b, 'c/d', {x: y}]",
        "license_link: |",  # a block scalar: left out
        "  https://example.com",
        "  nested: value",
        "model_name: plain # comment",
        "license: second",  # the first license had no plain value: this one is kept
        "---",
        "license: after the front matter",
    ]
    assert front_matter(lines) == {
        "license_name": 'quoted "name"',
        "base_model": ["a/b", "c/d"],
        "model_name": "plain",
        "license": "second",
    }
    assert front_matter(["---", "license: " + "x" * 1025, "---"]) == {}


# ---- dump and report show it -------------------------------------------------------------------
@pytest.fixture
def sculpted(tmp_path: Path) -> Path:
    model = with_card(SINGLE, tmp_path / "m")
    opts = SculptOptions(jobs=1, title="Tiny <b>bold</b>", license="Apache-2.0")
    return sculpt(model, tmp_path / "out", opts).vault


def test_dump_shows_the_provenance(sculpted: Path, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = smoe(capsys, "dump", sculpted)
    assert code == 0
    block = out.split("\n├── header")[0].splitlines()
    assert block[1] == f"├── provenance (from {manifest.path_for(sculpted).name})"
    fields = [
        re.split(r"\s{2,}", re.sub(r"^[│├└─\s]+", "", line), maxsplit=1) for line in block[2:]
    ]
    assert fields == [
        ["source.model_type", "qwen3_moe"],
        ["source.files", "1 file, 387,120 bytes"],
        ["source.card.base_model", "org/base"],
        ["source.card.license", "apache-2.0"],
        ["source.card.license_link", "https://huggingface.co/org/name/blob/main/LICENSE"],
        ["source.card.model_name", "Tiny Qwen3 MoE"],
        [
            "tool",
            f"smoe {manifest_of(sculpted)['tool']['version']} sculpt (bits 4, scale optimal, "
            "version 2)",
        ],
        ["metadata.license", "Apache-2.0"],
        ["metadata.name", "Tiny <b>bold</b>"],
    ]
    code, out, _ = smoe(capsys, "dump", sculpted, "--json")
    prov = json.loads(out)["provenance"]
    assert prov["manifest"] == str(manifest.path_for(sculpted))
    assert prov["metadata"] == {"license": "Apache-2.0", "name": "Tiny <b>bold</b>"}
    assert prov["source"]["card"]["license"] == "apache-2.0"
    assert prov["tool"]["command"] == "sculpt"
    code, out, _ = smoe(capsys, "dump", sculpted, "--field", "provenance.source.card.license")
    assert (code, out) == (0, "apache-2.0\n")
    code, out, _ = smoe(capsys, "dump", sculpted, "--no-manifest", "--json")
    assert json.loads(out)["provenance"] is None


def test_report_shows_the_provenance(
    sculpted: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    page = tmp_path / "r.html"
    code, out, _ = smoe(capsys, "report", sculpted, "-o", page, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["provenance"]["metadata"]["name"] == "Tiny <b>bold</b>"
    assert doc["provenance"]["source"]["model_type"] == "qwen3_moe"
    html = page.read_text()
    section = html.split('<section id="provenance">')[1].split("</section>")[0]
    assert (
        '<td><code>metadata.name</code></td><td class="mono">Tiny &lt;b&gt;bold&lt;/b&gt;'
        in section
    )
    assert '<td><code>source.card.license</code></td><td class="mono">apache-2.0</td>' in section
    code, out, _ = smoe(
        capsys, "report", sculpted, "-o", page, "--no-manifest", "--json", "--force"
    )
    assert json.loads(out)["provenance"] is None
    assert 'id="provenance"' not in page.read_text()


def strings(obj: object) -> list[str]:
    """Every string of a JSON document, keys included."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in (k, *strings(v))]
    if isinstance(obj, list):
        return [s for v in obj for s in strings(v)]
    return []


def test_no_lone_surrogate_reaches_the_manifest(tmp_path: Path) -> None:
    """A checkpoint folder whose name is not UTF-8 (the vault is named after it), written
    into a folder whose name is not either, and a card value holding a ``\\ud800`` escape:
    the manifest is strict UTF-8 JSON with no lone surrogate, an undecodable byte written
    ``\\xNN`` (issue 31)."""
    model = Path(os.fsdecode(bytes(tmp_path) + b"/m\xff"))
    shutil.copytree(SHARDED, model)
    (model / "README.md").write_text('---\nlicense: "apache\\ud800-2.0"\n---\n')
    out = Path(os.fsdecode(bytes(tmp_path) + b"/out\xfd"))
    result = sculpt(model, out, SculptOptions(jobs=1))
    raw = manifest.path_for(result.vault).read_bytes()
    doc = json.loads(raw.decode("utf-8"))  # strict: a lone surrogate escape would pass here
    for s in strings(doc):
        s.encode("utf-8")  # ... but not here
    assert doc["vault"]["name"] == "m\\xff.smoe"
    assert doc["source"]["card"]["license"] == "apache\ufffd-2.0"
    assert verify_path(result.vault, deep=True).ok


def test_the_manifest_encoder_writes_no_lone_surrogate() -> None:
    """Whatever a caller hands it: keys and values, bytes of names and escapes alike."""
    doc = {"vault": {"name": os.fsdecode(b"v\xff.smoe")}, "k\ud800": ["x\udfff"]}
    text = manifest.encode(doc).decode("ascii")
    assert json.loads(text) == {"vault": {"name": "v\\xff.smoe"}, "k\ufffd": ["x\ufffd"]}
    assert "\\ud" not in text.lower()
