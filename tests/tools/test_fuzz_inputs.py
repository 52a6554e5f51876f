"""The input-fuzzing targets (fuzz/inputs_target.py): short seeded runs and their mutators."""

from __future__ import annotations

import json
import os
import random
import struct
import sys
import time
import warnings
from pathlib import Path

import pytest
from safetensors import safe_open

from smoe.errors import SmoeError

from fixtures_data import ROOT

sys.path.insert(0, str(ROOT))  # fuzz/ is not installed
from fuzz import config_mutators as cm
from fuzz import st_mutators as sm
from fuzz.inputs_target import run
from fuzz.oracle import attempt
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
@pytest.mark.parametrize("target, seed, cases", [("safetensors", 7, 30), ("config", 7, 50)])
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
