"""Fuzz target 3: structure-aware mutations of the sidecars, read by the commands that read them.

    python -m fuzz.sidecar_target [--seed N] [--cases N] [--seconds S] [--only KIND]
    python -m fuzz.sidecar_target --seed 1 --case 17     # replay one case (fresh processes)

Sidecars (``fuzz.sidecar_mutators`` says how each is mutated and what each reader owes it):

* the manifest of a sculpted vault (qwen3_moe, v2; qwen3_moe_fused, v1, fused 3-D sources),
  read by ``verify --deep`` (every case) and one of ``report --deep``, ``export --hf`` and
  (v1) ``upgrade --out``;
* the journal of an interrupted ``sculpt`` (a synthetic checkpoint of 2 x 16 experts, stopped
  as by Ctrl-C once 12 are journaled), read by ``sculpt --resume``: whatever the journal
  says, the result is a fresh run's, byte for byte, and no expert is kept whose blob the
  partial does not hold;
* an importance matrix of qwen3_moe, GGUF and legacy ``.dat``, read by ``sculpt --imatrix``.

Every command runs in a child process under a cap on its address space (what it starts with
plus ``BUDGET``) and a time limit: forked from a server that has imported smoe once (a few
tens of milliseconds a command), or with ``fresh`` a new interpreter (``python -m smoe``'s
exact conditions; every replay). A command fails the case when it hangs, dies of a signal,
exits other than 0, 1 or 2, prints a traceback or an internal error, runs out of its memory
(or its resident set grows by more than ``GROWTH_MB``), refuses with other than exactly one
line on stderr, refuses what it owes a result, accepts what it must refuse, gives a result
that does not hold up (see ``judge``), leaves outputs under their final names after a
refusal or changes another input. A failing case is copied to
``build/fuzz/sidecar/s<seed>-c<case>/`` with a ``case.json`` naming the mutation, each
command's verdict, the command lines and how to replay it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from fuzz import sidecar_mutators as sm
from fuzz.oracle import CaseReport
from smoe.format.manifest import checksum

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = ROOT / "fixtures" / "checkpoints"
REPRO = ROOT / "build" / "fuzz"
TARGET = "sidecar"
BUDGET = 1 << 30  # bytes of address space a command may take beyond what it starts with
GROWTH_MB = 256  # the most a command's resident set may grow on these small inputs
TIMEOUT = 60.0  # seconds per command; the slowest here takes well under one
MAX_REPROS = 25
MAX_LISTED = 20
TAIL = 1 << 30  # the sparse NUL tail of a "tail" mutation
PRELOAD = (
    "smoe.cli",
    "smoe.cli.commands",
    "smoe.cli.report",
    "smoe.format.verify",
    "smoe.export.hf.checkpoint",
    "smoe.vault.upgrade",
    "smoe.sculpt",
    "smoe.sculpt.source.imatrix",
    "gguf",
)
KINDS = {"manifest": 5, "journal": 3, "imatrix": 4}  # how often each sidecar is mutated


# ---- running a command ----------------------------------------------------------------------
@dataclass
class Run:
    """How one command ended."""

    argv: list[str]
    rc: int  # negative: killed by that signal
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    peak_kb: int = 0  # the child's peak resident set
    base_kb: int = -1  # its resident set when it started (-1: not known)

    @property
    def grew_mb(self) -> float:
        """How much the resident set grew while the command ran (0 if not known)."""
        return max(0.0, (self.peak_kb - self.base_kb) / 1024) if self.base_kb >= 0 else 0.0

    @property
    def lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.strip()]

    def line(self) -> str:
        last = self.lines[-1] if self.lines else ""
        return f"exit {self.rc}" + (f": {last[:300]}" if last else "")


def _vm_bytes(key: str = "VmSize") -> int:
    """This process's address space (``VmRSS``: its resident set), 0 where /proc is missing
    (then no cap is set)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cap(budget: int) -> int:
    base = _vm_bytes()
    if base:
        resource.setrlimit(resource.RLIMIT_AS, (base + budget, base + budget))
    return base


# A fresh interpreter: smoe's CLI under the cap (imports first, then the cap, then the command).
CAPPED = (
    "import sys; from fuzz.sidecar_target import PRELOAD, _cap, _preload; _preload(); "
    "_cap(int(sys.argv[1])); from smoe.cli import main; sys.exit(main(sys.argv[2:]))"
)


