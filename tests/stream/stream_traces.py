"""What the cache and replay tests share: small vaults written here, routing traces
(``smoe-trace/1``, docs/FORMAT.md) written in Python, and reference models of the cache (LRU
and Belady's optimum) that the C++ counters must equal exactly.

>>> steps = [(0, [0, 1]), (1, [0, 1]), (0, [0, 2]), (1, [1, 2])]
>>> lru(steps, 4), belady(steps, 4)
((2, 6), (2, 6))
>>> lru(steps, 2), belady(steps, 2)
((0, 8), (0, 8))
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from pathlib import Path

import crc32c
import numpy as np

from smoe.format.records import ArchInfo, ModelInfo
from smoe.vault.writer import write_vault

Step = tuple[int, list[int]]  # (layer, experts)


def make_vault(
    path: Path, layers: int = 3, experts: int = 6, top_k: int = 2, ffn: int = 32, seed: int = 0
) -> Path:
    """A v2 vault of ``layers`` x ``experts`` random experts (d_model 64), each blob one
    16 KiB page unless ``ffn`` is large."""
    rng = np.random.default_rng(seed)
    d = 64
    shapes = ((ffn, d), (ffn, d), (d, ffn))
    mats = {
        (lay, e): [rng.standard_normal(s).astype(np.float32) * 0.02 for s in shapes]
        for lay in range(layers)
        for e in range(experts)
    }
    arch = ArchInfo(
        1e4, 4, 4, 16, top_k, ffn, layers, 1e-6, "olmoe"
    )  # the block's constants: only moe_top_k matters to the cache
    write_vault(path, ModelInfo(layers, experts, d, 320, ffn), mats, arch=arch, manifest=False)
    return path


def vault_id(path: Path) -> str:
    """The trace's vault id: the CRC-32C of the header and the expert table, 8 hex digits."""
    with path.open("rb") as f:
        head = f.read(64)
        total, table = struct.unpack_from("<IQ", head, 20)
        f.seek(table)
        return f"{crc32c.crc32c(head + f.read(48 * total)):08x}"


def header(path: Path) -> dict:
    """The first line of a trace of the vault at ``path``."""
    with path.open("rb") as f:
        head = f.read(64)
        layers, width = struct.unpack_from("<II", head, 12)
        f.seek(struct.unpack_from("<I", head, 60)[0] + 32)
        top_k = struct.unpack("<I", f.read(4))[0]
    vault = {
        "size": path.stat().st_size,
        "num_moe_layers": layers,
        "num_experts": width,
        "top_k": top_k,
        "id": vault_id(path),
    }
    return {"schema": "smoe-trace/1", "vault": vault}


def write_trace(out: Path, vault: Path, steps: Sequence[Step], first: dict | None = None) -> Path:
    """A trace of ``steps``, token by token (a token every time layer 0 comes round)."""
    lines = [json.dumps(first if first is not None else header(vault))]
    token = -1
    for layer, experts in steps:
        token += layer == 0
        lines.append(json.dumps({"token": max(token, 0), "layer": layer, "experts": experts}))
    out.write_text("\n".join(lines) + "\n")
    return out


def random_steps(
    rng: np.random.Generator, tokens: int, layers: int, experts: int, k: int
) -> list[Step]:
    """Tokens walking the layers, each layer picking ``k`` of ``experts`` (skewed, so that
    some blobs come back often)."""
    p = np.arange(experts, 0, -1, dtype=float) ** 2
    p /= p.sum()
    return [
        (lay, [int(e) for e in rng.choice(experts, k, replace=False, p=p)])
        for _ in range(tokens)
        for lay in range(layers)
    ]


def batches(experts: list[int], slots: int) -> list[list[int]]:
    """A step's experts in batches of at most ``slots`` (as the decoder's prefill)."""
    return [experts[b : b + slots] for b in range(0, len(experts), slots)]


def lru(steps: Sequence[Step], slots: int) -> tuple[int, int]:
    """(hits, misses) of plain LRU: a batch's hits are pinned first, each miss evicts the
    unpinned blob asked for longest ago (every request a tick of its own, in order)."""
    last: dict[tuple[int, int], int] = {}
    resident: set[tuple[int, int]] = set()
    hits = misses = tick = 0
    for layer, experts in steps:
        for batch in batches(experts, slots):
            blobs = [(layer, e) for e in batch]
            for b in blobs:
                tick += 1
                last[b] = tick
            for b in blobs:
                if b in resident:
                    hits += 1
                    continue
                misses += 1
                if len(resident) >= slots:
                    resident.remove(min(resident - set(blobs), key=last.__getitem__))
                resident.add(b)
    return hits, misses


def belady(steps: Sequence[Step], slots: int) -> tuple[int, int]:
    """(hits, misses) of Belady's optimum: each miss evicts the blob outside its batch that
    is asked for again furthest ahead (never again: first)."""
    seq = [[(layer, e) for e in batch] for layer, es in steps for batch in batches(es, slots)]

    def next_use(blob: tuple[int, int], after: int) -> float:
        for j in range(after + 1, len(seq)):
            if blob in seq[j]:
                return j
        return math.inf

    resident: set[tuple[int, int]] = set()
    hits = misses = 0
    for i, batch in enumerate(seq):
        for b in batch:
            if b in resident:
                hits += 1
                continue
            misses += 1
            if len(resident) >= slots:
                resident.remove(max(resident - set(batch), key=lambda x: (next_use(x, i), x)))
            resident.add(b)
    return hits, misses
