"""The compiled kernels' first run (issue 25): a compile says so on stderr once, before it
starts, and a warm cache says nothing; a run too small to pay for the compile (or even the
load) is encoded by numpy, the same bytes; ``smoe warmup`` compiles every kernel up front.

The cold-cache cases run in subprocesses with their own empty ``NUMBA_CACHE_DIR`` and
compile only the two smallest kernels (a few seconds); the rest swaps the kernels for
stand-ins that make numba compile a one-line function."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from smoe import quant
from smoe.cli import main
from smoe.cli.notices import KERNEL_LOGGER
from smoe.quant import compiling, dispatch, encoder, first_run
from smoe.sculpt import SculptOptions, sculpt
from smoe_testkit.synth import write_checkpoint

from fixtures_data import FIXTURES
from helpers import plain_env, run

NUMBA = importlib.util.find_spec("numba") is not None
needs_numba = pytest.mark.skipif(not NUMBA, reason="needs numba (pip install 'smoe[fast]')")
HEADER = "compiling kernels for this machine, once: about"

# `smoe warmup --json` in a fresh process, on only the two smallest kernels (a test's
# budget: all of them take minutes to compile); then what the cache held before and after
WARMUP_SMALL = """
import json, sys
from smoe.cli import main
from smoe.quant import first_run
small = ("einsum order check (Q4 optimal)", "decode to float32")
calls = [c for c in first_run.all_kernels() if c.name in small]
first_run.all_kernels = lambda: calls
before = [c.cached() for c in calls]
code = main(["warmup", "--json"])
sys.stderr.write(json.dumps({"before": before, "after": [c.cached() for c in calls]}) + "\\n")
sys.exit(code)
"""


def _warmup_small(cache: Path) -> tuple[dict, list[str], dict]:
    """``smoe warmup --json`` (two kernels) with ``cache`` as numba's: its JSON, its stderr
    lines but the last, and that last (what the cache held before and after)."""
    command = [sys.executable, "-c", WARMUP_SMALL]
    proc = run(command=command, env=plain_env(NUMBA_CACHE_DIR=str(cache)))
    assert proc.returncode == 0, proc.stderr
    *lines, probe = proc.stderr.splitlines()
    return json.loads(proc.stdout), lines, json.loads(probe)


@needs_numba
def test_a_cold_cache_says_so_once_and_a_warm_one_says_nothing(tmp_path: Path) -> None:
    doc, lines, probe = _warmup_small(tmp_path)  # empty: numba compiles
    assert probe == {"before": [False, False], "after": [True, True]}
    assert [k["compiled"] for k in doc["kernels"]] == [True, True]
    assert len(lines) == 4 and sum(HEADER in line for line in lines) == 1, lines
    assert lines[0].startswith(HEADER) and lines[0].endswith(" s")
    assert lines[1:3] == [
        "  kernel 1 of 2: einsum order check (Q4 optimal)",
        "  kernel 2 of 2: decode to float32",
    ]
    assert lines[3].startswith("compiled 2 kernels in ")
    assert any(tmp_path.rglob("*.nbi"))  # numba's index files went to NUMBA_CACHE_DIR

    doc, lines, probe = _warmup_small(tmp_path)  # filled: numba loads, nothing is said
    assert probe == {"before": [True, True], "after": [True, True]}
    assert lines == []
    assert doc["schema"] == "smoe-warmup/1"
    assert [(k["name"], k["compiled"]) for k in doc["kernels"]] == [
        ("einsum order check (Q4 optimal)", False),
        ("decode to float32", False),
    ]
    assert doc["seconds"] >= sum(k["seconds"] for k in doc["kernels"]) - 1e-3


# ---------------------------------------------------------------------------- the notices


def _compiles(name: str) -> compiling.KernelCall:
    """A stand-in kernel that makes numba compile a fresh function (nothing cached)."""
    import numba

    return compiling.KernelCall(name, lambda: numba.njit(lambda x: x + 1)(1), lambda: False)


@needs_numba
def test_each_compiling_kernel_is_counted_and_cached_ones_are_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cached = compiling.KernelCall("decode to float32", lambda: None, lambda: True)
    calls = [cached, _compiles("encode Q4 optimal"), cached, _compiles("encode absmax")]
    with caplog.at_level(logging.INFO, logger=compiling.LOGGER):
        done = compiling.run_kernels(calls)
    assert [w.compiled for w in done] == [False, True, False, True]
    about = compiling.about(
        compiling.COMPILE_S["encode Q4 optimal"] + compiling.COMPILE_S["encode absmax"]
    )
    said = [r.getMessage() for r in caplog.records if r.name == compiling.LOGGER]
    assert said[:3] == [
        f"{HEADER} {about} s",
        "  kernel 1 of 2: encode Q4 optimal",
        "  kernel 2 of 2: encode absmax",
    ]
    assert len(said) == 4 and said[3].startswith("compiled 2 kernels in ")


@needs_numba
def test_nothing_compiled_nothing_said(caplog: pytest.LogCaptureFixture) -> None:
    calls = [compiling.KernelCall("decode to float32", lambda: None, lambda: False)]
    with caplog.at_level(logging.INFO, logger=compiling.LOGGER):
        assert [w.compiled for w in compiling.run_kernels(calls)] == [False]
    assert [r for r in caplog.records if r.name == compiling.LOGGER] == []  # found: no notice


def test_the_cli_listens_to_the_quant_layers_logger() -> None:
    assert KERNEL_LOGGER == compiling.LOGGER == quant.COMPILE_LOGGER


@needs_numba
def test_sculpt_json_stays_clean_while_stderr_says_it_compiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(quant, "run_kernel", lambda *a, **k: None)  # no small-job rule
    monkeypatch.setattr(
        encoder, "encoder_kernels", lambda *a, **k: [_compiles("encode Q4 optimal")]
    )
    model = FIXTURES / "checkpoints" / "qwen3_moe"
    code = main(["sculpt", str(model), str(tmp_path / "out"), "--jobs", "2", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["experts_written"] == 16
    lines = err.splitlines()
    assert sum(HEADER in line for line in lines) == 1 and lines[0].startswith(HEADER), lines
    assert "  kernel 1 of 1: encode Q4 optimal" in lines


# ---------------------------------------------------------------------------- the small-job rule


def test_pick_kernel_weighs_the_time_saved_against_the_start_up() -> None:
    saved = first_run.SAVED_NS[(4, "optimal", False)]
    assert first_run.pick_kernel(25_000_000, 60.0, saved) == "numpy"  # 50 MB, cold
    assert first_run.pick_kernel(25_000_000, compiling.LOAD_S, saved) == "numpy"  # warm
    assert first_run.pick_kernel(2 * 10**10, 60.0, saved) == "fast"  # 40 GB: compiling pays
    assert first_run.pick_kernel(2 * 10**10, 60.0, saved, workers=64) == "numpy"
    assert first_run.pick_kernel(0, 0.0, saved) == "fast"  # (nothing to encode, nothing to start)


def _cache_is(state: bool | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder's kernels, as the cache would find them: all there (True), none."""

    def kernels(bits: int, scale: str = "optimal", **kw: object) -> list[compiling.KernelCall]:
        return [compiling.KernelCall(f"encode Q{bits} {scale}", lambda: None, lambda: state)]

    monkeypatch.setattr(first_run, "encoder_kernels", kernels)


