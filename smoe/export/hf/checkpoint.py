"""``smoe export VAULT OUT_DIR --hf``: a runnable HuggingFace checkpoint folder.

The folder holds the scout's tensors byte for byte, every routed expert dequantised under
the names and in the layout of the source checkpoint (:mod:`smoe.export.hf.names`), in shards of
at most ``max_shard_size`` bytes with ``model.safetensors.index.json`` when there are
several (as ``save_pretrained`` writes them), and ``config.json``
(:mod:`smoe.export.hf.transformers_config`).

* **Complete or absent**: everything is written in a temporary folder beside ``OUT_DIR``
  (``.<name>.<hex>.tmp``), each file fsynced, the marker ``smoe-export.json`` last (every
  file with its size and SHA-256: :mod:`smoe.export.hf.folder`), then the folder is renamed
  onto ``OUT_DIR`` (which must not exist, or be an empty folder; with ``--force`` an earlier
  export its marker vouches for) under the lock ``.<name>.lock``; on any error the
  temporary folder is removed.
* **Bounded memory**: vault tensors are decoded ahead by worker threads (one per usable
  core), each of ``2 * threads`` slots holding one tensor in reused buffers; the calling
  thread writes each at its place; scout tensors are copied in chunks.
* **Inputs untouched**: ``OUT_DIR`` may not be, or contain, the vault, its manifest, the
  scout or the config, nor be the checkpoint the vault was sculpted from.
* **Only whole models**: a partial vault (``sculpt --max-layers/--max-experts``) is
  refused, naming the layers and experts it lacks; a manifest that describes another vault
  is refused; each blob's CRC-32C is checked against the manifest as it is read.
* **Another model's inputs refused**: before anything is written, the config
  (:func:`smoe.vault.contradictions.refuse_contradictions`: model type, widths, layer, head and
  expert counts against the arch block, header and descriptors) and the scout
  (:func:`_check_scout`: embedding ``[vocab, d_model]``, the model's layers and no more,
  each MoE layer's router ``[experts, d_model]`` in the block the experts go to), each
  contradiction naming both values.
* **config.json**: copied (``--config``, else ``<stem>.config.json`` beside the vault), or
  rebuilt from the arch block and the scout; a family whose config a vault cannot give
  exactly (``Family.rebuild`` false) is rebuilt only when asked (``rebuild_config``).
* **FP8 sources**: when the manifest records experts dequantised from FP8
  (``experts[].tensors[].fp8``), they are written in BF16 (unless ``dtype``) and the copied
  config loses its ``quantization_config``; a scout that still holds FP8 tensors (or their
  scales) is refused, since the experts would have to be requantised to FP8 to match it.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from smoe import quant
from smoe.errors import FormatError, OutputExists, RefusedInput, UsageError, WriteFailed
from smoe.export.hf import folder
from smoe.export.hf import transformers_config as hf_config
from smoe.export.hf.names import OutTensor, Piece, family_layout, manifest_layout
from smoe.families.config import parse_json
from smoe.families.registry import CONTAINERS, EMBEDDINGS, family_of, generic, split_layer
from smoe.format import manifest
from smoe.format.records import model_type_str
from smoe.interop.fp8 import FP8_DTYPES
from smoe.interop.safetensors_io import (
    DTYPE_SIZES,
    FLOAT_DTYPES,
    TensorInfo,
    copy_range,
    read_header,
)
from smoe.interop.safetensors_io import write_file as write_safetensors
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile
from smoe.plumbing.cpus import usable_cores
from smoe.plumbing.lock import Lock, lock_for
from smoe.vault.companions import companions
from smoe.vault.contradictions import refuse_contradictions, stated
from smoe.vault.names import load_manifest, natural_key
from smoe.vault.reader import ExpertView, Vault
from smoe_gen.layout import TENSOR_NAMES

__all__ = ["MAX_SHARD_SIZE", "HfExportResult", "export_hf"]

MAX_SHARD_SIZE = 5 * 10**9
"""Default bytes of tensor data per shard (``save_pretrained``'s ``max_shard_size`` "5GB")."""
INDEX_NAME = "model.safetensors.index.json"


@dataclass
class HfExportResult:
    """What an export wrote; :meth:`summary` is what the CLI prints.

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> d = tempfile.mkdtemp()
    >>> scout = {"model.embed_tokens.weight": np.zeros((320, 64), np.float32)}  # [vocab, H]
    >>> scout |= {f"model.layers.{i}.mlp.gate.weight": np.zeros((4, 64), np.float32)
    ...           for i in (0, 1)}  # the routers [experts, H]
    >>> save_file(scout, f"{d}/scout.st")  # a scout: the tensors besides the experts
    >>> result = export_hf("fixtures/q4_v2.smoe", f"{d}/hf", scout=f"{d}/scout.st", threads=1)
    >>> result.files, result.tensors, result.expert_tensors, result.dtype
    (['model.safetensors', 'config.json', 'smoe-export.json'], 27, 24, 'F32')
    >>> result.config, result.config_path, result.assumed[1]
    ('rebuilt', None, 'max_position_embeddings 4096')
    """

    out: Path
    files: list[str]
    tensors: int
    expert_tensors: int
    bytes_out: int
    expert_bytes_out: int
    dtype: str
    config: str  # "copied" or "rebuilt"
    seconds: float
    notes: list[str] = field(default_factory=list)
    config_path: Path | None = None  # the config copied (None: rebuilt)
    assumed: list[str] = field(default_factory=list)  # what a rebuilt config assumed

    def summary(self) -> dict[str, Any]:
        """The result as a JSON object (``smoe export --hf --json``), with the throughput.

        >>> import tempfile, numpy as np
        >>> from safetensors.numpy import save_file
        >>> d = tempfile.mkdtemp()
        >>> scout = {"model.embed_tokens.weight": np.zeros((320, 64), np.float32)}
        >>> scout |= {f"model.layers.{i}.mlp.gate.weight": np.zeros((4, 64), np.float32)
        ...           for i in (0, 1)}
        >>> save_file(scout, f"{d}/scout.st")  # a scout: the tensors besides the experts
        >>> result = export_hf("fixtures/q4_v2.smoe", f"{d}/hf", scout=f"{d}/scout.st", threads=1)
        >>> doc = result.summary()
        >>> doc["bytes_out"], doc["config"], doc["config_path"], doc["throughput_mb_s"] > 0
        (280576, 'rebuilt', None, True)
        >>> doc["assumed"][0]
        "rope_type 'default' (no rope scaling)"
        """
        return {
            "out": str(self.out),
            "files": self.files,
            "tensors": self.tensors,
            "expert_tensors": self.expert_tensors,
            "bytes_out": self.bytes_out,
            "expert_bytes_out": self.expert_bytes_out,
            "dtype": self.dtype,
            "config": self.config,
            "config_path": None if self.config_path is None else str(self.config_path),
            "assumed": self.assumed,
            "seconds": self.seconds,
            "throughput_mb_s": (
                self.expert_bytes_out / 1e6 / self.seconds if self.seconds > 0 else None
            ),
            "notes": self.notes,
        }


# ---- inputs ---------------------------------------------------------------------------------
def _ids(ids: list[int]) -> str:
    """``0..3, 7``: sorted ids as runs."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def _refuse_partial(vault: Vault, doc: dict[str, Any] | None) -> None:
    """Every MoE layer the header counts, each with all its experts, or refused naming
    what is missing."""
    want_layers = int(vault.header["num_moe_layers"])
    want = int(vault.header["max_experts_per_layer"])
    layer_ids, expert_ids = vault.table["layer_id"], vault.table["expert_id"]
    held = vault.layers()
    problems = []
    if len(held) < want_layers:
        problems.append(
            f"it holds {len(held)} of the model's {want_layers} MoE layers "
            f"(layers {_ids(list(held))}; {want_layers - len(held)} missing)"
        )
    short = []
    for lay in sorted(held):
        have = {int(e) for e in expert_ids[layer_ids == lay]}
        missing = sorted(set(range(want)) - have)
        if missing:
            short.append(f"layer {lay} lacks experts {_ids(missing)} of 0..{want - 1}")
    if short:
        more = f" and {len(short) - 3} more layers" if len(short) > 3 else ""
        problems.append("; ".join(short[:3]) + more)
    if not problems:
        return
    opts = ((doc or {}).get("tool") or {}).get("options") or {}
    how = " ".join(
        f"--{k.replace('_', '-')} {opts[k]}"
        for k in ("max_layers", "max_experts")
        if isinstance(opts.get(k), int)
    )
    made = f" (sculpted with {how})" if how else ""
    raise RefusedInput(
        f"{vault.path}: a partial vault{made}: {'; '.join(problems)}; a "
        "checkpoint needs every expert: sculpt the model again without "
        "--max-layers/--max-experts"
    )


def _scout_dtype(scout: dict[str, TensorInfo]) -> str | None:
    """The float dtype holding most of the scout's bytes (None if it has no float tensor)."""
    by: dict[str, int] = {}
    for t in scout.values():
        if t.dtype in FLOAT_DTYPES:
            by[t.dtype] = by.get(t.dtype, 0) + t.nbytes
    return max(by, key=lambda d: (by[d], d)) if by else None


# ---- decoding expert tensors ----------------------------------------------------------------
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


class _Decoder:
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


def _expert_tasks(plan: _Plan) -> list[_Task]:
    """Every vault tensor in the order the shards' writers want them: shard by shard,
    tensor names sorted as in the safetensors file, pieces in place order."""
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
    fd: int, path: Path, o: OutTensor, dtype: str, offset: int, decoder: _Decoder
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
    fd: int, path: Path, o: OutTensor, dtype: str, offset: int, decoder: _Decoder
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


# ---- the output folder ----------------------------------------------------------------------
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


def _shard_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def _stat_unless_missing(path: str | Path) -> os.stat_result | None:
    """``os.stat(path)``, or None when nothing is there (a missing input is refused where it
    is opened, not here)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _refuse_outputs(
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
    earlier export to replace, or None."""
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
    source = folder.source_checkpoint(out_dir, doc)
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


def _make_tmp_dir(out_dir: Path) -> Path:
    """A new folder beside ``out_dir``, with the owner, group and mode of the (empty)
    folder there it is to replace, from the start."""
    replaced = fileio.existing_output(out_dir, folder=True)
    while True:
        tmp = out_dir.parent / f".{out_dir.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.mkdir(tmp, 0o777)
            fileio.take_over(tmp, replaced)
            return tmp
        except FileExistsError:
            continue
        except OSError as e:
            raise WriteFailed(f"{tmp}: cannot create the folder: {e.strerror or e}") from None


@dataclass
class _Plan:
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
    ) -> _Plan:
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


