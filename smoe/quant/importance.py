"""Per-column importance (e.g. a llama.cpp importance matrix's mean squares,
:mod:`smoe.sculpt.source.imatrix`) as the encoders use it: checked, divided by its maximum,
rounded to bfloat16 precision, and laid out per weight for a range of a flattened tensor."""

from __future__ import annotations

import numpy as np

__all__ = ["ImportanceRuns", "bf16_round", "prepare_importance"]


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round finite non-negative float32 values to bfloat16 precision (ties to even).

    >>> bf16_round(np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8], np.float32)).tolist()  # ties to even
    [1.0, 1.0, 1.015625]
    """
    u = np.array(x, np.float32).view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> 16) & 1)
    u &= np.uint32(0xFFFF0000)
    return u.view(np.float32)


def prepare_importance(
    importance: np.ndarray | None, shape: tuple[int, ...]
) -> tuple[np.ndarray, float] | None:
    """Per-column importance as the encoders use it: divided by its maximum and rounded to
    bfloat16 precision (float32 values in ``[0, 1]``), and that maximum; ``None`` when it is
    uniform (all equal, also all zero, before or after rounding): the plain encoder runs.

    >>> h, top = prepare_importance(np.array([2.0, 0.5, 8.0]), (4, 3))
    >>> h.tolist(), top
    ([0.25, 0.0625, 1.0], 8.0)
    >>> prepare_importance(np.full(3, 7.0), (4, 3)) is None  # uniform: the plain encoding
    True
    """
    if importance is None:
        return None
    imp = np.asarray(importance)
    cols = shape[-1] if shape else 1
    if imp.shape != (cols,):
        raise ValueError(
            f"importance must hold one value per column ({cols},), got shape {imp.shape}"
        )
    if imp.dtype.kind not in "fiu":
        raise TypeError(f"importance must be real numbers, got {imp.dtype}")
    imp = imp.astype(np.float64)
    bad = ~(np.isfinite(imp) & (imp >= 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"importance must be finite and >= 0: column {i} holds {float(imp[i])}")
    top = float(imp.max(initial=0.0))
    if top == 0 or float(imp.min()) == top:
        return None
    h = bf16_round(np.abs(imp / top).astype(np.float32))
    return None if float(h.min()) == float(h.max()) else (h, top)


class ImportanceRuns:
    """Per-weight importance of flat index ranges ``[start, stop)`` (row-major, column =
    index mod ``cols``), as contiguous float32 runs; O(chunk + cols) memory, allocated on
    first use (the compiled encoder takes the columns ``h`` themselves). ``top``: the
    importance's maximum, the unit of ``h`` (weighted statistics are kept in the caller's
    units, so that one ``QuantStats`` can sum several tensors).

    >>> runs = ImportanceRuns(np.array([1, 2, 3], np.float32), 3.0, chunk=4)
    >>> runs.run(2, 6).tolist()  # weights 2..5: columns 2, 0, 1, 2
    [3.0, 1.0, 2.0, 3.0]
    """

    def __init__(self, h: np.ndarray, top: float, chunk: int) -> None:
        self.h = h
        self.top = top
        self.cols = h.size
        self.chunk = chunk
        self.tiled: np.ndarray | None = None
        self.buf: np.ndarray | None = None

    def run(self, start: int, stop: int) -> np.ndarray:
        """The importance of weights ``start:stop`` (at most ``chunk`` of them): a view of
        the columns, or of a tiled copy, or copied into a buffer (reused by the next run).

        >>> runs = ImportanceRuns(np.array([1, 2, 3], np.float32), 3.0, chunk=8)
        >>> runs.run(1, 3).tolist(), runs.run(3, 10).tolist()
        ([2.0, 3.0], [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0])
        """
        off, n = start % self.cols, stop - start
        if off + n <= self.cols:
            return self.h[off : off + n]
        if self.cols < self.chunk:
            if self.tiled is None:
                self.tiled = np.resize(self.h, self.chunk + self.cols)
            return self.tiled[off : off + n]
        if self.buf is None:
            self.buf = np.empty(self.chunk, np.float32)
        first = self.cols - off  # cols >= chunk >= n: it wraps once
        self.buf[:first] = self.h[off:]
        self.buf[first:n] = self.h[: n - first]
        return self.buf[:n]
