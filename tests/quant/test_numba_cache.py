"""numba's disk cache fails soft (issue 31): a damaged entry (a torn or garbled ``.nbc`` data
file or ``.nbi`` index) is compiled afresh and rewritten, and a cache that cannot be written
(``NUMBA_CACHE_DIR`` under a regular file, a folder where an index belongs) leaves the
kernels compiled in memory; ``smoe warmup`` says what it found and could not keep, and exits
0. Each case was an internal error.

Each run is ``smoe warmup`` in a fresh process with its own ``NUMBA_CACHE_DIR``, on the two
smallest kernels (a few seconds to compile). The cases that cannot write do not rely on
permissions (the tests may run as root): a path under a regular file cannot be created by
anyone, and a folder in an index's place cannot be renamed over.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from helpers import plain_env, run

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="needs numba (pip install 'smoe[fast]')"
)

SMALL = ("einsum order check (Q4 optimal)", "decode to float32")
WARMUP = f"""
import sys
from smoe.cli import main
from smoe.quant import first_run
calls = [c for c in first_run.all_kernels() if c.name in {SMALL!r}]
first_run.all_kernels = lambda: calls
sys.exit(main(["warmup", *sys.argv[1:]]))
"""


def warmup(cache: Path, *args: str) -> tuple[dict | str, list[str]]:
    """``smoe warmup ARGS`` (the two small kernels) with ``cache`` as ``NUMBA_CACHE_DIR``:
    its output (the document with ``--json``), its stderr lines; it must exit 0."""
    proc = run(
        *args,
        command=[sys.executable, "-c", WARMUP],
        env=plain_env(NUMBA_CACHE_DIR=str(cache)),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout) if "--json" in args else proc.stdout
    return out, proc.stderr.splitlines()


def compiled(doc: dict) -> list[bool]:
    return [k["compiled"] for k in doc["kernels"]]


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache that holds the two kernels."""
    cache = tmp_path_factory.mktemp("warm") / "cache"
    doc, _ = warmup(cache, "--json")
    assert compiled(doc) == [True, True]
    return cache


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _garble(path: Path) -> None:
    path.write_bytes(b"not a pickle")


def _empty(path: Path) -> None:
    path.write_bytes(b"")


DAMAGE = {
    "torn-data": ("*.nbc", _truncate),
    "garbled-index": ("*.nbi", _garble),
    "empty-index": ("*.nbi", _empty),
    "garbled-data": ("*.nbc", _garble),
}


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_entry_is_compiled_afresh_and_rewritten(
    how: str, warm: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(warm, cache)
    pattern, damage = DAMAGE[how]
    damaged = sorted(cache.rglob(pattern))
    assert len(damaged) == 2  # one per kernel
    for path in damaged:
        damage(path)
    doc, _ = warmup(cache, "--json")
    assert compiled(doc) == [True, True]
    assert doc["not_kept"] == []
    assert sorted(line.split(": ")[0] for line in doc["damaged"]) == [str(p) for p in damaged]
    assert all(line.endswith("; compiled afresh and rewritten") for line in doc["damaged"])
    doc, lines = warmup(cache, "--json")  # rewritten: loaded, nothing to say
    assert compiled(doc) == [False, False]
    assert doc["damaged"] == doc["not_kept"] == [] and lines == []


def test_a_cache_folder_that_cannot_be_created_runs_from_memory(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    cache = tmp_path / "file" / "cache"  # under a regular file: nobody can create it
    doc, _ = warmup(cache, "--json")
    assert compiled(doc) == [True, True]
    assert doc["damaged"] == []
    assert doc["not_kept"] == [
        f"{cache}: NUMBA_CACHE_DIR cannot be created ({cache}: Not a directory); compiled in memory"
    ]
    out, lines = warmup(cache)  # nothing was kept, here or anywhere else: compiled again
    assert out.endswith("(2 compiled now, 0 loaded from the cache)\n")
    assert lines[-2] == "compiled 2 kernels in " + lines[-2].split(" in ")[1]
    assert lines[-2].endswith("; numba's cache could not keep them (smoe warmup says why)")
    assert lines[-1] == f"warning: numba's cache: not kept: {doc['not_kept'][0]}"


def test_an_entry_that_cannot_be_written_runs_from_memory(warm: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(warm, cache)
    indexes = sorted(cache.rglob("*.nbi"))
    for path in indexes:  # a folder where the index belongs: neither read nor replaced
        path.unlink()
        path.mkdir()
    doc, _ = warmup(cache, "--json")
    assert compiled(doc) == [True, True]
    assert sorted(line.split(": ")[0] for line in doc["damaged"]) == [str(p) for p in indexes]
    assert all(line.endswith(": Is a directory; compiled afresh") for line in doc["damaged"])
    folder = str(indexes[0].parent)
    assert len(doc["not_kept"]) == 1 and doc["not_kept"][0].startswith(f"{folder}: ")
    assert doc["not_kept"][0].endswith(": Is a directory; compiled in memory")
    assert not [p for p in cache.rglob("*") if ".tmp." in p.name]  # numba's own clean-up
