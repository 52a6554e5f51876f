"""Notices the layers below hand the CLI for the user's eyes, neither results nor warnings:
the compiled kernels' first compile (:mod:`smoe.quant.compiling`), printed on stderr as
plain lines (above a sculpt's progress bar on a terminal: rich routes stderr around it).
``--json`` output is untouched: it is on stdout."""

from __future__ import annotations

import logging
import sys

__all__ = ["KERNEL_LOGGER", "show_kernel_notices"]

KERNEL_LOGGER = "smoe.quant.compiling"
""":data:`smoe.quant.compiling.LOGGER`, named here so that a command that never quantises
does not import the quant layer (and numpy) to listen to it."""


class _Stderr(logging.Handler):
    """Each record's message as one line on the ``sys.stderr`` of the moment (a closed
    stderr drops its lines)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(record.getMessage() + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def show_kernel_notices() -> None:
    """From now on the kernels' compile notices go to stderr (idempotent).

    >>> import contextlib, io, logging
    >>> show_kernel_notices(); show_kernel_notices()
    >>> with contextlib.redirect_stderr(io.StringIO()) as err:
    ...     logging.getLogger(KERNEL_LOGGER).info("compiling kernels for this machine, once")
    >>> err.getvalue()
    'compiling kernels for this machine, once\\n'
    """
    log = logging.getLogger(KERNEL_LOGGER)
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        log.addHandler(_Stderr())
    log.setLevel(logging.INFO)
