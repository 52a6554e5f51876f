"""Cross-language conformance on vaults sculpted from the transformers-made checkpoints:
`smoe-stream check --json` agrees with the Python reader on every field, `dequant` equals
the Python decoder bit for bit, and `forward` equals a numpy SwiGLU within 1e-5."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from smoe.format.records import plain
from smoe.sculpt import SculptOptions, sculpt
from smoe.vault.reader import Vault

from fixtures_data import CKPTS, CONVERT
from helpers import SMOE_STREAM, run


@pytest.fixture(scope="module")
def vaults(smoe_stream: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("conformance")
    made = {}
    for name in CONVERT:
        for bits in (4, 2):
            res = sculpt(CKPTS / name, out / f"q{bits}", SculptOptions(bits=bits))
            made[f"{name}-q{bits}"] = res.vault
    return made


@pytest.mark.parametrize("key", [f"{n}-q{b}" for n in CONVERT for b in (4, 2)])
def test_check_agrees_with_python_reader(vaults, key: str) -> None:
    r = run("check", "--json", "--deep", vaults[key], command=[SMOE_STREAM])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    v = Vault.open(vaults[key])
    assert out["header"] == plain(v.header_record)
    arch = plain(v.arch_record)
    for name, value in arch.items():
        if name == "reserved":
            continue
        got = out["arch"][name]
        assert got == (pytest.approx(value, rel=1e-7) if isinstance(value, float) else value)
    assert out["experts"] == len(v)
    assert {d["layer_id"]: d["experts"] for d in out["layers"]} == v.layers()


@pytest.mark.parametrize("key", [f"{n}-q{b}" for n in CONVERT for b in (4, 2)])
def test_dequant_and_forward_match_python(vaults, key: str, tmp_path: Path) -> None:
    v = Vault.open(vaults[key])
    keys = v.keys()
    for layer, expert in (keys[0], keys[len(keys) // 2], keys[-1]):
        e = v.expert(layer, expert)
        ref = e.dequantize()
        r = run("dequant", vaults[key], layer, expert, tmp_path, command=[SMOE_STREAM])
        assert r.returncode == 0, r.stderr
        for cname, pname in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            got = np.fromfile(tmp_path / f"{cname}.f32", "<f4").reshape(ref[pname].shape)
            assert np.array_equal(got.view(np.uint32), ref[pname].view(np.uint32)), cname
        d_model = ref["gate_proj"].shape[1]
        x = np.random.default_rng(layer * 1000 + expert).standard_normal(d_model)
        x.astype("<f4").tofile(tmp_path / "x.f32")
        r = run(
            "forward",
            vaults[key],
            layer,
            expert,
            tmp_path / "x.f32",
            tmp_path / "y.f32",
            command=[SMOE_STREAM],
        )
        assert r.returncode == 0, r.stderr
        y = np.fromfile(tmp_path / "y.f32", "<f4").astype(np.float64)
        xf = x.astype(np.float32).astype(np.float64)
        g = ref["gate_proj"].astype(np.float64) @ xf
        u = ref["up_proj"].astype(np.float64) @ xf
        want = ref["down_proj"].astype(np.float64) @ (g / (1 + np.exp(-g)) * u)
        assert np.max(np.abs(y - want)) <= 1e-5 * np.max(np.abs(want))


@pytest.mark.parametrize("key", ["qwen3_moe-q4", "mixtral-q2"])
def test_sculpted_manifest_checked_alike(vaults: dict[str, Path], key: str, tmp_path: Path) -> None:
    """The manifest the sculptor wrote passes both deep checkers; a flipped bit in a blob
    is `manifest.checksum` at that blob's offset and field in both languages."""
    from smoe.format.manifest import path_for
    from smoe.format.verify import verify_path

    src = vaults[key]
    assert verify_path(src, deep=True).ok
    assert run("check", src, "--deep", command=[SMOE_STREAM]).returncode == 0
    bad = tmp_path / src.name
    data = bytearray(src.read_bytes())
    v = Vault.open(src)
    e = v.table[len(v) // 2]
    at = int(e["byte_offset"]) + int(e["raw_size"]) // 2
    data[at] ^= 0x10
    bad.write_bytes(bytes(data))
    path_for(bad).write_bytes(path_for(src).read_bytes())
    py = [f for f in verify_path(bad, deep=True).errors]
    assert [(f.code, f.offset, f.path) for f in py] == [
        ("manifest.checksum", int(e["byte_offset"]), f"manifest/experts/{len(v) // 2}/crc32c")
    ]
    cpp = run("check", bad, "--deep", "--json", command=[SMOE_STREAM])
    assert cpp.returncode == 1
    (err,) = [f for f in json.loads(cpp.stdout)["findings"] if f["severity"] == "error"]
    assert (err["code"], err["offset"], err["field"]) == (py[0].code, py[0].offset, py[0].path)
    assert (err["expected"], err["actual"]) == (py[0].expected, py[0].actual)
