"""The C++ harness `smoe-stream` (harness/*.cpp) against the fixtures and the Python side.

* `check --json` agrees with MANIFEST.json and the Kaitai reference parser; `--deep`
  accepts every good fixture and rejects every corrupt one with EXPECTED.json's code,
  field and offset (also under ASan/UBSan, with no sanitizer report).
* `dequant` is bit-identical to `smoe.quant.decode`; `forward` matches a numpy SwiGLU.
* A seeded mutation run (the hidden `fuzz` subcommand, one forked child per input under
  alarm()) never crashes, hangs or trips a sanitizer.
"""

from __future__ import annotations

import json
import random
import statistics
import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from smoe.format.plan import make_plan
from smoe.format.records import ArchInfo, ModelInfo, metadata_bytes
from smoe.quant import decode
from smoe.vault.writer import write_vault
from smoe_gen import layout
from smoe_gen.smoe_kaitai import Smoe

from fixtures_data import BAD, CORRUPT, EXPECTED, FIXTURES, GOOD, MANIFEST, ROOT, boundary_values
from helpers import SMOE_STREAM, bytes_read, plain_env, run
from kaitai_names import kaitai_field
from rule_cases import RULE_CASES, _en, _h, apply

BIN = SMOE_STREAM
ASAN_BIN = ROOT / "build" / "asan" / "smoe-stream"
SANITIZER_ENV = plain_env(
    # exit codes of their own, so a report can never pass for "invalid" (1); allocations
    # above 256 MiB are reported as errors (a fixture never justifies one)
    ASAN_OPTIONS="exitcode=86:max_allocation_size_mb=256:detect_leaks=1",
    UBSAN_OPTIONS="exitcode=87:print_stacktrace=1",
)
SANITIZER_MARKS = ("runtime error", "AddressSanitizer", "LeakSanitizer", "UndefinedBehavior")
TENSORS = ("gate", "up", "down")


@pytest.fixture(scope="module", autouse=True)
def built(make: Callable[..., None]) -> None:
    make("build", "build-asan")


def first_error(stdout: str) -> dict:
    """The one error of a failed `check --json` (docs/JSON.md): C++ stops at the first."""
    doc = json.loads(stdout)
    assert doc["schema"] == "smoe-findings/1" and doc["valid"] is False and doc["errors"] == 1
    (err,) = [f for f in doc["findings"] if f["severity"] == "error"]
    return err


def assert_clean(stderr: str) -> None:
    for mark in SANITIZER_MARKS:
        assert mark not in stderr, stderr


# ---------------------------------------------------------------------------- weights


def python_weights(path: Path, index: int) -> list[np.ndarray]:
    """The three matrices of table entry `index`, decoded by the normative Python decoder."""
    s = Smoe.from_file(str(path))
    try:
        bits = s.header.bits
        out = []
        for t in s.experts[index].tensors:
            packed = np.frombuffer(t.packed, np.uint8)
            scales = np.frombuffer(t.scales, "<f2")
            out.append(decode(packed, scales, bits, (t.num_rows, t.num_cols)))
        return out
    finally:
        s.close()


