"""The machine's own limits, measured in the same run: memory copy, bf16 -> f32, and the
rates at which a file can be read (page-cached, cold, O_DIRECT).

Every limit is the best over 1, 2 and 4 threads (each thread reads its own contiguous
share of every file with positioned reads of :data:`CHUNK` bytes, :data:`DIRECT_CHUNK` for
O_DIRECT, into its own buffer), so
that a ratio against it says how close a figure is to the machine, not to one thread.
Cold means the files were dropped from the page cache first (``fsync`` then
``posix_fadvise(POSIX_FADV_DONTNEED)``); O_DIRECT bypasses the cache altogether.

Other sections import :func:`read_limit`, :func:`drop_cache` and :func:`warm` to measure
their own inputs' limits the same way, and :func:`read_write_limit` for a job that reads
its input while it writes its output through the same device.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.figures import best_time, figure
from smoe import quant
from smoe.plumbing import fileio

CHUNK = 1 << 20
DIRECT_CHUNK = 8 << 20  # O_DIRECT has no read-ahead: each read is one request to the device
THREADS = (1, 2, 4)
ALIGN = fileio.DIRECT_ALIGN


def copy_rate(n: int, threads: int, repeat: int = 5) -> float:
    """GB/s of ``np.copyto`` over ``n`` bytes split among ``threads`` threads."""
    src = np.ones(n, np.uint8)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(n), threads)
    spans = [(int(p[0]), int(p[-1]) + 1) for p in parts if len(p)]

    def one(lo: int, hi: int) -> None:
        np.copyto(dst[lo:hi], src[lo:hi])

    def run() -> None:
        pool = [threading.Thread(target=one, args=s) for s in spans]
        for t in pool:
            t.start()
        for t in pool:
            t.join()

    return n / best_time(run, repeat=repeat) / 1e9


def drop_cache(paths: Sequence[Path]) -> None:
    """Drop files from the page cache (written back first: dirty pages cannot be dropped)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: Sequence[Path]) -> None:
    """Read files once so that "page-cached" means what it says."""
    read_rate(paths, 2)


