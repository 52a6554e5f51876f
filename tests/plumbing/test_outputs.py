"""Outputs that are not regular files are refused, and a replaced output keeps its mode,
owner and group (issue 23, items 1 and 9).

* Every writer goes through :class:`smoe.plumbing.atomic.AtomicFile` (or, for the
  ``export --hf`` folder, a folder renamed into place): an existing output that is a FIFO,
  a character device or anything else but a regular file (a folder, for ``--hf``) is
  refused before anything is written, so ``report V -o /dev/null`` as root can never
  rename a file onto ``/dev/null``. A symlink there is still replaced, never followed.
* A file or folder that is replaced keeps its mode, owner and group; a new one is created
  with the umask's mode.

The character device is a twin of ``/dev/null`` made in the test's folder (root only); the
real ``/dev/null`` is never touched.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from smoe.errors import WriteFailed
from smoe.plumbing.atomic import AtomicFile
from smoe.sculpt import SculptOptions, sculpt

from fixtures_data import CKPTS, FIXTURES, OLMOE_CONFIG
from helpers import Arg, refused, run

ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0, reason="a character device can be made only as root (mknod)"
)
DAEMON = 1  # uid and gid 1: "daemon" on Debian and its kin; any id other than ours will do
KINDS = {"fifo": "a FIFO", "chardev": "a character device"}


def make_special(path: Path, kind: str) -> None:
    """A FIFO, or a character device with /dev/null's numbers (1, 3) at ``path``."""
    if kind == "fifo":
        os.mkfifo(path)
    else:
        if os.geteuid() != 0:
            pytest.skip("a character device can be made only as root (mknod)")
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))


