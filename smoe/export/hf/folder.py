"""The folder ``smoe export --hf`` writes, and what ``--force`` may delete of an earlier one.

* **The marker**: an export folder is known by ``smoe-export.json`` (:data:`MARKER`), written
  last into it, naming every other file the export wrote with its size and SHA-256. File
  names are never evidence: a folder without the marker was not written by smoe.
* **What --force replaces**: a non-empty folder only when its marker is there (a regular
  file of at most :data:`MARKER_BYTES`, parsed and checked) and every other entry of the
  folder is a regular file the marker lists, with that size and SHA-256; else refused,
  naming the first entry that is not (:func:`check_earlier`).
* **Never a source**: before any of that, a folder that is the checkpoint the vault was
  sculpted from is refused by name (:func:`source_checkpoint`: a shard with the size and
  header SHA-256 the vault's manifest records, whose bytes hold a source tensor's recorded
  CRC-32C).
* **Deleting the earlier export**: right before the new folder is renamed into place, the
  folder is checked again (the same folder, not a symlink; no entry but those checked, each
  the same file), then renamed aside and opened without following links: it must be the
  folder checked, else it is put back and the export refused. Only the names its marker
  lists, each still the same file, are unlinked through that descriptor, the marker last;
  a file that appeared in the last instant keeps the aside folder, which a note names
  (:func:`move_aside`, :func:`remove_earlier`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smoe.errors import SmoeError, WriteFailed
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile
from smoe.plumbing.text import utf8_tree

__all__ = [
    "MARKER",
    "MARKER_BYTES",
    "SCHEMA",
    "WRITTEN",
    "Earlier",
    "Hashes",
    "check_earlier",
    "move_aside",
    "put_back",
    "remove_earlier",
    "remove_written",
    "sweep",
    "write_marker",
]

MARKER = "smoe-export.json"
"""The export folder's own manifest: every file the export wrote, its size and SHA-256."""
SCHEMA = "smoe-export/1"
MARKER_BYTES = 1 << 20
"""A marker larger than this is refused unread (a listing of thousands of shards is smaller)."""
MAX_FILES = 100_000
WRITTEN = re.compile(
    r"^(config\.json|model\.safetensors\.index\.json"
    r"|model(-[0-9]{5}-of-[0-9]{5})?\.safetensors|smoe-export\.json)$"
)
"""The names an export writes: all a killed export's temporary folder may lose to the sweep."""
FORCE = (
    "--force replaces only a folder an earlier smoe export wrote, as it wrote it (remove it "
    "yourself, or name a new folder)"
)
_HEX64 = re.compile(r"[0-9a-f]{64}")
_STALE = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{8}\.(?P<kind>tmp|old)$")
_CHUNK = 8 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
_FILE_FLAGS = os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC

Identity = tuple[int, int, int]
"""(inode, size, mtime in ns) of one entry: the same file, unchanged."""


@dataclass(frozen=True)
class Earlier:
    """An earlier export found replaceable: the folder (device, inode) and each entry's
    :data:`Identity` when it was checked, the marker's included.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "config.json").write_text("{}")
    >>> write_marker(d, ["config.json"], "v.smoe")
    >>> e = check_earlier(d)
    >>> e.path == d, e.folder == (os.stat(d).st_dev, os.stat(d).st_ino)
    (True, True)
    >>> e.entries["config.json"][1]  # (inode, size, mtime_ns)
    2
    """

    path: Path
    folder: tuple[int, int]
    entries: Mapping[str, Identity]


# ---- descriptors that never follow a link ---------------------------------------------------
def _open_folder(path: Path) -> int:
    """A descriptor of the folder ``path`` itself (a symlink there: WriteFailed)."""
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as e:
        why = "a symlink" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise WriteFailed(f"{path}: cannot open the folder ({why})") from None


@contextlib.contextmanager
def _folder(path: Path) -> Any:
    fd = _open_folder(path)
    try:
        yield fd
    finally:
        os.close(fd)


