"""`smoe-stream forward` and `dequant` refuse outputs that are not regular files, and a
replaced output keeps its mode, owner and group (issue 23, items 1 and 9).

* A FIFO or a character device (a twin of ``/dev/null`` made in the test's folder, as
  root) at OUT.f32 or OUT_DIR/{gate,up,down}.f32 is refused before anything is written:
  exit 2, one line, the special file still there, no temporary file left.
* A symlink there is still replaced, never followed (test_harness_safety.py).
* A file that is replaced keeps its mode, owner and group; a new one takes the umask's mode.
* An output that outgrows the file size limit (``ulimit -f``, issue 31) is one line naming
  it (EFBIG, exit ``write_failed``), not a death by SIGXFSZ, and no temporary file is left.
"""

from __future__ import annotations

import errno
import functools
import os
import resource
import stat
import struct
import subprocess
from pathlib import Path

import pytest

from smoe_gen import exit_codes

from fixtures_data import FIXTURES
from helpers import SMOE_STREAM, plain_env, refused, run

STREAM = [SMOE_STREAM]
GOOD = FIXTURES / "q4_v2.smoe"
D_MODEL = 64
DAEMON = 1  # uid and gid 1 ("daemon" on Debian); any id other than ours will do
KINDS = {"fifo": "a FIFO", "chardev": "a character device"}
ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0, reason="a character device can be made only as root (mknod)"
)

pytestmark = pytest.mark.usefixtures("smoe_stream")


def make_special(path: Path, kind: str) -> None:
    """A FIFO, or a character device with /dev/null's numbers (1, 3) at ``path``."""
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))


SPECIAL = ["fifo", pytest.param("chardev", marks=ROOT_ONLY)]


def inputs(tmp_path: Path) -> tuple[Path, Path]:
    vault = tmp_path / "v.smoe"
    vault.write_bytes(GOOD.read_bytes())
    x = tmp_path / "x.f32"
    x.write_bytes(struct.pack(f"<{D_MODEL}f", *[0.25] * D_MODEL))
    return vault, x


def refusal(path: Path, kind: str) -> str:
    """The line (exit 1, write_failed, as Python's WriteFailed) of a refused output."""
    return (
        f"smoe-stream: {path}: exists and is not a regular file ({KINDS[kind]}); "
        "refusing to replace it"
    )


def mode_of(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def is_kind(path: Path, kind: str) -> bool:
    return (stat.S_ISFIFO if kind == "fifo" else stat.S_ISCHR)(os.lstat(path).st_mode)


@pytest.mark.parametrize("kind", SPECIAL)
def test_forward_refuses_a_special_output(kind: str, tmp_path: Path) -> None:
    vault, x = inputs(tmp_path)
    out = tmp_path / "y.f32"
    make_special(out, kind)
    before = sorted(os.listdir(tmp_path))
    r = functools.partial(run, "forward", vault, 0, 0, x, out, command=STREAM, raw_stdout=True)
    assert refused(r, 1, unchanged=[vault, x]) == refusal(out, kind)
    assert is_kind(out, kind) and sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("name", ["gate.f32", "up.f32", "down.f32"])
def test_dequant_refuses_a_special_output(name: str, kind: str, tmp_path: Path) -> None:
    vault, _ = inputs(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    make_special(out_dir / name, kind)
    r = functools.partial(run, "dequant", vault, 0, 0, out_dir, command=STREAM, raw_stdout=True)
    assert refused(r, 1, unchanged=[vault]) == refusal(out_dir / name, kind)
    assert is_kind(out_dir / name, kind) and os.listdir(out_dir) == [name]


def test_forward_keeps_the_mode_of_a_replaced_file(tmp_path: Path) -> None:
    vault, x = inputs(tmp_path)
    out = tmp_path / "y.f32"
    out.write_bytes(b"old\n")
    os.chmod(out, 0o600)
    r = run("forward", vault, 0, 0, x, out, command=STREAM, raw_stdout=True)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size == D_MODEL * 4
    assert mode_of(out) == (0o600, os.geteuid(), os.getegid())


@ROOT_ONLY
def test_dequant_keeps_the_owner_group_and_mode_of_replaced_files(tmp_path: Path) -> None:
    vault, _ = inputs(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    modes = {"gate.f32": 0o600, "up.f32": 0o640, "down.f32": 0o2750}
    for name, mode in modes.items():
        (out_dir / name).write_bytes(b"old\n")
        os.chown(out_dir / name, DAEMON, DAEMON)
        os.chmod(out_dir / name, mode)
    r = run("dequant", vault, 0, 0, out_dir, command=STREAM, raw_stdout=True)
    assert r.returncode == 0, r.stderr
    for name, mode in modes.items():
        assert (out_dir / name).stat().st_size == 32 * D_MODEL * 4
        assert mode_of(out_dir / name) == (mode, DAEMON, DAEMON), name


def test_new_outputs_take_the_umask(tmp_path: Path) -> None:
    vault, x = inputs(tmp_path)
    script = 'umask 027 && exec "$@"'
    out = tmp_path / "y.f32"
    r = run(
        "-c",
        script,
        "sh",
        SMOE_STREAM,
        "forward",
        vault,
        0,
        0,
        x,
        out,
        command=["sh"],
        raw_stdout=True,
    )
    assert r.returncode == 0, r.stderr
    assert mode_of(out)[0] == 0o640


def _under_file_limit(limit: int, *args: str | Path) -> subprocess.CompletedProcess:
    """``smoe-stream ARGS`` with a file size limit of ``limit`` bytes (``ulimit -f``)."""

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [str(SMOE_STREAM), *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=plain_env(),
        preexec_fn=limited,
        timeout=60,
    )


@pytest.mark.parametrize("command", ["forward", "dequant"])
def test_an_output_past_the_file_size_limit_is_one_line_and_leaves_nothing(
    command: str, tmp_path: Path
) -> None:
    vault, x = inputs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    if command == "forward":
        r = _under_file_limit(100, "forward", vault, 0, 0, x, out / "y.f32")
        path = out / "y.f32"  # 256 bytes: 100 written, then EFBIG
    else:
        r = _under_file_limit(4096, "dequant", vault, 0, 0, out)
        path = out / "gate.f32"  # 8 KiB, the first of three
    assert r.returncode == exit_codes.WRITE_FAILED.status, r.stderr
    assert r.stderr.splitlines() == [r.stderr.rstrip("\n")]
    assert r.stderr.startswith(f"smoe-stream: {path}: cannot write ")
    assert r.stderr.endswith(f": {os.strerror(errno.EFBIG)}\n")
    assert os.listdir(out) == []  # neither the output nor its temporary file