def _preload() -> None:
    import importlib

    for name in PRELOAD:  # gguf is optional: without it sculpt --imatrix refuses, as it should
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _wait(pid: int, timeout: float) -> tuple[int, bool, int]:
    """(exit code, timed out, peak RSS in KiB) of child ``pid`` (a session leader): killed
    with its group after ``timeout`` seconds; its group is killed after it exits too."""
    deadline = time.monotonic() + timeout
    timed_out = False
    delay = 0.0005
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if not timed_out and time.monotonic() > deadline:
            timed_out = True
            _kill_group(pid)
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
    _kill_group(pid)  # anything the command left running
    return os.waitstatus_to_exitcode(status), timed_out, int(usage.ru_maxrss)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _fork_one(req: dict, main: Callable[[list[str]], int], devnull: int) -> dict:
    """Run ``smoe ARGV`` in a forked child (the server's half of ``Runner.run``)."""
    out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    base, resident = _vm_bytes(), _vm_bytes("VmRSS")
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 70
        try:
            os.setsid()
            os.dup2(devnull, 0)
            os.dup2(out, 1)
            os.dup2(err, 2)
            # Python's streams on the new descriptors (a caller's may be replaced objects)
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
            sys.stderr = io.TextIOWrapper(
                io.FileIO(2, "w", closefd=False),
                encoding="utf-8",
                errors="backslashreplace",
                line_buffering=True,
            )
            if base:
                cap = base + int(req["budget"])
                resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            os.chdir(req["cwd"])
            code = main(req["argv"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 70
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code & 0xFF if isinstance(code, int) else 1)
    os.close(out)
    os.close(err)
    rc, timed_out, peak = _wait(pid, float(req["timeout"]))
    return {
        "rc": rc,
        "timed_out": timed_out,
        "seconds": time.monotonic() - t0,
        "peak_kb": peak,
        "base_kb": resident // 1024,
    }


def _warm() -> None:
    """Load what every command would load again: a sculpt's compiled encoder, the resume's
    compiled SNR replay (numba, from its disk cache), by a sculpt and a resume of an edited
    journal. No thread outlives them (the forks are safe)."""
    from smoe.sculpt import SculptOptions, sculpt
    from smoe_testkit.synth import write_checkpoint

    with tempfile.TemporaryDirectory(prefix="smoe-fuzz-warm-") as tmp:
        sculpt(CHECKPOINTS / IM_MODEL, Path(tmp) / "a", SculptOptions(jobs=1))
        ck = write_checkpoint(Path(tmp) / "ck", layers=1, experts=2, seed=1)
        _interrupted(ck, Path(tmp) / "b", 1)
        journal = Path(tmp) / "b" / f".{ck.name}.smoe.journal"
        head, line = journal.read_bytes().splitlines(keepends=True)[:2]
        fields = line.split(b" ")
        fields[6] = b"99.5"  # an edited SNR: recomputed both ways (the compiled replay too)
        journal.write_bytes(head + b" ".join(fields))
        sculpt(ck, Path(tmp) / "b", SculptOptions(jobs=1, resume=True))


def serve() -> int:
    """The fork server: JSON requests on stdin, one JSON reply per line on (the original)
    stdout; the server's own fd 1 is /dev/null, so nothing else reaches the pipe."""
    _preload()
    _warm()
    from smoe.cli import main

    replies = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    for line in sys.stdin:
        reply = _fork_one(json.loads(line), main, devnull)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return 0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SMOE_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


class Runner:
    """Runs ``smoe ARGV`` in a child process under the address-space cap and a time limit:
    forked from a server that imported smoe once, or (``fresh``) a new interpreter."""

    def __init__(self, fresh: bool = False, budget: int = BUDGET) -> None:
        self.fresh = fresh
        self.budget = budget
        self.server: subprocess.Popen | None = None
        self.runs = 0
        self.peak_kb = 0
        self.grew_mb = 0.0

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.server is not None:
            assert self.server.stdin is not None and self.server.stdout is not None
            with contextlib.suppress(BrokenPipeError):
                self.server.stdin.close()
            self.server.stdout.close()
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
            self.server = None

    def start(self) -> subprocess.Popen:
        """Start the fork server (it imports smoe while the caller does other work)."""
        if self.server is None or self.server.poll() is not None:
            self.server = subprocess.Popen(
                [sys.executable, "-m", "fuzz.sidecar_target", "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=ROOT,
                env=_env(),
                text=True,
            )
        return self.server

    def _ask(self, req: dict) -> dict:
        for _attempt in range(2):
            server = self.start()
            assert server.stdin is not None and server.stdout is not None
            try:
                server.stdin.write(json.dumps(req) + "\n")
                server.stdin.flush()
                reply = server.stdout.readline()
            except BrokenPipeError:
                reply = ""
            if reply:
                return dict(json.loads(reply))
            self.close()
        raise RuntimeError("the fork server died twice in a row")

    def run(self, argv: list[str], logs: Path, timeout: float = TIMEOUT) -> Run:
        logs.mkdir(parents=True, exist_ok=True)
        out, err = logs / "stdout", logs / "stderr"
        if self.fresh:
            reply = self._fresh(argv, out, err, timeout)
        else:
            req = {
                "argv": argv,
                "cwd": str(ROOT),
                "stdout": str(out),
                "stderr": str(err),
                "timeout": timeout,
                "budget": self.budget,
            }
            reply = self._ask(req)
        self.runs += 1
        self.peak_kb = max(self.peak_kb, int(reply["peak_kb"]))
        done = Run(
            argv,
            int(reply["rc"]),
            out.read_bytes().decode("utf-8", "replace"),
            err.read_bytes().decode("utf-8", "replace"),
            float(reply["seconds"]),
            bool(reply["timed_out"]),
            int(reply["peak_kb"]),
            int(reply["base_kb"]),
        )
        self.grew_mb = max(self.grew_mb, done.grew_mb)
        return done

    def _fresh(self, argv: list[str], out: Path, err: Path, timeout: float) -> dict:
        t0 = time.monotonic()
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = subprocess.Popen(
                [sys.executable, "-c", CAPPED, str(self.budget), *argv],
                stdin=subprocess.DEVNULL,
                stdout=fo,
                stderr=fe,
                cwd=ROOT,
                env=_env(),
                start_new_session=True,
            )
            rc, timed_out, peak = _wait(proc.pid, timeout)
            proc.returncode = rc  # reaped by _wait
        return {
            "rc": rc,
            "timed_out": timed_out,
            "seconds": time.monotonic() - t0,
            "peak_kb": peak,
            "base_kb": -1,
        }


# ---- the verdicts ---------------------------------------------------------------------------
def clean(run: Run) -> str | None:
    """What no command may ever do, whatever its input: None if it did none of it."""
    err = run.stderr
    if run.timed_out:
        return f"no verdict within {TIMEOUT:g} s (killed)"
    if run.rc < 0:
        try:
            name = signal.Signals(-run.rc).name
        except ValueError:
            name = "?"
        return f"killed by signal {-run.rc} ({name}): {err[-300:]!r}"
    if "Traceback" in err:
        return f"a traceback on stderr: {(run.lines or [''])[-1][:300]}"
    if "MemoryError" in err or "Cannot allocate memory" in err:
        return f"ran out of its {BUDGET >> 20} MiB of memory: {(run.lines or [''])[-1][:300]}"
    if "internal error" in err:
        return f"an internal error, not a refusal: {err.strip()[:300]!r}"
    if run.rc not in (0, 1, 2):
        return f"exit {run.rc}, not 0, 1 or 2: {err.strip()[:300]!r}"
    if run.grew_mb > GROWTH_MB:
        return f"its resident set grew by {run.grew_mb:.0f} MiB (more than {GROWTH_MB})"
    return None


def refusal(run: Run, reader: str) -> str | None:
    """None if a non-zero exit is a clean refusal: exit 1 or 2 with exactly one line on
    stderr (``error: ...``); verify and report --deep also report findings (exit 1, the
    findings on stdout, nothing or one line on stderr)."""
    lines = run.lines
    if reader == "verify" and run.rc == 1 and len(lines) <= 1 and "INVALID" in run.stdout:
        return None
    if reader == "report" and run.rc == 1 and len(lines) <= 1:
        try:
            if json.loads(run.stdout).get("ok") is False:
                return None
        except ValueError:
            pass
    if run.rc in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "):
        return None
    return (
        f"a refusal must be exit 1 or 2 and one 'error:' line on stderr, got exit {run.rc} "
        f"and {len(lines)} lines: {run.stderr.strip()[:300]!r}"
    )


Check = Callable[[str], "str | None"]


def judge(reader: str, expect: str, run: Run, check: Check) -> str | None:
    """A failure text, or None when ``run`` is what ``expect`` allows; ``check(expect)``
    judges the outputs of an exit 0 (None: they hold up)."""
    problem = clean(run)
    if problem:
        return problem
    if run.rc == 0:
        if expect == "refuse":
            return "exit 0: accepted an input it must refuse"
        return check(expect)
    problem = refusal(run, reader)
    if problem:
        return problem
    if expect in ("same", "valid"):
        return f"refused a valid input: {run.line()}"
    return None


def files(folder: Path, skip: str | None = None) -> dict[str, bytes]:
    """Every regular file under ``folder`` by relative path (but ``skip``)."""
    if not folder.is_dir():
        return {}
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.name != skip and p.is_file() and not p.is_symlink()
    }


def _differs(got: dict[str, bytes], want: dict[str, bytes]) -> str | None:
    if got == want:
        return None
    names = sorted(set(got) ^ set(want)) or [k for k in sorted(want) if got.get(k) != want[k]]
    return f"output differs from the unmutated input's ({', '.join(names[:4])})"


def verifies(vault: Path) -> str | None:
    from smoe.format.verify import verify_path

    report = verify_path(vault, deep=True)
    return f"{vault.name} does not verify: {report.errors[0].line()}" if report.errors else None


# ---- bases -----------------------------------------------------------------------------------
@dataclass
class Base:
    """One valid sidecar and everything its readers need; ``ref`` holds each reader's
    output for the unmutated sidecar, made at the very paths the cases use."""

    kind: str  # manifest | journal | imatrix
    name: str
    dir: Path  # the inputs, copied for each case
    sidecar: str  # the sidecar's file name in the case folder
    mutate: Any  # the mutators' view of it
    ref: dict[str, Any] = field(default_factory=dict)
    checkpoint: Path | None = None
    readers: tuple[str, ...] = ()


def _sculpt(model: Path, out: Path, **opts: Any) -> None:
    from smoe.sculpt import SculptOptions, sculpt

    sculpt(model, out, SculptOptions(jobs=1, **opts))


def manifest_base(work: Path, name: str, version: int) -> Base:
    from smoe.sculpt.source.checkpoint import Checkpoint

    d = work / f"manifest-{name}"
    _sculpt(CHECKPOINTS / name, d, version=version)
    path = d / f"{name}.smoe.manifest.json"
    raw = path.read_bytes()
    ck = Checkpoint.open(CHECKPOINTS / name)
    ref = next(iter(ck.experts.values()))
    heights = (ref.shapes[0][0], ref.shapes[1][0], ref.shapes[2][0])
    per_layer = max(e for _, e in ck.experts) + 1
    doc = json.loads(raw)
    fused = any(t.get("index") is not None for r in doc["experts"] for t in r.get("tensors", []))
    view = sm.ManifestBase(doc, raw, fused, heights, per_layer, upgradable=version == 1)
    readers = ("verify", "report", "export") + (("upgrade",) if version == 1 else ())
    return Base("manifest", name, d, path.name, view, readers=readers)


KILL_AT = 12  # experts journaled before the interrupted sculpt stops
JOURNAL_SHAPE = {"layers": 2, "experts": 16, "d_model": 64, "ffn": 32, "seed": 11}


def _interrupted(model: Path, out: Path, after: int) -> None:
    """A sculpt stopped (as by Ctrl-C) once ``after`` experts are journaled."""
    from smoe.sculpt import SculptOptions, sculpt

    def progress(done: int, total: int, nbytes: int) -> None:
        if done >= after:
            raise KeyboardInterrupt

    try:
        sculpt(model, out, SculptOptions(jobs=1, resume=True), progress=progress)
    except KeyboardInterrupt:
        return
    raise RuntimeError(f"the sculpt of {model} was not interrupted after {after} experts")


def journal_base(work: Path) -> Base:
    from smoe_testkit.synth import write_checkpoint

    d = work / "journal"
    ck = write_checkpoint(d / "ck", **JOURNAL_SHAPE)  # type: ignore[arg-type]
    total = JOURNAL_SHAPE["layers"] * JOURNAL_SHAPE["experts"]
    state = d / "state"
    _interrupted(ck, state, KILL_AT)
    full = d / "full"
    _interrupted(ck, full, total)
    journal = f".{ck.name}.smoe.journal"
    head, *lines = (state / journal).read_bytes().splitlines(keepends=True)
    _, *every = (full / journal).read_bytes().splitlines(keepends=True)
    shutil.rmtree(full)
    fresh = d / "fresh"
    _sculpt(ck, fresh)
    doc = json.loads((fresh / f"{ck.name}.smoe.manifest.json").read_bytes())
    sizes = {(r["layer"], r["expert"]): r["raw_size"] for r in doc["experts"]}
    shutil.rmtree(fresh)
    view = sm.JournalBase(head, lines, {sm._key(x): x for x in every}, sizes)
    base = Base("journal", "synthetic", state, journal, view, checkpoint=ck, readers=("resume",))
    # the experts whose finished blob the partial holds (a resume may keep those, no other)
    partial = (state / f".{ck.name}.smoe.partial").read_bytes()
    base.ref["present"] = sum(
        checksum(partial[r["offset"] : r["offset"] + r["raw_size"]]) == r["crc32c"]
        for r in doc["experts"]
    )
    return base


IM_MODEL = "qwen3_moe"


def importance_entries(model: Path, seed: int = 3) -> tuple[dict, int]:
    """llama-imatrix statistics for every expert weight of ``model`` (and one dense weight):
    name -> (in_sum2 [n_mat, cols], counts [n_mat]), and the experts per layer."""
    from smoe.sculpt.source.checkpoint import Checkpoint

    ck = Checkpoint.open(model)
    layers = sorted({la for la, _ in ck.experts})
    per_layer = max(e for _, e in ck.experts) + 1
    shapes = next(iter(ck.experts.values())).shapes
    rng = np.random.default_rng(seed)
    out = {}
    for la in layers:
        for role, (_, cols) in zip(("gate", "up", "down"), shapes):
            counts = rng.integers(1, 5000, per_layer).astype(np.float32)
            var = rng.lognormal(0, 1, cols) * np.where(rng.random(cols) < 0.05, 100.0, 1.0)
            sums = counts[:, None] * var[None, :] * rng.uniform(0.5, 2, (per_layer, cols))
            out[f"blk.{la}.ffn_{role}_exps.weight"] = (sums.astype(np.float32), counts)
        cols = shapes[0][1]
        out[f"blk.{la}.attn_q.weight"] = (np.ones((1, cols), np.float32), np.ones(1, np.float32))
    return out, per_layer


def imatrix_base(work: Path, form: str) -> Base:
    entries, per_layer = importance_entries(CHECKPOINTS / IM_MODEL)
    if form == "gguf":
        structure: sm.GgufFile | sm.DatFile = sm.imatrix_gguf(entries, ["calibration.txt"])
    else:
        structure = sm.DatFile(
            [
                sm.DatEntry(name, 10, (sums / counts[:, None] * 10).astype(np.float32).reshape(-1))
                for name, (sums, counts) in sorted(entries.items())
            ]
        )
    d = work / f"imatrix-{form}"
    d.mkdir(parents=True)
    view = sm.ImatrixBase(structure, per_layer)
    return Base(
        "imatrix",
        form,
        d,
        f"imatrix.{form}",
        view,
        checkpoint=CHECKPOINTS / IM_MODEL,
        readers=("imatrix",),
    )


# ---- one case -------------------------------------------------------------------------------
@dataclass
class Case:
    """The paths of one case (always the same ones: outputs that name their paths compare)."""

    root: Path

    @property
    def inputs(self) -> Path:
        return self.root / "in"

    @property
    def outputs(self) -> Path:
        return self.root / "out"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def reset(self) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True)


