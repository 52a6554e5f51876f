"""v1 -> v2 upgrade (ruling D7): in place when the gap has room, else rewrite to a new file.

In place, no blob moves and the time does not depend on the vault's size. The writes
are ordered so that an interruption at any instant leaves a valid v1 or v2 vault:

1. the 128-byte arch block into the zero gap (a v1 vault ignores that gap), fsync;
2. ``reserved_ext`` (a v1 vault with a non-zero reserved_ext is valid, with a warning);
3. ``version`` = 2 (from here on the vault is v2, its block already durable), fsync.

``force`` re-stamps the block of a v2 vault in its existing slot (one 128-byte write).
When the gap has no room, ``rewrite`` writes a new file whose blobs are shifted by whole
pages, leaving the original untouched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from smoe.atomic import AtomicFile
from smoe.errors import SmoeError
from smoe.plan import round_up
from smoe.reader import Vault
from smoe.records import ArchInfo, arch_record
from smoe_gen import layout

H = layout.HEADER_DTYPE.fields


class FileOps(Protocol):
    """The two primitive operations an in-place upgrade performs (replaced in fault tests)."""

    def pwrite(self, fd: int, data: bytes, offset: int) -> int: ...
    def fsync(self, fd: int) -> None: ...


class OsOps:
    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


@dataclass(frozen=True)
class UpgradeResult:
    path: Path
    mode: str  # "in-place", "re-stamp" or "rewrite"
    arch_offset: int
    data_offset: int


def arch_slot(vault: Vault) -> int:
    """Where a v2 writer puts the block: the 64-aligned end of the descriptors (D4)."""
    return round_up(vault.geometry.descriptors_end, layout.ARCH_ALIGN)


def has_room(vault: Vault) -> bool:
    return arch_slot(vault) + layout.ARCH_BLOCK_SIZE <= vault.geometry.data_offset


def _check_gap(vault: Vault) -> None:
    g = vault.geometry
    gap = vault.data[g.descriptors_end : g.data_offset]
    nz = np.flatnonzero(gap)
    if len(nz):
        at = g.descriptors_end + int(nz[0])
        raise SmoeError(f"{vault.path}: the gap between the descriptors and data_offset is not "
                        f"zero (byte {at:#x} = {int(gap[nz[0]]):#04x}); refusing to write into it")


def _check_moe_ffn(vault: Vault, arch: ArchInfo) -> None:
    if len(vault) and int(vault.descriptors[0, 0]["rows"]) != arch.moe_ffn_dim:
        raise SmoeError(f"{vault.path}: arch.moe_ffn_dim {arch.moe_ffn_dim} disagrees with the "
                        f"vault's expert shapes ({int(vault.descriptors[0, 0]['rows'])} rows)")


def upgrade(path: str | os.PathLike, arch: ArchInfo, *, force: bool = False,
            out: str | os.PathLike | None = None, ops: FileOps | None = None) -> UpgradeResult:
    """Upgrade ``path`` to v2 with ``arch`` (see the module docstring)."""
    path = Path(path)
    arch.check()
    vault = Vault.open(path)
    _check_moe_ffn(vault, arch)
    version = vault.geometry.version
    if out is not None:
        return rewrite(vault, arch, Path(out))
    if version >= layout.VERSION_WITH_ARCH and not force:
        raise SmoeError(f"{path}: already version {version}; --force re-stamps its arch block")
    block = arch_record(arch).tobytes()
    ops = ops or OsOps()
    if version >= layout.VERSION_WITH_ARCH:
        slot = vault.geometry.reserved_ext
        mode = "re-stamp"
    else:
        if not has_room(vault):
            g = vault.geometry
            raise SmoeError(
                f"{path}: no room for the arch block: the descriptors end at {g.descriptors_end}, "
                f"so the {layout.ARCH_BLOCK_SIZE}-byte block would need [{arch_slot(vault)}, "
                f"{arch_slot(vault) + layout.ARCH_BLOCK_SIZE}) before data_offset "
                f"{g.data_offset}; use --out NEW to rewrite into a new file (blobs shift by "
                "whole pages, the original is untouched)")
        _check_gap(vault)
        slot = arch_slot(vault)
        mode = "in-place"
    del vault  # drop the read-only map before writing
    fd = os.open(path, os.O_RDWR)
    try:
        ops.pwrite(fd, block, slot)
        ops.fsync(fd)
        if mode == "in-place":
            ops.pwrite(fd, np.uint32(slot).astype("<u4").tobytes(), H["reserved_ext"][1])
            ops.pwrite(fd, np.uint32(layout.VERSION_WITH_ARCH).astype("<u4").tobytes(),
                       H["version"][1])
            ops.fsync(fd)
    finally:
        os.close(fd)
    data_offset = int(np.fromfile(path, "<u8", 1, offset=H["data_offset"][1])[0])
    return UpgradeResult(path, mode, slot, data_offset)


def rewrite(vault: Vault, arch: ArchInfo, out: Path, chunk: int = 8 << 20) -> UpgradeResult:
    """A v2 copy in a new file, blobs shifted by whole pages; the original is untouched."""
    if out.resolve() == vault.path.resolve():
        raise SmoeError(f"{out}: --out must name a new file, not the vault itself")
    g = vault.geometry
    slot = arch_slot(vault)
    new_data = round_up(slot + layout.ARCH_BLOCK_SIZE, layout.PAGE_SIZE)
    shift = new_data - g.data_offset
    shift = max(shift, 0)
    header = vault.header.copy()
    header["version"] = layout.VERSION_WITH_ARCH
    header["reserved_ext"] = slot
    header["data_offset"] = g.data_offset + shift
    table = vault.table.copy()
    table["byte_offset"] += np.uint64(shift)
    end = max([g.data_offset] + [int(o) + int(p) for o, p in
                                 zip(vault.table["byte_offset"], vault.table["padded_size"])])
    with AtomicFile(out) as dst:
        fd = dst.fd
        assert fd is not None
        os.ftruncate(fd, end + shift)
        meta = bytearray(g.data_offset + shift)
        meta[: layout.HEADER_SIZE] = header.tobytes()
        meta[layout.TABLE_OFFSET : g.descriptors_offset] = table.tobytes()
        meta[g.descriptors_offset : g.descriptors_end] = vault.descriptors.tobytes()
        meta[slot : slot + layout.ARCH_BLOCK_SIZE] = arch_record(arch).tobytes()
        os.pwrite(fd, meta, 0)
        for pos in range(g.data_offset, end, chunk):
            piece = vault.data[pos : min(pos + chunk, end)]
            if piece.any():  # keep holes as holes
                os.pwrite(fd, piece.tobytes(), pos + shift)
        dst.commit()
    return UpgradeResult(out, "rewrite", slot, g.data_offset + shift)
