"""The output folder of an HF export: the shards, the index, the small files; OUT_DIR
checked before anything is written.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smoe.errors import OutputExists, WriteFailed
from smoe.export.hf import folder, source_guard
from smoe.export.hf import transformers_config as hf_config
from smoe.export.hf.decode import Decoder, write_expert
from smoe.export.hf.plan import INDEX_NAME, ExportPlan, shard_names
from smoe.interop.safetensors_io import (
    copy_range,
)
from smoe.interop.safetensors_io import write_file as write_safetensors
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile

__all__ = ["refuse_outputs"]


def _stat_unless_missing(path: str | Path) -> os.stat_result | None:
    """``os.stat(path)``, or None when nothing is there (a missing input is refused where it
    is opened, not here)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def refuse_outputs(
    out_dir: Path,
    inputs: list[Path],
    replace: bool = False,
    doc: dict[str, Any] | None = None,
    hashes: bool = True,
) -> folder.Earlier | None:
    """OUT_DIR may be new or an empty folder (or, ``replace``, a folder of an earlier
    export its marker vouches for: :func:`smoe.export.hf.folder.check_earlier`, by size
    only unless ``hashes``); never an input, nor a folder holding one, nor the checkpoint
    the vault was sculpted from (by its manifest ``doc``), which is refused first. The
    earlier export to replace, or None.

    >>> import tempfile
    >>> refuse_outputs(Path(tempfile.mkdtemp()) / "new", [Path("fixtures/q4_v2.smoe")])
    >>> refuse_outputs(Path("fixtures"), [Path("fixtures/q4_v2.smoe")])
    Traceback (most recent call last):
    smoe.errors.WriteFailed: fixtures: the output folder holds the input ...
    """
    if os.path.islink(out_dir):
        raise WriteFailed(
            f"{out_dir}: is a symlink; name the folder to write itself (the "
            "folder is renamed into place, never written through a link)"
        )
    try:
        st = os.stat(out_dir)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise WriteFailed(f"{out_dir}: cannot use as the output folder: {e.strerror}") from None
    real = os.path.realpath(out_dir)
    for src in inputs:
        with fileio.reading():  # an input that cannot be stat'ed: exit 2, as at its open
            src_st = _stat_unless_missing(src)
        if src_st is None:
            continue
        if st is not None and fileio.same_file(st, src_st):
            raise WriteFailed(
                f"{out_dir}: the output is the input {src} itself; refusing to overwrite an input"
            )
        if os.path.realpath(src).startswith(real.rstrip(os.sep) + os.sep):
            raise WriteFailed(
                f"{out_dir}: the output folder holds the input {src}; refusing to replace an input"
            )
    if st is None:
        return None
    fileio.existing_output(out_dir, folder=True)  # a file, a FIFO, a device: refused
    if not os.listdir(out_dir):
        return None
    source = source_guard.source_checkpoint(out_dir, doc)
    if source is not None:
        raise WriteFailed(
            f"{out_dir}: is the checkpoint the vault was sculpted from ({source}); "
            "refusing to replace a source, with or without --force"
        )
    if not replace:
        raise OutputExists(
            f"{out_dir}: exists and is not empty; --force replaces it (a folder an earlier "
            "export wrote), or name a new folder (the folder is written whole, never merged)"
        )
    return folder.check_earlier(out_dir, hashes)


def write_folder(
    tmp: Path,
    plan: ExportPlan,
    decoder: Decoder,
    config_bytes: bytes,
    hashes: folder.Hashes | None = None,
) -> list[str]:
    """Write the shards, the index (when there are several) and config.json into ``tmp``;
    the names of the files, in that order (``hashes``: told of each shard's bytes as they
    are written)."""
    names = shard_names(len(plan.shards))
    _write_shards(tmp, names, plan, decoder, hashes)
    files = list(names)
    if len(names) > 1:
        _write_small(tmp / INDEX_NAME, hf_config.json_bytes(_index(names, plan)))
        files.append(INDEX_NAME)
    _write_small(tmp / "config.json", config_bytes)
    return [*files, "config.json"]


def _write_shards(
    tmp: Path,
    names: list[str],
    plan: ExportPlan,
    decoder: Decoder,
    hashes: folder.Hashes | None = None,
) -> None:
    """Each shard file ``names[i]`` with the tensors of ``plan.shards[i]``: scout tensors
    copied from their files (each opened once), experts from the ``decoder``; ``hashes``
    is told of each tensor's bytes once written, and of each shard once complete."""
    fds: dict[Path, int] = {}
    try:
        for file_name, tensors in zip(names, plan.shards):
            path = tmp / file_name
            items = [(n, plan.dtype(n), plan.shape(n)) for n in tensors]

            def fill(
                fd: int, i: int, offset: int, path: Path = path, tensors: list[str] = tensors
            ) -> None:
                name = tensors[i]
                info = plan.scout.get(name)
                if info is None:
                    write_expert(fd, path, plan.experts[name], plan.dtypes[name], offset, decoder)
                    return
                src = fds.get(info.path)
                if src is None:
                    src = fds[info.path] = fileio.open_input(info.path)
                copy_range(
                    src, info.offset, fd, offset, info.nbytes, src_path=info.path, dst_path=path
                )

            def filled(
                fd: int,
                i: int,
                offset: int,
                fill: Callable[[int, int, int], None] = fill,
                name: str = file_name,
                tensors: list[str] = tensors,
            ) -> None:
                fill(fd, i, offset)
                if hashes is not None:  # its bytes hashed while the next tensor is written
                    hashes.written(name, fd, offset, offset + plan.nbytes(tensors[i]))

            write_safetensors(path, items, filled, metadata={"format": "pt"})
            if hashes is not None:
                hashes.complete(file_name)
    finally:
        for fd in fds.values():
            os.close(fd)


def _index(names: list[str], plan: ExportPlan) -> dict[str, Any]:
    """``model.safetensors.index.json`` as ``save_pretrained`` writes it: the totals and
    which shard holds each tensor."""
    weight_map = {n: f for f, tensors in zip(names, plan.shards) for n in tensors}
    total = sum(plan.nbytes(n) for n in weight_map)
    params = sum(math.prod(plan.shape(n)) for n in weight_map)
    return {
        "metadata": {"total_parameters": params, "total_size": total},
        "weight_map": dict(sorted(weight_map.items())),
    }


def _write_small(path: Path, data: bytes) -> None:
    f = AtomicFile(path)
    try:
        f.pwrite(data, 0)
        f.commit()
    except BaseException:
        f.abort()
        raise