def _write_folder(
    tmp: Path,
    plan: _Plan,
    decoder: _Decoder,
    config_bytes: bytes,
    hashes: folder.Hashes | None = None,
) -> list[str]:
    """Write the shards, the index (when there are several) and config.json into ``tmp``;
    the names of the files, in that order (``hashes``: told of each shard's bytes as they
    are written)."""
    names = _shard_names(len(plan.shards))
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
    plan: _Plan,
    decoder: _Decoder,
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


def _index(names: list[str], plan: _Plan) -> dict[str, Any]:
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


# ---- the export -----------------------------------------------------------------------------
def export_hf(
    vault_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    scout: str | os.PathLike | None = None,
    config: str | os.PathLike | None = None,
    dtype: str | None = None,
    max_shard_size: int = MAX_SHARD_SIZE,
    threads: int | None = None,
    rebuild_config: bool = False,
    replace: bool = False,
) -> HfExportResult:
    """Write the checkpoint folder ``out_dir`` for ``vault_path`` (see the module docstring).

    ``scout``: default ``<stem>.scout.safetensors`` beside the vault; ``config``: default
    ``<stem>.config.json`` beside it, else rebuilt (refused for a family whose config the
    vault cannot give exactly); ``rebuild_config``: rebuild it, not copy it, even then
    (not with ``config``); ``dtype`` (``bf16``, ``f16``, ``f32``): the experts' dtype,
    default the source's (manifest; BF16 for FP8 sources), else the scout's, else bf16;
    ``threads``: decoding threads (default: the usable cores); ``replace`` (``--force``):
    replace a non-empty ``out_dir`` that an earlier export wrote, as its marker
    ``smoe-export.json`` lists it, else refused (:mod:`smoe.export.hf.folder`; the checkpoint
    the vault was sculpted from always is); the new folder takes its place in one rename.

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> d = tempfile.mkdtemp()
    >>> scout = {"model.embed_tokens.weight": np.zeros((320, 64), np.float32)}  # [vocab, H]
    >>> scout |= {f"model.layers.{i}.mlp.gate.weight": np.zeros((4, 64), np.float32)
    ...           for i in (0, 1)}  # the routers [experts, H]
    >>> save_file(scout, f"{d}/scout.st")  # a scout: the tensors besides the experts
    >>> result = export_hf("fixtures/q4_v2.smoe", f"{d}/hf", scout=f"{d}/scout.st", dtype="bf16")
    >>> sorted(os.listdir(result.out)), result.expert_bytes_out
    (['config.json', 'model.safetensors', 'smoe-export.json'], 98304)
    >>> export_hf("fixtures/partial_vault.smoe", f"{d}/hf2", scout=f"{d}/scout.st")
    Traceback (most recent call last):
    smoe.errors.RefusedInput: fixtures/partial_vault.smoe: a partial vault...: sculpt the model \
again without --max-layers/--max-experts
    """
    t0 = time.perf_counter()
    vault_path, out_dir = Path(vault_path), Path(out_dir)
    _check_options(dtype, threads, max_shard_size)
    if rebuild_config and config is not None:
        raise UsageError(
            "--rebuild-config and --config: choose one (the config.json to copy, or one "
            "rebuilt from the vault)"
        )
    notes: list[str] = []
    with Vault.open(vault_path) as vault:
        src = _open_sources(vault, vault_path, scout)
        experts = _expert_layout(vault, src, notes)
        fp8 = src.fp8_sources
        if fp8:
            _refuse_fp8_scout(src)
        explicit = hf_config.DTYPES[dtype] if dtype is not None else None
        fallback = _scout_dtype(src.scout) or "BF16"
        dtypes = {
            n: explicit or o.dtype or ("BF16" if n in fp8 else fallback) for n, o in experts.items()
        }
        cfg = _config_file(vault, src, config, explicit, fallback, notes, rebuild_config)
        _check_scout(vault, src, experts, cfg.facts)
        inputs = [vault_path, src.manifest_path, src.scout_path, cfg.path]
        _refuse_outputs(out_dir, inputs, replace, src.doc, hashes=False)  # before any work
        plan = _Plan.build(src.scout, experts, dtypes, max_shard_size)
        files = _write_checkpoint(
            vault, src, plan, cfg.data, out_dir, inputs, threads, replace, notes
        )
    return HfExportResult(
        out_dir,
        files,
        len(plan.names()),
        len(experts),
        sum(plan.nbytes(n) for n in plan.names()),
        sum(plan.nbytes(n) for n in experts),
        explicit or _common_dtype(dtypes),
        cfg.origin,
        time.perf_counter() - t0,
        notes,
        cfg.path if cfg.origin == "copied" else None,
        cfg.assumed,
    )


