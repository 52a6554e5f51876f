"""One JSON schema (docs/JSON.md, ``smoe-findings/1``) for `smoe verify --json`,
`smoe dump --json` and `smoe-stream check --json`: on every fixture, valid and corrupt, the
three agree on the exit status and on the first error (code, offset, field, expected,
actual), every code is registered, and every document has exactly the documented keys."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from smoe import cli
from smoe.format.findings import SCHEMA
from smoe_gen import layout

from fixtures_data import BAD, CORRUPT, EXPECTED, FIXTURES, GOOD, ROOT
from helpers import SMOE_STREAM, run

JSON_MD = (ROOT / "docs" / "JSON.md").read_text()
SPEC_MD = (ROOT / "generated" / "docs" / "SPEC.md").read_text()
ALL = [FIXTURES / n for n in GOOD] + [CORRUPT / n for n in BAD]


def documented_keys(section: str) -> set[str]:
    """The keys of the table under ``## section`` of docs/JSON.md."""
    body = JSON_MD.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    keys = re.findall(r"^\| `([a-z_]+)` \|", body, re.M)
    assert keys, section
    return set(keys)


FINDINGS_KEYS = documented_keys("Findings document")
FINDING_KEYS = documented_keys("Finding")
CHECK_KEYS = FINDINGS_KEYS | documented_keys("Check")
DUMP_KEYS = documented_keys("Dump document")
ERROR_KEYS = documented_keys("Error document")


pytestmark = pytest.mark.usefixtures("smoe_stream")  # check() runs the harness


def python(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, dict]:
    """``smoe ARGS`` (``smoe-dump`` for ``dump``), in this process: (exit status, document)."""
    capsys.readouterr()
    code = cli.dump_main(list(args[1:])) if args[0] == "dump" else cli.main(list(args))
    return code, json.loads(capsys.readouterr().out)


def check(*args: object) -> tuple[int, dict]:
    r = run("check", *args, command=[SMOE_STREAM])
    return r.returncode, json.loads(r.stdout)


def valid_finding(f: dict) -> dict:
    """Asserts ``f`` is a finding as documented; returns it without its (free) message."""
    assert set(f) == FINDING_KEYS, f
    rule = layout.RULES[f["code"]]  # registered ...
    assert f["severity"] == rule.severity and f"| `{f['code']}` |" in SPEC_MD  # ... and listed
    assert isinstance(f["offset"], int) and f["offset"] >= 0 and f["field"]
    for side in ("expected", "actual"):
        v, text = f[side], f[f"{side}_text"]
        assert v is None or isinstance(v, (int, float, str)), f
        assert (text is None) == (v is None), f
        if isinstance(v, int):
            assert text == f"{v:#x} ({v})"
        elif v is not None:
            assert text == str(v)
    return {k: v for k, v in f.items() if k != "message"}


def valid_findings_doc(doc: dict, keys: set[str]) -> list[dict]:
    assert set(doc) == keys and doc["schema"] == SCHEMA, doc
    found = [valid_finding(f) for f in doc["findings"]]
    severities = [f["severity"] for f in found]
    assert severities == sorted(severities, key=layout.SEVERITIES.index)
    assert doc["errors"] == severities.count("error")
    assert doc["warnings"] == severities.count("warning")
    assert doc["valid"] == (doc["errors"] == 0)
    return found


@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_three_commands_agree(path: Path, capsys: pytest.CaptureFixture) -> None:
    v_code, verify = python(capsys, "verify", "--json", "--deep", str(path))
    d_code, dump = python(capsys, "dump", "--json", "--deep", str(path))
    c_code, checked = check("--json", "--deep", path)
    assert v_code == d_code == c_code == (0 if path.name in GOOD else 1)

    py = valid_findings_doc(verify, FINDINGS_KEYS)
    cpp = valid_findings_doc(checked, CHECK_KEYS)
    assert set(dump) == DUMP_KEYS and dump["schema"] == SCHEMA
    assert dump["findings"] == verify["findings"]
    for key in ("schema", "vault", "size", "valid", "deep"):
        assert verify[key] == checked[key], key
    py_errors = [f for f in py if f["severity"] == "error"]
    cpp_errors = [f for f in cpp if f["severity"] == "error"]
    assert cpp_errors == py_errors[:1]  # C++ stops at the first error
    if py_errors:
        exp = EXPECTED[path.name]
        assert (py_errors[0]["code"], py_errors[0]["field"], py_errors[0]["offset"]) == (
            exp["code"],
            exp["field"],
            exp["offset"],
        )
        assert all(checked[key] is None for key in CHECK_KEYS - FINDINGS_KEYS)
    else:
        assert checked["header"]["version"] == dump["header"]["version"]
    # The warnings C++ met are Python's, value for value.
    assert [f for f in cpp if f["severity"] != "error"] == [
        f for f in py if f in cpp and f["severity"] != "error"
    ]


