"""Command-line entry points: ``smoe <command>`` and ``smoe-dump``.

Every failure is one line on stderr, ``error: MESSAGE``, never a traceback (``--debug`` or
``SMOE_DEBUG=1`` re-raises to show it); a multi-line message is folded onto one line, an
undecodable byte of a path is shown as ``\\xNN``. A refused command line is one line too.

Exit status:

* 0: done (verify/dump: no error finding).
* 1: a :class:`~smoe.errors.SmoeError` of any kind but the two below (a refused input, a
  broken format rule, a failed write; verify/dump: the vault breaks a rule); an ``OSError``
  no layer gave a kind (``error: FILE: STRERROR``); stdout that cannot be written
  (``error: standard output: cannot write: ...``); any other exception (``UnicodeError``,
  ``ValueError``, ``MemoryError``, ...): ``error: internal error: TYPE: message (run with
  --debug for the traceback)``.
* 2: an :class:`~smoe.errors.UnreadableInput`: an input cannot be read at all (a FIFO,
  folder or device, a file that cannot be opened or stat'ed, a vault too short for a
  header); a :class:`~smoe.errors.UsageError`: a refused command line (``--jobs 0``).
  The kinds are raised where the problem is found; :data:`smoe.cli.failures.EXIT_STATUS`
  maps them to these numbers.
* 130: interrupted (Ctrl-C); 143: terminated (SIGTERM or SIGHUP), cleaned up as for Ctrl-C;
  141: stdout was closed (``| head``), quietly: nothing on stderr, also when the pipe
  closes at the last flush or under ``--help`` (stdout then points at /dev/null, so that
  the interpreter's own flush at exit has nothing to fail on); a command that failed keeps
  its status. A closed stderr drops its lines and changes no status.

With ``--json`` stdout holds exactly one RFC 8259 document, on success (the command's own
shape; verify and dump: docs/JSON.md) and on failure: ``{"schema": "smoe-findings/1", "ok":
false, "error": {"message": MESSAGE, "exit_code": N}}`` (the stderr line is printed too).
:func:`to_json` serialises every document: non-finite floats become ``null``, undecodable
bytes in strings U+FFFD.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from smoe.cli.console import Stdout, silence_stdout, to_json
from smoe.cli.failures import describe, fail, run, terminate_on_signals
from smoe.cli.notices import show_kernel_notices
from smoe.cli.parser import build_dump_parser, build_parser
from smoe.errors import SmoeError, UsageError
from smoe_gen import exit_codes

__all__ = ["dump_main", "main", "to_json"]

_DESCRIPTION = __doc__.split("\n\n")[0]  # `smoe --help`: this docstring's first paragraph


def _main(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    for stream in (sys.stdout, sys.stderr):  # a path's undecodable bytes never crash output
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    stdout = sys.stdout
    sys.stdout = out = Stdout(stdout)
    terminate_on_signals()  # SIGTERM/SIGHUP clean up as Ctrl-C does, then exit 143
    show_kernel_notices()  # a first compile of the compiled kernels says so on stderr
    try:
        try:
            args = parser.parse_args(argv)
        except UsageError as e:
            words = argv[: argv.index("--")] if "--" in argv else argv
            return _flushed(out, fail(argparse.Namespace(json="--json" in words), str(e), 2))
        except SystemExit as e:  # --help, --version: printed (argparse drops a write error)
            if e.code not in (0, None):
                raise
            return _flushed(out, 0)
        return _flushed(out, run(args))
    finally:
        sys.stdout = stdout


def _flushed(out: Stdout, code: int) -> int:
    """``code``, once what stdout still buffers is written, so that the flush at interpreter
    exit has nothing left to fail on. Stdout closed (``| head``), now or before: it is pointed
    at /dev/null and a success becomes 141, quietly; a failure keeps its status (its line is
    on stderr), as it does when the flush fails otherwise (a full disk under a redirected
    stdout)."""
    try:
        out.flush()
    except BrokenPipeError:
        pass
    except (OSError, SmoeError) as e:  # console.Stdout already pointed stdout at /dev/null
        return fail(argparse.Namespace(), *describe(e)) if code == 0 else code
    if out.pipe_closed:
        silence_stdout()
        return exit_codes.STDOUT_CLOSED.status if code == 0 else code
    return code


def dump_main(argv: list[str] | None = None) -> int:
    """``smoe-dump VAULT [--experts] [--layer L] [--deep] [--json]``: the console script,
    same as ``smoe dump``; returns the exit status (``argv`` default: ``sys.argv[1:]``).

    >>> dump_main(["fixtures/q4_v1.smoe"])
    fixtures/q4_v1.smoe  147,456 bytes  v1  Q4  group 64  data_offset 0x4000  full vault, 8 experts
    ├── header (64 bytes at 0)
    ...
    ├── arch block: none (version 1)
    ├── expert table (8 entries, 2 layers)
    ...
    └── findings (0)
    0
    """
    return _main(build_dump_parser(), argv)


def main(argv: list[str] | None = None) -> int:
    """``smoe COMMAND ...``: the console script; returns the exit status (see the module
    docstring; ``argv`` default: ``sys.argv[1:]``).

    >>> main(["verify", "fixtures/q4_v1.smoe"])
    fixtures/q4_v1.smoe: valid (0 errors, 0 warnings)
    0
    >>> import contextlib, io, json
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:
    ...     code = main(["verify", "fixtures/corrupt/bad_magic.smoe", "--json"])
    >>> code, json.loads(out.getvalue())["findings"][0]["code"]
    (1, 'header.magic')
    """
    return _main(build_parser(_DESCRIPTION), argv)
