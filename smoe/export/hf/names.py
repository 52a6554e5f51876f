"""Which checkpoint tensor each vault tensor becomes: names and layout.

The rules live in :mod:`smoe.vault.names`, below the export layer, so that the reader
(:meth:`smoe.vault.reader.Vault.tensor_names`) names tensors exactly as ``export --hf``
writes them; this module re-exports them where export has always found them.
"""

from __future__ import annotations

from smoe.vault.names import (
    OutTensor,
    Piece,
    assemble,
    expert_layout,
    family_layout,
    load_manifest,
    manifest_layout,
    natural_key,
)

__all__ = [
    "OutTensor",
    "Piece",
    "assemble",
    "expert_layout",
    "family_layout",
    "load_manifest",
    "manifest_layout",
    "natural_key",
]
