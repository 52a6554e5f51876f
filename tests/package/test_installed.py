"""The package as users get it: the wheel and the sdist of this checkout, installed into a
clean virtual environment outside the repository, running the README's commands.

The rest of the suite runs against the editable install of the checkout, which finds every
module in the source tree whatever the wheel holds: a subpackage left out of pyproject's
``[tool.setuptools] packages`` once went unnoticed that way (``smoe export --hf`` failed
after ``pip install .`` with ``No module named 'smoe.hf'``). Here:

* **Building.** The checkout's files (``git ls-files``: tracked and untracked-but-not-ignored,
  as a clone with the work in progress would have them; without git, the tree less what
  .gitignore names) are copied to a temporary folder, so a stale ``build/lib`` or egg-info of
  the checkout cannot leak into the wheel and nothing is written into the repository. From
  the copy: ``pip wheel --no-deps --no-build-isolation`` (what ``pip install .`` builds), and
  from a second copy ``python -m build --no-isolation``, which makes the sdist and then a
  wheel from the sdist unpacked (``build`` comes with the ``dev`` extra, which ``make
  setup`` installs).
* **Contents.** The wheel holds exactly the files of ``smoe/`` and
  ``generated/python/smoe_gen/`` (every module, every package's ``__init__.py``, the package
  data: ``py.typed``, ``smoe/cli/templates/*``, ``smoe_gen/smoe.ksy``), nothing else beside
  its dist-info, and RECORD lists every member; every resource the code reads through
  ``importlib.resources`` or jinja2's ``PackageLoader`` is in it. The sdist holds every
  source file, pyproject.toml, README.md (the long description) and LICENSE, and the wheel
  built from it is the first wheel member for member, byte for byte.
* **Installing.** Each wheel goes into its own ``python -m venv`` (no system site packages)
  under the temporary folder. The dependencies come from where ``make setup`` gets them:
  this environment's pip configuration (its indexes and find-links, untouched), resolved
  once with ``pip download`` into a wheelhouse that both installs then use with
  ``--no-index``. Only the core dependencies are installed: no extra, so no torch. To save
  time the venvs are made ``--without-pip`` and installed into with this environment's pip
  (``pip --python VENV/bin/python``, the same pip a fresh venv would bring; with a pip
  older than 22.3, which lacks ``--python``, the venvs get their own), ``--no-compile``:
  smoe's own modules are byte-compiled after (every one must compile), the dependencies'
  by their first import.
* **Running.** Every command runs with its working directory in the temporary folder (never
  the repository), the venv's ``bin`` first on PATH as ``activate`` puts it, no
  ``PYTHON*``/``SMOE_*`` variables, plain output (``NO_COLOR``, ``TERM=dumb``), a private
  ``HF_HOME`` and ``HF_HUB_OFFLINE=1``, against copies of the repository's fixtures laid out
  as the README names them (``fixtures/checkpoints/qwen3_moe``, ``fixtures/q4_v2.smoe`` ...).
  Commands run concurrently (after one that byte-compiles what the CLI imports), those
  reading the README's first sculpt once it is done; each test then checks its commands'
  results, and every failure names the command, its exit status and its stderr.

README commands covered (in the clean venv of the wheel; the venv of the sdist's wheel,
whose files are checked identical, runs ``--version``, the sculpt, ``export --hf``,
``report`` and ``spec --ksy`` again):

* "Install and first steps", run line by line as the README has them: ``pip install .`` (as
  the wheel ``pip install .`` builds, installed), ``smoe --version``, ``python -m smoe
  --version``, ``smoe sculpt fixtures/checkpoints/qwen3_moe out/`` (its four files
  byte-identical to what the checkout's own package writes with the same numpy encoder,
  which tests/sculpt/test_demo_outputs.py holds to fixtures/DEMO.json),
  ``smoe verify --deep out/qwen3_moe.smoe``,
  ``smoe-dump out/qwen3_moe.smoe | grep data_offset``, and the Python example;
* ``smoe --help``, ``smoe-dump --help`` and ``smoe COMMAND --help`` for every subcommand of
  the checkout's parser;
* ``smoe sculpt`` with ``--dry-run``; ``--format-version 1 --json``; ``--bits 2
  --max-layers 1 --max-experts 2 --scale absmax --jobs 1 --json``;
* ``smoe families`` plain, ``MODEL_TYPE``, ``--long``, ``--json``, ``--markdown`` (the same
  table as this checkout's), and the README's ``python -c "... splice_readme ..."`` on a
  copy of the README;
* ``smoe verify VAULT --deep [--json]``; ``smoe dump VAULT --experts``, ``--layer 1``,
  ``smoe-dump VAULT --json``, the three ``smoe dump V --field ...`` examples (on
  ``fixtures/q4_v2.smoe``, whose values the README shows);
* ``smoe report VAULT -o page.html``, and ``--deep --json``;
* ``smoe export VAULT OUT.safetensors`` (float32), with ``--layer 1 --expert 3``;
* ``smoe export VAULT OUT_DIR --hf`` (it writes with numpy and safetensors only, so it runs
  here: this is the command the missing ``smoe.hf`` broke), and ``--hf --rebuild-config
  --dtype f32 --json``;
* ``smoe upgrade VAULT --config CONFIG_JSON`` on the v1 fixture ``fixtures/q4_v1.smoe``
  (then verified), and ``smoe upgrade VAULT --model MODEL_DIR`` on a v1 sculpt, which gives
  the v2 sculpt byte for byte;
* "From Python" and the error-taxonomy example: ``import smoe`` stays light, ``Vault.open``
  as a context manager, ``v[l, e]``, ``np.asarray(view)``, ``dequantize(dtype=np.float16)``,
  ``items()``, ``tensor_names()``/``get_tensor``, ``header``/``arch``, the Mapping API,
  ``v[0, :]``'s TypeError, ``UnreadableInput``/``SmoeError``, ``help(Vault)``,
  ``dequantize(dtype="bfloat16")`` without ml_dtypes (its hint, ``pip install ml-dtypes``:
  a plain package, no extra); and that ``smoe_testkit`` (not installed, says the README)
  is indeed absent.

Not covered, and why: ``pip install '.[NAME]'`` for the extras (torch, transformers, numba,
gguf are not core); ``smoe sculpt --calibrate`` (torch, transformers), ``--imatrix`` (gguf),
``SMOE_KERNEL=fast`` (numba), ``smoe sculpt ORG/NAME`` (huggingface_hub, a download):
each of those is run only far enough to check its hint (below); ``--resume``,
``--jobs N`` and the refusals (the rest of the suite; nothing about them depends on how the
package is installed); ``make`` targets, ``build/smoe-stream`` (C++, not part of the
package), ``python -m smoe_testkit.synth`` and ``python -m fuzz.sidecar_target``
(developer tools, not installed); loading an ``export --hf`` folder with transformers (the
``hf`` extra: tests/export/test_hf_roundtrip.py).

Hints for a missing extra. Every ``pip install`` a message of the package prints for an
optional dependency names it as ``pip install 'smoe[EXTRA]'`` (ml_dtypes, in no extra but
dev, as ``pip install ml-dtypes``); run in the clean venv, ``smoe sculpt ORG/NAME``,
``--imatrix``, ``--calibrate`` and ``SMOE_KERNEL=fast`` each give one line naming the
missing module and an extra of the wheel that brings it. That form is the one that works
wherever the user is, as long as it is the pip of the environment smoe runs in: pip takes
the installed smoe (the wheel, ``pip install .`` from a clone, or the editable install of
``make setup``) as satisfying ``smoe`` and fetches only the extra's own requirements, so no
index needs to publish smoe (none does). ``pip install '.[EXTRA]'`` works only in a clone's
root, and would replace an editable install with a copy. The last tests ask the venv's pip
(``--dry-run --no-deps``, from the configured indexes, no wheelhouse) to carry out the
hints' commands.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import textwrap
import traceback
import zipfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from smoe import __version__
from smoe.cli.parser import build_parser

from fixtures_data import CKPTS, FIXTURES, OLMOE_CONFIG, ROOT
from helpers import plain_env, run

README = ROOT / "README.md"
KSY = ROOT / "spec" / "smoe.ksy"  # what `smoe spec --ksy` prints (its copy ships in smoe_gen)
CHECKPOINT = "fixtures/checkpoints/qwen3_moe"  # as the README names it, under the work folder
IMATRIX = "imatrix.gguf"  # a GGUF importance matrix (a legacy .dat needs no gguf): its magic
VAULT = "out/qwen3_moe.smoe"  # what the README's first sculpt writes
# where each package's files are in the source tree (pyproject's [tool.setuptools.package-dir])
SOURCES = {"smoe": Path("smoe"), "smoe_gen": Path("generated/python/smoe_gen")}
LIMIT = 600.0  # seconds; a guard against a hang, never a measure of speed
# pip >= 22.3 installs into another interpreter's environment (`pip --python PY`): the venvs
# are then made without pip of their own (ensurepip costs more than the rest of a venv)
PIP_VERSION = tuple(int(n) for n in re.findall(r"\d+", importlib.metadata.version("pip"))[:2])
PIP_PYTHON = PIP_VERSION >= (22, 3)
# what a build or the compiler leaves in a source tree, never part of a package
# (and an editor's hidden or backup files, which no package means to ship)
NOT_SOURCE = re.compile(r"(^|/)(__pycache__/|\.)|\.py[co]$|\.nb[ic]$|~$")
# modules a core install must not have (extras, and what the README says is not installed)
ABSENT = (
    "smoe_testkit",
    "torch",
    "transformers",
    "huggingface_hub",
    "numba",
    "gguf",
    "ml_dtypes",
    "pytest",
)


# ---- running commands ------------------------------------------------------------------------
@dataclass
class Ran:
    """A finished command: what it was (as a user would type it), where, and what it gave."""

    cmd: str
    cwd: str
    code: int
    out: str
    err: str

    def explain(self, what: str) -> str:
        """``what`` went wrong, with the command, its exit status, stderr and stdout."""

        def block(text: str) -> str:
            return textwrap.indent(text.rstrip("\n") or "(empty)", "    ")

        return (
            f"{what}\n  command: {self.cmd}\n  in: {self.cwd}\n  exit status: {self.code}\n"
            f"  stderr:\n{block(self.err)}\n  stdout (first 4000 characters):\n"
            f"{block(self.out[:4000])}"
        )

    def ok(self) -> Ran:
        """This command, which must have succeeded with nothing alarming on stderr."""
        assert self.code == 0, self.explain("the command failed")
        assert "Traceback" not in self.err, self.explain("the command printed a traceback")
        return self

    def json(self) -> dict:
        """Its stdout as one JSON document."""
        self.ok()
        try:
            return json.loads(self.out)
        except ValueError as e:
            raise AssertionError(self.explain(f"stdout is not one JSON document: {e}")) from None


def execute(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path,
    env: Mapping[str, str],
    shown: str | None = None,
) -> Ran:
    """Run ``argv`` to its end in ``cwd`` with exactly ``env``, stdin at end of file."""
    words = [os.fspath(a) for a in argv]
    try:
        proc = subprocess.run(
            words,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=LIMIT,
        )
    except (OSError, subprocess.TimeoutExpired) as e:  # not found, not executable, a hang
        return Ran(shown or shlex.join(words), str(cwd), -1, "", f"{type(e).__name__}: {e}")
    return Ran(shown or shlex.join(words), str(cwd), proc.returncode, proc.stdout, proc.stderr)


def host_env() -> dict[str, str]:
    """The environment of this checkout's tools (builds, pip): ours, less what would point
    Python elsewhere; the pip configuration (PIP_*, HOME's config files) stays as it is."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH")
    }


