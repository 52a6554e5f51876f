"""The encoder's choice of each group's fp16 scale: ``absmax``, or ``optimal`` (least
squared error; with importance, least weighted squared error). How each one works, and how
close it gets, is told in :mod:`smoe.quant`; the compiled kernels
(:mod:`smoe.quant.kernels.encode`) repeat every float32 operation here in the same order.

Every function takes groups as the rows of a float32 array ``g`` and scratch arrays shaped
like it (``work``, ``aux``), and returns the scales as float32 values already rounded to
fp16. ``limit`` is the largest acceptable ``|w|`` as a float32 bit pattern
(:data:`~smoe.quant.traits.OK_BITS`): a group above it yields ``None`` (the caller refuses).
"""

from __future__ import annotations

import numpy as np

from smoe.quant.traits import FP16_MAX, level_center

__all__ = ["Q4W_FACTORS", "Q4_FACTORS", "choose_scales", "f16_round"]

Q4_FACTORS = (0.96, 0.89)
"""Q4 ``optimal``: the candidate scales, as multiples of the fp16 absmax scale (tuned on
normal-like weights against a dense search of fp16 scales; see bench/quant_bench.py)."""

Q4W_FACTORS = (1.0, 0.86, 0.73, 0.6)
"""Q4 ``optimal`` with importance: the candidate ladder, as multiples of the fp16 absmax scale.
A weighted optimum strays further from the absmax than a plain one (it clips unimportant
large weights, or fits an important one exactly): on heavy-tailed weights with outlier
channels (bench/imatrix_bench.py) 1 % / 5 % / 50 % / 95 % / 99 % of groups sit at ~0.47 /
0.62 / 0.88 / 1.08 / 1.2 times it. Four rungs, each with its weighted least-squares scale,
keep ~0.17 dB of output SNR from a dense search there (two, as without importance: ~0.6 dB;
six: ~0.05 dB, at more cost)."""

_F16_MIN_NORMAL = np.float32(2.0**-14)

_TILE = 128
"""Groups per block when transposing (keeps the strided copy in cache)."""


def choose_scales(
    g: np.ndarray,
    bits: int,
    scale: str,
    work: np.ndarray,
    aux: np.ndarray,
    limit: int,
    h: np.ndarray | None = None,
) -> np.ndarray | None:
    """The fp16 scales (as float32) of the groups (rows) of ``g`` for ``scale`` mode, with
    importance ``h`` (shaped like ``g``; only ``optimal`` uses it) or without; ``None`` when
    a group's absmax, as a float32 bit pattern, exceeds ``limit``. Call it under
    ``np.errstate(over="ignore", invalid="ignore")``: huge groups overflow float32 sums.

    >>> g = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)
    >>> work, aux = np.empty_like(g), np.empty_like(g)
    >>> choose_scales(g, 4, "optimal", work, aux, 0x7F7FFFFF)  # 0.96 of the absmax
    array([0.9604492, 0.9604492], dtype=float32)
    >>> choose_scales(g, 2, "absmax", work, aux, 0x7F7FFFFF)
    array([1., 1.], dtype=float32)
    """
    if h is not None and scale == "optimal":
        return _weighted_scales(g, h, bits, work, aux, limit)
    return _plain_scales(g, bits, scale, work, aux, limit)


def _plain_scales(
    g: np.ndarray, bits: int, scale: str, work: np.ndarray, aux: np.ndarray, limit: int
) -> np.ndarray | None:
    """Scales of the groups of ``g`` without importance."""
    if scale == "optimal" and 1 << (bits - 1) == 2:  # two magnitude levels: Q2
        return _scales_q2_optimal(g, work, aux, limit)
    absmax = _absmax(g, work)
    if absmax.view(np.int32).max() > limit:  # NaN and Inf patterns are the largest
        return None
    if scale == "absmax":
        return f16_round(absmax)
    return _scales_candidates(g, absmax, bits, work, aux)


