"""v1 -> v2 upgrade (D7): in place, refusals, rewrite, and crash safety by fault injection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from smoe.errors import SmoeError
from smoe.format.verify import verify
from smoe.vault.reader import Vault
from smoe.vault.upgrade import OsOps, has_room, upgrade

from fixtures_data import CKPTS, FIXTURES
from fixtures_data import OLMOE_ARCH as ARCH
from fixtures_data import OLMOE_CONFIG as CONFIG
from helpers import run


def blobs(path: Path) -> bytes:
    data = path.read_bytes()
    v = Vault.open(path)
    return data[v.geometry.data_offset :]


def copy_of(name: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_bytes((FIXTURES / name).read_bytes())
    return p


def state(path: Path) -> int:
    """1 or 2 when the file is a valid vault of that version (no errors), else fail."""
    report = verify(np.fromfile(path, np.uint8), deep=True)
    assert report.errors == [], [f.line() for f in report.errors]
    return Vault.open(path).geometry.version


def test_in_place_upgrade_keeps_blobs(tmp_path: Path) -> None:
    p = copy_of("q4_v1.smoe", tmp_path)
    before = blobs(p)
    size = p.stat().st_size
    res = upgrade(p, ARCH)
    assert (res.mode, res.arch_offset, res.data_offset) == ("in-place", 1536, 16384)
    assert state(p) == 2
    assert blobs(p) == before and p.stat().st_size == size
    v = Vault.open(p)
    assert v.arch["model_type"] == b"olmoe" and int(v.arch["moe_top_k"]) == 2
    # Same bytes as a vault written as v2 from the start, apart from the arch contents.
    v2 = (FIXTURES / "q4_v2.smoe").read_bytes()
    got = p.read_bytes()
    assert got[:1536] == v2[:1536] and got[1664:] == v2[1664:]


def test_v2_refused_without_force_and_restamped_with_it(tmp_path: Path) -> None:
    p = copy_of("q4_v2.smoe", tmp_path)
    before = p.read_bytes()
    with pytest.raises(SmoeError) as info:
        upgrade(p, replace(ARCH, moe_top_k=4))
    assert str(info.value) == (
        f"{p}: already version 2, with another arch block; --force re-stamps its arch block"
    )
    assert p.read_bytes() == before
    res = upgrade(p, replace(ARCH, moe_top_k=4), force=True)
    assert res.mode == "re-stamp" and state(p) == 2
    assert int(Vault.open(p).arch["moe_top_k"]) == 4
    assert p.read_bytes()[16384:] == before[16384:]


def test_no_room_refused_in_place_then_rewritten(tmp_path: Path) -> None:
    p = copy_of("noroom_v1.smoe", tmp_path)
    assert not has_room(Vault.open(p))
    before = p.read_bytes()
    arch = replace(ARCH, moe_ffn_dim=8, num_hidden_layers=3)  # its MoE layers are 0..2
    with pytest.raises(SmoeError) as info:
        upgrade(p, arch)
    assert str(info.value) == (
        f"{p}: no room for the arch block: the descriptors end at 16264, so the 128-byte block "
        "would need [16320, 16448) before data_offset 16384; use --out NEW to rewrite into a "
        "new file (blobs shift by whole pages, the original is untouched)"
    )
    assert p.read_bytes() == before
    out = tmp_path / "new.smoe"
    res = upgrade(p, arch, out=out)
    assert (res.mode, res.arch_offset, res.data_offset) == ("rewrite", 16320, 32768)
    assert p.read_bytes() == before
    assert state(out) == 2
    old, new = Vault.open(p), Vault.open(out)
    assert new.keys() == old.keys()
    for key in old:
        for a, b in zip(old.expert(*key).tensors, new.expert(*key).tensors):
            assert bytes(a.packed) == bytes(b.packed) and bytes(a.scales) == bytes(b.scales)
    assert out.stat().st_size == p.stat().st_size + 16384


def test_refusals_leave_the_file_untouched(tmp_path: Path) -> None:
    p = copy_of("q4_v1.smoe", tmp_path)
    data = bytearray(p.read_bytes())
    data[1600] = 7  # inside the gap where the block would go
    p.write_bytes(bytes(data))
    with pytest.raises(SmoeError) as info:
        upgrade(p, ARCH)
    assert str(info.value) == (
        f"{p}: the gap between the descriptors and data_offset is not "
        "zero (byte 0x640 = 0x07); refusing to write into it"
    )
    assert p.read_bytes() == bytes(data)
    not_vault = tmp_path / "x.smoe"
    not_vault.write_bytes(b"\0" * 100)
    with pytest.raises(SmoeError, match=r"header\.magic"):
        upgrade(not_vault, ARCH)
    v3 = copy_of("q4_v1.smoe", tmp_path / "v3")
    raw = bytearray(v3.read_bytes())
    raw[8] = 3
    v3.write_bytes(bytes(raw))
    with pytest.raises(SmoeError, match=r"header\.version"):
        upgrade(v3, ARCH)
    assert v3.read_bytes() == bytes(raw)
    with pytest.raises(SmoeError, match=r"arch\.moe_ffn_dim 48 disagrees"):
        upgrade(copy_of("q4_v1.smoe", tmp_path / "v4"), replace(ARCH, moe_ffn_dim=48))


class Crash(Exception):
    pass


class CrashAfter(OsOps):
    """Real writes and fsyncs, but raise after the first ``n`` of them."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.steps = 0

    def _tick(self) -> None:
        if self.left == 0:
            raise Crash
        self.left -= 1
        self.steps += 1

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._tick()
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._tick()
        super().fsync(fd)


