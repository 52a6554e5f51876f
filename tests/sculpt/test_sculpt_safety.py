"""The Sculptor never loses data or writes a wrong file (issue 10).

Checked writes (short writes, disk full), one writer per target, no symlink followed, no
output that is an input, resume decided by content, bounded worker pools, clean aborts
when a worker fails, the commit order of vault, scout and manifest, and the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import crc32c
import numpy as np
import pytest

from smoe import __version__
from smoe.errors import SmoeError
from smoe.format import manifest
from smoe.plumbing import fileio
from smoe.plumbing.cpus import usable_cores
from smoe.sculpt import SculptOptions, sculpt
from smoe.sculpt import workers as workers_mod
from smoe.sculpt.source.checkpoint import Checkpoint
from smoe_gen import layout
from smoe_testkit.synth import write_checkpoint

from fixtures_data import CKPTS
from helpers import HANG_GUARD, plain_env, python, refused, run

REFUSED = "not a file smoe made; refused, not followed and not deleted"


def finals(out: Path, stem: str) -> list[Path]:
    return [
        out / f"{stem}.smoe",
        out / f"{stem}.scout.safetensors",
        out / f"{stem}.smoe.manifest.json",
        out / f"{stem}.config.json",
    ]


def contents(out: Path, stem: str) -> list[bytes]:
    """Vault, scout, manifest and config copy bytes."""
    return [p.read_bytes() for p in finals(out, stem)]


def listing(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir())


def interrupt_after(n: int) -> Callable[[int, int, int], None]:
    """A progress hook that stops the run like Ctrl-C once ``n`` experts are done."""

    def hook(done: int, total: int, nbytes: int) -> None:
        if done == n:
            raise KeyboardInterrupt

    return hook


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("ckpt")
    write_checkpoint(base / "qwen", layers=2, experts=4, d_model=64, ffn=32, seed=1)
    write_checkpoint(base / "mid", layers=2, experts=8, d_model=256, ffn=128, seed=3)
    write_checkpoint(base / "wide", layers=2, experts=4, d_model=64, ffn=32, vocab=16384, seed=4)
    return base


@pytest.fixture(scope="module")
def clean(ckpts: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[bytes]]:
    """Vault, scout and manifest of an uninterrupted Q4 run per checkpoint."""
    base = tmp_path_factory.mktemp("clean")
    out = {}
    for name in ("qwen", "mid"):
        sculpt(ckpts / name, base / name, SculptOptions(jobs=1))
        out[name] = contents(base / name, name)
    return out


# ---- checked writes ------------------------------------------------------------------------
def test_short_writes_give_identical_output(
    ckpts: Path, clean: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwrite
    calls = []

    def at_most_7_bytes(fd: int, data, offset: int) -> int:
        calls.append(offset)
        return real(fd, memoryview(data).cast("B")[:7], offset)

    monkeypatch.setattr(os, "pwrite", at_most_7_bytes)  # forked workers inherit it
    for jobs in (1, 2):
        out = tmp_path / f"j{jobs}"
        sculpt(ckpts / "qwen", out, SculptOptions(jobs=jobs))
        assert contents(out, "qwen") == clean["qwen"]
    assert len(calls) > 10_000


@pytest.mark.parametrize(
    ("name", "size", "culprit"),
    [
        ("mid", "256k", "mid.smoe"),  # a worker's blob write fails
        ("wide", "512k", "wide.scout.safetensors"),  # the vault's blobs fit, the scout does not
    ],
)
def test_disk_full_is_one_line_and_leaves_no_output(
    ckpts: Path, tmpfs, name: str, size: str, culprit: str
) -> None:
    out = tmpfs("mnt", f"size={size}") / "out"
    proc = run("sculpt", ckpts / name, out, "--jobs", "2")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.fullmatch(
        rf"error: {re.escape(str(out / culprit))}: cannot write \d+ bytes at "
        r"offset \d+: No space left on device",
        lines[0],
    ), lines[0]
    # nothing under a final name, no partial, no journal, no temporary file, no lock
    assert listing(out) == []


# ---- commit order ----------------------------------------------------------------------------
KILL_AFTER_RENAME = """
import os, sys
from smoe.plumbing import fileio
from smoe.sculpt import SculptOptions, sculpt

