"""The input-fuzzing targets (fuzz/inputs_target.py, fuzz/sidecar_target.py): short seeded
runs, their judges and their mutators."""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open

from smoe.errors import SmoeError

from fixtures_data import ROOT

sys.path.insert(0, str(ROOT))  # fuzz/ is not installed
from fuzz import config_mutators as cm
from fuzz import sidecar_mutators as sidem
from fuzz import sidecar_target as side
from fuzz import st_mutators as sm
from fuzz.inputs_target import run
from fuzz.oracle import CaseReport, attempt
from fuzz.st_target import CHECKPOINTS

SHARD = CHECKPOINTS / "qwen3_moe" / "model.safetensors"
CONFIG = json.loads((CHECKPOINTS / "qwen3_moe" / "config.json").read_text())


class Members(list):
    """A JSON object as its (key, value) members, duplicates kept."""


def pairs(blob: bytes) -> list[tuple[str, object]]:
    """The header's top-level members in order, duplicates kept (entries as dicts)."""
    (n,) = struct.unpack("<Q", blob[:8])
    top = json.loads(blob[8 : 8 + n], object_pairs_hook=Members)
    return [(k, dict(v) if isinstance(v, Members) else v) for k, v in top]


def shard() -> sm.Shard:
    return sm.Shard.parse(SHARD.read_bytes())


def safetensors_refuses(tmp_path: Path, blob: bytes) -> bool:
    p = tmp_path / "x.safetensors"
    p.write_bytes(blob)
    try:
        with safe_open(str(p), framework="numpy") as f:
            f.keys()
    except Exception:
        return True
    return False


# ---- whole targets ----------------------------------------------------------------------
@pytest.mark.parametrize("target, seed, cases", [("safetensors", 7, 8), ("config", 7, 12)])
def test_target_finds_nothing_and_decides_both_ways(
    tmp_path: Path, target: str, seed: int, cases: int
) -> None:
    result = run(
        target, cases, 1e9, seed, tmp_path / "work", tmp_path / "repro", cli_every=cases
    )  # case 0 also goes through the CLI
    assert result["failures"] == [], "\n".join(result["failures"])
    assert result["ok"] and result["cases"] == cases and result["cli_runs"] == 1
    assert result["refused"] > 0 and result["accepted"] > 0
    if target == "safetensors":
        assert result["reference_refused"] > 0 and result["reference_accepted"] > 0
    else:
        assert result["expect_refuse"] > 0 and result["expect_same"] > 0
    assert not (tmp_path / "repro" / target).exists()