def _identity(st: os.stat_result) -> Identity:
    return st.st_ino, st.st_size, st.st_mtime_ns


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


def _open_at(dir_fd: int, name: str, where: Path) -> int:
    """Open the regular file ``name`` of the folder ``dir_fd``, never through a link."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        why = "a symlink" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise WriteFailed(f"{where}: cannot open ({why})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WriteFailed(f"{where}: not a regular file")
    os.set_blocking(fd, True)
    return fd


def _sha256(fd: int, size: int, where: Path, stop: threading.Event | None = None) -> str:
    h = hashlib.sha256()
    buf = bytearray(min(_CHUNK, size) or 1)
    view = memoryview(buf)
    for at in range(0, size, _CHUNK):
        if stop is not None and stop.is_set():
            raise WriteFailed(f"{where}: hashing stopped")
        n = min(_CHUNK, size - at)
        fileio.preadv_exact(fd, view[:n], at, where)
        h.update(view[:n])
    return h.hexdigest()


def _hash_at(
    dir_fd: int, name: str, where: Path, stop: threading.Event | None = None
) -> tuple[int, str, Identity]:
    """Size, SHA-256 and identity of the regular file ``name`` in ``dir_fd`` (``stop``:
    set, it ends the reading early)."""
    fd = _open_at(dir_fd, name, where)
    try:
        st = os.fstat(fd)
        return st.st_size, _sha256(fd, st.st_size, where, stop), _identity(st)
    finally:
        os.close(fd)


# ---- the marker -----------------------------------------------------------------------------
class _Stream:
    """One file hashed as it is written: ranges read back in order as they complete."""

    def __init__(self, fd: int, where: Path) -> None:
        self.fd = os.dup(fd)  # the writer's descriptor is closed when the file is committed
        self.where = where
        self.sha = hashlib.sha256()
        self.end = 0  # bytes queued for hashing so far
        self.broken = False  # a range out of order: hashed whole once complete instead

    def update(self, start: int, end: int, stop: threading.Event) -> None:
        for at in range(start, end, _CHUNK):
            if stop.is_set():
                raise WriteFailed(f"{self.where}: hashing stopped")
            self.sha.update(fileio.pread_exact(self.fd, min(_CHUNK, end - at), at, self.where))

    def finish(self) -> tuple[int, str, Identity]:
        try:
            st = os.fstat(self.fd)
            if st.st_size != self.end:
                raise WriteFailed(f"{self.where}: {st.st_size} bytes, {self.end} hashed")
            return st.st_size, self.sha.hexdigest(), _identity(st)
        finally:
            self.close()

    def close(self) -> None:
        """Close the descriptor (once; the thread that reads it has stopped or is done)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Hashes:
    """The SHA-256 of each file of the new folder ``tmp``, computed in a background thread
    while the export writes: a shard's bytes are read back (from the page cache) range by
    range as the writer reports them complete (:meth:`written`), so hashing overlaps
    decoding and writing; any other file is read back whole (:meth:`files`). A context
    manager: leaving it stops the thread.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "config.json").write_text("{}")
    >>> with Hashes(d) as h:
    ...     h.files(["config.json"])[0]["sha256"][:8]
    '44136fa3'
    """

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self._fd = _open_folder(tmp)
        self._pool = ThreadPoolExecutor(max_workers=1)  # in order; hashlib releases the GIL
        self._stop = threading.Event()  # an interrupted export does not wait for a hash
        self._streams: dict[str, _Stream] = {}  # being written
        self._opened: list[_Stream] = []  # each closed at the latest on leaving
        self._done: dict[str, Future[tuple[int, str, Identity]]] = {}

    def __enter__(self) -> Hashes:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for stream in self._opened:
            stream.close()
        os.close(self._fd)

    def written(self, name: str, fd: int, start: int, end: int) -> None:
        """Bytes ``[start, end)`` of the file ``name`` (open as ``fd``) are written; the
        bytes before the first range reported (the header) are taken as written too.

        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> fd = os.open(d / "model.safetensors", os.O_RDWR | os.O_CREAT, 0o644)
        >>> _ = os.pwrite(fd, b"header" + b"x" * 10, 0)
        >>> with Hashes(d) as h:
        ...     h.written("model.safetensors", fd, 6, 16)  # bytes 0-5 count as written
        ...     h.complete("model.safetensors")
        ...     got = h.files(["model.safetensors"])[0]["sha256"]
        >>> os.close(fd)
        >>> got == hashlib.sha256(b"header" + b"x" * 10).hexdigest()
        True
        """
        stream = self._streams.get(name)
        if stream is None:
            stream = self._streams[name] = _Stream(fd, self.tmp / name)
            self._opened.append(stream)
        if stream.broken or start < stream.end:
            stream.broken = True
            return
        self._pool.submit(stream.update, stream.end, end, self._stop)
        stream.end = end

    def complete(self, name: str) -> None:
        """The file ``name`` is complete (under its name): its digest, from its ranges when
        they covered it in order, else read back whole.

        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "config.json").write_text("{}")
        >>> with Hashes(d) as h:
        ...     h.complete("config.json")  # never reported by range: read back whole
        ...     h.files(["config.json"])[0]["size"]
        2
        """
        stream = self._streams.pop(name, None)
        if stream is not None and not stream.broken:
            self._done[name] = self._pool.submit(stream.finish)
            return
        if stream is not None:
            self._pool.submit(stream.close)  # after its queued ranges
        where = self.tmp / name
        self._done[name] = self._pool.submit(_hash_at, self._fd, name, where, self._stop)

    def files(self, names: list[str]) -> list[dict[str, Any]]:
        """``{"name", "size", "sha256"}`` of each of ``names`` (hashed now if not yet).

        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "config.json").write_text("{}")
        >>> with Hashes(d) as h:
        ...     h.files(["config.json"])
        [{'name': 'config.json', 'size': 2, 'sha256': '44136fa3...'}]
        """
        for name in names:
            if name not in self._done:
                self.complete(name)
        return [
            {"name": n, "size": size, "sha256": digest}
            for n in names
            for size, digest, _ in (self._done[n].result(),)
        ]


