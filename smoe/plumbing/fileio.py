"""Checked file primitives every smoe writer and reader goes through.

* Writes loop until every byte is written; an OSError (ENOSPC, EDQUOT, EIO, EROFS,
  EACCES, ...) becomes one :class:`WriteFailed` line naming the file and the error.
* Files the tools create are never reached through a symlink: new files are created
  exclusively with ``O_NOFOLLOW``; a fixed-name file (a resumable partial, a journal, a
  lock) is reused only if it is a regular file of ours with a single link.
* Inputs are untouchable: :func:`refuse_same_file` compares device and inode.
* An output is renamed only onto nothing, a symlink or a regular file (a folder onto a
  folder), never onto a FIFO or a device (:func:`existing_output`); the new file takes over
  the owner, group and mode of the one it replaces (:func:`take_over`).
* Inputs that are not regular files (FIFOs, devices, directories) are refused at once
  (:class:`NotRegular`), and a file that shrinks under a reader gives a clean error, never a
  hang or a signal; :func:`reading` turns any other failed open or stat of an input into
  :class:`UnreadableInput`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from smoe.errors import OutputExists, SmoeError, UnreadableInput, WriteFailed
from smoe.plumbing.input_errors import (
    CannotOpen,
    InputDenied,
    InputIsFolder,
    InputMissing,
    NotRegular,
    kind_of,
    not_regular,
)

if TYPE_CHECKING:
    from collections.abc import Buffer  # bytes, bytearray, memoryview, numpy arrays, ...

    import numpy as np

__all__ = [
    "DIRECT_ALIGN",
    "READ_ERRNOS",
    "CannotOpen",
    "InputDenied",
    "InputIsFolder",
    "InputMissing",
    "NotRegular",
    "aligned_empty",
    "create_new",
    "direct_io",
    "ensure_dir",
    "existing_output",
    "fsync",
    "fsync_dir",
    "open_input",
    "open_owned",
    "pread_exact",
    "preadv_exact",
    "pwrite_all",
    "read_whole",
    "reading",
    "refuse_existing",
    "refuse_same_file",
    "rename",
    "rename_new",
    "require_regular",
    "same_file",
    "take_over",
    "truncate",
    "unlink_owned",
]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def _current_umask() -> int:
    """The process umask (read without changing it for longer than two calls)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- writing ------------------------------------------------------------------------------
def pwrite_all(fd: int, data: Buffer, offset: int, path: str | os.PathLike) -> None:
    """Write all of ``data`` (any buffer) at ``offset``; short writes continue, errors raise
    WriteFailed.

    >>> import os, tempfile, numpy as np
    >>> path = tempfile.mkdtemp() + "/out.bin"
    >>> fd = create_new(path)
    >>> pwrite_all(fd, np.arange(3, dtype="<u2"), 2, path)
    >>> os.close(fd)
    >>> open(path, "rb").read().hex(" ")
    '00 00 00 00 01 00 02 00'
    """
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        try:
            n = os.pwrite(fd, view[done:], offset + done)
        except InterruptedError:
            continue
        except OSError as e:
            raise WriteFailed(
                f"{path}: cannot write {len(view) - done} bytes at offset "
                f"{offset + done}: {_why(e)}"
            ) from None
        if n <= 0:
            raise WriteFailed(
                f"{path}: cannot write {len(view) - done} bytes at offset "
                f"{offset + done}: the write made no progress"
            )
        done += n


def truncate(fd: int, size: int, path: str | os.PathLike) -> None:
    """``ftruncate`` with a one-line error.

    >>> import os, tempfile
    >>> path = tempfile.mkdtemp() + "/out.bin"
    >>> fd = create_new(path)
    >>> truncate(fd, 16384, path)
    >>> os.fstat(fd).st_size
    16384
    >>> os.close(fd)
    """
    try:
        os.ftruncate(fd, size)
    except OSError as e:
        raise WriteFailed(f"{path}: cannot set the size to {size} bytes: {_why(e)}") from None


