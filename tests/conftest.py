"""Test-wide set-up: the helpers in tests/ importable, and the fixtures tests share.

* ``make``: ``make("build/smoe-stream")`` builds targets in the checkout, once a session;
* ``smoe_stream``: the C++ harness, built (use it, or ``usefixtures("smoe_stream")``);
* ``slow_fsync``: a preload library holding a command at its first fsync (signal tests);
* ``tmpfs``: ``tmpfs("name", "size=64k")`` mounts a tmpfs for one test (the tests run as
  root; skipped where mounting is not permitted), unmounted afterwards.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures_data import ROOT
from helpers import SMOE_STREAM, run


@pytest.fixture(scope="session")
def make() -> Callable[..., None]:
    """``make(*targets)``: ``make -s TARGETS`` in the checkout, each set once a session."""
    done: set[tuple[str, ...]] = set()

    def build(*targets: str) -> None:
        if targets not in done:
            proc = run(*targets, command=["make", "-s"], cwd=ROOT)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            done.add(targets)

    return build


@pytest.fixture(scope="session")
def smoe_stream(make: Callable[..., None]) -> Path:
    """The C++ harness ``build/smoe-stream``, built from the current sources."""
    make("build/smoe-stream")
    return SMOE_STREAM


def mount(*args: str) -> None:
    """``mount ARGS``; skips the test where mounting is not permitted (not root, no mount
    command, no CAP_SYS_ADMIN), fails it where mounting fails otherwise."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs is not permitted here: not running as root")
    if shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs is not permitted here: mount(8) is not installed")
    proc = run(*args, command=["mount"])
    why = proc.stderr.strip()
    if proc.returncode != 0 and ("permission denied" in why.lower() or "not permitted" in why):
        pytest.skip(f"mounting a tmpfs is not permitted here: {why}")
    assert proc.returncode == 0, f"mount failed: {why}"


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``tmpfs(name="mnt", options="size=1m")`` mounts a tmpfs at tmp_path/name and returns
    it; ``tmpfs.remount(path, "ro")`` changes its options. All unmounted afterwards."""
    mounted: list[Path] = []

    def mount_at(name: str = "mnt", options: str = "size=1m") -> Path:
        point = tmp_path / name
        point.mkdir(parents=True)
        mount("-t", "tmpfs", "-o", options, "tmpfs", str(point))
        mounted.append(point)
        return point

    def remount(point: Path, options: str) -> None:
        mount("-o", f"remount,{options}", str(point))

    mount_at.remount = remount  # type: ignore[attr-defined]
    yield mount_at
    for point in reversed(mounted):
        proc = run(str(point), command=["umount"])
        assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="session")
def slow_fsync(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """harness/tests/slow_fsync_preload.c built for LD_PRELOAD: the first fsync (of a file
    whose path holds ``$SMOE_FSYNC_MATCH``, when set) creates ``$SMOE_FSYNC_MARK`` and then
    waits a minute, so that a test can signal a command while it writes."""
    lib = tmp_path_factory.mktemp("preload") / "slow_fsync.so"
    src = ROOT / "harness" / "tests" / "slow_fsync_preload.c"
    proc = run("-shared", "-fPIC", "-O1", "-o", lib, src, "-ldl", command=["cc"])
    assert proc.returncode == 0, proc.stderr
    return lib
