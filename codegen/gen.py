"""`make gen` / `make check-gen`: regenerate everything under generated/ from the .ksy
(and the exit-code table, codegen/exit_codes.yaml).

* the Kaitai Python parser and the graphviz diagram come from the official compiler
  (codegen/ksc.js, pinned in codegen/package-lock.json), every warning and error shown;
* the C++ header, the numpy layout module and SPEC.md come from the jinja2 templates
  in codegen/templates/, fed by codegen/model.py;
* the exit statuses of the tools (smoe_gen.exit_codes for the Python CLI, exit_codes.hpp
  for smoe-stream) from codegen/exit_codes.yaml, the toolchain's table rather than the
  format's.

usage: python codegen/gen.py [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SPEC = ROOT / "spec" / "smoe.ksy"
EXIT_CODES = HERE / "exit_codes.yaml"
GENERATED = ROOT / "generated"

sys.path.insert(0, str(HERE))
import model as ksy_model  # noqa: E402

PARSER = "python/smoe_gen/smoe_kaitai.py"
OPTIONAL = {"docs/smoe.svg"}  # written only where graphviz's `dot` is installed
FROM_EXIT_CODES = {"python/smoe_gen/exit_codes.py", "cpp/exit_codes.hpp"}


class GenError(Exception):
    pass


def compile_ksy(spec: Path) -> dict[str, dict[str, str]]:
    """Run the Kaitai compiler; print its problems; raise on errors."""
    node = shutil.which("node")
    if node is None:
        raise GenError("node is not installed; run `make setup`")
    if not (HERE / "node_modules" / "kaitai-struct-compiler").is_dir():
        raise GenError("codegen/node_modules is missing; run `make setup` (npm ci)")
    proc = subprocess.run(
        [node, str(HERE / "ksc.js"), str(spec), "python", "graphviz"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode == 2 or not proc.stdout:
        raise GenError(f"kaitai-struct-compiler failed to run:\n{proc.stderr}")
    result = json.loads(proc.stdout)
    for p in result["problems"]:
        print(f"ksc {result['version']} {p['severity']}: {p['text']}", file=sys.stderr)
    if proc.returncode != 0:
        raise GenError(f"{spec.name}: compilation failed (see errors above)")
    return result["files"]


def load_exit_codes(path: Path) -> list[dict[str, object]]:
    """The kinds of codegen/exit_codes.yaml, checked: each a unique lower-case name, a
    status in [0, 255] and a one-line meaning; `ok` is 0 and the only kind with status 0."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise GenError(f"{path.name}: {e}") from None
    kinds = doc.get("kinds") if isinstance(doc, dict) else None
    if not isinstance(kinds, list) or not kinds:
        raise GenError(f"{path.name}: `kinds` must be a non-empty list")
    seen: set[str] = set()
    for k in kinds:
        if not isinstance(k, dict) or set(k) != {"name", "status", "meaning"}:
            raise GenError(f"{path.name}: each kind has exactly name, status and meaning: {k!r}")
        name, status, meaning = k["name"], k["status"], k["meaning"]
        if not isinstance(name, str) or not name.isidentifier() or name != name.lower():
            raise GenError(f"{path.name}: kind name {name!r} is not a lower-case identifier")
        if name in seen:
            raise GenError(f"{path.name}: kind {name!r} is listed twice")
        seen.add(name)
        if isinstance(status, bool) or not isinstance(status, int) or not 0 <= status <= 255:
            raise GenError(f"{path.name}: {name}: status {status!r} is not in [0, 255]")
        if (status == 0) != (name == "ok"):
            raise GenError(f"{path.name}: {name}: only `ok` has status 0")
        if not isinstance(meaning, str) or not meaning.strip():
            raise GenError(f"{path.name}: {name}: no meaning")
    if "ok" not in seen:
        raise GenError(f"{path.name}: no `ok` kind")
    return kinds


