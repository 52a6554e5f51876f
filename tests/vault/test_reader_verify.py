"""Fast reader and verifier: fixtures, recorded codes, and differential tests vs Kaitai."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smoe import quant
from smoe.errors import SmoeError
from smoe.format.verify import verify
from smoe.vault.reader import Vault, VaultError
from smoe_gen.layout import Rule
from smoe_gen.smoe_kaitai import Smoe

from fixtures_data import BAD, CORRUPT, EXPECTED, FIXTURES, GOOD, MANIFEST, boundary_values
from helpers import run
from kaitai_names import kaitai_field
from rule_cases import RULE_CASES, apply

# Error rules the .ksy cannot express (Kaitai accepts files that break only these): the
# registry's error rules with `ksy` false.
NOT_IN_KSY = {r.code for r in Rule if r.severity == "error" and not r.ksy}


def kaitai_walk(data: bytes, padding: bool = True) -> Smoe:
    s = Smoe.from_bytes(data)
    for e in s.experts:
        for d in e.tensors:
            _ = d.packed, d.scales
        if padding:
            _ = e.padding
    _ = s.arch
    return s


def reader_walk(data: np.ndarray) -> Vault:
    v = Vault.from_array(data)
    for key in v:
        v.expert(*key)
    return v


@pytest.mark.parametrize("name", GOOD)
def test_reader_matches_manifest(name: str) -> None:
    v = Vault.open(FIXTURES / name)
    want = MANIFEST[name]
    for k, value in want["header"].items():
        got = v.header[k]
        assert (bytes(got).hex() if k == "magic" else int(got)) == value, k
    if want["arch"] is None:
        assert v.arch is None
    else:
        for k, value in want["arch"].items():
            got = v.arch[k]
            if k == "model_type":
                assert got.decode() == value
            elif k in ("magic", "reserved"):  # the hex text, answering as its bytes too
                assert got == value and bytes(got).hex() == value
            elif isinstance(value, float):
                assert float(got) == pytest.approx(value, rel=1e-7)
            else:
                assert int(got) == value, k
    assert len(v) == len(want["experts"])
    for i, we in enumerate(want["experts"]):
        e = v.expert(we["layer_id"], we["expert_id"])
        assert e.index == i
        for t, wd in zip(e.tensors, we["tensors"]):
            assert (t.rows, t.cols) == (wd["rows"], wd["cols"])
            assert t.packed.nbytes == wd["packed_size"] and t.scales.nbytes == wd["scales_size"]
            assert not t.packed.flags.owndata and not t.packed.flags.writeable  # a view of the map


@pytest.mark.parametrize("name", GOOD)
def test_good_fixtures_have_no_errors(name: str) -> None:
    report = verify(np.fromfile(FIXTURES / name, np.uint8), deep=True)
    assert report.errors == []


def test_partial_vault_reported_not_rejected() -> None:
    report = verify(np.fromfile(FIXTURES / "partial_vault.smoe", np.uint8))
    (info,) = [f for f in report.findings if f.severity == "info"]
    assert (info.code, info.message) == ("header.partial", "partial: 4 of 32 experts")


@pytest.mark.parametrize("name", BAD)
def test_corrupt_fixture_raises_recorded_code(name: str) -> None:
    exp = EXPECTED[name]
    report = verify(np.fromfile(CORRUPT / name, np.uint8), deep=True)
    hits = [(f.code, f.path, f.offset) for f in report.errors]
    assert (exp["code"], exp["field"], exp["offset"]) in hits
    proc = run("verify", "--deep", "--json", CORRUPT / name)
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["valid"] is False and out["errors"] == len(report.errors)
    assert any(
        f["code"] == exp["code"] and f["field"] == exp["field"] and f["offset"] == exp["offset"]
        for f in out["findings"]
    )
    # The fast reader refuses it too (at open or when the broken expert is reached),
    # except for blob contents, which only --deep reads.
    if exp["section"] != "blobs" or exp["code"] != "blob.padding":
        with pytest.raises(VaultError) as info:
            reader_walk(np.fromfile(CORRUPT / name, np.uint8))
        assert info.value.finding.severity == "error"


@pytest.mark.parametrize(
    "code,field,offset,base,patches,cut",
    RULE_CASES,
    ids=[f"{r[0]}-{i}" for i, r in enumerate(RULE_CASES)],
)
def test_rule_cases_raise_the_same_code_as_the_cpp_checker(
    code, field, offset, base, patches, cut
) -> None:
    report = verify(np.frombuffer(apply(base, patches, cut), np.uint8), deep=True)
    assert (code, field, offset) in [(f.code, f.path, f.offset) for f in report.errors]


def test_finding_carries_expected_and_actual_in_hex_and_decimal() -> None:
    report = verify(np.fromfile(CORRUPT / "packed_size_mismatch.smoe", np.uint8))
    f = next(f for f in report.errors if f.code == "descriptor.packed_size")
    assert f.to_dict() == {
        "code": "descriptor.packed_size",
        "severity": "error",
        "offset": 468,
        "field": "experts[0].tensors[0].packed_size",
        "message": "packed_size must be ceil(rows * cols * bits / 8)",
        "expected": 1024,
        "actual": 1025,
        "expected_text": "0x400 (1024)",
        "actual_text": "0x401 (1025)",
    }
    assert f.line().endswith("[expected 0x400 (1024), got 0x401 (1025)]")


def test_verify_exit_codes(tmp_path: Path) -> None:
    ok = run("verify", FIXTURES / "q4_v1.smoe")
    assert ok.returncode == 0
    assert ok.stdout.strip().endswith("valid (0 errors, 0 warnings)")
    missing = run("verify", tmp_path / "nope.smoe")
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"error: {tmp_path / 'nope.smoe'}: cannot open: No such file or directory"
    )
    short = tmp_path / "short.smoe"
    short.write_bytes(b"SMOE")
    assert run("verify", short).returncode == 2
    usage = run("verify")
    assert usage.returncode == 2
    assert usage.stderr == (
        "error: the following arguments are required: vault (see smoe verify --help)\n"
    )


def test_expert_views_and_dequantize() -> None:
    v = Vault.open(FIXTURES / "partial_groups.smoe")
    e = v.expert(1, 3)
    gate = e["gate_proj"]
    assert (gate.rows, gate.cols) == (25, 41)
    w = gate.dequantize()
    assert w.dtype == np.float32 and w.shape == (25, 41)
    ref = quant.decode(np.array(gate.packed), np.array(gate.scales), 4, (25, 41))
    assert np.array_equal(w, ref)
    with pytest.raises(KeyError):
        v.expert(0, 1)  # layer 0 holds experts 0, 2, 4
    assert (0, 2) in v and (0, 1) not in v
    assert v.layers() == {0: 3, 1: 5}


def test_reader_errors_name_offset_and_field(tmp_path: Path) -> None:
    data = bytearray((FIXTURES / "q4_v2.smoe").read_bytes())
    struct.pack_into("<Q", data, 64 + 48 + 8, 16384 + 7)  # experts[1].byte_offset misaligned
    with pytest.raises(VaultError) as info:
        Vault.from_array(np.frombuffer(bytes(data), np.uint8), "x.smoe")
    assert str(info.value) == (
        "x.smoe: entry.byte_offset_align at offset 120 "
        "(experts[1].byte_offset): blob offset must be a multiple of 16384"
    )
    with pytest.raises(SmoeError, match="cannot open"):
        Vault.open(tmp_path / "missing.smoe")


def test_huge_counts_fail_without_allocating() -> None:
    data = bytearray((FIXTURES / "q4_v2.smoe").read_bytes()[:16384])
    for off in (12, 16, 20):
        struct.pack_into("<I", data, off, 0xFFFFFFFF)
    with pytest.raises(VaultError) as info:
        Vault.from_array(np.frombuffer(bytes(data), np.uint8))
    assert info.value.finding.code in {"header.table_bounds", "header.data_offset_bounds"}


# ---- differential: fast reader + verifier vs the Kaitai reference ---------------------------
SEEDS = {
    name: (FIXTURES / name).read_bytes()
    for name in ("q4_v2.smoe", "q2_v2.smoe", "q4_v1.smoe", "partial_groups.smoe")
}


def _agree_on_fields(s: Smoe, v: Vault) -> None:
    for name in v.header.dtype.names:
        want = kaitai_field(s.header, name)
        got = v.header[name]
        assert (bytes(got) if name == "magic" else int(got)) == want, name
    assert [
        (e.layer_id, e.expert_id, e.ofs_blob, e.len_raw, e.len_padded, e.num_groups)
        for e in s.experts
    ] == [
        tuple(
            int(r[f])
            for f in (
                "layer_id",
                "expert_id",
                "byte_offset",
                "raw_size",
                "padded_size",
                "num_groups",
            )
        )
        for r in v.table
    ]
    for i, e in enumerate(s.experts):
        for t, d in enumerate(e.tensors):
            r = v.descriptors[i, t]
            assert (
                d.num_rows,
                d.num_cols,
                d.ofs_packed,
                d.len_packed,
                d.ofs_scales,
                d.len_scales,
            ) == tuple(
                int(r[f])
                for f in (
                    "rows",
                    "cols",
                    "packed_offset",
                    "packed_size",
                    "scales_offset",
                    "scales_size",
                )
            )
    if s.arch is not None:
        for name in (
            "flags",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "moe_top_k",
            "moe_ffn_dim",
            "num_hidden_layers",
        ):
            assert kaitai_field(s.arch, name) == int(v.arch[name]), name


@st.composite
def mutants(draw) -> bytes:
    name = draw(st.sampled_from(sorted(SEEDS)))
    data = bytearray(SEEDS[name])
    meta_end = 2048  # header, table, descriptors and arch of every seed lie below this
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["byte", "u32", "u64"]))
        if kind == "byte":
            data[draw(st.integers(0, meta_end - 1))] = draw(st.integers(0, 255))
        else:
            fmt, width = ("<I", 4) if kind == "u32" else ("<Q", 8)
            off = draw(st.integers(0, meta_end - width))
            value = draw(st.sampled_from(boundary_values(len(data))))
            if kind == "u32":
                value &= 0xFFFFFFFF
            struct.pack_into(fmt, data, off, value)
    if draw(st.booleans()):
        del data[draw(st.integers(0, len(data))) :]
    return bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutants())
def test_differential_against_kaitai(data: bytes) -> None:
    arr = np.frombuffer(data, np.uint8)
    try:
        s = kaitai_walk(data, padding=False)
        ks_error = None
    except Exception as e:  # the reference's verdict, whatever its exception type
        s, ks_error = None, e
    report = verify(arr)
    err_codes = {f.code for f in report.errors}
    try:
        v = reader_walk(arr)
        rd_error = None
    except VaultError as e:
        v, rd_error = None, e
    if ks_error is not None:
        # What the spec rejects, the verifier and the reader reject.
        assert err_codes, f"Kaitai rejected ({ks_error!r}) but the verifier found nothing"
        assert rd_error is not None
    else:
        # What the spec accepts, only rules it cannot express make the verifier reject.
        assert err_codes <= NOT_IN_KSY, err_codes
        if v is not None:
            _agree_on_fields(s, v)
        else:
            assert rd_error.finding.code in NOT_IN_KSY