def _place(m: sm.Mutation, path: Path) -> None:
    """Write the mutated sidecar at ``path`` (or make the special file)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    if m.special is None:
        assert m.raw is not None
        path.write_bytes(m.raw)
    elif m.special == "tail":
        assert m.raw is not None
        path.write_bytes(m.raw)
        os.truncate(path, len(m.raw) + TAIL)
    elif m.special == "fifo":
        os.mkfifo(path)
    elif m.special == "dir":
        path.mkdir()
        (path / "x").write_bytes(b"{}")
    elif m.special == "devzero":
        os.symlink("/dev/zero", path)
    elif m.special == "devnull":
        os.symlink("/dev/null", path)
    elif m.special == "selflink":
        os.symlink(path.name, path)
    else:
        raise ValueError(m.special)


def _hash_inputs(folder: Path, skip: str) -> dict[str, bytes]:
    return files(folder, skip)


def commands(base: Base, case: Case) -> dict[str, list[str]]:
    """The command line of each reader of the base's sidecar, at the case's paths."""
    i, o = case.inputs, case.outputs
    if base.kind == "manifest":
        vault = str(i / f"{base.name}.smoe")
        return {
            "verify": ["verify", "--deep", vault],
            "report": ["report", "--deep", "--json", vault, "-o", str(o / "report" / "page.html")],
            "export": ["export", "--hf", vault, str(o / "hf")],
            "upgrade": [
                "upgrade",
                vault,
                "--config",
                str(i / f"{base.name}.config.json"),
                "--out",
                str(o / "up" / "new.smoe"),
            ],
        }
    assert base.checkpoint is not None
    if base.kind == "journal":
        return {
            "resume": ["sculpt", str(base.checkpoint), str(i), "--resume", "--jobs", "1", "--json"]
        }
    return {
        "imatrix": [
            "sculpt",
            str(base.checkpoint),
            str(o),
            "--imatrix",
            str(i / base.sidecar),
            "--jobs",
            "1",
            "--json",
        ]
    }


def _outputs(base: Base, reader: str, case: Case) -> dict[str, bytes]:
    """What a reader made (what ``same`` compares)."""
    o = case.outputs
    if reader in ("report", "export", "upgrade"):
        return files(o / {"report": "report", "export": "hf", "upgrade": "up"}[reader])
    if reader == "resume":
        return files(case.inputs)
    if reader == "imatrix":
        out = files(o)
        stem = base.checkpoint.name if base.checkpoint else ""
        key = f"{stem}.smoe.manifest.json"
        if key in out:  # the record of the file read differs (its hash): compare the experts
            doc = json.loads(out[key])
            out[key] = json.dumps(doc["experts"], sort_keys=True).encode()
        return out
    return {}


def output_check(
    base: Base, reader: str, case: Case, run: Run, m: sm.Mutation | None
) -> Callable[[str], str | None]:
    """``check(expect)`` for an exit 0 of ``reader``."""

    def check(expect: str) -> str | None:
        got = _outputs(base, reader, case)
        if reader == "report":
            try:
                if json.loads(run.stdout).get("ok") is not True:
                    return "exit 0 but the report says the vault is not ok"
            except ValueError:
                return f"--json printed no JSON document: {run.stdout[:200]!r}"
        if reader == "export":
            from safetensors import safe_open

            if not got:
                return "exit 0 but no export folder"
            for name in got:
                if name.endswith(".safetensors"):
                    try:
                        with safe_open(str(case.outputs / "hf" / name), framework="numpy") as f:
                            f.keys()
                    except Exception as e:
                        return f"exported {name} does not open with safetensors: {e}"
        if reader == "upgrade":
            new = case.outputs / "up" / "new.smoe"
            if not new.is_file() or not Path(f"{new}.manifest.json").is_file():
                return "exit 0 but no upgraded vault and manifest"
            problem = verifies(new)
            if problem:
                return f"upgrade wrote what verify --deep rejects: {problem}"
        if reader == "resume":
            stem = base.checkpoint.name if base.checkpoint else ""
            left = [p.name for p in case.inputs.iterdir() if p.name.startswith(f".{stem}.smoe.")]
            if left:
                return f"exit 0 but left {left}"
            try:
                summary = json.loads(run.stdout)
            except ValueError:
                return f"--json printed no JSON document: {run.stdout[:200]!r}"
            total = JOURNAL_SHAPE["layers"] * JOURNAL_SHAPE["experts"]
            if summary["experts_resumed"] + summary["experts_written"] != total:
                return f"resumed + written is not {total}: {summary}"
            present = base.ref["present"]
            if summary["experts_resumed"] > present:
                return (
                    f"kept {summary['experts_resumed']} experts; the partial holds the blobs "
                    f"of {present}"
                )
            return _differs(got, base.ref.get("resume", got))  # a fresh run's, whatever the journal
        if reader == "imatrix":
            problem = _imatrix_outputs(base, case, m)
            if problem:
                return problem
        if expect == "same":
            return _differs(got, base.ref.get(reader, got))
        return None

    return check


def _imatrix_outputs(base: Base, case: Case, m: sm.Mutation | None) -> str | None:
    """A sculpt with an importance matrix: the vault verifies, and every expert tensor whose
    importance is not uniform records a weighted SNR (issue 23, case 8)."""
    assert base.checkpoint is not None
    stem = base.checkpoint.name
    vault = case.outputs / f"{stem}.smoe"
    problem = verifies(vault)
    if problem:
        return problem
    doc = json.loads(Path(f"{vault}.manifest.json").read_bytes())
    must = sm.must_weigh(
        m.form if m is not None and m.form is not None else base.mutate.form, base.mutate.experts
    )
    for row in doc["experts"]:
        for t, tensor in enumerate(row["tensors"]):
            key = (row["layer"], row["expert"], t)
            if (
                key in must
                and tensor.get("snr_db") is not None
                and tensor.get("weighted_snr_db") is None
            ):
                return (
                    f"layer {key[0]} expert {key[1]} {tensor['name']}: weighted_snr_db null "
                    "(recorded as unweighted) although its importance is not uniform"
                )
    return None


def prepare(base: Base, case: Case, m: sm.Mutation | None) -> None:
    """The case folder: the base's inputs and the (mutated) sidecar; outputs empty."""
    case.reset()
    shutil.copytree(base.dir, case.inputs, symlinks=True)
    case.outputs.mkdir()
    if base.kind == "imatrix":
        raw = base.mutate.form.bytes()
        (case.inputs / base.sidecar).write_bytes(raw)
    if m is not None:
        _place(m, case.inputs / base.sidecar)