def test_run_kernel_picks_numpy_for_small_runs_and_when_the_compile_would_not_pay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(quant.KERNEL_ENV, raising=False)
    sets = [(4, "optimal")]
    assert first_run.run_kernel(sets, 0) == "numpy"
    assert first_run.run_kernel(sets, 25_000_000) == "numpy"  # sooner than even a warm load
    _cache_is(True, monkeypatch)
    assert first_run.run_kernel(sets, 2_000_000_000) is None  # warm: auto (compiled)
    _cache_is(False, monkeypatch)
    assert first_run.run_kernel(sets, 2_000_000_000) == "numpy"  # cold: 10 s saved < compile
    assert first_run.run_kernel(sets, 10**11) is None  # cold, but huge: worth compiling
    _cache_is(None, monkeypatch)  # numba's cache cannot be read: counted as cold
    assert first_run.run_kernel(sets, 2_000_000_000) == "numpy"
    for forced in ("fast", "numpy"):  # $SMOE_KERNEL still forces: no run-wide choice
        monkeypatch.setenv(quant.KERNEL_ENV, forced)
        assert first_run.run_kernel(sets, 0) is None


def test_a_runs_choice_is_what_auto_means_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(quant.KERNEL_ENV, raising=False)
    with quant.run_choice("numpy"):
        assert quant.fast_kernels(4, "optimal", 1 << 30) is None
        assert dispatch.decode_kernels(1 << 30) is None
        assert not quant.prepare_fast(4)  # nothing compiled for a numpy run
        if NUMBA:  # kernel= and $SMOE_KERNEL still win
            assert quant.fast_kernels(4, "optimal", 1, kernel="fast") is not None
            monkeypatch.setenv(quant.KERNEL_ENV, "fast")
            assert quant.fast_kernels(4, "optimal", 1) is not None
    monkeypatch.delenv(quant.KERNEL_ENV)
    with quant.run_choice(None):
        assert (quant.fast_kernels(4, "optimal", 1 << 30) is None) is not NUMBA


