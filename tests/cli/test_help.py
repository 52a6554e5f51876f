"""Every option of every command says what it does, every subcommand has a description and
an example, and no docstring markup leaks into ``--help``."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from smoe.cli import dump_main, main
from smoe.cli.parser import build_dump_parser, build_parser

MARKUP = ("``", ":func:", ":mod:", ":class:", ":data:", "**")


def subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


COMMANDS = subparsers(build_parser())


def undocumented(p: argparse.ArgumentParser) -> list[str]:
    return [
        "/".join(a.option_strings) or a.dest
        for a in p._actions
        if not isinstance(a, argparse._HelpAction | argparse._VersionAction)
        and a.help != argparse.SUPPRESS
        and not (a.help or "").strip()
    ]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_argument_has_help(name: str) -> None:
    assert undocumented(COMMANDS[name]) == []


def test_smoe_dump_and_the_top_level_have_help_for_every_argument() -> None:
    assert undocumented(build_dump_parser()) == []
    top = [a for a in build_parser()._actions if not isinstance(a, argparse._SubParsersAction)]
    assert [a.dest for a in top if not (a.help or "").strip()] == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_a_description_and_an_example(name: str) -> None:
    p = COMMANDS[name]
    assert (p.description or "").strip(), name
    assert f"smoe {name}" in (p.epilog or "") or f"smoe-{name}" in (p.epilog or ""), name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_markup_leaks_into_help(name: str) -> None:
    text = COMMANDS[name].format_help()
    assert [m for m in MARKUP if m in text] == [], text


def test_no_markup_in_the_top_level_and_smoe_dump_help() -> None:
    for text in (build_parser().format_help(), build_dump_parser().format_help()):
        assert [m for m in MARKUP if m in text] == [], text


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_exits_0_and_shows_the_examples(name: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([name, "--help"]) == 0
    assert (COMMANDS[name].epilog or "").splitlines()[-1].strip() in out.getvalue()


def test_smoe_dump_help_exits_0() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert dump_main(["--help"]) == 0
    assert "usage: smoe-dump" in out.getvalue()
