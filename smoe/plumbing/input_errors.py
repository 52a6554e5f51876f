"""The refusals of inputs that cannot be read: not a regular file, or not openable at all.

Apart from :mod:`smoe.plumbing.fileio` (which raises them and re-exports them) to keep that
module one job's size. A failed open is also the ``OSError`` Python's ``open()`` raises, so
code that catches ``FileNotFoundError`` around ``Vault.open`` works as around ``open()``.
"""

from __future__ import annotations

import errno
import os
import stat

from smoe.errors import UnreadableInput

__all__ = [
    "CannotOpen",
    "InputDenied",
    "InputIsFolder",
    "InputMissing",
    "NotRegular",
    "kind_of",
    "not_regular",
]


class NotRegular(UnreadableInput):
    """An input is not a regular file, or cannot be opened at all (CLI exit status 2).

    >>> print(NotRegular("p: not a regular file (a FIFO)"))
    p: not a regular file (a FIFO)
    """


class CannotOpen(NotRegular, OSError):
    """An input that cannot be opened, or a folder: a :class:`NotRegular` to the CLI (one
    line, exit status 2) and to Python the ``OSError`` ``open()`` raises, with its ``errno``
    and ``filename``: :class:`InputMissing` is a ``FileNotFoundError``, :class:`InputDenied`
    a ``PermissionError``, :class:`InputIsFolder` an ``IsADirectoryError``.

    >>> try:
    ...     raise CannotOpen.of("no/such.smoe", FileNotFoundError(2, "No such file or directory"))
    ... except FileNotFoundError as e:
    ...     print(e, "|", e.errno == errno.ENOENT, e.filename, isinstance(e, NotRegular))
    no/such.smoe: cannot open: No such file or directory | True no/such.smoe True
    """

    def __str__(self) -> str:
        if self.errno == errno.EISDIR:
            return f"{self.filename}: not a regular file (a folder)"
        return f"{self.filename}: cannot open: {self.strerror}"

    @staticmethod
    def of(path: str | os.PathLike, e: OSError) -> CannotOpen:
        """The error for a failed open or stat of ``path``, of the class matching ``e``.

        >>> e = CannotOpen.of("v.smoe", PermissionError(13, "Permission denied"))
        >>> type(e).__name__, isinstance(e, PermissionError), str(e)
        ('InputDenied', True, 'v.smoe: cannot open: Permission denied')
        """
        kinds = ((FileNotFoundError, InputMissing), (PermissionError, InputDenied))
        kind = next((k for os_kind, k in kinds if isinstance(e, os_kind)), CannotOpen)
        return kind(e.errno, e.strerror or str(e), os.fspath(path))


class InputMissing(CannotOpen, FileNotFoundError):
    """An input that is not there.

    >>> issubclass(InputMissing, FileNotFoundError), issubclass(InputMissing, NotRegular)
    (True, True)
    """


class InputDenied(CannotOpen, PermissionError):
    """An input the process may not read.

    >>> issubclass(InputDenied, PermissionError)
    True
    """


class InputIsFolder(CannotOpen, IsADirectoryError):
    """A folder where a file is read.

    >>> str(not_regular("models", stat.S_IFDIR)), issubclass(InputIsFolder, IsADirectoryError)
    ('models: not a regular file (a folder)', True)
    """


def not_regular(path: str | os.PathLike, mode: int) -> NotRegular:
    """The refusal of ``path``, not a regular file by its ``mode`` (a folder's is an OSError).

    >>> str(not_regular("p", stat.S_IFIFO))
    'p: not a regular file (a FIFO)'
    """
    if stat.S_ISDIR(mode):
        return InputIsFolder(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
    return NotRegular(f"{path}: not a regular file ({kind_of(mode)})")


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words ('a folder', 'a FIFO', ...).

    >>> kind_of(stat.S_IFDIR)
    'a folder'
    """
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file"
