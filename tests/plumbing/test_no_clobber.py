"""``AtomicFile(replace=False)``: an output that exists is refused when the file is opened,
and one that appears between then and the commit is kept, never replaced (the commit's
hard link fails); the temporary file is gone either way."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from unittest import mock

import pytest

from smoe.errors import OutputExists
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile


def test_an_existing_output_is_refused_at_open(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    out.write_bytes(b"theirs")
    with pytest.raises(OutputExists) as e:
        AtomicFile(out, replace=False)
    assert str(e.value) == f"{out}: exists; --force replaces it"
    assert os.listdir(tmp_path) == ["out.bin"] and out.read_bytes() == b"theirs"


def test_a_dangling_symlink_counts_as_existing(tmp_path: Path) -> None:
    (tmp_path / "out.bin").symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputExists):
        AtomicFile(tmp_path / "out.bin", replace=False)


def test_an_output_that_appears_before_the_commit_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    f = AtomicFile(out, replace=False)
    f.pwrite(b"ours", 0)
    out.write_bytes(b"theirs")  # another writer, meanwhile
    inode = out.stat().st_ino
    with pytest.raises(OutputExists):
        f.commit()
    assert out.read_bytes() == b"theirs" and out.stat().st_ino == inode
    assert os.listdir(tmp_path) == ["out.bin"]  # our temporary file removed


def test_a_new_output_is_put_in_place_with_one_name(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    with AtomicFile(out, replace=False) as f:
        f.pwrite(b"ours", 0)
        f.commit()
    assert out.read_bytes() == b"ours" and out.stat().st_nlink == 1
    assert os.listdir(tmp_path) == ["out.bin"]


@pytest.mark.parametrize("code", [errno.EPERM, errno.EOPNOTSUPP])
def test_without_hard_links_it_checks_then_renames(tmp_path: Path, code: int) -> None:
    """A file system without hard links (EPERM, EOPNOTSUPP): the check just before the
    rename still refuses an output that is there."""
    out = tmp_path / "out.bin"
    refuse = OSError(code, os.strerror(code))
    with mock.patch.object(fileio.os, "link", side_effect=refuse):
        f = AtomicFile(out, replace=False)
        f.pwrite(b"ours", 0)
        f.commit()
        assert out.read_bytes() == b"ours"
        g = AtomicFile(tmp_path / "other.bin", replace=False)
        (tmp_path / "other.bin").write_bytes(b"theirs")
        with pytest.raises(OutputExists):
            g.commit()
    assert (tmp_path / "other.bin").read_bytes() == b"theirs"
    assert sorted(os.listdir(tmp_path)) == ["other.bin", "out.bin"]


def test_another_link_failure_is_a_write_failure(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    with mock.patch.object(fileio.os, "link", side_effect=OSError(errno.ENOSPC, "No space")):
        f = AtomicFile(out, replace=False)
        f.pwrite(b"ours", 0)
        with pytest.raises(Exception) as e:
            f.commit()
    assert str(e.value) == f"{out}: cannot put {f.tmp.name} in place: No space"
    assert os.listdir(tmp_path) == []
