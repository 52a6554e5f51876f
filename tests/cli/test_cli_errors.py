"""Every CLI failure is one line, ``--json`` is always one valid JSON document, ``--jobs``.

Real failures come from tmpfs mounts (read-only, 64 KiB, an immutable folder: the tests run as
root, where ``chmod 0o500`` stops nothing); exceptions the CLI must classify are raised by a
command function replaced in a tiny ``-c`` script.
"""

from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from smoe import cli
from smoe.plumbing import cpus
from smoe_testkit.synth import write_checkpoint

from fixtures_data import FIXTURES
from helpers import SMOE_DUMP, one_line, plain_env, python, refused, run, strict_json

ARCH_ROPE_THETA = 1536 + 16  # deepseek_v2.smoe: arch block at 1536, rope_theta at +16
Arg = str | bytes | os.PathLike


def failed(proc: subprocess.CompletedProcess, code: int) -> str:
    """Exit ``code``, one ``error:`` line, and with --json exactly the error document."""
    line = refused(proc, code)
    assert line.startswith("error: "), line
    if b"--json" in [os.fsencode(a) for a in proc.args]:
        doc = strict_json(proc.stdout)
        assert doc == {
            "schema": "smoe-findings/1",
            "ok": False,
            "error": {"message": doc["error"]["message"], "exit_code": code},
        }
        if "\\x" not in line:
            assert doc["error"]["message"] == line.removeprefix("error: ")
    else:
        assert proc.stdout == b""
    return line


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "qwen",
        layers=2,
        experts=4,
        d_model=64,
        ffn=32,
        seed=1,
        vocab=320,  # the q4_v1 fixture's, which upgrade --model checks
    )


def writes(ckpt: Path, out_dir: Path) -> dict[str, list[Arg]]:
    """One writing invocation per command, each putting its output in ``out_dir``."""
    return {
        "sculpt": ["sculpt", ckpt, out_dir, "--jobs", "1", "--json"],
        "export": ["export", FIXTURES / "qwen3_v2.smoe", out_dir / "x.safetensors", "--json"],
        "upgrade": [
            "upgrade",
            FIXTURES / "q4_v1.smoe",
            "--config",
            ckpt / "config.json",
            "--out",
            out_dir / "x.smoe",
            "--json",
        ],
    }


COMMANDS = ("sculpt", "export", "upgrade")


# ---- outputs that cannot be written ----------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_unwritable_out_dir(ckpt: Path, tmpfs: Callable[..., Path], command: str) -> None:
    out = tmpfs("mnt") / "out"
    out.mkdir()
    if shutil.which("chattr") is None:
        pytest.skip("chattr (e2fsprogs) is not installed: cannot make a folder unwritable to root")
    assert run("+i", out, command=["chattr"]).returncode == 0
    line = failed(run(*writes(ckpt, out)[command], text=False), 1)
    assert line.startswith(f"error: {out}/") and line.endswith(": Operation not permitted")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_out_dir_is_a_file(ckpt: Path, tmp_path: Path, command: str) -> None:
    afile = tmp_path / "afile"
    afile.write_bytes(b"keep")
    line = failed(run(*writes(ckpt, afile)[command], text=False), 1)
    assert line == f"error: {afile}: exists and is not a folder"  # fileio.ensure_dir
    assert afile.read_bytes() == b"keep"


@pytest.mark.parametrize("command", COMMANDS)
def test_read_only_filesystem(ckpt: Path, tmpfs: Callable[..., Path], command: str) -> None:
    ro = tmpfs("ro", "ro")
    line = failed(run(*writes(ckpt, ro / "out")[command], text=False), 1)
    assert line.startswith(f"error: {ro}/") and line.endswith(": Read-only file system")


@pytest.mark.parametrize("command", COMMANDS)
def test_disk_full(ckpt: Path, tmpfs: Callable[..., Path], command: str) -> None:
    full = tmpfs("full", "size=64k")
    out = full / "out"
    line = failed(run(*writes(ckpt, out)[command], text=False), 1)
    assert line.startswith(f"error: {full}/") and line.endswith(": No space left on device")
    left = [p.name for p in out.iterdir() if not p.name.endswith(".lock")] if out.exists() else []
    assert left == []  # nothing half-written under a final or temporary name