def write_marker(tmp: Path, names: list[str], vault: str, hashes: Hashes | None = None) -> None:
    """Write :data:`MARKER` into the new export folder ``tmp``: each of ``names`` (files of
    ``tmp``, read back, by ``hashes`` where it has them already) with its size and SHA-256,
    and the vault's file name.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "config.json").write_text("{}")
    >>> write_marker(d, ["config.json"], "v.smoe")
    >>> doc = json.loads((d / MARKER).read_text())
    >>> doc["schema"], doc["files"][0]["size"], doc["files"][0]["sha256"][:8]
    ('smoe-export/1', 2, '44136fa3')
    """
    if hashes is None:
        with Hashes(tmp) as own:
            files = own.files(names)
    else:
        files = hashes.files(names)
    doc = {"schema": SCHEMA, "vault": vault, "files": files}
    data = json.dumps(utf8_tree(doc), indent=2, sort_keys=True, ensure_ascii=True) + "\n"
    f = AtomicFile(tmp / MARKER)
    try:
        f.pwrite(data.encode("ascii"), 0)
        f.commit()
    except BaseException:
        f.abort()
        raise


def parse_marker(data: bytes) -> dict[str, tuple[int, str]]:
    """The files a marker lists: name -> (size, SHA-256); ValueError saying what is wrong.

    >>> parse_marker(b'{"schema": "smoe-export/1", "files": [{"name": "config.json", '
    ...              b'"size": 2, "sha256": "' + b"0" * 64 + b'"}]}')["config.json"][0]
    2
    >>> parse_marker(b'{"schema": "smoe-export/1", "files": [{"name": "../x", "size": 2}]}')
    Traceback (most recent call last):
    ValueError: files[0]: name '../x' is not a plain file name
    """
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"no schema {SCHEMA!r}")
    files = doc.get("files")
    if not isinstance(files, list) or len(files) > MAX_FILES:
        raise ValueError(f"files is not a list of at most {MAX_FILES} entries")
    out: dict[str, tuple[int, str]] = {}
    for i, f in enumerate(files):
        name = f.get("name") if isinstance(f, dict) else None
        if not isinstance(name, str) or name in ("", ".", "..", MARKER) or "/" in name:
            raise ValueError(f"files[{i}]: name {name!r} is not a plain file name")
        size, digest = f.get("size"), f.get("sha256")
        if type(size) is not int or size < 0 or not isinstance(digest, str):
            raise ValueError(f"files[{i}]: no size and sha256")
        if not _HEX64.fullmatch(digest) or name in out:
            raise ValueError(f"files[{i}]: {name!r} listed twice or its sha256 not 64 hex digits")
        out[name] = (size, digest)
    return out


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _read_marker(out_dir: Path, dir_fd: int) -> tuple[dict[str, tuple[int, str]], Identity]:
    """The files the marker of ``out_dir`` lists, and its identity; refused in one line."""
    if _lstat_at(dir_fd, MARKER) is None:
        raise WriteFailed(
            f"{out_dir}: has no {MARKER}, the marker every export writes, so smoe did not "
            f"write it; {FORCE}"
        )
    where = out_dir / MARKER
    fd = _open_at(dir_fd, MARKER, where)
    try:
        st = os.fstat(fd)
        if st.st_size > MARKER_BYTES:
            raise WriteFailed(
                f"{where}: {st.st_size} bytes, more than the {MARKER_BYTES} of a marker an "
                f"export writes; {FORCE}"
            )
        data = fileio.pread_exact(fd, st.st_size, 0, where)
    finally:
        os.close(fd)
    try:
        return parse_marker(data), _identity(st)
    except ValueError as e:
        raise WriteFailed(f"{where}: not a marker smoe export wrote ({e}); {FORCE}") from None