def test_a_failure_leaves_a_reproducer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import smoe.sculpt.source.checkpoint

    def broken(root: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(smoe.sculpt.source.checkpoint.Checkpoint, "open", broken)
    result = run("safetensors", 1, 1e9, 3, tmp_path / "work", tmp_path / "repro", cli_every=0)
    assert result["failure_count"] == 1 and not result["ok"]
    assert "Checkpoint.open: exception: KeyError: 'boom'" in result["failures"][0]
    saved = tmp_path / "repro" / "safetensors" / "s3-c0"
    info = json.loads((saved / "case.json").read_text())
    assert info["replay"] == "python -m fuzz.inputs_target safetensors --seed 3 --case 0"
    assert (saved / info["base"] / "config.json").is_file()


# ---- the oracle -----------------------------------------------------------------------
def test_attempt_classifies_every_ending(tmp_path: Path) -> None:
    def refuse() -> None:
        raise SmoeError("x: refused")

    def crash() -> None:
        {}["k"]

    def warn() -> None:
        warnings.warn("overflow encountered", RuntimeWarning, stacklevel=1)

    def leak() -> None:
        leaked.append(os.open(tmp_path, os.O_RDONLY))

    def hang() -> None:
        while True:
            time.sleep(1)

    leaked: list[int] = []
    assert attempt(lambda: 5, 10).status == "accepted" and attempt(lambda: 5, 10).value == 5
    assert attempt(refuse, 10).line() == "refused: x: refused"
    assert attempt(crash, 10).line().startswith("exception: KeyError: 'k' (at test_fuzz_inputs")
    assert attempt(warn, 10).line().startswith("warning: RuntimeWarning: overflow encountered")
    assert attempt(warn, 10).line().endswith(", then accepted")
    assert attempt(leak, 10).line() == "fd_leak: 1 file descriptor(s) left open after accepted: "
    os.close(leaked[0])
    assert attempt(hang, 0.05).line() == "timeout: no verdict within 0.05 s"


# ---- safetensors mutators ---------------------------------------------------------------
def test_dump_keeps_duplicates_raw_text_and_surrogate_escapes() -> None:
    assert sm.dump(sm.Pairs((("a", 1), ("a", [sm.Raw("NaN")])))) == '{"a":1,"a":[NaN]}'
    assert sm.dump({"a\ud800": {"b": None}}) == '{"a\\ud800":{"b":null}}'


def test_duplicate_key_writes_a_key_twice(tmp_path: Path) -> None:
    seen = set()
    for seed in range(40):
        blob, what = sm.duplicate_key(random.Random(seed), shard())
        keys = [k for k, _ in pairs(blob)]
        twice = {k for k in keys if keys.count(k) > 1}
        assert len(twice) == 1 and what.startswith(f"key {twice.pop()!r} twice (")
        seen.add(what.rsplit("(", 1)[1])
    assert seen == {"exact-next)", "exact-end)", "other-first)", "other-last)", "metadata)"}


def test_name_invalid_writes_lone_surrogates_escaped_or_as_raw_bytes() -> None:
    escaped = raw = 0
    for seed in range(200):
        blob, what = sm.name_invalid(random.Random(seed), shard())
        if "\\ud800" in what and what.endswith("(raw UTF-8)"):
            assert b"\xed\xa0\x80" in blob  # not UTF-8: a surrogate encoded as bytes
            raw += 1
        elif '"a\\ud800"' in what:
            assert any(k == "a\ud800" for k, _ in pairs(blob))
            escaped += 1
    assert escaped and raw


def test_offsets_hole_keeps_sizes_but_breaks_contiguity(tmp_path: Path) -> None:
    s = shard()
    blob, what = sm.offsets_hole(random.Random(5), s)
    sizes = {k: sm._nbytes(v) for k, v in s.items if k != "__metadata__"}
    after = {k: sm._nbytes(v) for k, v in pairs(blob) if k != "__metadata__"}
    assert after == sizes and "-byte hole before " in what
    assert not safetensors_refuses(tmp_path, s.build())
    assert safetensors_refuses(tmp_path, blob)


def test_header_length_lies_or_repads() -> None:
    s = shard()
    true = len(s.build()) - 8 - len(s.data)
    for seed in range(30):
        blob, what = sm.header_length(random.Random(seed), s)
        (n,) = struct.unpack("<Q", blob[:8])
        if what.startswith("length prefix"):
            assert n != true and f"length prefix {n} (true {true}, " in what
        else:
            assert n % 8 and blob[8 + n :] == s.data


def test_every_safetensors_mutator_changes_the_file() -> None:
    original = SHARD.read_bytes()
    for name, mutator in sm.MUTATORS.items():
        blob, what = mutator(random.Random(11), shard())
        assert blob != original or what.startswith("unchanged"), name


# ---- config mutators --------------------------------------------------------------------
def test_respell_keeps_every_value() -> None:
    for seed in range(60):
        text, expect, key, _ = cm.respell(random.Random(seed), CONFIG)
        assert expect == "same" and json.loads(text) == CONFIG, key


def test_wrong_type_gives_another_json_type_or_a_bad_number() -> None:
    for seed in range(100):
        text, expect, key, what = cm.wrong_type(random.Random(seed), CONFIG)
        value = cm._get(json.loads(text), key)
        kind = cm.KINDS[key]
        good = {
            "bool": type(value) is bool,
            "count": type(value) is int and value >= 1,
            "count0": type(value) is int and value >= 0,
            "float": type(value) in (int, float) and abs(value) != float("inf") and value == value,
            "str": type(value) is str,
            "object": type(value) is dict,
        }[kind]
        assert expect == "refuse" and not good, what


def test_whole_file_faults() -> None:
    hows = {}
    for seed in range(80):
        raw, _, _, how = cm.whole_file(random.Random(seed), CONFIG)
        hows[how] = raw
    with pytest.raises(UnicodeDecodeError):
        hows["bad-utf8"].decode("utf-8")
    with pytest.raises(UnicodeDecodeError):
        hows["raw-surrogate"].decode("utf-8")
    assert not isinstance(json.loads(hows["not-object"]), dict)


def test_duplicate_config_key_is_written_twice() -> None:
    text, _, key, what = cm.duplicate_key(random.Random(2), CONFIG)
    members = json.loads(text, object_pairs_hook=lambda p: p)
    assert [k for k, _ in members].count(key) == 2 and f"{key} twice (" in what


def test_reads_follows_spellings_and_fallbacks() -> None:
    cfg = {
        "num_experts": 8,
        "num_local_experts": "x",
        "head_dim": 16,
        "hidden_size": 64,
        "rope_theta": 1e6,
        "rope_parameters": 5,
        "model_type": "qwen3_moe",
    }
    assert cm.reads(cfg, "num_experts", False)
    assert not cm.reads(cfg, "num_local_experts", False)
    assert not cm.reads(cfg, "hidden_size", False) and cm.reads(cfg, "head_dim", False)
    assert not cm.reads(cfg, "rope_parameters", False)
    assert cm.reads(cfg, "intermediate_size", True) and not cm.reads(
        cfg, "intermediate_size", False
    )
    assert not cm.reads(cfg, "num_experts", None)  # upgrade --config has no tensors to count
    case = cm.ConfigCase(b"", "refuse", "num_local_experts", "")
    assert cm.expectation(case, cfg, False) == "any"
    assert cm.expectation(case, {"num_local_experts": "x"}, False) == "refuse"


# ---- sidecars (fuzz/sidecar_target.py) ----------------------------------------------------------
@pytest.fixture(scope="module")
def sidecars(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict, side.Runner, Path]]:
    """The sidecar target's bases (a manifest, an interrupted sculpt's journal, an importance
    matrix when gguf is installed) and its fork server, for the hand-made mutations."""
    root = tmp_path_factory.mktemp("sidecars")
    with side.Runner() as runner:
        runner.start()
        bases = side.setup(root / "bases")
        yield bases, runner, root