def test_a_small_run_is_numpy_throughout_and_writes_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint whose matrices are large enough for the compiled encoder, but only 1.6 MB
    of them: numpy, by the rule, and byte for byte what the compiled encoder writes."""
    model = write_checkpoint(tmp_path / "m", layers=1, experts=4, d_model=256, ffn=256, seed=3)
    monkeypatch.delenv(quant.KERNEL_ENV, raising=False)
    chosen: list[str | None] = []
    pick = quant.run_kernel

    def watched(*args: object, **kw: object) -> str | None:
        chosen.append(pick(*args, **kw))  # type: ignore[arg-type]
        return chosen[-1]

    monkeypatch.setattr(quant, "run_kernel", watched)
    opts = SculptOptions(jobs=1, scale="absmax")  # (the cheapest kernel to compile)
    auto = sculpt(model, tmp_path / "auto", opts).vault.read_bytes()
    assert chosen == ["numpy"]
    if NUMBA:
        monkeypatch.setenv(quant.KERNEL_ENV, "fast")
        fast = sculpt(model, tmp_path / "fast", opts).vault.read_bytes()
        assert chosen == ["numpy", None] and fast == auto


@needs_numba
def test_the_probe_finds_what_encoding_compiled() -> None:
    """What ``cached`` says of a kernel this process has run: compiled."""
    (call,) = encoder.encoder_kernels(4, "absmax", kernel="fast")
    call.run()
    assert call.cached() is True
    w = np.zeros(quant.FAST_MIN_WEIGHTS, np.uint16)
    packed, _ = quant.encode(w, 4, "absmax", src_dtype="bf16", kernel="fast")
    assert np.array_equal(packed, quant.encode(w, 4, "absmax", src_dtype="bf16", kernel="numpy")[0])


# ---------------------------------------------------------------------------- smoe warmup


def test_warmup_without_numba_says_numpy_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(dispatch._FAST, "module", None)  # as if importing the kernels failed
    assert main(["warmup"]) == 0
    assert (
        capsys.readouterr().out == "numpy kernels only (install smoe[fast] for the compiled ones)\n"
    )
    assert main(["warmup", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "smoe-warmup/1" and doc["kernels"] == []
    assert doc["note"] == "numpy kernels only (install smoe[fast] for the compiled ones)"


@needs_numba
def test_warmup_says_how_long_it_took(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = [
        _compiles("encode absmax"),
        compiling.KernelCall("decode to float32", lambda: None, lambda: True),
    ]
    monkeypatch.setattr(first_run, "all_kernels", lambda: calls)
    assert main(["warmup"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("2 compiled kernels ready in ") and out.endswith(
        " s (1 compiled now, 1 loaded from the cache)\n"
    )
    assert err.startswith(HEADER)
    calls[0] = compiling.KernelCall("encode absmax", lambda: None, lambda: True)
    assert main(["warmup", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert set(doc) == {"schema", "kernels", "seconds", "damaged", "not_kept"} and err == ""
    assert [set(k) for k in doc["kernels"]] == [{"name", "compiled", "seconds"}] * 2


@needs_numba
def test_every_kernel_is_in_the_warmup_and_has_an_estimate() -> None:
    names = [c.name for c in first_run.all_kernels()]
    assert len(names) == len(set(names)) == len(compiling.COMPILE_S)
    assert set(names) == set(compiling.COMPILE_S)