def host(*words: str | os.PathLike[str], cwd: Path) -> Ran:
    """``python WORDS`` with this checkout's interpreter (its pip, setuptools, build)."""
    shown = shlex.join(["python", *map(os.fspath, words)])
    return execute([sys.executable, *words], cwd=cwd, env=host_env(), shown=shown)


class Venv:
    """A clean virtual environment and the environment its commands run in."""

    def __init__(self, path: Path, home: Path) -> None:
        self.path = path
        self.bin = path / "bin"
        self.python = self.bin / "python"
        env = plain_env()
        for name in list(env):
            if name.startswith(("PYTHON", "SMOE_", "HF_")) or name in (
                "VIRTUAL_ENV",
                "CONDA_PREFIX",
            ):
                del env[name]
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', os.defpath)}"  # as `activate` does
        env["VIRTUAL_ENV"] = str(path)
        env["HF_HOME"] = str(home / "hf-home")  # an empty HuggingFace cache of its own
        env["HF_HUB_OFFLINE"] = "1"
        self.env = env

    def run(self, *words: str, cwd: Path, **changes: str) -> Ran:
        """``WORDS`` as typed in a shell with this venv activated (``smoe``, ``python`` are
        the venv's), in ``cwd``, with ``changes`` to the environment."""
        found = shutil.which(words[0], path=self.env["PATH"])
        if found is None or Path(found).parent != self.bin:
            return Ran(shlex.join(words), str(cwd), -1, "", f"{words[0]}: not in {self.bin}")
        env = {**self.env, **changes}
        shown = (
            shlex.join(words)
            if not changes
            else shlex.join([*map("=".join, changes.items()), *words])
        )
        return execute([found, *words[1:]], cwd=cwd, env=env, shown=shown)

    def shell(self, line: str, *, cwd: Path) -> Ran:
        """One shell line (a pipeline), under ``bash -o pipefail``."""
        return execute(["bash", "-o", "pipefail", "-c", line], cwd=cwd, env=self.env, shown=line)

    def pip(self, *words: str, cwd: Path) -> Ran:
        """``pip WORDS`` for this venv: this environment's pip aimed at the venv's python
        (or, where that pip is too old for ``--python``, the venv's own)."""
        shown = shlex.join(["pip", *words])
        if PIP_PYTHON:
            argv = [sys.executable, "-m", "pip", "--python", self.python, *words]
        else:  # the venv's own pip
            argv = [self.python, "-m", "pip", *words]
        return execute(argv, cwd=cwd, env=host_env(), shown=shown)