def verdict(
    sidecars: tuple[dict, side.Runner, Path], kind: str, m: sidem.Mutation, base: int = 0
) -> tuple[list[str], dict[str, str]]:
    """The failures and per-reader verdicts of mutation ``m`` of base ``base`` of ``kind``."""
    bases, runner, root = sidecars
    if kind not in bases:
        pytest.skip(f"no {kind} base (gguf, the smoe[imatrix] extra, is missing)")
    b = bases[kind][base]
    rep = CaseReport(0, kind, "hand-made", m.what, "")
    side.check_case(rep, b, m, list(m.expect), side.Case(root / "case"), runner)
    return rep.failures, rep.detail


def manifest_doc(sidecars: tuple[dict, side.Runner, Path]) -> sidem.ManifestBase:
    view: sidem.ManifestBase = sidecars[0]["manifest"][0].mutate  # qwen3_moe, v2
    return view


def test_a_respelled_manifest_is_accepted_with_the_same_outputs(
    sidecars: tuple[dict, side.Runner, Path],
) -> None:
    view = manifest_doc(sidecars)
    raw = sidem.pretty(view.doc, 3, random.Random(1)).encode()
    expect = {"verify": "same", "export": "same", "report": "same"}
    failures, detail = verdict(sidecars, "manifest", sidem.Mutation(raw, expect, "respelled"))
    assert failures == [] and all("exit 0" in v for v in detail.values()), detail


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["experts"][3].__setitem__("crc32c", d["experts"][3]["crc32c"] ^ 1),
        lambda d: d["vault"].__setitem__("size", sidem.Raw(f"{d['vault']['size']}.0")),
        lambda d: d["experts"][1].__setitem__("layer", True),
        lambda d: d["experts"][0]["tensors"][0].__setitem__("snr_db", sidem.Raw("NaN")),
        lambda d: d["experts"].insert(2, d["experts"][2]),
        lambda d: d["experts"][5].__setitem__("offset", sidem.Raw("9" * 5000)),
        lambda d: d["experts"][2].__setitem__("tensors", d["experts"][1]["tensors"]),
        lambda d: d["experts"][4]["tensors"][2].__setitem__("index", 10**12),
    ],
    ids=[
        "crc",
        "float-size",
        "bool-layer",
        "nan",
        "duplicated",
        "5000-digits",
        "permuted",
        "index",
    ],
)
def test_broken_manifests_are_refused_cleanly(
    sidecars: tuple[dict, side.Runner, Path], change: Any
) -> None:
    doc = json.loads(manifest_doc(sidecars).raw)
    change(doc)
    m = sidem.Mutation(
        sidem.pretty(doc, None).encode(), {"verify": "refuse", "export": "refuse"}, ""
    )
    failures, detail = verdict(sidecars, "manifest", m)
    assert failures == [] and "exit 1" in detail["verify"] and "exit 1" in detail["export"], detail


