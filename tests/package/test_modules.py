"""The package's modules: no import cycles among them, none over ~700 lines.

A cycle, even one broken at run time by a function-level import, is two modules that can
only change together; the graph below counts every import (lazy ones inside functions and
``TYPE_CHECKING`` ones too), as the layer contract does (test_layers.py). A module far over
700 lines does several jobs, unless it is one data table or one kernel (named below).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest
from test_layers import ENTRY_POINTS, PACKAGE, Import, all_imports, module_name

from fixtures_data import ROOT

MAX_LINES = 720  # about 700

# Over MAX_LINES, each with why: one table of data or one kernel, read as a whole.
LONG_MODULES = {
    "smoe/families/registry.py": "one data table: an entry per model family",
    "smoe/quant/kernels/encode.py": "one kernel: the compiled encoder and its replay",
    "smoe/quant/hessian.py": "one kernel: GPTQ-style rounding, its derivation first (#24)",
}

# Over MAX_LINES and doing several jobs: each to be split (issue #34), then removed here.
NOT_YET_SPLIT = {
    "smoe/cli/commands.py": "one module per command (#34 point 4)",
    "smoe/sculpt/source/checkpoint.py": "tensor discovery apart from the index (#34)",
    "smoe/sculpt/source/imatrix.py": "the GGUF and legacy forms apart (#34)",
}


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def edges(imports: Iterable[Import], known: Iterable[str]) -> dict[str, set[str]]:
    """Importer -> the package's modules it imports. ``from a import b`` reaches the module
    ``a.b`` when there is one, else ``a``. The entry points (the ``smoe`` facade, whose
    ``__version__`` modules read, and ``python -m smoe``) sit above every layer: an import
    of them is not an edge (test_layers.py checks what is taken from them)."""
    known = set(known)
    graph: dict[str, set[str]] = {m: set() for m in known}
    for imp in imports:
        wanted = [f"{imp.what}.{n}" for n in imp.names] or [imp.what]
        for target in wanted:
            target = target if target in known else imp.what
            if target in known and target != imp.importer and target not in ENTRY_POINTS:
                graph.setdefault(imp.importer, set()).add(target)
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan, iterative), each
    as one cycle through it: ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                part = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    part.add(w)
                    if w == v:
                        break
                if len(part) > 1:
                    found.append(_cycle_through(graph, part))
    return found


def _cycle_through(graph: Mapping[str, Iterable[str]], part: set[str]) -> list[str]:
    """One cycle inside the component ``part``, from its first module back to it (breadth
    first, so the shortest)."""
    start = min(part)
    came: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph.get(v, ())):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if w in part and w not in came:
                came[w] = v
                todo.append(w)
    raise AssertionError(f"no cycle in {sorted(part)}")


def test_no_import_cycles_among_the_packages_modules() -> None:
    found = cycles(edges(all_imports(), modules()))
    assert [" -> ".join(c) for c in found] == []


def test_the_package_takes_only_its_version_from_the_facade() -> None:
    """(``from smoe import quant`` takes a module, not the facade's name.)"""
    known = modules()
    bad = [
        f"{i.where}: {i.importer} takes {n}"
        for i in all_imports()
        if i.what in ENTRY_POINTS and i.importer not in ENTRY_POINTS
        for n in i.names or ("the module",)
        if n != "__version__" and f"{i.what}.{n}" not in known
    ]
    assert bad == []


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b", "a"]]),
        (
            {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"d2"}, "d2": {"d"}},
            [
                ["d", "d2", "d"],
                ["a", "b", "c", "a"],
            ],
        ),
    ],
)
def test_the_cycle_finder_itself(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_a_lazy_import_is_an_edge_like_any_other() -> None:
    imports = [
        Import("smoe.x.a", "smoe.x.b", ("f",), "a.py:9"),  # inside a function
        Import("smoe.x.b", "smoe.x", ("a",), "b.py:1"),  # from smoe.x import a
        Import("smoe.x.b", "smoe", ("__version__",), "b.py:2"),
    ]
    graph = edges(imports, ["smoe", "smoe.x", "smoe.x.a", "smoe.x.b"])
    assert cycles(graph) == [["smoe.x.a", "smoe.x.b", "smoe.x.a"]]


def test_no_module_is_over_about_700_lines_unless_named_with_why() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    named = LONG_MODULES | NOT_YET_SPLIT
    assert {p: n for p, n in sorted(long.items()) if p not in named} == {}


def test_every_named_long_module_is_still_long() -> None:
    """An exception that no longer holds is removed, not kept for later."""
    for rel in LONG_MODULES | NOT_YET_SPLIT:
        path = ROOT / rel
        assert path.is_file(), rel
        assert len(path.read_text(encoding="utf-8").splitlines()) > MAX_LINES, rel


# The sculpt pipeline passes named records (smoe.sculpt.outcome), not positional tuples;
# these still do, each with why (the source readers are being reworked apart, #34).
TUPLES_LEFT = {
    "smoe/sculpt/source/checkpoint.py": "ranges and the expert index: the source readers",
    "smoe/sculpt/source/imatrix.py": "the matrix's parsed rows: the source readers",
}


def _wide_tuples(path: Path, root: Path = ROOT) -> Iterator[str]:
    """Annotations of a function's arguments or result that are a tuple of more than two
    things, not all of one type (a per-tensor triple of one type is a sequence)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        for ann in [a.annotation for a in args] + [fn.returns]:
            for node in ast.walk(ann) if ann is not None else ():
                if (
                    isinstance(node, ast.Subscript)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "tuple"
                    and isinstance(node.slice, ast.Tuple)
                    and len(node.slice.elts) > 2
                    and len({ast.dump(e) for e in node.slice.elts}) > 1
                ):
                    yield f"{path.relative_to(root)}:{fn.lineno} {fn.name}: {ast.unparse(node)}"


def test_no_function_in_sculpt_passes_a_tuple_of_more_than_two_things() -> None:
    found = [
        hit
        for p in sorted((PACKAGE / "sculpt").rglob("*.py"))
        if str(p.relative_to(ROOT)) not in TUPLES_LEFT
        for hit in _wide_tuples(p)
    ]
    assert found == []


def test_the_wide_tuple_finder_itself(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "def f(a: tuple[int, str, int]) -> tuple[int, int, int]: ...\n"
        "def g() -> dict[str, tuple[float, bool]]: ...\n"
    )
    hits = [h.split(" ", 1)[1] for h in _wide_tuples(src, tmp_path)]
    assert hits == ["f: tuple[int, str, int]"]
