"""`smoe families`: the family registry as a table, as JSON, and as the README's table.

The registry grows while these tests stand still: every expectation is read from
``registry.FAMILIES`` at run time, never a list written here.
"""

from __future__ import annotations

import dataclasses
from enum import Enum

import pytest

from smoe.cli.families import MARKERS, markdown_table, splice_readme
from smoe.families import registry
from smoe.families.registry import FAMILIES, Family

from fixtures_data import ROOT
from helpers import refused, run, strict_json

UNIQUE = sorted({f.model_type: f for f in FAMILIES.values()}.values(), key=lambda f: f.model_type)
ALIASES = sorted((a, f) for f in UNIQUE for a in f.aliases)
UNKNOWN = "no_such_moe_type"
assert UNKNOWN not in FAMILIES


def _decode(value: object, like: object) -> object:
    """A JSON value back into the Python value of the registry's field it came from."""
    if isinstance(like, Enum):
        return type(like)(value)
    if dataclasses.is_dataclass(like) and not isinstance(like, type):
        assert isinstance(value, dict), value
        fields = {f.name for f in dataclasses.fields(like)}
        assert set(value) == fields, (value, fields)
        return type(like)(**{k: _decode(v, getattr(like, k)) for k, v in value.items()})
    if isinstance(like, tuple):
        assert isinstance(value, list) and len(value) == len(like), (value, like)
        return tuple(_decode(v, x) for v, x in zip(value, like, strict=True))
    return value


def _rebuilt(doc: dict, family: Family) -> Family:
    names = [f.name for f in dataclasses.fields(Family)]
    assert set(names) <= set(doc), sorted(set(names) - set(doc))
    return Family(**{n: _decode(doc[n], getattr(family, n)) for n in names})


def test_the_table_lists_every_family() -> None:
    proc = run("families")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    rows = lines[2 : 2 + len(UNIQUE)]  # after the title and the header
    assert [r.split()[0] for r in rows] == [f.model_type for f in UNIQUE]  # once each, sorted
    for row, f in zip(rows, UNIQUE, strict=True):
        assert (" converted " if f.converted else " refused ") in row, row
        for alias in f.aliases:
            assert alias in row, (alias, row)
        if f.converted and f.architecture:
            assert f.architecture in row, row
    for f in UNIQUE:
        if not f.converted:
            assert f"{f.model_type} refused: {' '.join(f.refused.split())}" in lines


def test_the_long_table_shows_what_the_arch_block_cannot_carry() -> None:
    proc = run("families", "--long")
    assert proc.returncode == 0, proc.stderr
    for f in UNIQUE:
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(f.model_type + " "))
        for key in f.beyond:
            assert key in line, (f.model_type, key)
        reason = f.refused or f.note
        if reason:
            assert " ".join(reason.split()) in line, f.model_type


def test_json_round_trips_every_field_of_every_family() -> None:
    proc = run("families", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    assert list(doc) == ["schema", "families"] and doc["schema"] == "smoe-families/1"
    got = doc["families"]
    assert [d["model_type"] for d in got] == [f.model_type for f in UNIQUE]
    for d, f in zip(got, UNIQUE, strict=True):
        assert _rebuilt(d, f) == f, f.model_type
        assert d["status"] == ("converted" if f.converted else "refused")
        assert all(isinstance(v, str) for v in d["layouts"])  # enums as their values


@pytest.mark.parametrize("family", UNIQUE, ids=lambda f: f.model_type)
def test_one_family_by_name(family: Family) -> None:
    proc = run("families", family.model_type)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"family {family.model_type}"
    assert f"model type                 {family.model_type}" in lines
    if family.refused:
        assert " ".join(family.refused.split()) in proc.stdout
    if family.architecture:
        assert family.architecture in proc.stdout
    for key in family.beyond:
        assert key in proc.stdout
    one = strict_json(run("families", family.model_type, "--json").stdout)["families"]
    assert len(one) == 1 and _rebuilt(one[0], family) == family


NO_ALIAS = pytest.param("", None, marks=pytest.mark.skip(reason="no alias registered yet"))


@pytest.mark.parametrize("alias, family", ALIASES or [NO_ALIAS])
def test_one_family_by_alias(alias: str, family: Family) -> None:
    by_alias = run("families", alias)
    assert by_alias.returncode == 0, by_alias.stderr
    assert by_alias.stdout == run("families", family.model_type).stdout
    doc = strict_json(run("families", alias, "--json").stdout)
    assert [d["model_type"] for d in doc["families"]] == [family.model_type]


def test_an_unknown_model_type_says_what_the_sculptor_assumes() -> None:
    line = refused(run("families", UNKNOWN), 2)
    assert line == f"error: {registry.assumptions(UNKNOWN)}"
    assert f"'{UNKNOWN}'" in line
    proc = run("families", UNKNOWN, "--json")
    assert proc.returncode == 2
    doc = strict_json(proc.stdout)
    assert doc["ok"] is False
    assert doc["error"] == {"message": registry.assumptions(UNKNOWN), "exit_code": 2}


def test_markdown_prints_the_generated_table() -> None:
    proc = run("families", "--markdown")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == markdown_table()
    rows = proc.stdout.splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == [f.model_type for f in UNIQUE]


def test_the_readme_table_is_generated_from_the_registry() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert all(m in text for m in MARKERS), f"README.md has no {MARKERS[0]} block"
    assert splice_readme(text) == text, (
        "README.md's family table differs from the registry: regenerate it with "
        "`python -m smoe families --markdown` (paste between "
        f'{MARKERS[0]} and {MARKERS[1]}), or run: python -c "import pathlib; '
        "from smoe.cli.families import splice_readme as s; p = pathlib.Path('README.md'); "
        'p.write_text(s(p.read_text()))"'
    )