def reference(runner: Runner, base: Base, reader: str, case: Case) -> str | None:
    """Make a reader's output for the unmutated sidecar (for the journal: a fresh run's) at
    the case's paths, when first wanted; a failure text if the reader fails on it."""
    if reader in base.ref:
        return None
    prepare(base, case, None)
    if reader == "resume":  # the reference is a fresh run, not a resumed one
        for p in case.inputs.iterdir():
            p.unlink()
    run = runner.run(commands(base, case)[reader], case.logs / reader)
    problem = clean(run) or (None if run.rc == 0 else run.line())
    if problem:
        return f"fails on the unmutated sidecar: {problem}"
    base.ref[reader] = _outputs(base, reader, case)
    return None


def setup(work: Path, only: str | None = None) -> dict[str, list[Base]]:
    bases: dict[str, list[Base]] = {}
    if only in (None, "manifest"):
        bases["manifest"] = [
            manifest_base(work, "qwen3_moe", 2),
            manifest_base(work, "qwen3_moe_fused", 1),
        ]
    if only in (None, "journal"):
        bases["journal"] = [journal_base(work)]
    if only in (None, "imatrix"):
        try:
            import gguf  # noqa: F401
        except ImportError:
            pass  # no smoe[imatrix]: sculpt --imatrix is refused; nothing to fuzz
        else:
            bases["imatrix"] = [imatrix_base(work, "gguf"), imatrix_base(work, "dat")]
    return bases