def chain(*steps: Callable[[], Ran]) -> list[Ran]:
    """Steps run in order, stopping after the first that fails."""
    done: list[Ran] = []
    for step in steps:
        done.append(step())
        if done[-1].code != 0:
            break
    return done


def all_ok(steps: object) -> list[Ran]:
    """A :func:`chain`'s steps, each of which must have succeeded."""
    if isinstance(steps, Ran):  # a job that raised
        steps.ok()
    assert isinstance(steps, list)
    return [step.ok() for step in steps]


# ---- building --------------------------------------------------------------------------------
@dataclass
class Built:
    top: Path  # the temporary folder everything below is in
    src: Path  # the copy of the checkout the wheel is built from
    wheel: Path  # as `pip install .` builds it
    sdist: Path
    sdist_wheel: Path  # the wheel built from the sdist
    wheelhouse: Path  # the core dependencies, as pip resolved them from its configuration
    venv: Venv  # the wheel, installed


def source_files(root: Path) -> list[str]:
    """The checkout's files, relative: what a clone holds, with the work in progress."""
    listed = subprocess.run(
        ["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )
    if listed.returncode == 0 and listed.stdout:
        names = [os.fsdecode(n) for n in listed.stdout.split(b"\0") if n]
        return [n for n in names if (root / n).is_file() or (root / n).is_symlink()]
    # no git (or not a repository): the tree, less what .gitignore names
    skip = re.compile(
        r"(^|/)(\.git|\.venv|build|node_modules|__pycache__|[^/]*\.egg-info|\.[a-z_]*cache"
        r"|\.hypothesis)(/|$)|\.tmp$"
    )
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if (p.is_file() or p.is_symlink()) and not skip.search(p.relative_to(root).as_posix())
    )


def copy_files(root: Path, names: list[str], dest: Path) -> None:
    for name in names:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target, follow_symlinks=False)