def test_a_file_shorter_than_a_header_is_unreadable_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    short = tmp_path / "short.smoe"
    short.write_bytes((FIXTURES / "q4_v2.smoe").read_bytes()[:30])
    (v_code, verify), (d_code, dump) = (
        python(capsys, cmd, "--json", str(short)) for cmd in ("verify", "dump")
    )
    c_code, checked = check("--json", short)
    assert v_code == d_code == c_code == 2
    want = [
        {
            "code": "header.size",
            "severity": "error",
            "offset": 0,
            "field": "header",
            "expected": 64,
            "actual": 30,
            "expected_text": "0x40 (64)",
            "actual_text": "0x1e (30)",
        }
    ]
    assert valid_findings_doc(verify, FINDINGS_KEYS) == want
    assert valid_findings_doc(checked, CHECK_KEYS) == want
    assert set(dump) == DUMP_KEYS and dump["findings"] == verify["findings"]


def test_bad_magic_is_a_broken_rule_not_an_unreadable_file(capsys: pytest.CaptureFixture) -> None:
    """Exit status 2 is for files that cannot be read at all (docs/JSON.md); a file with
    another magic was read and judged: status 1, code header.magic, in both languages."""
    path = CORRUPT / "bad_magic.smoe"
    code, verify = python(capsys, "verify", "--json", str(path))
    c_code, checked = check("--json", path)
    assert code == c_code == 1
    assert (
        [f["code"] for f in verify["findings"]]
        == [f["code"] for f in checked["findings"]]
        == ["header.magic"]
    )


def test_error_documents_are_the_same(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "missing.smoe"
    docs = [
        python(capsys, "verify", "--json", str(missing)),
        python(capsys, "dump", "--json", str(missing)),
        check("--json", missing),
    ]
    message = f"{missing}: cannot open: No such file or directory"
    want = {"schema": SCHEMA, "ok": False, "error": {"message": message, "exit_code": 2}}
    assert docs == [(2, want)] * 3
    for code, doc in (python(capsys, "verify", "--json"), check("--json", "--bogus", missing)):
        assert code == 2 and set(doc) == ERROR_KEYS and doc["schema"] == SCHEMA
        assert doc["ok"] is False and doc["error"]["exit_code"] == 2


def test_the_documented_codes_are_the_registry() -> None:
    """docs/JSON.md names the codes by the registry table of SPEC.md (which holds every
    registered code) and mentions only registered ones."""
    assert "generated/docs/SPEC.md" in JSON_MD
    kinds = {code.split(".")[0] for code in layout.RULES}  # header, arch, table, ...
    for code in re.findall(r"`([a-z]+\.[a-z_]+)`", JSON_MD):  # (`vault.size` is a key)
        assert code.split(".")[0] not in kinds or code in layout.RULES, code
    for rule in layout.Rule:
        assert f"| `{rule.code}` |" in SPEC_MD, rule.code


def test_the_warmup_document_has_the_documented_keys(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``smoe warmup --json`` (smoe-warmup/1): what it could not keep in numba's cache is
    in ``damaged`` and ``not_kept`` (issue 31), empty when all was kept."""
    from smoe import quant
    from smoe.quant.compiling import Warmed

    monkeypatch.setattr(quant, "warmup", lambda: [Warmed("decode to float32", False, 0.01)])
    code, doc = python(capsys, "warmup", "--json")
    assert code == 0 and set(doc) == documented_keys("Warmup document") - {"note"}
    assert doc["schema"] == "smoe-warmup/1"
    assert isinstance(doc["damaged"], list) and isinstance(doc["not_kept"], list)


# ---- families and spec (issue 33) ----------------------------------------------------------
@pytest.mark.parametrize(
    "args", [["families"], ["families", "olmoe"], ["families", "dbrx"], ["families", "aria_text"]]
)
def test_the_families_document_has_the_documented_keys(
    args: list[str], capsys: pytest.CaptureFixture
) -> None:
    code, doc = python(capsys, *args, "--json")
    assert code == 0 and set(doc) == documented_keys("Families document")
    assert doc["schema"] == "smoe-families/1" and doc["families"]
    for family in doc["families"]:
        assert set(family) == documented_keys("Family"), family["model_type"]


def test_the_spec_document_has_the_documented_keys(capsys: pytest.CaptureFixture) -> None:
    code, doc = python(capsys, "spec", "--json")
    assert code == 0 and set(doc) == documented_keys("Spec document")
    assert doc["schema"] == "smoe-spec/1" and doc["magic"] == layout.MAGIC.hex(" ")
    for struct in doc["structs"].values():
        assert {k for f in struct["fields"] for k in f} == {"name", "offset", "size", "doc"}