@pytest.mark.parametrize(
    "args", [["spec", "--json"], ["spec"], ["verify", str(FIXTURES / "q4_v2.smoe")]]
)
def test_stdout_on_a_full_disk(tmpfs: Callable[..., Path], args: list[str]) -> None:
    full = tmpfs("full", "size=64k")
    fd = os.open(full / "fill", os.O_WRONLY | os.O_CREAT)
    with pytest.raises(OSError, match="No space left on device"):
        while True:
            os.write(fd, b"\0" * 4096)
    os.close(fd)
    with (full / "out").open("wb") as out:
        proc = run(*args, stdout=out, text=False)
    assert proc.returncode == 1
    assert one_line(proc) == "error: standard output: cannot write: No space left on device"


# ---- inputs ----------------------------------------------------------------------------------
def test_non_utf8_config(ckpt: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    (bad / "config.json").write_bytes(b"\xff" + (ckpt / "config.json").read_bytes())
    for args in (
        ["sculpt", bad, tmp_path / "out", "--jobs", "1", "--json"],
        [
            "upgrade",
            FIXTURES / "q4_v1.smoe",
            "--config",
            bad / "config.json",
            "--out",
            tmp_path / "x.smoe",
            "--json",
        ],
    ):
        line = failed(run(*args, text=False), 1)
        assert line.startswith(f"error: {bad / 'config.json'}: "), line
        assert "UTF-8" in line and "internal error" not in line
    assert not (tmp_path / "out" / "bad.smoe").exists() and not (tmp_path / "x.smoe").exists()


def test_paths_with_byte_ff_in_json_modes(ckpt: Path, tmp_path: Path) -> None:
    base = os.fsencode(tmp_path)
    vault = base + b"/ok\xff.smoe"
    shutil.copyfile(FIXTURES / "q4_v2.smoe", vault)
    shown = f"{tmp_path}/ok\ufffd.smoe"
    proc = run("verify", "--json", vault, text=False)
    assert proc.returncode == 0 and strict_json(proc.stdout)["vault"] == shown
    proc = run("dump", "--json", vault, text=False)
    assert proc.returncode == 0 and strict_json(proc.stdout)["file"]["path"] == shown
    proc = run(
        "export", FIXTURES / "q4_v2.smoe", base + b"/x\xff.safetensors", "--json", text=False
    )
    assert proc.returncode == 0
    assert strict_json(proc.stdout)["out"] == f"{tmp_path}/x\ufffd.safetensors"
    proc = run("sculpt", ckpt, base + b"/out\xff", "--jobs", "1", "--json", text=False)
    assert proc.returncode == 0
    assert strict_json(proc.stdout)["vault"] == f"{tmp_path}/out\ufffd/qwen.smoe"

    proc = run("verify", "--json", base + b"/missing\xff.smoe", text=False)
    failed(proc, 2)
    reason = "cannot open: No such file or directory"
    assert one_line(proc) == f"error: {tmp_path}/missing\\xff.smoe: {reason}"
    assert (
        strict_json(proc.stdout)["error"]["message"] == f"{tmp_path}/missing\ufffd.smoe: {reason}"
    )
    text = run("verify", vault, text=False)
    assert text.returncode == 0
    assert f"{tmp_path}/ok\\xff.smoe: valid" in text.stdout.decode("utf-8")


# ---- NaN never reaches a JSON document --------------------------------------------------------
def test_json_helper_nulls_non_finite_floats_and_cleans_strings() -> None:
    doc = {
        "nan": math.nan,
        "inf": [math.inf, -math.inf, 1.5],
        "f32": np.float32("nan"),
        "arr": np.array([1.0, np.inf]),
        "i": np.int64(7),
        "path": Path(os.fsdecode(b"a\xff")),
        "bad\udcff": "x\udcffy",
        3: (True, None),
    }
    text = cli.to_json(doc)
    assert text.isascii()
    assert strict_json(text.encode()) == {
        "nan": None,
        "inf": [None, None, 1.5],
        "f32": None,
        "arr": [1.0, None],
        "i": 7,
        "path": "a\ufffd",
        "bad\ufffd": "x\ufffdy",
        "3": [True, None],
    }


def test_dump_json_of_a_nan_arch_field(tmp_path: Path) -> None:
    vault = tmp_path / "nan.smoe"
    data = bytearray((FIXTURES / "deepseek_v2.smoe").read_bytes())
    data[ARCH_ROPE_THETA : ARCH_ROPE_THETA + 4] = struct.pack("<f", math.nan)
    vault.write_bytes(bytes(data))
    dump, verify = (
        run("dump", "--json", vault, text=False),
        run("verify", "--json", vault, text=False),
    )
    assert (dump.returncode, dump.stderr, verify.returncode, verify.stderr) == (0, b"", 0, b"")
    assert strict_json(dump.stdout)["arch"]["rope_theta"] is None  # NaN in the file
    findings = strict_json(verify.stdout)["findings"]
    assert [f["severity"] for f in findings if f["code"] == "arch.rope_theta"] == ["warning"]


def test_nan_weight(tmp_path: Path) -> None:
    ck = write_checkpoint(
        tmp_path / "nanw", layers=2, experts=4, d_model=64, ffn=32, seed=1, dtype="F32"
    )
    tensors = load_file(str(ck / "model.safetensors"))
    tensors["model.layers.1.mlp.experts.2.up_proj.weight"][3, 5] = np.nan
    save_file(tensors, str(ck / "model.safetensors"), metadata={"format": "pt"})
    line = failed(run("sculpt", ck, tmp_path / "out", "--jobs", "1", "--json", text=False), 1)
    assert "inf or nan" in line and "internal error" not in line
    assert not (tmp_path / "out" / "nanw.smoe").exists()


# ---- --jobs and other usage errors -------------------------------------------------------------
@pytest.mark.parametrize("value", ["0", "-5", "x", "2.5"])
def test_jobs_refused(tmp_path: Path, value: str) -> None:
    want = (
        f"error: argument --jobs: expected a whole number >= 1, got '{value}' "
        "(see smoe sculpt --help)"
    )
    assert failed(run("sculpt", tmp_path, tmp_path / "o", "--jobs", value, text=False), 2) == want
    assert (
        failed(run("sculpt", tmp_path, tmp_path / "o", "--jobs", value, "--json", text=False), 2)
        == want
    )
    assert not (tmp_path / "o").exists()


def test_jobs_default_and_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import smoe.sculpt

    seen = []
    monkeypatch.setattr(smoe.sculpt, "sculpt", lambda m, o, opts: seen.append(opts.jobs) or {})
    assert cli.main(["sculpt", "m", "o", "--dry-run", "--json"]) == 0
    assert cli.main(["sculpt", "m", "o", "--dry-run", "--json", "--jobs", "3"]) == 0
    assert seen == [None, 3]
    assert cpus.usable_cores() == len(os.sched_getaffinity(0))
    help_text = " ".join(run("sculpt", "--help", text=False).stdout.decode().split())
    assert f"(default: the usable cores, {cpus.usable_cores()} here;" in help_text


def test_usage_errors_are_one_line_and_json(tmp_path: Path) -> None:
    line = failed(run("verify", "--json", text=False), 2)
    assert line == "error: the following arguments are required: vault (see smoe verify --help)"
    line = failed(run("verify", "v.smoe", "--manifest", "m.json", "--no-manifest", text=False), 2)
    assert line == (
        "error: argument --no-manifest: not allowed with argument --manifest "
        "(see smoe verify --help)"
    )
    proc = run("--layer", "x", "v.smoe", command=SMOE_DUMP, text=False)
    assert failed(proc, 2) == (
        "error: argument --layer: invalid int value: 'x' (see smoe-dump --help)"
    )
    missing = tmp_path / "missing.smoe"
    proc = run("--json", missing, command=SMOE_DUMP, text=False)
    assert failed(proc, 2) == f"error: {missing}: cannot open: No such file or directory"


def test_manifest_options_reach_verify_and_dump(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import smoe.cli.dump
    import smoe.format.verify
    from smoe.errors import SmoeError

    def fake(path: Path, deep: bool, manifest: object) -> None:
        raise SmoeError(f"{path} deep={deep} manifest={manifest!r}")

    monkeypatch.setattr(smoe.format.verify, "verify_path", fake)
    monkeypatch.setattr(smoe.cli.dump, "collect_path", fake)
    for command in ("verify", "dump"):
        for extra, want in (
            ([], "'auto'"),
            (["--manifest", "m.json"], "PosixPath('m.json')"),
            (["--no-manifest"], "None"),
        ):
            assert cli.main([command, "v.smoe", "--deep", *extra]) == 1
            err = capsys.readouterr().err
            assert err == f"error: v.smoe deep=True manifest={want}\n"
        help_text = " ".join(run(command, "--help", text=False).stdout.decode().split())
        assert "when present); only checked with --deep" in help_text
        assert "(it is only checked with --deep anyway)" in help_text
    assert cli.dump_main(["v.smoe", "--no-manifest"]) == 1
    assert capsys.readouterr().err == "error: v.smoe deep=False manifest=None\n"


def test_a_broken_manifest_is_a_finding(tmp_path: Path) -> None:
    bad = tmp_path / "m.json"
    bad.write_bytes(b"{not json")
    proc = run("verify", "--deep", "--json", "--manifest", bad, FIXTURES / "q4_v2.smoe", text=False)
    assert proc.returncode == 1, proc.stderr
    codes = [f["code"] for f in strict_json(proc.stdout)["findings"]]
    assert "manifest.malformed" in codes
    proc = run("verify", "--deep", "--json", "--no-manifest", FIXTURES / "q4_v2.smoe", text=False)
    assert proc.returncode == 0 and strict_json(proc.stdout)["valid"] is True


# ---- how each exception is shown ---------------------------------------------------------------
SCRIPT = """\
import errno, sys
import smoe.cli as cli
import smoe.cli.commands as commands
from smoe.errors import SmoeError, UnreadableInput
from smoe.plumbing.fileio import NotRegular

def fail(args):
    raise {exc}

commands.{func} = fail
sys.exit(cli.main(sys.argv[1:]))
"""
HINT = "(run with --debug for the traceback)"
CASES = [
    # internal errors
    (
        "cmd_spec",
        ["spec"],
        "RuntimeError('boom\\n  second line')",
        1,
        f"internal error: RuntimeError: boom second line {HINT}",
    ),
    ("cmd_spec", ["spec", "--json"], "MemoryError()", 1, f"internal error: MemoryError {HINT}"),
    (
        "cmd_verify",
        ["verify", "v.smoe", "--json"],
        "b'\\xff'.decode()",
        1,
        "internal error: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: "
        f"invalid start byte {HINT}",
    ),
    (
        "cmd_export",
        ["export", "v.smoe", "x.st"],
        "ValueError('bad value')",
        1,
        f"internal error: ValueError: bad value {HINT}",
    ),
    # OSError: FILE: STRERROR, exit 1 (an input that cannot be read is UnreadableInput: 2)
    (
        "cmd_export",
        ["export", "v.smoe", "out/x.st", "--json"],
        "PermissionError(errno.EACCES, 'Permission denied', 'out/x.st')",
        1,
        "out/x.st: Permission denied",
    ),
    (
        "cmd_verify",
        ["verify", "dir/v.smoe", "--json"],
        "UnreadableInput.from_os(FileNotFoundError(errno.ENOENT, 'No such file or directory', "
        "'dir/v.smoe'))",
        2,
        "dir/v.smoe: No such file or directory",
    ),
    (
        "cmd_sculpt",
        ["sculpt", "model", "out"],
        "UnreadableInput.from_os(PermissionError(errno.EACCES, 'Permission denied', "
        "'model/config.json'))",
        2,
        "model/config.json: Permission denied",
    ),
    (
        "cmd_sculpt",
        ["sculpt", "model", "out"],
        "PermissionError(errno.EACCES, 'Permission denied', 'model/config.json')",
        1,
        "model/config.json: Permission denied",
    ),
    (
        "cmd_sculpt",
        ["sculpt", "model", "model/out"],
        "PermissionError(errno.EACCES, 'Permission denied', 'model/out/q.smoe')",
        1,
        "model/out/q.smoe: Permission denied",
    ),
    (
        "cmd_upgrade",
        ["upgrade", "v.smoe", "--config", "c.json"],
        "OSError(errno.EROFS, 'Read-only file system', 'v.smoe')",
        1,
        "v.smoe: Read-only file system",
    ),
    (
        "cmd_export",
        ["export", "v.smoe", "x.st"],
        "OSError(errno.EXDEV, 'Invalid cross-device link', 'x.st.tmp', None, 'x.st')",
        1,
        "x.st.tmp -> x.st: Invalid cross-device link",
    ),
    (
        "cmd_spec",
        ["spec", "--json"],
        "OSError(errno.ENOSPC, 'No space left on device')",
        1,
        f"I/O error: No space left on device {HINT}",
    ),
    # SmoeError and its exit-2 kinds
    (
        "cmd_verify",
        ["verify", "v.smoe"],
        "SmoeError('v.smoe: first\\nsecond')",
        1,
        "v.smoe: first second",
    ),
    (
        "cmd_dump",
        ["dump", "p", "--json"],
        "NotRegular('p: not a regular file (a FIFO)')",
        2,
        "p: not a regular file (a FIFO)",
    ),
]


def run_failing(
    func: str, exc: str, args: list[str], env: dict | None = None
) -> subprocess.CompletedProcess:
    code = SCRIPT.format(func=func, exc=exc)
    return python(code, *args, env=env, text=False)


@pytest.mark.parametrize(("func", "args", "exc", "code", "message"), CASES)
def test_exception_is_one_line(
    func: str, args: list[str], exc: str, code: int, message: str
) -> None:
    assert failed(run_failing(func, exc, args), code) == f"error: {message}"


def test_debug_shows_the_traceback() -> None:
    exc = "RuntimeError('boom')"
    for args, env in (
        (["--debug", "spec"], None),
        (["spec", "--debug"], None),
        (["spec"], plain_env(SMOE_DEBUG="1")),
    ):
        proc = run_failing("cmd_spec", exc, args, env)
        assert proc.returncode == 1
        err = proc.stderr.decode()
        assert err.startswith("Traceback") and err.endswith("RuntimeError: boom\n")
    proc = run_failing("cmd_spec", exc, ["spec", "--json", "--debug"])
    assert "Traceback" in proc.stderr.decode()
    assert (
        strict_json(proc.stdout)["error"]["message"] == f"internal error: RuntimeError: boom {HINT}"
    )
    quiet = run_failing("cmd_spec", exc, ["spec"], plain_env(SMOE_DEBUG="0"))
    assert failed(quiet, 1) == f"error: internal error: RuntimeError: boom {HINT}"


def test_interrupt_and_broken_pipe_keep_their_exit_codes() -> None:
    proc = run_failing("cmd_sculpt", "KeyboardInterrupt()", ["sculpt", "m", "o"])
    assert proc.returncode == 130 and proc.stdout == b""
    assert one_line(proc) == "interrupted; run the same command with --resume to continue"
    proc = run_failing("cmd_sculpt", "KeyboardInterrupt()", ["sculpt", "m", "o", "--json"])
    assert proc.returncode == 130
    assert strict_json(proc.stdout) == {
        "schema": "smoe-findings/1",
        "ok": False,
        "error": {
            "message": "interrupted; run the same command with --resume to continue",
            "exit_code": 130,
        },
    }
    proc = run_failing("cmd_spec", "BrokenPipeError()", ["spec", "--json"])
    assert (proc.returncode, proc.stdout, proc.stderr) == (141, b"", b"")