def check_earlier(out_dir: Path, hashes: bool = True) -> Earlier:
    """The earlier export in ``out_dir`` if ``--force`` may replace it (see the module
    docstring), else WriteFailed naming the first entry that is not as its marker lists it
    (``hashes`` False: sizes only, the quick check before any work).

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "config.json").write_text("{}")
    >>> write_marker(d, ["config.json"], "v.smoe")
    >>> sorted(check_earlier(d).entries)
    ['config.json', 'smoe-export.json']
    >>> _ = (d / "notes.txt").write_text("mine")
    >>> check_earlier(d)
    Traceback (most recent call last):
    smoe.errors.WriteFailed: /...: holds 'notes.txt', which its smoe-export.json does not list...
    """
    with _folder(out_dir) as dir_fd:
        folder = os.fstat(dir_fd)
        listed, marker = _read_marker(out_dir, dir_fd)
        entries = {MARKER: marker}
        for name in sorted(os.listdir(dir_fd)):
            if name != MARKER:
                entries[name] = _check_entry(out_dir, dir_fd, name, listed.get(name), hashes)
    return Earlier(out_dir, (folder.st_dev, folder.st_ino), entries)


def _check_entry(
    out_dir: Path, dir_fd: int, name: str, listed: tuple[int, str] | None, hashes: bool
) -> Identity:
    """One entry of an earlier export: a regular file its marker lists, as it lists it."""
    if listed is None:
        raise WriteFailed(
            f"{out_dir}: holds {name!r}, which its {MARKER} does not list (smoe did not "
            f"write it); {FORCE}"
        )
    st = _lstat_at(dir_fd, name)
    if st is None or not stat.S_ISREG(st.st_mode):
        raise WriteFailed(f"{out_dir}: {name!r} is not a regular file; {FORCE}")
    size, digest = listed
    if st.st_size != size:
        raise WriteFailed(
            f"{out_dir}: {name!r} is {st.st_size} bytes, not the {size} its {MARKER} lists "
            f"(changed since the export wrote it); {FORCE}"
        )
    if not hashes:
        return _identity(st)
    got, sha, identity = _hash_at(dir_fd, name, out_dir / name)
    if (got, sha) != (size, digest):
        raise WriteFailed(
            f"{out_dir}: {name!r} changed since the export wrote it (its SHA-256 is not the "
            f"one its {MARKER} lists); {FORCE}"
        )
    return identity


