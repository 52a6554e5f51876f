"""The CLI's exit-code policy: how a failure is worded, which exit status it gets, and how it
is printed (one ``error:`` line on stderr, and with ``--json`` the error document).

The statuses come from the one table of both languages, codegen/exit_codes.yaml (generated
into :mod:`smoe_gen.exit_codes` here and generated/cpp/exit_codes.hpp for ``smoe-stream``);
:data:`EXIT_KIND` maps each error kind of :mod:`smoe.errors` to its entry.
:func:`describe` is the one place that maps a failure to its message and exit status (the
policy is spelled out in :mod:`smoe.cli`'s docstring); :func:`run` runs a parsed command
under it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading

from rich.text import Text

from smoe.cli.console import fold_lines, make_console, one_line, print_json, shown, silence_stdout
from smoe.errors import (
    FormatError,
    RefusedInput,
    SmoeError,
    Terminated,
    UnreadableInput,
    UsageError,
    WriteFailed,
    os_message,
)
from smoe.format import findings
from smoe_gen import exit_codes
from smoe_gen.exit_codes import ExitCode

__all__ = [
    "EXIT_KIND",
    "EXIT_STATUS",
    "describe",
    "exit_kind",
    "exit_status",
    "fail",
    "print_error_json",
    "run",
]

EXIT_KIND: dict[type[BaseException], ExitCode] = {
    UnreadableInput: exit_codes.UNREADABLE,  # fileio.NotRegular; a failed open or stat of an input
    UsageError: exit_codes.USAGE,
    RefusedInput: exit_codes.REFUSED,
    FormatError: exit_codes.INVALID,
    WriteFailed: exit_codes.WRITE_FAILED,
    SmoeError: exit_codes.FAILED,  # WriterStateError, a read that fails or shrinks, the base
    OSError: exit_codes.FAILED,  # raised where no layer gave it a kind: error: FILE: STRERROR
}
"""The kind of outcome (an entry of the shared table) of each kind of failure, found along
the exception's MRO (the layers raise the kind that says what happened, so nothing here
guesses from an errno or a file name); any other exception is ``internal``."""

EXIT_STATUS: dict[type[BaseException], int] = {e: kind.status for e, kind in EXIT_KIND.items()}
"""The exit status of each kind of failure (:data:`EXIT_KIND`'s statuses)."""

_RESUMABLE = "sculpt"  # the command whose interrupted run --resume continues


# ---- the message and exit status of a failure ----------------------------------------------
def exit_kind(e: BaseException) -> ExitCode:
    """The kind of outcome of a failure: the :data:`EXIT_KIND` entry of the nearest class in
    its MRO, else ``internal``.

    >>> from smoe.plumbing.fileio import NotRegular
    >>> exit_kind(NotRegular("p: not a regular file (a FIFO)")).name, exit_kind(KeyError()).name
    ('unreadable', 'internal')
    """
    for cls in type(e).__mro__:
        if cls in EXIT_KIND:
            return EXIT_KIND[cls]
    return exit_codes.INTERNAL


def exit_status(e: BaseException) -> int:
    """The exit status of a failure (that of its :func:`exit_kind`).

    >>> from smoe.plumbing.fileio import NotRegular
    >>> exit_status(NotRegular("p: not a regular file (a FIFO)")), exit_status(KeyError())
    (2, 1)
    """
    return exit_kind(e).status


def describe(e: BaseException) -> tuple[str, int]:
    """The one-line message (without ``error:``) and exit status for a failure.

    >>> describe(SmoeError("v.smoe: not a .smoe vault"))
    ('v.smoe: not a .smoe vault', 1)
    >>> describe(UnreadableInput.from_os(FileNotFoundError(2, "No such file or directory", "v")))
    ('v: No such file or directory', 2)
    >>> describe(OSError(30, "Read-only file system", "v.smoe"))
    ('v.smoe: Read-only file system', 1)
    >>> describe(RuntimeError("boom\\n  again"))[0]
    'internal error: RuntimeError: boom again (run with --debug for the traceback)'
    """
    if isinstance(e, SmoeError):
        message = str(e)
    elif isinstance(e, OSError):
        message = _os_message(e)
    else:
        detail = fold_lines(str(e))
        message = (
            f"internal error: {type(e).__name__}{': ' + detail if detail else ''} "
            "(run with --debug for the traceback)"
        )
    return message, exit_status(e)


def _os_message(e: OSError) -> str:
    """``FILE: STRERROR``; without a file, where it happened is only in the traceback."""
    if e.filename is None:
        why = e.strerror or str(e) or type(e).__name__
        return f"I/O error: {why} (run with --debug for the traceback)"
    return os_message(e)


# ---- printing it ---------------------------------------------------------------------------
def fail(args: argparse.Namespace, message: str, code: int) -> int:
    """Print the one stderr line (and with --json the error document); return ``code``.

    >>> import contextlib, io
    >>> with contextlib.redirect_stderr(io.StringIO()) as err:
    ...     fail(argparse.Namespace(), "--jobs: must be at least 1", 2)
    2
    >>> err.getvalue()
    'error: --jobs: must be at least 1\\n'
    """
    line = Text.assemble(("error:", "bold red"), " " + shown(message))
    with contextlib.suppress(OSError):
        make_console(stderr=True).print(line, soft_wrap=True)
    if getattr(args, "json", False):
        print_error_json(message, code)
    return code


def print_error_json(message: str, code: int) -> None:
    """The --json document of a failure (silently dropped if stdout cannot take it).

    >>> print_error_json("v.smoe:\\n  bad magic", 1)
    {
      "schema": "smoe-findings/1",
      "ok": false,
      "error": {
        "message": "v.smoe: bad magic",
        "exit_code": 1
      }
    }
    """
    doc = findings.error_document(one_line(message), code)
    try:
        print_json(doc)
        sys.stdout.flush()
    except (OSError, SmoeError):  # SmoeError: console.Stdout's disk full
        silence_stdout()


# ---- running a command under the policy ----------------------------------------------------
def _debug(args: argparse.Namespace) -> bool:
    env = os.environ.get("SMOE_DEBUG", "")
    return bool(getattr(args, "debug", False)) or env not in ("", "0")


def run(args: argparse.Namespace) -> int:
    """Run the parsed command ``args.func(args)``; return its exit status, or that of its
    failure once it is printed (``--debug`` or ``SMOE_DEBUG=1``: re-raised after printing
    the --json document). Ctrl-C is 130, a closed stdout 141 (quietly).

    >>> def broken(args):
    ...     raise SmoeError("v.smoe: not a .smoe vault")
    >>> import contextlib, io
    >>> with contextlib.redirect_stderr(io.StringIO()) as err:
    ...     run(argparse.Namespace(func=broken))
    1
    >>> err.getvalue()
    'error: v.smoe: not a .smoe vault\\n'
    """
    try:
        code = args.func(args)
        sys.stdout.flush()  # a full disk under a redirected stdout fails here, not at exit
        return code
    except Terminated as e:
        return _interrupted(args, f"terminated ({e})", exit_codes.TERMINATED.status)
    except KeyboardInterrupt:
        return _interrupted(args)
    except BrokenPipeError:  # e.g. `smoe-dump --json VAULT | head`: stop quietly
        silence_stdout()
        return exit_codes.STDOUT_CLOSED.status
    except Exception as e:
        message, code = describe(e)
        if not _debug(args):
            return fail(args, message, code)
        if getattr(args, "json", False):
            print_error_json(message, code)
        raise


def _interrupted(
    args: argparse.Namespace, what: str = "interrupted", code: int | None = None
) -> int:
    """Ctrl-C (or ``what``, a SIGTERM: ``code`` 143): one line on stderr (how to continue,
    for a resumable command)."""
    hint = (
        "; run the same command with --resume to continue"
        if getattr(args, "command", None) == _RESUMABLE
        else ""
    )
    make_console(stderr=True).print(f"{what}{hint}", highlight=False)
    code = exit_codes.INTERRUPTED.status if code is None else code
    if getattr(args, "json", False):
        print_error_json(f"{what}{hint}", code)
    return code


def terminate_on_signals() -> None:
    """From now on SIGTERM and SIGHUP raise :class:`~smoe.errors.Terminated` in the main
    thread, so that clean-up runs as for Ctrl-C (the CLI installs this; a library caller
    keeps its own handlers). Only from the main thread, where Python delivers signals.

    >>> import signal, threading
    >>> before = signal.getsignal(signal.SIGTERM)
    >>> terminate_on_signals()
    >>> signal.getsignal(signal.SIGTERM) is _raise_terminated
    True
    >>> _ = signal.signal(signal.SIGTERM, before)
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_terminated)


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signal.Signals(signum).name)
