"""The import contracts of the package's layers (also run by ``make lint``).

Each subpackage is one layer; a module may import its own layer and the layers below it,
never one above. Nothing imports the CLI but ``python -m smoe``; no module imports another
module's private (``_name``) names; the shipped package never imports the test kit. Lazy
imports inside functions and ``TYPE_CHECKING`` imports count like any other.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fixtures_data import ROOT

PACKAGE = ROOT / "smoe"

# Lowest first. docs/ARCHITECTURE.md shows the same table (tested below).
LAYERS = (
    "smoe.errors",
    "smoe.plumbing",
    "smoe.interop",
    "smoe.format",
    "smoe.families",
    "smoe.quant",
    "smoe.vault",
    "smoe.sculpt",
    "smoe.export",
    "smoe.cli",
)
ENTRY_POINTS = {"smoe", "smoe.__main__"}  # the facade and `python -m smoe`: above every layer


@dataclass(frozen=True)
class Import:
    """One imported module (``what``), and the names taken from it, at ``where``."""

    importer: str
    what: str
    names: tuple[str, ...]
    where: str


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute name of a relative import (``from . import x`` inside ``importer``)."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def imports_of(path: Path) -> Iterator[Import]:
    importer = module_name(path)
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(importer, alias.name, (), where)
        elif isinstance(node, ast.ImportFrom):
            what = _resolve(importer, is_package, node.level, node.module)
            yield Import(importer, what, tuple(a.name for a in node.names), where)


def all_imports() -> list[Import]:
    return [i for p in sorted(PACKAGE.rglob("*.py")) for i in imports_of(p)]


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the layer holding ``module`` (None: not in the package)."""
    for i, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return i
    return None


def _targets(imp: Import) -> Iterator[str]:
    """The smoe modules an import reaches: ``from smoe.format import plan`` reaches
    ``smoe.format.plan``, ``from smoe import quant`` reaches ``smoe.quant``."""
    if not (imp.what == "smoe" or imp.what.startswith("smoe.")):
        return
    yield imp.what
    for name in imp.names:
        yield f"{imp.what}.{name}"


def layer_violations(imports: list[Import]) -> list[str]:
    out = []
    for imp in imports:
        if imp.importer in ENTRY_POINTS:
            continue
        own = layer_of(imp.importer)
        assert own is not None, f"{imp.importer} belongs to no layer: add it to LAYERS"
        for target in _targets(imp):
            theirs = layer_of(target)
            if theirs is not None and theirs > own:
                out.append(f"{imp.where}: {imp.importer} ({LAYERS[own]}) imports {target}")
    return out


def test_every_module_belongs_to_a_layer() -> None:
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")} - ENTRY_POINTS
    assert sorted(m for m in modules if layer_of(m) is None) == []


def test_lower_layers_never_import_higher_ones() -> None:
    assert layer_violations(all_imports()) == []


def test_nothing_imports_the_cli_but_python_m_smoe() -> None:
    bad = [
        f"{i.where}: {i.importer}"
        for i in all_imports()
        if any(layer_of(t) == LAYERS.index("smoe.cli") for t in _targets(i))
        and layer_of(i.importer) != LAYERS.index("smoe.cli")
        and i.importer != "smoe.__main__"
    ]
    assert bad == []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_imports_another_modules_private_names() -> None:
    bad = [
        f"{i.where}: {i.importer} takes {n} from {i.what}"
        for i in all_imports()
        if i.what.startswith("smoe")
        for n in i.names
        if _private(n)
    ]
    bad += [
        f"{i.where}: {i.importer} imports the private module {i.what}"
        for i in all_imports()
        if any(_private(part) for part in i.what.split("."))
    ]
    assert bad == []


def _module_aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound to smoe modules (``from smoe import quant``, ``import smoe.x as y``)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("smoe"):
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("smoe") and a.asname:
                    names[a.asname] = a.name
    return names


def test_no_module_reaches_into_another_modules_private_attributes() -> None:
    """``quant._FACTORS`` from another module is a private name taken all the same."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = _module_aliases(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _private(node.attr)
            ):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert bad == []


def test_the_shipped_package_never_imports_test_or_tool_code() -> None:
    outside = ("smoe_testkit", "bench", "fuzz", "tests", "codegen", "fixtures")
    bad = [f"{i.where}: {i.what}" for i in all_imports() if i.what.split(".")[0] in outside]
    assert bad == []


@pytest.mark.parametrize(
    "importer, what, names, expected",
    [
        (
            "smoe.format.plan",
            "smoe.sculpt",
            (),
            ["x: smoe.format.plan (smoe.format) imports smoe.sculpt"],
        ),
        (
            "smoe.format.plan",
            "smoe",
            ("quant",),
            ["x: smoe.format.plan (smoe.format) imports smoe.quant"],
        ),
        ("smoe.sculpt.driver", "smoe.format.plan", ("Plan",), []),
        ("smoe.quant", "numpy", (), []),
    ],
)
def test_the_contract_check_itself(
    importer: str, what: str, names: tuple[str, ...], expected: list[str]
) -> None:
    assert layer_violations([Import(importer, what, names, "x")]) == expected


def test_relative_imports_resolve_inside_the_importer() -> None:
    assert _resolve("smoe.format.verify", True, 1, "header") == "smoe.format.verify.header"
    assert _resolve("smoe.format.verify.table", False, 1, "rules") == "smoe.format.verify.rules"
    assert _resolve("smoe.format.verify.table", False, 2, None) == "smoe.format"


def test_the_architecture_document_shows_the_same_layers() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    table = re.search(r"<!-- layers -->\n(.*?)<!-- /layers -->", text, re.S)
    assert table, "docs/ARCHITECTURE.md has no <!-- layers --> table"
    shown = re.findall(r"^\| \d+ \| `(smoe[\w.]*)` \|", table.group(1), re.M)
    assert shown == list(LAYERS)