def read_rate(paths: Sequence[Path], threads: int, direct: bool = False) -> float:
    """GB/s of reading every byte of ``paths`` once with ``threads`` threads."""
    sizes = [p.stat().st_size for p in paths]
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fds = [os.open(p, flags) for p in paths]
    chunk = DIRECT_CHUNK if direct else CHUNK
    errors: list[BaseException] = []

    def share(t: int) -> None:
        view = memoryview(fileio.aligned_empty(chunk))
        try:
            for fd, size in zip(fds, sizes):
                step = -(-size // threads // chunk) * chunk  # chunk-aligned shares
                off, end = t * step, min(size, (t + 1) * step)
                while off < end:
                    want = min(chunk, -(-(end - off) // ALIGN) * ALIGN)
                    got = os.preadv(fd, [view[:want]], off)
                    if got <= 0:
                        break
                    off += got
        except BaseException as e:  # reported by the caller
            errors.append(e)

    try:
        start = time.perf_counter()
        pool = [threading.Thread(target=share, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        seconds = time.perf_counter() - start
    finally:
        for fd in fds:
            os.close(fd)
    if errors:
        raise errors[0]
    return sum(sizes) / seconds / 1e9


def read_limit(
    paths: Sequence[Path], mode: str, threads: Sequence[int] = THREADS, repeat: int = 2
) -> tuple[float, dict[int, float]]:
    """(best GB/s, best GB/s per thread count) of reading ``paths``.

    ``mode``: "cached" (warmed once, then read from the page cache), "cold" (dropped
    from the cache before every read) or "direct" (O_DIRECT).
    """
    if mode == "cached":
        warm(paths)
    best: dict[int, float] = {}
    for _ in range(repeat):
        for n in threads:
            if mode == "cold":
                drop_cache(paths)
            best[n] = max(best.get(n, 0.0), read_rate(paths, n, direct=mode == "direct"))
    return max(best.values()), best


def write_rate(path: Path, nbytes: int, direct: bool) -> float:
    """GB/s of writing ``nbytes`` to a new file ``path`` in :data:`DIRECT_CHUNK` pieces
    (with ``O_DIRECT`` if ``direct``), fsynced; the file is removed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0))
    buf = fileio.aligned_empty(DIRECT_CHUNK)
    buf[:] = np.random.default_rng(1).integers(0, 256, DIRECT_CHUNK, dtype=np.uint8)
    try:
        start = time.perf_counter()
        for at in range(0, nbytes, DIRECT_CHUNK):
            if os.pwrite(fd, buf, at) != DIRECT_CHUNK:
                raise OSError(f"{path}: short write at {at}")
        os.fsync(fd)
        return nbytes / (time.perf_counter() - start) / 1e9
    finally:
        os.close(fd)
        path.unlink()


def write_limit(out_dir: Path, nbytes: int, repeat: int = 2) -> tuple[float, dict[str, float]]:
    """(best GB/s, best GB/s per way) of writing ``nbytes`` to a new file in ``out_dir``,
    fsynced: buffered writes as a job that commits its output does, and ``O_DIRECT``."""
    per: dict[str, float] = {}
    for _ in range(repeat):
        for direct in (False, True):
            way = "O_DIRECT writes" if direct else "buffered writes"
            scratch = out_dir / f".write-limit-{os.getpid()}.bin"
            per[way] = max(per.get(way, 0.0), write_rate(scratch, nbytes, direct))
    return max(per.values()), per


def read_write_limit(
    paths: Sequence[Path], out_dir: Path, nbytes: int, threads: Sequence[int] = (1, 2)
) -> tuple[float, dict[str, float]]:
    """(best GB/s, GB/s per way) of reading ``paths`` from a dropped page cache while
    another thread writes ``nbytes`` into ``out_dir`` (fsynced): the least disk work of a
    job that reads those files and writes that much, as a cold sculpt does. GB/s of
    ``paths``' bytes over the time both take; each way is a read mode (buffered or
    O_DIRECT, ``threads`` threads) with a write mode (buffered or O_DIRECT)."""
    total = sum(p.stat().st_size for p in paths)
    per: dict[str, float] = {}
    for read_direct in (False, True):
        for n in threads:
            for write_direct in (False, True):
                drop_cache(paths)
                scratch = out_dir / f".read-write-limit-{os.getpid()}.bin"
                writer = threading.Thread(
                    target=write_rate, args=(scratch, nbytes, write_direct), daemon=True
                )
                start = time.perf_counter()
                writer.start()
                read_rate(paths, n, direct=read_direct)
                writer.join()
                way = (
                    f"{'O_DIRECT' if read_direct else 'buffered'} reads ({n} thread"
                    f"{'s' if n > 1 else ''}) + {'O_DIRECT' if write_direct else 'buffered'}"
                    " writes"
                )
                per[way] = total / (time.perf_counter() - start) / 1e9
    return max(per.values()), per


def describe_ways(per_way: dict[str, float]) -> str:
    """ "buffered writes 1.90, O_DIRECT writes 3.10 GB/s": the rates behind a limit."""
    return ", ".join(f"{way} {v:.2f}" for way, v in per_way.items()) + " GB/s"


def describe(per_threads: dict[int, float]) -> str:
    """ "1 thread 5.1, 2 threads 9.8 GB/s": the rates behind a limit."""
    return (
        ", ".join(
            f"{n} thread{'s' if n > 1 else ''} {v:.2f}" for n, v in sorted(per_threads.items())
        )
        + " GB/s"
    )


def scratch_file(workdir: Path, nbytes: int) -> Path:
    """A file of ``nbytes`` random bytes (made once) to measure read rates on."""
    path = workdir / f"read-{nbytes >> 20}MiB.bin"
    if not path.exists() or path.stat().st_size != nbytes:
        workdir.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        with path.open("wb") as f:
            for _ in range(nbytes // (64 << 20)):
                f.write(rng.integers(0, 256, 64 << 20, dtype=np.uint8).tobytes())
    return path


def run(workdir: Path, quick: bool = False) -> list[dict]:
    n = (32 if quick else 128) << 20  # bytes
    per = {t: copy_rate(n, t) for t in (1, 2)}
    copy = max(per.values())
    raw = np.random.default_rng(0).integers(0, 1 << 16, n // 2, dtype=np.uint16)
    t = best_time(lambda: quant.bf16_to_f32(raw), repeat=5)
    conv = n / t / 1e9  # GB/s of bf16 input, one thread
    figs = [
        figure(
            "memory copy",
            copy,
            None,
            "GB/s",
            "reference limit",
            None,
            detail=f"np.copyto of {n >> 20} MiB, best of {describe(per)}",
        ),
        figure(
            "bf16 -> f32 widening, 1 thread, vs memory copy",
            conv,
            copy,
            "GB/s",
            "fraction of memory copy",
            None,
            detail="quant.bf16_to_f32, GB/s of bf16 in",
        ),
    ]
    path = scratch_file(workdir, (256 if quick else 1024) << 20)
    size = f"{path.stat().st_size >> 20} MiB file"
    for mode, what in (("cached", "page-cached"), ("cold", "cold"), ("direct", "O_DIRECT")):
        name = f"read a {size}, {what}"
        try:
            best, per = read_limit([path], mode)
        except OSError as e:  # O_DIRECT refused by the filesystem
            figs.append(
                figure(
                    name,
                    0.0,
                    None,
                    "GB/s",
                    "reference limit",
                    None,
                    detail=f"not measured: {e.strerror}",
                )
            )
            continue
        figs.append(
            figure(
                name,
                best,
                None,
                "GB/s",
                "reference limit",
                None,
                detail=f"best of {describe(per)}"
                + (", dropped from the page cache before each" if mode == "cold" else ""),
            )
        )
    return figs
