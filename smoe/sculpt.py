"""The Sculptor: a HuggingFace MoE checkpoint -> ``<stem>.smoe`` + scout + manifest.

Pipeline: open the checkpoint (config + safetensors headers only) -> choose the experts
-> plan every offset -> workers quantise experts and write each blob at its planned
offset in a fixed-name partial file, the parent journals every finished expert -> stage
the scout (streamed tensor by tensor) -> write header, table, descriptors and arch block,
stage the manifest -> fsync all three -> rename scout, manifest, then the vault.

Nothing lost, nothing silently wrong:

* **One writer per target**: an exclusive lock on ``.<stem>.smoe.lock`` is held for the
  whole run (taken before the partial or journal is touched; the worker processes inherit
  it and die with the parent); a second run stops at once naming the holder's pid.
* **No link followed**: the partial (``.<stem>.smoe.partial``), the journal and the lock
  are opened with :func:`smoe.fileio.open_owned` (a symlink or foreign file there is
  refused, not followed, not deleted); the outputs are renamed onto their final names,
  never opened through them. No output may be one of the checkpoint's files.
* **Checked writes**: every write loops on short writes and every error (ENOSPC, EIO, ...)
  ends the run with one SmoeError line naming the file; the partial and the journal are
  removed (kept for ``--resume`` on KeyboardInterrupt only) and no output appears.
* **Commit order**: the vault's partial, the staged scout and the staged manifest are
  fsynced; the scout is renamed, then the manifest, then the vault LAST: the vault's
  appearance is the commit point. If a rename fails, the companions already renamed are
  removed again. A kill between two renames leaves the scout (and maybe the manifest)
  without a vault, plus the partial and the journal, so ``--resume`` completes the run.
  The journal is removed after the vault's rename.

``--resume`` decides by content. The journal ``.<stem>.smoe.journal`` is text::

    smoe-journal/2 <fingerprint>
    <layer> <expert> <blob crc32c> <gate, up, down source crc32c> <gate, up, down SNR dB>

one line per finished expert (SNR ``-`` when it has no finite value). The fingerprint
(SHA-256) covers the planned metadata, the options that shape the bytes, the tool
version and every source tensor's name, dtype, shape, place and shard name (no mtimes).
An expert is kept only if its blob's CRC-32C matches the partial file AND the CRC-32C of
its source bytes, re-read now, matches the journal; anything else is redone. A resumed
run is byte-identical to a clean one (vault, scout and manifest).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import multiprocessing as mp
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from smoe import __version__, fileio, quant
from smoe.atomic import AtomicFile, sweep_stale
from smoe.checkpoint import Checkpoint, ExpertRef
from smoe.errors import SmoeError
from smoe.manifest import checksum, path_for, tool_info
from smoe.plan import TENSOR_NAMES, ExpertSlot, Plan, make_plan
from smoe.records import metadata_bytes
from smoe.safetensors_io import DTYPE_SIZES, write_streaming
from smoe.writer import State, VaultWriter, encode_blob, expert_name
from smoe_gen import layout


@dataclass(frozen=True)
class SculptOptions:
    bits: int = layout.BITS_Q4
    version: int = layout.VERSION_MAX
    max_layers: int | None = None
    max_experts: int | None = None
    jobs: int | None = None
    """Worker processes; None: the usable cores. Never more than there are batches."""
    resume: bool = False
    dry_run: bool = False
    scale: str = "optimal"


@dataclass
class SculptResult:
    """What a sculpt did; ``summary()`` is what the CLI prints."""

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
        the checkpoint's, then one per tensor below the floor (or one line for many).
        """
        snr, exact = {}, 0
        for t, values in self.snr.items():
            finite = [v for v in values if _finite(v)]
            exact += len(values) - len(finite)
            snr[t] = ({"min": min(finite), "median": statistics.median(finite)} if finite
                      else None)
        floor = quant.SNR_FLOOR_DB.get(self.bits) if self.bits is not None else None
        mb_in = self.bytes_in / 1e6
        return {
            "vault": str(self.vault), "scout": str(self.scout),
            "experts_written": self.experts_written, "experts_resumed": self.experts_resumed,
            "expert_bytes_in": self.bytes_in, "vault_bytes": self.vault_bytes,
            "scout_bytes": self.scout_bytes,
            "compression_ratio": self.bytes_in / self.vault_bytes if self.vault_bytes else None,
            "seconds": self.seconds,
            "throughput_mb_s": mb_in / self.seconds if self.seconds > 0 else None,
            "snr_db": snr, "snr_exact": exact, "snr_floor_db": floor,
            "warnings": self.warnings + self.snr_warnings(),
        }

    def snr_warnings(self) -> list[str]:
        """Expert tensors whose SNR is below the floor for ``bits``, worst first when
        there are more than :attr:`SHOW_EACH` (then as one line with a count)."""
        floor = quant.SNR_FLOOR_DB.get(self.bits) if self.bits is not None else None
        if floor is None:
            return []
        low = []  # (snr, (layer, expert) or (i,), tensor ordinal, who, tensor name)
        for j, (t, values) in enumerate(self.snr.items()):
            for i, v in enumerate(values):
                if _finite(v) and v < floor:
                    key = self.snr_keys[i] if i < len(self.snr_keys) else None
                    who = f"layer {key[0]} expert {key[1]}" if key else f"expert #{i}"
                    low.append((v, key or (i,), j, who, t))
        below = f"the Q{self.bits} floor of {floor:g} dB"
        if len(low) <= self.SHOW_EACH:
            return [f"{who} {t}: SNR {v:.2f} dB is below {below}"
                    for v, _, _, who, t in sorted(low, key=lambda x: x[1:3])]
        worst = ", ".join(f"{who} {t} {v:.2f} dB"
                          for v, _, _, who, t in sorted(low)[: self.SHOW_EACH])
        return [f"{len(low)} expert tensors have an SNR below {below}; worst: {worst}"]


