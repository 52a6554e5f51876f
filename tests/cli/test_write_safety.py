"""upgrade, export and the safetensors writers never lose data or write a wrong file (issue 10).

Short writes are continued, a full disk is one error line with nothing under the final
name, a failed in-place upgrade is rolled back, an output that is an input is refused and
one writer at a time holds a target.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from smoe.errors import SmoeError
from smoe.export.float32 import export
from smoe.format import manifest
from smoe.interop.safetensors_io import TensorInfo, read_header, write_file, write_streaming
from smoe.plumbing import fileio
from smoe.vault.reader import Vault
from smoe.vault.upgrade import OsOps, lock_path, upgrade

from fixtures_data import FIXTURES
from fixtures_data import OLMOE_ARCH as ARCH
from fixtures_data import OLMOE_CONFIG as CONFIG
from helpers import plain_env, run

ENOSPC_LINE = r"error: {}: cannot write \d+ bytes at offset \d+: No space left on device"
ROLLED_BACK = "; rolled back, the vault is unchanged"


def copy_of(name: str, folder: Path, as_name: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / (as_name or name)
    p.write_bytes((FIXTURES / name).read_bytes())
    return p


def config_file(folder: Path) -> Path:
    p = folder / "config.json"
    p.write_text(json.dumps(CONFIG))
    return p


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def checked_manifest(vault: Path) -> dict:
    """The manifest beside ``vault``, loaded and checked against it (no findings)."""
    v = Vault.open(vault)
    data = vault.read_bytes()
    doc = manifest.load(manifest.path_for(vault), len(v))
    findings = manifest.check(doc, len(data), v.table, lambda off, n: data[off : off + n])
    assert findings == [], [f.line() for f in findings]
    return doc


@pytest.fixture
def small_fs(tmpfs: Callable[..., Path]) -> Path:
    """A 64 KiB tmpfs (the tests run as root); unmounted afterwards."""
    return tmpfs("small", "size=64k")


# ---- short writes: the output is the same as with whole writes ---------------------------
def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = copy_of("q4_v1.smoe", tmp_path)
    whole = tmp_path / "whole"
    upgrade(src, ARCH, out=whole / "new.smoe")
    export(src, whole / "x.safetensors")
    info = sorted(read_header(whole / "x.safetensors").values(), key=lambda t: t.name)
    write_streaming(whole / "s.safetensors", info[:5], metadata={"format": "pt"})
    upgrade(copy_of("q4_v1.smoe", whole, "in_place.smoe"), ARCH)

    real = os.pwrite
    calls: list[int] = []

    def pwrite(fd: int, data, offset: int) -> int:
        n = real(fd, memoryview(data).cast("B")[:5], offset)
        calls.append(n)
        return n

    monkeypatch.setattr(os, "pwrite", pwrite)
    short = tmp_path / "short"
    upgrade(src, ARCH, out=short / "new.smoe")
    export(src, short / "x.safetensors")
    write_streaming(short / "s.safetensors", info[:5], metadata={"format": "pt"})
    upgrade(copy_of("q4_v1.smoe", short, "in_place.smoe"), ARCH)
    monkeypatch.undo()

    assert len(calls) > 50_000 and max(calls) == 5
    for name in (
        "new.smoe",
        "new.smoe.manifest.json",
        "x.safetensors",
        "s.safetensors",
        "in_place.smoe",
    ):
        assert (short / name).read_bytes() == (whole / name).read_bytes(), name
    assert src.read_bytes() == (FIXTURES / "q4_v1.smoe").read_bytes()


def test_in_place_ops_short_writes_and_no_progress(tmp_path: Path) -> None:
    class OneByte(OsOps):
        def pwrite(self, fd: int, data: bytes, offset: int) -> int:
            return super().pwrite(fd, data[:1], offset)

    class Stuck(OsOps):
        def pwrite(self, fd: int, data: bytes, offset: int) -> int:
            return 0

    ref = copy_of("q4_v1.smoe", tmp_path / "ref")
    upgrade(ref, ARCH)
    p = copy_of("q4_v1.smoe", tmp_path / "one")
    upgrade(p, ARCH, ops=OneByte())
    assert p.read_bytes() == ref.read_bytes()
    p = copy_of("q4_v1.smoe", tmp_path / "stuck")
    with pytest.raises(SmoeError) as info:
        upgrade(p, ARCH, ops=Stuck())
    assert str(info.value) == (
        f"{p}: cannot write 128 bytes at offset 1536: the write made no progress{ROLLED_BACK}"
    )
    assert p.read_bytes() == (FIXTURES / "q4_v1.smoe").read_bytes()


# ---- a full disk: one line, nothing under the final name, inputs untouched ---------------
def test_upgrade_out_on_a_full_disk(tmp_path: Path, small_fs: Path) -> None:
    src = copy_of("q4_v1.smoe", tmp_path)
    cfg = config_file(tmp_path)
    before, cfg_before = src.read_bytes(), cfg.read_bytes()
    out = small_fs / "new.smoe"
    proc = run("upgrade", src, "--config", cfg, "--out", out)
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1
    assert re.fullmatch(ENOSPC_LINE.format(re.escape(str(out))), proc.stderr.strip())
    assert listing(small_fs) == []  # no vault, manifest, temporary or lock file
    assert src.read_bytes() == before and cfg.read_bytes() == cfg_before


def test_export_on_a_full_disk(tmp_path: Path, small_fs: Path) -> None:
    src = copy_of("q4_v2.smoe", tmp_path)
    before = src.read_bytes()
    out = small_fs / "x.safetensors"
    proc = run("export", src, out)
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1
    assert re.fullmatch(ENOSPC_LINE.format(re.escape(str(out))), proc.stderr.strip())
    assert listing(small_fs) == []
    assert src.read_bytes() == before


def test_in_place_on_a_read_only_filesystem(tmp_path: Path, tmpfs) -> None:
    mnt = tmpfs("ro", "size=1m")
    vault = copy_of("q4_v1.smoe", mnt)
    tmpfs.remount(mnt, "ro")
    proc = run("upgrade", vault, "--config", config_file(tmp_path))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == (
        f"error: {vault}: cannot open for writing: Read-only file system"
    )
    assert vault.read_bytes() == (FIXTURES / "q4_v1.smoe").read_bytes()
    assert listing(mnt) == ["q4_v1.smoe"]


# ---- in place: a failure at any step is rolled back --------------------------------------
class FailAt(OsOps):
    """Real writes and fsyncs, but step ``n`` (0-based) fails with ``err``."""

    def __init__(self, n: int, err: int = errno.EIO) -> None:
        self.n, self.err, self.steps = n, err, 0

    def _tick(self) -> None:
        self.steps += 1
        if self.steps - 1 == self.n:
            raise OSError(self.err, os.strerror(self.err))

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._tick()
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._tick()
        super().fsync(fd)


def test_in_place_failure_at_each_step_is_rolled_back(tmp_path: Path) -> None:
    reasons = [
        "cannot write 128 bytes at offset 1536: Input/output error",  # the arch block
        "cannot flush to disk (fsync): Input/output error",
        "cannot write 4 bytes at offset 60: Input/output error",  # reserved_ext
        "cannot write 4 bytes at offset 8: Input/output error",  # version
        "cannot flush to disk (fsync): Input/output error",
    ]
    original = (FIXTURES / "q4_v1.smoe").read_bytes()
    for n, reason in enumerate(reasons):
        p = copy_of("q4_v1.smoe", tmp_path / f"s{n}")
        with pytest.raises(SmoeError) as info:
            upgrade(p, ARCH, ops=FailAt(n))
        assert str(info.value) == f"{p}: {reason}{ROLLED_BACK}"
        assert p.read_bytes() == original, n

    # A write that fails after it changed the file (version already 2 in the page cache).
    class WriteThenFail(OsOps):
        def pwrite(self, fd: int, data: bytes, offset: int) -> int:
            n = super().pwrite(fd, data, offset)
            if offset == 8:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return n

    p = copy_of("q4_v1.smoe", tmp_path / "late")
    with pytest.raises(SmoeError) as info:
        upgrade(p, ARCH, ops=WriteThenFail())
    assert str(info.value) == (
        f"{p}: cannot write 4 bytes at offset 8: No space left on device{ROLLED_BACK}"
    )
    assert p.read_bytes() == original


def test_restamp_failure_restores_the_old_block(tmp_path: Path) -> None:
    p = copy_of("q4_v2.smoe", tmp_path)
    before = p.read_bytes()
    with pytest.raises(SmoeError) as info:
        upgrade(p, ARCH, force=True, ops=FailAt(1))
    assert str(info.value) == f"{p}: cannot flush to disk (fsync): Input/output error{ROLLED_BACK}"
    assert p.read_bytes() == before


def test_failed_rollback_says_so_and_leaves_a_valid_vault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = copy_of("q4_v1.smoe", tmp_path)

    def broken_fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    class FailVersion(OsOps):  # the version write fails; then every real fsync fails too
        def pwrite(self, fd: int, data: bytes, offset: int) -> int:
            if offset == 8:
                monkeypatch.setattr(os, "fsync", broken_fsync)
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return super().pwrite(fd, data, offset)

    with pytest.raises(SmoeError) as info:
        upgrade(p, ARCH, ops=FailVersion())
    monkeypatch.undo()
    assert str(info.value) == (
        f"{p}: cannot write 4 bytes at offset 8: Input/output error; restoring the original "
        f"bytes failed too ({p}: cannot flush to disk (fsync): Input/output error); the vault "
        "is a valid v1 or v2 vault (check it with smoe verify)"
    )
    assert run("verify", "--deep", p).returncode == 0


def test_kill_style_exceptions_are_not_rolled_back(tmp_path: Path) -> None:
    """A crash (not an I/O error) stops at once: the state a kill would leave (valid v2)."""

    class Crash(Exception):
        pass

    class CrashAfterVersion(OsOps):
        def __init__(self) -> None:
            self.fsyncs = 0

        def fsync(self, fd: int) -> None:
            self.fsyncs += 1
            if self.fsyncs == 2:
                raise Crash
            super().fsync(fd)

    p = copy_of("q4_v1.smoe", tmp_path)
    with pytest.raises(Crash):
        upgrade(p, ARCH, ops=CrashAfterVersion())
    assert Vault.open(p).geometry.version == 2


# ---- an output that is an input is refused -----------------------------------------------
def test_export_refuses_the_vault_and_its_manifest(tmp_path: Path) -> None:
    vault = copy_of("q4_v2.smoe", tmp_path)
    man = manifest.path_for(vault)
    man.write_text("{}\n")
    (tmp_path / "link.safetensors").symlink_to(vault.name)
    os.link(vault, tmp_path / "hard.safetensors")
    (tmp_path / "mlink.json").symlink_to(man.name)
    before = vault.read_bytes()
    for out, what in (
        (vault, vault),
        (tmp_path / "link.safetensors", vault),
        (tmp_path / "hard.safetensors", vault),
        (man, man),
        (tmp_path / "mlink.json", man),
    ):
        proc = run("export", vault, out)
        assert proc.returncode == 1
        assert proc.stderr.strip() == (
            f"error: {out}: the output is the input {what} itself; refusing to overwrite an input"
        )
    proc = run("export", vault, tmp_path)
    assert (
        proc.stderr.strip()
        == f"error: {tmp_path}: is a folder; name the .safetensors file to write"
    )
    assert vault.read_bytes() == before and man.read_text() == "{}\n"
    assert (tmp_path / "link.safetensors").is_symlink()
    assert listing(tmp_path) == [
        "hard.safetensors",
        "link.safetensors",
        "mlink.json",
        "q4_v2.smoe",
        "q4_v2.smoe.manifest.json",
    ]


def test_upgrade_out_refuses_its_inputs(tmp_path: Path) -> None:
    vault = copy_of("q4_v1.smoe", tmp_path)
    cfg = config_file(tmp_path)
    (tmp_path / "link.smoe").symlink_to(vault.name)
    os.link(vault, tmp_path / "hard.smoe")
    before = vault.read_bytes()
    for out in (vault, tmp_path / "link.smoe", tmp_path / "hard.smoe"):
        proc = run("upgrade", vault, "--config", cfg, "--out", out)
        assert proc.returncode == 1
        assert proc.stderr.strip() == (
            f"error: {out}: the output is the input {vault} itself; refusing to overwrite an input"
        )
    assert vault.read_bytes() == before
    # The config, or any file directly in a model folder, and a manifest name.
    elsewhere = tmp_path / "sub" / "x.json"
    elsewhere.parent.mkdir()
    elsewhere.symlink_to(cfg)
    for out, inputs in ((cfg, [cfg]), (elsewhere, [tmp_path])):
        with pytest.raises(SmoeError) as info:
            upgrade(vault, ARCH, out=out, inputs=inputs)
        assert str(info.value) == (
            f"{out}: the output is the input {cfg} itself; refusing to overwrite an input"
        )
    new = tmp_path / "new.smoe"
    manifest.path_for(new).symlink_to(vault.name)
    with pytest.raises(SmoeError) as info:
        upgrade(vault, ARCH, out=new)
    assert str(info.value) == (
        f"{manifest.path_for(new)}: the output is the input {vault} "
        "itself; refusing to overwrite an input"
    )
    assert vault.read_bytes() == before and not new.exists()
    assert json.loads(cfg.read_text()) == CONFIG
    with pytest.raises(SmoeError) as info:
        upgrade(vault, ARCH, out=tmp_path / "sub")
    assert str(info.value) == f"{tmp_path / 'sub'}: is a folder; --out names the new vault file"


def test_in_place_through_a_symlink_edits_the_target(tmp_path: Path) -> None:
    vault = copy_of("q4_v1.smoe", tmp_path / "store")
    link = tmp_path / "link.smoe"
    link.symlink_to(vault)
    ref = copy_of("q4_v1.smoe", tmp_path / "ref")
    upgrade(ref, ARCH)
    res = upgrade(link, ARCH)
    assert res.mode == "in-place" and res.path == link
    assert link.is_symlink() and vault.read_bytes() == ref.read_bytes()
    assert lock_path(link) == Path(os.path.realpath(tmp_path / "store")) / ".q4_v1.smoe.lock"
    fifo = tmp_path / "fifo.smoe"
    os.mkfifo(fifo)
    with pytest.raises(fileio.NotRegular) as info:
        upgrade(fifo, ARCH)
    assert str(info.value) == f"{fifo}: not a regular file (a FIFO)"


# ---- one writer per target ---------------------------------------------------------------
HOLD = textwrap.dedent("""
    import sys
    from smoe.plumbing.lock import Lock
    with Lock(sys.argv[1], sys.argv[2]):
        print("locked", flush=True)
        sys.stdin.readline()