real = fileio.rename

def rename(src, dst):
    real(src, dst)
    if str(dst).endswith(sys.argv[3]):
        os._exit(9)  # like SIGKILL right after this rename

fileio.rename = rename
sculpt(sys.argv[1], sys.argv[2], SculptOptions(jobs=1))
"""


@pytest.mark.parametrize("after", [".scout.safetensors", ".config.json", ".smoe.manifest.json"])
def test_kill_between_renames_then_resume_completes(
    ckpts: Path, clean: dict, tmp_path: Path, after: str
) -> None:
    out = tmp_path / "out"
    killed = python(KILL_AFTER_RENAME, ckpts / "qwen", out, after)
    assert killed.returncode == 9
    names = listing(out)
    assert "qwen.smoe" not in names  # the vault is the commit point: it comes last
    assert f"qwen{after}" in names
    assert {".qwen.smoe.journal", ".qwen.smoe.partial"} <= set(names)
    done = run("sculpt", ckpts / "qwen", out, "--resume", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["experts_resumed"], summary["experts_written"]) == (8, 0)
    assert contents(out, "qwen") == clean["qwen"]
    assert [n for n in listing(out) if not n.endswith(".tmp")] == [
        "qwen.config.json",
        "qwen.scout.safetensors",
        "qwen.smoe",
        "qwen.smoe.manifest.json",
    ]


def test_config_is_committed_byte_for_byte(ckpts: Path, tmp_path: Path) -> None:
    source = ckpts / "qwen" / "config.json"
    res = sculpt(ckpts / "qwen", tmp_path / "out", SculptOptions(jobs=1))
    assert res.config == tmp_path / "out" / "qwen.config.json"
    assert res.config.read_bytes() == source.read_bytes()
    assert res.summary()["config"] == str(res.config)


def test_config_changed_while_sculpting_is_refused(ckpts: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(ckpts / "qwen", model)
    config = model / "config.json"

    def edit(done: int, total: int, nbytes: int) -> None:
        if done == 1:
            cfg = json.loads(config.read_text())
            cfg["num_experts_per_tok"] = 1
            config.write_text(json.dumps(cfg))

    out = tmp_path / "out"
    with pytest.raises(SmoeError) as info:
        sculpt(model, out, SculptOptions(jobs=1), progress=edit)
    assert str(info.value) == f"{config}: changed while sculpting; refused"
    assert [n for n in listing(out) if not n.startswith(".qwen.smoe.")] == []


def test_failed_vault_rename_removes_the_companions(
    ckpts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = fileio.rename
    out = tmp_path / "out"
    vault = out / "qwen.smoe"

    def rename(src, dst) -> None:
        if Path(dst) == vault:
            raise SmoeError(f"{dst}: cannot rename {Path(src).name} onto it: Input/output error")
        real(src, dst)

    monkeypatch.setattr(fileio, "rename", rename)
    with pytest.raises(SmoeError) as info:
        sculpt(ckpts / "qwen", out, SculptOptions(jobs=1))
    assert str(info.value) == (
        f"{vault}: cannot rename .qwen.smoe.partial onto it: Input/output error"
    )
    assert listing(out) == []  # scout and manifest were renamed, then removed again


# ---- one writer per target -------------------------------------------------------------------
HOLD = """
import sys
from smoe.sculpt import SculptOptions, sculpt

def hold(done, total, nbytes):
    if done == 1:
        print("holding", flush=True)
        sys.stdin.readline()

