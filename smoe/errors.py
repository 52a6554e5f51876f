"""The one error taxonomy of the smoe tools; every message names the file, field or expert.

Errors are raised where the problem is found, as the kind that says what went wrong; the
CLI maps kind -> exit status in one table (:data:`smoe.cli.failures.EXIT_STATUS`) and
prints the message as one ``error:`` line, word for word:

* :class:`UnreadableInput` (2): an input cannot be read at all: not a regular file, it
  cannot be opened, stat'ed or listed;
* :class:`UsageError` (2): a command line or API call refused as such; its
  :class:`MissingExtra`: an optional dependency the request needs is not installed;
  :class:`OutputExists`: an output is there already, and ``--force`` was not given;
* :class:`RefusedInput` (1): an input was read but is refused: a family the format cannot
  hold, a lying config, a file of another model; its :class:`StoppedResumable`: found
  mid-sculpt, the partial vault and journal kept for ``--resume``;
* :class:`FormatError` (1): a vault or manifest breaks a rule of the format;
* :class:`WriteFailed` (1): an output cannot be written: a full disk, a foreign file in the
  way, a lost race for a lock;
* :class:`SmoeError` (1): any other refused operation; the base of all of them.
"""

from __future__ import annotations

import os

__all__ = [
    "FormatError",
    "MissingExtra",
    "OutputExists",
    "RefusedInput",
    "SmoeError",
    "StoppedResumable",
    "Terminated",
    "UnreadableInput",
    "UsageError",
    "WriteFailed",
    "WriterStateError",
    "os_message",
]


def os_message(e: OSError) -> str:
    """``FILE: STRERROR`` (``FILE -> FILE2`` for a rename or link) of an ``OSError``.

    >>> os_message(FileNotFoundError(2, "No such file or directory", "m/config.json"))
    'm/config.json: No such file or directory'
    """
    why = e.strerror or str(e) or type(e).__name__
    if e.filename is None:
        return why
    name = os.fsdecode(e.filename)
    where = name if e.filename2 is None else f"{name} -> {os.fsdecode(e.filename2)}"
    return f"{where}: {why}"


class SmoeError(Exception):
    """A user-facing error: bad input, a broken vault, or a refused operation. The CLI
    prints its message as one ``error:`` line (exit status 1 unless its kind says otherwise).

    >>> from smoe.sculpt.source.hub import check_stem
    >>> try:
    ...     check_stem("a/b")
    ... except SmoeError as e:
    ...     print(e)
    output name 'a/b': not a file name stem (it must be non-empty, not '.' or '..', without '/')
    """


class UnreadableInput(SmoeError):
    """An input cannot be read at all (CLI exit status 2).

    >>> raise UnreadableInput.from_os(PermissionError(13, "Permission denied", "v.smoe"))
    Traceback (most recent call last):
    ...
    smoe.errors.UnreadableInput: v.smoe: Permission denied
    """

    @classmethod
    def from_os(cls, e: OSError) -> UnreadableInput:
        """The error of a failed open or read of an input, worded as ``FILE: STRERROR``.

        >>> str(UnreadableInput.from_os(IsADirectoryError(21, "Is a directory", "m")))
        'm: Is a directory'
        """
        return cls(os_message(e))


class UsageError(SmoeError):
    """A command line (or an API call) refused as such, before any input is read (exit 2).

    >>> str(UsageError("--jobs: must be at least 1"))
    '--jobs: must be at least 1'
    """


class MissingExtra(UsageError):
    """What was asked for needs an optional dependency this install lacks (exit 2, as the
    command line asked for something the install cannot do): the message names the module
    and the ``pip install 'smoe[EXTRA]'`` that brings it (:meth:`needs`).

    >>> isinstance(MissingExtra.needs("a model id needs huggingface_hub", "hub"), UsageError)
    True
    """

    @classmethod
    def needs(cls, what: str, extra: str) -> MissingExtra:
        """``what`` (naming the missing module) and the one install command of every hint,
        which works wherever the user is (the pip of smoe's environment takes the installed
        smoe as satisfying ``smoe``).

        >>> str(MissingExtra.needs("SMOE_KERNEL=fast needs numba", "fast"))
        "SMOE_KERNEL=fast needs numba: pip install 'smoe[fast]'"
        """
        return cls(f"{what}: pip install 'smoe[{extra}]'")


class OutputExists(UsageError):
    """A command would replace an output that already exists, and was not told to (exit 2:
    the command line names another output, or adds ``--force``). Raised before any work,
    and again at the commit if the output appeared meanwhile (it is then not replaced).

    >>> str(OutputExists.at("out/model.smoe"))
    'out/model.smoe: exists; --force replaces it'
    """

    @classmethod
    def at(cls, path: object) -> OutputExists:
        """The error for ``path``, in the one wording of the policy.

        >>> str(OutputExists.at("r.html"))
        'r.html: exists; --force replaces it'
        """
        return cls(f"{path}: exists; --force replaces it")


class RefusedInput(SmoeError):
    """An input that was read but is refused: what it says cannot be converted, or it
    contradicts another input (exit status 1).

    >>> isinstance(RefusedInput("m/config.json: no hidden_size"), SmoeError)
    True
    """


class StoppedResumable(RefusedInput):
    """A refused input found mid-run by a sculpt that can be resumed (exit status 1, as
    RefusedInput): non-finite activations in a calibration's forward pass. The run stops as
    an interruption does: the experts done so far stay in the partial vault and its journal,
    and ``--resume`` continues once the cause is fixed.

    >>> isinstance(StoppedResumable("m: --calibrate: layer 1: ..."), RefusedInput)
    True
    """


class FormatError(SmoeError):
    """A vault or manifest breaks a rule of the format (exit status 1); the readers'
    :class:`~smoe.vault.reader.VaultError` and
    :class:`~smoe.format.manifest.ManifestError` carry the rule's finding.

    >>> issubclass(FormatError, SmoeError)
    True
    """


class WriteFailed(SmoeError):
    """An output cannot be written or put in place (exit status 1).

    >>> str(WriteFailed.from_os(OSError(28, "No space left on device", "out/v.smoe")))
    'out/v.smoe: No space left on device'
    """

    @classmethod
    def from_os(cls, e: OSError) -> WriteFailed:
        """The error of a failed write, worded as ``FILE: STRERROR``.

        >>> str(WriteFailed.from_os(OSError(30, "Read-only file system", "o/v.smoe")))
        'o/v.smoe: Read-only file system'
        """
        return cls(os_message(e))


class WriterStateError(SmoeError):
    """A VaultWriter method was called in a state that does not allow it (a misuse of the
    API, exit status 1).

    >>> import tempfile
    >>> from smoe.format.records import ModelInfo
    >>> from smoe.vault.writer import VaultWriter
    >>> model = ModelInfo(1, 1, d_model=64, vocab_size=0, ffn_dim=0)
    >>> try:
    ...     VaultWriter(tempfile.mkdtemp() + "/v.smoe", model, version=1).plan
    ... except WriterStateError as e:
    ...     print(e)
    plan: the layout is planned by begin()
    """


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread by the CLI's handler: like Ctrl-C, every
    writer's clean-up runs on the way out (temporary files and locks removed; a sculpt keeps
    its partial and journal for ``--resume``), then the CLI exits 143.

    >>> issubclass(Terminated, KeyboardInterrupt), str(Terminated("SIGTERM"))
    (True, 'SIGTERM')
    """
