"""`make gen` drift detection, compiler problem reporting, and packaging."""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path

from fixtures_data import ROOT
from helpers import run

GEN = [sys.executable, ROOT / "codegen" / "gen.py"]  # run(..., command=GEN, cwd=ROOT)


def test_committed_generated_files_are_current() -> None:
    proc = run("--check", command=GEN, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "generated files are current" in proc.stdout


def test_check_gen_names_a_hand_edited_file(tmp_path: Path) -> None:
    scratch = tmp_path / "generated"
    shutil.copytree(ROOT / "generated", scratch, ignore=shutil.ignore_patterns("__pycache__"))
    assert run("--check", "--out", str(scratch), command=GEN, cwd=ROOT).returncode == 0
    header = scratch / "cpp" / "common.hpp"
    header.write_text(header.read_text().replace("16384u", "4096u"))
    (scratch / "python" / "smoe_gen" / "stale.py").write_text("# left behind\n")
    proc = run("--check", "--out", str(scratch), command=GEN, cwd=ROOT)
    assert proc.returncode == 1
    want = "check-gen: generated/cpp/common.hpp: differs from what smoe.ksy generates"
    assert want in proc.stderr
    assert "check-gen: generated/python/smoe_gen/stale.py: not produced by the spec" in proc.stderr
    (scratch / "docs" / "SPEC.md").unlink()
    proc = run("--check", "--out", str(scratch), command=GEN, cwd=ROOT)
    assert "check-gen: generated/docs/SPEC.md: missing" in proc.stderr


def test_compiler_errors_fail_gen_and_warnings_are_shown(tmp_path: Path) -> None:
    spec = (ROOT / "spec" / "smoe.ksy").read_text()
    broken = tmp_path / "smoe.ksy"
    broken.write_text(spec.replace("valid: _root.header.group_size", "valid: _root.no_such_thing"))
    proc = run("--spec", str(broken), "--out", str(tmp_path / "out"), command=GEN, cwd=ROOT)
    assert proc.returncode == 1
    assert "unable to access 'no_such_thing'" in proc.stderr
    assert "compilation failed" in proc.stderr
    assert not (tmp_path / "out").exists()
    # A style warning (a field only used as the size of another) is shown, not fatal.
    warned = tmp_path / "warned.ksy"
    warned.write_text(spec.replace("        size: len_packed\n", "        size: len_scales\n"))
    proc = run("--spec", str(warned), "--out", str(tmp_path / "out2"), command=GEN, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "warning: use `len_packed` instead of `len_scales`" in proc.stderr


def test_wheel_ships_generated_parser_and_layout(tmp_path: Path) -> None:
    """A non-editable build (from a copy, so the work tree stays clean)."""
    src = tmp_path / "src"
    for rel in ("pyproject.toml", "README.md", "LICENSE", "smoe", "generated/python"):
        copy = shutil.copytree if (ROOT / rel).is_dir() else shutil.copy
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        copy(ROOT / rel, src / rel)
    proc = run(
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-v",
        "-w",
        tmp_path,
        src,
        command=[sys.executable],
    )
    assert proc.returncode == 0, proc.stderr
    assert "Deprecat" not in proc.stdout + proc.stderr  # e.g. a license table
    (wheel,) = tmp_path.glob("smoe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "smoe_gen/smoe_kaitai.py",
        "smoe_gen/layout.py",
        "smoe/cli/__init__.py",
        "smoe/__main__.py",
        "smoe/py.typed",
        "smoe/cli/templates/report.html.j2",
        "smoe_gen/smoe.ksy",
    } <= names
    # every module and template of the package, whatever subpackage it is in; no test kit
    shipped = {
        str(f.relative_to(ROOT)) for f in (ROOT / "smoe").rglob("*") if f.suffix in (".py", ".j2")
    }
    assert sorted(shipped - names) == []
    assert not any(n.startswith("smoe_testkit/") for n in names)
    from smoe import __version__

    dist = f"smoe-{__version__}.dist-info"  # the version comes from smoe/__init__.py
    assert f"{dist}/licenses/LICENSE" in names
    metadata = zipfile.ZipFile(wheel).read(f"{dist}/METADATA").decode()
    assert "License-Expression: MIT" in metadata.splitlines()
    entry_points = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in names if n.endswith("entry_points.txt")))
        .decode()
    )
    assert "smoe = smoe.cli:main" in entry_points
    assert "smoe-dump = smoe.cli:dump_main" in entry_points
