"""What an HF export writes: every output tensor in its shard (:class:`ExportPlan`), and the
inputs besides the vault, checked against it (:class:`Sources`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smoe.export.hf.names import OutTensor
from smoe.interop.safetensors_io import (
    DTYPE_SIZES,
    TensorInfo,
)
from smoe.vault.names import natural_key

__all__ = ["INDEX_NAME", "shard_names"]


INDEX_NAME = "model.safetensors.index.json"


def _shard(items: list[tuple[str, int]], max_bytes: int) -> list[list[str]]:
    """Names in order, split greedily into shards of at most ``max_bytes`` of data (a tensor
    larger than that gets a shard of its own), as huggingface_hub splits a state dict."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, n in items:
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def shard_names(count: int) -> list[str]:
    """The shards' file names, as ``save_pretrained`` names them.

    >>> shard_names(1), shard_names(2)[1]
    (['model.safetensors'], 'model-00002-of-00002.safetensors')
    """
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


@dataclass
class ExportPlan:
    """Every output tensor (scout copies and experts), its dtype and shard."""

    scout: dict[str, TensorInfo]
    experts: dict[str, OutTensor]
    dtypes: dict[str, str]
    shards: list[list[str]]

    @classmethod
    def build(
        cls,
        scout: dict[str, TensorInfo],
        experts: dict[str, OutTensor],
        dtypes: dict[str, str],
        max_shard_size: int,
    ) -> ExportPlan:
        """Every tensor in natural name order, in shards of at most ``max_shard_size``
        bytes of data."""
        plan = cls(scout, experts, dtypes, [])
        order = sorted([*scout, *experts], key=natural_key)
        plan.shards = _shard([(n, plan.nbytes(n)) for n in order], max_shard_size)
        return plan

    def names(self) -> list[str]:
        """Every output tensor in file order, shard by shard."""
        return [n for shard in self.shards for n in shard]

    def shape(self, name: str) -> tuple[int, ...]:
        t = self.scout.get(name)
        return t.shape if t is not None else self.experts[name].shape

    def nbytes(self, name: str) -> int:
        return math.prod(self.shape(name)) * DTYPE_SIZES[self.dtype(name)]

    def dtype(self, name: str) -> str:
        t = self.scout.get(name)
        return t.dtype if t is not None else self.dtypes[name]


@dataclass
class Sources:
    """The inputs besides the vault, checked against it: its manifest (``doc``, None when
    there is none at ``manifest_path``) and its scout (the tensors' headers)."""

    vault_path: Path
    doc: dict[str, Any] | None
    manifest_path: Path
    scout_path: Path
    scout: dict[str, TensorInfo]

    @property
    def crcs(self) -> dict[tuple[int, int], int] | None:
        """Each expert's blob CRC-32C the manifest records (None without a manifest)."""
        if self.doc is None:
            return None
        return {(r["layer"], r["expert"]): r["crc32c"] for r in self.doc["experts"]}

    @property
    def fp8_sources(self) -> set[str]:
        """The source tensors the manifest records as FP8 (``experts[].tensors[].fp8``:
        dequantised to BF16 when sculpted); empty without a manifest or such records."""
        if self.doc is None:
            return set()
        return {
            t["source"]
            for r in self.doc["experts"]
            for t in r.get("tensors") or []
            if isinstance(t, dict) and t.get("fp8") and isinstance(t.get("source"), str)
        }