def test_crash_after_every_step_leaves_a_valid_vault(tmp_path: Path) -> None:
    steps = CrashAfter(10**6)
    upgrade(copy_of("q4_v1.smoe", tmp_path / "full"), ARCH, ops=steps)
    assert steps.steps == 5  # block, fsync, reserved_ext, version, fsync
    seen = []
    for n in range(steps.steps + 1):
        p = copy_of("q4_v1.smoe", tmp_path / f"c{n}")
        before = blobs(p)
        if n < steps.steps:
            with pytest.raises(Crash):
                upgrade(p, ARCH, ops=CrashAfter(n))
        else:
            upgrade(p, ARCH, ops=CrashAfter(n))
        seen.append(state(p))
        assert blobs(p) == before
    assert seen == [1, 1, 1, 1, 2, 2]


def test_sigkill_at_every_step_leaves_a_valid_vault(tmp_path: Path) -> None:
    """A subprocess pauses before each write/fsync; it is killed at each pause in turn."""
    script = textwrap.dedent("""
        import os, sys
        from smoe.vault.upgrade import OsOps, upgrade
        from smoe.format.records import ArchInfo
        class Pause(OsOps):
            def _pause(self):
                print("step", flush=True)
                sys.stdin.readline()
            def pwrite(self, fd, data, offset):
                self._pause()
                return super().pwrite(fd, data, offset)
            def fsync(self, fd):
                self._pause()
                super().fsync(fd)
        arch = ArchInfo(rope_theta=10000.0, num_heads=4, num_kv_heads=4, head_dim=16,
                        moe_top_k=2, moe_ffn_dim=32, num_hidden_layers=2, rms_norm_eps=1e-6,
                        model_type="olmoe")
        upgrade(sys.argv[1], arch, ops=Pause())
        print("done", flush=True)
    """)
    versions = []
    for kill_at in range(6):
        p = tmp_path / f"k{kill_at}.smoe"
        p.write_bytes((FIXTURES / "q4_v1.smoe").read_bytes())
        before = blobs(p)
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(p)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(kill_at):
            assert proc.stdout.readline() == "step\n"
            proc.stdin.write("\n")
            proc.stdin.flush()
        line = proc.stdout.readline()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert line == ("step\n" if kill_at < 5 else "done\n")
        versions.append(state(p))
        assert blobs(p) == before
    assert versions == [1, 1, 1, 1, 2, 2]


def test_cli_upgrade_with_config_and_model(tmp_path: Path) -> None:
    p = copy_of("q4_v1.smoe", tmp_path)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CONFIG))
    proc = run("upgrade", p, "--config", cfg, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mode"] == "in-place"
    assert state(p) == 2
    before = p.read_bytes()
    again = run("upgrade", p, "--config", cfg)  # idempotent: the same block is there already
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"already version 2 with this arch block, nothing written: {p} " + (
        "(arch block at 1536, data_offset 16384)\n"
    )
    assert p.read_bytes() == before
    doc = json.loads(run("upgrade", p, "--config", cfg, "--json").stdout)
    assert (doc["mode"], doc["path"]) == ("current", str(p))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**CONFIG, "rope_theta": 5.0}))
    refused = run("upgrade", p, "--config", other)
    assert refused.returncode == 1 and p.read_bytes() == before
    assert "already version 2, with another arch block; --force" in refused.stderr
    noroom = copy_of("noroom_v1.smoe", tmp_path)
    cfg2 = tmp_path / "c2.json"
    cfg2.write_text(  # noroom_v1's shapes: 30 experts per layer in MoE layers 0..2
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
    no_room = run("upgrade", noroom, "--config", cfg2)
    assert no_room.returncode == 1 and "use --out NEW" in no_room.stderr
    out = tmp_path / "converted.smoe"
    done = run("upgrade", noroom, "--config", cfg2, "--out", out)
    assert done.returncode == 0, done.stderr
    assert state(out) == 2


def test_upgrade_flags_from_model_tensors(tmp_path: Path) -> None:
    ck = CKPTS / "qwen3_moe"
    v1 = tmp_path / "q.smoe"
    from smoe.sculpt import SculptOptions, sculpt

    res = sculpt(ck, tmp_path / "v1", SculptOptions(version=1))
    v1.write_bytes(res.vault.read_bytes())
    proc = run("upgrade", v1, "--model", ck)
    assert proc.returncode == 0, proc.stderr
    v2 = sculpt(ck, tmp_path / "v2", SculptOptions(version=2)).vault
    assert v1.read_bytes() == v2.read_bytes()  # upgraded v1 == sculpted v2, byte for byte
