"""What ``smoe sculpt``'s OUT names, and the runs that have nothing to write.

OUT is a folder (the vault is ``OUT/<stem>.smoe``, the stem the model's name or ``--name``)
or, ending in ``.smoe``, the vault itself (its companions beside it, the stem its name), as
``--outfile x.gguf`` names a file. A run that writes nothing is not refused for an output
that exists: a dry run prints its plan and says so, and ``--resume`` of a finished run says
the run is complete (exit 0 both).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from smoe.errors import UsageError
from smoe.format.records import VAULT_SIGNATURE
from smoe.plumbing.atomic import refuse_foreign
from smoe.sculpt.paths import Paths

__all__ = ["RESUMED_SCHEMA", "Target", "finished", "target"]

RESUMED_SCHEMA = "smoe-sculpt-complete/1"
"""The ``schema`` of ``smoe sculpt --resume --json`` for a run that had finished."""

_SUFFIX = ".smoe"


@dataclass(frozen=True)
class Target:
    """Where a sculpt writes: the folder and the stem (None: the model's name).

    >>> target("out/model-q4.smoe", None)
    Target(out_dir=PosixPath('out'), name='model-q4')
    >>> target("out", "q4"), target("old.smoe/", None)
    (Target(out_dir=PosixPath('out'), name='q4'), Target(out_dir=PosixPath('old.smoe'), name=None))
    """

    out_dir: Path
    name: str | None


def target(out: str | os.PathLike[str], name: str | None) -> Target:
    """OUT as a folder, or (ending in ``.smoe``) as the vault's own path; refused in one line
    where it could mean either: ``--name`` beside a vault path, or an existing folder whose
    name ends in ``.smoe`` (the folder it was before this rule, or a vault path?).

    >>> target("out/x.smoe", "y")
    Traceback (most recent call last):
    smoe.errors.UsageError: out/x.smoe: OUT ending in .smoe names the vault itself, and \
--name names it too; give a folder with --name, or the vault's path alone
    """
    path = Path(out)
    folder = os.fspath(out).endswith(os.sep)  # "x.smoe/": the folder, as the user wrote it
    if folder or not path.name.endswith(_SUFFIX) or path.name == _SUFFIX:
        return Target(path, name)
    if name is not None:
        raise UsageError(
            f"{out}: OUT ending in .smoe names the vault itself, and --name names it too; "
            "give a folder with --name, or the vault's path alone"
        )
    if os.path.isdir(path):
        raise UsageError(
            f"{out}: is a folder, and OUT ending in .smoe names the vault itself; name the "
            f"vault inside it ({os.path.join(out, 'NAME.smoe')}) or the folder with a "
            "trailing /"
        )
    return Target(path.parent, path.name[: -len(_SUFFIX)])


def finished(paths: Paths) -> bool:
    """Whether ``--resume`` finds a finished run: the vault is there (a vault: anything
    else is refused as an output smoe did not write) and no partial file waits for it.

    >>> finished(Paths.of(Path("fixtures/checkpoints/qwen3_moe"), Path("fixtures"), "q4_v2"))
    True
    """
    if not os.path.lexists(paths.vault) or os.path.lexists(paths.partial):
        return False
    refuse_foreign(paths.vault, VAULT_SIGNATURE)
    return True
