"""Weights the format cannot hold (issue 10): NaN and ±Inf always, and with
``overflow="raise"`` any ``|w| > 65504``. The encoders only notice that a group's absmax is
out of range; :func:`refusal` then rescans the input to count exactly and name the first
(or largest) offender."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smoe.errors import RefusedInput
from smoe.quant.inputs import read_chunk
from smoe.quant.traits import FP16_MAX
from smoe_gen.layout import GROUP_SIZE, num_groups

__all__ = ["NonFiniteWeights", "ScaleOverflow", "UnrepresentableWeights", "refusal"]


class UnrepresentableWeights(RefusedInput, ValueError):
    """Weights the format cannot hold; see :class:`NonFiniteWeights`, :class:`ScaleOverflow`.

    ``count``: offending weights; ``groups``: groups holding them; ``position``: index
    (in the input's shape) of the first non-finite weight, or of the largest ``|w|``;
    ``value``: the weight there; ``bits``. Pickles with its message and fields (sculpt
    workers run in other processes). :meth:`within` adds where it happened.

    >>> import numpy as np
    >>> from smoe.quant import encode
    >>> try:
    ...     encode(np.array([1.0, np.nan, np.inf], np.float32), 4)
    ... except UnrepresentableWeights as e:
    ...     print(type(e).__name__, e.count, e.position, isinstance(e, ValueError))
    NonFiniteWeights 2 (1,) True
    """

    def __init__(
        self,
        message: str,
        *,
        count: int = 0,
        groups: int = 0,
        position: tuple[int, ...] = (),
        value: float = 0.0,
        bits: int = 0,
    ) -> None:
        super().__init__(message)
        self.count, self.groups, self.position = count, groups, position
        self.value, self.bits = value, bits

    def within(self, where: str) -> UnrepresentableWeights:
        """The same error with ``where: `` (e.g. ``layer 3 expert 5 down_proj``) prepended.

        >>> e = ScaleOverflow("1 group needs a scale above 65504", count=1, groups=1, bits=4)
        >>> e2 = e.within("layer 3 expert 5 down_proj")
        >>> print(e2); e2.count, type(e2).__name__
        layer 3 expert 5 down_proj: 1 group needs a scale above 65504
        (1, 'ScaleOverflow')
        """
        return type(self)(
            f"{where}: {self}",
            count=self.count,
            groups=self.groups,
            position=self.position,
            value=self.value,
            bits=self.bits,
        )


class NonFiniteWeights(UnrepresentableWeights):
    """NaN or ±Inf weights: the format stores finite values only.

    >>> import numpy as np
    >>> from smoe.quant import encode
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> w[1, 5], w[1, 7] = np.nan, np.inf
    >>> encode(w, 4)
    Traceback (most recent call last):
    smoe.quant.errors.NonFiniteWeights: 2 weights are inf or nan, the first (nan) at row 1 col 5; \
the format stores finite values only
    """


class ScaleOverflow(UnrepresentableWeights):
    """``|w| > 65504``: the group would need a scale above the largest float16.

    Raised with ``overflow="raise"`` only; ``"clip"`` clips the scale to 65504.

    >>> import numpy as np
    >>> from smoe.quant import encode
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> w[0, 3] = 70000
    >>> encode(w, 4, overflow="raise")
    Traceback (most recent call last):
    smoe.quant.errors.ScaleOverflow: 1 group needs a scale above 65504 (the largest float16): \
1 weight has |w| > 65504, up to 70000.0 at row 0 col 3; the largest magnitude Q4 can hold \
is 65504 (top level 1.0 x scale 65504)
    >>> float(encode(w, 4, "absmax")[1][0])  # the default, overflow="clip"
    65504.0
    """


def _where(position: tuple[int, ...]) -> str:
    if len(position) == 2:
        return f"row {position[0]} col {position[1]}"
    return f"index {position[0]}" if len(position) == 1 else f"index {position}"


@dataclass
class _Scan:
    """What a rescan of a refused input counts: non-finite weights (``bad``, the flat index
    of the ``first``) and, while every weight so far is finite and with ``overflow="raise"``,
    weights above 65504 (``over``, in ``groups`` groups, the largest ``top_abs`` at ``top``)."""

    overflow: str
    bad: int = 0
    first: int = -1
    over: int = 0
    groups: int = 0
    top: int = -1
    top_abs: float = 0.0

    def add(self, w: np.ndarray, start: int) -> None:
        """Count the float32 weights ``w``, which start at flat index ``start``."""
        finite = np.isfinite(w)
        k = int(w.size - np.count_nonzero(finite))
        if k and self.first < 0:
            self.first = start + int(np.argmin(finite))
        self.bad += k
        if self.bad or self.overflow != "raise":
            return
        mag = np.abs(w)
        hit = mag > FP16_MAX
        k = int(np.count_nonzero(hit))
        if k:
            self.over += k
            pad = np.zeros(num_groups(w.size) * GROUP_SIZE, bool)
            pad[: w.size] = hit
            self.groups += int(np.count_nonzero(pad.reshape(-1, GROUP_SIZE).any(axis=1)))
            i = int(np.argmax(mag))
            if mag[i] > self.top_abs:
                self.top, self.top_abs = start + i, float(mag[i])


def refusal(
    src: np.ndarray, kind: str, shape: tuple[int, ...], bits: int, overflow: str, chunk: int
) -> UnrepresentableWeights:
    """The failure path: rescan the whole input (flattened as the encoder read it, of
    ``kind``, :func:`~smoe.quant.inputs.source_kind`), count exactly, build the error.

    >>> w = np.ones(130, np.float32)
    >>> w[[3, 100]] = np.nan, np.inf
    >>> str(refusal(w, "float", (2, 65), 4, "clip", 128))
    '2 weights are inf or nan, the first (nan) at row 0 col 3; the format stores finite values only'
    """
    n = int(np.prod(shape, dtype=np.int64))
    buf = np.empty(chunk, np.float32)
    scan = _Scan(overflow)
    for start in range(0, n, chunk):
        scan.add(read_chunk(src, kind, start, min(start + chunk, n), buf), start)
    if scan.bad:
        value = float(read_chunk(src, kind, scan.first, scan.first + 1, buf)[0])
        return _non_finite(scan, value, shape, bits)
    return _overflowed(scan, shape, bits)


def _non_finite(scan: _Scan, value: float, shape: tuple[int, ...], bits: int) -> NonFiniteWeights:
    """The error of ``scan.bad`` non-finite weights, the first of them ``value``."""
    pos = tuple(int(i) for i in np.unravel_index(scan.first, shape))
    msg = (
        f"1 weight is inf or nan ({value}) at {_where(pos)}"
        if scan.bad == 1
        else f"{scan.bad} weights are inf or nan, the first ({value}) at {_where(pos)}"
    )
    return NonFiniteWeights(
        f"{msg}; the format stores finite values only",
        count=scan.bad,
        groups=0,
        position=pos,
        value=value,
        bits=bits,
    )


def _overflowed(scan: _Scan, shape: tuple[int, ...], bits: int) -> ScaleOverflow:
    """The error of ``scan.over`` weights above 65504 (``overflow="raise"``)."""
    pos = tuple(int(i) for i in np.unravel_index(max(scan.top, 0), shape))
    need = "1 group needs" if scan.groups == 1 else f"{scan.groups} groups need"
    have = "1 weight has" if scan.over == 1 else f"{scan.over} weights have"
    return ScaleOverflow(
        f"{need} a scale above 65504 (the largest float16): {have} |w| > 65504, up to "
        f"{np.float32(scan.top_abs)!s} at {_where(pos)}; the largest magnitude Q{bits} can hold "
        "is 65504 (top level 1.0 x scale 65504)",
        count=scan.over,
        groups=scan.groups,
        position=pos,
        value=scan.top_abs,
        bits=bits,
    )
