"""``smoe completion SHELL`` (issue 33): scripts generated from the parser, that bash loads
and that complete commands, options and choices; zsh and fish where installed, else their
text."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from smoe.cli.completion import commands_of
from smoe.cli.parser import build_parser

from helpers import one_line, run

BASH = shutil.which("bash")


def script(shell: str) -> str:
    proc = run("completion", shell)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout


def bash_complete(*words: str) -> list[str]:
    """What the bash script offers for the command line ``words`` (the last one being
    completed), run in a fresh ``bash -c``."""
    assert BASH is not None
    line = " ".join(f"'{w}'" for w in words)
    code = (
        f"source /dev/stdin; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
        '_smoe; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    proc = subprocess.run(
        [BASH, "--norc", "--noprofile", "-c", code],
        input=script("bash"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return [w for w in proc.stdout.splitlines() if w]


def test_bash_registers_the_completion() -> None:
    assert BASH is not None  # the tests run where bash is (make, the harness)
    proc = subprocess.run(
        [BASH, "--norc", "--noprofile", "-c", "source /dev/stdin; complete -p smoe"],
        input=script("bash"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()  # bash lists the -o options in its own order
    assert words[0] == "complete" and words[-3:] == ["-F", "_smoe", "smoe"]
    assert sorted(words[1:-3]) == ["-o", "-o", "bashdefault", "default"]


def test_bash_completes_commands_options_and_choices() -> None:
    commands = [c.name for c in commands_of(build_parser())][1:]
    assert bash_complete("smoe", "") == commands
    assert "completion" in commands and "sculpt" in commands
    assert bash_complete("smoe", "sc") == ["sculpt"]
    assert bash_complete("smoe", "sculpt", "m", "o", "--dry") == ["--dry-run"]
    assert bash_complete("smoe", "sculpt", "m", "o", "--bits", "") == ["2", "4"]
    assert bash_complete("smoe", "--debug", "verify", "--de") == ["--deep", "--debug"]
    assert bash_complete("smoe", "completion", "") == ["bash", "zsh", "fish"]
    assert bash_complete("smoe", "sculpt", "--imatrix", "") == []  # files: the shell's own


def test_every_command_and_option_is_in_each_script() -> None:
    cmds = commands_of(build_parser())
    for shell in ("bash", "zsh", "fish"):
        text = script(shell)
        for c in cmds[1:]:
            assert c.name in text, (shell, c.name)
            for o in c.options:
                for flag in o.long:
                    assert (f"-l {flag}" if shell == "fish" else f"--{flag}") in text, (shell, flag)


def test_zsh_script_loads_the_bash_function_through_bashcompinit() -> None:
    text = script("zsh")
    assert text.startswith("#compdef smoe\n")
    assert "autoload -U +X bashcompinit && bashcompinit" in text
    assert text.endswith("complete -o default -o bashdefault -F _smoe smoe\n")
    zsh = shutil.which("zsh")
    if zsh is not None:
        proc = subprocess.run(
            [zsh, "-f", "-c", "autoload -U compinit && compinit -u; source /dev/stdin; "
             "print -r -- ${_comps[smoe]}"],
            input=text, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr


def test_fish_script_lists_commands_and_choices() -> None:
    text = script("fish")
    assert "complete -c smoe -n __fish_use_subcommand -f -a sculpt -d " in text
    assert "-n '__fish_seen_subcommand_from sculpt' -l bits -x -a '2 4'" in text
    assert "-n '__fish_seen_subcommand_from completion' -f -a 'bash zsh fish'" in text
    fish = shutil.which("fish")
    if fish is not None:
        proc = subprocess.run(
            [fish, "--no-config", "-c", "source; complete -C 'smoe sculpt m o --bi'"],
            input=text, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0 and "--bits" in proc.stdout, proc.stderr


def test_an_unknown_shell_is_refused_in_one_line() -> None:
    proc = run("completion", "tcsh")
    assert proc.returncode == 2
    assert one_line(proc).startswith("error: argument shell: invalid choice: 'tcsh'")


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_script_is_the_same_each_time(shell: str) -> None:
    assert script(shell) == script(shell)