# ---- replacing it ---------------------------------------------------------------------------
def _changed(earlier: Earlier, what: str) -> WriteFailed:
    return WriteFailed(
        f"{earlier.path}: {what} while the export ran; nothing deleted, the new export "
        "not put in place"
    )


def recheck(earlier: Earlier) -> None:
    """The folder is still the one checked (not a symlink, the same inode) and holds the
    same entries, each the same file, unchanged; else WriteFailed."""
    try:
        st = os.lstat(earlier.path)
    except OSError:
        raise _changed(earlier, "was removed") from None
    if stat.S_ISLNK(st.st_mode) or (st.st_dev, st.st_ino) != earlier.folder:
        raise _changed(earlier, "was replaced (by a symlink or another folder)")
    with _folder(earlier.path) as dir_fd:
        here = os.fstat(dir_fd)
        if (here.st_dev, here.st_ino) != earlier.folder:
            raise _changed(earlier, "was replaced (by a symlink or another folder)")
        for name in sorted(os.listdir(dir_fd)):
            want = earlier.entries.get(name)
            if want is None:
                raise _changed(earlier, f"{name!r} appeared in it")
            now = _lstat_at(dir_fd, name)
            if now is None or not stat.S_ISREG(now.st_mode) or _identity(now) != want:
                raise _changed(earlier, f"{name!r} changed")


def _rename_aside(path: Path, aside: Path) -> None:
    try:
        os.rename(path, aside)
    except OSError as e:
        why = e.strerror or e
        raise WriteFailed(f"{path}: cannot move the earlier export aside: {why}") from None


def move_aside(earlier: Earlier) -> Path:
    """Check the folder once more (:func:`recheck`), rename it aside, and make sure what
    was renamed is that folder (not a symlink swapped in meanwhile: it is put back, and
    WriteFailed); the aside name, one the sweep of stale folders knows.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()) / "out"
    >>> d.mkdir(); _ = (d / "config.json").write_text("{}")
    >>> write_marker(d, ["config.json"], "v.smoe")
    >>> e = check_earlier(d)
    >>> aside = move_aside(e)
    >>> bool(_STALE.match(aside.name)), d.exists(), sorted(os.listdir(aside))
    (True, False, ['config.json', 'smoe-export.json'])
    >>> d.mkdir(); move_aside(e)  # a different folder there now
    Traceback (most recent call last):
    smoe.errors.WriteFailed: /.../out: was replaced (by a symlink or another folder) while...
    """
    recheck(earlier)
    path = earlier.path
    aside = path.parent / f".{path.name}.{secrets.token_hex(4)}.old"
    _rename_aside(path, aside)
    try:
        with _folder(aside) as dir_fd:
            st = os.fstat(dir_fd)
        same = (st.st_dev, st.st_ino) == earlier.folder
    except WriteFailed:
        same = False
    if not same:
        put_back(aside, path)
        raise _changed(earlier, "was replaced (by a symlink or another folder)")
    return aside


def put_back(aside: Path, path: Path) -> None:
    """Rename ``aside`` back to ``path`` if nothing took its place meanwhile.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> (d / ".out.0123abcd.old").mkdir()
    >>> put_back(d / ".out.0123abcd.old", d / "out")
    >>> sorted(os.listdir(d))
    ['out']
    >>> (d / ".again.old").mkdir()
    >>> put_back(d / ".again.old", d / "out")  # "out" is taken: left as it is
    >>> sorted(os.listdir(d))
    ['.again.old', 'out']
    """
    if not os.path.lexists(path):
        with contextlib.suppress(OSError):
            os.rename(aside, path)


