"""The Sculptor: a HuggingFace MoE checkpoint -> ``<stem>.smoe`` + scout + manifest + config.

Pipeline: open the checkpoint (config + safetensors headers only) -> choose the experts
-> plan every offset -> workers quantise experts and write each blob at its planned
offset in a fixed-name partial file, the parent journals every finished expert -> stage
the scout (streamed tensor by tensor) and a byte-for-byte copy of config.json -> write
header, table, descriptors and arch block, stage the manifest -> fsync all four -> rename
scout, config, manifest, then the vault.

Nothing lost, nothing silently wrong:

* **One writer per target**: an exclusive lock on ``.<stem>.smoe.lock`` is held for the
  whole run (taken before the partial or journal is touched; the worker processes inherit
  it and die with the parent); a second run stops at once naming the holder's pid.
* **No link followed**: the partial (``.<stem>.smoe.partial``), the journal and the lock
  are opened with :func:`smoe.plumbing.fileio.open_owned` (a symlink or foreign file there is
  refused, not followed, not deleted); the outputs are renamed onto their final names,
  never opened through them. No output may be one of the checkpoint's files.
* **Checked writes**: every write loops on short writes and every error (ENOSPC, EIO, ...)
  ends the run with one SmoeError line naming the file; the partial and the journal are
  removed (kept for ``--resume`` on KeyboardInterrupt only) and no output appears.
* **Commit order**: the vault's partial, the staged scout, config copy and manifest are
  fsynced; the scout is renamed, then the config copy, then the manifest, then the vault
  LAST: the vault's appearance is the commit point. If a rename fails, the companions
  already renamed are removed again. A kill between two renames leaves some companions
  without a vault, plus the partial and the journal, so ``--resume`` completes the run.
  A config.json that changed since the checkpoint was opened is refused at the commit.
  The journal is removed after the vault's rename.

``--resume`` decides by content. The journal ``.<stem>.smoe.journal`` is text::

    smoe-journal/2 <fingerprint>
    <layer> <expert> <blob crc32c> <gate, up, down source crc32c> <gate, up, down SNR dB>

one line per finished expert (SNR ``-`` when it has no finite value; with ``--imatrix``
three more fields, the importance-weighted SNR of gate, up, down). The fingerprint
(SHA-256) covers the planned metadata, the options that shape the bytes (and the
importance matrix's SHA-256), the tool version and every source tensor's name, dtype,
shape, place and shard name (no mtimes).
An expert is kept only if its blob's CRC-32C matches the partial file AND the CRC-32C of
its source bytes, re-read now, matches the journal; anything else is redone. A resumed
run is byte-identical to a clean one (vault, scout, config copy and manifest).

``--imatrix FILE`` (a llama.cpp importance matrix, :mod:`smoe.sculpt.source.imatrix`): opened and
mapped onto the chosen experts before any work (a file of another model is refused; the expert
tensors it has no data for are quantised unweighted, named in one warning); each worker
reads its expert's per-column importance and the encoder minimises the error weighted by
it (:func:`smoe.quant.encode`). The summary and the manifest record the file (hashes,
datasets, chunk count) and per tensor the importance-weighted SNR beside the plain one.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import json
import multiprocessing as mp
import os
import pickle
import signal
import statistics
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, cast

from smoe import __version__, quant
from smoe.errors import SmoeError
from smoe.families.config import config_object, parse_json, read_small
from smoe.format.manifest import checksum, path_for, tool_info
from smoe.format.plan import TENSOR_NAMES, ExpertSlot, Plan, Shape, make_plan
from smoe.format.records import ModelInfo, metadata_bytes
from smoe.interop.safetensors_io import write_streaming
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile, sweep_stale
from smoe.plumbing.cpus import usable_cores
from smoe.sculpt.blob_writer import BlobWriter
from smoe.sculpt.expert_reader import ExpertReader
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef
from smoe.sculpt.source.hub import output_stem
from smoe.vault.companions import companions
from smoe.vault.writer import State, VaultWriter, encode_blob
from smoe_gen import layout

if TYPE_CHECKING:
    import numpy as np

    from smoe.sculpt.source.imatrix import ImportanceMatrix

__all__ = [
    "Paths",
    "SculptOptions",
    "SculptResult",
    "companions",
    "outputs",
    "sculpt",
    "select",
]


@dataclass(frozen=True)
class SculptOptions:
    """What :func:`sculpt` makes: bit width, format version, which experts, how many
    worker processes, resume, scale choice, output name, importance matrix.

    >>> SculptOptions(bits=2, max_layers=1, jobs=2).bits
    2
    """

    bits: int = layout.BITS_Q4
    version: int = layout.VERSION_MAX
    max_layers: int | None = None
    max_experts: int | None = None
    jobs: int | None = None
    """Worker processes; None: the usable cores. Never more than there are batches."""
    resume: bool = False
    dry_run: bool = False
    scale: str = "optimal"
    name: str | None = None
    """The outputs' stem (``<name>.smoe``, ...); None: the model folder's name."""
    imatrix: str | Path | None = None
    """A llama.cpp importance matrix (GGUF or legacy ``.dat``): ``optimal`` scales minimise
    the error weighted by each input channel's mean square; None: the plain error."""


