"""Text output in a pipe: never wrapped or cut, no trailing spaces, warnings on stderr.

Every text command runs with stdout and stderr to pipes, ``COLUMNS=40``, on files under a
directory path of several hundred characters (with spaces); ``grep PATH`` must find the whole
path on one line. On a terminal (a pty) rich's rendering stays, and ``NO_COLOR`` holds.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from smoe.cli.console import TrimmedLines

from fixtures_data import CORRUPT, FIXTURES
from helpers import SMOE, SMOE_DUMP, plain_env, run

# a narrow colour terminal's settings: what a pipe's output must not depend on
ENV = plain_env(NO_COLOR=None, COLUMNS="40", LINES="10", TERM="xterm-256color")
CHECKPOINT = FIXTURES / "checkpoints" / "qwen3_moe"
# config.json says 1 layer, the tensors hold 2: sculpt and upgrade --model warn, then go on
WARNING = "warning: num_hidden_layers: config.json says 1, the tensors say 2; using the tensors"
COLOUR = re.compile(r"\x1b\[([0-9;]*)m")


@dataclass
class Place:
    """Inputs and outputs under the long directory."""

    long: Path
    model: Path
    vault: Path
    v1: Path
    corrupt: Path
    sculpt: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Place:
    long = tmp_path_factory.mktemp("pipes")
    for i in range(4):
        long /= f"a directory name long enough to wrap any terminal line, part {i}"
    model = long / "qwen3_moe"
    shutil.copytree(CHECKPOINT, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    sculpt = run("sculpt", model, long / "v2", "--jobs", "1", env=ENV)
    assert sculpt.returncode == 0, sculpt.stderr
    v1_run = run(
        "sculpt", model, long / "v1", "--jobs", "1", "--format-version", "1", "--json", env=ENV
    )
    assert v1_run.returncode == 0, v1_run.stderr
    corrupt = long / "duplicate_expert.smoe"
    shutil.copy(CORRUPT / "duplicate_expert.smoe", corrupt)
    return Place(
        long, model, long / "v2" / "qwen3_moe.smoe", long / "v1" / "qwen3_moe.smoe", corrupt, sculpt
    )


def check_plain(proc: subprocess.CompletedProcess) -> None:
    """No trailing spaces, no cut cell, no colour, on both streams."""
    for name, text in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        for line in text.splitlines():
            assert line == line.rstrip(), f"{name}: trailing spaces: {line!r}"
            assert "…" not in line, f"{name}: cut: {line!r}"
            assert "\x1b" not in line, f"{name}: escape sequence: {line!r}"


def test_trailing_spaces_are_dropped_only_at_line_ends() -> None:
    out = io.StringIO()
    trimmed = TrimmedLines(out)
    for chunk in ("a  ", " b   ", "\n  \nc ", "d  "):
        trimmed.write(chunk)
    trimmed.flush()
    assert out.getvalue() == "a   b\n\nc d"


def lines_with(text: str, needle: str) -> list[str]:
    """What ``grep -F NEEDLE`` prints."""
    return [line for line in text.splitlines() if needle in line]


def test_sculpt_summary_and_its_warning(place: Place) -> None:
    check_plain(place.sculpt)
    vault_line = f"vault                {place.vault}"
    assert lines_with(place.sculpt.stdout, str(place.vault)) == [vault_line]
    assert lines_with(place.sculpt.stdout, str(place.vault.with_suffix(".scout.safetensors")))
    assert "warning" not in place.sculpt.stdout
    assert place.sculpt.stderr.splitlines() == [WARNING]


def test_sculpt_dry_run(place: Place) -> None:
    proc = run("sculpt", place.model, place.long / "planned", "--dry-run", env=ENV)
    assert proc.returncode == 0, proc.stderr
    check_plain(proc)
    assert "experts                  16" in proc.stdout.splitlines()
    assert "warning" not in proc.stdout
    assert proc.stderr.splitlines() == [WARNING]


@pytest.mark.parametrize("deep", [[], ["--deep"]], ids=["shallow", "deep"])
def test_verify(place: Place, deep: list[str]) -> None:
    proc = run("verify", *deep, place.vault, env=ENV)
    assert proc.returncode == 0, proc.stderr
    check_plain(proc)
    verdict = "valid (0 errors, 0 warnings, deep)" if deep else "valid (0 errors, 0 warnings)"
    assert lines_with(proc.stdout, str(place.vault)) == [f"{place.vault}: {verdict}"]
    assert proc.stderr == ""


def test_verify_findings_are_whole_lines(place: Place) -> None:
    proc = run("verify", place.corrupt, env=ENV)
    assert proc.returncode == 1
    check_plain(proc)
    assert (
        "error: table.duplicate at offset 0x74 (experts[1].expert_id): (layer 0, expert 0) "
        "appears twice"
    ) in proc.stdout.splitlines()
    (verdict,) = lines_with(proc.stdout, str(place.corrupt))
    assert verdict.startswith(f"{place.corrupt}: INVALID (1 errors, ")
    assert proc.stderr == ""


@pytest.mark.parametrize("command", [[*SMOE, "dump"], SMOE_DUMP], ids=["smoe dump", "smoe-dump"])
@pytest.mark.parametrize("flags", [[], ["--experts"], ["--layer", "1", "--deep"]])
def test_dump(place: Place, command: list[str], flags: list[str]) -> None:
    proc = run(*flags, place.vault, command=command, env=ENV)
    assert proc.returncode == 0, proc.stderr
    check_plain(proc)
    (first,) = lines_with(proc.stdout, str(place.vault))
    assert first == (
        f"{place.vault}  278,528 bytes  v2  Q4  group 64  data_offset 0x4000  "
        "full vault, 16 experts"
    )
    shapes = "gate_proj 48x64 up_proj 48x64 down_proj 64x48"
    assert f"layer 1: 8 experts (ids 0-7), {shapes}, blobs 0x24000..0x44000" in proc.stdout
    if flags:
        assert (
            "layer 1 expert 7 up_proj    Q4  [48, 64]  packed +1632 (0x40660) 1,536 B  "
            "scales +3168 (0x40c60) 96 B" in proc.stdout
        )
    assert proc.stderr == ""


def test_spec(place: Place) -> None:
    proc = run("spec", env=ENV)
    assert proc.returncode == 0, proc.stderr
    check_plain(proc)
    lines = proc.stdout.splitlines()
    spec = json.loads(run("spec", "--json", env=ENV).stdout)
    for struct in spec["structs"].values():
        for f in struct["fields"]:
            assert len(lines_with(proc.stdout, f["doc"])) >= 1, f["name"]  # never folded
    assert max(map(len, lines)) > 100


def test_export(place: Place) -> None:
    out = place.long / "layer0.safetensors"
    proc = run("export", place.vault, out, "--layer", "0", env=ENV)
    assert proc.returncode == 0, proc.stderr
    check_plain(proc)
    assert proc.stdout.splitlines() == [f"wrote 24 float32 tensors (8 experts) to {out}"]


def test_upgrade_and_its_warning(place: Place) -> None:
    proc = run("upgrade", place.v1, "--model", place.model, env=ENV)
    assert proc.returncode == 0, proc.stderr
    check_plain(proc)
    (line,) = proc.stdout.splitlines()
    assert line.startswith(f"upgraded in place to v2: {place.v1} (arch block at ")
    assert proc.stderr.splitlines() == [WARNING]


def test_errors_are_one_whole_line_on_stderr(place: Place) -> None:
    missing = place.long / "missing.smoe"
    proc = run("verify", missing, env=ENV)
    assert proc.returncode == 2
    check_plain(proc)
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: {missing}: ")


def on_terminal(args: list[str], env: dict) -> str:
    """Run with stdout on a pseudo-terminal; what the terminal received, newlines as \\n."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        args, stdout=follower, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 1 << 16)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait() == 1
    return b"".join(chunks).decode().replace("\r\n", "\n")


def colours(text: str) -> set[str]:
    """The SGR colour parameters (30-38, 90-97) in ``text``."""
    params = {p for m in COLOUR.finditer(text) for p in m.group(1).split(";")}
    return {p for p in params if p.isdigit() and (30 <= int(p) <= 38 or 90 <= int(p) <= 97)}


def test_terminal_keeps_rich_rendering_and_no_color(place: Place) -> None:
    dump = [*SMOE, "dump", str(place.corrupt)]
    env = {**ENV, "COLUMNS": "60"}
    shown = on_terminal(dump, env)
    plain = COLOUR.sub("", shown)
    assert str(place.corrupt) not in plain  # wrapped at the terminal's 60 columns
    assert max(len(line) for line in plain.splitlines()) <= 60
    assert colours(shown)  # the error finding in red
    no_color = on_terminal(dump, {**env, "NO_COLOR": "1"})
    assert not colours(no_color) and COLOUR.sub("", no_color) == plain
