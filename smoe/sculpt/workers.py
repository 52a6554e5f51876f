"""The experts' work: each one read, quantised and written at its planned offset in the
partial file, in this process or in forked worker processes that claim the next expert
from a shared counter and send each result back over a pipe."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing as mp
import os
import pickle
import signal
import time
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, cast

from smoe import quant
from smoe.errors import SmoeError, WriteFailed
from smoe.format.manifest import checksum
from smoe.format.plan import ExpertSlot
from smoe.plumbing import fileio
from smoe.plumbing.cpus import limit_blas_threads, usable_cores
from smoe.quant.replay import tensor_stats
from smoe.sculpt.blob_writer import BlobWriter
from smoe.sculpt.expert_reader import ExpertReader
from smoe.sculpt.outcome import ExpertOutcome, TensorOutcome
from smoe.sculpt.source.checkpoint import ExpertRef
from smoe.vault.blob import MatrixInput, encode_blob
from smoe_gen.layout import TENSOR_NAMES

if TYPE_CHECKING:
    import numpy as np

    from smoe.sculpt.source.imatrix import ImportanceMatrix

__all__ = [
    "BATCH",
    "Claims",
    "Job",
    "Target",
    "expert_importance",
    "file_order",
    "quantise_expert",
    "run_jobs",
]


@dataclass(frozen=True)
class Job:
    """One expert to quantise: where its sources are, where its blob goes, how.

    >>> from smoe.format.plan import make_plan
    >>> from smoe.sculpt.source.checkpoint import Checkpoint
    >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe").experts[(0, 1)]
    >>> job = Job(ref, make_plan({(0, 1): ref.shapes}, 4, 2).experts[0], 4, "optimal")
    >>> job.slot.raw_size
    4896
    """

    ref: ExpertRef
    slot: ExpertSlot
    bits: int
    scale: str
    imatrix: ImportanceMatrix | None = None
    """Read for this expert's importance (positioned reads: a forked worker shares it)."""
    hessians: tuple[np.ndarray | None, ...] | None = None
    """``--calibrate``: per matrix (gate, up, down) the second moments of its routed inputs
    (None: that matrix got no calibration token); the matrices with one are encoded by
    :func:`smoe.quant.encode_hessian_into`."""


@dataclass(frozen=True)
class Target:
    """The partial file workers write into: its path, the name errors give, its identity.

    >>> Target("out/.m.smoe.partial", "out/m.smoe", (2049, 1234)).name
    'out/m.smoe'
    """

    partial: str
    name: str
    ident: tuple[int, int]  # st_dev, st_ino of the file the parent created


BATCH = 4  # no worker process is started for fewer experts than this


def open_target(target: Target) -> int:
    """Open the parent's partial file for writing, never through a symlink."""
    flags = os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target.partial, flags)
    except OSError as e:
        raise WriteFailed(f"{target.partial}: cannot open for writing: {e.strerror or e}") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != target.ident:
        os.close(fd)
        raise WriteFailed(
            f"{target.partial}: was replaced by another file while sculpting; refused"
        )
    return fd


def file_order(todo: list[Job]) -> list[Job]:
    """Jobs in the order their bytes lie in the checkpoint (shard, offset), so that reads
    move forward through each shard as the kernel's read-ahead expects. Every blob still
    goes to its planned offset: the output does not depend on this order.

    >>> from smoe.format.plan import make_plan
    >>> from smoe.sculpt.source.checkpoint import Checkpoint
    >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe_sharded")
    >>> refs = list(ck.experts.values())
    >>> plan = make_plan({(r.layer, r.expert): r.shapes for r in refs}, 4, 2)
    >>> jobs = [Job(r, s, 4, "optimal") for r, s in zip(refs, plan.experts)]
    >>> ordered = file_order(jobs[::-1])
    >>> starts = [min((str(p), o) for p, o, _ in j.ref.ranges()) for j in ordered]
    >>> starts == sorted(starts)
    True
    """
    return sorted(todo, key=lambda job: min((str(p), o) for p, o, _ in job.ref.ranges()))