def one_case(
    seed: int, case_no: int, bases: dict[str, list[Base]], case: Case, runner: Runner
) -> tuple[CaseReport, Base, sm.Mutation, dict[str, list[str]]]:
    """Case ``case_no`` of ``seed``: a sidecar, a base, a mutation and its readers (verify
    and one other for a manifest), all drawn from the case's own seeded generator."""
    rng = random.Random(f"sidecar:{seed}:{case_no}")
    kind = sm.choose(rng, {k: w for k, w in KINDS.items() if k in bases})
    base = rng.choice(bases[kind])
    mutators, weights = sm.TABLES[kind]
    mutator = sm.choose(rng, weights)
    m = mutators[mutator](rng, base.mutate)
    readers = list(base.readers)
    if kind == "manifest":
        readers = ["verify", rng.choice([r for r in base.readers if r != "verify"])]
    rep = CaseReport(case_no, f"{kind}:{base.name}", mutator, m.what, "")
    return check_case(rep, base, m, readers, case, runner)


def check_case(
    rep: CaseReport, base: Base, m: sm.Mutation, readers: list[str], case: Case, runner: Runner
) -> tuple[CaseReport, Base, sm.Mutation, dict[str, list[str]]]:
    """Run each reader on the mutated sidecar and judge it (``rep`` gets the verdicts and
    failures): what ``judge`` asks, and after a refusal nothing under the final names, and
    the other inputs unchanged. Returns the report, the base, the mutation, the commands."""
    argv = commands(base, case)
    for reader in readers:
        if reader == "resume" or m.expect.get(reader) == "same":
            problem = reference(runner, base, reader, case)
            if problem:
                rep.failures.append(f"{reader}: {problem}")
    prepare(base, case, m)
    before = _hash_inputs(case.inputs, base.sidecar) if base.kind != "journal" else {}
    verdicts = []
    for reader in readers:
        expect = m.expect.get(reader, "any")
        run = runner.run(argv[reader], case.logs / reader)
        problem = judge(reader, expect, run, output_check(base, reader, case, run, m))
        if problem is None and run.rc != 0 and not _nothing_written(base, reader, case):
            problem = "refused, but left outputs under their final names"
        if problem is None and before and _hash_inputs(case.inputs, base.sidecar) != before:
            problem = "an input changed"
        rep.detail[reader] = (
            f"expect {expect}; {run.line()[:300]} ({run.seconds:.2f} s, +{run.grew_mb:.0f} MiB)"
        )
        verdict = "accepted" if run.rc == 0 else "refused"
        for key in (f"{base.kind}_{verdict}", f"expect_{expect}"):
            rep.counters[key] = rep.counters.get(key, 0) + 1
        verdicts.append(verdict)
        if problem:
            rep.failures.append(f"{reader}: {problem}")
    rep.verdict = "accepted" if all(v == "accepted" for v in verdicts) else "refused"
    return rep, base, m, {r: argv[r] for r in readers}