""")


def test_a_held_lock_refuses_a_second_upgrade(tmp_path: Path) -> None:
    vault = copy_of("q4_v1.smoe", tmp_path)
    cfg = config_file(tmp_path)
    new = tmp_path / "new.smoe"
    before = vault.read_bytes()
    for lock, target, args in (
        (lock_path(vault), vault, ()),
        (tmp_path / ".new.smoe.lock", new, ("--out", new)),
    ):
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(lock), str(target)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=plain_env(),
        )
        try:
            assert holder.stdout.readline() == "locked\n"
            proc = run("upgrade", vault, "--config", cfg, *args)
        finally:
            holder.communicate("\n")
        assert proc.returncode == 1
        assert proc.stderr.strip() == (
            f"error: {target}: another smoe process (pid "
            f"{holder.pid}) is writing it; wait for it to finish "
            f"(lock {lock.name})"
        )
        assert vault.read_bytes() == before and not new.exists()
    assert run("upgrade", vault, "--config", cfg).returncode == 0  # free again


# ---- upgrade --out writes a manifest ------------------------------------------------------
def test_upgrade_out_writes_a_checked_manifest(tmp_path: Path) -> None:
    src = copy_of("noroom_v1.smoe", tmp_path)
    cfg = tmp_path / "c.json"
    cfg.write_text(  # noroom's own shapes: 30 experts in 3 layers, d_model 8
        json.dumps(
            {
                **CONFIG,
                "moe_intermediate_size": 8,
                "hidden_size": 8,
                "num_experts": 30,
                "num_hidden_layers": 3,
            }
        )
    )
    out = tmp_path / "new.smoe"
    proc = run("upgrade", src, "--config", cfg, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote a v2 copy: {out} (arch block at 16320, data_offset 32768)"
    doc = checked_manifest(out)
    assert doc["vault"] == {
        "name": "new.smoe",
        "size": out.stat().st_size,
        "experts": len(Vault.open(out)),
        "bits": 4,
    }
    assert doc["tool"]["command"] == "upgrade" and doc["source"] is None
    assert doc["tool"]["options"] == {"bits": 4, "version": 2}
    assert run("verify", "--deep", out).returncode == 0


def _old_manifest(vault: Path) -> dict:
    """A manifest for a fixture vault with provenance, as a sculpt would have written it."""
    v = Vault.open(vault)
    data = vault.read_bytes()
    b = manifest.ManifestBuilder(
        manifest.tool_info("sculpt", {"bits": 4, "scale": "absmax", "version": 1}),
        source={"model_type": "olmoe", "files": [{"name": "m.st"}]},
    )
    slots = []
    for e in v.table:
        off, raw = int(e["byte_offset"]), int(e["raw_size"])
        tensors = [
            {
                "name": n,
                "source": f"t{int(e['expert_id'])}.{n}",
                "index": None,
                "rows": None,
                "source_crc32c": 7,
                "snr_db": 20.5,
            }
            for n in ("gate_proj", "up_proj", "down_proj")
        ]
        b.add(
            int(e["layer_id"]),
            int(e["expert_id"]),
            manifest.checksum(data[off : off + raw]),
            tensors,
        )
        slots.append((int(e["layer_id"]), int(e["expert_id"]), off, raw))
    doc = b.document(vault.name, len(data), v.bits, slots)
    manifest.path_for(vault).write_bytes(manifest.encode(doc))
    return doc


def test_upgrade_out_keeps_provenance_and_refuses_a_damaged_vault(tmp_path: Path) -> None:
    src = copy_of("q4_v1.smoe", tmp_path)
    old = _old_manifest(src)
    out = tmp_path / "new.smoe"
    upgrade(src, ARCH, out=out)
    doc = checked_manifest(out)
    assert doc["source"] == old["source"]
    assert doc["tool"]["options"] == {"bits": 4, "scale": "absmax", "version": 2}
    assert [r["tensors"] for r in doc["experts"]] == [r["tensors"] for r in old["experts"]]
    assert [r["crc32c"] for r in doc["experts"]] == [r["crc32c"] for r in old["experts"]]
    # A blob changed since its manifest was written: refused, nothing written.
    data = bytearray(src.read_bytes())
    row = old["experts"][5]
    data[row["offset"] + 3] ^= 0x10
    src.write_bytes(bytes(data))
    crc = manifest.checksum(data[row["offset"] : row["offset"] + row["raw_size"]])
    out2 = tmp_path / "new2.smoe"
    with pytest.raises(SmoeError) as info:
        upgrade(src, ARCH, out=out2)
    assert str(info.value) == (
        f"{src}: layer {row['layer']} expert {row['expert']}: the blob at offset "
        f"{row['offset']} has CRC-32C {crc:#010x}, its manifest says {row['crc32c']:#010x}; "
        "the old vault is damaged, nothing written"
    )
    assert listing(tmp_path) == [
        "new.smoe",
        "new.smoe.manifest.json",
        "q4_v1.smoe",
        "q4_v1.smoe.manifest.json",
    ]
    # A manifest that belongs to another vault, and one that is not a manifest.
    other = copy_of("q4_v1.smoe", tmp_path / "o")
    theirs = manifest.path_for(other)
    theirs.write_bytes(manifest.encode({**old, "vault": {**old["vault"], "size": 4096}}))
    with pytest.raises(SmoeError) as info:
        upgrade(other, ARCH, out=tmp_path / "o" / "n.smoe")
    assert str(info.value) == (
        f"{theirs}: describes a vault of 4096 bytes with {len(old['experts'])} experts, {other} "
        f"has {len(data)} bytes and {len(old['experts'])}; it belongs to another file; move it "
        "aside to upgrade without it"
    )
    theirs.write_text("{}")
    with pytest.raises(SmoeError) as info:
        upgrade(other, ARCH, out=tmp_path / "o" / "n.smoe")
    assert str(info.value) == (
        f"{theirs}: the old vault's manifest is unusable (manifest/schema: is None, expected "
        "'smoe-manifest/1'); move it aside to upgrade without it"
    )
    assert listing(tmp_path / "o") == ["q4_v1.smoe", "q4_v1.smoe.manifest.json"]


# ---- the safetensors writers -------------------------------------------------------------
def _items() -> tuple[list[tuple[str, str, tuple[int, ...]]], list[np.ndarray]]:
    arrays = [np.arange(12, dtype="<f4").reshape(3, 4) * (i + 1) for i in range(3)]
    return [(f"t{i}", "F32", a.shape) for i, a in enumerate(arrays)], arrays


def test_staged_writes_appear_only_on_commit(tmp_path: Path) -> None:
    items, arrays = _items()

    def fill(fd: int, i: int, offset: int) -> None:
        fileio.pwrite_all(fd, arrays[i], offset, tmp_path / "a.safetensors")

    size, staged = write_file(tmp_path / "a.safetensors", items, fill, stage=True)
    assert listing(tmp_path) == [staged.tmp.name]
    staged.commit()
    assert listing(tmp_path) == ["a.safetensors"]
    assert (tmp_path / "a.safetensors").stat().st_size == size
    info = list(read_header(tmp_path / "a.safetensors").values())
    size2, staged2 = write_streaming(tmp_path / "b.safetensors", info, stage=True)
    assert not (tmp_path / "b.safetensors").exists()
    staged2.abort()
    assert listing(tmp_path) == ["a.safetensors"]
    assert write_streaming(tmp_path / "c.safetensors", info) == size2 == size
    assert (tmp_path / "c.safetensors").read_bytes() == (tmp_path / "a.safetensors").read_bytes()


def test_a_shrinking_source_and_a_source_as_output(tmp_path: Path) -> None:
    items, arrays = _items()
    src = tmp_path / "a.safetensors"
    write_file(src, items, lambda fd, i, off: fileio.pwrite_all(fd, arrays[i], off, src))
    info = sorted(read_header(src).values(), key=lambda t: t.name)
    with pytest.raises(SmoeError) as e:
        write_streaming(src, info)
    assert str(e.value) == (
        f"{src}: the output is the input {src} itself; refusing to overwrite an input"
    )
    os.truncate(src, info[2].offset + 10)
    with pytest.raises(SmoeError) as e:
        write_streaming(tmp_path / "b.safetensors", info)
    assert str(e.value) == (
        f"{src}: file shrank while reading: 48 bytes at offset {info[2].offset}, got 10"
    )
    assert listing(tmp_path) == ["a.safetensors"]


def test_a_fill_raising_oserror_is_one_line(tmp_path: Path) -> None:
    items, _ = _items()
    out = tmp_path / "a.safetensors"

    def fill(fd: int, i: int, offset: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(SmoeError) as e:
        write_file(out, items, fill)
    assert str(e.value) == f"{out}: cannot write tensor 't0' at offset 184: No space left on device"
    assert listing(tmp_path) == []


def test_tensorinfo_paths_name_the_source(tmp_path: Path) -> None:
    missing = TensorInfo("w", tmp_path / "gone.safetensors", "F32", (2,), 8, 8)
    with pytest.raises(fileio.NotRegular) as e:
        write_streaming(tmp_path / "b.safetensors", [missing])
    assert str(e.value) == f"{missing.path}: cannot open: No such file or directory"
    assert listing(tmp_path) == []