def only(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {folder}, found {[p.name for p in found]}"
    return found[0]


def build_wheel(tree: Path, out: Path, cwd: Path) -> Path:
    """What ``pip install TREE`` builds and installs."""
    host(
        "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, tree, cwd=cwd
    ).ok()
    return only(out, "smoe-*.whl")


def build_sdist_and_its_wheel(src: Path, top: Path) -> tuple[Path, Path]:
    """The sdist of ``src`` and the wheel ``build`` makes from it (unpacked, not from src)."""
    probe = host("-c", "import build", cwd=top)
    assert probe.code == 0, probe.explain(
        "the `build` package is missing from this environment: it comes with the dev extra "
        "(make setup, or pip install -e '.[dev]')"
    )
    out = top / "sdist"
    host("-m", "build", "--no-isolation", "-o", out, src, cwd=top).ok()
    return only(out, "smoe-*.tar.gz"), only(out, "smoe-*.whl")


COMPILE = (  # what pip does at install, for smoe's own packages: exit 1 if a module fails
    "import compileall, sys, sysconfig; p = sysconfig.get_paths()['purelib']; "
    "sys.exit(not all([compileall.compile_dir(f'{p}/{d}', quiet=1) for d in ('smoe', 'smoe_gen')]))"
)


def make_venv(path: Path, wheel: Path, wheelhouse: Path, top: Path) -> tuple[Venv, list[Ran]]:
    """A clean venv with ``wheel`` installed, its dependencies from ``wheelhouse`` alone."""
    venv = Venv(path, top)
    steps = chain(
        lambda: host("-m", "venv", *(["--without-pip"] if PIP_PYTHON else []), path, cwd=top),
        lambda: venv.pip(
            "install",
            "-q",
            "--no-compile",
            "--no-index",
            "--find-links",
            str(wheelhouse),
            str(wheel),
            cwd=top,
        ),
        # the package's own modules byte-compiled, as pip does by default (the dependencies'
        # are compiled by their first import)
        lambda: venv.run(
            "python",
            "-c",
            COMPILE,
            cwd=top,
        ),
    )
    return venv, steps


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    top = tmp_path_factory.mktemp("installed").resolve()
    assert not top.is_relative_to(ROOT.resolve()), f"{top} is inside the checkout"
    names = source_files(ROOT)
    src = top / "checkout"
    src_for_sdist = top / "checkout-for-sdist"  # each build writes into the tree it builds
    copy_files(ROOT, names, src)
    copy_files(ROOT, names, src_for_sdist)
    with ThreadPoolExecutor(1) as pool:
        sdist_job = pool.submit(build_sdist_and_its_wheel, src_for_sdist, top)
        wheel = build_wheel(src, top / "wheel", top)
        house = top / "wheelhouse"
        host("-m", "pip", "download", "-q", "-d", house, wheel, cwd=top).ok()
        for ours in house.glob("smoe-*"):
            ours.unlink()
        venv, steps = make_venv(top / "venv-wheel", wheel, house, top)
        all_ok(steps)
        sdist, sdist_wheel = sdist_job.result()
    return Built(top, src, wheel, sdist, sdist_wheel, house, venv)


# ---- what should be in the wheel -------------------------------------------------------------
def package_files(tree: Path) -> dict[str, Path]:
    """Every file of the two packages in a copy of the checkout, by the name it must have in
    a wheel."""
    files = {}
    for package, folder in SOURCES.items():
        base = tree / folder
        assert (base / "__init__.py").is_file(), f"{base}: no __init__.py"
        for p in base.rglob("*"):
            rel = p.relative_to(base).as_posix()
            if p.is_file() and not NOT_SOURCE.search(rel):
                files[f"{package}/{rel}"] = p
    return files


def members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {i.filename: z.read(i) for i in z.infolist() if not i.is_dir()}


def dist_info(wheel: Path) -> str:
    """The dist-info folder of a wheel named ``NAME-VERSION-...``."""
    name, version = wheel.name.split("-")[:2]
    return f"{name}-{version}.dist-info"


def test_the_wheel_is_named_for_this_version(built: Built) -> None:
    assert built.wheel.name == f"smoe-{__version__}-py3-none-any.whl"
    assert built.sdist.name == f"smoe-{__version__}.tar.gz"


def test_the_wheel_holds_every_package_module_and_data_file_and_nothing_else(
    built: Built,
) -> None:
    want = package_files(built.src)
    got = members(built.wheel)
    info = dist_info(built.wheel)
    missing = sorted(set(want) - set(got))
    extra = sorted(n for n in set(got) - set(want) if not n.startswith(f"{info}/"))
    packages = sorted({str(Path(n).parent) for n in missing if n.endswith(".py")})
    assert not missing, (
        f"{built.wheel.name} lacks {missing}: a subpackage missing from pyproject.toml's "
        f"[tool.setuptools] packages ({packages}?) or data from its package-data"
    )
    assert not extra, f"{built.wheel.name} holds files that are not the packages': {extra}"
    for name, path in want.items():
        assert got[name] == path.read_bytes(), f"{name} in the wheel differs from {path}"
    # every folder of smoe/ with modules is a regular package (namespace packages are not
    # found by an explicit packages list)
    for folder in sorted({Path(n).parent for n in want if n.endswith(".py")}):
        assert f"{folder.as_posix()}/__init__.py" in want, f"{folder}: modules but no __init__.py"
    assert {"smoe/py.typed", "smoe/cli/templates/report.html.j2", "smoe_gen/smoe.ksy"} <= set(got)
    # the dist-info: RECORD lists every member, the commands and the top-level packages
    record = got[f"{info}/RECORD"].decode()
    listed = {line.split(",")[0] for line in record.splitlines() if line}
    assert listed == set(got), f"RECORD and the wheel differ: {sorted(listed ^ set(got))}"
    for line in record.splitlines():
        name, digest, _size = line.rsplit(",", 2)
        if digest:
            algo, _, value = digest.partition("=")
            actual = base64.urlsafe_b64encode(hashlib.new(algo, got[name]).digest()).rstrip(b"=")
            assert actual.decode() == value, f"RECORD's hash of {name} is wrong"
    entry_points = got[f"{info}/entry_points.txt"].decode()
    assert "smoe = smoe.cli:main" in entry_points, entry_points
    assert "smoe-dump = smoe.cli:dump_main" in entry_points, entry_points
    assert got[f"{info}/top_level.txt"].decode().split() == ["smoe", "smoe_gen"]
    assert f"{info}/licenses/LICENSE" in got


RESOURCE_READS = (
    # importlib.resources: files("pkg").joinpath("name") / files("pkg") / "name"
    re.compile(r"""files\(\s*["']([\w.]+)["']\s*\)\s*(?:\.joinpath\(|/)\s*["']([^"']+)["']"""),
    # jinja2: PackageLoader("pkg", "folder")
    re.compile(r"""PackageLoader\(\s*["']([\w.]+)["']\s*,\s*["']([^"']+)["']"""),
)


def test_every_resource_the_code_reads_is_in_the_wheel(built: Built) -> None:
    """Resources named in the code (not only those package-data lists) are in the wheel;
    and no module reads a file beside itself through ``__file__`` (a file there would be
    missing from the wheel unless package-data named it)."""
    got = set(members(built.wheel))
    reads = []
    for name, path in package_files(built.src).items():
        if not name.endswith(".py"):
            continue
        text = path.read_text(encoding="utf-8")
        for pattern in RESOURCE_READS:
            for package, resource in pattern.findall(text):
                reads.append((name, package, resource))
        for line in text.splitlines():
            if "Path(__file__)" in line or "os.path.dirname(__file__)" in line:
                raise AssertionError(f"{name} reads beside itself through __file__: {line.strip()}")
    assert {r[2] for r in reads} >= {"smoe.ksy", "templates"}, reads  # the scan finds them
    for module, package, resource in reads:
        prefix = package.replace(".", "/") + "/" + resource
        assert any(m == prefix or m.startswith(prefix + "/") for m in got), (
            f"{module} reads {resource!r} of {package}, which the wheel does not hold "
            "(add it to [tool.setuptools.package-data])"
        )


def sdist_files(sdist: Path) -> dict[str, bytes]:
    """The regular files of an sdist, by their path under its ``NAME-VERSION/`` folder."""
    files = {}
    with tarfile.open(sdist) as tar:
        for info in tar.getmembers():
            head, _, rest = info.name.partition("/")
            assert head == sdist.name.removesuffix(".tar.gz"), f"{sdist.name}: {info.name}"
            reader = tar.extractfile(info) if info.isfile() else None
            if reader is not None:
                files[rest] = reader.read()
    return files


def test_the_sdist_holds_what_a_wheel_needs_and_builds_the_same_wheel(built: Built) -> None:
    have = sdist_files(built.sdist)
    for needed in ("pyproject.toml", "README.md", "LICENSE", "PKG-INFO"):
        assert needed in have, f"{built.sdist.name} has no {needed}"
    want = {
        (SOURCES[name.split("/")[0]] / name.split("/", 1)[1]).as_posix(): path
        for name, path in package_files(built.src).items()
    }
    under = tuple(f"{folder.as_posix()}/" for folder in SOURCES.values())
    stray = sorted(n for n in have if n.startswith(under) and n not in want)
    lacks = sorted(set(want) - set(have))
    assert not lacks, f"{built.sdist.name} lacks source files: {lacks}"
    assert not stray, f"{built.sdist.name} has package files the checkout lacks: {stray}"
    for name, path in want.items():
        assert have[name] == path.read_bytes(), f"{name} differs in the sdist"
    first, again = members(built.wheel), members(built.sdist_wheel)
    assert sorted(first) == sorted(again), f"{sorted(set(first) ^ set(again))}"
    differ = sorted(n for n in first if first[n] != again[n])
    assert not differ, f"the wheel built from the sdist differs from the wheel in {differ}"


# ---- the commands ----------------------------------------------------------------------------
def readme_block(heading: str, lang: str) -> str:
    """The first ``lang`` code block after the README's ``heading``."""
    text = README.read_text(encoding="utf-8")
    assert heading in text, f"README.md has no {heading!r}"
    found = re.search(rf"^```{lang}\n(.*?)^```", text.split(heading, 1)[1], re.M | re.S)
    assert found is not None, f"README.md has no {lang} block after {heading!r}"
    return found.group(1)


def first_steps_lines() -> list[str]:
    """The shell lines of "Install and first steps", comments off, less ``pip install .``
    (which the installed wheel stands for)."""
    lines = []
    for raw in readme_block("## Install and first steps", "sh").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("pip install"):
            lines.append(line)
    assert any(line.startswith("smoe sculpt ") for line in lines), lines
    return lines


def lay_out_work(work: Path) -> None:
    """Copies of the fixtures, where the README's commands name them."""
    shutil.copytree(CKPTS / "qwen3_moe", work / CHECKPOINT)
    for name in ("q4_v2.smoe", "q4_v1.smoe"):
        shutil.copy2(FIXTURES / name, work / "fixtures" / name)
        manifest = FIXTURES / f"{name}.manifest.json"
        if manifest.exists():
            shutil.copy2(manifest, work / "fixtures" / manifest.name)
    (work / IMATRIX).write_bytes(b"GGUF" + bytes(28))  # the hint comes before any parsing
    (work / "olmoe.config.json").write_text(json.dumps(OLMOE_CONFIG), encoding="utf-8")
    (work / "readme").mkdir()
    shutil.copy2(README, work / "readme" / "README.md")
    import numpy as np

    np.save(work / "ids.npy", np.arange(64, dtype=np.int64).reshape(2, 32))


PYTHON_API = """
import sys

import smoe

assert "numpy" not in sys.modules, "import smoe pulled numpy in"
import pydoc

import numpy as np
from smoe import Vault
from smoe.errors import SmoeError, UnreadableInput
from smoe.vault.reader import Vault as V

assert Vault is V and "Vault" in dir(smoe)
with Vault.open("out/qwen3_moe.smoe") as v:
    e = v[1, 3]
    w = np.asarray(e["gate_proj"])
    assert w.dtype == np.float32 and w.ndim == 2, (w.dtype, w.shape)
    h = e["down_proj"].dequantize(dtype=np.float16)
    assert h.dtype == np.float16 and h.shape == e["down_proj"].dequantize().shape
    keys = [key for key, view in v.items()]
    assert keys == sorted(keys) and len(v) == len(keys), keys
    names = v.tensor_names()
    assert names[0] == "model.layers.0.mlp.experts.0.down_proj.weight", names[:3]
    t = v.get_tensor(names[0])
    assert t.dtype == np.float32, t.dtype
    try:
        v.get_tensor("model.layers.0.mlp.experts.0.down_proj.weights")
    except KeyError:
        pass
    else:
        raise AssertionError("an unknown tensor name was found")
    assert v.header["bits"] == 4 and v.arch["model_type"] == "qwen3_moe", (v.header, v.arch)
    assert v.header_record["bits"] == 4 and v.arch_record is not None
    assert (0, 3) in v and v.get((0, 99)) is None
    assert [x.expert_id for x in v.values()][:2] == [0, 1]
    try:
        v[0, :]
    except TypeError as err:
        assert str(err).startswith("a vault is indexed by (layer, expert)"), err
    else:
        raise AssertionError("v[0, :] was accepted")
    try:  # ml_dtypes is not a core dependency: the message says what to install
        e["down_proj"].dequantize(dtype="bfloat16")
    except TypeError as err:
        assert "pip install ml-dtypes" in str(err), err
    else:
        raise AssertionError("bfloat16 without ml_dtypes")
try:
    Vault.open("model.smoe")
except UnreadableInput as err:
    assert "model.smoe" in str(err), err
else:
    raise AssertionError("a missing vault opened")
try:
    Vault.open("out/qwen3_moe.scout.safetensors")
except SmoeError as err:
    assert not isinstance(err, UnreadableInput), err
else:
    raise AssertionError("a safetensors file opened as a vault")
assert "class Vault" in pydoc.render_doc(Vault)
print("python api: ok")
"""

ISOLATION = """
import importlib.metadata, importlib.util, json, re, sys, sysconfig
import smoe, smoe_gen
core = [r for r in importlib.metadata.requires("smoe") if "extra ==" not in r]
def installed(requirement):
    try:
        return importlib.metadata.version(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
    except importlib.metadata.PackageNotFoundError:
        return None
print(json.dumps({
    "prefix": sys.prefix,
    "purelib": sysconfig.get_paths()["purelib"],
    "files": [smoe.__file__, smoe_gen.__file__],
    "path": sys.path,
    "absent": [m for m in MODULES if importlib.util.find_spec(m) is None],
    "requirements": {r: installed(r) for r in core},
}))
""".replace("MODULES", repr(ABSENT))


def subcommands() -> list[str]:
    """The subcommands of the checkout's parser (each must be in the installed one)."""
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices)
    raise AssertionError("smoe's parser has no subcommands")


