"""A replacing write replaces only a file of its own kind (Signature): checked when the
output is opened and again at the rename, so that a file of someone else's that appears
meanwhile is kept and the write fails in one line, leaving no temporary file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from smoe.errors import WriteFailed
from smoe.format.records import VAULT_SIGNATURE
from smoe.plumbing.atomic import AtomicFile, Signature

from fixtures_data import FIXTURES

GREETING = Signature("a greeting", lambda fd: os.pread(fd, 5, 0) == b"hello")


def test_a_file_of_its_kind_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    out.write_bytes(b"hello, old")
    with AtomicFile(out, ours=GREETING) as f:
        f.pwrite(b"hello, new", 0)
        f.commit()
    assert out.read_bytes() == b"hello, new"


def test_a_foreign_file_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    out.write_bytes(b"mine")
    with pytest.raises(WriteFailed, match="smoe did not write it \\(not a greeting\\)"):
        AtomicFile(out, ours=GREETING)
    assert sorted(os.listdir(tmp_path)) == ["out.txt"] and out.read_bytes() == b"mine"


def test_a_foreign_file_that_appears_before_the_rename_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    f = AtomicFile(out, ours=GREETING)  # nothing there yet
    f.pwrite(b"hello", 0)
    out.write_bytes(b"appeared meanwhile")  # another program's file
    with pytest.raises(WriteFailed, match="smoe did not write it"):
        f.commit()
    assert out.read_bytes() == b"appeared meanwhile"
    assert sorted(os.listdir(tmp_path)) == ["out.txt"]  # the temporary file removed


def test_a_symlink_is_replaced_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"not a greeting")
    out = tmp_path / "out.txt"
    out.symlink_to(target)
    with AtomicFile(out, ours=GREETING) as f:
        f.pwrite(b"hello", 0)
        f.commit()
    assert not out.is_symlink() and target.read_bytes() == b"not a greeting"


def test_a_vault_is_known_by_its_magic(tmp_path: Path) -> None:
    vault = FIXTURES / "q4_v2.smoe"
    fd = os.open(vault, os.O_RDONLY)
    try:
        assert VAULT_SIGNATURE.probe(fd)
    finally:
        os.close(fd)
    other = tmp_path / "x.smoe"
    other.write_bytes(b"\0" * 64)
    fd = os.open(other, os.O_RDONLY)
    try:
        assert not VAULT_SIGNATURE.probe(fd)
    finally:
        os.close(fd)