def _check_options(dtype: str | None, threads: int | None, max_shard_size: int) -> None:
    """Refuse options no export takes (before any input is read)."""
    if dtype is not None and dtype not in hf_config.DTYPES:
        raise UsageError(f"--dtype: {dtype!r} is not one of {', '.join(hf_config.DTYPES)}")
    if threads is not None and threads < 1:
        raise UsageError(f"threads: must be at least 1, got {threads}")
    if max_shard_size < 1:
        raise UsageError(f"--max-shard-size: must be at least 1 byte, got {max_shard_size}")


@dataclass
class _Sources:
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


def _fp8_scout_tensor(scout: dict[str, TensorInfo]) -> str | None:
    """The first of the scout's tensors (natural name order) that is FP8 or an FP8 scale
    (``*_scale_inv``, ``*weight_scale``), as the refusal names it; None if there is none."""
    for name in sorted(scout, key=natural_key):
        dtype = scout[name].dtype
        if dtype in FP8_DTYPES:
            return f"the FP8 tensor {name!r} ({dtype})"
        if name.endswith(("_scale_inv", "weight_scale")):
            return f"the FP8 scale tensor {name!r}"
    return None


def _refuse_fp8_scout(src: _Sources) -> None:
    """A vault whose experts were dequantised from FP8 exports as an unquantised
    checkpoint only: refused if its scout still holds FP8 tensors or scales."""
    found = _fp8_scout_tensor(src.scout)
    if found is None:
        return
    raise RefusedInput(
        f"{src.scout_path}: holds {found}, while the vault's experts were dequantised "
        "from FP8: a checkpoint of both would need the experts requantised to FP8, which "
        "export --hf does not do; convert the scout's FP8 tensors to BF16 first "
        "(dequantised with their scales, the scale tensors removed), then export it "
        "unquantised"
    )