def render_all(spec: Path, exit_codes: Path = EXIT_CODES) -> dict[str, str]:
    """Every generated file, as relative path -> text."""
    files = compile_ksy(spec)
    try:
        m = ksy_model.load(spec)
    except ValueError as e:
        raise GenError(f"{spec.name}: {e}") from None
    kinds = load_exit_codes(exit_codes)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["oneline"] = lambda s: " ".join(str(s).split())
    env.filters["pyrepr"] = repr
    env.filters["cbytes"] = lambda b: ", ".join(f"0x{x:02X}" for x in b)
    env.filters["pybytes"] = lambda b: "b'" + "".join(f"\\x{x:02x}" for x in b) + "'"
    env.filters["hexwords"] = lambda b: " ".join(f"{x:02X}" for x in b)
    env.filters["cstring"] = lambda s: json.dumps(s, ensure_ascii=True)
    ctx = {"m": m, "spec_name": f"spec/{spec.name}", "ksc_version": "0.11.0"}
    codes = {"kinds": kinds, "source": f"codegen/{exit_codes.name}"}
    out = {
        PARSER: files["python"][f"{m.meta['id']}.py"],
        "python/smoe_gen/__init__.py": env.get_template("init.py.j2").render(ctx),
        "python/smoe_gen/layout.py": env.get_template("layout.py.j2").render(ctx),
        # the spec itself ships in the wheel (`smoe spec --ksy`)
        "python/smoe_gen/smoe.ksy": spec.read_text(encoding="utf-8"),
        "cpp/common.hpp": env.get_template("common.hpp.j2").render(ctx),
        "docs/SPEC.md": env.get_template("SPEC.md.j2").render(ctx),
        "docs/smoe.dot": files["graphviz"][f"{m.meta['id']}.dot"],
        "python/smoe_gen/exit_codes.py": env.get_template("exit_codes.py.j2").render(codes),
        "cpp/exit_codes.hpp": env.get_template("exit_codes.hpp.j2").render(codes),
    }
    dot = shutil.which("dot")
    if dot is not None:
        svg = subprocess.run(
            [dot, "-Tsvg"], input=out["docs/smoe.dot"], capture_output=True, text=True, check=True
        ).stdout
        out["docs/smoe.svg"] = svg
    return out


def write_tree(files: dict[str, str], dest: Path) -> None:
    for rel, text in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def drift(files: dict[str, str], committed: Path) -> list[str]:
    """Relative paths that differ between fresh output and the committed tree."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        write_tree(files, fresh)
        problems = []
        existing = {
            p.relative_to(committed).as_posix()
            for p in committed.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        for rel in sorted(set(files) | existing):
            if rel not in files:
                if rel in OPTIONAL:
                    continue
                problems.append(f"{rel}: not produced by the spec (stale file)")
            elif rel not in existing:
                problems.append(f"{rel}: missing (never generated or deleted)")
            elif not filecmp.cmp(fresh / rel, committed / rel, shallow=False):
                source = EXIT_CODES.name if rel in FROM_EXIT_CODES else SPEC.name
                problems.append(f"{rel}: differs from what {source} generates")
        return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=GENERATED, help="output tree (default generated/)")
    ap.add_argument("--spec", type=Path, default=SPEC, help="the .ksy (default spec/smoe.ksy)")
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    try:
        files = render_all(args.spec)
    except GenError as e:
        print(f"gen: {e}", file=sys.stderr)
        return 1
    if args.check:
        if "docs/smoe.svg" not in files:
            print(
                "check-gen: graphviz `dot` not installed; docs/smoe.svg not compared",
                file=sys.stderr,
            )
        problems = drift(files, args.out)
        for p in problems:
            print(f"check-gen: generated/{p}", file=sys.stderr)
        if problems:
            print(
                "check-gen: generated files are stale or hand-edited; run `make gen`",
                file=sys.stderr,
            )
            return 1
        print(f"check-gen: {len(files)} generated files are current")
        return 0
    write_tree(files, args.out)
    print(f"gen: wrote {len(files)} files under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
