"""`smoe export`: dequantise experts to float32 safetensors, named as HF checkpoints name them."""

from __future__ import annotations

import os
from pathlib import Path

from smoe.errors import SmoeError
from smoe.reader import Vault
from smoe.safetensors_io import write_file


def tensor_name(layer: int, expert: int, tensor: str) -> str:
    return f"model.layers.{layer}.mlp.experts.{expert}.{tensor}.weight"


def export(vault_path: str | os.PathLike, out: str | os.PathLike, layer: int | None = None,
           expert: int | None = None) -> list[str]:
    """Write the selected experts' float32 weights; returns the tensor names written.

    One expert is dequantised at a time, straight into its place in the output file.
    """
    vault = Vault.open(vault_path)
    keys = [k for k in vault
            if (layer is None or k[0] == layer) and (expert is None or k[1] == expert)]
    if not keys:
        what = " ".join(f"{n} {v}" for n, v in (("layer", layer), ("expert", expert))
                        if v is not None)
        raise SmoeError(f"{vault_path}: no expert matches {what}")
    items, where = [], []
    for key in keys:
        view = vault.expert(*key)
        for t in view.tensors:
            items.append((tensor_name(*key, t.name), "F32", (t.rows, t.cols)))
            where.append(t)

    def fill(fd: int, i: int, offset: int) -> None:
        data = where[i].dequantize().astype("<f4", copy=False).tobytes()
        os.pwrite(fd, data, offset)

    write_file(Path(out), items, fill, metadata={"format": "pt", "source": Path(vault_path).name})
    return [name for name, _, _ in items]


