"""Every file one sculpt touches in OUT_DIR, and the refusal of an output that is an input."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from smoe.errors import UsageError
from smoe.format.manifest import path_for
from smoe.format.records import VAULT_SIGNATURE
from smoe.plumbing import fileio
from smoe.plumbing.atomic import refuse_foreign
from smoe.plumbing.lock import lock_for
from smoe.sculpt.source.checkpoint import Checkpoint
from smoe.sculpt.source.hub import output_stem
from smoe.vault.companions import companions

__all__ = ["Paths", "checkpoint_inputs", "outputs"]


@dataclass(frozen=True)
class Paths:
    """Every file one sculpt touches in OUT_DIR.

    >>> p = Paths.of(Path("models/qwen3_moe"), Path("out"))
    >>> [str(x) for x in (p.vault, p.partial, p.journal)]
    ['out/qwen3_moe.smoe', 'out/.qwen3_moe.smoe.partial', 'out/.qwen3_moe.smoe.journal']
    """

    vault: Path
    scout: Path
    manifest: Path
    config: Path
    partial: Path
    journal: Path
    lock: Path

    @classmethod
    def of(cls, model_dir: Path, out_dir: Path, name: str | None = None) -> Paths:
        """The paths for ``model_dir`` converted into ``out_dir`` (``name``: the stem).

        >>> str(Paths.of(Path("models/qwen3_moe"), Path("out"), "q4").manifest)
        'out/q4.smoe.manifest.json'
        """
        vault, scout = outputs(model_dir, out_dir, name)
        hidden = out_dir / f".{vault.name}"
        return cls(
            vault,
            scout,
            path_for(vault),
            companions(vault)[1],
            Path(f"{hidden}.partial"),
            Path(f"{hidden}.journal"),
            lock_for(vault),
        )

    TMP_EXTRA = len("..0123abcd.tmp")
    """What an atomic write adds to a name for its temporary file (``.<name>.<8 hex>.tmp``)."""

    def check_slots(self, replace: bool = True) -> None:
        """Refuse, before the first expert is quantised, what would otherwise fail only at
        the commit: a name too long for the folder's file system (the longest name a run
        makes is an output's temporary file), an existing output that is not a regular
        file (a folder at ``<stem>.scout.safetensors``, a FIFO), and (``replace`` False) an
        existing vault: nothing is written then. (The companions of a missing vault are
        left over from an earlier run: they are replaced.)

        >>> Paths.of(Path("m"), Path("out"), "x" * 250).check_slots()  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        smoe.errors.UsageError: out/xxx...xxx.smoe: its name is 269 bytes with the temporary ...
        """
        limit = _name_max(self.vault.parent)
        for path in (self.vault, self.scout, self.manifest, self.config):
            need = len(os.fsencode(path.name)) + self.TMP_EXTRA
            if need > limit:
                raise UsageError(
                    f"{path}: its name is {need} bytes with the temporary suffix a write adds "
                    f"('.<name>.<8 hex>.tmp'), more than the {limit} bytes this file system "
                    "allows in a name; choose a shorter --name"
                )
        for path in (self.vault, self.scout, self.manifest, self.config):
            fileio.existing_output(path)
        if not replace:
            fileio.refuse_existing(self.vault)
        else:  # --force replaces a vault, never a file smoe did not write
            refuse_foreign(self.vault, VAULT_SIGNATURE)

    def refuse_inputs(self, inputs: list[Path]) -> None:
        """Refuse any output (or partial, journal or lock) that is one of ``inputs``: a run
        must never write over what it reads.

        >>> from smoe.errors import SmoeError
        >>> p = Paths.of(Path("fixtures/checkpoints/qwen3_moe"), Path("fixtures"), "q4_v2")
        >>> try:
        ...     p.refuse_inputs([Path("fixtures/q4_v2.smoe")])
        ... except SmoeError as e:
        ...     print(e)
        fixtures/q4_v2.smoe: the vault is the input fixtures/q4_v2.smoe itself; refusing to ...
        """
        for out, what in (
            (self.vault, "vault"),
            (self.scout, "scout"),
            (self.manifest, "manifest"),
            (self.config, "config copy"),
            (self.partial, "partial file"),
            (self.journal, "journal"),
            (self.lock, "lock file"),
        ):
            fileio.refuse_same_file(out, inputs, what)


def outputs(model_dir: Path, out_dir: Path, name: str | None = None) -> tuple[Path, Path]:
    """The vault and the scout: ``<stem>.smoe`` and ``<stem>.scout.safetensors``, the stem
    being ``name`` (a plain file name stem, else refused) or the model's name (the folder's,
    or ``NAME`` for a HuggingFace cache snapshot ``models--ORG--NAME/snapshots/<hash>``).

    >>> [p.name for p in outputs(Path("fixtures/checkpoints/qwen3_moe"), Path("out"))]
    ['qwen3_moe.smoe', 'qwen3_moe.scout.safetensors']
    """
    vault = out_dir / f"{output_stem(model_dir, name)}.smoe"
    return vault, companions(vault)[0]


def checkpoint_inputs(ckpt: Checkpoint) -> list[Path]:
    """Every file the checkpoint is read from: config, index (if any) and shards.

    >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe_sharded")
    >>> [p.name for p in checkpoint_inputs(ck)][:2]
    ['config.json', 'model.safetensors.index.json']
    """
    files = [ckpt.root / "config.json"]
    index = ckpt.root / "model.safetensors.index.json"
    if index.is_file():
        files.append(index)
    return files + sorted({t.path for t in ckpt.tensors.values()})


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the file system of ``folder`` (or the nearest existing
    folder above it) allows; 255 where it cannot say."""
    for place in (folder, *folder.parents):
        try:
            return int(os.pathconf(place, "PC_NAME_MAX"))
        except (OSError, ValueError):
            continue
    return 255