def _open_sources(vault: Vault, vault_path: Path, scout: str | os.PathLike | None) -> _Sources:
    """The manifest (checked to describe ``vault``, which must be whole) and the scout's
    header (``scout``, default the one beside the vault; checked to belong to its model
    by :func:`_check_scout` once the config is known)."""
    doc, manifest_path = load_manifest(vault)
    _refuse_partial(vault, doc)
    scout_path = Path(scout) if scout is not None else companions(vault_path)[0]
    if scout is None and not os.path.lexists(scout_path):
        raise RefusedInput(
            f"{vault_path}: no scout beside it (looked for {scout_path.name}, "
            "which the sculptor writes); name it with --scout"
        )
    return _Sources(vault_path, doc, manifest_path, scout_path, read_header(scout_path))


def _expert_layout(vault: Vault, src: _Sources, notes: list[str]) -> dict[str, OutTensor]:
    """The output's expert tensors: the source's names and layout (manifest), else the
    family's standard names (noted); refused if the scout already has one of them."""
    experts = manifest_layout(vault, src.doc, src.manifest_path) if src.doc is not None else None
    if experts is None:
        model_type = "" if vault.arch is None else model_type_str(vault.arch["model_type"])
        experts = family_layout(vault, set(src.scout), model_type)
        first = next(iter(experts))
        why = (
            "no manifest beside the vault"
            if src.doc is None
            else f"{src.manifest_path.name} records no source tensors"
        )
        notes.append(
            f"{why}: experts named as the family's checkpoints name them "
            f"({first.replace('.0.', '.{L}.', 1)} ...)"
        )
    clash = sorted(set(experts) & set(src.scout))
    if clash:
        raise RefusedInput(
            f"{src.scout_path}: already has {clash[0]!r}, which the vault's experts "
            "would write: the scout belongs to another vault"
        )
    return experts