def _weighted_scales(
    g: np.ndarray, h: np.ndarray, bits: int, work: np.ndarray, aux: np.ndarray, limit: int
) -> np.ndarray | None:
    """``optimal`` scales with importance ``h``. A group whose weights with importance are
    all zero (also: whose importance is all zero) has the same weighted error at every
    scale: it gets the plain scale instead."""
    if bits == 2:
        found = _scales_q2_weighted(g, h, limit)
        if found is None:
            return None
        s, signal = found
    else:
        absmax = _absmax(g, work)
        if absmax.view(np.int32).max() > limit:
            return None
        s, signal = _scales_q4_weighted(g, h, absmax, bits, work, aux)
    plain = signal == 0
    if plain.any():
        sub = np.ascontiguousarray(g[plain])
        s[plain] = _plain_scales(
            sub, bits, "optimal", np.empty_like(sub), np.empty_like(sub), limit
        )
    return s


# ---------------------------------------------------------------------------- fp16


def f16_round(s: np.ndarray) -> np.ndarray:
    """Round scales to the nearest binary16 value (ties to even), clipped to
    ``[0, FP16_MAX]``, returned as float32. Same result as ``.astype(np.float16)`` but
    several times faster: rounds the float32 bit pattern to 10 mantissa bits.

    >>> f16_round(np.array([0.1, 1e5, 1e-7], np.float32)).tolist()  # fp16 subnormal: 2**-24 steps
    [0.0999755859375, 65504.0, 1.1920928955078125e-07]
    """
    x = np.clip(np.asarray(s, np.float32), 0, FP16_MAX)
    u = x.view(np.uint32)
    u += np.uint32(0x0FFF) + ((u >> 13) & 1)
    u &= np.uint32(0xFFFFE000)
    tiny = x < _F16_MIN_NORMAL  # fp16 subnormals: a fixed step of 2**-24
    if tiny.any():
        x[tiny] = np.rint(np.asarray(s, np.float32)[tiny] * np.float32(2.0**24)) * np.float32(
            2.0**-24
        )
    return x


