"""A closed stdout (``smoe dump V --experts | head -1``) ends every command quietly (issue 25):
exit status 141 (128 + SIGPIPE, codegen/exit_codes.yaml's ``stdout_closed``), nothing on
stderr, never a traceback, whether the pipe is closed before the first write, in the middle
of the output, or at the last flush at interpreter exit (stdout block-buffered, as Python has
it in a pipe, or unbuffered under ``PYTHONUNBUFFERED``). A command that failed keeps its own
status and its error line; a command that writes files finishes them first (sculpt's vault
verifies clean, byte for byte the vault of a run whose stdout stayed open). A closed stderr
only drops the lines nobody can read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from smoe_gen import exit_codes
from smoe_testkit.synth import write_sparse_vault

from fixtures_data import CKPTS, FIXTURES, OLMOE_CONFIG, ROOT
from helpers import HANG_GUARD, SMOE, SMOE_DUMP, plain_env, run, strict_json

CLOSED = 141
Q4 = FIXTURES / "q4_v2.smoe"
# stdout block-buffered (everything reaches the pipe at the last flush) or unbuffered
BUFFERING = {"buffered": {"PYTHONUNBUFFERED": None}, "unbuffered": {"PYTHONUNBUFFERED": "1"}}


def closed_stdout(
    *args: str | Path, command: list[str] = SMOE, env: dict[str, str | None] | None = None
) -> tuple[int, str]:
    """Run with stdout a pipe whose reading end is closed before the command starts:
    (exit status, stderr)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [*command, *map(str, args)],
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=plain_env(**(env or {})),
            timeout=HANG_GUARD,
        )
    finally:
        os.close(write)
    return proc.returncode, proc.stderr.decode("utf-8", "surrogateescape")