def _nothing_written(base: Base, reader: str, case: Case) -> bool:
    o = case.outputs
    if reader == "export":
        return not (o / "hf").exists() or not any((o / "hf").iterdir())
    if reader == "upgrade":
        return (
            not (o / "up" / "new.smoe").exists()
            and not (o / "up" / "new.smoe.manifest.json").exists()
        )
    if reader == "imatrix":
        return not any(
            p.name.endswith((".smoe", ".manifest.json", ".safetensors")) for p in o.iterdir()
        )
    if reader == "resume":
        stem = base.checkpoint.name if base.checkpoint else ""
        return not (case.inputs / f"{stem}.smoe").exists()
    return True


# ---- the campaign ---------------------------------------------------------------------------
def scratch() -> str | None:
    """A RAM-backed temp folder if there is one: every case writes and fsyncs outputs."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def run(
    cases: int,
    seconds: float,
    seed: int,
    work: Path,
    repro: Path | None = REPRO,
    first: int = 0,
    fresh_every: int = 0,
    only: str | None = None,
    clean_repros: bool = True,
    log: IO[str] | None = None,
) -> dict:
    """Cases ``first``.. until ``cases`` are done or ``seconds`` have passed; the summary.
    Every ``fresh_every``-th case runs its commands in a new interpreter (0: none)."""
    work.mkdir(parents=True, exist_ok=True)
    if repro is not None and clean_repros:
        shutil.rmtree(repro / TARGET, ignore_errors=True)
    t0 = time.perf_counter()
    totals: dict[str, int] = {}
    by_mutator: dict[str, dict[str, int]] = {}
    failures: list[str] = []
    failed = 0
    with Runner() as runner, Runner(fresh=True) as fresh:
        if fresh_every != 1:
            runner.start()
        bases = setup(work / "bases", only)
        setup_s = time.perf_counter() - t0
        case = Case(work / "case")
        t1 = time.perf_counter()
        for n in range(first, first + cases):
            if time.perf_counter() - t1 > seconds:
                break
            use = fresh if fresh_every and n % fresh_every == 0 else runner
            rep, base, m, argv = one_case(seed, n, bases, case, use)
            if log is not None:
                print(
                    json.dumps(
                        {
                            "case": n,
                            "mutator": rep.mutator,
                            "what": rep.what[:120],
                            **rep.detail,
                            "failures": rep.failures,
                        }
                    ),
                    file=log,
                    flush=True,
                )
            for d in (totals, by_mutator.setdefault(f"{base.kind}:{rep.mutator}", {})):
                d["cases"] = d.get("cases", 0) + 1
                d[rep.verdict] = d.get(rep.verdict, 0) + 1
            for k, v in rep.counters.items():
                totals[k] = totals.get(k, 0) + v
            if use is fresh:
                totals["fresh_cases"] = totals.get("fresh_cases", 0) + 1
            if rep.failures:
                failed += 1
                by_mutator[f"{base.kind}:{rep.mutator}"]["failures"] = (
                    by_mutator[f"{base.kind}:{rep.mutator}"].get("failures", 0) + 1
                )
                saved = (
                    save(rep, base, m, argv, seed, case, repro, only)
                    if failed <= MAX_REPROS
                    else None
                )
                if len(failures) < MAX_LISTED:
                    where = f"; reproducer {saved}" if saved else ""
                    failures.append(
                        f"seed {seed} case {rep.case} ({rep.mutator} on {rep.base}: "
                        f"{rep.what[:160]}): {' | '.join(rep.failures)[:500]}{where}"
                    )
        commands_run = runner.runs + fresh.runs
        peak = max(runner.peak_kb, fresh.peak_kb)
        grew = max(runner.grew_mb, fresh.grew_mb)
    shutil.rmtree(work / "case", ignore_errors=True)
    return {
        "cases": totals.pop("cases", 0),
        "refused": totals.pop("refused", 0),
        "accepted": totals.pop("accepted", 0),
        "failure_count": failed,
        "failures": failures,
        **dict(sorted(totals.items())),
        "commands": commands_run,
        "peak_rss_mb": round(peak / 1024, 1),
        "peak_growth_mb": round(grew, 1),
        "memory_cap_mb": BUDGET >> 20,
        "setup_s": round(setup_s, 1),
        "by_mutator": dict(sorted(by_mutator.items())),
        "first_case": first,
        "seed": seed,
        "ok": failed == 0,
    }


def save(
    rep: CaseReport,
    base: Base,
    m: sm.Mutation,
    argv: dict[str, list[str]],
    seed: int,
    case: Case,
    repro: Path | None,
    only: str | None = None,
) -> Path | None:
    """Copy the case's inputs (and a journal case's checkpoint) to REPRO/sidecar/s<seed>-c<n>/
    with case.json: the mutation, each reader's verdict, the replay and the command lines."""
    if repro is None:
        return None
    dest = repro / TARGET / f"s{seed}-c{rep.case}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    skipped = []
    for p in sorted(case.inputs.iterdir()):
        st = os.lstat(p)
        if m.special is not None and p.name == base.sidecar:
            skipped.append(p.name)
            if m.raw is not None:
                (dest / "in").mkdir(exist_ok=True)
                (dest / "in" / p.name).write_bytes(m.raw)  # without the tail: recreate it
            continue
        (dest / "in").mkdir(exist_ok=True)
        if stat.S_ISREG(st.st_mode):
            shutil.copy2(p, dest / "in" / p.name)
    if base.kind == "journal" and base.checkpoint is not None:
        shutil.copytree(base.checkpoint, dest / base.checkpoint.name)
    if m.special is None and m.raw is not None:
        (dest / "in" / base.sidecar).write_bytes(m.raw)

    def moved(args: list[str]) -> list[str]:
        out = []
        for a in args:
            a = a.replace(str(case.inputs), str(dest / "in"))
            a = a.replace(str(case.outputs), "OUT")
            if base.kind == "journal" and base.checkpoint is not None:
                a = a.replace(str(base.checkpoint), str(dest / base.checkpoint.name))
            out.append(a)
        return out

    info = {
        "target": TARGET,
        "seed": seed,
        "case": rep.case,
        "sidecar": base.kind,
        "base": base.name,
        "mutator": rep.mutator,
        "mutation": rep.what,
        "special": m.special,
        "expect": m.expect,
        "failures": rep.failures,
        **rep.detail,
        "replay": f"python -m fuzz.sidecar_target --seed {seed} --case {rep.case}"
        + (f" --only {only}" if only else ""),
        "cli": {r: "python -m smoe " + " ".join(moved(a)) for r, a in argv.items()},
    }
    if base.kind == "journal":
        info["note"] = "sculpt --resume completes in/ in place: run it on a copy"
    if m.special is not None:
        info["recreate"] = (
            f"in/{base.sidecar} is to be a {m.special}"
            + (
                f" (its content here, then a sparse NUL tail of {TAIL} bytes)"
                if m.special == "tail"
                else ""
            )
            + "; the replay command recreates it"
        )
    (dest / "case.json").write_text(json.dumps(info, indent=1) + "\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--case", type=int, help="replay this one case in fresh processes")
    ap.add_argument("--only", choices=sorted(KINDS), help="mutate only this sidecar")
    ap.add_argument("--fresh-every", type=int, default=0, help="0: always the fork server")
    ap.add_argument("--repro", type=Path, default=REPRO)
    ap.add_argument("--verbose", action="store_true", help="one line per case on stderr")
    args = ap.parse_args(argv)
    if args.serve:
        return serve()
    first, cases = (args.case, 1) if args.case is not None else (0, args.cases)
    with tempfile.TemporaryDirectory(prefix="smoe-fuzz-sidecar-", dir=scratch()) as tmp:
        result = run(
            cases,
            args.seconds if args.case is None else 1e9,
            args.seed,
            Path(tmp),
            args.repro,
            first,
            1 if args.case is not None else args.fresh_every,
            args.only,
            clean_repros=args.case is None,
            log=sys.stderr if args.verbose or args.case is not None else None,
        )
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