def hint_command(line: str) -> list[str]:
    """The pip command a hint names: ``pip install 'smoe[EXTRA]'`` -> its words."""
    found = re.search(r"pip install ('[^']+'|\S+)", line)
    assert found is not None, f"the hint names no pip install: {line!r}"
    return ["pip", "install", *shlex.split(found.group(1))]


Results = dict[str, object]  # a command's Ran, or a chain's list of them, by name


def in_parallel(jobs: Mapping[str, Callable[[], object]]) -> Results:
    """The jobs' results, the jobs run concurrently; a job may give one result (kept under
    its name) or a dict of them (merged). A job that raised gives a Ran whose stderr is its
    traceback, so one failure costs only the tests that look at what it was to run."""

    def guarded(job: Callable[[], object]) -> object:
        try:
            return job()
        except Exception:
            return Ran("(the test's own job)", "", -1, "", traceback.format_exc())

    workers = max(8, 2 * (os.cpu_count() or 2))
    out: Results = {}
    with ThreadPoolExecutor(workers) as pool:
        futures = {name: pool.submit(guarded, job) for name, job in jobs.items()}
        for name, future in futures.items():
            got = future.result()
            if isinstance(got, dict):
                out.update(got)
            else:
                out[name] = got
    return out


def lookup(results: Results, name: str) -> object:
    if name not in results:
        failed = {k: v for k, v in results.items() if isinstance(v, Ran) and v.cmd.startswith("(")}
        detail = "".join(f"\n{k}:\n{v.err}" for k, v in failed.items())
        raise AssertionError(
            f"{name}: not run: a command it needs failed first (the README's first steps, or "
            f"the sdist wheel's install: see their tests){detail}"
        )
    return results[name]


def ran(results: Results, name: str) -> Ran:
    """One command's result."""
    got = lookup(results, name)
    assert isinstance(got, Ran), f"{name}: {got!r}"
    return got


def steps_of(results: Results, name: str) -> list[Ran]:
    """A chain's steps, each of which must have succeeded."""
    return all_ok(lookup(results, name))


