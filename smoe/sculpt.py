"""The Sculptor: a HuggingFace MoE checkpoint -> ``<stem>.smoe`` + ``<stem>.scout.safetensors``.

Pipeline: open the checkpoint (config + safetensors headers only) -> choose the experts
-> plan every offset -> workers quantise experts and ``pwrite`` each blob at its planned
offset in a fixed-name partial file, the parent journals every finished expert -> write
the scout (streamed tensor by tensor) -> write header, table, descriptors and arch block
-> fsync -> rename both outputs onto their final names.

``--resume`` continues an interrupted run: the journal (``.<stem>.smoe.journal``) names
each finished expert with the CRC-32 of its blob; blobs whose CRC still matches are kept,
the rest are redone, and the result is byte-identical to an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import statistics
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from smoe import quant
from smoe.checkpoint import Checkpoint, ExpertRef
from smoe.errors import SmoeError
from smoe.plan import TENSOR_NAMES, ExpertSlot, Plan, make_plan
from smoe.records import metadata_bytes
from smoe.safetensors_io import write_streaming
from smoe.writer import VaultWriter, encode_blob
from smoe_gen import layout


@dataclass(frozen=True)
class SculptOptions:
    bits: int = layout.BITS_Q4
    version: int = layout.VERSION_MAX
    max_layers: int | None = None
    max_experts: int | None = None
    jobs: int = 1
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
    snr: dict[str, list[float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        snr = {t: {"min": min(v), "median": statistics.median(v)} if v else None
               for t, v in self.snr.items()}
        mb_in = self.bytes_in / 1e6
        return {
            "vault": str(self.vault), "scout": str(self.scout),
            "experts_written": self.experts_written, "experts_resumed": self.experts_resumed,
            "expert_bytes_in": self.bytes_in, "vault_bytes": self.vault_bytes,
            "scout_bytes": self.scout_bytes,
            "compression_ratio": self.bytes_in / self.vault_bytes if self.vault_bytes else None,
            "seconds": self.seconds,
            "throughput_mb_s": mb_in / self.seconds if self.seconds > 0 else None,
            "snr_db": snr, "warnings": self.warnings,
        }


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


# ---- one expert, in a worker or in-process -------------------------------------------------
_FDS: dict[str, int] = {}


def _partial_fd(path: str) -> int:
    fd = _FDS.get(path)
    if fd is None:
        fd = _FDS[path] = os.open(path, os.O_WRONLY)
    return fd


@dataclass(frozen=True)
class Job:
    ref: ExpertRef
    slot: ExpertSlot
    partial: str
    bits: int
    scale: str


Result = tuple[tuple[int, int], int, list[float], int]  # key, blob crc32, SNR per tensor, bytes in
BATCH = 4  # experts per worker task: reads of the next overlap the current one's compute


def quantise_expert(job: Job, mats: list | None = None) -> Result:
    """Read (unless ``mats`` are given), quantise and write one expert blob."""
    if mats is None:
        mats = job.ref.load()
    stats = [quant.QuantStats() for _ in mats]  # SNR from the encoder's own pass, no decode
    blob = encode_blob(job.slot, [a for a, _ in mats], job.bits, job.scale,
                       [src for _, src in mats], stats)
    os.pwrite(_partial_fd(job.partial), blob, job.slot.byte_offset)
    return ((job.ref.layer, job.ref.expert), zlib.crc32(blob), [s.snr_db for s in stats],
            sum(a.nbytes for a, _ in mats))


# ---- journal -----------------------------------------------------------------------------
def fingerprint(ckpt: Checkpoint, refs: list[ExpertRef], meta: bytes, opts: SculptOptions) -> str:
    """Identifies one planned run: inputs (names, dtypes, places, shard sizes) and outputs."""
    h = hashlib.sha256(meta)
    h.update(json.dumps({"scale": opts.scale, "bits": opts.bits}).encode())
    for ref in refs:
        for info, idx, rows in ref.sources:
            st = info.path.stat()
            h.update(f"{info.name}|{info.dtype}|{info.shape}|{info.offset}|{idx}|{rows}|"
                     f"{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def read_journal(path: Path, fp: str) -> dict[tuple[int, int], int]:
    """Finished experts -> blob CRC, if the journal belongs to this very run."""
    try:
        lines = path.read_text().split("\n")
    except OSError:
        return {}
    if not lines or lines[0] != f"smoe-journal {fp}":
        return {}
    done = {}
    for line in lines[1:-1]:  # the last element is "" or a torn line
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            done[(int(parts[0]), int(parts[1]))] = int(parts[2])
    return done


def blob_crc(fd: int, slot: ExpertSlot) -> int | None:
    data = os.pread(fd, slot.raw_size, slot.byte_offset)
    return zlib.crc32(data) if len(data) == slot.raw_size else None


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
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    ckpt = Checkpoint.open(model_dir)
    refs = select(ckpt, opts)
    model = ckpt.model_info()
    arch = ckpt.arch_info() if opts.version >= layout.VERSION_WITH_ARCH else None
    vault_path, scout_path = outputs(model_dir, out_dir)
    partial = out_dir / f".{vault_path.name}.partial"
    journal = out_dir / f".{vault_path.name}.journal"

    writer = VaultWriter(vault_path, model, bits=opts.bits, version=opts.version, arch=arch,
                         scale=opts.scale, partial=partial)
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

    out_dir.mkdir(parents=True, exist_ok=True)
    fp = fingerprint(ckpt, refs, metadata_bytes(plan0, model, arch), opts)
    done = read_journal(journal, fp) if opts.resume and partial.exists() else {}
    plan = writer.begin(keep=bool(done))
    slots = {e.key: e for e in plan.experts}
    if done:
        fd = os.open(partial, os.O_RDONLY)
        try:
            for key, crc in done.items():
                if key in slots and blob_crc(fd, slots[key]) == crc:
                    writer.adopt(*key)
        finally:
            os.close(fd)
    missing = set(writer.missing)
    resumed = len(slots) - len(missing)
    with journal.open("w") as jf:  # this run's header, plus the blobs kept
        jf.write(f"smoe-journal {fp}\n")
        for key in sorted(set(slots) - missing):
            jf.write(f"{key[0]} {key[1]} {done[key]}\n")
        jf.flush()
        os.fsync(jf.fileno())

    todo = [Job(ref, slots[(ref.layer, ref.expert)], str(writer.partial_path), opts.bits,
                opts.scale) for ref in refs if (ref.layer, ref.expert) in missing]
    snr: dict[str, list[float]] = {n: [] for n in TENSOR_NAMES}
    bytes_in = 0
    n_total = len(refs)
    n_done = resumed
    try:
        with journal.open("a") as jf:
            for key, crc, snrs, nbytes in _run_jobs(todo, opts.jobs):
                writer.adopt(*key)
                jf.write(f"{key[0]} {key[1]} {crc}\n")
                jf.flush()
                for name, value in zip(TENSOR_NAMES, snrs):
                    snr[name].append(value)
                bytes_in += nbytes
                n_done += 1
                if progress:
                    progress(n_done, n_total, bytes_in)
        scout_bytes = write_streaming(scout_path, ckpt.non_expert_tensors(),
                                      metadata={"format": "pt"})
        writer.commit()
    except KeyboardInterrupt:
        writer.suspend()
        raise
    except BaseException:
        writer.abort()
        journal.unlink(missing_ok=True)
        raise
    journal.unlink(missing_ok=True)
    return SculptResult(vault_path, scout_path, len(todo), resumed, bytes_in, plan.file_size,
                        scout_bytes, time.perf_counter() - t0, snr, ckpt.warnings)


def quantise_stream(todo: list[Job]) -> Iterator[Result]:
    """Quantise experts in order while a thread reads the next one (preadv drops the GIL)."""
    if not todo:
        return
    with ThreadPoolExecutor(max_workers=1) as reader:
        ahead = reader.submit(todo[0].ref.load)
        for i, job in enumerate(todo):
            mats = ahead.result()
            if i + 1 < len(todo):
                ahead = reader.submit(todo[i + 1].ref.load)
            yield quantise_expert(job, mats)


def quantise_batch(batch: list[Job]) -> list[Result]:
    return list(quantise_stream(batch))


def _run_jobs(todo: list[Job], jobs: int) -> Iterator[Result]:
    if jobs <= 1 or len(todo) <= 1:
        yield from quantise_stream(todo)
        return
    batches = [todo[i : i + BATCH] for i in range(0, len(todo), BATCH)]
    ctx = mp.get_context("fork")
    with ctx.Pool(processes=jobs) as pool:
        for results in pool.imap_unordered(quantise_batch, batches, chunksize=1):
            yield from results
