"""The expert cache (harness/engine/cache.cpp) driven by the hidden `cache-check` command:
a seeded mix of acquires held together up to the capacity, releases and prefetch hints, every
held blob compared byte for byte with the vault after every acquire (a pinned slot is never
evicted or overwritten), an acquire beyond the capacity refused without effect; under the
sanitizers too. O_DIRECT where the file system takes it, buffered with one warning where it
refuses it (tmpfs), the same counts either way."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from stream_traces import lru, make_vault, random_steps, write_trace

from fixtures_data import ROOT
from helpers import SMOE_STREAM, plain_env, run, strict_json

ASAN = ROOT / "build" / "asan" / "smoe-stream"


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_vault(tmp_path_factory.mktemp("cache") / "v.smoe", layers=3, experts=6, top_k=2)


def cache_check(binary: Path, vault: Path, *args: object) -> dict:
    proc = run("cache-check", vault, *args, command=[binary])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.usefixtures("smoe_stream")
@pytest.mark.parametrize("policy", ["lru", "cycle"])
@pytest.mark.parametrize("slots", [2, 3, 7, 18])
@pytest.mark.parametrize("threads", [1, 3])
def test_held_blobs_stay_intact(vault: Path, policy: str, slots: int, threads: int) -> None:
    doc = cache_check(
        SMOE_STREAM, vault, slots, 400, slots, "--policy", policy, "--io-threads", threads
    )
    assert doc["slots"] == slots and doc["acquires"] > 50 and doc["checked"] > doc["acquires"]
    assert doc["refusals"] > 0 if slots < 18 else doc["refusals"] == 0  # 18: every blob fits
    assert doc["blobs_read"] == doc["misses"] + doc["prefetched"]
    assert doc["bytes_read"] == doc["blobs_read"] * 16384


@pytest.mark.usefixtures("smoe_stream")
def test_blobs_larger_than_a_read_chunk(tmp_path: Path) -> None:
    """Blobs of over 1 MiB are read in several pieces, by several threads at once."""
    big = make_vault(tmp_path / "big.smoe", layers=2, experts=3, top_k=2, ffn=12288)
    for threads in (1, 4):
        doc = cache_check(SMOE_STREAM, big, 2, 120, threads, "--io-threads", threads, "--direct")
        assert doc["acquires"] > 10 and doc["misses"] > 10
        assert doc["bytes_read"] == doc["blobs_read"] * (big.stat().st_size - 16384) // 6


def test_held_blobs_stay_intact_under_sanitizers(make: Callable[..., None], vault: Path) -> None:
    make("build/asan/smoe-stream")
    for threads in (1, 4):
        doc = cache_check(ASAN, vault, 3, 300, threads, "--io-threads", threads, "--direct")
        assert doc["acquires"] > 30 and doc["refusals"] > 0


@pytest.mark.usefixtures("smoe_stream")
def test_direct_reads_where_taken_else_one_warning(vault: Path, tmp_path: Path) -> None:
    """Wherever the tests run, --direct either reads with O_DIRECT or says once why not."""
    steps = random_steps(np.random.default_rng(3), 30, 3, 6, 2)
    trace = write_trace(tmp_path / "t.jsonl", vault, steps)
    proc = run(
        vault,
        trace,
        "--cache-slots",
        5,
        "--direct",
        "--json",
        "--policy",
        "lru",
        command=[SMOE_STREAM, "replay"],
    )
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    assert (doc["hits"], doc["misses"]) == lru(steps, 5)
    if doc["direct"]:
        assert proc.stderr == ""
    else:
        assert proc.stderr == (
            f"smoe-stream: warning: {vault}: O_DIRECT refused (Invalid argument); "
            "using buffered reads\n"
        )


@pytest.fixture(scope="module")
def no_direct(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """harness/tests/no_direct_preload.c built for LD_PRELOAD: O_DIRECT refused (EINVAL) at
    open or at read, as $SMOE_NO_DIRECT says."""
    lib = tmp_path_factory.mktemp("preload") / "no_direct.so"
    src = ROOT / "harness" / "tests" / "no_direct_preload.c"
    proc = run("-shared", "-fPIC", "-O1", "-o", lib, src, "-ldl", command=["cc"])
    assert proc.returncode == 0, proc.stderr
    return lib


@pytest.mark.usefixtures("smoe_stream")
@pytest.mark.parametrize("where", ["open", "read"])
def test_direct_refused_reads_buffered_with_one_warning(
    vault: Path, tmp_path: Path, no_direct: Path, where: str
) -> None:
    steps = random_steps(np.random.default_rng(4), 30, 3, 6, 2)
    trace = write_trace(tmp_path / "t.jsonl", vault, steps)
    env = plain_env(LD_PRELOAD=str(no_direct), SMOE_NO_DIRECT=where)
    proc = run(
        *(vault, trace, "--cache-slots", 4, "--direct", "--json", "--policy", "lru"),
        command=[SMOE_STREAM, "replay"],
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    assert doc["direct"] is False and (doc["hits"], doc["misses"]) == lru(steps, 4)
    assert proc.stderr == (
        f"smoe-stream: warning: {vault}: O_DIRECT refused (Invalid argument); "
        "using buffered reads\n"
    )
    proc = run("cache-check", vault, 3, 200, 1, "--direct", command=[SMOE_STREAM], env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["direct"] is False