def test_the_judge_catches_a_manifest_accepted_as_valid(
    sidecars: tuple[dict, side.Runner, Path],
) -> None:
    """An unchanged manifest said to be broken: exit 0 is a failure, named."""
    m = sidem.Mutation(manifest_doc(sidecars).raw, {"verify": "refuse"}, "unchanged")
    failures, _ = verdict(sidecars, "manifest", m)
    assert failures == ["verify: exit 0: accepted an input it must refuse"]


def test_a_forged_journal_line_is_redone_and_refused_files_are_clean(
    sidecars: tuple[dict, side.Runner, Path],
) -> None:
    view: sidem.JournalBase = sidecars[0]["journal"][0].mutate
    key = view.pending()[0]
    fields = view.full[key].rstrip(b"\n").split(b" ")
    fields[2] = str(sidem.crc32c_zeros(view.raw_sizes[key])).encode()  # its zeros' CRC
    forged = view.header + b"".join(view.lines) + b" ".join(fields) + b"\n"
    failures, detail = verdict(sidecars, "journal", sidem.Mutation(forged, sidem.RESUME, "forged"))
    assert failures == [] and "exit 0" in detail["resume"], detail  # a fresh run's bytes
    for special in ("dir", "devzero", "fifo"):
        m = sidem.Mutation(None, {"resume": "refuse"}, special, special=special)
        failures, detail = verdict(sidecars, "journal", m)
        assert failures == [] and "exit 1" in detail["resume"], (special, detail)