@pytest.fixture(scope="module")
def results(built: Built) -> Results:
    """Every command of the tests below: one to byte-compile what the CLI imports (once, not
    in every concurrent process), then the rest concurrently; what reads the README's first
    sculpt starts when that is done."""
    top, venv = built.top, built.venv
    work = top / "work"  # the user's folder: fixtures where the README names them
    lay_out_work(work)
    (work / "api.py").write_text(PYTHON_API, encoding="utf-8")

    def smoe(*words: str, **changes: str) -> Callable[[], Ran]:
        return lambda: venv.run(*words, cwd=work, **changes)

    def first_steps_and_after() -> Results:
        steps = [lambda line=line: venv.shell(line, cwd=work) for line in first_steps_lines()]
        python = readme_block("## Install and first steps", "python")
        check = '\nassert w.dtype == "float32" and w.ndim == 2, (w.dtype, w.shape)\nprint("ok")\n'
        steps.append(lambda: venv.run("python", "-c", python + check, cwd=work))
        first = chain(*steps)
        done: Results = {"first-steps": first}
        if all(step.code == 0 for step in first):
            done.update(in_parallel(reading_the_vault))
        return done

    reading_the_vault = {  # VAULT is the first steps' sculpt
        "dump --experts": smoe("smoe", "dump", VAULT, "--experts"),
        "dump --layer": smoe("smoe", "dump", VAULT, "--layer", "1"),
        "smoe-dump --json": smoe("smoe-dump", VAULT, "--json"),
        "verify --json": smoe("smoe", "verify", VAULT, "--deep", "--json"),
        "report": smoe("smoe", "report", VAULT, "-o", "page.html"),
        "report --json": smoe("smoe", "report", VAULT, "-o", "deep.html", "--deep", "--json"),
        "export": smoe("smoe", "export", VAULT, "all.safetensors"),
        "export one": smoe(
            "smoe", "export", VAULT, "one.safetensors", "--layer", "1", "--expert", "3"
        ),
        "export --hf": smoe("smoe", "export", VAULT, "hf", "--hf", "--json"),
        "export --hf rebuilt": smoe(
            "smoe", "export", VAULT, "hf32", "--hf", "--rebuild-config", "--dtype", "f32", "--json"
        ),
        "python api": smoe("python", "api.py"),
        "sculpt v1, upgrade --model": lambda: chain(
            smoe("smoe", "sculpt", CHECKPOINT, "v1", "--format-version", "1", "--json"),
            smoe("smoe", "upgrade", "v1/qwen3_moe.smoe", "--model", CHECKPOINT, "--json"),
        ),
    }

    hints: dict[str, tuple[list[str], dict[str, str]]] = {  # what needs a missing extra
        "hint hub": (["sculpt", "ORG/NAME", "hub-out"], {}),
        "hint imatrix": (["sculpt", CHECKPOINT, "imatrix-out", "--imatrix", IMATRIX], {}),
        "hint calibrate": (["sculpt", CHECKPOINT, "calib-out", "--calibrate", "ids.npy"], {}),
        "hint fast": (["sculpt", CHECKPOINT, "fast-out"], {"SMOE_KERNEL": "fast"}),
    }

    def the_hints() -> Results:
        """Each hint, then pip asked (--dry-run) whether the commands they name can be
        carried out in this venv, from the configured indexes (none has smoe)."""
        done: Results = {
            name: venv.run("smoe", *words, cwd=work, **env) for name, (words, env) in hints.items()
        }
        named = []
        for hint in done.values():
            assert isinstance(hint, Ran)
            if "pip install" in hint.err:
                named += hint_command(hint.err)[2:]
        if named:
            done["hints resolve"] = venv.pip("install", "--dry-run", "--no-deps", *named, cwd=work)
        return done

    def the_sdist_wheel() -> Results:
        """The sdist's wheel in a venv of its own, and the commands that show it works."""
        sd, setup = make_venv(top / "venv-sdist", built.sdist_wheel, built.wheelhouse, top)
        done: Results = {"sdist install": setup}
        if all(step.code == 0 for step in setup):
            there = top / "work-sdist"
            shutil.copytree(CKPTS / "qwen3_moe", there / CHECKPOINT)
            done["sdist work"] = there
            done["sdist venv"] = sd.path
            done["sdist isolation"] = sd.run("python", "-c", ISOLATION, cwd=there)
            done["sdist commands"] = chain(
                lambda: sd.run("smoe", "--version", cwd=there),
                lambda: sd.run("smoe", "sculpt", CHECKPOINT, "out", cwd=there),
                lambda: sd.run("smoe", "verify", "--deep", VAULT, cwd=there),
                lambda: sd.run("smoe", "export", VAULT, "hf", "--hf", "--json", cwd=there),
                lambda: sd.run("smoe", "report", VAULT, "-o", "page.html", "--json", cwd=there),
                lambda: sd.run("smoe", "spec", "--ksy", cwd=there),
            )
        return done

    def the_checkouts_sculpt() -> Ran:
        """The same sculpt by the checkout's own (editable) package and the same (numpy)
        encoder, for comparison."""
        there = top / "work-checkout"
        shutil.copytree(CKPTS / "qwen3_moe", there / CHECKPOINT)
        words = ["-m", "smoe", "sculpt", CHECKPOINT, "out"]
        shown = shlex.join(["SMOE_KERNEL=numpy", "python", *words])
        env = {**host_env(), "SMOE_KERNEL": "numpy"}
        return execute([sys.executable, *words], cwd=there, env=env, shown=shown)

    splice = re.search(r'`(python -c "[^`]*splice_readme[^`]*")`', README.read_text("utf-8"))
    jobs = {
        "first steps": first_steps_and_after,
        "isolation": smoe("python", "-c", ISOLATION),
        "hints": the_hints,
        "sdist": the_sdist_wheel,
        "checkout sculpt": the_checkouts_sculpt,
        "dump-version": smoe("smoe-dump", "--version"),
        "m-version": smoe("python", "-m", "smoe", "--version"),
        "help": smoe("smoe", "--help"),
        "dump-help": smoe("smoe-dump", "--help"),
        **{f"help {s}": smoe("smoe", s, "--help") for s in subcommands()},
        "spec": smoe("smoe", "spec"),
        "spec --json": smoe("smoe", "spec", "--json"),
        "spec --ksy": smoe("smoe", "spec", "--ksy"),
        "families": smoe("smoe", "families"),
        "families one": smoe("smoe", "families", "qwen3_moe"),
        "families --long": smoe("smoe", "families", "--long"),
        "families --json": smoe("smoe", "families", "--json"),
        "families --markdown": smoe("python", "-m", "smoe", "families", "--markdown"),
        "splice": (lambda: venv.shell(splice.group(1), cwd=work / "readme"))
        if splice
        else (lambda: Ran("README.md's splice_readme line", "", -1, "", "not in README.md")),
        "verify fixture": smoe("smoe", "verify", "fixtures/q4_v2.smoe", "--deep", "--json"),
        "fields": lambda: chain(
            *(
                smoe("smoe", "dump", "fixtures/q4_v2.smoe", "--field", f)
                for f in ("header.num_moe_layers", "arch.model_type", "experts[0].tensors[2]")
            )
        ),
        "upgrade --config": lambda: chain(
            smoe(
                "smoe", "upgrade", "fixtures/q4_v1.smoe", "--config", "olmoe.config.json", "--json"
            ),
            smoe("smoe", "verify", "fixtures/q4_v1.smoe", "--json"),
        ),
        "sculpt --dry-run": smoe("smoe", "sculpt", CHECKPOINT, "dry", "--dry-run"),
        "sculpt q2": smoe(
            "smoe",
            "sculpt",
            CHECKPOINT,
            "q2",
            *shlex.split("--bits 2 --max-layers 1 --max-experts 2 --scale absmax --jobs 1 --json"),
        ),
    }
    warm = venv.run("smoe", "--version", cwd=work)
    return {"version": warm, "work": work, **in_parallel(jobs)}


