"""What the CLI writes: terminal-safe text, the one JSON serialiser, and the consoles.

On a terminal the output is rich's (colour, boxes, the terminal's width); anywhere else (a
pipe, a file) it is plain text that is never wrapped or cut and has no spaces at line
ends, so that every line greps as a whole. A path's undecodable byte never crashes or
corrupts the output: the terminal shows it as ``\\xNN``, JSON and HTML as U+FFFD.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import IO, NoReturn, TextIO, cast

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from smoe.errors import WriteFailed

__all__ = [
    "Stdout",
    "TrimmedLines",
    "fold_lines",
    "make_console",
    "make_table",
    "one_line",
    "print_json",
    "print_notes",
    "print_warnings",
    "shown",
    "silence",
    "silence_stdout",
    "to_json",
    "valid_text",
]

_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1 (U+009B is CSI, U+009D OSC)
_NEWLINES = re.compile(r"\s*[\r\n]+\s*")


# ---- text ----------------------------------------------------------------------------------
def valid_text(s: str) -> str:
    """``s`` as valid Unicode: every lone surrogate (an undecodable byte of a path) -> U+FFFD.

    >>> valid_text("caf\\udce9.smoe"), valid_text("plain")
    ('caf\\ufffd.smoe', 'plain')
    """
    return s if s.isascii() else _SURROGATE.sub("\ufffd", s)


def fold_lines(message: str) -> str:
    """``message`` on one line: each line break (and the blanks around it) -> one space.

    >>> fold_lines("boom\\n  second line\\n")
    'boom second line'
    """
    return _NEWLINES.sub(" ", message).strip()


def one_line(message: str) -> str:
    """A message folded onto one line (for JSON: the terminal form escapes more).

    >>> one_line("v\\udcff.smoe:\\n  bad magic")
    'v\\ufffd.smoe: bad magic'
    """
    return valid_text(fold_lines(message))


def shown(s: object) -> str:
    """A path or message for the terminal: one line, an undecodable byte as ``\\xNN``, other
    control characters (C0, DEL, C1) as ``\\xNN`` of their code point (no terminal escape
    sequence gets through, not even an 8-bit one).

    The rule, which ``smoe-stream`` (harness/text.cpp) follows byte for byte: a run of
    whitespace (``str.isspace``) holding a CR or LF becomes one space and the ends are
    stripped (:func:`fold_lines`); then each byte not part of well-formed UTF-8 is ``\\xNN``,
    and so is each of U+0000-U+001F, U+007F-U+009F; every other character passes.

    >>> from pathlib import Path
    >>> print(shown(Path("v\\udcff.smoe")), shown("a\\x1b[31m\\nb"), shown("c\\x9b2J\\td"))
    v\\xff.smoe a\\x1b[31m b c\\x9b2J\\x09d
    """
    text = fold_lines(os.fsdecode(s) if isinstance(s, os.PathLike) else str(s))
    text = _SURROGATE.sub(lambda m: _escape_surrogate(m.group()), text)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _escape_surrogate(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "\ufffd"


# ---- JSON ----------------------------------------------------------------------------------
def _jsonable(obj: object) -> object:
    """``obj`` as plain JSON data: non-finite floats -> None, strings valid UTF-8 (lone
    surrogates -> U+FFFD), numpy scalars and arrays -> Python values, paths -> text, tuples ->
    lists, anything else -> its ``str``."""
    if obj is None or isinstance(obj, bool):
        return obj
    if isinstance(obj, str):
        return valid_text(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {_json_key(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, os.PathLike):
        return valid_text(os.fsdecode(obj))
    return valid_text(str(obj))


def _json_key(k: object) -> str:
    return valid_text(k) if isinstance(k, str) else valid_text(to_json(k, indent=None))


def to_json(obj: object, indent: int | None = 2, compact: bool = False) -> str:
    """One RFC 8259 document (ASCII, no NaN or Infinity): the only serialiser of the CLI
    (``compact``: on one line without blanks, as ``jq -c`` prints it).

    >>> to_json({"snr": float("nan"), "ids": (1, 2), 3: "x"}, indent=None)
    '{"snr": null, "ids": [1, 2], "3": "x"}'
    >>> to_json({"ids": (1, 2)}, compact=True)
    '{"ids":[1,2]}'
    """
    if compact:
        return json.dumps(_jsonable(obj), separators=(",", ":"), allow_nan=False)
    return json.dumps(_jsonable(obj), indent=indent, allow_nan=False)


def print_json(obj: object) -> None:
    """``obj`` as one :func:`to_json` document on stdout.

    >>> print_json({"ok": True})
    {
      "ok": true
    }
    """
    print(to_json(obj))


# ---- stdout --------------------------------------------------------------------------------
class Stdout:
    """``sys.stdout`` while a command runs: a failed write (disk full, I/O error) is one
    WriteFailed naming standard output, and stdout then goes to /dev/null so that the flush
    at exit cannot fail again. A closed pipe still raises BrokenPipeError, and ``pipe_closed``
    remembers it (also when the caller swallowed it, as argparse's ``--help`` does).

    >>> import io
    >>> out = Stdout(io.StringIO())
    >>> out.write("text"), out.getvalue()
    (4, 'text')
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.pipe_closed = False
        """A write or flush met a closed pipe."""
        raw = getattr(stream, "buffer", None)
        # unbuffered (python -u, PYTHONUNBUFFERED): the text layer writes straight to the file
        # and drops what a short write leaves, as when the pipe closes during it
        self._raw = raw if isinstance(raw, io.RawIOBase) else None

    def write(self, text: str) -> int:
        """Write ``text`` to the stream (a failure other than a closed pipe: WriteFailed).

        >>> import io
        >>> Stdout(io.StringIO()).write("abc")
        3
        """
        try:
            if self._raw is None:
                return self._stream.write(text)
            self._write_all(self._raw, text)
            return len(text)
        except BrokenPipeError:
            self.pipe_closed = True
            raise
        except OSError as e:
            self._failed(e)

    def _write_all(self, raw: io.RawIOBase, text: str) -> None:
        """``text`` to an unbuffered stream's file, each byte of it: after a short write the
        rest is written, so that a pipe closed meanwhile is the next write's BrokenPipeError."""
        self._stream.flush()
        errors = self._stream.errors or "strict"
        data = memoryview(text.replace("\n", os.linesep).encode(self._stream.encoding, errors))
        while data:
            n = raw.write(data)
            if not n:  # None: a non-blocking stdout that is full
                raise BlockingIOError(errno.EAGAIN, "standard output would block")
            data = data[n:]

    def flush(self) -> None:
        """Flush the stream (a failure other than a closed pipe: WriteFailed).

        >>> import io
        >>> Stdout(io.StringIO()).flush()
        """
        try:
            self._stream.flush()
        except BrokenPipeError:
            self.pipe_closed = True
            raise
        except OSError as e:
            self._failed(e)

    def _failed(self, e: OSError) -> NoReturn:
        silence_stdout()
        raise WriteFailed(f"standard output: cannot write: {e.strerror or e}") from None

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def silence_stdout() -> None:
    """Point stdout at /dev/null: nothing more can reach it, and the exit flush succeeds
    (a stdout without a file descriptor is left as it is).

    >>> silence_stdout()  # doctest's stdout has no file descriptor: nothing happens
    """
    silence(sys.stdout)


def silence(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor at /dev/null (a stream without one is left as it
    is): what is still in its buffer, and whatever follows, is dropped without an error.

    >>> import io
    >>> silence(io.StringIO())  # no file descriptor: nothing happens
    """
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(fd, stream.fileno())
        finally:
            os.close(fd)
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError
        pass


# ---- consoles: rich on a terminal, plain lines in a pipe ------------------------------------
_PIPE_WIDTH = 1 << 20  # the width of a pipe or file: wide enough that nothing wraps or is cut


class TrimmedLines:
    """A text stream that drops the spaces at the end of every line (rich pads table cells
    to their column's width). Spaces are held back until text follows them on the line.

    >>> import io
    >>> out = io.StringIO()
    >>> lines = TrimmedLines(out)
    >>> lines.write("a   \\nb  "), lines.write(" c  "), out.getvalue()
    (8, 4, 'a\\nb   c')
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._spaces = ""

    def write(self, text: str) -> int:
        """Write ``text`` without the spaces that end its lines; returns ``len(text)``.

        >>> import io
        >>> TrimmedLines(io.StringIO()).write("x  \\n")
        4
        """
        *ended, last = text.split("\n")
        out = [(self._spaces + line).rstrip(" ") + "\n" for line in ended]
        if ended:
            self._spaces = ""
        body = self._spaces + last
        kept = body.rstrip(" ")
        self._spaces = body[len(kept) :]
        self._stream.write("".join(out) + kept)
        return len(text)

    def flush(self) -> None:
        """Flush the stream (spaces held back stay held back).

        >>> import io
        >>> TrimmedLines(io.StringIO()).flush()
        """
        self._stream.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class _Console(Console):
    """rich's Console, but a closed pipe is not rich's ``SystemExit(1)`` (after pointing
    stdout, whatever the stream, at /dev/null): on stdout it is a BrokenPipeError, which
    :func:`smoe.cli.failures.run` ends quietly with exit status 141; on stderr the console
    goes quiet (a warning or error line that nobody can read is dropped, the outcome and
    its exit status stand)."""

    def __init__(self, *args: object, on_stderr: bool = False, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._on_stderr = on_stderr

    def on_broken_pipe(self) -> None:
        """What rich calls when a write of this console meets a closed pipe.

        >>> c = make_console()
        >>> try:
        ...     c.on_broken_pipe()
        ... except BrokenPipeError as e:
        ...     print(e.strerror, c.quiet)
        standard output was closed True
        """
        self.quiet = True  # nothing more is rendered to it
        if self._on_stderr:
            silence(sys.stderr)  # what is left in its buffer flushes to /dev/null at exit
            return
        raise BrokenPipeError(errno.EPIPE, "standard output was closed")


def make_console(stderr: bool = False, highlight: bool = False) -> Console:
    """The Console of stdout (or stderr). On a terminal: rich's rendering at the terminal's
    width (``COLUMNS``), in colour unless ``NO_COLOR`` is set. Anywhere else (a pipe, a file):
    plain text, no colour, never wrapped or cut whatever ``COLUMNS`` says, and no spaces at
    line ends, so that every line greps as a whole (a long path stays on one line). A closed
    pipe: see :class:`_Console` (stdout: BrokenPipeError; stderr: quiet from then on).

    >>> make_console().print("[bold]plain[/] in a pipe   ")
    plain in a pipe
    """
    stream = sys.stderr if stderr else sys.stdout
    if _is_terminal(stream):
        return _Console(stderr=stderr, highlight=highlight, on_stderr=stderr)
    return _Console(
        on_stderr=stderr,
        # rich only writes, flushes and reads attributes, which TrimmedLines forwards
        file=cast(IO[str], TrimmedLines(stream)),
        width=_PIPE_WIDTH,
        soft_wrap=True,
        highlight=False,
        force_terminal=False,
        no_color=True,
    )


def make_table(console: Console, title: str, show_header: bool = True) -> Table:
    """A table for ``console``: boxed on a terminal, plain aligned columns (no borders, no
    indent) in a pipe, where a box around an unbounded column would pad every line.

    >>> c = make_console()
    >>> t = make_table(c, "sizes")
    >>> t.add_column("what"); t.add_column("bytes", justify="right")
    >>> t.add_row("header", "64"); t.add_row("arch block", "1024")
    >>> c.print(t)
    sizes
    what       bytes
    header        64
    arch block  1024
    """
    if console.is_terminal:
        return Table(title=title, title_justify="left", show_header=show_header)
    return Table(
        title=title, title_justify="left", show_header=show_header, box=None, pad_edge=False
    )


def print_warnings(warnings: Sequence[str]) -> None:
    """Each warning as one line on stderr (``warning: ...``): stdout holds only the
    command's output.

    >>> import contextlib, io
    >>> with contextlib.redirect_stderr(io.StringIO()) as err:
    ...     print_warnings(["m/config.json:\\nno rope_theta"])
    >>> err.getvalue()
    'warning: m/config.json: no rope_theta\\n'
    """
    err = make_console(stderr=True)
    for w in warnings:
        err.print(f"[yellow]warning:[/] {escape(shown(w))}", soft_wrap=True)


def print_notes(notes: Sequence[str]) -> None:
    """Each note as one line on stderr (``note: ...``).

    >>> import contextlib, io
    >>> with contextlib.redirect_stderr(io.StringIO()) as err:
    ...     print_notes(["no scout: the embeddings are missing"])
    >>> err.getvalue()
    'note: no scout: the embeddings are missing\\n'
    """
    err = make_console(stderr=True)
    for n in notes:
        err.print(f"[cyan]note:[/] {escape(shown(n))}", soft_wrap=True)
