"""Compiled SMOE-Q2/Q4 encoder (numba), byte-identical to the numpy reference.

:mod:`smoe.quant` keeps the numpy encoder as the reference; these kernels repeat each of
its float32 operations in the same order, so codes and scales are the same bytes. How:

* Work goes in tiles of :data:`TILE` groups held as ``y[m * _W + 4 g + l]`` = weight
  ``4 m + l`` of group ``g``. Loops run across the groups of a tile (SIMD), each step
  handling one weight of every group, so every per-group float32 sum keeps a fixed
  order. Q4's one order-dependent sum, ``einsum("ij,ij->i", v, t)``, is reproduced
  exactly: numpy's SSE loop adds the 4-weight sub-vectors 3, 2, 1, 0 of each block of
  16 into four lanes and ends with ``(l0 + l1) + (l2 + l3)``. :func:`einsum_order_holds`
  checks that this numpy still sums that way; if not, Q4 ``optimal`` stays on numpy.
* Q2 ``optimal`` sorts each group's magnitudes with Batcher's network and scores every
  split with the reference's float32 prefix sums and tagged maxima.
* The per-weight steps are straight-line code generated below (``*_source``) and
  compiled with the module: numba only vectorises loops whose bodies have no inner loops.
* bfloat16 bits are widened as they are loaded (no float32 copy of the tensor), and the
  SNR statistics (``QuantStats``) are summed from the same codes in the same pass.
* With importance, a tile of it is laid out as the weights'. Q4 sums each rung of the
  ladder as numpy's einsum does; Q2 sorts 64-bit keys ``|w| << 32 | h``, or, when every
  weight of the tile is a bfloat16 value, the 32-bit keys ``|w| | h >> 16`` that sort the
  same way at the cost of the plain sort. The drivers take ``None`` for no importance:
  numba then compiles them without the weighted branches.

:func:`encode_chunk` returns :data:`REFUSED` when a ``|w|`` bit pattern exceeds ``limit``
(the caller raises the reference's error) and :data:`NEEDS_REFERENCE` when a Q2 optimum
exceeds 65504 (huge weights and ``overflow="clip"``: the caller re-encodes on numpy).

Importing this module needs numba; :mod:`smoe.quant` falls back to numpy without it.
Compiled code is cached on disk (``__pycache__``, or ``NUMBA_CACHE_DIR``) where writable.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from smoe.quant.kernels.code_cache import compile_cached
from smoe.quant.kernels.jit import cached, jit
from smoe.quant.scales import Q4_FACTORS, Q4W_FACTORS
from smoe_gen.layout import GROUP_SIZE, code_centre

__all__ = [
    "NEEDS_REFERENCE",
    "OK",
    "REFUSED",
    "TILE",
    "einsum_check_cached",
    "einsum_order_holds",
    "encode_chunk",
    "encode_chunk_cached",
    "replay_chunk",
]

if GROUP_SIZE != 64:
    raise ImportError("the compiled encoder is written for groups of 64 weights")

OK, REFUSED, NEEDS_REFERENCE = 0, 1, 2

TILE = 64
"""Groups per tile (a tile of float32 is 16 KiB: it stays in L1/L2)."""

_LANES = 4  # numpy's einsum accumulator: one SSE register of float32
_ROWS = GROUP_SIZE // _LANES  # rows m of a tile
_W = _LANES * TILE  # row length of a tile
_F32 = np.float32
_FP16_MAX = _F32(65504.0)
_MIN_NORMAL = _F32(2.0**-14)
_TWO24 = _F32(2.0**24)
_TWO_M24 = _F32(2.0**-24)
_MAG = np.uint32(0x7FFFFFFF)
_HUGE = np.uint32(np.float32(2.0**60).view(np.uint32))
"""Tiles with a ``|w|`` pattern at or above this sum their stats in float64: below it,
sums of 16 squares in float32 cannot overflow."""
_Q4_F0, _Q4_F1 = (_F32(f) for f in Q4_FACTORS)  # as numpy applies them: float32 factors
_Q4_REL_INV = _F32(1) / _F32(Q4_FACTORS[1] / Q4_FACTORS[0])  # numpy: 1 / np.float32(rel)
_C4 = _F32(code_centre(4))  # the Q4 decoding centre (7.5), from the spec
_Q4W_F = np.array(Q4W_FACTORS, np.float32)  # the ladder with importance, as numpy has it
_Q4W_K = np.array([_F32(1) / _F32(f / Q4W_FACTORS[0]) for f in Q4W_FACTORS], np.float32)
"""Per rung, the factor from the first rung's ``t`` to its own (numpy: 1 / rel)."""
_NF = len(Q4W_FACTORS)


def _generated(source: str):
    """Compile generated source (one function, attributed to this file, so that numba's
    disk cache keys it to this file's version; the Python code itself is cached on disk
    too, :mod:`smoe.quant.kernels.code_cache`) into a jitted function."""
    namespace: dict = {}
    exec(compile_cached(source, __file__), globals(), namespace)
    (fn,) = namespace.values()
    return jit()(fn)


def _sort_network(n: int) -> list[tuple[int, int]]:
    """Batcher's odd-even merge sort of ``n`` (a power of two) keys: comparator pairs."""

    def merge(lo: int, hi: int, r: int):
        step = r * 2
        if step < hi - lo:
            yield from merge(lo, hi, step)
            yield from merge(lo + r, hi, step)
            yield from ((i, i + r) for i in range(lo + r, hi - r, step))
        else:
            yield lo, lo + r

    def sort(lo: int, hi: int):
        if hi - lo >= 1:
            mid = lo + (hi - lo) // 2
            yield from sort(lo, mid)
            yield from sort(mid + 1, hi)
            yield from merge(lo, hi, 1)

    return list(sort(0, n - 1))


def _split_weights() -> np.ndarray:
    """``r[n, k] = float32(1 / sqrt(k + 9 (n - k)))``, as scales._scales_q2_optimal has it."""
    out = np.zeros((GROUP_SIZE + 1, GROUP_SIZE + 1), np.float32)
    for n in range(1, GROUP_SIZE + 1):
        ks = np.arange(n + 1)
        out[n, : n + 1] = (1.0 / np.sqrt(ks + 9.0 * (n - ks))).astype(np.float32)
    return out


_RTAB = _split_weights()


# ---------------------------------------------------------------------------- scalars


@numba.njit(inline="always")
def _f16_round(s):
    """scales.f16_round of one float32: the same bits (also -0, subnormals, NaN).
    Branch-free, so that loops over groups vectorise."""
    x = _FP16_MAX if s > _FP16_MAX else (_F32(0) if s < _F32(0) else s)
    u = np.float32(x).view(np.uint32)
    u = np.uint32(u + np.uint32(0x0FFF) + ((u >> np.uint32(13)) & np.uint32(1)))
    normal = np.uint32(u & np.uint32(0xFFFFE000)).view(np.float32)
    tiny = _F32(np.rint(s * _TWO24)) * _TWO_M24  # fp16 subnormals: steps of 2**-24
    return tiny if x < _MIN_NORMAL else normal


