"""The rule registry (``-smoe-rules`` in spec/smoe.ksy): one list of rules, the same in
Python (``smoe_gen.layout.Rule``) and C++ (``smoe::rules``); every registered code is raised
by some input, every error code by a broken vault in both languages; the checkers name codes
only through the registry; the registry's ``ksy`` flag says what a Kaitai parser rejects.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path

import kaitaistruct
import numpy as np
import pytest

from smoe.format.verify import verify, verify_path
from smoe.format.verify.arch import ARCH
from smoe.format.verify.blobs import BLOBS
from smoe.format.verify.descriptors import DESCRIPTORS
from smoe.format.verify.header import HEADER
from smoe.format.verify.rules import Section, checkers, rule
from smoe.format.verify.table import TABLE
from smoe_gen import layout
from smoe_gen.layout import Rule
from smoe_gen.smoe_kaitai import Smoe

from fixtures_data import CORRUPT, EXPECTED, ROOT
from helpers import SMOE_STREAM, run
from rule_cases import (
    MANIFEST_CASES,
    NOTICE_CASES,
    RULE_CASES,
    UNREADABLE_CASES,
    apply,
    write_with_manifest,
)

ERRORS = {r.code for r in layout.Rule if r.severity == "error"}
RULE_LINE = re.compile(r": ([a-z]+\.[a-z0-9_]+) at offset (\d+) \(([^)]*)\): ")


pytestmark = pytest.mark.usefixtures("smoe_stream")


def broken_vaults() -> Iterator[tuple[str, str, int, bytes]]:
    """(code, field, offset, bytes) of every vault that breaks one error rule."""
    for name, exp in sorted(EXPECTED.items()):
        yield exp["code"], exp["field"], exp["offset"], (CORRUPT / name).read_bytes()
    for code, field, offset, base, patches, cut in RULE_CASES + UNREADABLE_CASES:
        yield code, field, offset, apply(base, patches, cut)


def findings(data: bytes) -> set[tuple[str, str, str, int]]:
    report = verify(np.frombuffer(data, np.uint8), deep=True)
    return {(f.severity, f.code, f.path, f.offset) for f in report.findings}


def cpp_first_error(path: Path) -> tuple[str, str, int] | None:
    """(code, field, offset) of what ``check --deep`` reports, or None for a valid vault."""
    r = run("check", "--deep", "--json", path, command=[SMOE_STREAM])
    if r.returncode == 0:
        return None
    if r.returncode == 1:
        (err,) = [f for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"]
        return err["code"], err["field"], err["offset"]
    assert r.returncode == 2, r.stderr  # unreadable: the stderr line names the rule
    m = RULE_LINE.search(r.stderr)
    assert m, r.stderr
    return m.group(1), m.group(3), int(m.group(2))


def kaitai_rejects(data: bytes) -> bool:
    """Whether the reference parser rejects ``data`` once every instance is touched."""
    try:
        s = Smoe.from_bytes(data)
        for e in s.experts:
            for d in e.tensors:
                _ = d.packed, d.scales
            _ = e.padding
        _ = s.arch
    except (kaitaistruct.KaitaiStructError, UnicodeDecodeError):  # EOF, validation, UTF-8
        return True
    return False


# ---- one registry ------------------------------------------------------------------------------
def test_python_and_cpp_registries_are_equal() -> None:
    r = run("rules", command=[SMOE_STREAM])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [
        {
            "code": rule.code,
            "severity": rule.severity,
            "load": rule.load,
            "deep": rule.deep,
            "ksy": rule.ksy,
            "sidecar": rule.sidecar,
            "rulings": ", ".join(rule.rulings),
            "message": rule.message,
        }
        for rule in layout.Rule
    ]


def test_registry_holds_the_shape_rules_and_the_sidecar_rules() -> None:
    assert layout.RULES["descriptor.shape"].rulings == ("D3",)
    assert layout.RULES["layer.shape"].severity == "error"
    assert {r.code for r in layout.Rule if r.sidecar} == {
        "manifest.malformed",
        "manifest.vault",
        "manifest.expert",
        "manifest.checksum",
    }
    assert all(r.severity == "error" and not r.deep for r in layout.Rule if r.load)


def test_checkers_name_codes_only_through_the_registry() -> None:
    """Findings are made, and checkers registered, from registry entries, never from a code
    spelled as a literal."""
    sources = sorted((ROOT / "smoe" / "format" / "verify").glob("*.py"))
    assert len(sources) > 1
    for path in sources:
        text = path.read_text()
        assert not re.search(r"Finding\(\s*[\"']|\.(one|many|rule)\(\s*[\"']", text), path.name
        assert not re.search(r"\brule\(\s*[\"']", text), path.name
    for name in ("vault.cpp", "manifest.cpp"):  # the C++ checkers
        text = (ROOT / "harness" / name).read_text()
        assert not re.search(r"\bfail\(\s*\"|Issue\{\s*\"", text), name


def test_every_rule_has_exactly_one_checker() -> None:
    """Each rule of the registry is checked by one registered function: the format's rules
    by a section of the verifier, the manifest's (sidecar) rules where the verifier reads
    and checks the manifest; a function checks several rules only where it says why."""
    found = checkers()
    assert set(found) == set(layout.RULES), sorted(set(layout.RULES) ^ set(found))
    for code, checker in found.items():
        assert [r.code for r in checker.rules].count(code) == 1, code
        assert (checker.section == "manifest") == layout.RULES[code].sidecar, code
        if len(checker.rules) > 1:
            assert inspect.getcomments(checker.check) or checker.check.__doc__, code
    sections = (HEADER, ARCH, TABLE, DESCRIPTORS, BLOBS)
    listed = [r.code for s in sections for c in s.checks for r in c.rules]
    assert len(listed) == len(set(listed))
    alone = {code for code, c in found.items() if c.section not in {s.name for s in sections}}
    assert alone == {"header.ffn_dim"} | {r.code for r in layout.Rule if r.sidecar}
    assert {r.code for r in layout.Rule if r.deep and not r.sidecar} == {
        r.code for c in BLOBS.checks for r in c.rules
    }


def test_a_checker_of_an_unknown_or_already_checked_rule_is_refused() -> None:
    before = checkers()
    demo: Section[None] = Section("demo")
    with pytest.raises(ValueError, match="not a rule of the spec's registry"):
        demo.rule("header.nonsense")(lambda facts: None)  # a code, not a Rule
    with pytest.raises(ValueError, match="not a rule of the spec's registry"):
        rule("table.order", section="demo")(lambda: None)  # a code, not a Rule
    with pytest.raises(ValueError, match=r"table\.order: already checked by _order"):
        demo.rule(Rule.TABLE_ORDER)(lambda facts: None)
    with pytest.raises(ValueError, match="already checked"):  # refused whole: nothing added
        rule(Rule.TABLE_ORDER, Rule.HEADER_FFN_DIM, section="demo")(lambda: None)
    with pytest.raises(ValueError, match="at least one rule"):
        demo.rule()(lambda facts: None)
    assert checkers() == before and demo.checks == []


def test_a_failed_gate_ends_its_section() -> None:
    """header.magic is a gate: a vault without the magic is judged on nothing else."""
    data = bytearray((CORRUPT.parent / "q4_v2.smoe").read_bytes())
    data[0] ^= 0xFF
    data[layout.HEADER_OFFSETS["bits"]] = 3  # would break header.bits, but is never read
    report = verify(np.frombuffer(bytes(data), np.uint8))
    assert [f.code for f in report.findings] == ["header.magic"]
    assert report.geometry is None


def test_a_finding_of_an_unregistered_code_is_refused() -> None:
    from smoe.format.findings import Finding

    with pytest.raises(ValueError, match="not a rule"):
        Finding("error", "header.nonsense", 0, "header", "")
    with pytest.raises(ValueError, match="not a rule"):
        Finding("warning", "header.magic", 0, "header.magic", "")  # an error rule


# ---- every code raised by some input ----------------------------------------------------------
def test_every_registered_code_is_raised_by_some_input(tmp_path: Path) -> None:
    raised = set()
    for code, field, offset, data in broken_vaults():
        if (layout.RULES[code].severity, code, field, offset) in findings(data):
            raised.add(code)
    for code, field, offset, base, patches, cut in NOTICE_CASES:
        if (layout.RULES[code].severity, code, field, offset) in findings(
            apply(base, patches, cut)
        ):
            raised.add(code)
    for case in MANIFEST_CASES:
        folder = tmp_path / case[0]
        folder.mkdir()
        report = verify_path(write_with_manifest(case, folder), deep=True)
        if (case[0], case[1], case[2]) in {(f.code, f.path, f.offset) for f in report.errors}:
            raised.add(case[0])
    assert raised == set(layout.RULES), sorted(set(layout.RULES) - raised)


def test_every_error_code_is_a_broken_vault_in_both_languages(tmp_path: Path) -> None:
    python, native = set(), set()
    for k, (code, field, offset, data) in enumerate(broken_vaults()):
        if ("error", code, field, offset) in findings(data):
            python.add(code)
        path = tmp_path / f"{k}.smoe"
        path.write_bytes(data)
        if cpp_first_error(path) == (code, field, offset):
            native.add(code)
    for case in MANIFEST_CASES:
        folder = tmp_path / case[0]
        folder.mkdir()
        vault = write_with_manifest(case, folder)
        if (case[0], case[1], case[2]) in {
            (f.code, f.path, f.offset) for f in verify_path(vault, deep=True).errors
        }:
            python.add(case[0])
        if cpp_first_error(vault) == case[:3]:
            native.add(case[0])
    assert python == ERRORS, sorted(ERRORS - python)
    assert native == ERRORS, sorted(ERRORS - native)


@pytest.mark.parametrize("case", NOTICE_CASES, ids=[c[0] for c in NOTICE_CASES])
def test_notices_leave_the_vault_valid(case: tuple, tmp_path: Path) -> None:
    code, field, offset, base, patches, cut = case
    data = apply(base, patches, cut)
    report = verify(np.frombuffer(data, np.uint8), deep=True)
    assert (code, field, offset) in {(f.code, f.path, f.offset) for f in report.findings}
    assert report.ok, [f.line() for f in report.errors]
    path = tmp_path / base
    path.write_bytes(data)
    assert cpp_first_error(path) is None
    assert not kaitai_rejects(data)


def test_unreadable_files_exit_2_in_both_languages(tmp_path: Path) -> None:
    for code, field, offset, base, patches, cut in UNREADABLE_CASES:
        path = tmp_path / base
        path.write_bytes(apply(base, patches, cut))
        r = run("verify", "--json", path)
        assert r.returncode == 2
        assert [(f["code"], f["field"], f["offset"]) for f in json.loads(r.stdout)["findings"]] == [
            (code, field, offset)
        ]
        r = run("check", path, command=[SMOE_STREAM])
        assert r.returncode == 2
        assert r.stderr == (
            f"smoe-stream: {path}: {code} at offset {offset} ({field}): file of "
            f"{path.stat().st_size} bytes is shorter than the "
            f"{layout.HEADER_SIZE}-byte header\n"
        )


# ---- what the .ksy states -------------------------------------------------------------------
def test_ksy_flag_says_what_a_kaitai_parser_rejects() -> None:
    """A broken vault of a rule the .ksy states is rejected by the generated parser; for each
    rule it does not state, some broken vault passes it."""
    passes: set[str] = set()
    for code, _field, _offset, data in broken_vaults():
        rejected = kaitai_rejects(data)
        if layout.RULES[code].ksy:
            assert rejected, code
        elif not rejected:
            passes.add(code)
    unstated = {
        code for code in ERRORS if not layout.RULES[code].ksy and not layout.RULES[code].sidecar
    }
    assert passes == unstated, sorted(unstated - passes)
