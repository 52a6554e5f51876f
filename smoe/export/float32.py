"""`smoe export`: dequantise experts to float32 safetensors, named as HF checkpoints name them.

The output is written atomically (nothing under its name until it is complete), every
write is checked (a full disk is one error line) and an output that is the vault itself
or its manifest (through symlinks or hard links) is refused before anything is written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from smoe import quant
from smoe.errors import RefusedInput, WriteFailed
from smoe.format import manifest
from smoe.interop.safetensors_io import marked, write_file
from smoe.plumbing import fileio
from smoe.plumbing.atomic import refuse_foreign
from smoe.vault.reader import Vault

__all__ = ["EXPORT_SIGNATURE", "export"]

# what an export file says of itself, so that a replacing export knows its own
EXPORT_SIGNATURE = marked("a float32 file smoe export wrote", "smoe", "export")


def _tensor_name(layer: int, expert: int, tensor: str) -> str:
    """The name HF checkpoints give an expert's weight matrix."""
    return f"model.layers.{layer}.mlp.experts.{expert}.{tensor}.weight"


def export(
    vault_path: str | os.PathLike,
    out: str | os.PathLike,
    layer: int | None = None,
    expert: int | None = None,
    replace: bool = True,
) -> list[str]:
    """Write the selected experts' float32 weights; returns the tensor names written.
    ``replace`` False (``smoe export`` without ``--force``): an existing ``out`` is refused
    (:class:`~smoe.errors.OutputExists`), before anything is read, and never replaced;
    True replaces only a file an export wrote (its ``smoe`` metadata), never another.

    One expert is dequantised at a time, straight into its place in the output file.

    >>> import os, tempfile
    >>> out = os.path.join(tempfile.mkdtemp(), "experts.safetensors")
    >>> names = export("fixtures/q4_v2.smoe", out, layer=1, expert=0)
    >>> names[0], len(names)
    ('model.layers.1.mlp.experts.0.gate_proj.weight', 3)
    >>> from safetensors.numpy import load_file
    >>> load_file(out)[names[0]].dtype, load_file(out)[names[0]].shape
    (dtype('float32'), (32, 64))
    """
    vault_path, out = Path(vault_path), Path(out)
    fileio.refuse_same_file(out, [vault_path, manifest.path_for(vault_path)])
    if out.is_dir():
        raise WriteFailed(f"{out}: is a folder; name the .safetensors file to write")
    if not replace:
        fileio.refuse_existing(out)
    else:
        refuse_foreign(out, EXPORT_SIGNATURE)
    vault = Vault.open(vault_path)
    keys = [
        k for k in vault if (layer is None or k[0] == layer) and (expert is None or k[1] == expert)
    ]
    if not keys:
        what = " ".join(
            f"{n} {v}" for n, v in (("layer", layer), ("expert", expert)) if v is not None
        )
        raise RefusedInput(f"{vault_path}: no expert matches {what}")
    items: list[tuple[str, str, tuple[int, ...]]] = []
    where: list[tuple[tuple[int, int], int]] = []
    for key in keys:  # checks each expert's descriptors; no view is kept (bounded memory)
        for t, view in enumerate(vault.expert(*key).tensors):
            items.append((_tensor_name(*key, view.name), "F32", (view.rows, view.cols)))
            where.append((key, t))
    current: dict[tuple[int, int], Any] = {}  # the expert being written (one at a time)
    f32 = np.empty(0, np.float32)  # one buffer for every tensor: no fresh pages each time

    def fill(fd: int, i: int, offset: int) -> None:
        nonlocal f32
        key, t = where[i]
        if key not in current:  # an expert's three names are adjacent in name order
            current.clear()
            current[key] = vault.expert(*key)
        view = current[key].tensors[t]
        if f32.size < view.rows * view.cols:
            f32 = np.empty(view.rows * view.cols, np.float32)
        data = f32[: view.rows * view.cols].reshape(view.shape)
        quant.decode(view.packed, view.scales, view.bits, view.shape, out=data)
        fileio.pwrite_all(fd, data.astype("<f4", copy=False), offset, out)

    metadata = {"format": "pt", "source": vault_path.name, "smoe": "export"}
    write_file(out, items, fill, metadata=metadata, replace=replace, ours=EXPORT_SIGNATURE)
    return [name for name, _, _ in items]
