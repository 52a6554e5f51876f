"""The disk cache of code compiled from generated source (smoe.quant.kernels.code_cache): a hit
gives the very code compile() gives; anything else in the entry's place (another interpreter's
magic, other source, a torn file, a FIFO, a folder) is compiled afresh without blocking, and an
entry that cannot be written is simply not kept."""

from __future__ import annotations

import builtins
import errno
import importlib.util
import marshal
import os
import stat
from pathlib import Path

import pytest

from smoe.plumbing import atomic
from smoe.quant.kernels import code_cache
from smoe.quant.kernels.code_cache import cache_path, compile_cached

SOURCE = "def f(x):\n    return x * 2 + 1\n"


def _run(code: object) -> int:
    namespace: dict = {}
    exec(code, {}, namespace)
    return namespace["f"](20)


def _compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources compile() is asked for from now on."""
    seen: list[str] = []
    real = builtins.compile

    def counting(source: str, filename: str, mode: str, *args: object, **kwargs: object) -> object:
        seen.append(source)
        return real(source, filename, mode, *args, **kwargs)

    monkeypatch.setattr(code_cache, "compile", counting, raising=False)
    return seen


def test_a_second_compile_is_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = str(tmp_path / "gen.py")
    seen = _compiles(monkeypatch)
    first = compile_cached(SOURCE, name)
    again = compile_cached(SOURCE, name)
    assert seen == [SOURCE]  # compiled once, then read back
    assert again == compile(SOURCE, name, "exec") and again.co_filename == name
    assert _run(first) == _run(again) == 41
    entry = cache_path(SOURCE, name)
    assert entry is not None and entry.parent == tmp_path / "__pycache__"
    data = entry.read_bytes()
    assert data.startswith(importlib.util.MAGIC_NUMBER)
    assert marshal.loads(data[len(importlib.util.MAGIC_NUMBER) + 32 :]) == again
    assert cache_path(SOURCE + "\n", name) != entry  # other source, other entry


@pytest.mark.parametrize(
    "damage",
    ["torn", "other magic", "other source", "not code", "other file name", "empty"],
)
def test_a_damaged_entry_is_compiled_afresh_and_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    name = str(tmp_path / "gen.py")
    compile_cached(SOURCE, name)
    entry = cache_path(SOURCE, name)
    assert entry is not None
    good = entry.read_bytes()
    head = len(importlib.util.MAGIC_NUMBER) + 32
    bad = {
        "torn": good[: len(good) // 2],
        "other magic": b"\0\0\r\n" + good[4:],
        "other source": good[: len(importlib.util.MAGIC_NUMBER)] + b"\1" * 32 + good[head:],
        "not code": good[:head] + marshal.dumps({"f": 1}),
        "other file name": good[:head] + marshal.dumps(compile(SOURCE, "elsewhere.py", "exec")),
        "empty": b"",
    }[damage]
    entry.write_bytes(bad)
    seen = _compiles(monkeypatch)
    code = compile_cached(SOURCE, name)
    assert seen == [SOURCE] and _run(code) == 41 and code.co_filename == name
    assert entry.read_bytes() == good


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_fifo_or_folder_in_the_entry_s_place_is_compiled_around(
    tmp_path: Path, kind: str
) -> None:
    name = str(tmp_path / "gen.py")
    entry = cache_path(SOURCE, name)
    assert entry is not None
    entry.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(entry)  # reading it would block: refused without opening for reading
    else:
        entry.mkdir()
    assert _run(compile_cached(SOURCE, name)) == 41
    # an output that is not a regular file is never replaced (issue 23): left as it is
    assert (stat.S_ISFIFO if kind == "fifo" else stat.S_ISDIR)(entry.lstat().st_mode)
    assert compile_cached(SOURCE, name) == compile(SOURCE, name, "exec")


def test_a_failed_write_leaves_no_entry_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = str(tmp_path / "gen.py")

    def full(fd: int, data: object, offset: int, path: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.fileio, "pwrite_all", full)
    assert _run(compile_cached(SOURCE, name)) == 41
    assert list((tmp_path / "__pycache__").iterdir()) == []


def test_an_unwritable_folder_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = str(tmp_path / "gen.py")
    (tmp_path / "__pycache__").write_bytes(b"a file where the folder would be")
    assert _run(compile_cached(SOURCE, name)) == 41
    assert (tmp_path / "__pycache__").read_bytes() == b"a file where the folder would be"
