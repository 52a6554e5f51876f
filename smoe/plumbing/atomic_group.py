"""Several atomic files committed as one set (a vault and its companions): each renamed
in order, the last rename the commit point, everything put back if it is not reached."""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile, put_in_place

__all__ = ["commit_together"]


def commit_together(files: Sequence[AtomicFile]) -> None:
    """fsync every file, rename each onto its final name in order, fsync the folders.

    The last file's rename is the commit point. When it may not replace anything
    (``replace`` False), its name is checked before any file is renamed, so that a vault
    that appeared meanwhile keeps its companions. Each earlier file keeps what it replaces
    under a hard link until the commit point: if anything fails before it, each file this
    call renamed is taken back (only while its name still holds it) and what it replaced is
    put back, so nothing that was there is lost. After the commit point the set is complete
    (each file fsynced) and stays, even if flushing a folder then fails (that error is still
    raised). Temporary files not yet renamed stay for the caller to drop or keep.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> files = [AtomicFile(f"{d}/a.json"), AtomicFile(f"{d}/a.smoe")]
    >>> for f in files:
    ...     f.pwrite(b"x", 0)
    >>> commit_together(files)  # the vault (last) is the commit point
    >>> sorted(os.listdir(d))
    ['a.json', 'a.smoe']
    """
    placed: list[_Placed] = []
    try:
        for f in files:
            f.sync()
        if files and not files[-1].replace:
            fileio.refuse_existing(files[-1].path)  # every name checked before any rename
        for i, f in enumerate(files):
            assert f.fd is not None
            st = os.fstat(f.fd)
            os.close(f.fd)
            f.fd = None
            kept = _keep_aside(f.path) if i < len(files) - 1 else None
            try:
                put_in_place(f)
            except BaseException:
                if kept is not None:
                    fileio.unlink_owned(kept)  # nothing was replaced: the name still holds it
                raise
            placed.append(_Placed(f.path, (st.st_dev, st.st_ino), kept))
        for folder in dict.fromkeys(f.path.parent for f in files):
            fileio.fsync_dir(folder)
    except BaseException:
        if len(placed) < len(files):
            for p in reversed(placed):
                p.undo()
            placed = []
        raise
    finally:
        for p in placed:
            if p.kept is not None:
                fileio.unlink_owned(p.kept)


@dataclass(frozen=True)
class _Placed:
    """A file put in place by :func:`commit_together`: its name, its (device, inode), and
    the hard link keeping what it replaced (None: nothing was there)."""

    path: Path
    identity: tuple[int, int]
    kept: Path | None

    def undo(self) -> None:
        """Take the file back if its name still holds it, and put back what it replaced."""
        try:
            st = os.lstat(self.path)
            ours = (st.st_dev, st.st_ino) == self.identity
        except OSError:
            ours = False
        if self.kept is None:
            if ours:
                fileio.unlink_owned(self.path)
            return
        try:
            if ours:
                os.replace(self.kept, self.path)
                return
        except OSError:
            pass
        fileio.unlink_owned(self.kept)


def _keep_aside(path: Path) -> Path | None:
    """A hard link to what is at ``path`` (a file or a symlink, never followed) under a
    temporary name the sweep of stale files knows; None if nothing is there (or the file
    system has no hard links: then nothing can be put back)."""
    while True:
        kept = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.link(path, kept, follow_symlinks=False)
            return kept
        except FileExistsError:
            continue
        except OSError:
            return None
