"""The public API of every module is declared (``__all__``) and documented by example: every
public function, class, method and property has a docstring with a ``>>>`` example, and
every example runs here as a doctest (from the repository root, so examples may name
``fixtures/...``; they write only into temporary directories)."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import pkgutil
from types import ModuleType

import pytest

import smoe

from fixtures_data import FIXTURES

SKIP = {"smoe.__main__"}  # `python -m smoe`: runs the CLI on import


def _modules() -> list[ModuleType]:
    names = [smoe.__name__] + [
        m.name for m in pkgutil.walk_packages(smoe.__path__, f"{smoe.__name__}.")
    ]
    return [importlib.import_module(n) for n in sorted(names) if n not in SKIP]


MODULES = _modules()


def _public(module: ModuleType) -> list[tuple[str, object]]:
    """The functions and classes ``module.__all__`` names that the module defines, with
    their public methods and properties (dunder methods excepted)."""
    found: list[tuple[str, object]] = []
    for name in getattr(module, "__all__", ()):
        obj = getattr(module, name)
        if getattr(obj, "__module__", None) != module.__name__:
            continue  # a constant, or a name re-exported from where it is documented
        if inspect.isfunction(obj):
            found.append((name, obj))
        elif inspect.isclass(obj):
            found.append((name, obj))
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(member, (classmethod, staticmethod)):
                    member = member.__func__
                if inspect.isfunction(member) or isinstance(member, property):
                    found.append((f"{name}.{attr}", member))
    return found


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_module_declares_its_public_api(module: ModuleType) -> None:
    names = getattr(module, "__all__", None)
    assert isinstance(names, list) and names, f"{module.__name__} has no __all__"
    assert len(set(names)) == len(names)
    assert [n for n in names if not hasattr(module, n) and not _submodule(module, n)] == []


def _submodule(module: ModuleType, name: str) -> bool:
    """A package may list its submodules in ``__all__`` without importing them (light imports)."""
    path = getattr(module, "__path__", None)
    return path is not None and importlib.util.find_spec(f"{module.__name__}.{name}") is not None


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_public_function_has_an_example(module: ModuleType) -> None:
    missing = [n for n, obj in _public(module) if ">>>" not in (inspect.getdoc(obj) or "")]
    assert missing == []


def _doctests() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder()
    seen: set[str] = set()
    out = []
    for m in MODULES:
        for t in finder.find(m):
            if t.examples and t.name not in seen:
                seen.add(t.name)
                out.append(t)
    return out


@pytest.mark.parametrize("test", _doctests(), ids=lambda t: t.name)
def test_docstring_examples_run(test: doctest.DocTest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES.parent)
    monkeypatch.setenv("NO_COLOR", "1")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out: list[str] = []
    result = runner.run(test, out=out.append)
    assert result.attempted > 0
    assert result.failed == 0, "".join(out)