def quantise_expert(job: Job, mats: list, srcs: tuple[int, ...], out: np.ndarray) -> ExpertOutcome:
    """Quantise one expert's matrices (``srcs``: their CRC-32C, as read) into its blob in
    ``out`` (``uint8``, the blob's size; see :func:`encode_blob`), with an importance
    matrix weighted by it; the result to report once ``out`` is written at
    ``job.slot.byte_offset``.

    >>> import numpy as np
    >>> from smoe.format.plan import make_plan
    >>> from smoe.sculpt.source.checkpoint import Checkpoint
    >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe").experts[(0, 1)]
    >>> job = Job(ref, make_plan({(0, 1): ref.shapes}, 4, 2).experts[0], 4, "optimal")
    >>> out = np.zeros(job.slot.raw_size, np.uint8)
    >>> o = quantise_expert(job, ref.load(), (1, 2, 3), out)
    >>> o.key, o.sources, o.weighted, o.source_bytes, o.reports, o.blob_crc == checksum(out)
    ((0, 1), (1, 2, 3), (None, None, None), 18432, None, True)
    """
    stats = [quant.QuantStats() for _ in mats]  # SNR from the encoder's own pass, no decode
    importance = expert_importance(job.ref, job.imatrix)
    hessians = job.hessians
    reports = [quant.HessianReport() for _ in mats] if hessians else None
    matrices = [
        MatrixInput(
            weights=w,
            src_dtype=src,
            importance=importance[i] if importance else None,
            hessian=hessians[i] if hessians else None,
            stats=stats[i],
            report=reports[i] if reports else None,
        )
        for i, (w, src) in enumerate(mats)
    ]
    encode_blob(job.slot, matrices, job.bits, job.scale, out=out)
    if hessians:  # its SNR from the codes, as a resume recomputes it (numpy's order)
        for i, (t, (w, src)) in enumerate(zip(job.slot.tensors, mats)):
            if hessians[i] is not None:
                packed = out[t.packed_offset : t.packed_offset + t.packed_size]
                scales = out[t.scales_offset : t.scales_offset + t.scales_size]
                got = tensor_stats(w, src, job.bits, packed, scales)
                stats[i] = got if got is not None else quant.QuantStats()
    calibrated = reports is not None and hessians is not None
    shown: list[quant.HessianReport | None] = [None] * len(stats)
    if reports is not None and hessians is not None:
        shown = [r if h is not None else None for r, h in zip(reports, hessians)]
    return ExpertOutcome(
        key=(job.ref.layer, job.ref.expert),
        blob_crc=checksum(out),
        tensors=tuple(
            TensorOutcome(
                source_crc=crc,
                snr=s.finite_snr_db,
                weighted_snr=s.weighted_snr_db,
                report=report,
            )
            for crc, s, report in zip(srcs, stats, shown)
        ),
        source_bytes=job.ref.source_bytes,  # as stored: FP8 codes and scales, not BF16
        calibrated=calibrated,
    )


def expert_importance(
    ref: ExpertRef, imatrix: ImportanceMatrix | None
) -> list[np.ndarray | None] | None:
    """Per matrix of expert ``ref`` (gate, up, down), its per-column importance from
    ``imatrix`` (None for a matrix it has no data for), or None without an importance
    matrix: what :func:`quantise_expert` encodes with, and what ``--resume`` weighs the
    SNR it recomputes by (:func:`smoe.sculpt.resume.keep_verified`).

    >>> from smoe.sculpt.source.checkpoint import Checkpoint
    >>> from smoe.sculpt.source.imatrix import ImportanceMatrix
    >>> ref = Checkpoint.open("fixtures/checkpoints/olmoe").experts[(0, 0)]
    >>> expert_importance(ref, None) is None
    True
    >>> imp = expert_importance(ref, ImportanceMatrix.open("fixtures/imatrix_tiny.dat"))
    >>> [None if h is None else h.shape for h in imp]  # data for down_proj only
    [None, None, (32,)]
    """
    if imatrix is None:
        return None
    return [
        imatrix.for_expert(ref.layer, ref.expert, t, cols, rows)
        for t, (rows, cols) in zip(TENSOR_NAMES, ref.shapes)
    ]


class Claims:
    """Hands out the indices ``0 .. n - 1`` once each, to one process or, through a counter
    in shared memory, to several.

    >>> claims = Claims(2)
    >>> claims(), claims(), claims()
    (0, 1, None)
    """

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


@dataclass(frozen=True)
class _Fetched:
    """One claimed job's source matrices as read, their CRC-32C, and whether they came
    from the page cache (then the blob may be written with O_DIRECT: the expert is
    CPU-bound)."""

    job: Job
    mats: list
    crcs: tuple[int, ...]
    cached: bool


def quantise_stream(
    todo: Sequence[Job], claims: Claims, target: Target, reader: ExpertReader
) -> Iterator[ExpertOutcome]:
    """Quantise the jobs ``claims`` hands out while one thread claims the next one and
    reads and hashes its sources into the reader's other buffer (preadv and CRC-32C drop
    the GIL) and another writes the previous blob (:class:`BlobWriter`, with
    ``O_DIRECT`` where it can), so reading and writing never wait for quantising nor the
    other way round. Each result comes once its blob is written."""

    def fetch(slot: int) -> _Fetched | None:
        i = claims()
        if i is None:
            return None
        reader.hint(todo[i].ref)  # the whole expert at once: a deeper queue than chunk by chunk
        before = reader.direct_reads
        mats, crcs = reader.read(todo[i].ref, slot)
        return _Fetched(todo[i], mats, crcs, cached=reader.direct_reads == before)

    fd = open_target(target)
    try:
        again = open_target(target)
    except BaseException:
        os.close(fd)
        raise
    direct = again if fileio.direct_io(again) else None
    if direct is None:
        os.close(again)
    with BlobWriter[ExpertOutcome](fd, target.name, direct) as out:
        with ThreadPoolExecutor(max_workers=1) as pool:
            ahead, slot = pool.submit(fetch, 0), 0
            while (got := ahead.result()) is not None:
                slot ^= 1  # the other buffer: the expert being quantised stays untouched
                ahead = pool.submit(fetch, slot)
                job, blob = got.job, out.buffer(got.job.slot.raw_size)
                result = quantise_expert(job, got.mats, got.crcs, blob)
                yield from out.write(blob, job.slot.byte_offset, result, direct=got.cached)
        yield from out.drain()


