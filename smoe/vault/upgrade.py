"""v1 -> v2 upgrade (ruling D7): in place when the gap has room, else rewrite to a new file.

In place, no blob moves and the time does not depend on the vault's size. The writes
are ordered so that an interruption at any instant leaves a valid v1 or v2 vault:

1. the 128-byte arch block into the zero gap (a v1 vault ignores that gap), fsync;
2. ``reserved_ext`` (a v1 vault with a non-zero reserved_ext is valid, with a warning);
3. ``version`` = 2 (from here on the vault is v2, its block already durable), fsync.

``force`` re-stamps the block of a v2 vault in its existing slot (one 128-byte write).
Every write is checked and continued when short. When a write or fsync fails with an
error (not a kill), the bytes written are restored in the reverse order, each restore
made durable before the next, so the vault stays valid throughout and ends unchanged.

One writer per target: an in-place upgrade holds ``.<name>.lock`` beside the vault's real
file, ``--out NEW`` holds ``.<NEW name>.lock`` beside NEW. A vault named through a symlink
is edited in place at the link's target (that is what naming it asks for); anything but a
regular file is refused.

When the gap has no room, ``--out NEW`` writes a new file whose blobs are shifted by
whole pages, leaving the original untouched, together with ``NEW.manifest.json``: each
blob's CRC-32C is computed from the bytes copied, and the old vault's manifest (if any)
must agree with them; its provenance and its metadata (``smoe meta``) are kept.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from smoe.errors import FormatError, RefusedInput, SmoeError, WriteFailed
from smoe.families.config import read_json
from smoe.format import manifest
from smoe.format.records import VAULT_SIGNATURE, ArchInfo, arch_record
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile, refuse_foreign
from smoe.plumbing.lock import Lock, lock_for
from smoe.vault.companions import lock_path
from smoe.vault.contradictions import refuse_contradictions, stated
from smoe.vault.meta import check_metadata
from smoe.vault.reader import Vault
from smoe_gen import layout

__all__ = [
    "FileOps",
    "OsOps",
    "UpgradeResult",
    "has_room",
    "upgrade",
]

_CHUNK = 8 << 20


class FileOps(Protocol):
    """The two primitive operations an in-place upgrade performs (replaced in fault tests).

    A failed write is rolled back, the vault left as it was:

    >>> import errno, os, shutil, tempfile
    >>> from smoe.format.records import ArchInfo
    >>> class FullDisk(OsOps):
    ...     def pwrite(self, fd, data, offset):
    ...         raise OSError(errno.ENOSPC, "No space left on device")
    >>> vault = shutil.copy("fixtures/q4_v1.smoe", tempfile.mkdtemp())
    >>> arch = ArchInfo(1e6, 4, 2, 16, 2, moe_ffn_dim=32, num_hidden_layers=2,
    ...                 rms_norm_eps=1e-6, model_type="qwen3_moe")
    >>> try:
    ...     upgrade(vault, arch, ops=FullDisk())
    ... except SmoeError as e:
    ...     print(str(e).removeprefix(vault))
    : cannot write 128 bytes at offset 1536: No space left on device; rolled back, the vault \
