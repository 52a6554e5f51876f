"""Exceptions of the smoe tools; every message names the file, field or expert at fault."""

__all__ = ["SmoeError", "WriterStateError"]


class SmoeError(Exception):
    """A user-facing error: bad input, a broken vault, or a refused operation. The CLI
    prints its message as one ``error:`` line (exit status 1).

    >>> from smoe.hub import check_stem
    >>> try:
    ...     check_stem("a/b")
    ... except SmoeError as e:
    ...     print(e)
    output name 'a/b': not a file name stem (it must be non-empty, not '.' or '..', without '/')
    """


class WriterStateError(SmoeError):
    """A VaultWriter method was called in a state that does not allow it.

    >>> import tempfile
    >>> from smoe.records import ModelInfo
    >>> from smoe.writer import VaultWriter
    >>> model = ModelInfo(1, 1, d_model=64, vocab_size=0, ffn_dim=0)
    >>> try:
    ...     VaultWriter(tempfile.mkdtemp() + "/v.smoe", model, version=1).plan
    ... except WriterStateError as e:
    ...     print(e)
    plan: the layout is planned by begin()
    """