def _absmax(g: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Per-row ``max(|g|)``, via the sign-cleared bit patterns (integer max is faster)."""
    bits = work.view(np.int32)
    np.bitwise_and(g.view(np.int32), 0x7FFFFFFF, out=bits)
    return bits.max(axis=1).view(np.float32)


# ---------------------------------------------------------------------------- Q4


def _ladder_base(
    g: np.ndarray, absmax: np.ndarray, bits: int, f0: float, aux: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """What a Q4 ladder whose first rung is ``f0`` times the fp16 absmax scale ``s0``
    works on: ``s0``, ``base = f0 * s0``, ``t = g * c / base`` (in ``aux``; 0 where the
    scale is 0) and ``max |t|``."""
    c = level_center(bits)
    s0 = f16_round(absmax)
    base = s0 * np.float32(f0)  # unit of t: one step is base / c
    with np.errstate(divide="ignore"):
        inv = np.float32(c) / base
    inv[base == 0] = 0
    t = np.multiply(g, inv[:, None], out=aux)
    peak = float((absmax * inv).max(initial=0))  # max |t|
    return s0, base, t, peak


def _rung_levels(
    t: np.ndarray, step: np.floating | None, clip: bool, half: int, work: np.ndarray
) -> np.ndarray:
    """A rung's levels ``v`` (half-integers, in ``work``): ``floor(t * step) + 0.5``
    (``step`` None: the first rung, ``floor(t) + 0.5``), clipped to the codes' range when
    ``clip`` says they could leave it."""
    if step is None:
        v = np.floor(t, out=work)
    else:
        v = np.multiply(t, step, out=work)
        np.floor(v, out=v)
    if clip:
        np.clip(v, -half, half - 1, out=v)
    v += 0.5
    return v


def _best_candidate(
    cands: np.ndarray, svt: np.ndarray, svv: np.ndarray, base: np.ndarray
) -> np.ndarray:
    """The best of a ladder's ``3 nf`` candidate scales (rows: each rung's own scale, its
    least-squares scale, the absmax scale) by their scores ``r (r sum(v v) - 2 sum(v t))``
    at ``r = candidate / base``, fp16-rounded; ties to the smallest. The rungs' sums are in
    the first ``nf`` rows of ``svt`` / ``svv`` (copied here to the other two thirds)."""
    nf = len(cands) // 3
    svt[nf : 2 * nf] = svt[2 * nf :] = svt[:nf]
    svv[nf : 2 * nf] = svv[2 * nf :] = svv[:nf]
    cands = f16_round(cands)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = cands / base
        err = r * (r * svv - 2 * svt)
    best = np.fmin.reduce(err, axis=0)  # ignores nan (zero scale or overflowed sums)
    pick = np.where(err == best, cands, np.float32(np.inf)).min(axis=0)  # ties: smallest
    return np.where(pick <= FP16_MAX, pick, cands[0])


def _scales_candidates(
    g: np.ndarray, absmax: np.ndarray, bits: int, work: np.ndarray, aux: np.ndarray
) -> np.ndarray:
    """Per-group fp16 scales for ``optimal`` Q4 (see :mod:`smoe.quant`).

    With ``s0`` the fp16 absmax scale and ``f0`` the first factor, works on
    ``t = g * c / (f0 * s0)``, so every candidate is at most one scalar multiply away. For a
    candidate's levels ``v`` (half-integers) the squared error at the scale ``r * f0 * s0``
    is, up to the constant ``sum(g^2)`` and the factor ``(f0 * s0 / c)^2``,
    ``r^2 * sum(v^2) - 2 r * sum(v t)``: exact for the codes' own scale, an upper bound for
    any other (re-assigning codes can only lower it). Each candidate's codes give three
    scores: at its own scale, at its least-squares scale, and at the absmax scale ``s0``.
    """
    m = len(g)
    half = 1 << (bits - 1)
    f0 = Q4_FACTORS[0]
    s0, base, t, peak = _ladder_base(g, absmax, bits, f0, aux)
    nf = len(Q4_FACTORS)
    svt = np.empty((3 * nf, m), np.float32)
    svv = np.empty((3 * nf, m), np.float32)
    cands = np.empty((3 * nf, m), np.float32)
    for i, factor in enumerate(Q4_FACTORS):
        rel = np.float32(factor / f0)  # candidate step in units of t's
        step = None if i == 0 else 1 / rel
        clip = bool(peak / rel >= half - 0.01)  # codes could leave [0, 2 c]
        v = _rung_levels(t, step, clip, half, work)
        np.einsum("ij,ij->i", v, t, out=svt[i])
        np.einsum("ij,ij->i", v, v, out=svv[i])
        cands[i] = s0 * np.float32(factor)
        cands[nf + i] = svt[i] / svv[i] * base  # least-squares scale for these codes
        cands[2 * nf + i] = s0
    return _best_candidate(cands, svt, svv, base)


def _scales_q4_weighted(
    g: np.ndarray, h: np.ndarray, absmax: np.ndarray, bits: int, work: np.ndarray, aux: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group fp16 scales for ``optimal`` Q4 with importance ``h`` (shaped like ``g``),
    and each group's ``sum(h v t)`` of the first rung (0: no weight with importance is
    non-zero).

    :func:`_scales_candidates` with the ladder :data:`Q4W_FACTORS` and weighted sums: for
    levels ``v`` at the scale ``r * f0 * s0`` the weighted squared error is, up to constants,
    ``r^2 * sum(h v^2) - 2 r * sum(h v t)``, exact at the codes' own scale, a bound elsewhere;
    each rung scores its own scale, its weighted least-squares scale and ``s0``.
    """
    m = len(g)
    half = 1 << (bits - 1)
    f0 = Q4W_FACTORS[0]
    s0, base, t, peak = _ladder_base(g, absmax, bits, f0, aux)
    u = h * t  # h t: sum(v u) is sum(h v t)
    vv = np.empty_like(g)
    nf = len(Q4W_FACTORS)
    svt = np.empty((3 * nf, m), np.float32)
    svv = np.empty((3 * nf, m), np.float32)
    cands = np.empty((3 * nf, m), np.float32)
    for i, factor in enumerate(Q4W_FACTORS):
        rel = np.float32(factor / f0)
        step = None if i == 0 else np.float32(1) / rel
        clip = bool(peak / rel >= half - 0.01)
        v = _rung_levels(t, step, clip, half, work)
        np.einsum("ij,ij->i", v, u, out=svt[i])
        np.multiply(v, v, out=vv)
        np.einsum("ij,ij->i", vv, h, out=svv[i])
        cands[i] = s0 * np.float32(factor)
        cands[nf + i] = svt[i] / svv[i] * base
        cands[2 * nf + i] = s0
    return _best_candidate(cands, svt, svv, base), svt[0]


