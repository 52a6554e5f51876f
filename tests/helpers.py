"""How every test runs a tool and checks a refusal: one :func:`run`, one :func:`refused`.

A command runs to its end in a plain environment built from this process's at the time of
the call (no terminal settings it could inherit, no ``SMOE_DEBUG``; ``NO_COLOR``, 200
columns, ``TERM=dumb``), with stdin at end of file and a generous timeout that only a hang
reaches: what the tests see never depends on the terminal, the checkout's path or the
machine's speed.

>>> proc = run("spec", "--json")
>>> proc.returncode, proc.stdout.startswith("{")
(0, True)
>>> refused(run("verify", "nothing-here.smoe"), 2)
'error: nothing-here.smoe: cannot open: No such file or directory'
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from smoe.errors import SmoeError

from fixtures_data import ROOT

__all__ = [
    "HANG_GUARD",
    "SMOE",
    "SMOE_DUMP",
    "SMOE_STREAM",
    "bytes_read",
    "one_line",
    "plain_env",
    "python",
    "refused",
    "run",
    "snapshot",
    "strict_json",
]

SMOE = [sys.executable, "-m", "smoe"]  # the CLI of this checkout's package, not one on PATH
SMOE_DUMP = [
    sys.executable,
    "-c",
    "import sys; from smoe.cli import dump_main; sys.exit(dump_main(sys.argv[1:]))",
]
SMOE_STREAM = ROOT / "build" / "smoe-stream"  # the C++ harness (conftest's smoe_stream builds it)
HANG_GUARD = 900.0  # seconds; a guard against a hang, never a measure of speed

# what a terminal (or the user's shell) could leave in the environment and the output depend on
TERMINAL_ENV = (
    "FORCE_COLOR",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "NO_COLOR",
    "COLUMNS",
    "LINES",
    "TERM",
    "SMOE_DEBUG",
)
PLAIN = {"NO_COLOR": "1", "COLUMNS": "200", "TERM": "dumb"}

Arg = str | bytes | os.PathLike | int | float


def plain_env(**changes: str | None) -> dict[str, str]:
    """This process's environment as it is now, less the terminal's settings, plus
    :data:`PLAIN` and ``changes`` (a value of None removes the variable).

    >>> env = plain_env(COLUMNS="40", NO_COLOR=None)
    >>> env["COLUMNS"], env["TERM"], "NO_COLOR" in env
    ('40', 'dumb', False)
    """
    env = {k: v for k, v in os.environ.items() if k not in TERMINAL_ENV}
    env.update(PLAIN)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _arg(a: Arg) -> str | bytes:
    """A command-line word: bytes and paths as they are (a path of any bytes), else str()."""
    if isinstance(a, bytes):
        return a
    if isinstance(a, os.PathLike):
        return os.fspath(a)
    return str(a)


def run(
    *args: Arg,
    command: Sequence[Arg] = SMOE,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    input: str | bytes | None = None,
    stdout: int | IO[Any] = subprocess.PIPE,
    text: bool = True,
    raw_stdout: bool = False,
    timeout: float = HANG_GUARD,
) -> subprocess.CompletedProcess:
    """Run ``command ARGS`` (the smoe CLI unless told) to its end and return it.

    ``env``: the whole environment (default :func:`plain_env`); ``input``: stdin's content
    (else stdin is at end of file); ``text``: stdout and stderr decoded as UTF-8, else bytes;
    ``raw_stdout``: stdout kept as bytes (its strict UTF-8 is the test's to check), stderr
    decoded with surrogates for any byte that is not UTF-8.

    >>> run("--version").stdout.startswith("smoe ")
    True
    >>> run(command=[sys.executable, "-c", "print(input())"], input="hi").stdout
    'hi\\n'
    """
    decoded = text and not raw_stdout
    proc = subprocess.run(
        [*map(_arg, command), *map(_arg, args)],
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=plain_env() if env is None else env,
        cwd=cwd,
        timeout=timeout,
        encoding="utf-8" if decoded else None,
    )
    if raw_stdout:
        proc.stderr = proc.stderr.decode("utf-8", "surrogateescape")
    return proc


def python(code: str, *args: Arg, **options: Any) -> subprocess.CompletedProcess:
    """``python -c CODE ARGS`` with :func:`run`'s options (a script that patches the package
    before it calls the CLI).

    >>> python("import sys; print(sys.argv[1:])", "a", Path("b")).stdout
    "['a', 'b']\\n"
    """
    return run(*args, command=[sys.executable, "-c", code], **options)


def one_line(proc: subprocess.CompletedProcess) -> str:
    """A finished command's stderr, which must be exactly one line and no traceback,
    without its newline.

    >>> one_line(run("verify"))
    'error: the following arguments are required: vault (see smoe verify --help)'
    """
    err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode("utf-8")
    assert "Traceback" not in err, err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err[:-1]


Outcome = subprocess.CompletedProcess | Sequence[Arg] | Callable[[], object]


def refused(
    outcome: Outcome,
    code: int = 1,
    *,
    unchanged: Iterable[Path] = (),
    absent: Path | None = None,
) -> str:
    """The one line a refusal (or any clean failure) gives, for the test to compare word for
    word.

    ``outcome`` is a finished command, which must have exited ``code`` with one line on
    stderr (:func:`one_line`); or the words of a smoe command, run here; or a callable,
    called here, that raises :class:`SmoeError` (the line is its text; ``code`` is then not
    looked at) or returns a finished command. Every file under ``unchanged`` must be as it
    was before the run (so do not pass a finished one), and ``absent`` must not exist after
    it: "refused before anything is written".

    >>> refused(run("dump", "--layer", "x", "v.smoe"), 2)
    "error: argument --layer: invalid int value: 'x' (see smoe dump --help)"
    >>> refused(["upgrade", "v.smoe", "--out", "new.smoe"], 2, absent=Path("new.smoe"))
    'error: one of the arguments --config --model is required (see smoe upgrade --help)'
    >>> from smoe.vault.reader import Vault
    >>> refused(lambda: Vault.open("nothing-here.smoe"))
    'nothing-here.smoe: cannot open: No such file or directory'
    """
    unchanged = list(unchanged)
    if isinstance(outcome, (list, tuple)):
        outcome = functools.partial(run, *outcome)
    assert callable(outcome) or not unchanged, "unchanged needs the run, to look before it"
    before = snapshot(*unchanged)
    line = _refusal_line(outcome, code)
    if absent is not None:
        assert not absent.exists(), absent
    assert snapshot(*unchanged) == before
    return line


def _refusal_line(outcome: Outcome, code: int) -> str:
    if callable(outcome):
        try:
            outcome = outcome()
        except SmoeError as e:
            return str(e)
        assert isinstance(outcome, subprocess.CompletedProcess), f"not refused: {outcome!r}"
    assert outcome.returncode == code, (outcome.returncode, outcome.stderr)
    return one_line(outcome)


def bytes_read() -> int:
    """Bytes this process and the children it has waited for read so far (Linux counts a
    reaped child's reads into its parent's ``/proc/self/io``): the difference around
    :func:`run` is what a command read, a measure of work that does not depend on speed.

    >>> before = bytes_read()
    >>> _ = run(ROOT / "LICENSE", command=["cat"])
    >>> bytes_read() - before >= (ROOT / "LICENSE").stat().st_size
    True
    """
    with open("/proc/self/io") as f:
        fields = dict(line.split(":") for line in f)
    return int(fields["rchar"])


def snapshot(*roots: Path) -> dict[str, object]:
    """Every file under ``roots``: bytes, symlink target, or its kind (FIFOs are not read).

    >>> snapshot(ROOT / "LICENSE")[str(ROOT / "LICENSE")][:3]
    b'MIT'
    """
    out: dict[str, object] = {}
    for root in roots:
        for p in [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]:
            if p.is_symlink():
                out[str(p)] = ("link", os.readlink(p))
            elif p.is_dir():
                out[str(p)] = "dir"
            elif p.is_file():
                out[str(p)] = p.read_bytes()
            else:
                out[str(p)] = "special"
    return out


def strict_json(raw: bytes | str) -> Any:
    """RFC 8259 or fail: UTF-8, no NaN or Infinity, no lone surrogate in any string.

    >>> strict_json(b'{"a": [1, "x"]}')
    {'a': [1, 'x']}
    """

    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name} in JSON output")

    doc = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw, parse_constant=refuse)
    _walk_strings(doc)
    return doc


def _walk_strings(v: object) -> None:
    """Raises where a string of a JSON document holds a lone surrogate (``\\udcff``)."""
    if isinstance(v, str):
        v.encode("utf-8")
    elif isinstance(v, dict):
        for k, x in v.items():
            _walk_strings(k)
            _walk_strings(x)
    elif isinstance(v, list):
        for x in v:
            _walk_strings(x)
