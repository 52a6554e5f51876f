"""Plumbing: checked file I/O, atomic writes, usable cores.

The bottom layer: it knows files and processes, nothing of the format. Everything above
writes through :mod:`smoe.plumbing.atomic` and reads through :mod:`smoe.plumbing.fileio`.
"""

__all__ = [
    "atomic",
    "cpus",
    "fileio",
    "input_errors",
    "lock",
    "text",
]  # submodules, imported on use