def fsync(fd: int, path: str | os.PathLike) -> None:
    """``fsync`` with a one-line error (a failed fsync means the data may be lost).

    >>> import os, tempfile
    >>> path = tempfile.mkdtemp() + "/out.bin"
    >>> fd = create_new(path)
    >>> pwrite_all(fd, b"data", 0, path)
    >>> fsync(fd, path)
    >>> os.close(fd)
    """
    try:
        os.fsync(fd)
    except OSError as e:
        raise WriteFailed(f"{path}: cannot flush to disk (fsync): {_why(e)}") from None


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename in the folder ``path`` durable (``fsync`` of the folder).

    >>> import tempfile
    >>> fsync_dir(tempfile.mkdtemp())
    >>> fsync_dir("no/such/folder")
    Traceback (most recent call last):
    smoe.errors.WriteFailed: no/such/folder: cannot open the folder to flush it: No such file ...
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    except OSError as e:
        raise WriteFailed(f"{path}: cannot open the folder to flush it: {_why(e)}") from None
    try:
        fsync(fd, path)
    finally:
        os.close(fd)


def rename(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """``os.replace`` of a file (or folder) of ours onto an output, with a one-line error.

    What ``dst`` is now is checked at the last moment (:func:`existing_output`: a FIFO or a
    device there is refused, never replaced), and ``src`` takes over the owner, group and
    mode of the file it replaces (:func:`take_over`).

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> os.close(create_new(f"{d}/.a.tmp"))
    >>> rename(f"{d}/.a.tmp", f"{d}/a")
    >>> os.listdir(d)
    ['a']
    >>> os.mkfifo(f"{d}/p"); os.close(create_new(f"{d}/.p.tmp"))
    >>> rename(f"{d}/.p.tmp", f"{d}/p")
    Traceback (most recent call last):
    smoe.errors.WriteFailed: /.../p: exists and is not a regular file (a FIFO); refusing ...
    """
    try:
        folder = stat.S_ISDIR(os.lstat(src).st_mode)
    except OSError:
        folder = False  # os.replace says why
    take_over(src, existing_output(dst, folder))
    try:
        os.replace(src, dst)
    except OSError as e:
        raise WriteFailed(f"{dst}: cannot rename {Path(src).name} onto it: {_why(e)}") from None


def rename_new(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Put the file ``src`` of ours in place as ``dst``, which must not exist: never replaced,
    also when it appears at the last moment (a hard link, which fails if ``dst`` exists, then
    the temporary name removed); :class:`~smoe.errors.OutputExists` if it is there. Where the
    file system has no hard links, a check just before a rename.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> os.close(create_new(f"{d}/.a.tmp")); rename_new(f"{d}/.a.tmp", f"{d}/a")
    >>> os.close(create_new(f"{d}/.a.tmp")); rename_new(f"{d}/.a.tmp", f"{d}/a")
    Traceback (most recent call last):
    smoe.errors.OutputExists: /.../a: exists; --force replaces it
    >>> sorted(os.listdir(d))  # the temporary file is the caller's to remove
    ['.a.tmp', 'a']
    """
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        raise OutputExists.at(dst) from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise WriteFailed(f"{dst}: cannot put {Path(src).name} in place: {_why(e)}") from None
        if os.path.lexists(dst):  # no hard links here: checked, then renamed
            raise OutputExists.at(dst) from None
        rename(src, dst)
        return
    try:
        os.unlink(src)
    except OSError as e:
        raise WriteFailed(f"{src}: cannot remove after linking it to {dst}: {_why(e)}") from None


def refuse_existing(path: str | os.PathLike) -> None:
    """:class:`~smoe.errors.OutputExists` if ``path`` exists (a dangling symlink too; what
    is not a regular file is refused as :func:`existing_output` refuses it, ``--force`` or not).

    >>> refuse_existing("fixtures/q4_v2.smoe")
    Traceback (most recent call last):
    smoe.errors.OutputExists: fixtures/q4_v2.smoe: exists; --force replaces it
    """
    existing_output(path)
    if os.path.lexists(path):
        raise OutputExists.at(path)


def ensure_dir(path: str | os.PathLike) -> Path:
    """Create the output folder (and parents); refuse a non-folder in its place.

    >>> import tempfile
    >>> ensure_dir(tempfile.mkdtemp() + "/a/b").is_dir()
    True
    >>> ensure_dir("fixtures/q4_v2.smoe")
    Traceback (most recent call last):
    smoe.errors.WriteFailed: fixtures/q4_v2.smoe: exists and is not a folder
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise WriteFailed(f"{path}: exists and is not a folder") from None
    except OSError as e:
        raise WriteFailed(f"{path}: cannot create the folder: {_why(e)}") from None
    if not path.is_dir():
        raise WriteFailed(f"{path}: exists and is not a folder")
    return path


# ---- outputs that replace what is there ---------------------------------------------------
def existing_output(path: str | os.PathLike, folder: bool = False) -> os.stat_result | None:
    """``lstat`` an output about to be replaced: None where nothing is there (or a symlink,
    which is replaced, never followed); anything but a regular file (a folder, with
    ``folder``) is refused, so a rename never lands on a FIFO or a device.

    >>> existing_output("no/such/out.html") is None, existing_output("LICENSE").st_size > 0
    (True, True)
    >>> existing_output("/dev/null")
    Traceback (most recent call last):
    smoe.errors.WriteFailed: /dev/null: exists and is not a regular file (a character ...
    """
    try:
        st = os.lstat(path)
    except OSError:
        return None  # absent, or out of reach: creating it says why
    if stat.S_ISLNK(st.st_mode):
        return None
    if folder and not stat.S_ISDIR(st.st_mode):
        kind = "" if stat.S_ISREG(st.st_mode) else f" ({kind_of(st.st_mode)})"
        raise WriteFailed(f"{path}: exists and is not a folder{kind}")
    if not folder and not stat.S_ISREG(st.st_mode):
        raise WriteFailed(
            f"{path}: exists and is not a regular file ({kind_of(st.st_mode)}); "
            "refusing to replace it"
        )
    return st


def take_over(target: int | str | os.PathLike, st: os.stat_result | None) -> None:
    """Give a new file or folder of ours (an fd, or a path, never followed) the owner,
    group and mode of ``st``, the one it replaces (None: keep the umask's mode). An owner or
    group this process may not give is left as it is (the mode is still kept, less what the
    kernel drops).

    >>> import os, stat, tempfile
    >>> d = tempfile.mkdtemp()
    >>> old, new = f"{d}/old", f"{d}/new"
    >>> os.close(create_new(old, 0o600))
    >>> fd = create_new(new)
    >>> take_over(fd, os.stat(old)); os.close(fd)
    >>> oct(stat.S_IMODE(os.stat(new).st_mode))
    '0o600'
    """
    if st is None:
        return
    if not isinstance(target, int):
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
        except OSError:
            return  # gone or out of reach: what comes next says why
        try:
            take_over(fd, st)
        finally:
            os.close(fd)
        return
    fd = target
    for uid, gid in ((st.st_uid, st.st_gid), (-1, st.st_gid)):
        try:
            os.fchown(fd, uid, gid)  # before the mode: chown clears set-id bits
            break
        except OSError:
            continue
    with contextlib.suppress(OSError):  # e.g. a filesystem without modes
        os.fchmod(fd, stat.S_IMODE(st.st_mode))


# ---- creating files without following links ------------------------------------------------
def create_new(path: str | os.PathLike, mode: int = 0o666) -> int:
    """Create ``path`` exclusively (never through a symlink); returns a read-write fd.

    >>> import os, tempfile
    >>> path = tempfile.mkdtemp() + "/new.bin"
    >>> os.close(create_new(path))
    >>> create_new(path)
    Traceback (most recent call last):
    smoe.errors.WriteFailed: /...new.bin: already exists (refusing to overwrite or follow it)
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        raise WriteFailed(f"{path}: already exists (refusing to overwrite or follow it)") from None
    except OSError as e:
        raise WriteFailed(f"{path}: cannot create: {_why(e)}") from None
    with contextlib.suppress(OSError):  # e.g. a filesystem without modes: still ours
        os.fchmod(fd, mode & ~_current_umask())
    return fd


def open_owned(path: str | os.PathLike, create: bool = True) -> int:
    """Open a fixed-name working file (partial, journal, lock) read-write.

    Refused, and neither followed nor deleted: a symlink, anything that is not a regular
    file, a file with more than one hard link or owned by another user.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> os.close(open_owned(f"{d}/job.partial"))  # created, or reused: a file of ours
    >>> os.symlink("job.partial", f"{d}/link")
    >>> open_owned(f"{d}/link")
    Traceback (most recent call last):
    smoe.errors.WriteFailed: /...link: is a symlink, not a file smoe made; refused, ...
    """
    flags = os.O_RDWR | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o666 & ~_current_umask())
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise WriteFailed(
                f"{path}: is a symlink, not a file smoe made; refused, not followed and not deleted"
            ) from None
        raise WriteFailed(f"{path}: cannot open: {_why(e)}") from None
    try:
        st = os.fstat(fd)
        foreign = None
        if not stat.S_ISREG(st.st_mode):
            foreign = "is not a regular file"
        elif st.st_nlink != 1:
            foreign = f"has {st.st_nlink} hard links"
        elif hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            foreign = f"belongs to user {st.st_uid}"
        if foreign:
            raise WriteFailed(
                f"{path}: {foreign}, not a file smoe made; refused, not followed and not deleted"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlink_owned(path: str | os.PathLike) -> None:
    """Remove a working file if it is a regular file (a symlink there is left alone).

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> os.close(create_new(f"{d}/job.partial"))
    >>> os.symlink("job.partial", f"{d}/link")
    >>> unlink_owned(f"{d}/link"); unlink_owned(f"{d}/job.partial"); unlink_owned(f"{d}/gone")
    >>> os.listdir(d)
    ['link']
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError:
        return
    if stat.S_ISREG(st.st_mode):
        with contextlib.suppress(OSError):
            os.unlink(path)


# ---- inputs ------------------------------------------------------------------------------
def open_existing(path: str | os.PathLike) -> int | None:
    """Open what is at ``path`` to read it, never through a symlink and never blocking on
    a FIFO: None where nothing (or a symlink, or something out of reach) is there.

    >>> fd = open_existing("LICENSE"); os.close(fd) if fd is not None else None
    >>> open_existing("no/such/file") is None
    True
    """
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
    except OSError:
        return None


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two ``stat`` results are the same file (device and inode).

    >>> import os
    >>> same_file(os.stat("fixtures/q4_v2.smoe"), os.stat("fixtures/../fixtures/q4_v2.smoe"))
    True
    """
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def refuse_same_file(
    out: str | os.PathLike, inputs: Iterable[str | os.PathLike], what: str = "output"
) -> None:
    """Refuse an output that is (through symlinks or hard links) one of the inputs.

    >>> refuse_same_file("fixtures/../fixtures/q4_v2.smoe", ["fixtures/q4_v2.smoe"])
    Traceback (most recent call last):
    smoe.errors.WriteFailed: fixtures/../fixtures/q4_v2.smoe: the output is the input ...
    >>> refuse_same_file("no/such/output.smoe", ["fixtures/q4_v2.smoe"])  # a new file: fine
    """
    try:
        st_out = os.stat(out)
    except OSError:
        return  # does not exist (or cannot be reached): it cannot be an input
    for src in inputs:
        try:
            st_in = os.stat(src)
        except OSError:
            continue
        if same_file(st_out, st_in):
            raise WriteFailed(
                f"{out}: the {what} is the input {src} itself; refusing to overwrite an input"
            )


def open_input(path: str | os.PathLike) -> int:
    """Open an input read-only; anything but a regular file is refused without blocking.

    >>> import os
    >>> fd = open_input("fixtures/q4_v2.smoe")
    >>> os.pread(fd, 4, 0)
    b'SMOE'
    >>> os.close(fd)
    >>> open_input("/dev/null")
    Traceback (most recent call last):
    smoe.plumbing.input_errors.NotRegular: /dev/null: not a regular file (a character device)
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC)
    except OSError as e:
        raise CannotOpen.of(path, e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def require_regular(path: str | os.PathLike) -> os.stat_result:
    """``stat`` an input (through symlinks) and refuse anything but a regular file.

    >>> require_regular("fixtures/q4_v2.smoe").st_size
    147456
    >>> require_regular("fixtures")
    Traceback (most recent call last):
    smoe.plumbing.input_errors.InputIsFolder: fixtures: not a regular file (a folder)
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise CannotOpen.of(path, e) from None
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(path, st.st_mode)
    return st


READ_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EACCES,
        errno.EPERM,
        errno.ELOOP,
        errno.ENAMETOOLONG,
        errno.EIO,
        errno.ENXIO,
        errno.ENODEV,
    }
)
"""The errnos of an input that cannot be opened or read (:func:`reading`); the others
(EMFILE, ENOMEM, ENOSPC, ...) say nothing about the file."""


@contextlib.contextmanager
def reading() -> Iterator[None]:
    """Open, stat or list inputs inside: an ``OSError`` of a :data:`READ_ERRNOS` kind that
    names its file becomes :class:`UnreadableInput`, worded ``FILE: STRERROR`` (exit status
    2); any other is raised as it is.

    >>> with reading():
    ...     os.stat("no/such/config.json")
    Traceback (most recent call last):
    smoe.errors.UnreadableInput: no/such/config.json: No such file or directory
    """
    try:
        yield
    except OSError as e:
        if isinstance(e, SmoeError):  # CannotOpen: already worded and classed
            raise
        if e.errno in READ_ERRNOS and e.filename is not None:
            raise UnreadableInput.from_os(e) from None
        raise


def pread_exact(fd: int, n: int, offset: int, path: str | os.PathLike) -> bytes:
    """Exactly ``n`` bytes at ``offset``; a file that shrank gives a clean error.

    >>> import os
    >>> fd = open_input("fixtures/q4_v2.smoe")
    >>> pread_exact(fd, 4, 0, "fixtures/q4_v2.smoe")
    b'SMOE'
    >>> pread_exact(fd, 8, 147452, "fixtures/q4_v2.smoe")
    Traceback (most recent call last):
    smoe.errors.SmoeError: fixtures/q4_v2.smoe: file shrank while reading: 8 bytes at ...
    >>> os.close(fd)
    """
    parts = []
    got = 0
    while got < n:
        try:
            chunk = os.pread(fd, n - got, offset + got)
        except InterruptedError:
            continue
        except OSError as e:
            raise SmoeError(
                f"{path}: cannot read {n} bytes at offset {offset}: {_why(e)}"
            ) from None
        if not chunk:
            raise SmoeError(
                f"{path}: file shrank while reading: {n} bytes at offset {offset}, got {got}"
            )
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts) if len(parts) != 1 else parts[0]


def read_whole(
    path: str | os.PathLike, limit: int, too_large: Callable[[int], BaseException]
) -> bytes:
    """Every byte of a small input: a regular file (FIFOs, folders and devices refused
    without blocking, :func:`open_input`) of at most ``limit`` bytes, read whole; for a
    larger one, ``too_large(size)`` is raised before anything is read.

    >>> read_whole("fixtures/checkpoints/qwen3_moe/config.json", 1 << 20, ValueError)[:1]
    b'{'
    >>> read_whole("fixtures/q4_v2.smoe", 64, lambda n: SmoeError(f"{n} bytes: too large"))
    Traceback (most recent call last):
    smoe.errors.SmoeError: 147456 bytes: too large
    """
    fd = open_input(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise too_large(size)
        return pread_exact(fd, size, 0, path)
    finally:
        os.close(fd)


def preadv_exact(fd: int, buf: Buffer, offset: int, path: str | os.PathLike) -> None:
    """Fill ``buf`` (any writable buffer) from ``offset`` (one copy, no intermediate bytes).

    >>> import os, numpy as np
    >>> fd = open_input("fixtures/q4_v2.smoe")
    >>> buf = np.empty(4, np.uint8)
    >>> preadv_exact(fd, buf, 0, "fixtures/q4_v2.smoe")
    >>> os.close(fd)
    >>> buf.tobytes()
    b'SMOE'
    """
    view = memoryview(buf).cast("B")
    got = 0
    while got < len(view):
        try:
            n = os.preadv(fd, [view[got:]], offset + got)
        except InterruptedError:
            continue
        except OSError as e:
            raise SmoeError(
                f"{path}: cannot read {len(view)} bytes at offset {offset}: {_why(e)}"
            ) from None
        if n == 0:
            raise SmoeError(
                f"{path}: file shrank while reading: {len(view)} bytes at offset "
                f"{offset}, got {got}"
            )
        got += n


# ---- O_DIRECT -----------------------------------------------------------------------------
DIRECT_ALIGN = 4096
"""``O_DIRECT``: the alignment of buffer addresses, file offsets and lengths (the logical
block size of common devices)."""


def direct_io(fd: int) -> bool:
    """Turn on ``O_DIRECT`` for ``fd``; whether the file system took it.

    >>> import tempfile
    >>> fd = os.open(tempfile.mkdtemp() + "/f", os.O_CREAT | os.O_WRONLY)
    >>> direct_io(fd) in (True, False)  # False where O_DIRECT is refused (e.g. tmpfs)
    True
    >>> os.close(fd)
    """
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | flag)
        return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & flag)
    except OSError:
        return False


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised ``uint8`` array of ``nbytes`` starting at a :data:`DIRECT_ALIGN`
    boundary, as ``O_DIRECT`` reads and writes need.

    >>> aligned_empty(100).ctypes.data % DIRECT_ALIGN, aligned_empty(100).shape
    (0, (100,))
    """
    import numpy as np

    raw = np.empty(nbytes + DIRECT_ALIGN, np.uint8)
    skip = -raw.ctypes.data % DIRECT_ALIGN
    return raw[skip : skip + nbytes]