def _finite(v: float | None) -> bool:
    """A real SNR: not None, NaN or ±Inf."""
    return v is not None and float("-inf") < v < float("inf")


@dataclass(frozen=True)
class Paths:
    """Every file one sculpt touches in OUT_DIR."""

    vault: Path
    scout: Path
    manifest: Path
    partial: Path
    journal: Path
    lock: Path

    @classmethod
    def of(cls, model_dir: Path, out_dir: Path) -> Paths:
        vault, scout = outputs(model_dir, out_dir)
        hidden = out_dir / f".{vault.name}"
        return cls(vault, scout, path_for(vault), Path(f"{hidden}.partial"),
                   Path(f"{hidden}.journal"), Path(f"{hidden}.lock"))


def outputs(model_dir: Path, out_dir: Path) -> tuple[Path, Path]:
    stem = model_dir.resolve().name
    return out_dir / f"{stem}.smoe", out_dir / f"{stem}.scout.safetensors"


def select(ckpt: Checkpoint, opts: SculptOptions) -> list[ExpertRef]:
    """The experts to write: the first ``max_layers`` MoE layers, ``max_experts`` each."""
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


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_jobs(jobs: int | None) -> int:
    """``--jobs``: None means the usable cores; anything below 1 is refused."""
    if jobs is None:
        return usable_cores()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise SmoeError(f"--jobs: must be at least 1, got {jobs}")
    return jobs


def checkpoint_inputs(ckpt: Checkpoint) -> list[Path]:
    """Every file the checkpoint is read from: config, index (if any) and shards."""
    files = [ckpt.root / "config.json"]
    index = ckpt.root / "model.safetensors.index.json"
    if index.is_file():
        files.append(index)
    return files + sorted({t.path for t in ckpt.tensors.values()})