def _worker_init(parent: int) -> None:
    """Die with the parent: an orphan would keep the lock and write into a reused partial.
    Ctrl-C is the parent's to handle: it stops the workers."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def hessian_aware(todo: Sequence[Job]) -> bool:
    """Whether any job is encoded Hessian-aware (``--calibrate``): matrix products, seconds
    an expert, where the plain encoder takes milliseconds and multiplies no matrices.

    >>> hessian_aware([])
    False
    """
    return any(job.hessians for job in todo)


def blas_threads(todo: Sequence[Job], processes: int) -> int | None:
    """The BLAS threads each of ``processes`` workers may start for ``todo``: the usable
    cores shared among them when it is :func:`hessian_aware`, else None (nothing to cap).

    >>> blas_threads([], 2) is None
    True
    """
    if not hessian_aware(todo):
        return None
    return max(1, usable_cores() // max(1, processes))


def _worker_main(
    parent: int,
    todo: list[Job],
    claims: Claims,
    target: Target,
    conn: Connection,
    blas: int | None = None,
) -> None:
    """A worker process: take the next unclaimed job until none is left, send each result
    (or the exception that stopped it) to the parent, exit. ``blas``: its BLAS threads
    (:func:`blas_threads`)."""
    _worker_init(parent)
    if blas is not None:
        limit_blas_threads(blas)
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

    def run(self, todo: list[Job], target: Target) -> Generator[ExpertOutcome, None, None]:
        ctx = mp.get_context("fork")
        claims = Claims(len(todo), ctx.Value("q", 0))
        live: dict[Connection, Any] = {}
        blas = blas_threads(todo, self.processes)
        for _ in range(self.processes):
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_worker_main,
                daemon=True,
                args=(os.getpid(), todo, claims, target, send, blas),
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


def run_jobs(
    todo: list[Job], jobs: int, target: Target, marks: dict[str, float] | None = None
) -> Generator[ExpertOutcome, None, None]:
    """Results as experts finish, in file order: in this process, or in up to ``jobs``
    worker processes, never more than there are batches of :data:`BATCH` experts (of one
    expert, when one is encoded Hessian-aware: each takes far longer than a fork).
    ``marks["experts"]``: when the work starts (compiled kernels loaded, workers forked).

    A run too small to make up for starting the compiled encoder (compiling it into a cold
    cache, or even loading it: :func:`smoe.quant.run_kernel`, from the weights of its
    large tensors) is encoded by numpy throughout, the same bytes; otherwise its kernels
    are compiled or loaded before any worker is forked (saying so when they compile).

    Every object alive once the kernels are loaded is frozen out of the collector for the
    run: forked workers never walk (and so never copy) the parent's heap, and the parent's
    own collections stay small; it is handed back when the run ends.

    >>> list(run_jobs([], 2, Target("out/.m.smoe.partial", "out/m.smoe", (0, 0))))
    []
    """
    if not todo:
        return
    todo = file_order(todo)
    per = 1 if hessian_aware(todo) else BATCH
    workers = min(jobs, -(-len(todo) // per))
    weighted = any(job.imatrix is not None for job in todo)
    sets = sorted({(job.bits, cast("quant.ScaleMode", job.scale)) for job in todo})
    large = [r * c for j in todo for r, c in j.ref.shapes if r * c >= quant.FAST_MIN_WEIGHTS]
    choice = quant.run_kernel(sets, sum(large), importance=weighted, workers=workers)
    with quant.run_choice(choice):  # (an unknown scale: refused by encode_into)
        if workers > 1 or large:
            with _no_collections():
                for bits, mode in sets:
                    quant.prepare_fast(bits, mode, importance=weighted)  # once, inherited
        gc.freeze()
        try:
            yield from _start_jobs(todo, workers, target, marks)
        finally:
            gc.unfreeze()


def _start_jobs(
    todo: list[Job], workers: int, target: Target, marks: dict[str, float] | None
) -> Generator[ExpertOutcome, None, None]:
    """:func:`run_jobs` once the kernels are loaded: the work itself."""
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