def special_kinds() -> list[object]:
    return ["fifo", pytest.param("chardev", marks=ROOT_ONLY)]


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A vault with its scout, manifest and staged config (what ``export --hf`` reads)."""
    out = tmp_path_factory.mktemp("vault")
    return sculpt(CKPTS / "qwen3_moe", out, SculptOptions(jobs=1)).vault


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("config") / "config.json"
    path.write_text(json.dumps(OLMOE_CONFIG))  # the q4_v1 fixture's model, as upgrade checks
    return path


def file_commands(vault: Path, config: Path) -> dict[str, Callable[[Path], list[Arg]]]:
    """Each command that writes one file, given the path of that file."""
    return {
        "report": lambda out: ["report", vault, "-o", out],
        "export": lambda out: ["export", vault, out, "--layer", "0"],
        "upgrade": lambda out: [
            "upgrade",
            FIXTURES / "q4_v1.smoe",
            "--config",
            config,
            "--out",
            out,
        ],
        "upgrade manifest": lambda out: [
            "upgrade",
            FIXTURES / "q4_v1.smoe",
            "--config",
            config,
            "--out",
            out.with_name(out.name.removesuffix(".manifest.json")),
        ],
    }


FILE_COMMANDS = ("report", "export", "upgrade", "upgrade manifest")


def out_name(command: str) -> str:
    return "x.smoe.manifest.json" if command == "upgrade manifest" else "x.out"


def refusal(path: Path, kind: str, what: str = "a regular file") -> str:
    return f"error: {path}: exists and is not {what} ({KINDS[kind]}); refusing to replace it"


def mode_of(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


# ---- outputs that are not regular files -----------------------------------------------------
@pytest.mark.parametrize("kind", special_kinds())
@pytest.mark.parametrize("command", FILE_COMMANDS)
def test_a_special_file_at_the_output_is_refused(
    command: str, kind: str, vault: Path, config: Path, tmp_path: Path
) -> None:
    out = tmp_path / out_name(command)
    make_special(out, kind)
    before = sorted(os.listdir(tmp_path))
    argv = file_commands(vault, config)[command](out)
    line = refused(argv, 1, unchanged=[vault.parent, config])
    assert line == refusal(out, kind)
    kind_of = stat.S_ISFIFO if kind == "fifo" else stat.S_ISCHR
    assert kind_of(os.lstat(out).st_mode)
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file, lock or manifest left


@pytest.mark.parametrize("kind", [*special_kinds(), "file"])
def test_hf_export_refuses_anything_but_a_folder(kind: str, vault: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    if kind == "file":
        out.write_bytes(b"keep me\n")
    else:
        make_special(out, kind)
    before = sorted(os.listdir(tmp_path))
    line = refused(["export", vault, out, "--hf"], 1, unchanged=[vault.parent])
    if kind == "file":
        assert line == f"error: {out}: exists and is not a folder"
        assert out.read_bytes() == b"keep me\n"
    else:
        assert line == f"error: {out}: exists and is not a folder ({KINDS[kind]})"
    assert sorted(os.listdir(tmp_path)) == before


def test_a_planted_symlink_is_still_replaced(vault: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = tmp_path / "r.html"
    out.symlink_to(fifo)
    assert run("report", vault, "-o", out).returncode == 2  # it exists: --force replaces it
    proc = run("report", vault, "-o", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and not out.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("kind", special_kinds())
def test_atomic_file_refuses_before_creating_anything(kind: str, tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    make_special(out, kind)
    with pytest.raises(WriteFailed) as info:
        AtomicFile(out)
    assert str(info.value) == refusal(out, kind).removeprefix("error: ")
    assert os.listdir(tmp_path) == ["out.bin"]


@pytest.mark.parametrize("kind", special_kinds())
def test_atomic_file_checks_again_at_commit(kind: str, tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    f = AtomicFile(out)
    f.pwrite(b"data", 0)
    make_special(out, kind)  # appears while the file is written
    with pytest.raises(WriteFailed) as info:
        f.commit()
    assert str(info.value) == refusal(out, kind).removeprefix("error: ")
    assert os.listdir(tmp_path) == ["out.bin"]


# ---- replaced outputs keep their mode, owner and group -------------------------------------
@pytest.mark.parametrize("command", FILE_COMMANDS)
def test_a_replaced_file_keeps_its_mode(
    command: str, vault: Path, config: Path, tmp_path: Path
) -> None:
    out = tmp_path / out_name(command)
    args = file_commands(vault, config)[command](out)
    assert run(*args).returncode == 0  # an earlier output (--force replaces only smoe's)
    os.chmod(out, 0o600)
    old = out.stat().st_ino
    proc = run(*args, "--force")  # (the policy)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_ino != old
    assert mode_of(out) == (0o600, os.geteuid(), os.getegid())


@ROOT_ONLY
@pytest.mark.parametrize("command", FILE_COMMANDS)
def test_a_replaced_file_keeps_its_owner_and_group(
    command: str, vault: Path, config: Path, tmp_path: Path
) -> None:
    out = tmp_path / out_name(command)
    args = file_commands(vault, config)[command](out)
    assert run(*args).returncode == 0  # an earlier output (--force replaces only smoe's)
    os.chown(out, DAEMON, DAEMON)
    os.chmod(out, 0o640)
    proc = run(*args, "--force")  # (the policy)
    assert proc.returncode == 0, proc.stderr
    assert mode_of(out) == (0o640, DAEMON, DAEMON)


def test_new_files_take_the_umask(vault: Path, config: Path, tmp_path: Path) -> None:
    code = (
        "import os, sys; os.umask(0o027); from smoe.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    for command in FILE_COMMANDS[:3]:
        out = tmp_path / command / "x.out"
        argv = file_commands(vault, config)[command](out)
        proc = run(*argv, command=[sys.executable, "-c", code])
        assert proc.returncode == 0, proc.stderr
        assert mode_of(out)[0] == 0o640, command


def test_a_replaced_hf_folder_keeps_its_mode_owner_and_group(vault: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    group = DAEMON if os.geteuid() == 0 else os.getegid()
    os.chown(out, os.geteuid(), group)
    os.chmod(out, 0o2770)
    proc = run("export", vault, out, "--hf", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["files"]
    assert mode_of(out) == (0o2770, os.geteuid(), group)


def test_a_new_hf_folder_takes_the_umask(vault: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    proc = run("export", vault, out, "--hf")
    assert proc.returncode == 0, proc.stderr
    assert mode_of(out)[0] == 0o777 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