# ---- the scout checked against the vault ----------------------------------------------------
_OTHER_MODEL = "the scout belongs to another model"


def _moe_blocks(experts: dict[str, OutTensor]) -> tuple[str, dict[int, str]]:
    """The language model's layer stem (``model.layers.``) and, per layer, the prefix of
    its MoE block (``model.layers.3.mlp.``): where the expert tensors written go, so where
    the scout must hold that layer's router."""
    stem, blocks = "", dict[int, str]()
    for name in sorted(experts, key=natural_key):
        split = split_layer(name)
        if split is None:
            continue
        _, layer, rest = split
        head = name[: len(name) - len(rest)]
        stem = stem or head[: -len(f"{layer}.")]
        first = rest.split(".", 1)[0]
        blocks.setdefault(layer, head + (f"{first}." if first in CONTAINERS else ""))
    return stem, blocks


def _check_embedding(vault: Vault, src: _Sources, stem: str) -> None:
    """The token embedding beside the layers (``model.embed_tokens.weight`` or another
    known spelling) is ``[vocab_size, d_model]`` of the vault (vocab_size when recorded)."""
    prefix = stem.removesuffix("layers.").removesuffix("blocks.")
    names = [prefix + e for e in EMBEDDINGS]
    name = next((n for n in names if n in src.scout), None)
    where, vault_path = src.scout_path, src.vault_path
    if name is None:
        raise RefusedInput(
            f"{where}: has no token embedding (looked for {', '.join(names)}): {_OTHER_MODEL}"
        )
    shape = src.scout[name].shape
    d_model, vocab = int(vault.header["d_model"]), int(vault.header["vocab_size"])
    if len(shape) != 2:
        raise RefusedInput(
            f"{where}: {name} has shape {list(shape)}, but {vault_path} needs [vocab_size, "
            f"d_model {d_model}]: {_OTHER_MODEL}"
        )
    if shape[1] != d_model:
        raise RefusedInput(
            f"{where}: {name} has {shape[1]} columns, but {vault_path} has d_model "
            f"{d_model}: {_OTHER_MODEL}"
        )
    if vocab and shape[0] != vocab:
        raise RefusedInput(
            f"{where}: {name} has {shape[0]} rows, but {vault_path} has vocab_size "
            f"{vocab}: {_OTHER_MODEL}"
        )


