"""Exceptions of the smoe tools; every message names the file, field or expert at fault."""


class SmoeError(Exception):
    """A user-facing error: bad input, a broken vault, or a refused operation."""


class WriterStateError(SmoeError):
    """A VaultWriter method was called in a state that does not allow it."""