def provenance(ckpt: Checkpoint, opts: SculptOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest's ``tool`` and ``source``: no time stamps, no absolute paths."""
    tool = tool_info("sculpt", {"bits": opts.bits, "version": opts.version,
                                "scale": opts.scale, "max_layers": opts.max_layers,
                                "max_experts": opts.max_experts})
    files = []
    for shard in sorted({t.path for t in ckpt.tensors.values()}):
        try:
            size = shard.stat().st_size
        except OSError as e:
            raise SmoeError(f"{shard}: cannot read: {e.strerror or e}") from None
        files.append({"name": shard.relative_to(ckpt.root).as_posix(), "size": size})
    return tool, {"model_type": ckpt.model_type, "files": files}


def tensor_entries(ref: ExpertRef, src_crcs: Sequence[int],
                   snrs: Sequence[float | None]) -> list[dict[str, Any]]:
    """Per tensor provenance of one expert for the manifest (docs/MANIFEST.md)."""
    return [{"name": name, "source": info.name, "index": idx,
             "rows": None if rows is None else [rows.start, rows.stop],
             "source_crc32c": crc, "snr_db": snr}
            for name, (info, idx, rows), crc, snr in zip(TENSOR_NAMES, ref.sources, src_crcs,
                                                         snrs)]


# ---- one expert, in a worker or in-process -------------------------------------------------
@dataclass(frozen=True)
class Job:
    ref: ExpertRef
    slot: ExpertSlot
    bits: int
    scale: str


@dataclass(frozen=True)
class Target:
    """The partial file workers write into: its path, the name errors give, its identity."""

    partial: str
    name: str
    ident: tuple[int, int]  # st_dev, st_ino of the file the parent created


# key, blob crc32c, source crc32c per tensor, SNR per tensor, bytes in
Result = tuple[tuple[int, int], int, tuple[int, ...], list[float | None], int]
BATCH = 4  # experts per worker task: reads of the next overlap the current one's compute


def open_target(target: Target) -> int:
    """Open the parent's partial file for writing, never through a symlink."""
    flags = os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target.partial, flags)
    except OSError as e:
        raise SmoeError(f"{target.partial}: cannot open for writing: "
                        f"{e.strerror or e}") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != target.ident:
        os.close(fd)
        raise SmoeError(f"{target.partial}: was replaced by another file while sculpting; "
                        "refused")
    return fd


def load_expert(ref: ExpertRef) -> list:
    """An expert's three source matrices (raw stored bytes), read errors as SmoeError."""
    try:
        return ref.load()
    except OSError as e:
        where = e.filename or ref.sources[0][0].path
        raise SmoeError(f"{where}: cannot read {expert_name(ref.layer, ref.expert)}: "
                        f"{e.strerror or e}") from None


def source_crcs(mats: list) -> tuple[int, ...]:
    """CRC-32C of each source tensor's bytes as stored in the checkpoint."""
    return tuple(checksum(a) for a, _ in mats)


def quantise_expert(job: Job, fd: int, name: str, mats: list | None = None) -> Result:
    """Read (unless ``mats`` are given), quantise and write one expert blob into ``fd``."""
    if mats is None:
        mats = load_expert(job.ref)
    srcs = source_crcs(mats)  # the bytes as read, before anything else touches them
    stats = [quant.QuantStats() for _ in mats]  # SNR from the encoder's own pass, no decode
    blob = encode_blob(job.slot, [a for a, _ in mats], job.bits, job.scale,
                       [src for _, src in mats], stats)
    fileio.pwrite_all(fd, blob, job.slot.byte_offset, name)
    return ((job.ref.layer, job.ref.expert), checksum(blob), srcs,
            [s.finite_snr_db for s in stats], sum(a.nbytes for a, _ in mats))


