"""`smoe-stream replay`: a routing trace streamed through the real expert cache (real reads,
no compute). Its counters equal a Python model of the same cache exactly (LRU), Belady's
optimum equals a Python reference, no policy beats Belady, and every bad input (a trace of
another vault, a malformed line, a cache below one layer's top-k, a bad command line) is
refused in one line, with a valid JSON error document under --json."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from stream_traces import belady, header, lru, make_vault, random_steps, write_trace

from smoe.format.plan import make_plan
from smoe.format.records import ArchInfo, ModelInfo, metadata_bytes

from fixtures_data import ROOT
from helpers import SMOE_STREAM, refused, run, strict_json

PAGE = 16384
LAYERS, EXPERTS, TOP_K = 3, 6, 2


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_vault(tmp_path_factory.mktemp("replay") / "v.smoe", LAYERS, EXPERTS, TOP_K)


@pytest.fixture(scope="module")
def steps() -> list[tuple[int, list[int]]]:
    return random_steps(np.random.default_rng(7), 40, LAYERS, EXPERTS, TOP_K)


def replay(*args: object, code: int = 0) -> dict:
    proc = run(*args, "--json", command=[SMOE_STREAM, "replay"])
    assert proc.returncode == code, proc.stderr
    return strict_json(proc.stdout)


@pytest.mark.usefixtures("smoe_stream")
@pytest.mark.parametrize("slots", [TOP_K, 3, 5, 8, LAYERS * EXPERTS])
def test_lru_counters_equal_the_python_model(vault: Path, steps, slots: int, tmp_path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", vault, steps)
    doc = replay(vault, trace, "--cache-slots", slots, "--policy", "lru")
    hits, misses = lru(steps, slots)
    b_hits, b_misses = belady(steps, slots)
    assert doc["schema"] == "smoe-replay/1" and doc["ok"] is True
    assert (doc["hits"], doc["misses"]) == (hits, misses)
    assert (doc["blobs_read"], doc["bytes_read"]) == (misses, misses * PAGE)
    assert doc["requests"] == hits + misses == len(steps) * TOP_K
    assert doc["steps"] == len(steps) and doc["slots"] == slots
    assert doc["belady_hits"] == b_hits and doc["belady_hit_rate"] == b_hits / (b_hits + b_misses)
    assert doc["hit_rate"] == hits / (hits + misses)


@pytest.mark.usefixtures("smoe_stream")
@pytest.mark.parametrize("policy", ["lru", "cycle"])
@pytest.mark.parametrize("slots", [TOP_K, 4, 7])
def test_no_policy_beats_belady(vault: Path, policy: str, slots: int, tmp_path) -> None:
    steps = random_steps(np.random.default_rng(slots), 60, LAYERS, EXPERTS, TOP_K)
    trace = write_trace(tmp_path / "t.jsonl", vault, steps)
    doc = replay(vault, trace, "--cache-slots", slots, "--policy", policy)
    assert doc["hits"] + doc["misses"] == len(steps) * TOP_K
    assert doc["hits"] <= doc["belady_hits"] == belady(steps, slots)[0]
    assert doc["bytes_read"] == doc["misses"] * PAGE
    if doc["belady_hits"]:
        assert doc["of_belady"] == pytest.approx(doc["hit_rate"] / doc["belady_hit_rate"])
    else:
        assert doc["of_belady"] is None


@pytest.mark.usefixtures("smoe_stream")
def test_a_step_larger_than_the_cache_is_read_in_batches(vault: Path, tmp_path) -> None:
    # a prefill chunk's union: all six experts of a layer through a cache of four slots
    steps = [(0, list(range(EXPERTS))), (1, [0, 1]), (0, list(range(EXPERTS)))]
    trace = write_trace(tmp_path / "t.jsonl", vault, steps)
    doc = replay(vault, trace, "--cache-slots", 4, "--policy", "lru")
    assert (doc["hits"], doc["misses"]) == lru(steps, 4)
    assert doc["belady_hits"] == belady(steps, 4)[0]


@pytest.mark.usefixtures("smoe_stream")
def test_hint_lines_prefetch_and_leave_belady_alone(vault: Path, steps, tmp_path) -> None:
    """A hint line (the engine's guess of a layer's experts before it routes) prefetches on
    the spare I/O threads; Belady's demand-paging optimum leaves hints out."""
    plain = write_trace(tmp_path / "plain.jsonl", vault, steps)
    lines = plain.read_text().splitlines()
    hinted = [lines[0]]
    for line in lines[1:]:  # each step hinted right before it, perfectly
        step = json.loads(line)
        hinted += [
            json.dumps({**{k: step[k] for k in ("token", "layer")}, "hint": step["experts"]})
        ]
        hinted.append(line)
    trace = tmp_path / "hinted.jsonl"
    trace.write_text("\n".join(hinted) + "\n")
    base = replay(vault, plain, "--cache-slots", 4, "--io-threads", 2)
    doc = replay(vault, trace, "--cache-slots", 4, "--io-threads", 2)
    assert doc["steps"] == base["steps"] == len(steps) and doc["hints"] == len(steps)
    assert doc["belady_hits"] == base["belady_hits"] and doc["requests"] == base["requests"]
    assert doc["misses"] == 0 and doc["prefetched"] == doc["blobs_read"] > 0  # all prefetched
    one = replay(vault, trace, "--cache-slots", 4, "--io-threads", 1)  # no spare thread
    assert one["prefetched"] == 0 and (one["hits"], one["misses"]) == (base["hits"], base["misses"])


