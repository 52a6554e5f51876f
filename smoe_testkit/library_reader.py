"""Reads experts' source matrices through the ``safetensors`` library: a drop-in alternative
to :class:`smoe.sculpt.expert_reader.ExpertReader` (same methods, same bytes, same CRC-32C values).

Each shard is validated by our strict :func:`smoe.interop.safetensors_io.read_header` before the
library ever opens it (and the tensors of the expert must be exactly the ones indexed);
the library is then opened on that same descriptor (``/proc/self/fd/N`` or ``/dev/fd/N``)
and read, ``safe_open(framework="numpy")`` + ``get_slice``: one expert of a
fused 3-D tensor is an index, and gate and up the two row halves of ``gate_up_proj``. BF16
comes back as ``ml_dtypes.bfloat16`` (needs ``ml_dtypes``) and is handed on as its raw
uint16 patterns, a zero-copy view, as :func:`smoe.quant.encode_into` wants it. FP8 is never
read: :meth:`smoe.sculpt.source.checkpoint.Checkpoint.open` refuses FP8 expert weights and
block-scaled ones, and so does this reader (the library cannot give FP8 to numpy anyway). Anything
the
library raises becomes one :class:`~smoe.errors.SmoeError` line naming shard and tensor.

Memory: the library maps the whole shard, and every page copied out of a mapping stays
resident in this process until it is unmapped, so a long-lived handle grows to the size of
the checkpoint. Rows are therefore asked for in runs of at most ``CHUNK`` bytes, copied into
reused buffers as ``ExpertReader`` does, and the handle is reopened every ``MAP`` bytes.

**Not the default.** The library reads through ``mmap``: a shard that shrinks while it is
mapped (truncated in place, a network file system going away) kills the process with SIGBUS
in the middle of a copy, where ``ExpertReader``'s ``pread`` gets a short read and stops with
one line. A size or mtime change seen before each open is refused, but the window between
that check and the copy remains. ``make bench`` (``bench/checkpoint_bench.py``) compares
the two readers' throughput and peak RSS.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from safetensors import safe_open

from smoe.errors import SmoeError
from smoe.format.manifest import checksum
from smoe.interop.safetensors_io import DTYPE_SIZES, FLOAT_DTYPES, TensorInfo, read_header
from smoe.plumbing import fileio
from smoe.sculpt.source.checkpoint import ExpertRef, src_dtype

__all__ = ["LibraryReader"]

_FD_DIRS = ("/proc/self/fd", "/dev/fd")  # a path that opens the descriptor's own file


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _need_ml_dtypes(info: TensorInfo) -> None:
    """The library gives BF16 to numpy as ``ml_dtypes.bfloat16``: import it (it registers
    the dtype), or say in one line what is missing."""
    try:
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
    except ImportError:
        raise SmoeError(
            f"{info.path}: tensor {info.name!r} is BF16, which the safetensors library "
            "reads only with ml_dtypes installed (pip install ml_dtypes)"
        ) from None


class _Shard:
    """One shard as validated: its descriptor, identity and checked header."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = fileio.open_input(path)  # never blocks on a FIFO put in a shard's place
        try:
            self.tensors = read_header(path)
            st, now = os.fstat(self.fd), os.stat(path)
            if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
                raise SmoeError(f"{path}: replaced while its header was being read; refused")
            self.stamp = (st.st_size, st.st_mtime_ns)
            self.where = next((f"{d}/{self.fd}" for d in _FD_DIRS if os.path.isdir(d)), str(path))
        except BaseException:
            os.close(self.fd)
            raise

    def check(self, info: TensorInfo) -> None:
        """The shard is as it was validated, and ``info`` is one of its tensors as indexed."""
        st = os.fstat(self.fd)
        if (st.st_size, st.st_mtime_ns) != self.stamp:
            raise SmoeError(
                f"{self.path}: changed since it was validated (size {self.stamp[0]} -> "
                f"{st.st_size} bytes, or modified); refused"
            )
        have = self.tensors.get(info.name)
        if have is None or (have.dtype, have.shape, have.offset) != (
            info.dtype,
            info.shape,
            info.offset,
        ):
            raise SmoeError(
                f"{self.path}: tensor {info.name!r} is not the one indexed ({info.dtype} "
                f"{list(info.shape)} at offset {info.offset}); refused"
            )
        if info.dtype not in FLOAT_DTYPES:
            raise SmoeError(
                f"{self.path}: tensor {info.name!r} is {info.dtype}; refused: expert "
                "weights must be BF16, F16 or F32"
            )
        if info.dtype == "BF16":
            _need_ml_dtypes(info)