def _check_layers(src: _Sources, stem: str, count: int | None, mtp: int) -> None:
    """The scout holds tensors of each of the model's ``count`` layers under ``stem``, and
    of no layer beyond them but ``mtp`` multi-token-prediction layers."""
    if count is None:
        return
    present = set()
    for name in src.scout:
        head = name[len(stem) :].split(".", 1)[0] if name.startswith(stem) else ""
        if head.isdigit():
            present.add(int(head))
    said = f"{src.vault_path} has num_hidden_layers {count}"
    missing = sorted(set(range(count)) - present)
    if missing:
        raise RefusedInput(
            f"{src.scout_path}: has no tensor of {stem}{missing[0]}, but {said}: {_OTHER_MODEL}"
        )
    beyond = max(present, default=-1)
    if beyond >= count + mtp:
        also = f" (and num_nextn_predict_layers {mtp})" if mtp else ""
        raise RefusedInput(
            f"{src.scout_path}: has tensors of {stem}{beyond}, but {said}{also}: {_OTHER_MODEL}"
        )


def _router_like(rest: str) -> bool:
    return "gate" in rest or "router" in rest


def _check_routers(vault: Vault, src: _Sources, blocks: dict[int, str], mlp_router: bool) -> None:
    """Each MoE layer's router is in its MoE block: a 2-D tensor there whose name holds
    ``gate`` or ``router``, ``[experts per layer, d_model]``; a family whose router is a
    small MLP of its own width (``router_hidden_size`` beyond the arch block: zaya) needs
    only a tensor there so named."""
    experts, d_model = int(vault.header["max_experts_per_layer"]), int(vault.header["d_model"])
    want = (experts, d_model)
    found: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    for name in sorted(src.scout, key=natural_key):
        split = split_layer(name)
        at = blocks.get(split[1], "") if split is not None else ""
        if split is not None and at and name.startswith(at) and _router_like(name[len(at) :]):
            found.setdefault(split[1], []).append((name, src.scout[name].shape))
    for layer in sorted(vault.layers()):
        block = blocks.get(layer)
        if block is None:
            continue
        near = found.get(layer, [])
        if any(tuple(shape) == want for _, shape in near) or (mlp_router and near):
            continue
        router = f"[{experts}, {d_model}] ({experts} experts per layer, d_model {d_model})"
        other = [
            (n, shape)
            for n, shape in near
            if len(shape) == 2
            and "shared" not in n[len(block) :]
            and "_proj" not in n[len(block) :]
        ]
        if other:
            name, shape = other[0]
            raise RefusedInput(
                f"{src.scout_path}: {name} is {list(shape)}, but a router of "
                f"{src.vault_path} is {router}: {_OTHER_MODEL}"
            )
        raise RefusedInput(
            f"{src.scout_path}: has no router for MoE layer {layer} (a 2-D tensor under "
            f"{block} whose name holds 'gate' or 'router', for {src.vault_path} "
            f"{router}): {_OTHER_MODEL}"
        )