def test_importance_matrices_same_and_broken(sidecars: tuple[dict, side.Runner, Path]) -> None:
    if "imatrix" not in sidecars[0]:
        pytest.skip("gguf (the smoe[imatrix] extra) is missing")
    view: sidem.ImatrixBase = sidecars[0]["imatrix"][0].mutate  # GGUF
    form = view.form.copy()
    assert isinstance(form, sidem.GgufFile)
    for t in form.tensors:  # sums and counts doubled: the very same importance
        if t.name.endswith((".in_sum2", ".counts")):
            t.data = (np.frombuffer(t.data, "<f4") * 2).astype("<f4").tobytes()
    m = sidem.Mutation(form.bytes(), {"imatrix": "same"}, "doubled", form=form)
    failures, detail = verdict(sidecars, "imatrix", m)
    assert failures == [] and "exit 0" in detail["imatrix"], detail
    raw, fields = view.form.build()
    n_kv = next(f for f in fields if f.kind == "n_kv")
    nan = view.form.copy()
    nan.tensors[0].data = b"\x00\x00\xc0\x7f" + nan.tensors[0].data[4:]
    for what, broken in (
        ("n_kv 2^64-1", sidem._patch(raw, n_kv, 2**64 - 1)),
        ("truncated", raw[: len(raw) // 2]),
        ("NaN sum", nan.bytes()),
    ):
        failures, detail = verdict(
            sidecars, "imatrix", sidem.Mutation(broken, {"imatrix": "refuse"}, what)
        )
        assert failures == [] and "exit 1" in detail["imatrix"], (what, detail)


def test_the_judge_of_one_command() -> None:
    def run(rc: int, err: str = "", out: str = "", **kw: Any) -> side.Run:
        return side.Run(["x"], rc, out, err, 0.1, **kw)

    ok = lambda expect: None  # noqa: E731
    assert side.judge("export", "refuse", run(1, "error: x: refused\n"), ok) is None
    assert side.judge("export", "any", run(2, "error: x: a FIFO\n"), ok) is None
    assert side.judge("verify", "refuse", run(1, "", "x: INVALID (1 errors)\n"), ok) is None
    assert side.judge("export", "same", run(0), lambda e: "differs") == "differs"
    problems = {
        "refuse": run(0),
        "valid": run(1, "error: x\n"),
        "any": run(1, "error: x\nmore\n"),
    }
    for expect, r in problems.items():
        assert side.judge("export", expect, r, ok), expect
    for r, words in (
        (run(1, "Traceback (most recent call last):\nKeyError\n"), "traceback"),
        (run(1, "error: internal error: KeyError: 'k'\n"), "internal error"),
        (run(1, "error: internal error: MemoryError\n"), "memory"),
        (run(-9), "signal 9"),
        (run(3, "error: x\n"), "exit 3"),
        (run(0, timed_out=True), "no verdict"),
        (run(0, peak_kb=900 << 10, base_kb=100 << 10), "grew by 800 MiB"),
    ):
        problem = side.judge("export", "any", r, ok)
        assert problem and words in problem, (words, problem)


def _alloc(argv: list[str]) -> int:
    bytearray(3 << 30)  # beyond the cap
    return 0


def _hang(argv: list[str]) -> int:
    time.sleep(60)
    return 0


def test_the_fork_server_caps_memory_and_time(tmp_path: Path) -> None:
    """A child past its address-space budget fails (MemoryError), one past its time is
    killed; both are failures of the judge."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        req = {
            "argv": [],
            "cwd": str(tmp_path),
            "stdout": str(tmp_path / "out"),
            "stderr": str(tmp_path / "err"),
            "timeout": 30,
            "budget": 256 << 20,
        }
        reply = side._fork_one(req, _alloc, devnull)
        err = (tmp_path / "err").read_text()
        assert reply["rc"] == 70 and "MemoryError" in err
        reply = side._fork_one({**req, "timeout": 0.3}, _hang, devnull)
        assert reply["timed_out"] and reply["rc"] == -signal.SIGKILL
    finally:
        os.close(devnull)


def test_sidecar_target_finds_nothing_and_decides_both_ways(tmp_path: Path) -> None:
    result = side.run(24, 1e9, 10, tmp_path / "work", tmp_path / "repro", fresh_every=24)
    assert result["failures"] == [], "\n".join(result["failures"])  # case 0 in fresh processes
    assert result["ok"] and result["cases"] == 24 and result["fresh_cases"] == 1
    assert result["refused"] > 0 and result["accepted"] > 0
    assert result["expect_refuse"] > 0 and result["expect_same"] > 0
    assert {k.split(":")[0] for k in result["by_mutator"]} >= {"manifest", "journal"}
    assert not (tmp_path / "repro" / "sidecar").exists()


def test_a_sidecar_failure_leaves_a_reproducer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(side, "judge", lambda *a: "boom")
    result = side.run(1, 1e9, 3, tmp_path / "work", tmp_path / "repro")
    assert result["failure_count"] == 1 and not result["ok"]
    saved = tmp_path / "repro" / "sidecar" / "s3-c0"
    info = json.loads((saved / "case.json").read_text())
    assert info["replay"] == "python -m fuzz.sidecar_target --seed 3 --case 0"
    assert info["failures"][0].endswith(": boom") and info["cli"]
    assert (saved / "in").is_dir()


def test_sidecar_mutators_keep_what_they_promise(sidecars: tuple[dict, side.Runner, Path]) -> None:
    """Respelled manifests parse to the same document; GGUF field lies change one number;
    the journal's forged lines name experts the partial lacks."""
    view = manifest_doc(sidecars)
    for seed in range(20):
        m = sidem.respell(random.Random(seed), view)
        assert json.loads(m.raw or b"") == view.doc and set(m.expect.values()) == {"same"}
    if "imatrix" in sidecars[0]:
        im: sidem.ImatrixBase = sidecars[0]["imatrix"][0].mutate
        raw = im.form.bytes()
        for seed in range(20):
            m = sidem.field_lie(random.Random(seed), im)
            assert m.raw is not None and len(m.raw) == len(raw) and m.raw != raw, m.what
    journal: sidem.JournalBase = sidecars[0]["journal"][0].mutate
    for seed in range(10):
        m = sidem.forge_line(random.Random(seed), journal)
        assert m.raw is not None and m.raw.startswith(journal.header)
        assert len(m.raw.splitlines()) == len(journal.lines) + 2