class LibraryReader:
    """Reads experts' source matrices with ``safetensors.safe_open`` + ``get_slice``; the
    same results as :class:`smoe.sculpt.expert_reader.ExpertReader`, which stays the default
    (see the module docstring: SIGBUS on a shard that shrinks while mapped).

    Like ``ExpertReader``, each matrix is asked for in runs of rows of at most
    :attr:`CHUNK` bytes, copied into buffer ``slot`` (one of ``slots``, allocated once,
    grown only for a larger expert) and hashed while in cache. The library's handle is
    reopened once :attr:`MAP` bytes have been copied through it: every page read through
    a mapping stays resident until it is unmapped.

    >>> from smoe.sculpt.source.checkpoint import Checkpoint
    >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe_fused").experts[(0, 1)]
    >>> with LibraryReader() as reader:
    ...     mats, crcs = reader.read(ref)
    ...     print([(a.shape, str(a.dtype), src) for a, src in mats])
    [((48, 64), 'uint16', 'bf16'), ((48, 64), 'uint16', 'bf16'), ((64, 48), 'uint16', 'bf16')]
    >>> [f"{c:08x}" for c in crcs]
    ['5bd4634b', 'd93408bf', '2b4969d6']
    """

    CHUNK = 1 << 20  # the most bytes asked of the library at once
    MAP = 4 << 20  # the most bytes copied through one mapping before it is reopened
    ALIGN = 64

    def __init__(self, slots: int = 2) -> None:
        self._bufs = [np.empty(0, np.uint8) for _ in range(slots)]
        self._shards: dict[Path, _Shard] = {}
        self._lock = threading.Lock()
        self.direct_reads = 0
        """Experts read with ``O_DIRECT``: always 0, the library reads through a memory map
        (kept for the sculptor, which reads ``ExpertReader.direct_reads``)."""

    def _shard(self, path: Path) -> _Shard:
        with self._lock:
            shard = self._shards.get(path)
            if shard is None:
                shard = self._shards[path] = _Shard(path)
            return shard

    def _buffer(self, slot: int, nbytes: int) -> np.ndarray:
        if self._bufs[slot].nbytes < nbytes:
            self._bufs[slot] = np.empty(nbytes, np.uint8)
        return self._bufs[slot]

    def _slices(self, ref: ExpertRef) -> list[tuple[int, TensorInfo, int | None, int, int, int]]:
        """(matrix, tensor, index, first row, end row, byte offset in the matrix) of each
        run of rows of at most :attr:`CHUNK` bytes, in file order."""
        out = []
        for i, ((info, idx, rows), (r, c)) in enumerate(zip(ref.sources, ref.shapes)):
            r0 = 0 if rows is None else rows.start
            row = c * DTYPE_SIZES[info.dtype]
            step = max(1, self.CHUNK // row)
            out += [
                (i, info, idx, r0 + a, r0 + min(r, a + step), a * row) for a in range(0, r, step)
            ]
        at = [offset for _, offset, _ in ref.ranges()]
        return sorted(out, key=lambda s: (str(s[1].path), at[s[0]], s[3]))

    def _fetch(self, ref: ExpertRef) -> Iterator[tuple[int, int, np.ndarray]]:
        """(matrix, byte offset in it, raw bytes) of each run of :meth:`_slices`, through
        handles of the library reopened every :attr:`MAP` bytes and at each new shard."""
        plan = self._slices(ref)
        for path in dict.fromkeys(s[1].path for s in plan):
            shard = self._shard(path)
            todo = [s for s in plan if s[1].path == path]
            for info in dict.fromkeys(s[1] for s in todo):
                shard.check(info)
            stack = contextlib.ExitStack()
            name, mapped, f = todo[0][1].name, self.MAP, None
            try:
                with stack:
                    for i, info, idx, r0, r1, at in todo:
                        name = info.name
                        if f is None or mapped >= self.MAP:
                            stack.close()  # unmaps: its pages leave this process's RSS
                            f, mapped = (
                                stack.enter_context(safe_open(shard.where, framework="numpy")),
                                0,
                            )
                        view = f.get_slice(name)
                        if (view.get_dtype(), tuple(view.get_shape())) != (info.dtype, info.shape):
                            raise SmoeError(
                                f"{path}: tensor {name!r}: the safetensors library sees "
                                f"{view.get_dtype()} {view.get_shape()}, the header "
                                f"{info.dtype} {list(info.shape)}; refused"
                            )
                        arr = view[r0:r1] if idx is None else view[idx, r0:r1]
                        raw = arr.view(np.uint8).reshape(-1)
                        mapped += raw.nbytes
                        yield i, at, raw
            except SmoeError:
                raise
            except Exception as e:  # the library's own errors: one line naming shard, tensor
                raise SmoeError(
                    f"{path}: tensor {name!r}: the safetensors library failed: {_one_line(e)}"
                ) from None

    def read(
        self, ref: ExpertRef, slot: int = 0
    ) -> tuple[list[tuple[np.ndarray, str | None]], tuple[int, ...]]:
        """(matrices as :meth:`smoe.sculpt.source.checkpoint.ExpertRef.load` gives them, CRC-32C of
        each one's stored bytes). The arrays are views of buffer ``slot``, valid until the next
        read into it. The matrices are read in file order.

        >>> from smoe.sculpt.source.checkpoint import Checkpoint
        >>> ref = Checkpoint.open("fixtures/checkpoints/mixtral").experts[(1, 3)]
        >>> with LibraryReader() as reader:
        ...     mats, crcs = reader.read(ref)
        ...     print(all((a == b).all() for (a, _), (b, _) in zip(mats, ref.load())))
        True
        """
        parts = ref.parts()
        places, end = [], 0
        for part in parts:
            places.append(end)
            end += -(-part.nbytes // self.ALIGN) * self.ALIGN
        buf = self._buffer(slot, end)
        crcs = [0] * len(parts)
        for i, at, raw in self._fetch(ref):
            dst = buf[places[i] + at : places[i] + at + raw.nbytes]
            dst[:] = raw
            crcs[i] = checksum(dst, crcs[i])
        mats = [
            (buf[at : at + p.nbytes].view(FLOAT_DTYPES[p.dtype]).reshape(p.shape), src_dtype(p))
            for p, at in zip(parts, places)
        ]
        return mats, tuple(crcs)

    def crcs(self, ref: ExpertRef, slot: int = 0) -> tuple[int, ...]:
        """The CRC-32C values :meth:`read` gives, without a buffer of the expert's size.

        >>> from smoe.sculpt.source.checkpoint import Checkpoint
        >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe_fused").experts[(0, 1)]
        >>> with LibraryReader() as reader:
        ...     reader.crcs(ref) == reader.read(ref)[1]
        True
        """
        crcs = [0] * len(ref.sources)
        for i, _, raw in self._fetch(ref):
            crcs[i] = checksum(raw, crcs[i])
        return tuple(crcs)

    def hint(self, ref: ExpertRef) -> None:
        """Ask the kernel to start reading an expert's bytes now (POSIX_FADV_WILLNEED).

        >>> from smoe.sculpt.source.checkpoint import Checkpoint
        >>> ref = Checkpoint.open("fixtures/checkpoints/qwen3_moe").experts[(0, 0)]
        >>> with LibraryReader() as reader:
        ...     reader.hint(ref)
        """
        advise = getattr(os, "posix_fadvise", None)
        if advise is None:
            return
        for path, offset, n in ref.ranges():
            with contextlib.suppress(OSError):
                advise(self._shard(path).fd, offset, n, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        """Close the shards' descriptors (the library holds none between reads).

        >>> reader = LibraryReader()
        >>> reader.close()
        """
        with self._lock:
            for shard in self._shards.values():
                os.close(shard.fd)
            self._shards.clear()

    def __enter__(self) -> LibraryReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
