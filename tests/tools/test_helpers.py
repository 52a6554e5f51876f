"""The tests' own helpers (tests/helpers.py) do what their examples say."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from smoe.errors import SmoeError

import helpers


def test_helpers_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the examples name files that are not there
    result = doctest.testmod(helpers, optionflags=doctest.ELLIPSIS, report=False)
    assert result.attempted > 0
    assert result.failed == 0


def test_refused_looks_at_what_the_refusal_left(tmp_path: Path) -> None:
    vault, config, out = tmp_path / "v.smoe", tmp_path / "config.json", tmp_path / "new.smoe"
    vault.write_bytes(b"SMOE")
    config.write_text("{}")
    line = helpers.refused(
        ["upgrade", vault, "--config", config, "--out", out], unchanged=[vault], absent=out
    )
    assert line == (
        f"error: {vault}: header.size at offset 0 (header): file of 4 bytes is shorter than "
        "the 64-byte header"
    )

    def writes_then_refuses() -> None:
        out.write_bytes(b"")
        raise SmoeError("refused")

    with pytest.raises(AssertionError):  # it left a file where nothing may be
        helpers.refused(writes_then_refuses, absent=out)

    def changes_then_refuses() -> None:
        vault.write_bytes(b"SMOF")
        raise SmoeError("refused")

    with pytest.raises(AssertionError):  # it changed an input
        helpers.refused(changes_then_refuses, unchanged=[vault])
