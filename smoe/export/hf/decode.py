"""Expert tensors decoded ahead by worker threads, each into reused buffers, for the
writer to put in place.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from smoe import quant
from smoe.errors import FormatError, RefusedInput
from smoe.export.hf.names import OutTensor, Piece
from smoe.export.hf.plan import ExportPlan
from smoe.format import manifest
from smoe.interop.safetensors_io import (
    DTYPE_SIZES,
)
from smoe.plumbing import fileio
from smoe.vault.reader import ExpertView, Vault
from smoe_gen.layout import TENSOR_NAMES

__all__ = ["expert_tasks"]


_Task = tuple[OutTensor, Piece, str]
"""One vault tensor to decode: the output tensor it fills, its place there, the dtype."""


class _Slot:
    """Decodes one vault tensor at a time into its own reused buffers, in the output dtype;
    the expert last read is kept (its three tensors are usually wanted in a row)."""

    def __init__(
        self,
        vault: Vault,
        crcs: dict[tuple[int, int], int] | None,
        manifest_path: Path,
        checked: set[tuple[int, int]],
    ) -> None:
        self.vault = vault
        self.crcs = crcs
        self.manifest_path = manifest_path
        self._checked = checked  # shared by the slots: each blob's CRC is checked once
        self._key: tuple[int, int] | None = None
        self._view: ExpertView | None = None
        self._f32 = np.empty(0, np.float32)
        self._u16 = np.empty(0, np.uint16)

    def _expert(self, key: tuple[int, int]) -> ExpertView:
        if key != self._key:
            self._view, self._key = self.vault.expert(*key), key
            if self.crcs is not None and key not in self._checked:
                self._check_crc(key)
        assert self._view is not None
        return self._view

    def _check_crc(self, key: tuple[int, int]) -> None:
        e = self.vault.table[self.vault.index(*key)]
        off, raw = int(e["byte_offset"]), int(e["raw_size"])
        assert self.crcs is not None
        if manifest.checksum(self.vault.data[off : off + raw]) != self.crcs[key]:
            raise FormatError(
                f"{self.vault.path}: layer {key[0]} expert {key[1]}: the blob at "
                f"offset {off} differs from its CRC-32C in {self.manifest_path} "
                "(changed or damaged); refused"
            )
        self._checked.add(key)

    def decode(self, task: _Task) -> np.ndarray:
        """The task's tensor as ``dtype`` values (a view of this slot's buffers, valid until
        its next decode); rounding to 16 bits is to nearest even, as torch rounds (BF16:
        :func:`smoe.quant.decode_bf16`, in the decoding pass when compiled)."""
        out, piece, dtype = task
        view = self._expert(piece.key).tensors[piece.tensor]
        if not np.isfinite(view.scales).all():  # only an unverified vault holds one
            layer, expert = piece.key
            raise RefusedInput(
                f"{self.vault.path}: layer {layer} expert {expert} "
                f"{TENSOR_NAMES[piece.tensor]}: a scale is not finite (NaN or inf), so its "
                "weights would be; refused (smoe verify --deep names the damage)"
            )
        n = view.rows * view.cols
        if dtype != "F32" and self._u16.size < n:
            self._u16 = np.empty(n, np.uint16)
        u16 = self._u16[:n]
        if dtype == "BF16":
            quant.decode_bf16(
                view.packed, view.scales, view.bits, view.shape, out=u16.reshape(view.shape)
            )
            return u16
        if self._f32.size < n:
            self._f32 = np.empty(n, np.float32)
        f32 = self._f32[:n]
        quant.decode(view.packed, view.scales, view.bits, view.shape, out=f32.reshape(view.shape))
        if dtype == "F32":
            return f32
        np.copyto(u16.view(np.float16), f32, casting="same_kind")
        if not np.isfinite(u16.view(np.float16)).all():
            raise RefusedInput(
                f"{out.name}: dequantised values beyond the float16 range "
                "(65504); export with --dtype bf16 or f32"
            )
        return u16


class Decoder:
    """Decodes the tasks, in order, ahead of the writer in ``threads`` worker threads
    (numpy and the compiled decoder release the GIL); the writer takes each result with
    :meth:`take`, writes it, and only then is its slot given the next task. Memory:
    ``2 * threads`` slots' buffers. Workers only read the vault: every write stays in the
    calling thread."""

    def __init__(
        self,
        vault: Vault,
        crcs: dict[tuple[int, int], int] | None,
        manifest_path: Path,
        tasks: list[_Task],
        threads: int,
    ) -> None:
        checked: set[tuple[int, int]] = set()
        self._slots = [_Slot(vault, crcs, manifest_path, checked) for _ in range(2 * threads)]
        self._tasks = tasks
        self._next = 0
        self._pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None
        self._ahead: deque[tuple[int, int, Future[np.ndarray] | None]] = deque()
        for slot in range(len(self._slots)):
            self._submit(slot)

    def _submit(self, slot: int) -> None:
        if self._next >= len(self._tasks):
            return
        i, self._next = self._next, self._next + 1
        future = (
            None
            if self._pool is None  # decoded when taken
            else self._pool.submit(self._slots[slot].decode, self._tasks[i])
        )
        self._ahead.append((slot, i, future))

    @contextlib.contextmanager
    def take(self, out: OutTensor, piece: Piece) -> Iterator[np.ndarray]:
        """The next result, which must be ``piece`` of ``out``; its slot is reused after."""
        slot, i, future = self._ahead.popleft()
        task = self._tasks[i]
        assert task[0] is out and task[1] == piece, "tasks taken out of order"
        yield future.result() if future is not None else self._slots[slot].decode(task)
        self._submit(slot)

    def close(self) -> None:
        """Stop: queued tasks are dropped, running ones finish (they write nothing)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._ahead.clear()