def head(*args: str | Path, env: dict[str, str | None] | None = None) -> tuple[int, bytes, str]:
    """``smoe ARGS | head -c 1``: read one byte, close the pipe, wait: (status, the byte,
    stderr). The output must exceed a pipe's buffer, so that the close comes mid-stream."""
    proc = subprocess.Popen(
        [*SMOE, *map(str, args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=plain_env(**(env or {})),
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        first = os.read(proc.stdout.fileno(), 1)
        proc.stdout.close()
        err = proc.stderr.read()
        proc.wait(timeout=HANG_GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, first, err.decode("utf-8", "surrogateescape")


def test_the_status_is_the_shared_tables() -> None:
    assert exit_codes.STDOUT_CLOSED.status == CLOSED


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A vault whose dumps (text and JSON) are far larger than a pipe's buffer."""
    path = tmp_path_factory.mktemp("big") / "big.smoe"
    return write_sparse_vault(path, layers=4, experts=128, d_model=64, ffn=32, vocab=320)


READERS = {
    "help": ["--help"],
    "version": ["--version"],
    "dump help": ["dump", "--help"],
    "dump": ["dump", Q4],
    "dump experts": ["dump", Q4, "--experts"],
    "dump json": ["dump", Q4, "--json"],
    "dump field": ["dump", Q4, "--field", "header.bits"],
    "dump field json": ["dump", Q4, "--field", "experts[0]", "--json"],
    "verify": ["verify", Q4],
    "verify json": ["verify", Q4, "--json"],
    "families": ["families"],
    "families one": ["families", "qwen3_moe"],
    "families json": ["families", "--json"],
    "families markdown": ["families", "--markdown"],
    "spec": ["spec"],
    "spec json": ["spec", "--json"],
    "spec ksy": ["spec", "--ksy"],
    "sculpt dry run": ["sculpt", CKPTS / "qwen3_moe", "unused-out", "--dry-run"],
}


@pytest.mark.parametrize("buffering", BUFFERING)
@pytest.mark.parametrize("argv", READERS.values(), ids=READERS)
def test_every_command_ends_quietly(argv: list[str | Path], buffering: str) -> None:
    assert closed_stdout(*argv, env=BUFFERING[buffering]) == (CLOSED, "")


@pytest.mark.parametrize("buffering", BUFFERING)
def test_smoe_dump_too(buffering: str) -> None:
    env = BUFFERING[buffering]
    assert closed_stdout(Q4, "--experts", command=SMOE_DUMP, env=env) == (CLOSED, "")
    assert closed_stdout("--help", command=SMOE_DUMP, env=env) == (CLOSED, "")


@pytest.mark.parametrize("buffering", BUFFERING)
@pytest.mark.parametrize("flags", [["--experts"], ["--json"]], ids=["text", "json"])
def test_a_pipe_closed_mid_stream(big: Path, flags: list[str], buffering: str) -> None:
    status, first, err = head("dump", big, *flags, env=BUFFERING[buffering])
    assert (status, err) == (CLOSED, "")
    assert first == (b"{" if flags == ["--json"] else os.fsencode(big)[:1])


def test_a_shell_pipeline_into_head(big: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed (PIPESTATUS)")
    smoe = " ".join(f"'{w}'" for w in SMOE)
    script = f"{smoe} dump '{big}' --experts | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}"
    proc = run("-c", script, command=[bash])
    assert (proc.stdout, proc.stderr) == (f"{CLOSED}\n", "")


@pytest.mark.parametrize("buffering", BUFFERING)
def test_a_failure_keeps_its_status_and_its_line(buffering: str) -> None:
    env = BUFFERING[buffering]
    missing = "missing.smoe"
    line = "error: missing.smoe: cannot open: No such file or directory\n"
    assert closed_stdout("verify", missing, "--json", env=env) == (2, line)
    assert closed_stdout("dump", missing, env=env) == (2, line)
    assert closed_stdout("dump", Q4, "--field", "header.num_layers", env=env) == (
        2,
        "error: --field header.num_layers: no such field (nearest: header.num_moe_layers, "
        "header.max_experts_per_layer, header.version)\n",
    )
    assert closed_stdout("dump", "--layer", "x", Q4, env=env) == (
        2,
        "error: argument --layer: invalid int value: 'x' (see smoe dump --help)\n",
    )


@pytest.mark.parametrize("buffering", BUFFERING)
def test_export_and_upgrade_finish_their_files(tmp_path: Path, buffering: str) -> None:
    env = BUFFERING[buffering]
    out = tmp_path / "layer1.safetensors"
    assert closed_stdout("export", Q4, out, "--layer", "1", "--json", env=env) == (CLOSED, "")
    want = tmp_path / "want.safetensors"
    assert run("export", Q4, want, "--layer", "1").returncode == 0
    assert out.read_bytes() == want.read_bytes()

    v1 = tmp_path / "v1.smoe"
    shutil.copyfile(FIXTURES / "q4_v1.smoe", v1)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(OLMOE_CONFIG))
    assert closed_stdout("upgrade", v1, "--config", config, env=env) == (CLOSED, "")
    proc = run("verify", v1, "--json")
    assert proc.returncode == 0 and strict_json(proc.stdout)["valid"] is True
    assert run("dump", v1, "--field", "header.version").stdout == "2\n"

    page = tmp_path / "q4.html"
    assert closed_stdout("report", Q4, "-o", page, env=env) == (CLOSED, "")
    assert page.read_text(encoding="utf-8").rstrip().endswith("</html>")


@pytest.mark.parametrize("buffering", BUFFERING)
def test_sculpt_into_a_closed_pipe_leaves_a_complete_vault(tmp_path: Path, buffering: str) -> None:
    """``smoe sculpt fixtures/checkpoints/qwen3_moe OUT | head -c 1``."""
    model = CKPTS / "qwen3_moe"
    out = tmp_path / "out"
    assert closed_stdout("sculpt", model, out, "--jobs", "1", env=BUFFERING[buffering]) == (
        CLOSED,
        "",
    )
    names = ["qwen3_moe.config.json", "qwen3_moe.scout.safetensors", "qwen3_moe.smoe"]
    names.append("qwen3_moe.smoe.manifest.json")
    assert sorted(p.name for p in out.iterdir()) == names  # no partial, journal or lock
    proc = run("verify", "--deep", out / "qwen3_moe.smoe")
    assert (proc.returncode, proc.stdout) == (
        0,
        f"{out / 'qwen3_moe.smoe'}: valid (0 errors, 0 warnings, deep)\n",
    )
    clean = tmp_path / "clean"
    assert run("sculpt", model, clean, "--jobs", "1").returncode == 0
    for name in ("qwen3_moe.smoe", "qwen3_moe.scout.safetensors", "qwen3_moe.config.json"):
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name


def test_sculpt_through_head(tmp_path: Path) -> None:
    """The same through a real ``head -c 1``, which exits after the summary's first byte."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed (PIPESTATUS)")
    out = tmp_path / "out"
    smoe = " ".join(f"'{w}'" for w in SMOE)
    script = (
        f"{smoe} sculpt '{CKPTS / 'qwen3_moe'}' '{out}' --jobs 1 | head -c 1; "
        'echo " ${PIPESTATUS[0]}"'
    )
    proc = run("-c", script, command=[bash], cwd=ROOT)
    assert proc.stderr == ""
    assert proc.stdout in (f"s {CLOSED}\n", "s 0\n")  # 0: the summary fitted in the pipe
    proc = run("verify", "--deep", out / "qwen3_moe.smoe")
    assert proc.returncode == 0, proc.stdout


def closed_stderr(*args: str | Path) -> tuple[int, str]:
    """Run with stderr a pipe whose reading end is closed: (exit status, stdout)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [*SMOE, *map(str, args)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=write,
            cwd=ROOT,
            env=plain_env(),
            timeout=HANG_GUARD,
        )
    finally:
        os.close(write)
    return proc.returncode, proc.stdout.decode()


def test_a_closed_stderr_drops_only_its_lines(tmp_path: Path) -> None:
    status, out = closed_stderr("verify", "missing.smoe", "--json")
    assert status == 2
    assert strict_json(out)["error"] == {
        "message": "missing.smoe: cannot open: No such file or directory",
        "exit_code": 2,
    }
    assert closed_stderr("verify", "missing.smoe") == (2, "")
    model = tmp_path / "qwen3_moe"  # config.json says 1 layer, the tensors 2: one warning
    shutil.copytree(CKPTS / "qwen3_moe", model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    status, out = closed_stderr("sculpt", model, tmp_path / "out", "--dry-run", "--json")
    assert status == 0
    assert strict_json(out)["warnings"] == [
        "num_hidden_layers: config.json says 1, the tensors say 2; using the tensors"
    ]