sculpt(sys.argv[1], sys.argv[2], SculptOptions(bits=int(sys.argv[3]), jobs=1), progress=hold)
print("done", flush=True)
"""


def test_second_sculpt_into_the_same_target_stops_at_once(
    ckpts: Path, clean: dict, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(ckpts / "qwen"), str(out), "4"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=plain_env(),
    )
    try:
        assert first.stdout.readline() == "holding\n"  # it holds the lock and is mid-run
        assert (out / ".qwen.smoe.lock").read_text() == f"{first.pid}\n"
        second = run("sculpt", ckpts / "qwen", out, "--bits", "2")
        assert second.returncode == 1
        assert second.stderr.splitlines() == [
            f"error: {out / 'qwen.smoe'}: another smoe process (pid {first.pid}) is writing "
            "it; wait for it to finish (lock .qwen.smoe.lock)"
        ]
        assert not (out / "qwen.smoe").exists()
        rest, _ = first.communicate("\n", timeout=HANG_GUARD)
        assert rest == "done\n"
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0
    assert contents(out, "qwen") == clean["qwen"]  # the Q4 run, untouched by the Q2 attempt
    assert listing(out) == [
        "qwen.config.json",
        "qwen.scout.safetensors",
        "qwen.smoe",
        "qwen.smoe.manifest.json",
    ]


# ---- no symlink followed, no input overwritten -----------------------------------------------
@pytest.mark.parametrize("which", ["partial", "journal", "lock"])
@pytest.mark.parametrize("resume", [False, True])
def test_planted_symlink_is_refused_not_followed(
    ckpts: Path, tmp_path: Path, which: str, resume: bool
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious\n" * 100)
    link = out / f".qwen.smoe.{which}"
    link.symlink_to(victim)
    proc = run("sculpt", ckpts / "qwen", out, *(["--resume"] if resume else []))
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"error: {link}: is a symlink, {REFUSED}"]
    assert victim.read_bytes() == b"precious\n" * 100
    assert link.is_symlink() and os.readlink(link) == str(victim)
    assert not any(p.exists() for p in finals(out, "qwen"))
    assert listing(out) == [link.name]


def test_hard_linked_journal_is_refused_not_deleted(ckpts: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    other = tmp_path / "notes.txt"
    other.write_text("keep me\n")
    journal = out / ".qwen.smoe.journal"
    os.link(other, journal)
    proc = run("sculpt", ckpts / "qwen", out, "--resume")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"error: {journal}: has 2 hard links, {REFUSED}"]
    assert other.read_text() == journal.read_text() == "keep me\n"
    assert not any(p.exists() for p in finals(out, "qwen"))


def test_output_that_is_an_input_is_refused_before_writing(tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / "m", layers=1, experts=2, d_model=64, ffn=32, seed=2, shards=2)
    inputs = sorted(ck.iterdir())
    before = {p: p.read_bytes() for p in inputs}
    shard = ck / "model-00001-of-00002.safetensors"
    out = tmp_path / "out"
    out.mkdir()
    cases = [
        ("vault", out / "m.smoe", shard, Path.symlink_to),
        ("scout", out / "m.scout.safetensors", ck / "config.json", Path.hardlink_to),
        (
            "manifest",
            out / "m.smoe.manifest.json",
            ck / "model.safetensors.index.json",
            Path.symlink_to,
        ),
    ]
    for what, planted, src, make in cases:
        make(planted, src)
        message = f"{planted}: the {what} is the input {src} itself; refusing to overwrite an input"
        with pytest.raises(SmoeError) as info:
            sculpt(ck, out, SculptOptions())
        assert str(info.value) == message
        proc = run("sculpt", ck, out)
        assert proc.returncode == 1
        assert proc.stderr.splitlines() == [f"error: {message}"]
        assert listing(out) == [planted.name]  # not even a lock or a partial
        planted.unlink()
    assert {p: p.read_bytes() for p in sorted(ck.iterdir())} == before


# ---- resume decides by content ---------------------------------------------------------------
def test_resume_redoes_changed_sources_and_damaged_blobs(tmp_path: Path) -> None:
    ck = write_checkpoint(
        tmp_path / "ck" / "stale", layers=2, experts=8, d_model=64, ffn=32, seed=11
    )
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        sculpt(ck, out, SculptOptions(jobs=1), progress=interrupt_after(10))
    lines = (out / ".stale.smoe.journal").read_text().splitlines()
    assert re.fullmatch(r"smoe-journal/2 [0-9a-f]{64}", lines[0])
    assert len(lines) == 11
    assert all(re.fullmatch(r"(\d+ ){6}([-0-9.e]+|-)( ([-0-9.e]+|-)){2}", ln) for ln in lines[1:])
    # 3 journaled experts get other weights of the same size; the shard keeps size and mtime
    c = Checkpoint.open(ck)
    shard = ck / "model.safetensors"
    st = shard.stat()
    donor = c.experts[(1, 7)].sources[1][0]
    fd = os.open(shard, os.O_RDWR)
    try:
        new = os.pread(fd, donor.nbytes, donor.offset)
        for e in (1, 2, 3):
            info = c.experts[(0, e)].sources[1][0]
            assert info.nbytes == donor.nbytes
            os.pwrite(fd, new, info.offset)
    finally:
        os.close(fd)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (shard.stat().st_size, shard.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    # and one journaled blob is damaged in the partial file
    ref = sculpt(ck, tmp_path / "clean", SculptOptions(jobs=2))
    rows = json.loads(manifest.path_for(ref.vault).read_text())["experts"]
    offset = next(r["offset"] for r in rows if (r["layer"], r["expert"]) == (0, 5))
    with open(out / ".stale.smoe.partial", "r+b") as f:
        f.seek(offset + 100)
        f.write(b"\xff" * 8)
    res = sculpt(ck, out, SculptOptions(jobs=1, resume=True))
    assert (res.experts_resumed, res.experts_written) == (6, 10)
    assert contents(out, "stale") == contents(tmp_path / "clean", "stale")


def test_resumed_and_parallel_runs_are_byte_identical(
    ckpts: Path, clean: dict, tmp_path: Path
) -> None:
    for jobs, stop in ((2, 3), (1, 7), (2, 8)):
        out = tmp_path / f"j{jobs}-{stop}"
        with pytest.raises(KeyboardInterrupt):
            sculpt(ckpts / "qwen", out, SculptOptions(jobs=jobs), progress=interrupt_after(stop))
        assert not any(p.exists() for p in finals(out, "qwen"))
        res = sculpt(ckpts / "qwen", out, SculptOptions(jobs=3 - jobs, resume=True))
        assert (res.experts_resumed, res.experts_written) == (stop, 8 - stop)
        assert contents(out, "qwen") == clean["qwen"]
    sculpt(ckpts / "qwen", tmp_path / "j2", SculptOptions(jobs=2))
    assert contents(tmp_path / "j2", "qwen") == clean["qwen"]


def test_resume_after_other_options_starts_over(ckpts: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        sculpt(ckpts / "qwen", out, SculptOptions(bits=2, jobs=1), progress=interrupt_after(5))
    res = sculpt(ckpts / "qwen", out, SculptOptions(bits=4, jobs=1, resume=True))
    assert (res.experts_resumed, res.experts_written) == (0, 8)
    ref = sculpt(ckpts / "qwen", tmp_path / "ref", SculptOptions(bits=4, jobs=1))
    assert ref.vault.read_bytes() == res.vault.read_bytes()


# ---- --jobs --------------------------------------------------------------------------------
@pytest.mark.parametrize("jobs", [0, -5])
def test_jobs_below_one_refused(ckpts: Path, tmp_path: Path, jobs: int) -> None:
    out = tmp_path / "out"
    with pytest.raises(SmoeError) as info:
        sculpt(ckpts / "qwen", out, SculptOptions(jobs=jobs))
    assert str(info.value) == f"--jobs: must be at least 1, got {jobs}"
    proc = run("sculpt", ckpts / "qwen", out, "--jobs", jobs)
    assert refused(proc, 2) == (
        f"error: argument --jobs: expected a whole number >= 1, got '{jobs}' "
        "(see smoe sculpt --help)"
    )
    assert not out.exists()


def test_never_more_workers_than_batches(
    ckpts: Path, clean: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    real = workers_mod._make_pool

    def counting(processes: int):
        asked.append(processes)
        return real(processes)

    monkeypatch.setattr(workers_mod, "_make_pool", counting)
    sculpt(ckpts / "qwen", tmp_path / "a", SculptOptions(jobs=48))  # 8 experts: 2 batches of 4
    assert asked == [2]
    assert contents(tmp_path / "a", "qwen") == clean["qwen"]
    sculpt(ckpts / "qwen", tmp_path / "b", SculptOptions(jobs=48, max_experts=1))  # one batch
    assert asked == [2]  # no pool at all: the batch runs in-process
    sculpt(ckpts / "qwen", tmp_path / "c", SculptOptions())  # default: the usable cores
    want = min(usable_cores(), 2)
    assert asked == [2, want] if want > 1 else asked == [2]
    assert contents(tmp_path / "c", "qwen") == clean["qwen"]


# ---- a worker fails ----------------------------------------------------------------------------
def test_worker_error_aborts_cleanly_and_releases_the_lock(tmp_path: Path) -> None:
    ck = write_checkpoint(
        tmp_path / "ck" / "nan", layers=2, experts=8, d_model=64, ffn=32, dtype="F32", seed=5
    )
    info = Checkpoint.open(ck).experts[(1, 6)].sources[2][0]
    shard = ck / "model.safetensors"
    good = shard.read_bytes()
    bad = bytearray(good)
    bad[info.offset + 40 : info.offset + 44] = np.float32("nan").tobytes()
    shard.write_bytes(bytes(bad))
    out = tmp_path / "out"
    proc = run("sculpt", ck, out, "--jobs", "2")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: layer 1 expert 6 down_proj: "), lines
    assert listing(out) == []  # no partial, journal, temporary file, lock or output
    shard.write_bytes(good)
    done = run("sculpt", ck, out, "--jobs", "2")  # the lock was released
    assert done.returncode == 0, done.stderr


# ---- the manifest --------------------------------------------------------------------------
def test_manifest_matches_the_vault_and_the_sources(tmp_path: Path) -> None:
    ck = write_checkpoint(
        tmp_path / "ck" / "fz", layers=2, experts=4, d_model=64, ffn=32, fused=True, seed=9
    )
    res = sculpt(ck, tmp_path / "out", SculptOptions(jobs=2))
    data = res.vault.read_bytes()
    text = manifest.path_for(res.vault).read_text()
    assert str(tmp_path) not in text  # no absolute path: the bytes depend on the content only
    total = 8
    table = np.frombuffer(data, layout.EXPERT_ENTRY_DTYPE, total, layout.TABLE_OFFSET)
    doc = manifest.load(manifest.path_for(res.vault), total)
    assert manifest.check(doc, len(data), table, lambda off, n: data[off : off + n]) == []
    assert doc["vault"] == {"name": "fz.smoe", "size": len(data), "experts": total, "bits": 4}
    assert doc["tool"] == {
        "name": "smoe",
        "version": __version__,
        "command": "sculpt",
        "options": {
            "bits": 4,
            "max_experts": None,
            "max_layers": None,
            "scale": "optimal",
            "version": 2,
        },
    }
    shard = ck / "model.safetensors"
    raw = shard.read_bytes()
    (head,) = struct.unpack("<Q", raw[:8])
    config = (ck / "config.json").read_bytes()
    assert doc["source"] == {
        "model_type": "qwen3_moe",
        "files": [
            {
                "name": "model.safetensors",
                "size": shard.stat().st_size,
                "header_sha256": hashlib.sha256(raw[: 8 + head]).hexdigest(),
            }
        ],
        "small_files": [
            {
                "name": "config.json",
                "size": len(config),
                "sha256": hashlib.sha256(config).hexdigest(),
            }
        ],
    }
    c = Checkpoint.open(ck)
    for row, entry in zip(doc["experts"], table):
        off, size = int(entry["byte_offset"]), int(entry["raw_size"])
        assert (row["layer"], row["expert"], row["offset"], row["raw_size"]) == (
            int(entry["layer_id"]),
            int(entry["expert_id"]),
            off,
            size,
        )
        assert row["crc32c"] == crc32c.crc32c(data[off : off + size])
        layer, e = row["layer"], row["expert"]
        gu = c.tensors[f"model.layers.{layer}.mlp.experts.gate_up_proj"]
        down = c.tensors[f"model.layers.{layer}.mlp.experts.down_proj"]
        half = 32 * 64 * 2  # 32 rows of 64 BF16 values
        slab = raw[gu.offset + e * 2 * half : gu.offset + (e + 1) * 2 * half]
        dslab = raw[down.offset + e * half : down.offset + (e + 1) * half]
        want = [
            ("gate_proj", gu.name, [0, 32], slab[:half]),
            ("up_proj", gu.name, [32, 64], slab[half:]),
            ("down_proj", down.name, None, dslab),
        ]
        for t, (name, source, rows, src_bytes) in zip(row["tensors"], want):
            assert (t["name"], t["source"], t["index"], t["rows"]) == (name, source, e, rows)
            assert t["source_crc32c"] == crc32c.crc32c(src_bytes)
            assert t["snr_db"] > 5.0


def test_vault_writer_writes_a_deterministic_manifest(tmp_path: Path) -> None:
    from smoe.format.records import ModelInfo
    from smoe.vault.writer import write_vault

    model = ModelInfo(
        num_moe_layers=2, max_experts_per_layer=3, d_model=16, vocab_size=50, ffn_dim=8
    )
    rng = np.random.default_rng(3)
    experts = {
        (lay, e): [rng.normal(0, 0.02, s).astype(np.float32) for s in ((8, 16), (8, 16), (16, 8))]
        for lay in range(2)
        for e in range(3)
    }
    backwards = dict(reversed(experts.items()))
    for name, mats in (("a", experts), ("b", backwards)):
        write_vault(tmp_path / name / "v.smoe", model, mats, version=1)
    a, b = (tmp_path / d / "v.smoe.manifest.json" for d in "ab")
    assert a.read_bytes() == b.read_bytes()
    doc = json.loads(a.read_text())
    assert doc["tool"] == {
        "name": "smoe",
        "version": __version__,
        "command": "VaultWriter",
        "options": {"bits": 4, "scale": "optimal", "version": 1},
    }
    assert doc["source"] is None
    data = (tmp_path / "a" / "v.smoe").read_bytes()
    for row in doc["experts"]:
        assert "tensors" not in row
        assert row["crc32c"] == crc32c.crc32c(data[row["offset"] : row["offset"] + row["raw_size"]])
    # without a manifest, one left beside an older vault of that name is removed
    write_vault(
        tmp_path / "a" / "v.smoe", model, {(0, 0): experts[(0, 0)]}, version=1, manifest=False
    )
    assert listing(tmp_path / "a") == ["v.smoe"]


def test_temporary_files_of_a_killed_run_are_swept(
    ckpts: Path, tmp_path: Path, clean: dict[str, list[bytes]]
) -> None:
    """Staged scout/manifest temporaries a SIGKILL left are removed; links are left alone."""
    out = tmp_path / "out"
    out.mkdir()
    stale = [
        out / ".qwen.scout.safetensors.0123abcd.tmp",
        out / ".qwen.smoe.manifest.json.89abcdef.tmp",
    ]
    for p in stale:
        p.write_bytes(b"left by a killed run")
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    link = out / ".qwen.smoe.deadbeef.tmp"
    link.symlink_to(target)
    sculpt(ckpts / "qwen", out, SculptOptions(jobs=1))
    assert listing(out) == sorted(
        [
            "qwen.smoe",
            "qwen.scout.safetensors",
            "qwen.smoe.manifest.json",
            "qwen.config.json",
            link.name,
        ]
    )
    assert target.read_bytes() == b"keep me"
    assert contents(out, "qwen") == clean["qwen"]


# ---- a vault that appears while the sculpt runs keeps its companions (issue 31) ------------
QWEN = CKPTS / "qwen3_moe"
THEIRS = (
    "qwen3_moe.smoe",
    "qwen3_moe.scout.safetensors",
    "qwen3_moe.smoe.manifest.json",
    "qwen3_moe.config.json",
)


def put_theirs(out: Path) -> dict[str, bytes]:
    """Another writer's whole set, put in place as an atomic writer would (rename)."""
    theirs = {}
    for name in THEIRS:
        tmp = out / f"{name}.theirs"
        tmp.write_bytes(f"theirs: {name}".encode())
        os.replace(tmp, out / name)
        theirs[name] = (out / name).read_bytes()
    return theirs