def quantise_stream(todo: list[Job], target: Target) -> Iterator[Result]:
    """Quantise experts in order while a thread reads the next one (preadv drops the GIL)."""
    if not todo:
        return
    fd = open_target(target)
    try:
        with ThreadPoolExecutor(max_workers=1) as reader:
            ahead = reader.submit(load_expert, todo[0].ref)
            for i, job in enumerate(todo):
                mats = ahead.result()
                if i + 1 < len(todo):
                    ahead = reader.submit(load_expert, todo[i + 1].ref)
                yield quantise_expert(job, fd, target.name, mats)
    finally:
        os.close(fd)


def quantise_batch(task: tuple[list[Job], Target]) -> list[Result]:
    return list(quantise_stream(*task))


def _worker_init(parent: int) -> None:
    """Die with the parent: an orphan would keep the lock and write into a reused partial."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _make_pool(processes: int):
    """The worker pool (a seam: tests count the processes asked for)."""
    return mp.get_context("fork").Pool(processes=processes, initializer=_worker_init,
                                       initargs=(os.getpid(),))


def _run_jobs(todo: list[Job], jobs: int, target: Target) -> Iterator[Result]:
    """Results as experts finish; never more worker processes than batches of work."""
    batches = [todo[i : i + BATCH] for i in range(0, len(todo), BATCH)]
    workers = min(jobs, len(batches))
    if workers <= 1:
        yield from quantise_stream(todo, target)
        return
    with _make_pool(workers) as pool:  # leaving the block terminates the workers
        for results in pool.imap_unordered(quantise_batch, [(b, target) for b in batches],
                                           chunksize=1):
            yield from results


# ---- journal -----------------------------------------------------------------------------
JOURNAL_MAGIC = "smoe-journal/2"


@dataclass(frozen=True)
class Entry:
    """One journaled expert: blob CRC-32C, source CRC-32C and SNR per tensor."""

    blob: int
    sources: tuple[int, ...]
    snrs: tuple[float | None, ...]

    def line(self, key: tuple[int, int]) -> bytes:
        snrs = " ".join("-" if v is None else repr(float(v)) for v in self.snrs)
        crcs = " ".join(str(c) for c in self.sources)
        return f"{key[0]} {key[1]} {self.blob} {crcs} {snrs}\n".encode("ascii")


def fingerprint(ckpt: Checkpoint, refs: list[ExpertRef], meta: bytes, opts: SculptOptions) -> str:
    """Identifies one planned run by its inputs' layout and the outputs' shape (no mtimes)."""
    h = hashlib.sha256(f"{JOURNAL_MAGIC} smoe {__version__}\n".encode())
    h.update(meta)
    h.update(json.dumps({"scale": opts.scale, "bits": opts.bits,
                         "version": opts.version}).encode())
    for ref in refs:
        for info, idx, rows in ref.sources:
            shard = info.path.relative_to(ckpt.root).as_posix()
            h.update(f"{info.name}|{info.dtype}|{info.shape}|{info.offset}|{idx}|{rows}|"
                     f"{shard}\n".encode())
    return h.hexdigest()


def _parse_line(line: str) -> tuple[tuple[int, int], Entry] | None:
    parts = line.split(" ")
    if len(parts) != 9 or not all(p.isdigit() for p in parts[:6]):
        return None
    snrs = []
    for p in parts[6:]:
        try:
            snrs.append(None if p == "-" else float(p))
        except ValueError:
            return None
    nums = [int(p) for p in parts[:6]]
    return (nums[0], nums[1]), Entry(nums[2], tuple(nums[3:6]), tuple(snrs))


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


class SourceHasher:
    """CRC-32C of source byte ranges read through one reused buffer per thread (no arrays,
    no page faults of fresh allocations: the resume re-reads every source byte)."""

    CHUNK = 8 << 20

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def _fd(self, path: Path) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                try:
                    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                except OSError as e:
                    raise SmoeError(f"{path}: cannot open: {e.strerror or e}") from None
                self._fds[path] = fd
            return fd

    def crc(self, path: Path, offset: int, n: int) -> int:
        view = getattr(self._local, "view", None)
        if view is None:
            view = self._local.view = memoryview(bytearray(self.CHUNK))
        fd, value, done = self._fd(path), 0, 0
        while done < n:
            k = min(len(view), n - done)
            fileio.preadv_exact(fd, view[:k], offset + done, path)
            value = checksum(view[:k], value)
            done += k
        return value

    def expert(self, ref: ExpertRef) -> tuple[int, ...]:
        """The same values as :func:`source_crcs` of the loaded expert."""
        return tuple(self.crc(*r) for r in source_ranges(ref))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def source_ranges(ref: ExpertRef) -> list[tuple[Path, int, int]]:
    """(shard, offset, size) of the bytes each of an expert's matrices is read from."""
    out = []
    for info, idx, rows in ref.sources:
        item = DTYPE_SIZES[info.dtype]
        shape = info.shape if idx is None else info.shape[1:]
        row = math.prod(shape[1:]) * item
        start = info.offset + (0 if idx is None else idx * shape[0] * row)
        r0, r1 = (0, shape[0]) if rows is None else (rows.start, rows.stop)
        out.append((info.path, start + r0 * row, (r1 - r0) * row))
    return out