@numba.njit(inline="always")
def _q4_pick(absmax, svt0, svv0, svt1, svv1):
    """The scored choice among one group's candidate scales (scales._scales_candidates):
    ``svt``, ``svv`` are ``sum(v t)`` and ``sum(v v)`` of the two candidates' codes."""
    s0 = _f16_round(absmax)
    base = s0 * _Q4_F0
    c0 = _f16_round(s0 * _Q4_F0)
    c1 = _f16_round(s0 * _Q4_F1)
    c2 = _f16_round(svt0 / svv0 * base)
    c3 = _f16_round(svt1 / svv1 * base)
    r = c0 / base
    e0 = r * (r * svv0 - _F32(2) * svt0)
    r = c1 / base
    e1 = r * (r * svv1 - _F32(2) * svt1)
    r = c2 / base
    e2 = r * (r * svv0 - _F32(2) * svt0)
    r = c3 / base
    e3 = r * (r * svv1 - _F32(2) * svt1)
    r = s0 / base
    e4 = r * (r * svv0 - _F32(2) * svt0)
    e5 = r * (r * svv1 - _F32(2) * svt1)
    best = e0 if e0 == e0 else _F32(np.nan)  # np.fmin.reduce: NaN scores are skipped
    best = e1 if not (best <= e1) and e1 == e1 else best
    best = e2 if not (best <= e2) and e2 == e2 else best
    best = e3 if not (best <= e3) and e3 == e3 else best
    best = e4 if not (best <= e4) and e4 == e4 else best
    best = e5 if not (best <= e5) and e5 == e5 else best
    pick = c0 if e0 == best else _F32(np.inf)  # ties: the smallest scale
    pick = c1 if e1 == best and c1 < pick else pick
    pick = c2 if e2 == best and c2 < pick else pick
    pick = c3 if e3 == best and c3 < pick else pick
    pick = s0 if (e4 == best or e5 == best) and s0 < pick else pick
    return pick if pick <= _FP16_MAX else c0


@jit()
def _bit_length(n):
    k = 0
    while n >> k:
        k += 1
    return k


@jit()
def _q2_scale(bk, k, n):
    """The least-squares scale of Q2 split ``k`` (float64, as numpy computes it)."""
    return 3.0 * np.float64(bk) / (k + 9.0 * (n - k))


@jit()
def _cx(a, b):
    """A comparator of the sorting network."""
    return np.uint32(min(a, b)), np.uint32(max(a, b))


@jit()
def _cx64(a, b):
    """A comparator of the sorting network on 64-bit keys."""
    return np.uint64(min(a, b)), np.uint64(max(a, b))


@jit()
def _as_f32(u):
    return np.uint32(u).view(np.float32)


@jit()
def _wfirst(total, weight, mask):
    """Weighted Q2 split 0: ``b_0 = 3 P_n``, ``d_0 = 9 Q_n`` and its tag."""
    b0 = total * _F32(3)
    d0 = weight * _F32(9)
    return b0, d0, np.int32(np.float32(b0 * (b0 / d0)).view(np.int32) & mask)


@jit()
def _wsplit(pk, qk, b0, d0, mask, k, best_tag, best_b, best_d):
    """Weighted Q2 split ``k``: the better of it and the best so far, as (tag, b_k, d_k)."""
    bk = pk * _F32(-2) + b0
    dk = qk * _F32(-8) + d0
    tag = np.int32((np.float32(bk * (bk / dk)).view(np.int32) & mask) | k)
    better = tag > best_tag
    return max(tag, best_tag), (bk if better else best_b), (dk if better else best_d)


@jit()
def _first(total, r0, mask):
    """Q2 split 0: ``b_0 = 3 sum(a)`` and its tag."""
    b0 = total * _F32(3)
    return b0, np.int32(np.float32(b0 * r0).view(np.int32) & mask)


@jit()
def _split(prefix, b0, rk, mask, k, best_tag, best_b):
    """Q2 split ``k``: the better of it and the best so far, as (tag, b_k)."""
    bk = prefix * _F32(-2) + b0
    tag = np.int32((np.float32(bk * rk).view(np.int32) & mask) | k)
    return max(tag, best_tag), (bk if tag > best_tag else best_b)


@jit(fastmath={"reassoc"})
def _add_sums(x, e, acc):
    """``acc`` (float64[4]) += ``sum(x), sum(x^2), sum(e), sum(e^2)`` (float32 partial
    sums in any order, redone in float64 if they overflow)."""
    a = _F32(0)
    b = _F32(0)
    c = _F32(0)
    d = _F32(0)
    for i in range(x.size):
        a += x[i]
        b += x[i] * x[i]
        c += e[i]
        d += e[i] * e[i]
    if np.isfinite(a) and np.isfinite(b) and np.isfinite(c) and np.isfinite(d):
        acc[0] += a
        acc[1] += b
        acc[2] += c
        acc[3] += d
        return
    for i in range(x.size):
        y = np.float64(x[i])
        z = np.float64(e[i])
        acc[0] += y
        acc[1] += y * y
        acc[2] += z
        acc[3] += z * z


@jit(fastmath={"reassoc"})
def _add_wsums(x, e, h, acc):
    """``acc[4:6]`` += ``sum(h x^2), sum(h e^2)`` (as :func:`_add_sums`)."""
    a = _F32(0)
    b = _F32(0)
    for i in range(x.size):
        a += h[i] * x[i] * x[i]
        b += h[i] * e[i] * e[i]
    if np.isfinite(a) and np.isfinite(b):
        acc[4] += a
        acc[5] += b
        return
    for i in range(x.size):
        y = np.float64(x[i])
        z = np.float64(e[i])
        acc[4] += np.float64(h[i]) * y * y
        acc[5] += np.float64(h[i]) * z * z


# ---------------------------------------------------------------------------- generated


