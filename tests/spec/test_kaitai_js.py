"""Cross-language conformance: the JavaScript parser generated from spec/smoe.ksy.

The pinned compiler (codegen/ksc.js) compiles the .ksy to JavaScript at test time; the npm
runtime `kaitai-struct` runs it through tests/spec/kaitai_js/parse.js, which touches every instance
that carries a check and prints every field. Every valid fixture must read as `smoe.Vault`
and the Python parser read it, field by field; every corrupt fixture must fail in JavaScript
exactly as its Kaitai expectation in fixtures/corrupt/EXPECTED.json says.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from smoe import Vault
from smoe_gen.smoe_kaitai import Smoe

from fixtures_data import CORRUPT, EXPECTED, FIXTURES, GOOD, ROOT
from helpers import plain_env, run

CODEGEN = ROOT / "codegen"
KSY = ROOT / "spec" / "smoe.ksy"
PARSE_JS = Path(__file__).resolve().parent / "kaitai_js" / "parse.js"
SPEC: dict[str, Any] = yaml.safe_load(KSY.read_text(encoding="utf-8"))

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(
    NODE is None or not (CODEGEN / "node_modules" / "kaitai-struct").is_dir(),
    reason="needs node and the npm packages of codegen/ (`make setup-node`)",
)


@pytest.fixture(scope="module")
def js_parser(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Smoe.js, compiled from the .ksy by the pinned compiler into a temporary directory."""
    proc = run(CODEGEN / "ksc.js", KSY, "javascript", command=[NODE])
    assert proc.returncode == 0, proc.stderr or proc.stdout
    out = tmp_path_factory.mktemp("kaitai_js") / "Smoe.js"
    out.write_text(json.loads(proc.stdout)["files"]["javascript"]["Smoe.js"], encoding="utf-8")
    return out


def parse_js(parser: Path, vault: Path) -> dict[str, Any]:
    env = plain_env(NODE_PATH=str(CODEGEN / "node_modules"))
    proc = run(PARSE_JS, parser, KSY, vault, command=[NODE], env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ---- the same walk over the Python parser ----------------------------------------------------


def _fields(type_id: str) -> list[tuple[str, str]]:
    """(id, kind) of a type's seq fields and value instances, as parse.js lists them."""
    out = []
    for a in SPEC["types"][type_id]["seq"]:
        kind = (
            "bytes"
            if "contents" in a
            else "zerofill"
            if a.get("type") == "zero_fill"
            else "text"
            if a.get("type") == "nul_padded_utf8"
            else "enum"
            if "enum" in a
            else "float"
            if a.get("type") == "f4"
            else "int"
        )
        out.append((a["id"], kind))
    for name, inst in (SPEC["types"][type_id].get("instances") or {}).items():
        if "value" in inst:
            out.append((name, "value"))
    return out


def _plain(obj: Any, type_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind in _fields(type_id):
        v = getattr(obj, name)
        if kind == "bytes":
            out[name] = v.hex()
        elif kind == "zerofill":
            out[name] = len(v.bytes)
        elif kind == "text":
            out[name] = v.text
        elif kind == "enum":
            out[name] = v.value
        elif kind == "float":
            out[name] = struct.unpack("<I", struct.pack("<f", v))[0]
        else:
            out[name] = v
    return out


def parse_py(vault: Path) -> dict[str, Any]:
    s = Smoe.from_file(str(vault))
    try:
        experts = []
        for e in s.experts:
            row = _plain(e, "expert_entry")
            row["tensors"] = [
                {
                    **_plain(d, "tensor_descriptor"),
                    "packed": d.packed.hex(),
                    "scales": d.scales.hex(),
                }
                for d in e.tensors
            ]
            row["padding"] = len(e.padding.bytes)
            experts.append(row)
        return {
            "header": _plain(s.header, "file_header"),
            "arch": None if s.arch is None else _plain(s.arch, "arch_block"),
            "experts": experts,
        }
    finally:
        s.close()


# ---- the fast reader's view, by the reference header's names ----------------------------------


def _same_record(got: dict[str, Any], record: np.void, type_id: str, where: str) -> None:
    """Every seq field of ``got`` equals the record's field of its ``-orig-id`` name."""
    for a in SPEC["types"][type_id]["seq"]:
        value, want = got[a["id"]], record[a.get("-orig-id", a["id"])]
        what = f"{where}.{a['id']}"
        if "contents" in a:
            assert value == bytes(want).hex(), what
        elif a.get("type") == "zero_fill":
            assert value == len(bytes(want)) and not any(bytes(want)), what
        elif a.get("type") == "nul_padded_utf8":
            assert value == bytes(want).decode("utf-8"), what  # numpy drops the NULs
        elif a.get("type") == "f4":
            assert value == int(np.asarray(want, "<f4").view("<u4")), what
        else:
            assert value == int(want), what


@pytest.mark.parametrize("name", GOOD)
def test_valid_fixture_reads_the_same_in_javascript(js_parser: Path, name: str) -> None:
    path = FIXTURES / name
    got = parse_js(js_parser, path)
    assert "error" not in got, got
    assert got == parse_py(path)  # every field and instance, blobs included
    with Vault.open(path) as v:
        _same_record(got["header"], v.header, "file_header", "header")
        if v.arch is None:
            assert got["arch"] is None
        else:
            _same_record(got["arch"], v.arch, "arch_block", "arch")
        assert len(got["experts"]) == len(v.table)
        for i, e in enumerate(got["experts"]):
            _same_record(e, v.table[i], "expert_entry", f"experts[{i}]")
            blob = int(v.table[i]["byte_offset"])
            for t, d in enumerate(e["tensors"]):
                _same_record(
                    d, v.descriptors[i, t], "tensor_descriptor", f"experts[{i}].tensors[{t}]"
                )
                for part in ("packed", "scales"):
                    at = blob + int(v.descriptors[i, t][f"{part}_offset"])
                    size = int(v.descriptors[i, t][f"{part}_size"])
                    assert d[part] == bytes(v.data[at : at + size]).hex(), f"{i}.{t}.{part}"
            assert e["padding"] == int(v.table[i]["padded_size"]) - int(v.table[i]["raw_size"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corrupt_fixture_fails_in_javascript_as_recorded(js_parser: Path, name: str) -> None:
    got = parse_js(js_parser, CORRUPT / name)
    want = EXPECTED[name]["kaitai"]
    if want is None:  # not expressible in the .ksy: the parser reads it all
        assert "error" not in got, got
    else:
        assert got == {"error": want["error"], "path": want["path"]}