def keep_verified(writer: VaultWriter, refs: list[ExpertRef], done: dict[tuple[int, int], Entry],
                  threads: int) -> dict[tuple[int, int], Entry]:
    """Adopt each journaled blob whose bytes AND sources still match; the rest are redone.

    The sources are re-read and hashed (the cost of a resume), ``threads`` at a time.
    """
    by_key = {(r.layer, r.expert): r for r in refs}
    candidates = [k for k in sorted(done) if k in by_key
                  and writer.stored_crc(*k) == done[k].blob]
    hasher = SourceHasher()
    kept = {}
    try:
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            now = pool.map(hasher.expert, [by_key[k] for k in candidates])
            for key, crcs in zip(candidates, now):
                entry = done[key]
                if crcs == entry.sources:
                    writer.adopt(*key, entry.blob, tensor_entries(by_key[key], crcs, entry.snrs))
                    kept[key] = entry
    finally:
        hasher.close()
    return kept


# ---- the run -----------------------------------------------------------------------------
def dry_run_plan(ckpt: Checkpoint, plan: Plan, scout_bytes: int, refs: list[ExpertRef]) -> dict:
    per_layer: dict[int, int] = {}
    for ref in refs:
        per_layer[ref.layer] = per_layer.get(ref.layer, 0) + 1
    sizes = sorted({e.padded_size for e in plan.experts})
    return {
        "experts": len(plan.experts), "experts_per_layer": per_layer,
        "blob_padded_sizes": sizes, "blob_raw_sizes": sorted({e.raw_size for e in plan.experts}),
        "data_offset": plan.data_offset, "reserved_ext": plan.reserved_ext,
        "vault_bytes": plan.file_size, "scout_bytes": scout_bytes,
        "scout_tensors": len(ckpt.non_expert_tensors()),
    }