def _einsum_rows() -> list[int]:
    """Tile rows in numpy's einsum order: sub-vectors 3, 2, 1, 0 of each block of 16."""
    return [(i // 4) * 4 + 3 - i % 4 for i in range(_ROWS)]


def _q4_sums_source() -> str:
    """``_q4_sums(y, inv4, out)``: per lane ``q`` of a tile, the Q4 candidates' running sums
    ``sum(v0 t), sum(v1 t), sum(v0 v0), sum(v1 v1)`` (``t = w * inv4[q]``) into
    ``out[k * _W + q]``. The ``v t`` sums run in numpy's einsum order and start from +0
    as its accumulators do; the ``v v`` sums (of quarter-integers) are exact anyhow."""
    lines = ["def _q4_sums(y, inv4, out):", f"    for q in range({_W}):", "        inv = inv4[q]"]
    for i, m in enumerate(_einsum_rows()):
        lines += [
            f"        t = y[{m * _W} + q] * inv",
            "        va = min(max(np.floor(t), _F32(-8)), _F32(7)) + _F32(0.5)",
            "        vb = min(max(np.floor(t * _Q4_REL_INV), _F32(-8)), _F32(7)) + _F32(0.5)",
        ]
        if i == 0:
            lines += [
                "        a = va * t + _F32(0)",
                "        b = vb * t + _F32(0)",
                "        c = va * va",
                "        d = vb * vb",
            ]
        else:
            lines += [
                "        a = va * t + a",
                "        b = vb * t + b",
                "        c = c + va * va",
                "        d = d + vb * vb",
            ]
    lines += [f"        out[{k * _W} + q] = {v}" for k, v in enumerate("abcd")]
    return "\n".join(lines) + "\n"


def _codes_source(weighted: bool = False) -> str:
    """``_codes_rows(y, inv4, scl4, half, lo, hi, codes, sums)``: per lane ``q`` of a tile,
    the codes ``clip(floor(w * inv4[q]), lo, hi) + half`` into ``codes[m * _W + q]`` and the
    lane's ``sum(w), sum(w^2), sum(err), sum(err^2)`` into ``sums[k * _W + q]``, with
    ``err = w - (f + 0.5) * scl4[q]`` (packing.floor_codes, and the stats of encode_into).
    ``weighted``: ``_codes_rows_w(y, hy, ...)``, also ``sum(h w^2), sum(h err^2)`` with the
    importance tile ``hy``."""
    name, extra = ("_codes_rows_w", "hy, ") if weighted else ("_codes_rows", "")
    lines = [
        f"def {name}(y, {extra}inv4, scl4, half, lo, hi, codes, sums):",
        f"    for q in range({_W}):",
        "        inv = inv4[q]",
        "        scl = scl4[q]",
    ]
    out = "abcdpr" if weighted else "abcd"
    for m in range(_ROWS):
        lines += [
            f"        x = y[{m * _W} + q]",
            "        f = min(max(np.floor(x * inv), lo), hi)",
            f"        codes[{m * _W} + q] = np.uint8(np.int32(f) + half)",
            "        e = x - (f + _F32(0.5)) * scl",
        ]
        if weighted:
            lines.append(f"        h = hy[{m * _W} + q]")
        if m == 0:
            lines += ["        a = x", "        b = x * x", "        c = e", "        d = e * e"]
            if weighted:
                lines += ["        p = h * x * x", "        r = h * e * e"]
        else:
            lines += [
                "        a = a + x",
                "        b = b + x * x",
                "        c = c + e",
                "        d = d + e * e",
            ]
            if weighted:
                lines += ["        p = p + h * x * x", "        r = r + h * e * e"]
    lines += [f"        sums[{k * _W} + q] = {v}" for k, v in enumerate(out)]
    return "\n".join(lines) + "\n"


def _q4w_sums_source() -> str:
    """``_q4w_sums(y, hy, inv4, out)``: per lane ``q`` of a tile and rung ``i`` of the ladder
    (scales._scales_q4_weighted), ``sum(v_i u)`` with ``u = h t`` into ``out[2 i * _W + q]``
    and ``sum((v_i v_i) h)`` into ``out[(2 i + 1) * _W + q]``, both in numpy's einsum order
    from +0 (``t = w * inv4[q]``, ``h`` the importance tile ``hy``)."""
    lines = [
        "def _q4w_sums(y, hy, inv4, out):",
        f"    for q in range({_W}):",
        "        inv = inv4[q]",
    ]
    for n, m in enumerate(_einsum_rows()):
        lines += [
            f"        t = y[{m * _W} + q] * inv",
            f"        h = hy[{m * _W} + q]",
            "        u = h * t",
        ]
        for i in range(_NF):
            x = "t" if i == 0 else f"t * _F32({float(_Q4W_K[i])!r})"
            lines.append(f"        v = min(max(np.floor({x}), _F32(-8)), _F32(7)) + _F32(0.5)")
            a, c = ("_F32(0)", "_F32(0)") if n == 0 else (f"a{i}", f"c{i}")
            lines += [f"        a{i} = v * u + {a}", f"        c{i} = v * v * h + {c}"]
    for i in range(_NF):
        lines += [
            f"        out[{2 * i * _W} + q] = a{i}",
            f"        out[{(2 * i + 1) * _W} + q] = c{i}",
        ]
    return "\n".join(lines) + "\n"


def _q2_optima_source() -> str:
    """``_q2_optima(yu, out)``: per group of a tile, the float64 least-squares scale of its
    best Q2 split (scales._scales_q2_optimal): sorting network on the ``|w|`` bit patterns,
    float32 prefix sums, tagged scores of the splits ``k = 0 .. 64``."""
    n = GROUP_SIZE
    mask = -1 << n.bit_length()
    r = _RTAB[n]
    names: dict[int, str] = {}
    count = 0

    def fresh(i: int) -> str:  # one name per value: little work for numba's SSA pass
        nonlocal count
        count += 1
        names[i] = f"v{count}"
        return names[i]

    lines = ["def _q2_optima(yu, out):", f"    for g in range({TILE}):"]
    for j in range(n):
        m, lane = divmod(j, _LANES)
        lines.append(f"        {fresh(j)} = np.uint32(yu[{m * _W + lane} + {_LANES} * g] & _MAG)")
    for i, j in _sort_network(n):
        a, b = names[i], names[j]
        lines.append(f"        {fresh(i)}, {fresh(j)} = _cx({a}, {b})")
    lines.append(f"        p0 = _as_f32({names[0]})")
    lines += [f"        p{j} = p{j - 1} + _as_f32({names[j]})" for j in range(1, n)]
    lines.append(f"        b0, t0 = _first(p{n - 1}, _F32({float(r[0])!r}), {mask})")
    lines.append("        s0 = b0")
    lines += [
        f"        t{k}, s{k} = _split(p{k - 1}, b0, _F32({float(r[k])!r}), {mask}, {k}, "
        f"t{k - 1}, s{k - 1})"
        for k in range(1, n + 1)
    ]
    lines.append(f"        out[g] = _q2_scale(s{n}, t{n} & {~mask}, {n})")
    return "\n".join(lines) + "\n"


def _q4w_pick_lines(indent: str, out: str) -> list[str]:
    """Straight-line code of one group's weighted Q4 choice (scales._scales_q4_weighted) from
    ``absmax``, ``svt0..``, ``svv0..`` into ``out``: per rung its own scale, its
    least-squares scale and the absmax scale ``s0`` (np.fmin.reduce skips NaN scores; ties
    take the smallest scale; a pick above 65504 becomes the first rung's scale)."""
    lines = ["s0 = _f16_round(absmax)", f"base = s0 * _F32({float(_Q4W_F[0])!r})", "r0 = s0 / base"]
    cands = []
    for i in range(_NF):
        lines += [
            f"c{i} = _f16_round(s0 * _F32({float(_Q4W_F[i])!r}))",
            f"l{i} = _f16_round(svt{i} / svv{i} * base)",
        ]
        for c in (f"c{i}", f"l{i}"):
            lines += [f"r = {c} / base", f"e{c} = r * (r * svv{i} - _F32(2) * svt{i})"]
            cands.append((c, f"e{c}"))
        lines.append(f"es{i} = r0 * (r0 * svv{i} - _F32(2) * svt{i})")
        cands.append(("s0", f"es{i}"))
    first = cands[0][1]
    lines.append(f"best = {first} if {first} == {first} else _F32(np.nan)")
    lines += [f"best = {e} if not (best <= {e}) and {e} == {e} else best" for _, e in cands[1:]]
    lines.append("pick = _F32(np.inf)")
    lines += [f"pick = {c} if {e} == best and {c} < pick else pick" for c, e in cands]
    lines.append(f"{out} = pick if pick <= _FP16_MAX else c0")
    return [indent + line for line in lines]


def _q4w_choose_source() -> str:
    """``_q4w_choose(wsums, amax, scales, plain)``: per group of a tile, the weighted Q4
    scale from the lane sums of :func:`_q4w_sums` (combined as numpy's einsum does) into
    ``scales[g]``; ``plain[g]``: whether the group's weighted signal is 0. Returns whether
    any is."""
    lines = [
        "def _q4w_choose(wsums, amax, scales, plain):",
        "    any_plain = False",
        f"    for g in range({TILE}):",
        f"        k = {_LANES} * g",
    ]
    for i in range(_NF):
        for name, row in ((f"svt{i}", 2 * i), (f"svv{i}", 2 * i + 1)):
            o = row * _W
            lines.append(
                f"        {name} = _F32(0) + ((wsums[{o} + k] + wsums[{o + 1} + k]) + "
                f"(wsums[{o + 2} + k] + wsums[{o + 3} + k]))"
            )
    lines.append("        absmax = np.uint32(amax[g]).view(np.float32)")
    lines += _q4w_pick_lines(" " * 8, "scales[g]")
    lines += [
        f"    for g in range({TILE}):",
        f"        k = {_LANES} * g",
        "        plain[g] = ((wsums[k] + wsums[k + 1]) + (wsums[k + 2] + wsums[k + 3])) == _F32(0)",
        "        any_plain |= plain[g]",
        "    return any_plain",
    ]
    return "\n".join(lines) + "\n"


def _q4w_pick_source() -> str:
    """``_q4w_pick(absmax, svt, svv)``: one group's weighted Q4 scale from its sums."""
    lines = ["def _q4w_pick(absmax, svt, svv):"]
    lines += [f"    svt{i} = svt[{i}]\n    svv{i} = svv[{i}]" for i in range(_NF)]
    lines += _q4w_pick_lines(" " * 4, "out")
    lines.append("    return out")
    return "\n".join(lines) + "\n"


def _q2w_optima_source(wide: bool) -> str:
    """``_q2w_optima32(yu, hu, out, total)`` (``wide``: ``_q2w_optima64``): per group of a
    tile, the float64 least-squares scale of its best weighted Q2 split
    (scales._scales_q2_weighted) into ``out[g]`` and ``sum(h |w|)`` into ``total[g]``.

    The magnitudes sort with their importance ``hu`` as the keys ``|w| << 32 | h`` do.
    ``wide`` sorts those 64-bit keys; the 32-bit form ``|w| | h >> 16`` sorts the same way
    and is exact when every ``|w|`` has 16 low zero bits (bfloat16 weights; the importance
    always has them), at the cost of the unweighted sort."""
    n = GROUP_SIZE
    mask = -1 << n.bit_length()
    names: dict[int, str] = {}
    count = 0

    def fresh(i: int) -> str:
        nonlocal count
        count += 1
        names[i] = f"v{count}"
        return names[i]

    name = "_q2w_optima64" if wide else "_q2w_optima32"
    lines = [f"def {name}(yu, hu, out, total):", f"    for g in range({TILE}):"]
    for j in range(n):
        m, lane = divmod(j, _LANES)
        at = f"{m * _W + lane} + {_LANES} * g"
        key = (
            f"(np.uint64(yu[{at}] & _MAG) << np.uint64(32)) | np.uint64(hu[{at}])"
            if wide
            else f"np.uint32((yu[{at}] & _MAG) | (hu[{at}] >> np.uint32(16)))"
        )
        lines.append(f"        {fresh(j)} = {key}")
    cx = "_cx64" if wide else "_cx"
    for i, j in _sort_network(n):
        a, b = names[i], names[j]
        lines.append(f"        {fresh(i)}, {fresh(j)} = {cx}({a}, {b})")
    for j in range(n):
        v = names[j]
        if wide:
            lines += [
                f"        a = _as_f32(np.uint32({v} >> np.uint64(32)))",
                f"        h = _as_f32(np.uint32({v} & np.uint64(0xFFFFFFFF)))",
            ]
        else:
            lines += [
                f"        a = _as_f32({v} & np.uint32(0xFFFF0000))",
                f"        h = _as_f32(np.uint32({v} << np.uint32(16)))",
            ]
        lines += (
            [f"        p{j} = h * a", f"        q{j} = h"]
            if j == 0
            else [f"        p{j} = p{j - 1} + h * a", f"        q{j} = q{j - 1} + h"]
        )
    lines.append(f"        b0, d0, t0 = _wfirst(p{n - 1}, q{n - 1}, {mask})")
    lines.append("        s0 = b0\n        e0 = d0")
    lines += [
        f"        t{k}, s{k}, e{k} = _wsplit(p{k - 1}, q{k - 1}, b0, d0, {mask}, {k}, "
        f"t{k - 1}, s{k - 1}, e{k - 1})"
        for k in range(1, n + 1)
    ]
    lines.append(f"        out[g] = 3.0 * np.float64(s{n}) / np.float64(e{n})")
    lines.append(f"        total[g] = p{n - 1}")
    return "\n".join(lines) + "\n"


_q4_sums = _generated(_q4_sums_source())
_codes_rows = _generated(_codes_source())
_q2_optima = _generated(_q2_optima_source())
_codes_rows_w = _generated(_codes_source(weighted=True))
_q4w_sums = _generated(_q4w_sums_source())
_q4w_choose = _generated(_q4w_choose_source())
_q4w_pick = _generated(_q4w_pick_source())
_q2w_optima32 = _generated(_q2w_optima_source(wide=False))
_q2w_optima64 = _generated(_q2w_optima_source(wide=True))


# ---------------------------------------------------------------------------- tiles


@jit()
def _load_bf16(src64, g0, t, words, yu, mx):
    """Tile of groups ``g0 .. g0 + t - 1`` from bfloat16 bits (``src64``: 4 per word) into
    ``yu`` (float32 bits; groups past ``t`` are zeros); ``mx[q]``: the lane's largest
    ``|w|`` pattern. ``words``: scratch, ``_ROWS * TILE`` uint64."""
    for g in range(TILE):
        for m in range(_ROWS):
            words[m * TILE + g] = src64[(g0 + g) * _ROWS + m] if g < t else np.uint64(0)
    half = words.view(np.uint16)
    for q in range(_W):
        mx[q] = 0
    for m in range(_ROWS):
        for q in range(_W):
            u = np.uint32(np.uint32(half[m * _W + q]) << np.uint32(16))
            yu[m * _W + q] = u
            mx[q] = max(mx[q], np.uint32(u & _MAG))


@jit()
def _load_f32(src64, g0, t, yu, mx):
    """:func:`_load_bf16` for float32 weights (``src64``: 2 per word)."""
    y64 = yu.view(np.uint64)
    for g in range(TILE):
        for m in range(_ROWS):
            for h in range(2):
                y64[m * 2 * TILE + 2 * g + h] = (
                    src64[(g0 + g) * 2 * _ROWS + 2 * m + h] if g < t else np.uint64(0)
                )
    for q in range(_W):
        mx[q] = 0
    for m in range(_ROWS):
        for q in range(_W):
            mx[q] = max(mx[q], np.uint32(yu[m * _W + q] & _MAG))


@jit()
def _load(src64, f32, g0, t, words, yu, mx, amax):
    """Load tile ``g0`` (``t`` groups); ``amax[g]``: each group's largest ``|w|`` bit
    pattern. Returns the tile's largest."""
    if f32:
        _load_f32(src64, g0, t, yu, mx)
    else:
        _load_bf16(src64, g0, t, words, yu, mx)
    per = 2 * _ROWS if f32 else _ROWS  # words per group
    ahead = np.uint64(0)  # read a line of each 64 bytes 3 tiles ahead: a software prefetch
    for i in range((g0 + 3 * TILE) * per, min(src64.size, (g0 + 4 * TILE) * per), 8):
        ahead |= src64[i]
    words[0] = ahead  # (a scratch word, free again: keeps the reads)
    top = np.uint32(0)
    for g in range(TILE):
        k = _LANES * g
        a = max(max(mx[k], mx[k + 1]), max(mx[k + 2], mx[k + 3]))
        amax[g] = a
        top = max(top, a)
    return top


@jit()
def _spread(per_group, per_lane):
    """``per_lane[4 g + l] = per_group[g]``."""
    for g in range(TILE):
        for lane in range(_LANES):
            per_lane[_LANES * g + lane] = per_group[g]


@jit()
def _load_importance(hcols, c0, g0, t, hy, last):
    """Importance tile of groups ``g0 .. g0 + t - 1`` into ``hy``, laid out as the weights:
    weight ``i`` of the chunk has column ``(c0 + i) % hcols.size``. Skipped when a whole tile
    starts at the column ``last[0]`` of the tile before (the same values); groups past
    ``t`` keep stale values (they are zeros: no weighted signal, the plain scale 0)."""
    cols = hcols.size
    start = (c0 + g0 * GROUP_SIZE) % cols
    if t == TILE and start == last[0]:
        return
    last[0] = start if t == TILE else -1
    for g in range(t):
        col = (c0 + (g0 + g) * GROUP_SIZE) % cols
        if col + GROUP_SIZE <= cols:
            for m in range(_ROWS):
                for lane in range(_LANES):
                    hy[m * _W + _LANES * g + lane] = hcols[col + _LANES * m + lane]
        else:  # the group wraps to the next row
            for m in range(_ROWS):
                for lane in range(_LANES):
                    hy[m * _W + _LANES * g + lane] = hcols[(col + _LANES * m + lane) % cols]


@jit()
def _q4_scales(y, amax, scales, inv4, sums, which):
    """Q4 ``optimal`` scales of a tile (scales._scales_candidates), into ``scales[g]`` for the
    groups ``g`` with ``which[g]``."""
    for g in range(TILE):
        base = _f16_round(np.uint32(amax[g]).view(np.float32)) * _Q4_F0
        inv = _C4 / base if base != _F32(0) else _F32(0)
        for lane in range(_LANES):
            inv4[_LANES * g + lane] = inv
    _q4_sums(y, inv4, sums)
    for g in range(TILE):
        if not which[g]:
            continue
        k = _LANES * g
        svt0 = _F32(0) + ((sums[k] + sums[k + 1]) + (sums[k + 2] + sums[k + 3]))
        k += _W
        svt1 = _F32(0) + ((sums[k] + sums[k + 1]) + (sums[k + 2] + sums[k + 3]))
        k += _W
        svv0 = (sums[k] + sums[k + 1]) + (sums[k + 2] + sums[k + 3])
        k += _W
        svv1 = (sums[k] + sums[k + 1]) + (sums[k + 2] + sums[k + 3])
        scales[g] = _q4_pick(np.uint32(amax[g]).view(np.float32), svt0, svv0, svt1, svv1)


@jit()
def _q4w_scales(y, hy, amax, plain, scales, inv4, sums, wsums):
    """Q4 ``optimal`` scales of a tile with importance (scales._weighted_scales): the ladder's
    weighted choice, or the plain one for the groups whose weighted signal is 0."""
    for g in range(TILE):
        base = _f16_round(np.uint32(amax[g]).view(np.float32)) * _Q4W_F[0]
        inv = _C4 / base if base != _F32(0) else _F32(0)
        for lane in range(_LANES):
            inv4[_LANES * g + lane] = inv
    _q4w_sums(y, hy, inv4, wsums)
    if _q4w_choose(wsums, amax, scales, plain):
        _q4_scales(y, amax, scales, inv4, sums, plain)


@jit()
def _bf16_exact(yu):
    """Whether every weight of a tile has 16 low zero bits (bfloat16 values)."""
    acc = np.uint32(0)
    for i in range(yu.size):
        acc |= yu[i]
    return (acc & np.uint32(0xFFFF)) == 0


@jit()
def _q2w_optima(yu, hu, narrow, plain, optima, total, plain_optima):
    """Q2 ``optimal`` least-squares scales (float64) of a tile with importance
    (scales._weighted_scales); the plain ones where the weighted signal is 0."""
    if narrow:
        _q2w_optima32(yu, hu, optima, total)
    else:
        _q2w_optima64(yu, hu, optima, total)
    any_plain = False
    for g in range(TILE):
        plain[g] = total[g] == _F32(0)
        any_plain = any_plain or plain[g]
    if any_plain:
        _q2_optima(yu, plain_optima)
        for g in range(TILE):
            if plain[g]:
                optima[g] = plain_optima[g]


@jit()
def _finish(y, top, sc, bits, g0, t, inv4, scl4, codes, sums, lanes, out, packed, scales, acc, hy):
    """Codes, packed bytes, scales and stats of a tile whose scales ``sc`` are chosen
    (also the importance-weighted stats from the importance tile ``hy``, unless None)."""
    c = _F32(((1 << bits) - 1) / 2)
    half = 1 << (bits - 1)
    for g in range(t):
        scales[g0 + g] = sc[g]
    per_group = sums[: 2 * TILE]  # (free until _codes_rows)
    for g in range(TILE):
        s = sc[g]
        per_group[g] = c / s if s > _F32(0) else _F32(0)
        per_group[TILE + g] = s / c
    _spread(per_group[:TILE], inv4)
    _spread(per_group[TILE:], scl4)
    if hy is None:  # (numba compiles only the branch the argument's type takes)
        _codes_rows(y, inv4, scl4, half, _F32(-half), _F32(half - 1), codes, sums)
    else:
        _codes_rows_w(y, hy, inv4, scl4, half, _F32(-half), _F32(half - 1), codes, sums)
    words = codes.view(np.uint32)  # word m * TILE + g: the codes of weights 4 m .. 4 m + 3
    if bits == 4:
        out16 = out.view(np.uint16)
        for g in range(TILE):
            for m in range(_ROWS):
                w = words[m * TILE + g]
                out16[g * _ROWS + m] = np.uint16(
                    (w & 0xF) | ((w >> 4) & 0xF0) | ((w >> 8) & 0xF00) | ((w >> 12) & 0xF000)
                )
    else:
        for g in range(TILE):
            for m in range(_ROWS):
                w = words[m * TILE + g]
                out[g * _ROWS + m] = np.uint8(
                    (w & 0x3) | ((w >> 6) & 0xC) | ((w >> 12) & 0x30) | ((w >> 18) & 0xC0)
                )
    step = GROUP_SIZE * bits // 8  # a multiple of 8: copy words (alignment does not matter)
    dst = packed[g0 * step : (g0 + t) * step].view(np.uint64)
    src = out[: t * step].view(np.uint64)
    for i in range(dst.size):
        dst[i] = src[i]
    if top < _HUGE:
        for i in range(acc.size * _W):
            lanes[i] += sums[i]
    else:  # float32 lane sums could overflow: this tile's stats in float64
        _tile_sums64(y, sc, bits, acc, hy)


@jit()
def _tile_sums64(y, scales, bits, acc, hy):
    """The stats of a tile in float64 (padding groups are zeros with scale 0: they add
    nothing)."""
    c = _F32(((1 << bits) - 1) / 2)
    half = 1 << (bits - 1)
    for m in range(_ROWS):
        for q in range(_W):
            s = scales[q // _LANES]
            inv = c / s if s > _F32(0) else _F32(0)
            x = y[m * _W + q]
            f = min(max(np.floor(x * inv), _F32(-half)), _F32(half - 1))
            e = np.float64(x - (f + _F32(0.5)) * (s / c))
            acc[0] += np.float64(x)
            acc[1] += np.float64(x) * np.float64(x)
            acc[2] += e
            acc[3] += e * e
            if hy is not None:
                h = np.float64(hy[m * _W + q])
                acc[4] += h * np.float64(x) * np.float64(x)
                acc[5] += h * e * e


# ---------------------------------------------------------------------------- one group


@jit()
def _q4_group(w, absmax):
    """Q4 ``optimal`` scale of one group ``w`` (float32, fewer than 64 weights)."""
    n = w.size
    base = _f16_round(absmax) * _Q4_F0
    inv = _C4 / base if base != _F32(0) else _F32(0)
    a = np.zeros(_LANES, np.float32)
    b = np.zeros(_LANES, np.float32)
    svv0 = _F32(0)
    svv1 = _F32(0)
    for j in range(0, n, 16):  # numpy's loop: blocks of 16, then zero-filled vectors of 4
        subs = (3, 2, 1, 0) if j + 16 <= n else (0, 1, 2, 3)
        for s in subs:
            for lane in range(_LANES):
                p = j + _LANES * s + lane
                if p < n:
                    tq = w[p] * inv
                    va = min(max(np.floor(tq), _F32(-8)), _F32(7)) + _F32(0.5)
                    vb = min(max(np.floor(tq * _Q4_REL_INV), _F32(-8)), _F32(7)) + _F32(0.5)
                    a[lane] = va * tq + a[lane]
                    b[lane] = vb * tq + b[lane]
                    svv0 += va * va
                    svv1 += vb * vb
                elif j + _LANES * s < n:
                    a[lane] = _F32(0) + a[lane]
                    b[lane] = _F32(0) + b[lane]
    svt0 = _F32(0) + ((a[0] + a[1]) + (a[2] + a[3]))
    svt1 = _F32(0) + ((b[0] + b[1]) + (b[2] + b[3]))
    return _q4_pick(absmax, svt0, svv0, svt1, svv1)


@jit()
def _q4w_group(w, h, absmax):
    """Q4 ``optimal`` scale of one group ``w`` (fewer than 64 weights) with importance ``h``:
    the ladder's sums in numpy's einsum order for a short row (:func:`_q4_group`)."""
    n = w.size
    base = _f16_round(absmax) * _Q4W_F[0]
    inv = _C4 / base if base != _F32(0) else _F32(0)
    a = np.zeros((_NF, _LANES), np.float32)
    c = np.zeros((_NF, _LANES), np.float32)
    for j in range(0, n, 16):
        subs = (3, 2, 1, 0) if j + 16 <= n else (0, 1, 2, 3)
        for s in subs:
            for lane in range(_LANES):
                p = j + _LANES * s + lane
                if p < n:
                    tq = w[p] * inv
                    hq = h[p]
                    u = hq * tq
                    for i in range(_NF):
                        x = tq if i == 0 else tq * _Q4W_K[i]
                        v = min(max(np.floor(x), _F32(-8)), _F32(7)) + _F32(0.5)
                        a[i, lane] = v * u + a[i, lane]
                        c[i, lane] = v * v * hq + c[i, lane]
                elif j + _LANES * s < n:
                    for i in range(_NF):
                        a[i, lane] = _F32(0) + a[i, lane]
                        c[i, lane] = _F32(0) + c[i, lane]
    svt = np.empty(_NF, np.float32)
    svv = np.empty(_NF, np.float32)
    for i in range(_NF):
        svt[i] = _F32(0) + ((a[i, 0] + a[i, 1]) + (a[i, 2] + a[i, 3]))
        svv[i] = _F32(0) + ((c[i, 0] + c[i, 1]) + (c[i, 2] + c[i, 3]))
    if svt[0] == _F32(0):
        return _q4_group(w, absmax)
    return _q4w_pick(absmax, svt, svv)


@jit()
def _q2_group(w, rtab):
    """Q2 ``optimal`` scale of one group ``w`` (float32, fewer than 64 weights); -1 when
    the optimum exceeds 65504."""
    n = w.size
    au = np.empty(n, np.uint32)
    for j in range(n):  # insertion sort of the |w| bit patterns
        u = np.uint32(np.float32(w[j]).view(np.uint32) & _MAG)
        i = j
        while i > 0 and au[i - 1] > u:
            au[i] = au[i - 1]
            i -= 1
        au[i] = u
    a = au.view(np.float32)
    for k in range(1, n):
        a[k] = a[k] + a[k - 1]
    kbits = _bit_length(n)
    mask = np.int32(-1 << kbits)
    b0, best_tag = _first(a[n - 1], rtab[n, 0], mask)
    best_b = b0
    for k in range(1, n + 1):
        best_tag, best_b = _split(a[k - 1], b0, rtab[n, k], mask, k, best_tag, best_b)
    s = _q2_scale(best_b, best_tag & ((1 << kbits) - 1), n)
    return _f16_round(_F32(s)) if s <= 65504.0 else _F32(-1)


@jit()
def _q2w_group(w, h, rtab):
    """Q2 ``optimal`` scale of one group ``w`` (fewer than 64 weights) with importance
    ``h`` (scales._scales_q2_weighted); -1 when the optimum exceeds 65504."""
    n = w.size
    keys = np.empty(n, np.uint64)
    for j in range(n):  # insertion sort of the keys |w| << 32 | h
        u = (np.uint64(np.float32(w[j]).view(np.uint32) & _MAG) << np.uint64(32)) | np.uint64(
            np.float32(h[j]).view(np.uint32)
        )
        i = j
        while i > 0 and keys[i - 1] > u:
            keys[i] = keys[i - 1]
            i -= 1
        keys[i] = u
    p = np.empty(n, np.float32)
    q = np.empty(n, np.float32)
    for j in range(n):
        a = _as_f32(np.uint32(keys[j] >> np.uint64(32)))
        hj = _as_f32(np.uint32(keys[j] & np.uint64(0xFFFFFFFF)))
        p[j] = hj * a if j == 0 else p[j - 1] + hj * a
        q[j] = hj if j == 0 else q[j - 1] + hj
    if p[n - 1] == _F32(0):
        return _q2_group(w, rtab)
    kbits = _bit_length(n)
    mask = np.int32(-1 << kbits)
    b0, d0, best_tag = _wfirst(p[n - 1], q[n - 1], mask)
    best_b = b0
    best_d = d0
    for k in range(1, n + 1):
        best_tag, best_b, best_d = _wsplit(
            p[k - 1], q[k - 1], b0, d0, mask, k, best_tag, best_b, best_d
        )
    s = 3.0 * np.float64(best_b) / np.float64(best_d)
    return _f16_round(_F32(s)) if s <= 65504.0 else _F32(-1)


@jit()
def _codes_group(w, s, bits, packed, acc, h):
    """Codes of one group ``w`` (float32) into ``packed`` (LSB-first); the stats (also
    those weighted by the importance ``h``, unless None)."""
    c = _F32(((1 << bits) - 1) / 2)
    half = 1 << (bits - 1)
    inv = c / s if s > _F32(0) else _F32(0)
    scl = s / c
    per = 8 // bits
    e = np.empty(w.size, np.float32)
    packed[:] = 0
    for j in range(w.size):
        f = min(max(np.floor(w[j] * inv), _F32(-half)), _F32(half - 1))
        code = np.uint8(np.int32(f) + half)
        packed[j // per] |= np.uint8(code << np.uint8(bits * (j % per)))
        e[j] = w[j] - (f + _F32(0.5)) * scl
    _add_sums(w, e, acc)
    if h is not None:
        _add_wsums(w, e, h, acc)


@jit()
def _tail_max(tail, limit):
    """The tail group's largest ``|w|`` bit pattern, or -1 if it exceeds ``limit``."""
    mx = np.uint32(0)
    for j in range(tail.size):
        mx = max(mx, np.uint32(np.float32(tail[j]).view(np.uint32) & _MAG))
    return np.int64(mx) if mx <= limit else np.int64(-1)


# ---------------------------------------------------------------------------- drivers


@jit()
def _scratch(bits):
    """A chunk's working memory (about 70 KiB): tile bits, lane and group maxima, group
    scales, per-lane factors, codes, lane sums (float32 per tile, float64 per chunk),
    load words, packed bytes."""
    return (
        np.empty(_ROWS * _W, np.uint32),
        np.empty(_W, np.uint32),
        np.empty(TILE, np.uint32),
        np.empty(TILE, np.float32),
        np.empty((2, _W), np.float32),
        np.empty(_ROWS * _W, np.uint8),
        np.empty(6 * _W, np.float32),
        np.zeros(6 * _W, np.float64),
        np.empty(_ROWS * TILE, np.uint64),
        np.empty(TILE * GROUP_SIZE * bits // 8, np.uint8),
    )


@jit()
def _end(lanes, acc):
    for k in range(acc.size):
        acc[k] += lanes[k * _W : (k + 1) * _W].sum()


@jit()
def _encode_absmax(src64, f32, tail, hcols, c0, htail, bits, limit, packed, scales, acc):
    groups = src64.size // (2 * _ROWS if f32 else _ROWS)
    yu, mx, amax, sc, rows, codes, sums, lanes, words, out = _scratch(bits)
    y = yu.view(np.float32)
    hu = np.zeros(_ROWS * _W, np.uint32)
    last = np.full(1, -1, np.int64)
    for g0 in range(0, groups, TILE):
        t = min(TILE, groups - g0)
        top = _load(src64, f32, g0, t, words, yu, mx, amax)
        if top > limit:
            return REFUSED
        for g in range(TILE):
            sc[g] = _f16_round(np.uint32(amax[g]).view(np.float32))
        if hcols is None:
            _finish(
                y,
                top,
                sc,
                bits,
                g0,
                t,
                rows[0],
                rows[1],
                codes,
                sums,
                lanes,
                out,
                packed,
                scales,
                acc,
                None,
            )
        else:
            _load_importance(hcols, c0, g0, t, hu.view(np.float32), last)
            _finish(
                y,
                top,
                sc,
                bits,
                g0,
                t,
                rows[0],
                rows[1],
                codes,
                sums,
                lanes,
                out,
                packed,
                scales,
                acc,
                hu.view(np.float32),
            )
    if tail.size:
        mx1 = _tail_max(tail, limit)
        if mx1 < 0:
            return REFUSED
        s = _f16_round(np.uint32(mx1).view(np.float32))
        scales[groups] = s
        _codes_group(tail, s, bits, packed[groups * GROUP_SIZE * bits // 8 :], acc, htail)
    _end(lanes, acc)
    return OK


@jit()
def replay_chunk(src64, f32, tail, hcols, c0, htail, bits, packed, scales, acc):
    """:func:`_encode_absmax` with each tile's scales taken from ``scales`` (a blob's,
    as float32) instead of chosen: the codes are recomputed into a scratch copy and
    compared with ``packed``, and the statistics summed into ``acc`` by the encoder's own
    routines in its order. False if a code differs (this kernel did not write them).
    :func:`smoe.quant.replay.tensor_stats` calls it chunk by chunk, as the encoder calls
    :func:`encode_chunk`."""
    groups = src64.size // (2 * _ROWS if f32 else _ROWS)
    yu, mx, amax, sc, rows, codes, sums, lanes, words, out = _scratch(bits)
    inv4, scl4 = rows[0], rows[1]
    y = yu.view(np.float32)
    mine = np.empty(packed.size, np.uint8)  # every byte written: by _finish, _codes_group
    chosen = np.empty(scales.size, np.float32)
    hu = np.zeros(_ROWS * _W, np.uint32)
    last = np.full(1, -1, np.int64)
    for g0 in range(0, groups, TILE):
        t = min(TILE, groups - g0)
        top = _load(src64, f32, g0, t, words, yu, mx, amax)
        for g in range(TILE):
            sc[g] = scales[g0 + g] if g < t else _F32(0)
        if hcols is None:  # an if statement numba prunes by argument type
            hy = None
        else:
            _load_importance(hcols, c0, g0, t, hu.view(np.float32), last)
            hy = hu.view(np.float32)
        _finish(y, top, sc, bits, g0, t, inv4, scl4, codes, sums, lanes, out, mine, chosen, acc, hy)
    if tail.size:
        at = groups * GROUP_SIZE * bits // 8
        _codes_group(tail, scales[groups], bits, mine[at:], acc, htail)
    _end(lanes, acc)
    for i in range(packed.size):  # noqa: SIM110 (numba compiles no generator)
        if mine[i] != packed[i]:
            return False
    return True


@jit()
def _encode_q4(src64, f32, tail, hcols, c0, htail, limit, packed, scales, acc):
    """Q4 ``optimal``; with importance (``hcols``, ``htail``: not None) weighted."""
    groups = src64.size // (2 * _ROWS if f32 else _ROWS)
    yu, mx, amax, sc, rows, codes, sums, lanes, words, out = _scratch(4)
    y = yu.view(np.float32)
    plain = np.ones(TILE, np.bool_)  # unweighted: every group takes the plain choice
    hu = np.zeros(_ROWS * _W, np.uint32)
    last = np.full(1, -1, np.int64)
    wsums = np.empty(2 * _NF * _W, np.float32)
    for g0 in range(0, groups, TILE):
        t = min(TILE, groups - g0)
        top = _load(src64, f32, g0, t, words, yu, mx, amax)
        if top > limit:
            return REFUSED
        if hcols is None:
            _q4_scales(y, amax, sc, rows[0], sums, plain)
            _finish(
                y,
                top,
                sc,
                4,
                g0,
                t,
                rows[0],
                rows[1],
                codes,
                sums,
                lanes,
                out,
                packed,
                scales,
                acc,
                None,
            )
        else:
            _load_importance(hcols, c0, g0, t, hu.view(np.float32), last)
            _q4w_scales(y, hu.view(np.float32), amax, plain, sc, rows[0], sums, wsums)
            _finish(
                y,
                top,
                sc,
                4,
                g0,
                t,
                rows[0],
                rows[1],
                codes,
                sums,
                lanes,
                out,
                packed,
                scales,
                acc,
                hu.view(np.float32),
            )
    if tail.size:
        mx1 = _tail_max(tail, limit)
        if mx1 < 0:
            return REFUSED
        absmax = np.uint32(mx1).view(np.float32)
        if htail is None:  # noqa: SIM108 (an if statement numba prunes by argument type)
            s = _q4_group(tail, absmax)
        else:
            s = _q4w_group(tail, htail, absmax)
        scales[groups] = s
        _codes_group(tail, s, 4, packed[groups * GROUP_SIZE // 2 :], acc, htail)
    _end(lanes, acc)
    return OK


@jit()
def _encode_q2(src64, f32, tail, hcols, c0, htail, limit, packed, scales, acc, rtab):
    """Q2 ``optimal``; with importance (``hcols``, ``htail``: not None) weighted."""
    groups = src64.size // (2 * _ROWS if f32 else _ROWS)
    yu, mx, amax, sc, rows, codes, sums, lanes, words, out = _scratch(2)
    y = yu.view(np.float32)
    hu = np.zeros(_ROWS * _W, np.uint32)
    last = np.full(1, -1, np.int64)
    plain = np.empty(TILE, np.bool_)
    optima = np.empty(TILE, np.float64)
    plain_optima = np.empty(TILE, np.float64)
    total = np.empty(TILE, np.float32)
    for g0 in range(0, groups, TILE):
        t = min(TILE, groups - g0)
        top = _load(src64, f32, g0, t, words, yu, mx, amax)
        if top > limit:
            return REFUSED
        if hcols is None:
            _q2_optima(yu, optima)
        else:
            _load_importance(hcols, c0, g0, t, hu.view(np.float32), last)
            _q2w_optima(yu, hu, not f32 or _bf16_exact(yu), plain, optima, total, plain_optima)
        for g in range(TILE):  # (padding groups are zeros: scale 0)
            if not optima[g] <= 65504.0:
                return NEEDS_REFERENCE
            sc[g] = _f16_round(_F32(optima[g]))
        if hcols is None:
            _finish(
                y,
                top,
                sc,
                2,
                g0,
                t,
                rows[0],
                rows[1],
                codes,
                sums,
                lanes,
                out,
                packed,
                scales,
                acc,
                None,
            )
        else:
            _finish(
                y,
                top,
                sc,
                2,
                g0,
                t,
                rows[0],
                rows[1],
                codes,
                sums,
                lanes,
                out,
                packed,
                scales,
                acc,
                hu.view(np.float32),
            )
    if tail.size:
        if _tail_max(tail, limit) < 0:
            return REFUSED
        if htail is None:  # noqa: SIM108 (an if statement numba prunes by argument type)
            s = _q2_group(tail, rtab)
        else:
            s = _q2w_group(tail, htail, rtab)
        if s < _F32(0):
            return NEEDS_REFERENCE
        scales[groups] = s
        _codes_group(tail, s, 2, packed[groups * GROUP_SIZE // 4 :], acc, htail)
    _end(lanes, acc)
    return OK


def encode_chunk(
    src64: np.ndarray,
    f32: bool,
    tail: np.ndarray,
    bits: int,
    optimal: bool,
    limit: int,
    packed: np.ndarray,
    scales: np.ndarray,
    acc: np.ndarray,
    importance: tuple[np.ndarray, int, np.ndarray] | None = None,
) -> int:
    """Encode whole groups ``src64`` (the weights' bytes as uint64: float32 if ``f32``,
    else bfloat16) followed by ``tail`` (float32, fewer than 64 weights: the tensor's
    last group) into ``packed`` (uint8, exactly their bytes) and ``scales`` (float32, one
    per group). ``acc`` (float64[4]) gains ``sum(w), sum(w^2), sum(err), sum(err^2)``.
    ``importance``: None, or ``(per_column, c0, tail_importance)``: float32 importance per
    column (as quant prepares it: bfloat16 values in [0, 1]), the column of the chunk's
    first weight, and the importance of the ``tail`` weights; with it ``acc`` is float64[6]
    and also gains ``sum(h w^2), sum(h err^2)``.
    Returns OK, REFUSED (a ``|w|`` pattern above ``limit``) or NEEDS_REFERENCE.

    >>> from smoe import quant
    >>> w = np.arange(64, dtype=np.float32) / 8  # one group, as bfloat16 bits
    >>> src = (w.view(np.uint32) >> 16).astype(np.uint16)
    >>> packed, scales, acc = np.zeros(32, np.uint8), np.zeros(1, np.float32), np.zeros(4)
    >>> limit = int(np.float32(65504).view(np.uint32))
    >>> encode_chunk(src.view(np.uint64), False, w[:0], 4, True, limit, packed, scales, acc)
    0
    >>> packed[:3].tolist(), scales.tolist(), acc[:2].tolist()  # as numpy encodes them
    ([136, 136, 136], [7.5703125], [252.0, 1333.5])
    >>> ref_packed, ref_scales = quant.encode(src, 4, src_dtype="bf16", kernel="numpy")
    >>> bool((ref_packed == packed).all()), float(ref_scales[0])
    (True, 7.5703125)
    """
    kernel, args = _route(src64, f32, tail, bits, optimal, limit, packed, scales, acc, importance)
    return kernel(*args)


def encode_chunk_cached(
    src64: np.ndarray,
    f32: bool,
    tail: np.ndarray,
    bits: int,
    optimal: bool,
    limit: int,
    packed: np.ndarray,
    scales: np.ndarray,
    acc: np.ndarray,
    importance: tuple[np.ndarray, int, np.ndarray] | None = None,
) -> bool | None:
    """Whether :func:`encode_chunk` with these arguments would find its compiled code (in
    this process or numba's disk cache) instead of compiling it; nothing is encoded,
    compiled or loaded (:func:`smoe.quant.kernels.jit.cached`; None: cannot tell).

    >>> w = np.zeros(64, np.uint16)  # one group of bfloat16 bits
    >>> args = (w.view(np.uint64), False, np.zeros(0, np.float32), 2, False, 1 << 31,
    ...         np.zeros(16, np.uint8), np.zeros(1, np.float32), np.zeros(4))
    >>> encode_chunk(*args), encode_chunk_cached(*args)  # encoded: compiled (or loaded) now
    (0, True)
    """
    return cached(*_route(src64, f32, tail, bits, optimal, limit, packed, scales, acc, importance))


def _route(
    src64: np.ndarray,
    f32: bool,
    tail: np.ndarray,
    bits: int,
    optimal: bool,
    limit: int,
    packed: np.ndarray,
    scales: np.ndarray,
    acc: np.ndarray,
    importance: tuple[np.ndarray, int, np.ndarray] | None,
) -> tuple[Any, tuple[Any, ...]]:
    """The driver that encodes :func:`encode_chunk`'s arguments, and its arguments."""
    hcols, c0, htail = None, 0, None
    if importance is not None:
        hcols, c0, htail = importance
    if not optimal:
        return _encode_absmax, (
            src64,
            f32,
            tail,
            hcols,
            c0,
            htail,
            bits,
            limit,
            packed,
            scales,
            acc,
        )
    if bits == 4:
        return _encode_q4, (src64, f32, tail, hcols, c0, htail, limit, packed, scales, acc)
    return _encode_q2, (src64, f32, tail, hcols, c0, htail, limit, packed, scales, acc, _RTAB)


def einsum_order_holds(trials: int = 2000, seed: int = 0) -> bool:
    """Whether ``np.einsum("ij,ij->i")`` on float32 rows sums as the Q4 kernels do.

    >>> einsum_order_holds(trials=10)  # numpy as built for this package: it does
    True
    """
    rng = np.random.default_rng(seed)
    for n in (GROUP_SIZE, 1, 3, 17, 20, 33, 47, GROUP_SIZE - 1):
        v = (np.floor(rng.normal(0, 3, (trials, n))) + 0.5).astype(np.float32)
        t = rng.normal(0, 3, (trials, n)).astype(np.float32)
        if not np.array_equal(
            np.einsum("ij,ij->i", v, t).view(np.int32), _einsum_like(v, t).view(np.int32)
        ):
            return False
    return True


def einsum_check_cached() -> bool | None:
    """Whether :func:`einsum_order_holds` would find its compiled code (in this process or
    numba's disk cache) instead of compiling it; nothing is compiled or loaded.

    >>> einsum_order_holds(trials=1), einsum_check_cached()
    (True, True)
    """
    v = np.zeros((1, GROUP_SIZE), np.float32)
    return cached(_einsum_like, (v, v))


@jit()
def _einsum_like(v, t):
    """Row sums of ``v * t`` in the order the Q4 kernels use."""
    out = np.empty(v.shape[0], np.float32)
    n = v.shape[1]
    for i in range(v.shape[0]):
        a = np.zeros(_LANES, np.float32)
        for j in range(0, n, 16):
            subs = (3, 2, 1, 0) if j + 16 <= n else (0, 1, 2, 3)
            for s in subs:
                for lane in range(_LANES):
                    p = j + _LANES * s + lane
                    if p < n:
                        a[lane] = v[i, p] * t[i, p] + a[lane]
                    elif j + _LANES * s < n:
                        a[lane] = _F32(0) + a[lane]
        out[i] = _F32(0) + ((a[0] + a[1]) + (a[2] + a[3]))
    return out