@dataclass
class SculptResult:
    """What a sculpt did; ``summary()`` is what the CLI prints.

    >>> import tempfile
    >>> res = sculpt("fixtures/checkpoints/qwen3_moe", tempfile.mkdtemp(), SculptOptions(jobs=1))
    >>> res.vault.name, res.experts_written, res.bytes_in, res.vault_bytes
    ('qwen3_moe.smoe', 16, 294912, 278528)
    """

    vault: Path
    scout: Path
    experts_written: int
    experts_resumed: int
    bytes_in: int
    vault_bytes: int
    scout_bytes: int
    seconds: float
    snr: dict[str, list[float | None]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    snr_keys: list[tuple[int, int]] = field(default_factory=list)
    """(layer, expert) of the i-th value of every list in ``snr``."""
    bits: int | None = None
    """Bit width of the run: selects ``quant.SNR_FLOOR_DB`` (no SNR warnings if None)."""
    weighted_snr: dict[str, list[float | None]] | None = None
    """With an importance matrix: per tensor name, the importance-weighted SNR of every
    expert written (as ``snr``; None for a tensor quantised unweighted)."""
    imatrix: dict[str, Any] | None = None
    """The importance matrix used (``ImatrixInfo.as_json()``), or None."""
    config: Path | None = None
    """The copy of the model's config.json committed beside the vault."""
    phases: dict[str, float] | None = None
    """Seconds of ``setup`` (checkpoint, plan, resume checks, compiled kernels loaded),
    ``experts`` (reading, quantising and writing them) and ``commit`` (scout, fsyncs,
    renames); together ``seconds``."""

    SHOW_EACH = 3
    """Up to this many low-SNR tensors get a warning line each; more collapse into one."""

    def summary(self) -> dict:
        """The CLI's summary; JSON-safe (RFC 8259: no NaN or Infinity anywhere).

        ``snr_db``: per tensor name, ``{"min", "median"}`` in dB over the experts written,
        or ``None`` when none has a finite SNR. ``snr_exact``: how many expert tensors
        have no finite SNR (``QuantStats.finite_snr_db`` is ``None``, or a value is
        NaN/±Inf: encoded exactly up to a constant offset, e.g. all zeros, or constant);
        they are left out of min/median.
        ``snr_floor_db``: the bit width's floor (``quant.SNR_FLOOR_DB``); ``warnings``:
        the checkpoint's (and the importance matrix's), then one per tensor below the floor
        (or one line for many; the importance-weighted SNR where there is one).
        ``phases_s``: seconds of setup, experts and commit (see :attr:`phases`).
        ``imatrix``: the importance matrix used (path, format, size, CRC-32C, SHA-256,
        datasets, chunk count and size, entries) or None; ``weighted_snr_db``: with it, per
        tensor name ``{"min", "median"}`` of the importance-weighted SNR (the expected SNR of
        the output ``W x``), or None.

        >>> res = SculptResult(Path("m.smoe"), Path("m.scout.safetensors"), 2, 0, 4096, 2048,
        ...                    64, 0.5, {"gate_proj": [6.5, float("nan")]}, bits=4)
        >>> s = res.summary()
        >>> s["compression_ratio"], s["throughput_mb_s"], s["snr_db"], s["snr_exact"]
        (2.0, 0.008192, {'gate_proj': {'min': 6.5, 'median': 6.5}}, 1)
        >>> s["warnings"]
        ['expert #0 gate_proj: SNR 6.50 dB is below the Q4 floor of 10 dB']
        """
        snr, exact = {}, 0
        for t, values in self.snr.items():
            finite = [v for v in values if _finite(v)]
            exact += len(values) - len(finite)
            snr[t] = _spread(finite)
        weighted = None
        if self.weighted_snr is not None:
            weighted = {
                t: _spread([v for v in values if _finite(v)])
                for t, values in self.weighted_snr.items()
            }
        floor = quant.SNR_FLOOR_DB.get(self.bits) if self.bits is not None else None
        mb_in = self.bytes_in / 1e6
        return {
            "vault": str(self.vault),
            "scout": str(self.scout),
            "config": None if self.config is None else str(self.config),
            "experts_written": self.experts_written,
            "experts_resumed": self.experts_resumed,
            "expert_bytes_in": self.bytes_in,
            "vault_bytes": self.vault_bytes,
            "scout_bytes": self.scout_bytes,
            "compression_ratio": self.bytes_in / self.vault_bytes if self.vault_bytes else None,
            "seconds": self.seconds,
            "phases_s": self.phases,
            "throughput_mb_s": mb_in / self.seconds if self.seconds > 0 else None,
            "snr_db": snr,
            "snr_exact": exact,
            "snr_floor_db": floor,
            "imatrix": self.imatrix,
            "weighted_snr_db": weighted,
            "warnings": self.warnings + self.snr_warnings(),
        }

    def snr_warnings(self) -> list[str]:
        """Expert tensors whose SNR is below the floor for ``bits``, worst first when
        there are more than :attr:`SHOW_EACH` (then as one line with a count). A tensor
        quantised with importance is judged by its importance-weighted SNR: weighting
        lowers the plain one on purpose.

        >>> res = SculptResult(Path("m.smoe"), Path("s"), 1, 0, 1, 1, 1, 1.0,
        ...                    {"up_proj": [7.25]}, snr_keys=[(3, 5)], bits=2)
        >>> res.snr_warnings()
        []
        >>> SculptResult(Path("m.smoe"), Path("s"), 1, 0, 1, 1, 1, 1.0, {"up_proj": [7.25]},
        ...              snr_keys=[(3, 5)], bits=4).snr_warnings()
        ['layer 3 expert 5 up_proj: SNR 7.25 dB is below the Q4 floor of 10 dB']
        """
        floor = quant.SNR_FLOOR_DB.get(self.bits) if self.bits is not None else None
        if floor is None:
            return []
        low = []  # (snr, (layer, expert) or (i,), tensor ordinal, who, tensor name, weighted)
        for j, (t, values) in enumerate(self.snr.items()):
            wvalues = (self.weighted_snr or {}).get(t, [])
            for i, v in enumerate(values):
                w = wvalues[i] if i < len(wvalues) else None
                weighted = _finite(w)
                v = w if weighted else v
                if _finite(v) and v < floor:
                    key = self.snr_keys[i] if i < len(self.snr_keys) else None
                    who = f"layer {key[0]} expert {key[1]}" if key else f"expert #{i}"
                    low.append((v, key or (i,), j, who, t, weighted))
        below = f"the Q{self.bits} floor of {floor:g} dB"
        if len(low) <= self.SHOW_EACH:
            return [
                f"{who} {t}: {'importance-weighted ' if w else ''}SNR {v:.2f} dB is below {below}"
                for v, _, _, who, t, w in sorted(low, key=lambda x: x[1:3])
            ]
        worst = ", ".join(
            f"{who} {t} {v:.2f} dB" for v, _, _, who, t, _ in sorted(low)[: self.SHOW_EACH]
        )
        how = " (importance-weighted where an imatrix applies)" if self.weighted_snr else ""
        return [f"{len(low)} expert tensors have an SNR{how} below {below}; worst: {worst}"]


def _finite(v: float | None) -> TypeGuard[float]:
    """A real SNR: not None, NaN or ±Inf."""
    return v is not None and float("-inf") < v < float("inf")


def _spread(values: list[float]) -> dict[str, float] | None:
    """``{"min", "median"}`` of finite values, or None when there are none."""
    return {"min": min(values), "median": statistics.median(values)} if values else None


@dataclass(frozen=True)
class Paths:
    """Every file one sculpt touches in OUT_DIR.

    >>> p = Paths.of(Path("models/qwen3_moe"), Path("out"))
    >>> [str(x) for x in (p.vault, p.partial, p.journal)]
    ['out/qwen3_moe.smoe', 'out/.qwen3_moe.smoe.partial', 'out/.qwen3_moe.smoe.journal']
    """

    vault: Path
    scout: Path
    manifest: Path
    config: Path
    partial: Path
    journal: Path
    lock: Path

    @classmethod
    def of(cls, model_dir: Path, out_dir: Path, name: str | None = None) -> Paths:
        """The paths for ``model_dir`` converted into ``out_dir`` (``name``: the stem).

        >>> str(Paths.of(Path("models/qwen3_moe"), Path("out"), "q4").manifest)
        'out/q4.smoe.manifest.json'
        """
        vault, scout = outputs(model_dir, out_dir, name)
        hidden = out_dir / f".{vault.name}"
        return cls(
            vault,
            scout,
            path_for(vault),
            companions(vault)[1],
            Path(f"{hidden}.partial"),
            Path(f"{hidden}.journal"),
            Path(f"{hidden}.lock"),
        )


def outputs(model_dir: Path, out_dir: Path, name: str | None = None) -> tuple[Path, Path]:
    """The vault and the scout: ``<stem>.smoe`` and ``<stem>.scout.safetensors``, the stem
    being ``name`` (a plain file name stem, else refused) or the model's name (the folder's,
    or ``NAME`` for a HuggingFace cache snapshot ``models--ORG--NAME/snapshots/<hash>``).

    >>> [p.name for p in outputs(Path("fixtures/checkpoints/qwen3_moe"), Path("out"))]
    ['qwen3_moe.smoe', 'qwen3_moe.scout.safetensors']
    """
    vault = out_dir / f"{output_stem(model_dir, name)}.smoe"
    return vault, companions(vault)[0]


def select(ckpt: Checkpoint, opts: SculptOptions) -> list[ExpertRef]:
    """The experts to write: the first ``max_layers`` MoE layers, ``max_experts`` each.

    >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
    >>> [(r.layer, r.expert) for r in select(ck, SculptOptions(max_layers=1, max_experts=2))]
    [(0, 0), (0, 1)]
    """
    for name in ("max_layers", "max_experts"):
        value = getattr(opts, name)
        if value is not None and value < 1:
            raise SmoeError(f"--{name.replace('_', '-')}: must be at least 1, got {value}")
    layers = ckpt.moe_layers[: opts.max_layers]
    out = []
    for lay in layers:
        for e in ckpt.layer_experts(lay)[: opts.max_experts]:
            out.append(ckpt.experts[(lay, e)])
    return out


def resolve_jobs(jobs: int | None) -> int:
    """``--jobs``: None means the usable cores; anything below 1 is refused."""
    if jobs is None:
        return usable_cores()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise SmoeError(f"--jobs: must be at least 1, got {jobs}")
    return jobs


def stage_config(ckpt: Checkpoint, path: Path) -> AtomicFile:
    """The checkpoint's config.json, byte for byte, staged as ``path`` (committed with the
    vault; ``smoe export --hf`` copies it). A config.json that no longer says what it said
    when the checkpoint was opened is refused.

    >>> import os, tempfile
    >>> from smoe.sculpt.source.checkpoint import Checkpoint
    >>> ckpt = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
    >>> staged = stage_config(ckpt, Path(tempfile.mkdtemp()) / "qwen3_moe.config.json")
    >>> _ = staged.commit()
    >>> staged.path.read_bytes() == (ckpt.root / "config.json").read_bytes()
    True
    """
    src = ckpt.root / "config.json"
    raw = read_small(src)
    if config_object(parse_json(raw, src), src) != ckpt.config:
        raise SmoeError(f"{src}: changed while sculpting; refused")
    staged = AtomicFile(path)
    try:
        staged.pwrite(raw, 0)
    except BaseException:
        staged.abort()
        raise
    return staged


def checkpoint_inputs(ckpt: Checkpoint) -> list[Path]:
    """Every file the checkpoint is read from: config, index (if any) and shards."""
    files = [ckpt.root / "config.json"]
    index = ckpt.root / "model.safetensors.index.json"
    if index.is_file():
        files.append(index)
    return files + sorted({t.path for t in ckpt.tensors.values()})


def provenance(
    ckpt: Checkpoint, opts: SculptOptions, imatrix: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest's ``tool`` and ``source``: no time stamps, no absolute paths
    (``imatrix``: the importance matrix's record, kept in ``source`` by file name)."""
    tool = tool_info(
        "sculpt",
        {
            "bits": opts.bits,
            "version": opts.version,
            "scale": opts.scale,
            "max_layers": opts.max_layers,
            "max_experts": opts.max_experts,
        },
    )
    files = []
    for shard in sorted({t.path for t in ckpt.tensors.values()}):
        try:
            size = shard.stat().st_size
        except OSError as e:
            raise SmoeError(f"{shard}: cannot read: {e.strerror or e}") from None
        files.append({"name": shard.relative_to(ckpt.root).as_posix(), "size": size})
    source: dict[str, Any] = {"model_type": ckpt.model_type, "files": files}
    if imatrix is not None:
        record = dict(imatrix)
        record["name"] = Path(record.pop("path")).name
        source["imatrix"] = record
    return tool, source


def open_imatrix(
    path: str | Path, refs: list[ExpertRef], n_experts: int
) -> tuple[ImportanceMatrix, str | None]:
    """The importance matrix at ``path``, opened, validated and mapped onto ``refs`` before
    any work (a file of another model is refused, one SmoeError line), and the one warning
    about the expert tensors it has no data for (quantised unweighted), or None."""
    from smoe.sculpt.source.imatrix import ImportanceMatrix

    matrix = ImportanceMatrix.open(path)
    try:
        fallbacks = matrix.check([(r.layer, r.expert, r.shapes) for r in refs], n_experts)
    except BaseException:
        matrix.close()
        raise
    return matrix, matrix.fallback_warning(fallbacks, len(TENSOR_NAMES) * len(refs))


def tensor_entries(
    ref: ExpertRef,
    src_crcs: Sequence[int],
    snrs: Sequence[float | None],
    weighted: Sequence[float | None] | None = None,
) -> list[dict[str, Any]]:
    """Per tensor provenance of one expert for the manifest (docs/MANIFEST.md); with
    ``weighted`` (a run with an importance matrix) also ``weighted_snr_db``."""
    out = [
        {
            "name": name,
            "source": info.name,
            "index": idx,
            "rows": None if rows is None else [rows.start, rows.stop],
            "source_crc32c": crc,
            "snr_db": snr,
        }
        for name, (info, idx, rows), crc, snr in zip(TENSOR_NAMES, ref.sources, src_crcs, snrs)
    ]
    if weighted is not None:
        for entry, value in zip(out, weighted):
            entry["weighted_snr_db"] = None if not _finite(value) else round(float(value), 4)
    return out


# ---- one expert, in a worker or in-process -------------------------------------------------
@dataclass(frozen=True)
class Job:
    ref: ExpertRef
    slot: ExpertSlot
    bits: int
    scale: str
    imatrix: ImportanceMatrix | None = None
    """Read for this expert's importance (positioned reads: a forked worker shares it)."""


@dataclass(frozen=True)
class Target:
    """The partial file workers write into: its path, the name errors give, its identity."""

    partial: str
    name: str
    ident: tuple[int, int]  # st_dev, st_ino of the file the parent created


# key, blob crc32c, source crc32c per tensor, SNR and weighted SNR per tensor, bytes in
Result = tuple[tuple[int, int], int, tuple[int, ...], list[float | None], list[float | None], int]
BATCH = 4  # no worker process is started for fewer experts than this


def open_target(target: Target) -> int:
    """Open the parent's partial file for writing, never through a symlink."""
    flags = os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target.partial, flags)
    except OSError as e:
        raise SmoeError(f"{target.partial}: cannot open for writing: {e.strerror or e}") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != target.ident:
        os.close(fd)
        raise SmoeError(f"{target.partial}: was replaced by another file while sculpting; refused")
    return fd


def file_order(todo: list[Job]) -> list[Job]:
    """Jobs in the order their bytes lie in the checkpoint (shard, offset), so that reads
    move forward through each shard as the kernel's read-ahead expects. Every blob still
    goes to its planned offset: the output does not depend on this order."""
    return sorted(todo, key=lambda job: min((str(p), o) for p, o, _ in job.ref.ranges()))


def quantise_expert(job: Job, mats: list, srcs: tuple[int, ...], out: np.ndarray) -> Result:
    """Quantise one expert's matrices (``srcs``: their CRC-32C, as read) into its blob in
    ``out`` (``uint8``, the blob's size; see :func:`encode_blob`), with an importance
    matrix weighted by it; the result to report once ``out`` is written at
    ``job.slot.byte_offset``."""
    stats = [quant.QuantStats() for _ in mats]  # SNR from the encoder's own pass, no decode
    importance = None
    if job.imatrix is not None:
        importance = [
            job.imatrix.for_expert(job.ref.layer, job.ref.expert, t, cols, rows)
            for t, (rows, cols) in zip(TENSOR_NAMES, job.ref.shapes)
        ]
    encode_blob(
        job.slot,
        [a for a, _ in mats],
        job.bits,
        job.scale,
        [src for _, src in mats],
        stats,
        importance,
        out=out,
    )
    return (
        (job.ref.layer, job.ref.expert),
        checksum(out),
        srcs,
        [s.finite_snr_db for s in stats],
        [s.weighted_snr_db for s in stats],
        sum(a.nbytes for a, _ in mats),
    )


class Claims:
    """Hands out the indices ``0 .. n - 1`` once each, to one process or, through a counter
    in shared memory, to several."""

    def __init__(self, n: int, counter: Any = None) -> None:
        self.n = n
        self.counter = counter if counter is not None else mp.get_context("fork").Value("q", 0)

    def __call__(self) -> int | None:
        with self.counter.get_lock():
            i = self.counter.value
            if i >= self.n:
                return None
            self.counter.value = i + 1
        return i


def quantise_stream(
    todo: Sequence[Job], claims: Claims, target: Target, reader: ExpertReader
) -> Iterator[Result]:
    """Quantise the jobs ``claims`` hands out while one thread claims the next one and
    reads and hashes its sources into the reader's other buffer (preadv and CRC-32C drop
    the GIL) and another writes the previous blob (:class:`BlobWriter`, with
    ``O_DIRECT`` where it can), so reading and writing never wait for quantising nor the
    other way round. Each result comes once its blob is written."""

    def fetch(slot: int) -> tuple[Job, list, tuple[int, ...], bool] | None:
        i = claims()
        if i is None:
            return None
        reader.hint(todo[i].ref)  # the whole expert at once: a deeper queue than chunk by chunk
        before = reader.direct_reads
        mats, crcs = reader.read(todo[i].ref, slot)
        return todo[i], mats, crcs, reader.direct_reads > before

    fd = open_target(target)
    try:
        again = open_target(target)
    except BaseException:
        os.close(fd)
        raise
    direct = again if fileio.direct_io(again) else None
    if direct is None:
        os.close(again)
    with BlobWriter[Result](fd, target.name, direct) as out:
        with ThreadPoolExecutor(max_workers=1) as pool:
            ahead, slot = pool.submit(fetch, 0), 0
            while (got := ahead.result()) is not None:
                slot ^= 1  # the other buffer: the expert being quantised stays untouched
                ahead = pool.submit(fetch, slot)
                job, blob = got[0], out.buffer(got[0].slot.raw_size)
                result = quantise_expert(job, got[1], got[2], blob)
                yield from out.write(blob, job.slot.byte_offset, result, direct=not got[3])
        yield from out.drain()


def _worker_init(parent: int) -> None:
    """Die with the parent: an orphan would keep the lock and write into a reused partial.
    Ctrl-C is the parent's to handle: it stops the workers."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _worker_main(
    parent: int, todo: list[Job], claims: Claims, target: Target, conn: Connection
) -> None:
    """A worker process: take the next unclaimed job until none is left, send each result
    (or the exception that stopped it) to the parent, exit."""
    _worker_init(parent)
    code = 0
    try:
        with ExpertReader() as reader:
            for result in quantise_stream(todo, claims, target, reader):
                conn.send(result)
    except BaseException as e:  # every failure goes to the parent, as one line
        code = 1
        with contextlib.suppress(BaseException):
            conn.send(_portable(e))
    finally:
        conn.close()
    os._exit(code)  # no atexit handlers, no flushing of the parent's inherited buffers


def _portable(e: BaseException) -> BaseException:
    """``e`` if it survives pickling (the parent raises it as it is), else a SmoeError
    with its text."""
    try:
        pickle.loads(pickle.dumps(e))
    except Exception:
        return SmoeError(f"{type(e).__name__}: {e}")
    return e


class Workers:
    """``processes`` forked worker processes quantising one list of jobs.

    Each worker claims the next job from a shared counter (the list is in file order), and
    its reader thread reads the job after the current one while it quantises and its writer
    thread writes the blob before (:func:`quantise_stream`), so every worker reads and
    quantises without pause until the list is done; results come back one per expert, once
    its blob is written, over a pipe per worker. A worker that fails sends its exception, which is
    raised here; one that dies is an error. Leaving the block kills any worker left.
    """

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._procs: list[Any] = []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join()

    def run(self, todo: list[Job], target: Target) -> Generator[Result, None, None]:
        ctx = mp.get_context("fork")
        claims = Claims(len(todo), ctx.Value("q", 0))
        live: dict[Connection, Any] = {}
        for _ in range(self.processes):
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_worker_main, daemon=True, args=(os.getpid(), todo, claims, target, send)
            )
            proc.start()
            send.close()  # only the worker holds the sending end: EOF when it exits
            self._procs.append(proc)
            live[recv] = proc
        remaining = len(todo)
        while remaining:
            if not live:
                raise SmoeError(f"sculpt: the workers stopped with {remaining} experts left")
            for conn in cast("list[Connection]", wait(list(live))):  # those it was given
                try:
                    item = conn.recv()
                except EOFError:
                    proc = live.pop(conn)
                    proc.join()
                    if proc.exitcode:
                        raise SmoeError(
                            f"sculpt: worker process {proc.pid} died ("
                            f"{_exit_reason(proc.exitcode)}); nothing was "
                            "committed"
                        ) from None
                    continue
                if isinstance(item, BaseException):
                    raise item
                remaining -= 1
                yield item


def _exit_reason(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"


def _make_pool(processes: int) -> Workers:
    """The worker processes (a seam: tests count the processes asked for)."""
    return Workers(processes)


@contextlib.contextmanager
def _no_collections() -> Iterator[None]:
    """No cyclic garbage collection inside the block: loading the compiled kernels (numba's
    import makes some 150,000 objects) otherwise spends about a tenth of its time in it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _run_jobs(
    todo: list[Job], jobs: int, target: Target, marks: dict[str, float] | None = None
) -> Generator[Result, None, None]:
    """Results as experts finish, in file order: in this process, or in up to ``jobs``
    worker processes, never more than there are batches of :data:`BATCH` experts.
    ``marks["experts"]``: when the work starts (compiled kernels loaded, workers forked).

    Every object alive once the kernels are loaded is frozen out of the collector for the
    run: forked workers never walk (and so never copy) the parent's heap, and the parent's
    own collections stay small; it is handed back when the run ends."""
    if not todo:
        return
    todo = file_order(todo)
    workers = min(jobs, -(-len(todo) // BATCH))
    weighted = any(job.imatrix is not None for job in todo)
    if workers > 1 or any(r * c >= quant.FAST_MIN_WEIGHTS for j in todo for r, c in j.ref.shapes):
        with _no_collections():
            for bits, scale in sorted({(job.bits, job.scale) for job in todo}):
                mode = cast("quant.ScaleMode", scale)  # an unknown scale: refused by encode_into
                quant.prepare_fast(bits, mode, importance=weighted)  # compiled once, inherited
    gc.freeze()
    try:
        yield from _start_jobs(todo, workers, target, marks)
    finally:
        gc.unfreeze()


def _start_jobs(
    todo: list[Job], workers: int, target: Target, marks: dict[str, float] | None
) -> Generator[Result, None, None]:
    """:func:`_run_jobs` once the kernels are loaded: the work itself."""
    if workers <= 1:
        with ExpertReader() as reader:
            if marks is not None:
                marks["experts"] = time.perf_counter()
            yield from quantise_stream(todo, Claims(len(todo)), target, reader)
        return
    with _make_pool(workers) as pool:
        results = pool.run(todo, target)
        if marks is not None:
            marks["experts"] = time.perf_counter()
        yield from results


# ---- journal -----------------------------------------------------------------------------
JOURNAL_MAGIC = "smoe-journal/2"


@dataclass(frozen=True)
class Entry:
    """One journaled expert: blob CRC-32C, source CRC-32C and SNR per tensor (and with an
    importance matrix, the weighted SNR per tensor)."""

    blob: int
    sources: tuple[int, ...]
    snrs: tuple[float | None, ...]
    weighted: tuple[float | None, ...] | None = None

    def line(self, key: tuple[int, int]) -> bytes:
        values = self.snrs + (self.weighted or ())
        snrs = " ".join("-" if v is None else repr(float(v)) for v in values)
        crcs = " ".join(str(c) for c in self.sources)
        return f"{key[0]} {key[1]} {self.blob} {crcs} {snrs}\n".encode("ascii")


def fingerprint(
    ckpt: Checkpoint,
    refs: list[ExpertRef],
    meta: bytes,
    opts: SculptOptions,
    imatrix_sha256: str | None = None,
) -> str:
    """Identifies one planned run by its inputs' layout and the outputs' shape (no mtimes),
    and the importance matrix's content."""
    h = hashlib.sha256(f"{JOURNAL_MAGIC} smoe {__version__}\n".encode())
    h.update(meta)
    shaping: dict[str, Any] = {"scale": opts.scale, "bits": opts.bits, "version": opts.version}
    if imatrix_sha256 is not None:
        shaping["imatrix"] = imatrix_sha256
    h.update(json.dumps(shaping).encode())
    for ref in refs:
        for info, idx, rows in ref.sources:
            shard = info.path.relative_to(ckpt.root).as_posix()
            h.update(
                f"{info.name}|{info.dtype}|{info.shape}|{info.offset}|{idx}|{rows}|"
                f"{shard}\n".encode()
            )
    return h.hexdigest()


def _parse_line(line: str) -> tuple[tuple[int, int], Entry] | None:
    parts = line.split(" ")
    if len(parts) not in (9, 12) or not all(p.isdigit() for p in parts[:6]):
        return None
    snrs: list[float | None] = []
    for p in parts[6:]:
        try:
            snrs.append(None if p == "-" else float(p))
        except ValueError:
            return None
    nums = [int(p) for p in parts[:6]]
    weighted = tuple(snrs[3:]) if len(snrs) == 6 else None
    return (nums[0], nums[1]), Entry(nums[2], tuple(nums[3:6]), tuple(snrs[:3]), weighted)


def read_journal(fd: int, path: Path, fp: str) -> dict[tuple[int, int], Entry]:
    """Finished experts, if the journal belongs to this very run (else nothing)."""
    try:
        size = os.fstat(fd).st_size
    except OSError as e:
        raise SmoeError(f"{path}: cannot read: {e.strerror or e}") from None
    text = fileio.pread_exact(fd, size, 0, path).decode("ascii", "replace")
    lines = text.split("\n")
    if not lines or lines[0] != f"{JOURNAL_MAGIC} {fp}":
        return {}
    done = {}
    for line in lines[1:-1]:  # the last element is "" or a torn line
        parsed = _parse_line(line)
        if parsed is not None:
            done[parsed[0]] = parsed[1]
    return done


class Journal:
    """The journal file, opened without following links; lines appended with checked writes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = fileio.open_owned(path)
        self.end = 0

    def read(self, fp: str) -> dict[tuple[int, int], Entry]:
        assert self.fd is not None
        return read_journal(self.fd, self.path, fp)

    def start(self, fp: str, kept: dict[tuple[int, int], Entry]) -> None:
        """Rewrite as this run's header plus the experts kept."""
        assert self.fd is not None
        fileio.truncate(self.fd, 0, self.path)
        self.end = 0
        self.append(f"{JOURNAL_MAGIC} {fp}\n".encode("ascii"))
        if kept:
            self.append(b"".join(e.line(k) for k, e in sorted(kept.items())))

    def append(self, data: bytes) -> None:
        assert self.fd is not None
        fileio.pwrite_all(self.fd, data, self.end, self.path)
        self.end += len(data)

    def close(self, remove: bool) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if remove:
            fileio.unlink_owned(self.path)


def keep_verified(
    writer: VaultWriter,
    refs: list[ExpertRef],
    done: dict[tuple[int, int], Entry],
    threads: int,
    weighted: bool = False,
) -> dict[tuple[int, int], Entry]:
    """Adopt each journaled blob whose bytes AND sources still match; the rest are redone.
    ``weighted``: the run has an importance matrix (its journal lines carry weighted SNRs).

    Blobs and sources are re-read and hashed (the cost of a resume) by ``threads`` threads,
    each through its own chunk-sized buffer, in file order.
    """
    by_key = {(r.layer, r.expert): r for r in refs}
    candidates = sorted(
        (k for k in done if k in by_key),
        key=lambda k: min((str(p), o) for p, o, _ in by_key[k].ranges()),
    )
    threads = max(1, min(threads, len(candidates)))

    def check(t: int) -> dict[tuple[int, int], tuple[int, ...]]:
        """Source CRC-32C of this thread's share of the candidates whose blob is intact."""
        return {
            k: reader.crcs(by_key[k], slot=t)
            for k in candidates[t::threads]
            if writer.stored_crc(*k) == done[k].blob
        }

    now: dict[tuple[int, int], tuple[int, ...]] = {}
    with ExpertReader(slots=threads) as reader, ThreadPoolExecutor(threads) as pool:
        for share in pool.map(check, range(threads)):
            now.update(share)
    kept = {}
    for key in sorted(now):
        entry = done[key]
        if now[key] == entry.sources and (entry.weighted is not None) == weighted:
            writer.adopt(
                *key, entry.blob, tensor_entries(by_key[key], now[key], entry.snrs, entry.weighted)
            )
            kept[key] = entry
    return kept


# ---- the run -----------------------------------------------------------------------------
def dry_run_plan(ckpt: Checkpoint, plan: Plan, scout_bytes: int, refs: list[ExpertRef]) -> dict:
    per_layer: dict[int, int] = {}
    for ref in refs:
        per_layer[ref.layer] = per_layer.get(ref.layer, 0) + 1
    sizes = sorted({e.padded_size for e in plan.experts})
    return {
        "experts": len(plan.experts),
        "experts_per_layer": per_layer,
        "blob_padded_sizes": sizes,
        "blob_raw_sizes": sorted({e.raw_size for e in plan.experts}),
        "data_offset": plan.data_offset,
        "reserved_ext": plan.reserved_ext,
        "vault_bytes": plan.file_size,
        "scout_bytes": scout_bytes,
        "scout_tensors": len(ckpt.non_expert_tensors()),
    }


def sculpt(
    model_dir: str | Path,
    out_dir: str | Path,
    opts: SculptOptions,
    progress: Callable[[int, int, int], None] | None = None,
) -> SculptResult | dict:
    """Convert; returns a SculptResult, or the planned layout (a dict) with ``dry_run``.

    ``progress(done, total, bytes_in)`` is called after every expert.

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> res = sculpt("fixtures/checkpoints/qwen3_moe", out, SculptOptions(bits=2, jobs=1))
    >>> sorted(p.name for p in Path(out).iterdir())  # doctest: +NORMALIZE_WHITESPACE
    ['qwen3_moe.config.json', 'qwen3_moe.scout.safetensors', 'qwen3_moe.smoe',
     'qwen3_moe.smoe.manifest.json']
    >>> plan = sculpt("fixtures/checkpoints/qwen3_moe", out, SculptOptions(dry_run=True))
    >>> plan["experts"], plan["vault_bytes"]
    (16, 278528)
    """
    t0 = time.perf_counter()
    jobs = resolve_jobs(opts.jobs)
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    ckpt = Checkpoint.open(model_dir)
    refs = select(ckpt, opts)
    model = ckpt.model_info()
    imatrix, imatrix_warning = None, None
    if opts.imatrix is not None:  # a wrong file is refused here, before anything is written
        imatrix, imatrix_warning = open_imatrix(opts.imatrix, refs, model.max_experts_per_layer)
    try:
        return _sculpt_checked(
            ckpt,
            refs,
            model,
            model_dir,
            out_dir,
            opts,
            jobs,
            imatrix,
            imatrix_warning,
            progress,
            t0,
        )
    finally:
        if imatrix is not None:
            imatrix.close()


def _sculpt_checked(
    ckpt: Checkpoint,
    refs: list[ExpertRef],
    model: ModelInfo,
    model_dir: Path,
    out_dir: Path,
    opts: SculptOptions,
    jobs: int,
    imatrix: ImportanceMatrix | None,
    imatrix_warning: str | None,
    progress: Callable[[int, int, int], None] | None,
    t0: float,
) -> SculptResult | dict:
    """:func:`sculpt` once the inputs are open and checked."""
    arch = ckpt.arch_info() if opts.version >= layout.VERSION_WITH_ARCH else None
    paths = Paths.of(model_dir, out_dir, opts.name)
    inputs = checkpoint_inputs(ckpt) + ([imatrix.path] if imatrix is not None else [])
    for out, what in (
        (paths.vault, "vault"),
        (paths.scout, "scout"),
        (paths.manifest, "manifest"),
        (paths.config, "config copy"),
        (paths.partial, "partial file"),
        (paths.journal, "journal"),
        (paths.lock, "lock file"),
    ):
        fileio.refuse_same_file(out, inputs, what)
    record = imatrix.info.as_json() if imatrix is not None else None
    tool, source = provenance(ckpt, opts, record)
    writer = VaultWriter(
        paths.vault,
        model,
        bits=opts.bits,
        version=opts.version,
        arch=arch,
        scale=opts.scale,
        partial=paths.partial,
        tool=tool,
        source=source,
    )
    for ref in refs:
        writer.add_expert(ref.layer, ref.expert, ref.shapes)
    shapes = {(r.layer, r.expert): cast("tuple[Shape, Shape, Shape]", r.shapes) for r in refs}
    plan0 = make_plan(shapes, opts.bits, opts.version)  # (an ExpertRef has three matrices)
    warnings = ckpt.warnings + ([imatrix_warning] if imatrix_warning else [])
    if opts.dry_run:
        scout_bytes = sum(t.nbytes for t in ckpt.non_expert_tensors())
        info = dry_run_plan(ckpt, plan0, scout_bytes, refs)
        info["arch"] = asdict(arch) if arch else None
        info["model"] = asdict(model)
        if record is not None:
            info["imatrix"] = record
        info["warnings"] = warnings
        return info
    fileio.ensure_dir(out_dir)
    with fileio.Lock(paths.lock, paths.vault):
        for staged in (paths.scout, paths.config, paths.manifest, paths.vault):
            sweep_stale(staged)  # temporary files of a killed run (the partial is kept)
        fp = fingerprint(
            ckpt,
            refs,
            metadata_bytes(plan0, model, arch),
            opts,
            imatrix.info.sha256 if imatrix is not None else None,
        )
        result = _sculpt_locked(ckpt, refs, writer, paths, fp, opts, jobs, progress, t0, imatrix)
    result.warnings = warnings
    result.imatrix = record
    return result


def _sculpt_locked(
    ckpt: Checkpoint,
    refs: list[ExpertRef],
    writer: VaultWriter,
    paths: Paths,
    fp: str,
    opts: SculptOptions,
    jobs: int,
    progress: Callable[[int, int, int], None] | None,
    t0: float,
    imatrix: ImportanceMatrix | None = None,
) -> SculptResult:
    """The run proper, under the lock: see the module docstring for the protocol."""
    journal: Journal | None = None
    scout: AtomicFile | None = None
    config: AtomicFile | None = None
    try:
        journal = Journal(paths.journal)
        done = journal.read(fp) if opts.resume and os.path.lexists(paths.partial) else {}
        plan = writer.begin(keep=bool(done))
        weighted = imatrix is not None
        kept = keep_verified(writer, refs, done, jobs, weighted) if done else {}
        journal.start(fp, kept)
        slots = {e.key: e for e in plan.experts}
        todo = [
            Job(ref, slots[(ref.layer, ref.expert)], opts.bits, opts.scale, imatrix)
            for ref in refs
            if (ref.layer, ref.expert) not in kept
        ]
        target = Target(str(writer.partial_path), str(paths.vault), writer.partial_identity)
        by_key = {(r.layer, r.expert): r for r in refs}
        snr: dict[str, list[float | None]] = {n: [] for n in TENSOR_NAMES}
        wsnr: dict[str, list[float | None]] = {n: [] for n in TENSOR_NAMES}
        snr_keys: list[tuple[int, int]] = []
        bytes_in = 0
        n_done = len(kept)
        marks: dict[str, float] = {}
        results = _run_jobs(todo, jobs, target, marks)
        try:
            for key, crc, srcs, snrs, wsnrs, nbytes in results:
                w = tuple(wsnrs) if weighted else None
                writer.adopt(*key, crc, tensor_entries(by_key[key], srcs, snrs, w))
                journal.append(Entry(crc, srcs, tuple(snrs), w).line(key))
                for name, value, wvalue in zip(TENSOR_NAMES, snrs, wsnrs):
                    snr[name].append(value)
                    wsnr[name].append(wvalue)
                snr_keys.append(key)
                bytes_in += nbytes
                n_done += 1
                if progress:
                    progress(n_done, len(refs), bytes_in)
        finally:
            results.close()  # stops the worker pool at once on an error
        marks["commit"] = time.perf_counter()
        scout_bytes, scout = write_streaming(
            paths.scout, ckpt.non_expert_tensors(), metadata={"format": "pt"}, stage=True
        )
        config = stage_config(ckpt, paths.config)
        writer.commit([scout, config])
    except KeyboardInterrupt:
        writer.suspend()
        for staged in (scout, config):
            if staged is not None:
                staged.abort()
        if journal is not None:
            journal.close(remove=False)
        raise
    except BaseException:
        for staged in (scout, config):
            if staged is not None:
                staged.abort()
        if writer.state is not State.COMMITTED:
            writer.abort()
        if journal is not None:
            journal.close(remove=True)
        raise
    journal.close(remove=True)
    end = time.perf_counter()
    start = marks.get("experts", marks["commit"])
    return SculptResult(
        paths.vault,
        paths.scout,
        len(todo),
        len(kept),
        bytes_in,
        plan.file_size,
        scout_bytes,
        end - t0,
        snr,
        ckpt.warnings,
        snr_keys=snr_keys,
        bits=opts.bits,
        weighted_snr=wsnr if weighted else None,
        config=paths.config,
        phases={
            "setup": start - t0,
            "experts": marks["commit"] - start,
            "commit": end - marks["commit"],
        },
    )