def swiglu(mats: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    gate, up, down = (m.astype(np.float64) for m in mats)
    g, u = gate @ x, up @ x
    return down @ (g / (1.0 + np.exp(-g)) * u)


def experts_of(name: str) -> list[dict]:
    return MANIFEST[name]["experts"]


# ---------------------------------------------------------------------------- check


@pytest.mark.parametrize("name", GOOD)
def test_check_json_matches_manifest_and_kaitai(name: str) -> None:
    r = run("check", FIXTURES / name, "--json", command=[BIN])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    m = MANIFEST[name]
    assert out["valid"] is True
    assert out["size"] == m["size"]
    assert out["header"] == m["header"]
    if m["arch"] is None:
        assert out["arch"] is None
    else:
        for key, value in m["arch"].items():
            assert out["arch"][key] == value, key
    assert out["experts"] == len(m["experts"])
    layers = Counter(e["layer_id"] for e in m["experts"])
    assert {d["layer_id"]: d["experts"] for d in out["layers"]} == dict(layers)
    h = m["header"]
    assert out["partial"] == (len(m["experts"]) < h["num_moe_layers"] * h["max_experts_per_layer"])

    s = Smoe.from_file(str(FIXTURES / name))
    try:
        assert s.header.magic.hex() == out["header"]["magic"]
        for key in out["header"]:
            if key != "magic":
                assert kaitai_field(s.header, key) == out["header"][key], key
        if s.header.version >= 2:
            for key in (
                "block_version",
                "block_size",
                "flags",
                "rope_theta",
                "num_heads",
                "num_kv_heads",
                "head_dim",
                "moe_top_k",
                "moe_ffn_dim",
                "dense_ffn_dim",
                "shared_expert_ffn_dim",
                "num_hidden_layers",
                "rms_norm_eps",
                "model_type",
            ):
                assert kaitai_field(s.arch, key) == out["arch"][key], key
            assert s.arch.norm_topk_prob == out["arch"]["norm_topk_prob"]
            assert s.arch.has_qk_norm == out["arch"]["has_qk_norm"]
            assert s.arch.has_dense_layer_0 == out["arch"]["has_dense_layer_0"]
        assert len(s.experts) == out["experts"]
    finally:
        s.close()


@pytest.mark.parametrize("name", GOOD)
def test_check_deep_accepts_good_fixtures(name: str) -> None:
    r = run("check", "--deep", FIXTURES / name, command=[BIN])
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


@pytest.mark.parametrize("name", BAD)
def test_corrupt_fixture_names_code_field_offset(name: str) -> None:
    exp = EXPECTED[name]
    for binary, env in ((BIN, None), (ASAN_BIN, SANITIZER_ENV)):
        r = run("check", "--deep", CORRUPT / name, command=[binary], env=env)
        assert_clean(r.stderr)
        assert r.returncode == 1, r.stderr
        lines = r.stderr.splitlines()
        assert len(lines) == 1, r.stderr
        prefix = f"smoe-stream: {CORRUPT / name}: {exp['code']} at offset {exp['offset']} "
        assert lines[0].startswith(prefix + f"({exp['field']}): "), lines[0]


@pytest.mark.parametrize("name", BAD)
def test_corrupt_fixture_json_error(name: str) -> None:
    exp = EXPECTED[name]
    r = run("check", "--deep", "--json", CORRUPT / name, command=[BIN])
    assert r.returncode == 1
    err = first_error(r.stdout)
    assert (err["code"], err["field"], err["offset"]) == (exp["code"], exp["field"], exp["offset"])


def test_good_fixtures_under_sanitizers() -> None:
    for name in GOOD:
        r = run("check", "--deep", "--json", FIXTURES / name, command=[ASAN_BIN], env=SANITIZER_ENV)
        assert_clean(r.stderr)
        assert r.returncode == 0, r.stderr


def test_huge_sparse_vault_checks_without_reading_a_blob(tmp_path: Path) -> None:
    """A 113 GB vault (sparse: only its metadata is written) checks without blob reads."""
    d_model, ffn, layers, experts = 4096, 1536, 48, 240
    shapes = ((ffn, d_model), (ffn, d_model), (d_model, ffn))
    plan = make_plan(
        {(layer, e): shapes for layer in range(layers) for e in range(experts)}, bits=4, version=2
    )
    model = ModelInfo(
        num_moe_layers=layers,
        max_experts_per_layer=experts,
        d_model=d_model,
        vocab_size=151936,
        ffn_dim=ffn,
    )
    arch = ArchInfo(
        rope_theta=1e6,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        moe_top_k=8,
        moe_ffn_dim=ffn,
        num_hidden_layers=layers,
        rms_norm_eps=1e-6,
        model_type="qwen3_moe",
    )
    path = tmp_path / "huge.smoe"
    with open(path, "wb") as f:
        f.write(metadata_bytes(plan, model, arch))
        f.truncate(plan.file_size)
    assert plan.file_size > 100e9
    before = bytes_read()
    r = run("check", "--json", path, command=[BIN])
    read = bytes_read() - before
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["experts"] == layers * experts
    assert read < plan.data_offset + (1 << 20)  # the metadata (and the loader's), no blob


# ------------------------------------------------- rules not in EXPECTED.json (our own codes)


@pytest.mark.parametrize(
    "code,field,offset,base,patches,cut",
    RULE_CASES,
    ids=[f"{r[0]}-{i}" for i, r in enumerate(RULE_CASES)],
)
def test_rule_case_codes(code, field, offset, base, patches, cut, tmp_path: Path) -> None:
    path = tmp_path / "bad.smoe"
    path.write_bytes(apply(base, patches, cut))
    r = run("check", "--deep", "--json", path, command=[ASAN_BIN], env=SANITIZER_ENV)
    assert_clean(r.stderr)
    assert r.returncode == 1, r.stderr
    err = first_error(r.stdout)
    assert (err["code"], err["field"], err["offset"]) == (code, field, offset), err


def test_warnings_are_not_fatal(tmp_path: Path) -> None:
    """v1 with a non-zero reserved_ext (D6) and a gap between blobs (D4): valid, warned."""
    data = bytearray((FIXTURES / "q4_v1.smoe").read_bytes())
    struct.pack_into("<I", data, _h("reserved_ext"), 1536)
    last = MANIFEST["q4_v1.smoe"]["experts"][7]
    struct.pack_into("<Q", data, _en(7, "byte_offset"), last["byte_offset"] + layout.PAGE_SIZE)
    data[last["byte_offset"] :] = bytes(layout.PAGE_SIZE) + data[last["byte_offset"] :]
    path = tmp_path / "warn.smoe"
    path.write_bytes(bytes(data))
    r = run("check", "--deep", "--json", path, command=[BIN])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["gap_bytes"] == layout.PAGE_SIZE
    assert (out["valid"], out["errors"], out["warnings"]) == (True, 0, 2)
    assert [
        (f["severity"], f["code"], f["field"], f["offset"], f["actual"]) for f in out["findings"]
    ] == [
        ("warning", "header.reserved_ext", "header.reserved_ext", _h("reserved_ext"), 1536),
        ("warning", "table.gap", "experts[7].byte_offset", _en(7, "byte_offset"), None),
    ]


# ---------------------------------------------------------------------------- dequant / forward


def dequant_samples() -> list[tuple[str, int]]:
    """Every expert of partial_groups and q2_v2, first and last of the others."""
    out = []
    for name in GOOD:
        n = len(experts_of(name))
        picks = range(n) if name in ("partial_groups.smoe", "q2_v2.smoe") else sorted({0, n - 1})
        out += [(name, i) for i in picks]
    return out


@pytest.mark.parametrize("name,index", dequant_samples())
def test_dequant_bit_identical_to_python(name: str, index: int, tmp_path: Path) -> None:
    e = experts_of(name)[index]
    r = run("dequant", FIXTURES / name, e["layer_id"], e["expert_id"], tmp_path, command=[BIN])
    assert r.returncode == 0, r.stderr
    for tname, ref in zip(TENSORS, python_weights(FIXTURES / name, index)):
        got = np.fromfile(tmp_path / f"{tname}.f32", "<f4")
        assert got.size == ref.size
        np.testing.assert_array_equal(got.view(np.uint32), ref.reshape(-1).view(np.uint32))


def check_forward(
    path: Path,
    layer: int,
    expert: int,
    index: int,
    tmp_path: Path,
    seed: int = 0,
    env: dict | None = None,
) -> None:
    mats = python_weights(path, index)
    x = np.random.default_rng(seed).standard_normal(mats[0].shape[1]).astype(np.float32)
    (tmp_path / "in.f32").write_bytes(x.astype("<f4").tobytes())
    r = run(
        "forward",
        path,
        layer,
        expert,
        tmp_path / "in.f32",
        tmp_path / "out.f32",
        env=env,
        command=[BIN],
    )
    assert r.returncode == 0, r.stderr
    y = np.fromfile(tmp_path / "out.f32", "<f4").astype(np.float64)
    ref = swiglu(mats, x.astype(np.float64))
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("name", GOOD)
def test_forward_matches_numpy_swiglu(name: str, tmp_path: Path) -> None:
    experts = experts_of(name)
    for index in sorted({0, len(experts) // 2, len(experts) - 1}):
        e = experts[index]
        check_forward(FIXTURES / name, e["layer_id"], e["expert_id"], index, tmp_path, index)


@pytest.mark.parametrize("simd", ["best", "portable"])
@pytest.mark.parametrize("bits", [2, 4])
def test_forward_whole_block_rows(bits: int, simd: str, tmp_path: Path) -> None:
    """Rows of whole 32-byte blocks (cols % 128 == 0) take the fused SIMD kernel for all
    three matrices; "portable" switches AVX2 off so the SSE2/generic copy runs too."""
    d_model, ffn = 512, 384
    rng = np.random.default_rng(bits)
    experts = {
        (3, e): [
            rng.standard_normal(s).astype(np.float32) * 0.05
            for s in ((ffn, d_model), (ffn, d_model), (d_model, ffn))
        ]
        for e in range(2)
    }
    path = tmp_path / f"q{bits}.smoe"
    write_vault(
        path, ModelInfo(4, 2, d_model, 1000, ffn), experts, bits=bits, version=1, scale="absmax"
    )
    assert run("check", "--deep", path, command=[BIN]).returncode == 0
    env = plain_env(SMOE_STREAM_NO_AVX2="1") if simd == "portable" else None
    for index in range(2):
        check_forward(path, 3, index, index, tmp_path, seed=index, env=env)


# ---------------------------------------------------------------------------- fp16


def test_fp16_widening_exact_for_all_values(tmp_path: Path) -> None:
    r = run("fp16-table", tmp_path / "t.f32", command=[BIN])
    assert r.returncode == 0, r.stderr
    got = np.fromfile(tmp_path / "t.f32", "<f4")
    ref = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    assert got[1] == 2.0**-24 and got[0x3FF] == 1023 * 2.0**-24  # subnormals
    assert got[0x8000].view(np.uint32) == 0x80000000  # -0


# ---------------------------------------------------------------------------- robustness


def test_seeded_mutation_run_under_sanitizers() -> None:
    """2000 mutated fixtures (byte flips, boundary values in fields, truncations, copied
    spans), each checked with --deep in its own child under a 10 s alarm; plus 300 more
    with LeakSanitizer on (leak checks make every child exit slower)."""
    files = [FIXTURES / n for n in GOOD]
    for seed, count, leaks in ((20240601, 2000, 0), (7, 300, 1)):
        env = {
            **SANITIZER_ENV,
            "ASAN_OPTIONS": SANITIZER_ENV["ASAN_OPTIONS"] + f":detect_leaks={leaks}",
        }
        r = run(
            "fuzz",
            seed,
            count,
            "--jobs",
            2,
            "--timeout",
            10,
            *files,
            command=[ASAN_BIN],
            env=env,
        )
        assert_clean(r.stderr)
        assert r.returncode == 0, r.stdout + r.stderr
        out = json.loads(r.stdout)
        assert out["failed"] == 0 and out["failures"] == [], out["failures"][:5]
        assert sum(out["exit_codes"].values()) == count
        assert out["exit_codes"]["1"] > count // 2  # most mutations break a rule


def test_usage_errors_and_unreadable_files_exit_2(tmp_path: Path) -> None:
    good = FIXTURES / "q4_v2.smoe"
    short = tmp_path / "short.smoe"
    short.write_bytes(good.read_bytes()[:63])
    empty = tmp_path / "empty.smoe"
    empty.write_bytes(b"")
    x = tmp_path / "x.f32"
    x.write_bytes(b"\0" * 12)  # wrong length for d_model 64
    cases = [
        (),
        ("frobnicate",),
        ("check",),
        ("check", good, "--bogus"),
        ("check", good, good),
        ("check", tmp_path / "missing.smoe"),
        ("check", short),
        ("check", empty),
        ("check", tmp_path),
        ("forward", good, 0, 0),
        ("forward", good, "zero", 0, x, x),
        ("forward", good, 0, 99, x, x),
        ("forward", good, 0, 0, x, tmp_path / "y.f32"),
        ("forward", good, 0, 0, tmp_path / "missing.f32", tmp_path / "y.f32"),
        ("dequant", good, 0),
        ("dequant", good, 0, -1, tmp_path),
        ("bench", good, "--threads", 0),
        ("bench", good, "--pattern", "zigzag"),
        ("bench", good, "--seconds", "-1"),
        ("bench", good, "--topk"),
        ("bench",),
    ]
    for args in cases:
        for binary, env in ((BIN, None), (ASAN_BIN, SANITIZER_ENV)):
            r = run(*args, command=[binary], env=env)
            assert r.returncode == 2, (args, r.stderr)
            (line,) = r.stderr.splitlines()  # one line (issue 23: the usage is not repeated)
            assert line.startswith("smoe-stream: ") or (
                line.startswith("error: ") and line.endswith(" (see smoe-stream --help)")
            ), args
            assert_clean(r.stderr)


# ---------------------------------------------------------------------------- bench


@pytest.mark.parametrize(
    "extra",
    [
        ("--pattern", "random", "--threads", "2"),
        ("--pattern", "seq", "--direct", "--topk", "3"),
        ("--pattern", "random", "--threads", "auto"),
    ],
)
def test_bench_reports_json(extra: tuple[str, ...]) -> None:
    r = run("bench", FIXTURES / "q4_v2.smoe", "--seconds", "0.2", *extra, command=[BIN])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["experts"] == 8 and out["pattern"] == extra[1]
    for section, keys in (
        (
            "stream",
            ("gb_per_s", "experts_per_s", "latency_p50_us", "latency_p99_us", "reads", "bytes"),
        ),
        ("sequential_read", ("gb_per_s", "bytes")),
        ("compute", ("gb_per_s", "scalar_gb_per_s", "speedup", "forwards")),
    ):
        for key in keys:
            assert out[section][key] > 0, (section, key)
    assert out["compute"]["rel_diff_vs_scalar"] < 1e-4

    # the search: every raw pattern at every thread count, the stream at each count it may use
    stream, raw = out["stream"], out["raw_read"]
    assert {(x["pattern"], x["threads"]) for x in raw["runs"]} == {
        (p, n) for p in ("shares", "interleaved", "replay") for n in (1, 2, 4, 8)
    }
    tried = [x["threads"] for x in stream["search"]]
    given = dict(zip(extra[::2], extra[1::2])).get("--threads", "1")
    assert tried == ([1, 2, 4, 8] if given == "auto" else [int(given)])
    assert all(x["gb_per_s"] > 0 for x in raw["runs"] + stream["search"])
    fastest = max(raw["runs"], key=lambda x: x["gb_per_s"])
    assert (raw["file_limit"]["pattern"], raw["file_limit"]["gb_per_s"]) == (
        fastest["pattern"],
        fastest["gb_per_s"],
    )
    # the duel: the stream's fastest count against the fastest plain reader of its own reads
    best_stream = max(stream["search"], key=lambda x: x["gb_per_s"])
    best_replay = max(
        (x for x in raw["runs"] if x["pattern"] == "replay"), key=lambda x: x["gb_per_s"]
    )
    assert out["threads"] == best_stream["threads"]
    assert (raw["pattern"], raw["threads"]) == ("replay", best_replay["threads"])
    assert len(stream["runs_gb_per_s"]) == len(raw["duel_runs_gb_per_s"]) == out["duels"]
    assert stream["gb_per_s"] == pytest.approx(statistics.median(stream["runs_gb_per_s"]))
    assert raw["gb_per_s"] == pytest.approx(statistics.median(raw["duel_runs_gb_per_s"]))


def test_bench_refuses_a_bad_thread_count() -> None:
    for bad, why in (
        ("0", "1..256 or auto"),
        ("257", "1..256 or auto"),
        ("many", "not a valid number: 'many'"),
    ):
        r = run("bench", FIXTURES / "q4_v2.smoe", "--threads", bad, command=[BIN])
        assert r.returncode == 2 and r.stdout == "", (bad, r.stdout)
        assert r.stderr == f"error: --threads: {why} (see smoe-stream --help)\n", (bad, r.stderr)


def test_cpp_checker_and_python_verifier_agree_on_mutations(tmp_path: Path) -> None:
    """Seeded mutations of fixtures: C++ accepts iff Python finds no error, and the C++
    checker's first error code is among the Python verifier's."""
    from smoe.format.verify import verify

    rng = random.Random(11)
    seeds = {
        n: (FIXTURES / n).read_bytes()
        for n in ("q4_v2.smoe", "q2_v2.smoe", "q4_v1.smoe", "partial_groups.smoe")
    }
    path = tmp_path / "m.smoe"
    disagreements = []
    for _ in range(300):
        name = rng.choice(sorted(seeds))
        data = bytearray(seeds[name])
        for _ in range(rng.randint(1, 3)):
            fmt = rng.choice(["<B", "<I", "<Q"])
            off = rng.randrange(2048 - 8)
            value = rng.choice([*boundary_values(len(data)), rng.randrange(256)])
            struct.pack_into(
                fmt, data, off, value & {"<B": 0xFF, "<I": 2**32 - 1, "<Q": 2**64 - 1}[fmt]
            )
        if rng.random() < 0.3:
            del data[rng.randrange(len(data) + 1) :]
        path.write_bytes(bytes(data))
        errors = {f.code for f in verify(np.frombuffer(bytes(data), np.uint8), deep=True).errors}
        r = run("check", "--deep", "--json", path, command=[BIN])
        if r.returncode == 0:
            agree = not errors
        elif r.returncode == 1:
            agree = first_error(r.stdout)["code"] in errors
        else:
            agree = r.returncode == 2 and errors == {"header.size"}
        if not agree:
            disagreements.append((name, r.returncode, r.stdout[-200:], sorted(errors)))
    assert disagreements == []