def sha256s(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def folder(results: Results, name: str) -> Path:
    got = lookup(results, name)
    assert isinstance(got, Path), got
    return got


def check_isolation(got: dict, venv_path: Path) -> None:
    """What a venv's python reported: smoe from the venv, nothing from the checkout, no
    extra, every core requirement installed."""
    purelib = Path(got["purelib"]).resolve()
    assert Path(got["prefix"]).resolve() == venv_path.resolve(), got
    for file in got["files"]:
        assert Path(file).resolve().is_relative_to(purelib), f"{file} is not the installed one"
    checkout = ROOT.resolve()
    leaks = [p for p in got["path"] if p and Path(p).resolve().is_relative_to(checkout)]
    assert not leaks, f"the checkout is on the venv's sys.path: {leaks}"
    assert sorted(got["absent"]) == sorted(ABSENT), (
        f"a core install has {sorted(set(ABSENT) - set(got['absent']))}"
    )
    missing = sorted(r for r, version in got["requirements"].items() if version is None)
    assert got["requirements"] and not missing, f"requirements not installed: {missing}"


def test_the_venv_is_clean_and_runs_the_installed_package(built: Built, results: Results) -> None:
    cfg = (built.venv.path / "pyvenv.cfg").read_text(encoding="utf-8")
    assert "include-system-site-packages = false" in cfg, cfg
    check_isolation(ran(results, "isolation").json(), built.venv.path)


def test_readme_first_steps(results: Results) -> None:
    steps = steps_of(results, "first-steps")
    version = next(s for s in steps if s.cmd.startswith("smoe --version"))
    assert version.out == f"smoe {__version__}\n", version.explain("not this version")
    grep = next(s for s in steps if "| grep data_offset" in s.cmd)
    assert "data_offset" in grep.out, grep.explain("no data_offset line")
    assert steps[-1].out.endswith("ok\n"), steps[-1].explain("the Python example")
    # the same bytes as the checkout's own package writes (and so as fixtures/DEMO.json
    # records, which tests/sculpt/test_demo_outputs.py holds the checkout to)
    checkout = ran(results, "checkout sculpt").ok()
    work = folder(results, "work")
    assert sha256s(work / "out") == sha256s(Path(checkout.cwd) / "out"), checkout.explain(
        "the installed package's sculpt differs from the checkout's"
    )


def test_version_of_both_commands_and_python_dash_m(results: Results) -> None:
    for name, prog in (("version", "smoe"), ("dump-version", "smoe-dump"), ("m-version", "smoe")):
        proc = ran(results, name).ok()
        assert (proc.out, proc.err) == (f"{prog} {__version__}\n", ""), proc.explain(name)


def test_help_of_every_command(results: Results) -> None:
    main = ran(results, "help").ok()
    subcommands = [n.removeprefix("help ") for n in results if n.startswith("help ")]
    assert subcommands, "the checkout's parser has no subcommands"
    for sub in subcommands:
        assert re.search(rf"^    {sub}\b", main.out, re.M), main.explain(f"--help lacks {sub}")
        proc = ran(results, f"help {sub}").ok()
        assert proc.out.startswith(f"usage: smoe {sub} "), proc.explain("not its usage")
        assert proc.err == "", proc.explain("stderr")
    dump = ran(results, "dump-help").ok()
    assert dump.out.startswith("usage: smoe-dump "), dump.explain("not smoe-dump's usage")


def test_spec_and_the_shipped_ksy(results: Results) -> None:
    plain = ran(results, "spec").ok()
    assert plain.out.startswith(".smoe format v1..v2"), plain.explain("smoe spec")
    assert ran(results, "spec --json").json()["page_size"] == 16384
    ksy = ran(results, "spec --ksy").ok()
    assert ksy.out == KSY.read_text(encoding="utf-8"), ksy.explain(
        "smoe spec --ksy is not spec/smoe.ksy"
    )


def test_families_in_every_form(results: Results) -> None:
    listing = ran(results, "families").ok()
    assert "qwen3_moe" in listing.out and "gpt_oss" in listing.out, listing.explain("families")
    one = ran(results, "families one").ok()
    assert "qwen3_moe" in one.out, one.explain("families qwen3_moe")
    assert "qwen3_moe" in ran(results, "families --long").ok().out
    doc = ran(results, "families --json").json()
    assert "qwen3_moe" in {f["model_type"] for f in doc["families"]}, doc["families"][:2]
    table = ran(results, "families --markdown").ok()
    here = run("families", "--markdown")
    assert here.returncode == 0, here.stderr
    assert table.out == here.stdout, table.explain("the installed registry is not the checkout's")
    ran(results, "splice").ok()
    spliced = (folder(results, "work") / "readme" / "README.md").read_text(encoding="utf-8")
    assert f"<!-- families -->\n{table.out}" in spliced, "splice_readme did not write the table"


def test_sculpt_options(results: Results) -> None:
    work = folder(results, "work")
    dry = ran(results, "sculpt --dry-run").ok()
    assert not (work / "dry").exists() or not any((work / "dry").iterdir()), dry.explain(
        "--dry-run wrote files"
    )
    q2 = ran(results, "sculpt q2")
    assert q2.json() and (work / "q2" / "qwen3_moe.smoe").is_file(), q2.explain("no Q2 vault")
    verify = ran(results, "verify fixture").json()
    assert verify["valid"] is True, verify


def test_upgrade_a_v1_fixture_and_a_v1_sculpt(results: Results) -> None:
    upgrade, verify = steps_of(results, "upgrade --config")
    assert upgrade.json()["mode"] == "in-place", upgrade.explain("upgrade --config")
    assert verify.json()["valid"] is True, verify.explain("the upgraded fixture")
    _, by_model = steps_of(results, "sculpt v1, upgrade --model")
    by_model.json()
    work = folder(results, "work")
    assert (work / "v1" / "qwen3_moe.smoe").read_bytes() == (work / VAULT).read_bytes(), (
        by_model.explain("an upgraded v1 sculpt is not the v2 sculpt, byte for byte")
    )


def test_verify_and_dump_of_the_sculpted_vault(results: Results) -> None:
    verify = ran(results, "verify --json").json()
    assert verify["valid"] is True and verify["deep"] is True, verify
    experts = ran(results, "dump --experts").ok()
    lines = experts.out.splitlines()
    blob = re.compile(r"(^|[─ ])layer 1 expert 3 +blob at 0x")
    tensor = re.compile(r"(^|[─ ])layer 1 expert 3 gate_proj +Q4 +\[")
    assert any(blob.search(line) for line in lines), experts.explain("no expert line")
    assert any(tensor.search(line) for line in lines), experts.explain("no tensor line")
    layer = ran(results, "dump --layer").ok()
    assert "layer 1 " in layer.out, layer.explain("dump --layer 1")
    doc = ran(results, "smoe-dump --json").json()
    assert {"header", "arch", "experts", "findings"} <= set(doc), sorted(doc)
    assert doc["arch"]["model_type"] == "qwen3_moe", doc["arch"]
    layers, model_type, one = steps_of(results, "fields")
    assert (layers.out, model_type.out) == ("2\n", "olmoe\n"), layers.explain("--field")
    assert json.loads(one.out)["name"] == "down_proj", one.explain("--field experts[0]...")


def test_report(results: Results) -> None:
    work = folder(results, "work")
    ran(results, "report").ok()
    page = (work / "page.html").read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html") and "<svg" in page, page[:200]
    doc = ran(results, "report --json").json()
    assert doc["schema"] == "smoe-report/1" and (work / "deep.html").is_file(), doc


def test_export_float32(results: Results) -> None:
    ran(results, "export").ok()
    ran(results, "export one").ok()
    from safetensors.numpy import load_file  # the files, read here

    work = folder(results, "work")
    every, one = load_file(work / "all.safetensors"), load_file(work / "one.safetensors")
    assert every and {str(a.dtype) for a in every.values()} == {"float32"}, sorted(every)
    assert set(one) < set(every) and all(".layers.1." in k for k in one), sorted(one)
    assert len(one) == 3, sorted(one)


def test_export_hf_writes_a_checkpoint_folder(results: Results) -> None:
    """The command the wheel once lacked a subpackage for."""
    work = folder(results, "work")
    copied = ran(results, "export --hf").json()
    assert copied["schema"] == "smoe-export-hf/1" and copied["config"] == "copied", copied
    hf = work / "hf"
    config = (work / "out" / "qwen3_moe.config.json").read_bytes()
    assert (hf / "config.json").read_bytes() == config
    assert list(hf.glob("*.safetensors")), sorted(p.name for p in hf.iterdir())
    rebuilt = ran(results, "export --hf rebuilt").json()
    assert rebuilt["config"] == "rebuilt", rebuilt
    assert json.loads((work / "hf32" / "config.json").read_text())["model_type"] == "qwen3_moe"


def test_the_readme_python_api(results: Results) -> None:
    proc = ran(results, "python api").ok()
    assert proc.out.endswith("python api: ok\n"), proc.explain("the Python API script")


HINTS = {  # command -> the extra its hint must name, the module it lacks, where it was to write
    "hint hub": ("hub", "huggingface_hub", "hub-out"),
    "hint imatrix": ("imatrix", "gguf", "imatrix-out"),
    "hint calibrate": ("calibrate", "torch", "calib-out"),
    "hint fast": ("fast", "numba", "fast-out"),
}


def normalized(name: str) -> str:
    """A distribution's (or module's) name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def test_hints_for_missing_extras_name_an_extra_that_brings_the_module(
    built: Built, results: Results
) -> None:
    """Each is one ``error:`` line, a clean refusal (exit 1 or 2, no traceback) that writes
    no vault, naming the missing module and ``pip install 'smoe[EXTRA]'`` for an extra of
    the wheel whose requirements bring that module."""
    metadata = members(built.wheel)[f"{dist_info(built.wheel)}/METADATA"].decode()
    extras = set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M))
    brings: dict[str, set[str]] = {}
    for dist, extra in re.findall(
        r"^Requires-Dist: ([A-Za-z0-9._-]+)[^;\n]*; extra == \"([\w-]+)\"$", metadata, re.M
    ):
        brings.setdefault(extra, set()).add(normalized(dist))
    work = folder(results, "work")
    for name, (extra, module, out) in HINTS.items():
        proc = ran(results, name)
        assert proc.code in (1, 2), proc.explain("not a clean refusal (exit 1 or 2)")
        assert proc.out == "" and proc.err.count("\n") == 1, proc.explain("not one line")
        assert proc.err.startswith("error: "), proc.explain("not an error line")
        assert module in proc.err, proc.explain(f"the hint does not name {module}")
        words = hint_command(proc.err)
        assert words == ["pip", "install", f"smoe[{extra}]"], proc.explain(f"not smoe[{extra}]")
        assert extra in extras, f"{name}: the wheel has no extra {extra!r} ({sorted(extras)})"
        assert normalized(module) in brings.get(extra, set()), (
            f"the extra {extra!r} brings {sorted(brings.get(extra, ()))}, not {module}"
        )
        assert not list(work.glob(f"{out}/*.smoe")), proc.explain("it wrote a vault")


def test_the_hinted_commands_work_in_the_clean_venv(results: Results) -> None:
    """``pip install 'smoe[EXTRA]'``, with the pip of the venv the wheel is in, from the
    configured indexes (which need not have smoe, and here do not): pip takes the installed
    smoe as satisfying ``smoe`` (and would fetch only the extra's requirements, which
    resolve as ``make setup``'s dev extra does). ``--dry-run --no-deps``: nothing is
    installed."""
    proc = ran(results, "hints resolve").ok()
    assert "Requirement already satisfied: smoe[" in proc.out, proc.explain(
        "pip did not take the installed smoe for the hint's requirement"
    )


def test_the_sdist_wheel_installed_runs(results: Results) -> None:
    steps_of(results, "sdist install")
    check_isolation(ran(results, "sdist isolation").json(), folder(results, "sdist venv"))
    version, sculpt, _verify, export, report, ksy = steps_of(results, "sdist commands")
    assert version.out == f"smoe {__version__}\n", version.explain("not this version")
    checkout = ran(results, "checkout sculpt").ok()
    assert sha256s(folder(results, "sdist work") / "out") == sha256s(Path(checkout.cwd) / "out"), (
        sculpt.explain("the sculpt differs from the checkout's")
    )
    assert export.json()["config"] == "copied"
    assert report.json()["schema"] == "smoe-report/1"
    assert ksy.out == KSY.read_text(encoding="utf-8")