is unchanged
    """

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        """Write ``data`` at ``offset`` of ``fd``; the bytes written (a short count is
        continued).

        >>> import os, tempfile
        >>> ops: FileOps = OsOps()
        >>> fd = os.open(os.path.join(tempfile.mkdtemp(), "f"), os.O_RDWR | os.O_CREAT)
        >>> ops.pwrite(fd, b"SARC", 64), os.fstat(fd).st_size
        (4, 68)
        >>> os.close(fd)
        """
        ...

    def fsync(self, fd: int) -> None:
        """Make the writes to ``fd`` durable.

        >>> import os, tempfile
        >>> ops: FileOps = OsOps()
        >>> fd = os.open(os.path.join(tempfile.mkdtemp(), "f"), os.O_RDWR | os.O_CREAT)
        >>> ops.fsync(fd)
        >>> os.close(fd)
        """
        ...


class OsOps:
    """The :class:`FileOps` of the operating system: ``os.pwrite`` and ``os.fsync``.

    >>> import shutil, tempfile
    >>> from smoe.format.records import ArchInfo
    >>> vault = shutil.copy("fixtures/q4_v1.smoe", tempfile.mkdtemp())
    >>> arch = ArchInfo(1e6, 4, 2, 16, 2, 32, 2, 1e-6, "qwen3_moe")
    >>> upgrade(vault, arch, ops=OsOps()).mode  # the default ops
    'in-place'
    """

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        """``os.pwrite``.

        >>> import os, tempfile
        >>> fd = os.open(os.path.join(tempfile.mkdtemp(), "f"), os.O_RDWR | os.O_CREAT)
        >>> OsOps().pwrite(fd, b"SARC", 0)
        4
        >>> os.close(fd)
        """
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        """``os.fsync``.

        >>> import os, tempfile
        >>> fd = os.open(os.path.join(tempfile.mkdtemp(), "f"), os.O_RDWR | os.O_CREAT)
        >>> OsOps().fsync(fd)
        >>> os.close(fd)
        """
        os.fsync(fd)


@dataclass(frozen=True)
class UpgradeResult:
    """What :func:`upgrade` did: the v2 vault's path, how (``"in-place"``, ``"re-stamp"``,
    ``"rewrite"``, or ``"current"``: a v2 vault that holds this very arch block already,
    nothing written), where its arch block lies and its ``data_offset``.

    >>> import shutil, tempfile
    >>> from smoe.format.records import ArchInfo
    >>> vault = shutil.copy("fixtures/q4_v1.smoe", tempfile.mkdtemp())
    >>> arch = ArchInfo(1e6, 4, 2, 16, 2, moe_ffn_dim=32, num_hidden_layers=2,
    ...                 rms_norm_eps=1e-6, model_type="qwen3_moe")
    >>> result = upgrade(vault, arch)
    >>> result.mode, result.arch_offset, result.data_offset
    ('in-place', 1536, 16384)
    """

    path: Path
    mode: str  # "in-place", "re-stamp", "rewrite" or "current" (nothing to do)
    arch_offset: int
    data_offset: int


def _arch_slot(vault: Vault) -> int:
    """Where a v2 writer puts the block: the 64-aligned end of the descriptors (D6)."""
    return layout.writer_reserved_ext(vault.geometry.total)


def has_room(vault: Vault) -> bool:
    """Whether a v1 vault's gap before ``data_offset`` holds the arch block (an in-place
    upgrade), or the blobs must move (``upgrade(..., out=NEW)``).

    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v1.smoe") as a, Vault.open("fixtures/noroom_v1.smoe") as b:
    ...     has_room(a), has_room(b)
    (True, False)
    """
    return _arch_slot(vault) + layout.ARCH_BLOCK_SIZE <= vault.geometry.data_offset


def _check_gap(vault: Vault) -> None:
    g = vault.geometry
    gap = vault.data[g.descriptors_end : g.data_offset]
    nz = np.flatnonzero(gap)
    if len(nz):
        at = g.descriptors_end + int(nz[0])
        raise RefusedInput(
            f"{vault.path}: the gap between the descriptors and data_offset is not "
            f"zero (byte {at:#x} = {int(gap[nz[0]]):#04x}); refusing to write into it"
        )


def _check_moe_ffn(vault: Vault, arch: ArchInfo) -> None:
    if len(vault) and int(vault.descriptors[0, 0]["rows"]) != arch.moe_ffn_dim:
        raise RefusedInput(
            f"{vault.path}: arch.moe_ffn_dim {arch.moe_ffn_dim} disagrees with the "
            f"vault's expert shapes ({int(vault.descriptors[0, 0]['rows'])} rows)"
        )


def _configs(inputs: Iterable[str | os.PathLike]) -> list[tuple[Path, object]]:
    """The config.json files among ``inputs`` (a file, not a model folder), parsed."""
    return [(Path(p), read_json(Path(p))) for p in inputs if not Path(p).is_dir()]


def _check_against(vault: Vault, arch: ArchInfo, configs: Sequence[tuple[Path, object]]) -> None:
    """Refuse what the vault's header, table and descriptors contradict: each config the
    arch came from (:func:`refuse_contradictions`, not against an arch block being
    replaced), then the arch itself: top-k above the experts per layer, fewer layers than
    the table's highest MoE layer (plus the config's multi-token-prediction layers), fewer
    than the header's ``num_moe_layers`` (rule ``arch.num_hidden_layers``: the block has no
    field for multi-token-prediction layers)."""
    mtp = 0
    for path, doc in configs:
        refuse_contradictions(doc, path, vault, arch=False)
        mtp = max(mtp, stated(doc, path).get("mtp_layers", ("", 0))[1])
    experts = int(vault.header["max_experts_per_layer"])
    if arch.moe_top_k > experts:
        raise RefusedInput(
            f"{vault.path}: arch.moe_top_k {arch.moe_top_k} is more than the vault's "
            f"{experts} experts per layer"
        )
    held = vault.layers()
    if held and max(held) >= arch.num_hidden_layers + mtp:
        raise RefusedInput(
            f"{vault.path}: arch.num_hidden_layers {arch.num_hidden_layers} disagrees with "
            f"the vault's table, which holds experts of layer {max(held)}"
        )
    moe_layers = int(vault.header["num_moe_layers"])
    if moe_layers > arch.num_hidden_layers:
        raise RefusedInput(
            f"{vault.path}: arch.num_hidden_layers {arch.num_hidden_layers} is less than the "
            f"vault's num_moe_layers {moe_layers} (the arch block has no field for "
            "multi-token-prediction layers)"
        )


def upgrade(
    path: str | os.PathLike,
    arch: ArchInfo,
    *,
    force: bool = False,
    out: str | os.PathLike | None = None,
    ops: FileOps | None = None,
    inputs: Iterable[str | os.PathLike] = (),
    replace: bool = True,
) -> UpgradeResult:
    """Upgrade ``path`` to v2 with ``arch`` (see the module docstring).

    ``replace`` False (``smoe upgrade --out`` without ``--force``): an existing ``out`` is
    refused (:class:`~smoe.errors.OutputExists`) and never replaced.

    ``inputs`` are the files the arch came from (config.json, a model folder): a
    config.json among them is checked against the vault's header, table and descriptors
    (:func:`refuse_contradictions`); with ``out`` they, like the vault and its manifest,
    are refused as the output. The arch itself is refused where the vault contradicts it:
    ``moe_ffn_dim`` other than the experts' gate rows, ``moe_top_k`` above the experts per
    layer, ``num_hidden_layers`` (plus the config's ``num_nextn_predict_layers``) not above
    the table's highest MoE layer. Nothing is written before these checks.

    >>> import os, shutil, tempfile
    >>> from dataclasses import replace
    >>> from smoe.format.records import ArchInfo
    >>> from smoe.format.verify import verify_path
    >>> arch = ArchInfo(1e6, 4, 2, 16, 2, moe_ffn_dim=8, num_hidden_layers=3,
    ...                 rms_norm_eps=1e-6, model_type="qwen3_moe")
    >>> folder = tempfile.mkdtemp()
    >>> vault = shutil.copy("fixtures/noroom_v1.smoe", folder)
    >>> upgrade(vault, replace(arch, num_hidden_layers=2))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    smoe.errors.RefusedInput: ...noroom_v1.smoe: arch.num_hidden_layers 2 disagrees with the \
vault's table, which holds experts of layer 2
    >>> upgrade(vault, arch)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    smoe.errors.RefusedInput: ...noroom_v1.smoe: no room for the arch block: ...
    >>> result = upgrade(vault, arch, out=os.path.join(folder, "v2.smoe"))
    >>> result.mode, result.data_offset, verify_path(result.path, deep=True).ok
    ('rewrite', 32768, True)
    >>> sorted(os.listdir(folder))
    ['noroom_v1.smoe', 'v2.smoe', 'v2.smoe.manifest.json']
    """
    path = Path(path)
    arch.check()
    inputs = list(inputs)
    configs = _configs(inputs)
    if out is not None:
        return _rewrite(path, arch, Path(out), inputs=inputs, configs=configs, replace=replace)
    fileio.require_regular(path)
    fd = _open_for_writing(path)  # first: a read-only vault is named as such
    try:
        with Lock(lock_path(path), path):
            return _in_place(path, fd, arch, force, ops or OsOps(), configs)
    finally:
        os.close(fd)


# ---- in place ------------------------------------------------------------------------------
def _open_for_writing(path: Path) -> int:
    """The vault's real file, read-write; not a regular file -> refused (NotRegular)."""
    real = os.path.realpath(path)
    flags = os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise WriteFailed(f"{path}: was replaced by a symlink; nothing written") from None
        raise WriteFailed(f"{path}: cannot open for writing: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise fileio.NotRegular(f"{path}: not a regular file; nothing written")
    os.set_blocking(fd, True)
    return fd


def _ops_pwrite(ops: FileOps, fd: int, data: bytes, offset: int, path: Path) -> None:
    """All of ``data`` through ``ops`` (short writes continued; errors -> WriteFailed)."""
    done = 0
    while done < len(data):
        try:
            n = ops.pwrite(fd, data[done:], offset + done)
        except InterruptedError:
            continue
        except OSError as e:
            raise WriteFailed(
                f"{path}: cannot write {len(data) - done} bytes at offset {offset + done}: "
                f"{e.strerror or e}"
            ) from None
        if not isinstance(n, int) or n <= 0:
            raise WriteFailed(
                f"{path}: cannot write {len(data) - done} bytes at offset {offset + done}: "
                "the write made no progress"
            )
        done += n


def _ops_fsync(ops: FileOps, fd: int, path: Path) -> None:
    try:
        ops.fsync(fd)
    except OSError as e:
        raise WriteFailed(f"{path}: cannot flush to disk (fsync): {e.strerror or e}") from None


def _in_place(
    path: Path,
    fd: int,
    arch: ArchInfo,
    force: bool,
    ops: FileOps,
    configs: Sequence[tuple[Path, object]] = (),
) -> UpgradeResult:
    vault = Vault.open(path)
    with fileio.reading():
        now = os.stat(path)
    if not fileio.same_file(os.fstat(fd), now):
        raise WriteFailed(f"{path}: was replaced by another file while opening; nothing written")
    _check_moe_ffn(vault, arch)
    _check_against(vault, arch, configs)
    g = vault.geometry
    if g.version >= layout.VERSION_WITH_ARCH and not force:
        assert vault.arch_record is not None  # a v2 vault has its block
        if vault.arch_record.tobytes() == arch_record(arch).tobytes():
            return UpgradeResult(path, "current", g.reserved_ext, g.data_offset)
        raise RefusedInput(
            f"{path}: already version {g.version}, with another arch block; --force "
            "re-stamps its arch block"
        )
    if g.version >= layout.VERSION_WITH_ARCH:
        slot, mode = g.reserved_ext, "re-stamp"
    else:
        if not has_room(vault):
            raise RefusedInput(
                f"{path}: no room for the arch block: the descriptors end at "
                f"{g.descriptors_end}, so the {layout.ARCH_BLOCK_SIZE}-byte block would "
                f"need [{_arch_slot(vault)}, {_arch_slot(vault) + layout.ARCH_BLOCK_SIZE}) "
                f"before data_offset {g.data_offset}; use --out NEW to rewrite into a new "
                "file (blobs shift by whole pages, the original is untouched)"
            )
        _check_gap(vault)
        slot, mode = _arch_slot(vault), "in-place"
    del vault
    # The forward plan: writes (offset, bytes) and fsyncs (None), in this order.
    plan: list[tuple[int, bytes] | None] = [(slot, arch_record(arch).tobytes()), None]
    if mode == "in-place":
        plan += [
            (layout.HEADER_OFFSETS["reserved_ext"], np.uint32(slot).astype("<u4").tobytes()),
            (
                layout.HEADER_OFFSETS["version"],
                np.uint32(layout.VERSION_WITH_ARCH).astype("<u4").tobytes(),
            ),
            None,
        ]
    before = [
        None if s is None else (s[0], fileio.pread_exact(fd, len(s[1]), s[0], path)) for s in plan
    ]
    begun: list[tuple[int, bytes]] = []
    try:
        for step, old in zip(plan, before):
            if step is None:
                _ops_fsync(ops, fd, path)
            else:
                assert old is not None
                begun.append(old)
                _ops_pwrite(ops, fd, step[1], step[0], path)
    except SmoeError as e:
        _roll_back(fd, path, begun, e)
    return UpgradeResult(path, mode, slot, g.data_offset)


def _roll_back(fd: int, path: Path, begun: list[tuple[int, bytes]], error: SmoeError) -> None:
    """Restore the original bytes, newest first, each durable before the next; then raise."""
    try:
        for offset, data in reversed(begun):
            fileio.pwrite_all(fd, data, offset, path)
            fileio.fsync(fd, path)
    except SmoeError as again:
        raise WriteFailed(
            f"{error}; restoring the original bytes failed too ({again}); the vault is a "
            "valid v1 or v2 vault (check it with smoe verify)"
        ) from None
    raise WriteFailed(f"{error}; rolled back, the vault is unchanged") from None


# ---- into a new file -----------------------------------------------------------------------
def _expand(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Inputs as files: a folder (a model directory) stands for the files directly in it."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            with contextlib.suppress(OSError):
                out += sorted(c for c in p.iterdir() if c.is_file())
        else:
            out.append(p)
    return out


def _old_manifest(path: Path, vault: Vault) -> dict[str, Any] | None:
    """The manifest beside the old vault, checked against its table; None when absent."""
    where = manifest.path_for(path)
    if not os.path.lexists(where):
        return None
    hint = "move it aside to upgrade without it"
    try:
        doc = manifest.load(where, len(vault))
    except SmoeError as e:
        raise RefusedInput(f"{where}: the old vault's manifest is unusable ({e}); {hint}") from None
    size = len(vault.data)
    said = doc["vault"]["experts"]
    if doc["vault"]["size"] != size or len(doc["experts"]) != len(vault) or said != len(vault):
        rows = len(doc["experts"])
        count = f"{said} experts" + ("" if said == rows else f" ({rows} rows)")
        raise RefusedInput(
            f"{where}: describes a vault of {doc['vault']['size']} bytes with {count}, "
            f"{path} has {size} bytes and {len(vault)}; it belongs to another file; {hint}"
        )
    found = manifest.check(doc, size, vault.table, lambda o, n: vault.data[o : o + n])
    problems = [f for f in found if f.code != "manifest.checksum"]  # blobs: checked on copy
    if problems:
        raise RefusedInput(f"{where}: {problems[0].message}; {hint}")
    for i, row in enumerate(doc["experts"]):
        entry = vault.table[i]
        want = (entry["layer_id"], entry["expert_id"], entry["byte_offset"], entry["raw_size"])
        got = (row["layer"], row["expert"], row["offset"], row["raw_size"])
        if tuple(int(x) for x in want) != got:
            raise RefusedInput(
                f"{where}: experts[{i}] is layer {got[0]} expert {got[1]} at offset {got[2]} "
                f"({got[3]} bytes), the table of {path} has layer {int(want[0])} expert "
                f"{int(want[1])} at offset {int(want[2])} ({int(want[3])} bytes); {hint}"
            )
    return doc


def _copy_blobs(vault: Vault, dst: AtomicFile, end: int, shift: int) -> list[int]:
    """Copy [data_offset, end) to ``shift`` bytes later (holes stay holes); blob CRC-32Cs."""
    t = vault.table
    starts = t["byte_offset"].astype(np.int64)
    stops = starts + t["raw_size"].astype(np.int64)
    order = np.argsort(starts, kind="stable")
    crcs = [0] * len(t)
    first = 0  # the first blob (in offset order) not yet wholly behind the chunk
    for pos in range(vault.geometry.data_offset, end, _CHUNK):
        stop = min(pos + _CHUNK, end)
        piece = vault.data[pos:stop]
        if piece.any():
            dst.pwrite(np.ascontiguousarray(piece), pos + shift)
        k = first
        while k < len(order) and starts[order[k]] < stop:
            i = int(order[k])
            a, b = max(int(starts[i]), pos), min(int(stops[i]), stop)
            if a < b:
                crcs[i] = manifest.checksum(piece[a - pos : b - pos], crcs[i])
            k += 1
        while first < len(order) and stops[order[first]] <= stop:
            first += 1
    return crcs


_TENSOR_KEYS = (
    "name", "source", "index", "rows", "source_crc32c", "snr_db", "weighted_snr_db",
    "dtype", "fp8", "transposed", "calib_tokens", "calib_snr_db", "calib_gain_db",
)  # fmt: skip
"""What an ``experts[].tensors[]`` entry may record (docs/MANIFEST.md): only these are
copied, so a value the manifest cannot hold (an unknown key's 1e400) is never written."""


def _tensors(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """An old manifest row's per-tensor provenance (checked against the vault before), its
    known keys only; None when it records none, or its SNRs are not finite numbers."""
    tensors = row.get("tensors")
    if isinstance(tensors, list) and all(
        isinstance(x, dict)
        and all(
            x.get(k) is None or (type(x.get(k)) in (int, float) and math.isfinite(x[k]))
            for k in ("snr_db", "weighted_snr_db", "calib_tokens", "calib_snr_db", "calib_gain_db")
        )
        for x in tensors
    ):
        return [{k: x[k] for k in _TENSOR_KEYS if k in x} for x in tensors]
    return None


def _options(old: dict[str, Any] | None, bits: int) -> dict[str, Any]:
    """The options that shaped the blobs (kept from the old manifest), now at version 2."""
    tool = old.get("tool") if old else None
    options = tool.get("options") if isinstance(tool, dict) else None
    if not isinstance(options, dict):
        options = {"bits": bits}
    return {**options, "version": layout.VERSION_WITH_ARCH}


def _metadata(old: dict[str, Any] | None) -> dict[str, str] | None:
    """The old manifest's free-form ``metadata`` (smoe meta), its entries that keep the rules
    only (:func:`smoe.vault.meta.check_metadata`); None when it has none."""
    stored = old.get("metadata") if old else None
    if not isinstance(stored, dict):
        return None
    kept = {}
    for key, value in stored.items():
        try:
            kept.update(check_metadata({key: value}))
        except SmoeError:
            continue
    return kept or None


def _rewrite(
    path: Path,
    arch: ArchInfo,
    out: Path,
    inputs: Iterable[str | os.PathLike] = (),
    configs: Sequence[tuple[Path, object]] = (),
    replace: bool = True,
) -> UpgradeResult:
    """A v2 copy in a new file, blobs shifted by whole pages; the original is untouched."""
    man_out = manifest.path_for(out)
    protected = [path, manifest.path_for(path), *_expand(inputs)]
    for target in (out, man_out):
        fileio.refuse_same_file(target, protected)
    if out.is_dir():
        raise WriteFailed(f"{out}: is a folder; --out names the new vault file")
    fileio.require_regular(path)
    if not replace:
        fileio.refuse_existing(out)
    else:  # a file replaced must be a vault: --force never replaces what smoe did not write
        refuse_foreign(out, VAULT_SIGNATURE)
    fileio.ensure_dir(out.parent)
    with Lock(lock_for(out), out):
        vault = Vault.open(path)
        _check_moe_ffn(vault, arch)
        old = _old_manifest(path, vault)
        _check_against(vault, arch, configs)
        g = vault.geometry
        slot = _arch_slot(vault)
        shift = max(layout.writer_data_offset(g.total, layout.VERSION_WITH_ARCH) - g.data_offset, 0)
        header = vault.header_record.copy()
        header["version"] = layout.VERSION_WITH_ARCH
        header["reserved_ext"] = slot
        header["data_offset"] = g.data_offset + shift
        table = vault.table.copy()
        table["byte_offset"] += np.uint64(shift)
        ends = (vault.table["byte_offset"] + vault.table["padded_size"]).astype(np.int64)
        end = max(g.data_offset, int(ends.max()) if len(ends) else 0)
        meta = bytearray(g.data_offset + shift)
        meta[: layout.HEADER_SIZE] = header.tobytes()
        meta[layout.TABLE_OFFSET : g.descriptors_offset] = table.tobytes()
        meta[g.descriptors_offset : g.descriptors_end] = vault.descriptors.tobytes()
        meta[slot : slot + layout.ARCH_BLOCK_SIZE] = arch_record(arch).tobytes()
        with (
            AtomicFile(out, replace=replace, ours=VAULT_SIGNATURE) as dst,
            AtomicFile(man_out) as mdst,
        ):
            dst.truncate(end + shift)
            dst.pwrite(meta, 0)
            crcs = _copy_blobs(vault, dst, end, shift)
            builder = manifest.ManifestBuilder(
                manifest.tool_info("upgrade", _options(old, vault.bits)),
                source=old["source"] if old and isinstance(old.get("source"), dict) else None,
                metadata=_metadata(old),
            )
            for i, e in enumerate(vault.table):
                layer, expert = int(e["layer_id"]), int(e["expert_id"])
                row = old["experts"][i] if old else {}
                if old and row["crc32c"] != crcs[i]:
                    raise FormatError(
                        f"{path}: layer {layer} expert {expert}: the blob at offset "
                        f"{int(e['byte_offset'])} has CRC-32C {crcs[i]:#010x}, its manifest "
                        f"says {row['crc32c']:#010x}; the old vault is damaged, nothing written"
                    )
                builder.add(layer, expert, crcs[i], _tensors(row))
            slots = [
                (int(e["layer_id"]), int(e["expert_id"]), int(e["byte_offset"]), int(e["raw_size"]))
                for e in table
            ]
            doc = builder.document(out.name, end + shift, vault.bits, slots)
            mdst.pwrite(manifest.encode(doc), 0)
            dst.sync()
            mdst.commit()  # the manifest first, the vault last: both or (on error) neither
            try:
                dst.commit()
            except BaseException:
                fileio.unlink_owned(man_out)
                raise
    return UpgradeResult(out, "rewrite", slot, g.data_offset + shift)
