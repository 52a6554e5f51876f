"""Golden fixtures: the Kaitai parser reads every good one and rejects every corrupt one."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import crc32c
import kaitaistruct
import numpy as np
import pytest

from smoe.format import manifest
from smoe_gen import layout
from smoe_gen.smoe_kaitai import Smoe

from fixtures_data import BAD, CORRUPT, EXPECTED, FIXTURES, GOOD, MANIFEST
from helpers import run
from kaitai_names import kaitai_field


def walk(s: Smoe) -> None:
    """Touch every lazy instance: table, descriptors, slices, padding, arch."""
    for e in s.experts:
        for d in e.tensors:
            _ = d.packed, d.scales
        _ = e.padding
    _ = s.arch


def _value(v: object) -> object:
    if hasattr(v, "value"):
        return v.value
    if isinstance(v, bytes):
        return v.hex()
    if hasattr(v, "bytes"):
        return bytes(v.bytes).hex()
    return v


def _same(ks: object, want: dict) -> None:
    for name, value in want.items():
        if name == "tensors":
            continue
        got = _value(kaitai_field(ks, name))
        if isinstance(value, float):
            assert got == pytest.approx(value, rel=1e-7), name
        else:
            assert got == value, name


@pytest.mark.parametrize("name", GOOD)
def test_good_fixture_matches_manifest(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    want = MANIFEST[name]
    assert hashlib.sha256(data).hexdigest() == want["sha256"]
    s = Smoe.from_bytes(data)
    walk(s)
    _same(s.header, want["header"])
    if want["arch"] is None:
        assert s.arch is None
    else:
        _same(s.arch, want["arch"])
    assert len(s.experts) == len(want["experts"])
    for e, we in zip(s.experts, want["experts"]):
        _same(e, we)
        for d, wd in zip(e.tensors, we["tensors"]):
            _same(d, wd)


@pytest.mark.parametrize("name", BAD)
def test_corrupt_fixture_rejected_as_recorded(name: str) -> None:
    exp = EXPECTED[name]
    data = (CORRUPT / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == exp["sha256"]
    if exp["kaitai"] is None:
        # Not expressible in the .ksy (e.g. overlap between any two blobs): the verifier's job.
        walk(Smoe.from_bytes(data))
        return
    with pytest.raises(kaitaistruct.KaitaiStructError) as info:
        walk(Smoe.from_bytes(data))
    assert type(info.value).__name__ == exp["kaitai"]["error"]
    assert info.value.src_path == exp["kaitai"]["path"]


def test_corrupt_set_covers_every_section() -> None:
    sections = {e["section"] for e in EXPECTED.values()}
    assert sections == {"header", "table", "descriptors", "arch", "blobs"}


# committed beside the generated fixtures, made otherwise: the record of `make demo`'s outputs
NOT_GENERATED = {"DEMO.json"}


def test_make_fixtures_is_byte_identical(tmp_path: Path) -> None:
    """Vaults, their integrity manifests and the expectations: a rerun gives the same bytes."""
    gen = FIXTURES / "generate.py"
    proc = run(gen, tmp_path, command=[sys.executable])
    assert proc.returncode == 0, proc.stderr
    produced = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(
        p.relative_to(FIXTURES)
        for p in [*FIXTURES.glob("*"), *CORRUPT.glob("*")]
        if p.is_file() and p.suffix in (".smoe", ".json", ".dat") and p.name not in NOT_GENERATED
    )
    assert produced == committed
    assert {Path(f"{name}.manifest.json") for name in GOOD} <= set(produced)
    assert not [
        p
        for p in produced
        if p.parent.name == "corrupt" and p.suffix != ".smoe" and p.name != "EXPECTED.json"
    ]
    for rel in produced:
        assert (tmp_path / rel).read_bytes() == (FIXTURES / rel).read_bytes(), rel


@pytest.mark.parametrize("name", GOOD)
def test_good_fixture_has_a_matching_integrity_manifest(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    total = MANIFEST[name]["header"]["total_experts"]
    table = np.frombuffer(data, layout.EXPERT_ENTRY_DTYPE, total, layout.TABLE_OFFSET)
    doc = manifest.load(manifest.path_for(FIXTURES / name), total)
    assert manifest.check(doc, len(data), table, lambda off, n: data[off : off + n]) == []
    assert doc["vault"] == {
        "name": name,
        "size": len(data),
        "experts": total,
        "bits": MANIFEST[name]["header"]["bits"],
    }
    assert doc["tool"]["command"] == "fixtures/generate.py"
    for row, entry in zip(doc["experts"], table):
        blob = data[int(entry["byte_offset"]) : int(entry["byte_offset"]) + int(entry["raw_size"])]
        assert row["crc32c"] == crc32c.crc32c(blob)
