"""The files the sculptor commits beside a vault, where ``smoe export --hf`` looks for them.

A naming rule shared by the sculptor (which writes them) and export (which reads them), kept
in the vault layer so that neither imports the other.
"""

from __future__ import annotations

import os
from pathlib import Path

from smoe.plumbing.lock import lock_for

__all__ = ["companions", "lock_path"]


def companions(vault: Path) -> tuple[Path, Path]:
    """The scout and the config.json copy the sculptor commits beside ``vault`` (its stem:
    the name without ``.smoe``); ``smoe export --hf`` looks for them there.

    >>> [p.name for p in companions(Path("out/qwen3_moe.smoe"))]
    ['qwen3_moe.scout.safetensors', 'qwen3_moe.config.json']
    """
    stem = vault.name.removesuffix(".smoe") or vault.name
    return vault.with_name(f"{stem}.scout.safetensors"), vault.with_name(f"{stem}.config.json")


def lock_path(path: str | os.PathLike) -> Path:
    """The lock of a vault edited in place (``smoe upgrade``, ``smoe meta``): ``.<name>.lock``
    beside its real file (symlinks resolved), so two names of one vault share one lock.

    >>> lock_path("fixtures/q4_v2.smoe").name
    '.q4_v2.smoe.lock'
    """
    return lock_for(os.path.realpath(path))