def _check_scout(
    vault: Vault, src: _Sources, experts: dict[str, OutTensor], facts: dict[str, tuple[str, Any]]
) -> None:
    """Refuse a scout that belongs to another model, naming its tensor and the vault's
    value: the token embedding ``[vocab_size, d_model]``, a tensor of every one of the
    model's layers and of none beyond them (but the config's multi-token-prediction
    layers), and each MoE layer's router ``[experts per layer, d_model]`` where the experts
    written go (``facts``: what the config says, :func:`smoe.vault.contradictions.stated`)."""
    stem, blocks = _moe_blocks(experts)
    _check_embedding(vault, src, stem)
    count: int | None = facts.get("num_hidden_layers", ("", None))[1]
    model_type: str = facts.get("model_type", ("", ""))[1]
    if vault.arch is not None:
        count = int(vault.arch["num_hidden_layers"])
        model_type = model_type_str(vault.arch["model_type"])
    _check_layers(src, stem, count, facts.get("mtp_layers", ("", 0))[1])
    family = family_of(model_type) or generic(model_type)
    _check_routers(vault, src, blocks, "router_hidden_size" in family.beyond)


def _common_dtype(dtypes: dict[str, str]) -> str:
    """The experts' one dtype, or ``mixed``."""
    return dtypes[next(iter(dtypes))] if len(set(dtypes.values())) == 1 else "mixed"


@dataclass
class _ConfigFile:
    """The config.json to write: its bytes, where they came from (``copied`` or
    ``rebuilt``), the path of the copied (or looked-for) config, what a rebuild assumed,
    and what the config says of the vault's shapes (:func:`smoe.vault.contradictions.stated`)."""

    data: bytes
    origin: str
    path: Path
    assumed: list[str] = field(default_factory=list)
    facts: dict[str, tuple[str, Any]] = field(default_factory=dict)