def sculpt_no_clobber(out: Path) -> None:
    with pytest.raises(SmoeError) as e:
        sculpt(QWEN, out, SculptOptions(jobs=1, replace=False))
    assert str(e.value) == f"{out / 'qwen3_moe.smoe'}: exists; --force replaces it"


def test_a_vault_set_that_appears_before_the_commit_is_kept_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set appears between the early check and the commit: all four names are checked
    before any is renamed; none of theirs is replaced or deleted."""
    from smoe.vault import writer

    real = writer.commit_together
    theirs: dict[str, bytes] = {}

    def meanwhile(files: list) -> None:
        theirs.update(put_theirs(tmp_path))
        real(files)

    monkeypatch.setattr(writer, "commit_together", meanwhile)
    sculpt_no_clobber(tmp_path)
    assert {n: (tmp_path / n).read_bytes() for n in THEIRS} == theirs
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(
        THEIRS
    )


@pytest.mark.parametrize("whole", [True, False], ids=["their-set", "their-vault"])
def test_a_vault_that_appears_at_the_last_instant_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole: bool
) -> None:
    """The vault appears after this run's companions were put in place, before its vault:
    the vault's no-clobber link refuses, and each companion this run put in place is taken
    back (only if its name still holds it) and what it replaced is put back: their
    companions (``whole``), or the leftovers of an earlier run that were there."""
    from smoe.plumbing import atomic_group

    before = {n: f"leftover: {n}".encode() for n in THEIRS[1:]}
    for name, data in before.items():
        (tmp_path / name).write_bytes(data)
    real = atomic_group.put_in_place  # as the set is committed
    theirs: dict[str, bytes] = {}

    def late(f: object) -> None:
        if f.path.name == "qwen3_moe.smoe":  # type: ignore[attr-defined]
            if whole:
                theirs.update(put_theirs(tmp_path))
            else:
                (tmp_path / "qwen3_moe.smoe").write_bytes(b"theirs")
        real(f)  # type: ignore[arg-type]

    monkeypatch.setattr(atomic_group, "put_in_place", late)
    sculpt_no_clobber(tmp_path)
    want = theirs if whole else {**before, "qwen3_moe.smoe": b"theirs"}
    assert {n: (tmp_path / n).read_bytes() for n in THEIRS} == want
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []  # the hard links that kept what was replaced are gone