def expert_tasks(plan: ExportPlan) -> list[_Task]:
    """Every vault tensor in the order the shards' writers want them: shard by shard,
    tensor names sorted as in the safetensors file, pieces in place order.

    >>> from smoe.export.hf.plan import ExportPlan
    >>> from smoe.vault.names import family_layout
    >>> from smoe.vault.reader import Vault
    >>> with Vault.open("fixtures/q4_v2.smoe") as vault:
    ...     experts = family_layout(vault, set(), "olmoe")
    >>> tasks = expert_tasks(ExportPlan.build({}, experts, dict.fromkeys(experts, "BF16"), 10**9))
    >>> len(tasks), tasks[0][0].name, tasks[0][2]
    (24, 'model.layers.0.mlp.experts.0.down_proj.weight', 'BF16')
    """
    out = []
    for names in plan.shards:
        for name in sorted(names):
            o = plan.experts.get(name)
            if o is not None:
                out += [(o, p, plan.dtypes[name]) for p in _pieces_in_order(o)]
    return out


def _pieces_in_order(o: OutTensor) -> list[Piece]:
    return sorted(o.pieces, key=lambda p: (p.index or 0, p.rows))


def write_expert(
    fd: int, path: Path, o: OutTensor, dtype: str, offset: int, decoder: Decoder
) -> None:
    """Write output tensor ``o`` at ``offset``: each piece where its slab and rows lie."""
    if o.transposed:
        _write_transposed(fd, path, o, dtype, offset, decoder)
        return
    row = o.cols * DTYPE_SIZES[dtype]
    slab = o.shape[-2] * row
    for p in _pieces_in_order(o):
        with decoder.take(o, p) as data:
            fileio.pwrite_all(fd, data, offset + (p.index or 0) * slab + p.rows[0] * row, path)


def _write_transposed(
    fd: int, path: Path, o: OutTensor, dtype: str, offset: int, decoder: Decoder
) -> None:
    """A transposed layout (``[E, H, 2I]``): each slab assembled in memory from its pieces'
    transposes, side by side, then written whole."""
    cols, height = o.shape[-2], o.shape[-1]
    item = np.dtype(np.float32 if dtype == "F32" else np.uint16)
    slab_bytes = cols * height * item.itemsize
    pieces = _pieces_in_order(o)
    at = 0
    while at < len(pieces):
        index = pieces[at].index
        slab = np.empty((cols, height), item)
        while at < len(pieces) and pieces[at].index == index:
            p = pieces[at]
            with decoder.take(o, p) as data:
                rows = p.rows[1] - p.rows[0]
                slab[:, p.rows[0] : p.rows[1]] = data.view(item).reshape(rows, cols).T
            at += 1
        fileio.pwrite_all(fd, slab, offset + (index or 0) * slab_bytes, path)