def _config_file(
    vault: Vault,
    src: _Sources,
    config: str | os.PathLike | None,
    explicit: str | None,
    fallback: str,
    notes: list[str],
    rebuild_config: bool = False,
) -> _ConfigFile:
    """``config`` (default the one beside the vault) copied, its dtype set to ``explicit``
    (``--dtype``) if given and its ``quantization_config`` dropped for FP8 sources, and
    refused where it contradicts the vault
    (:func:`smoe.vault.contradictions.refuse_contradictions`);
    without one, or with ``rebuild_config``, rebuilt from the arch block and the scout for
    ``explicit`` or else ``fallback`` (noting what it assumed; refused for a family whose
    config cannot be rebuilt exactly unless ``rebuild_config``)."""
    vault_path = src.vault_path
    cfg_path = Path(config) if config is not None else companions(vault_path)[1]
    if not rebuild_config and (config is not None or os.path.lexists(cfg_path)):
        data, more = hf_config.copied(cfg_path, explicit, unquantised=bool(src.fp8_sources))
        scout_fp8 = _fp8_scout_tensor(src.scout) is not None
        hf_config.check_quantization(cfg_path, src.doc, src.manifest_path, scout_fp8)
        doc = parse_json(data, cfg_path)
        refuse_contradictions(doc, cfg_path, vault)
        notes += more
        return _ConfigFile(data, "copied", cfg_path, facts=stated(doc, cfg_path))
    cfg, assumed = hf_config.rebuild(vault, src.scout, explicit or fallback, inexact=rebuild_config)
    why = (
        "--rebuild-config"
        if rebuild_config
        else f"no {cfg_path.name} beside the vault, no --config"
    )
    notes.append(
        f"config.json rebuilt from {vault_path.name}'s arch block and the "
        f"scout's shapes ({why}); assumed: {', '.join(assumed)}"
    )
    return _ConfigFile(
        hf_config.json_bytes(cfg), "rebuilt", cfg_path, assumed, stated(cfg, cfg_path)
    )


def _write_checkpoint(
    vault: Vault,
    src: _Sources,
    plan: _Plan,
    config_bytes: bytes,
    out_dir: Path,
    inputs: list[Path],
    threads: int | None,
    replace: bool = False,
    notes: list[str] | None = None,
) -> list[str]:
    """Decode the experts in ``threads`` threads (default: the usable cores) while the
    folder is written and put in place; the names of the files written."""
    threads = usable_cores() if threads is None else threads
    decoder = _Decoder(vault, src.crcs, src.manifest_path, _expert_tasks(plan), threads)

    def write(tmp: Path) -> list[str]:
        with folder.Hashes(tmp) as hashes:  # each tensor hashed while the next is written
            files = _write_folder(tmp, plan, decoder, config_bytes, hashes)
            folder.write_marker(tmp, files, src.vault_path.name, hashes)
        return [*files, folder.MARKER]

    try:
        return _commit_folder(out_dir, write, inputs, replace, src.doc, notes)
    finally:
        decoder.close()


def _commit_folder(
    out_dir: Path,
    write: Callable[[Path], list[str]],
    inputs: list[Path],
    replace: bool = False,
    doc: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> list[str]:
    """Run ``write(tmp)`` in a temporary folder beside ``out_dir``, then rename it onto
    ``out_dir`` (``replace``: an earlier export there, checked again right before, is first
    moved aside, then only the files its marker lists are removed:
    :mod:`smoe.export.hf.folder`); under ``.<name>.lock``; the temporary folder is removed
    on any failure. An aside folder that keeps a file which appeared meanwhile is named in
    ``notes``."""
    parent = fileio.ensure_dir(out_dir.parent if str(out_dir.parent) else Path("."))
    with Lock(lock_for(parent / out_dir.name), out_dir):
        folder.sweep(out_dir)
        earlier = _refuse_outputs(out_dir, inputs, replace, doc)  # again, under the lock
        tmp = _make_tmp_dir(out_dir)
        try:
            files = write(tmp)
            fileio.fsync_dir(tmp)
            old = folder.move_aside(earlier) if earlier is not None else None
            try:
                fileio.rename(tmp, out_dir)
            except BaseException:
                if old is not None:
                    folder.put_back(old, out_dir)  # the earlier export back in place
                raise
        except BaseException:
            folder.remove_written(tmp)
            raise
        fileio.fsync_dir(parent)
        if old is not None and earlier is not None:
            left = folder.remove_earlier(old, earlier)
            if left and notes is not None:
                notes.append(
                    f"{old}: the earlier export, moved aside, is kept: it holds {left[0]!r}, "
                    "which appeared in it while this export ran"
                )
    return files