def remove_earlier(aside: Path, earlier: Earlier) -> list[str]:
    """Unlink, through a descriptor of ``aside`` that must be the folder checked, each name
    the earlier export's marker lists that is still the file checked, the marker last, then
    the folder if it is empty; the names left in it (none: it is gone).

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()) / "out"
    >>> d.mkdir(); _ = (d / "config.json").write_text("{}")
    >>> write_marker(d, ["config.json"], "v.smoe")
    >>> e = check_earlier(d)
    >>> aside = move_aside(e)
    >>> _ = (aside / "notes.txt").write_text("mine")  # appeared in the last instant: kept
    >>> remove_earlier(aside, e), sorted(os.listdir(aside))
    (['notes.txt'], ['notes.txt'])
    >>> (aside / "notes.txt").unlink(); remove_earlier(aside, e), aside.exists()
    ([], False)
    """
    try:
        dir_fd = _open_folder(aside)
    except WriteFailed:
        return ["(the folder was replaced)"]
    try:
        st = os.fstat(dir_fd)
        if (st.st_dev, st.st_ino) != earlier.folder:
            return ["(the folder was replaced)"]
        for name in sorted(earlier.entries, key=lambda n: n == MARKER):
            now = _lstat_at(dir_fd, name)
            same = now is not None and _identity(now) == earlier.entries[name]
            if same and now is not None and stat.S_ISREG(now.st_mode):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
        left = sorted(os.listdir(dir_fd))
    finally:
        os.close(dir_fd)
    if not left:
        with contextlib.suppress(OSError):
            os.rmdir(aside)
    return left


def remove_written(path: Path) -> None:
    """Remove a temporary export folder of ours: its regular files of the names an export
    writes (:data:`WRITTEN`), through a descriptor that follows no link, then the folder
    if that empties it; anything else stays, and the folder with it.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> for name in ("config.json", "model.safetensors", "notes.txt"):
    ...     _ = (d / name).write_text("x")
    >>> remove_written(d); sorted(os.listdir(d))
    ['notes.txt']
    >>> (d / "notes.txt").unlink(); remove_written(d); d.exists()
    False
    """
    try:
        dir_fd = _open_folder(path)
    except WriteFailed:
        return
    try:
        for name in os.listdir(dir_fd):
            st = _lstat_at(dir_fd, name)
            if WRITTEN.match(name) and st is not None and stat.S_ISREG(st.st_mode):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
        left = os.listdir(dir_fd)
    finally:
        os.close(dir_fd)
    if not left:
        with contextlib.suppress(OSError):
            os.rmdir(path)


def sweep(out_dir: Path) -> None:
    """The folders a killed export of ``out_dir`` left beside it (call under the lock): a
    new folder being written (``.<name>.<hex>.tmp``: :func:`remove_written`) and an earlier
    export moved aside (``.<name>.<hex>.old``: removed only as :func:`check_earlier` allows
    and :func:`remove_earlier` does).

    >>> import tempfile
    >>> parent = Path(tempfile.mkdtemp())
    >>> tmp, old, foreign = (parent / n for n in (".out.0a0a0a0a.tmp", ".out.1b1b1b1b.old",
    ...                                            ".out.2c2c2c2c.old"))
    >>> for d in (tmp, old, foreign):
    ...     d.mkdir(); _ = (d / "config.json").write_text("{}")
    >>> write_marker(old, ["config.json"], "v.smoe")  # an earlier export moved aside
    >>> sweep(parent / "out"); sorted(os.listdir(parent))  # no marker: not ours, kept
    ['.out.2c2c2c2c.old']
    """
    try:
        names = os.listdir(out_dir.parent)
    except OSError:
        return
    for name in names:
        m = _STALE.match(name)
        path = out_dir.parent / name
        if not m or m.group("name") != out_dir.name or not _is_folder(path):
            continue
        if m.group("kind") == "tmp":
            remove_written(path)
            continue
        try:
            remove_earlier(path, check_earlier(path))
        except SmoeError:
            continue  # not as an export left it: kept


def _is_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