def sculpt(model_dir: str | Path, out_dir: str | Path, opts: SculptOptions,
           progress: Callable[[int, int, int], None] | None = None) -> SculptResult | dict:
    """Convert; returns a SculptResult, or the planned layout (a dict) with ``dry_run``.

    ``progress(done, total, bytes_in)`` is called after every expert.
    """
    t0 = time.perf_counter()
    jobs = resolve_jobs(opts.jobs)
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    ckpt = Checkpoint.open(model_dir)
    refs = select(ckpt, opts)
    model = ckpt.model_info()
    arch = ckpt.arch_info() if opts.version >= layout.VERSION_WITH_ARCH else None
    paths = Paths.of(model_dir, out_dir)
    inputs = checkpoint_inputs(ckpt)
    for out, what in ((paths.vault, "vault"), (paths.scout, "scout"),
                      (paths.manifest, "manifest"), (paths.partial, "partial file"),
                      (paths.journal, "journal"), (paths.lock, "lock file")):
        fileio.refuse_same_file(out, inputs, what)
    tool, source = provenance(ckpt, opts)
    writer = VaultWriter(paths.vault, model, bits=opts.bits, version=opts.version, arch=arch,
                         scale=opts.scale, partial=paths.partial, tool=tool, source=source)
    for ref in refs:
        writer.add_expert(ref.layer, ref.expert, ref.shapes)
    plan0 = make_plan({(r.layer, r.expert): r.shapes for r in refs}, opts.bits, opts.version)
    if opts.dry_run:
        scout_bytes = sum(t.nbytes for t in ckpt.non_expert_tensors())
        info = dry_run_plan(ckpt, plan0, scout_bytes, refs)
        info["arch"] = asdict(arch) if arch else None
        info["model"] = asdict(model)
        info["warnings"] = ckpt.warnings
        return info
    fileio.ensure_dir(out_dir)
    with fileio.Lock(paths.lock, paths.vault):
        for staged in (paths.scout, paths.manifest, paths.vault):
            sweep_stale(staged)  # temporary files of a killed run (the partial is kept)
        fp = fingerprint(ckpt, refs, metadata_bytes(plan0, model, arch), opts)
        return _sculpt_locked(ckpt, refs, writer, paths, fp, opts, jobs, progress, t0)


def _sculpt_locked(ckpt: Checkpoint, refs: list[ExpertRef], writer: VaultWriter, paths: Paths,
                   fp: str, opts: SculptOptions, jobs: int,
                   progress: Callable[[int, int, int], None] | None, t0: float) -> SculptResult:
    """The run proper, under the lock: see the module docstring for the protocol."""
    journal: Journal | None = None
    scout: AtomicFile | None = None
    try:
        journal = Journal(paths.journal)
        done = journal.read(fp) if opts.resume and os.path.lexists(paths.partial) else {}
        plan = writer.begin(keep=bool(done))
        kept = keep_verified(writer, refs, done, jobs) if done else {}
        journal.start(fp, kept)
        slots = {e.key: e for e in plan.experts}
        todo = [Job(ref, slots[(ref.layer, ref.expert)], opts.bits, opts.scale)
                for ref in refs if (ref.layer, ref.expert) not in kept]
        target = Target(str(writer.partial_path), str(paths.vault), writer.partial_identity)
        by_key = {(r.layer, r.expert): r for r in refs}
        snr: dict[str, list[float | None]] = {n: [] for n in TENSOR_NAMES}
        snr_keys: list[tuple[int, int]] = []
        bytes_in = 0
        n_done = len(kept)
        results = _run_jobs(todo, jobs, target)
        try:
            for key, crc, srcs, snrs, nbytes in results:
                writer.adopt(*key, crc, tensor_entries(by_key[key], srcs, snrs))
                journal.append(Entry(crc, srcs, tuple(snrs)).line(key))
                for name, value in zip(TENSOR_NAMES, snrs):
                    snr[name].append(value)
                snr_keys.append(key)
                bytes_in += nbytes
                n_done += 1
                if progress:
                    progress(n_done, len(refs), bytes_in)
        finally:
            results.close()  # stops the worker pool at once on an error
        scout_bytes, scout = write_streaming(paths.scout, ckpt.non_expert_tensors(),
                                             metadata={"format": "pt"}, stage=True)
        writer.commit([scout])
    except KeyboardInterrupt:
        writer.suspend()
        if scout is not None:
            scout.abort()
        if journal is not None:
            journal.close(remove=False)
        raise
    except BaseException:
        if scout is not None:
            scout.abort()
        if writer.state is not State.COMMITTED:
            writer.abort()
        if journal is not None:
            journal.close(remove=True)
        raise
    journal.close(remove=True)
    return SculptResult(paths.vault, paths.scout, len(todo), len(kept), bytes_in,
                        plan.file_size, scout_bytes, time.perf_counter() - t0, snr,
                        ckpt.warnings, snr_keys=snr_keys, bits=opts.bits)