# ---------------------------------------------------------------------------- Q2


def _q2_split_matrix(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Level matrix of the Q2 splits ``k = 0..n`` of ``n`` sorted magnitudes (1 for the
    inner level ``s/3``, 3 for the outer ``s``, in thirds of ``s``) and ``1 / sqrt(d_k)``,
    ``d_k = sum(level^2) = k + 9 (n - k)``."""
    k = np.arange(n + 1)
    m = np.where(np.arange(n)[:, None] < k[None, :], 1.0, 3.0)
    return m, 1.0 / np.sqrt(k + 9.0 * (n - k))


def _prefix_sums(p: np.ndarray) -> None:
    """Row ``i`` of ``p`` becomes the sum of rows ``0..i``: float32 adds in row order, in
    place (groups side by side, so each step is one long vector add)."""
    for i in range(1, len(p)):
        np.add(p[i], p[i - 1], out=p[i])


def _tagged_best(score: np.ndarray, score0: np.ndarray, kbits: int) -> np.ndarray:
    """Per group (column), the split ``k`` of the largest score: ``score`` (row ``k - 1``:
    split ``k``, float32, overwritten) or ``score0`` (split 0). The split index rides in
    the low ``kbits`` mantissa bits of the score, so one max finds both; it perturbs scores
    by < 2**-15, which can only swap near-equal splits."""
    n = len(score)
    tag = score.view(np.int32)
    tag &= np.int32(-1 << kbits)
    tag |= np.arange(1, n + 1, dtype=np.int32)[:, None]
    top = np.maximum(tag.max(axis=0), score0.view(np.int32) & np.int32(-1 << kbits))
    return top & np.int32((1 << kbits) - 1)


def _scales_q2_optimal(
    g: np.ndarray, work: np.ndarray, aux: np.ndarray, limit: int
) -> np.ndarray | None:
    """Per-group fp16 scales for Q2 ``optimal``: the least-squares optimum, or ``None`` if
    a magnitude's bit pattern exceeds ``limit``.

    Every code assignment a scale can produce splits a group's sorted magnitudes ``a`` in
    two: split ``k`` puts ``a[:k]`` on the inner level ``s/3`` and the rest on ``s``. In
    thirds of ``s``, ``b_k = 3 * sum(a) - 2 * sum(a[:k])`` and ``d_k = k + 9 (n - k)``; the
    split's least-squares scale is ``3 b_k / d_k`` and its error ``sum(a^2) - b_k^2 / d_k``.
    All ``n + 1`` splits are scored from prefix sums (groups side by side, so each step is
    one long vector add) and the best is kept (:func:`_tagged_best`): the exact optimum,
    then rounded to fp16.
    """
    m, n = g.shape
    ks = np.arange(n + 1)
    r = (1.0 / np.sqrt(ks + 9.0 * (n - ks))).astype(np.float32)
    mag = aux.view(np.int32)  # |g| as bit patterns: same order as the floats, faster sort
    np.bitwise_and(g.view(np.int32), 0x7FFFFFFF, out=mag)
    mag.sort(axis=1)
    if mag[:, -1].max() > limit:  # each group's absmax is its last magnitude
        return None
    p = work.reshape(n, m)  # magnitude rank x group
    for i in range(0, m, _TILE):
        p[:, i : i + _TILE] = aux[i : i + _TILE].T
    _prefix_sums(p)  # row k - 1 becomes sum(a[:k])
    b0 = p[-1] * np.float32(3)  # b_0: every weight on the outer level
    p *= np.float32(-2)
    p += b0  # row k - 1: b_k
    score = np.multiply(p, r[1:, None], out=aux.reshape(n, m))  # b_k / sqrt(d_k) >= 0
    k = _tagged_best(score, b0 * r[0], n.bit_length())
    bk = np.where(k > 0, p[np.maximum(k - 1, 0), np.arange(m)], b0).astype(np.float64)
    s = 3.0 * bk / (k + 9.0 * (n - k))
    over = ~(s <= FP16_MAX)
    if over.any():  # the optimum does not fit in fp16 (or sums overflowed): redo clipped
        a = np.sort(np.abs(g[over].astype(np.float64)), axis=1)
        s[over] = _q2_clipped(a)
    return f16_round(s)


def _q2_clipped(a: np.ndarray, h: np.ndarray | None = None) -> np.ndarray:
    """Q2 optimum with the scale constrained to ``<= FP16_MAX``, for sorted magnitudes
    ``a`` (float64, rows = groups; only huge groups get here) and their importance ``h``
    (None: uniform)."""
    m, r = _q2_split_matrix(a.shape[1])
    if h is None:
        b = a @ (m / 3.0)  # sum(a * level / s)
        d = 1.0 / (9.0 * r * r)  # sum((level / s)^2)
    else:
        b = (h * a) @ (m / 3.0)
        d = h @ (m * m / 9.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.minimum(b / d, FP16_MAX)
        gain = 2 * s * b - s * s * d  # error reduction of split k at its clipped scale
    gain[np.isnan(gain)] = -np.inf
    return s[np.arange(len(a)), gain.argmax(axis=1)]


def _sorted_with_importance(
    g: np.ndarray, h: np.ndarray, limit: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each group's magnitudes sorted with their importance as one sort of 64-bit keys
    ``|w| bits << 32 | h bits`` (ties in ``|w|`` ordered by ``h``): the keys, and as float32
    rank x group arrays the products ``h a`` and the importances ``h``; None if a
    magnitude's bit pattern exceeds ``limit``."""
    mag = np.bitwise_and(g.view(np.uint32), np.uint32(0x7FFFFFFF))
    if int(mag.max(initial=0)) > limit:
        return None
    key = mag.astype(np.uint64)
    key <<= np.uint64(32)
    key |= h.view(np.uint32)
    key.sort(axis=1)
    p = (key >> np.uint64(32)).astype(np.uint32).view(np.float32).T.copy()  # rank x group
    q = key.astype(np.uint32).view(np.float32).T.copy()
    p *= q  # h a
    return key, p, q


def _scales_q2_weighted(
    g: np.ndarray, h: np.ndarray, limit: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-group fp16 scales for Q2 ``optimal`` with importance ``h``: the exact weighted
    least-squares optimum; and each group's ``sum(h |w|)`` (0: no weight with importance
    is non-zero). ``None`` if a magnitude's bit pattern exceeds ``limit``.

    :func:`_scales_q2_optimal` with weights: the magnitudes are sorted with their importance
    (:func:`_sorted_with_importance`); with prefix sums ``P_k = sum(h a)``, ``Q_k = sum(h)``
    over ``a[:k]``, split ``k`` has ``b_k = 3 P_n - 2 P_k`` and ``d_k = 9 Q_n - 8 Q_k``,
    least-squares scale ``3 b_k / d_k`` and error ``sum(h a^2) - b_k^2 / d_k``. Every split
    is scored (``b_k (b_k / d_k)``) and the best kept (:func:`_tagged_best`), then rounded
    to fp16.
    """
    m, n = g.shape
    found = _sorted_with_importance(g, h, limit)
    if found is None:
        return None
    key, p, q = found
    _prefix_sums(p)  # row k - 1 becomes P_k
    _prefix_sums(q)  # and Q_k
    total = p[-1].copy()
    b0 = p[-1] * np.float32(3)  # split 0: every weight on the outer level
    d0 = q[-1] * np.float32(9)
    p *= np.float32(-2)
    p += b0  # row k - 1: b_k
    q *= np.float32(-8)
    q += d0  # row k - 1: d_k
    with np.errstate(divide="ignore", invalid="ignore"):
        score = p * (p / q)
        score0 = b0 * (b0 / d0)
    k = _tagged_best(score, score0, n.bit_length())
    cols = np.arange(m)
    at = np.maximum(k - 1, 0)
    bk = np.where(k > 0, p[at, cols], b0).astype(np.float64)
    dk = np.where(k > 0, q[at, cols], d0).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = 3.0 * bk / dk
    over = ~(s <= FP16_MAX)
    if over.any():  # the optimum does not fit in fp16 (or sums overflowed): redo clipped
        rows = key[over]
        a = (rows >> np.uint64(32)).astype(np.uint32).view(np.float32).astype(np.float64)
        w = rows.astype(np.uint32).view(np.float32).astype(np.float64)
        s[over] = _q2_clipped(a, w)
    return f16_round(s), total
