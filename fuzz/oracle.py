"""What every input-fuzzing case checks: one verdict per call, within a time limit.

A call ends ``accepted`` (returned), ``refused`` (SmoeError), or in a failure: any other
exception, a RuntimeWarning (numpy's overflow/invalid warnings), no verdict within the
time limit, or file descriptors left open. ``cli_verdict`` runs the same input through
``python -m smoe`` and checks the user's view: exit 1 with exactly one line on stderr
for a refusal, exit 0 for an acceptance, never a traceback.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from smoe.errors import SmoeError

ROOT = Path(__file__).resolve().parent.parent
SMOE = [sys.executable, "-m", "smoe"]
CLI_TIMEOUT = 120.0


class CaseTimeout(BaseException):
    """The per-case time limit ran out (a BaseException: ``except Exception`` can't eat it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise CaseTimeout in the main thread after ``seconds`` (SIGALRM, so main thread only)."""

    def expire(signum: int, frame: object) -> None:
        raise CaseTimeout()

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class Outcome:
    """One call's verdict; ``value`` is what it returned when accepted."""

    status: str  # accepted | refused | exception | warning | timeout | fd_leak
    message: str = ""
    value: object = None
    then: str = ""  # for a warning or fd_leak: the verdict reached all the same

    @property
    def failed(self) -> bool:
        return self.status not in ("accepted", "refused")

    @property
    def verdict(self) -> str:
        """What the user must see: the verdict reached, or a refusal where none was."""
        return self.then or ("refused" if self.failed else self.status)

    def line(self) -> str:
        return f"{self.status}: {self.message}" if self.message else self.status


def _where(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {Path(f.filename).name}:{f.lineno} in {f.name})"


def _open_fds() -> int:
    """Open descriptors, not counting multiprocessing's shared-memory arenas (/dev/shm/pym-*),
    which the first shared value of a process creates and keeps for its lifetime."""
    if not os.path.isdir("/proc/self/fd"):
        return 0
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if not target.startswith("/dev/shm/pym-"):
            count += 1
    return count


def attempt(fn: Callable[[], object], seconds: float) -> Outcome:
    """Run ``fn`` once and classify how it ended (see the module docstring)."""
    gc.collect()  # garbage left by earlier work holding a descriptor must not hide a leak
    fds = _open_fds()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with time_limit(seconds):
                value = fn()
        except CaseTimeout:
            return Outcome("timeout", f"no verdict within {seconds:g} s")
        except SmoeError as e:
            out = Outcome("refused", str(e))
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            return Outcome("exception", f"{type(e).__name__}: {str(e)[:300]}{_where(e)}")
        else:
            out = Outcome("accepted", value=value)
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    if runtime:
        w = runtime[0]
        return Outcome(
            "warning",
            f"{w.category.__name__}: {w.message} "
            f"(at {Path(w.filename).name}:{w.lineno}), then "
            f"{out.line()[:200]}",
            then=out.status,
        )
    if _open_fds() > fds:
        gc.collect()
        leaked = _open_fds() - fds
        if leaked > 0:
            return Outcome(
                "fd_leak",
                f"{leaked} file descriptor(s) left open after {out.status}: {out.message[:200]}",
                then=out.status,
            )
    return out


def cli_verdict(args: list[str], expected: Outcome) -> str | None:
    """Run ``smoe ARGS``; a failure text if the user's view disagrees with the verdict the
    API reached (``expected.verdict``: a refusal where the API failed)."""
    try:
        proc = subprocess.run([*SMOE, *args], capture_output=True, cwd=ROOT, timeout=CLI_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"CLI: no verdict within {CLI_TIMEOUT:g} s"
    err = proc.stderr.decode("utf-8", "replace")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if "Traceback" in err:
        return f"CLI: a traceback on stderr: {lines[-1] if lines else ''}"
    if "error: internal error" in err:
        return f"CLI: an internal error, not a refusal: {err.strip()[:300]!r}"
    if expected.verdict == "refused":
        if proc.returncode != 1 or len(lines) != 1:
            return (
                f"CLI: refusal should be exit 1 and one stderr line, got exit "
                f"{proc.returncode} and {len(lines)} lines: {err.strip()[:300]!r}"
            )
    elif expected.verdict == "accepted" and proc.returncode != 0:
        return f"CLI: exit {proc.returncode} where the API accepted: {err.strip()[:300]!r}"
    return None


@dataclass
class CaseReport:
    """One case: what was mutated, our verdict, failures, and counters for the summary."""

    case: int
    base: str
    mutator: str
    what: str
    verdict: str
    failures: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    detail: dict[str, object] = field(default_factory=dict)