@pytest.mark.usefixtures("smoe_stream")
def test_cache_mb_counts_whole_slots(vault: Path, steps, tmp_path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", vault, steps)
    doc = replay(vault, trace, "--cache-mb", 1)  # 1 MiB = 64 slots of 16 KiB, more than 18 blobs
    assert doc["slots"] == LAYERS * EXPERTS and doc["slot_bytes"] == PAGE
    assert doc["misses"] == len({(lay, e) for lay, es in steps for e in es})  # cold misses only


@pytest.mark.usefixtures("smoe_stream")
def test_text_report(vault: Path, steps, tmp_path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", vault, steps)
    proc = run(vault, trace, "--cache-slots", 4, command=[SMOE_STREAM, "replay"])
    assert proc.returncode == 0, proc.stderr
    hits, misses = belady(steps, 4)
    assert f"Belady {hits / (hits + misses):.4f}" in proc.stdout
    assert "policy cycle, 4 slots of 16384 bytes" in proc.stdout


# ---- refusals ---------------------------------------------------------------------------


def replay_refused(vault: Path, trace: Path, *extra: object, code: int = 1) -> str:
    args = (vault, trace, *extra)
    line = refused(run(*args, command=[SMOE_STREAM, "replay"]), code)
    doc = replay(*args, code=code)
    assert doc["ok"] is False and doc["error"]["exit_code"] == code
    return line


@pytest.mark.usefixtures("smoe_stream")
def test_a_trace_of_another_vault_is_refused(vault: Path, steps, tmp_path) -> None:
    # the id covers the header and the expert table: another layout (here its experts' width)
    other = make_vault(tmp_path / "other.smoe", LAYERS, EXPERTS, TOP_K, ffn=40)
    trace = write_trace(tmp_path / "t.jsonl", other, steps)
    line = replay_refused(vault, trace, "--cache-slots", 4)
    assert line.startswith(f"smoe-stream: {trace}: line 1: a trace of another vault (its id ")
    assert line.endswith(f", {vault}'s {header(vault)['vault']['id']})")


@pytest.mark.usefixtures("smoe_stream")
def test_a_cache_below_one_layers_top_k_is_refused(vault: Path, steps, tmp_path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", vault, steps)
    line = replay_refused(vault, trace, "--cache-slots", TOP_K - 1)
    assert line == (
        f"smoe-stream: {vault}: a cache of 1 slots is below one layer's top-k "
        f"({TOP_K} blobs of {PAGE} bytes)"
    )
    line = replay_refused(vault, trace, "--cache-mb", 0)
    assert "a cache of 0 slots is below one layer's top-k" in line


@pytest.mark.usefixtures("smoe_stream")
def test_a_cache_beyond_the_machines_memory_is_refused(tmp_path: Path) -> None:
    """A 113 GB vault (sparse: only its metadata is written), every blob asked to be cached:
    refused before the ring is allocated."""
    d_model, ffn, layers, experts = 4096, 1536, 48, 240
    shapes = ((ffn, d_model), (ffn, d_model), (d_model, ffn))
    plan = make_plan(
        {(lay, e): shapes for lay in range(layers) for e in range(experts)}, bits=4, version=2
    )
    model = ModelInfo(layers, experts, d_model, 151936, ffn)
    arch = ArchInfo(1e6, 32, 4, 128, 8, ffn, layers, 1e-6, "qwen3_moe")
    huge = tmp_path / "huge.smoe"
    with open(huge, "wb") as f:
        f.write(metadata_bytes(plan, model, arch))
        f.truncate(plan.file_size)
    trace = write_trace(tmp_path / "t.jsonl", huge, [(0, list(range(8)))])
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    slot = max(e.padded_size for e in plan.experts)
    assert layers * experts * slot > memory, "a machine with more memory than this test assumes"
    line = replay_refused(huge, trace, "--cache-slots", layers * experts)
    assert line == (
        f"smoe-stream: {huge}: a cache of {layers * experts} slots of {slot} bytes is more "
        f"than this machine's {memory} bytes of memory"
    )


GOOD = '{"token": 0, "layer": 0, "experts": [0, 1]}'
MALFORMED: dict[str, tuple[str, str]] = {
    "not json": ("{token", "line 3: "),
    "trailing garbage": (GOOD + " x", "line 3: "),
    "no experts key": ('{"token": 0, "layer": 0}', "line 3: experts missing"),
    "empty experts": ('{"token": 0, "layer": 0, "experts": []}', "line 3: no experts"),
    "negative token": ('{"token": -1, "layer": 0, "experts": [0]}', "line 3: token is not"),
    "huge layer": ('{"token": 0, "layer": 4294967296, "experts": [0]}', "line 3: layer is not"),
    "unknown layer": ('{"token": 0, "layer": 7, "experts": [0]}', "line 3: no expert 0 in layer 7"),
    "unknown expert": (
        '{"token": 0, "layer": 0, "experts": [6]}',
        "line 3: no expert 6 in layer 0",
    ),
    "repeated expert": ('{"token": 0, "layer": 1, "experts": [2, 2]}', "line 3: expert 2 repeated"),
    "too many experts": (
        '{"token": 0, "layer": 1, "experts": [0, 1, 2, 3, 4, 5, 0]}',
        "line 3: more experts than the router's 6",
    ),
    "experts and hint": (
        '{"token": 0, "layer": 0, "experts": [0], "hint": [1]}',
        "line 3: both experts and hint",
    ),
    "hint not an array": ('{"token": 0, "layer": 0, "hint": 1}', "line 3: hint is not an array"),
    "fractional expert": ('{"token": 0, "layer": 0, "experts": [1.5]}', "line 3: expert is not"),
    "an array": ("[1, 2]", "line 3: "),
    "too deep": ('{"token": 0, "layer": 0, "experts": [[[[[0]]]]]}', "line 3: "),
    "too long": ('{"token": 0, "pad": "' + "x" * 70000 + '"}', "line 3: longer than 65536 bytes"),
}


@pytest.mark.usefixtures("smoe_stream")
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_line_is_refused_naming_it(vault: Path, case: str, tmp_path) -> None:
    bad, words = MALFORMED[case]
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(header(vault)) + "\n" + GOOD + "\n" + bad + "\n" + GOOD + "\n")
    line = replay_refused(vault, trace, "--cache-slots", 4)
    assert line.startswith(f"smoe-stream: {trace}: {words}"), line


HEADERS: dict[str, Callable[[dict], object]] = {
    "another schema": lambda h: {**h, "schema": "smoe-trace/2"},
    "no vault": lambda h: {"schema": h["schema"]},
    "no id": lambda h: {**h, "vault": {k: v for k, v in h["vault"].items() if k != "id"}},
    "another size": lambda h: {**h, "vault": {**h["vault"], "size": h["vault"]["size"] + 1}},
    "another top_k": lambda h: {**h, "vault": {**h["vault"], "top_k": 3}},
    "id a number": lambda h: {**h, "vault": {**h["vault"], "id": 5}},
}


@pytest.mark.usefixtures("smoe_stream")
@pytest.mark.parametrize("case", sorted(HEADERS))
def test_a_bad_first_line_is_refused(vault: Path, case: str, tmp_path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", vault, [(0, [0, 1])], HEADERS[case](header(vault)))
    line = replay_refused(vault, trace, "--cache-slots", 4)
    assert line.startswith(f"smoe-stream: {trace}: line 1: "), line


@pytest.mark.usefixtures("smoe_stream")
def test_an_empty_trace_is_refused(vault: Path, tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    line = replay_refused(vault, trace, "--cache-slots", 4)
    assert line == f"smoe-stream: {trace}: line 1: empty: no smoe-trace/1 header line"


@pytest.mark.usefixtures("smoe_stream")
@pytest.mark.parametrize(
    "args, words",
    [
        ((), "replay: one of --cache-mb and --cache-slots expected"),
        (("--cache-mb", 1, "--cache-slots", 4), "replay: one of --cache-mb and --cache-slots"),
        (("--cache-slots", 4, "--policy", "fifo"), "--policy: invalid choice: 'fifo'"),
        (("--cache-slots", 4, "--io-threads", 0), "--io-threads: 1..64"),
        (("--cache-slots", "many"), "--cache-slots: not a valid number: 'many'"),
        (("--cache-slots", 4, "--bogus"), "replay: unknown option --bogus"),
    ],
)
def test_usage_errors_exit_2(vault: Path, steps, args: tuple, words: str, tmp_path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", vault, steps)
    line = replay_refused(vault, trace, *args, code=2)
    assert line.startswith(f"error: {words}"), line
    assert line.endswith(" (see smoe-stream --help)")


def documented(section: str) -> set[str]:
    """Every key named in the first column of the table under ``## section`` of docs/JSON.md
    (a cell may name several: `a`, `b`; `vault.size` names `size` of `vault`)."""
    text = (ROOT / "docs" / "JSON.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"^\| ([^|]+) \|", body, re.M)
    return {k for c in cells for k in re.findall(r"`([a-z_.]+)`", c)}


@pytest.mark.usefixtures("smoe_stream")
def test_documents_have_the_documented_keys(vault: Path, steps, tmp_path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", vault, steps)
    assert set(replay(vault, trace, "--cache-slots", 4)) == documented("Replay document")
    first = header(vault)
    keys = {*first, *(f"vault.{k}" for k in first["vault"]), "token", "layer", "experts", "hint"}
    assert documented("Routing trace") == keys - {"vault"}


def test_mutated_traces_never_crash(make, vault: Path, steps, tmp_path) -> None:
    """Seeded byte flips, cuts and splices of a good trace, replayed by the sanitized build:
    each one replays (exit 0) or is refused in one line naming its trace (exit 1)."""
    make("build/asan/smoe-stream")
    good = write_trace(tmp_path / "good.jsonl", vault, steps[:12]).read_bytes()
    rng = np.random.default_rng(11)
    trace = tmp_path / "t.jsonl"
    seen = set()
    for case in range(48):
        data = bytearray(good)
        for _ in range(1 + case % 4):
            at = int(rng.integers(len(data)))
            what = case % 3
            if what == 0:
                data[at] = int(rng.integers(256))
            elif what == 1:
                del data[at : at + int(rng.integers(1, 40))]
            else:
                data[at:at] = data[int(rng.integers(len(data))) :][: int(rng.integers(1, 40))]
        trace.write_bytes(bytes(data))
        proc = run(
            vault, trace, "--cache-slots", 3, command=[ROOT / "build/asan/smoe-stream", "replay"]
        )
        seen.add(proc.returncode)
        if proc.returncode != 0:
            line = refused(proc, 1)
            assert line.startswith(f"smoe-stream: {trace}: line "), line
    assert seen <= {0, 1} and 1 in seen


@pytest.mark.usefixtures("smoe_stream")
@pytest.mark.parametrize("slots", [2, 3, 7, 16])
def test_replay_of_generates_own_trace_counts_the_same(tmp_path: Path, slots: int) -> None:
    """generate --trace writes what its cache was asked (prefill unions included), so
    replaying that trace through the same cache gives generate's own counts and Belady."""
    made = run("sculpt", ROOT / "fixtures" / "checkpoints" / "qwen3_moe", tmp_path, "--name", "d")
    assert made.returncode == 0, made.stderr
    vault, trace = tmp_path / "d.smoe", tmp_path / "t.jsonl"
    prompt = ",".join(map(str, range(1, 11)))
    gen = run(
        *(vault, "--prompt", prompt, "--max-new", 24, "--cache-slots", slots),
        *("--trace", trace, "--json"),
        command=[SMOE_STREAM, "generate"],
    )
    assert gen.returncode == 0, gen.stderr
    cache = strict_json(gen.stdout)["cache"]
    doc = replay(vault, trace, "--cache-slots", slots)
    assert (doc["hits"], doc["misses"], doc["bytes_read"]) == (
        cache["hits"],
        cache["misses"],
        cache["bytes"],
    )
    assert doc["belady_hit_rate"] == cache["belady_hit_rate"]
