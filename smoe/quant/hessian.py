"""Hessian-aware rounding into the SMOE-Q2/Q4 codes (calibrated sculpting, issue 24).

:func:`encode_hessian` quantises one matrix ``W [rows, cols]`` whose input ``x`` (dimension
``cols``) has second moments ``H = E[x x^T]`` (``X^T X / n`` over calibration tokens), so
that the *output* error ``tr((W - W_hat) H (W - W_hat)^T)`` (:func:`hessian_error`; the
mean of ``|(W - W_hat) x|^2``) is small rather than the weight error. The result is
exactly what :func:`~smoe.quant.encode` writes for the same matrix: the same codes,
packing and fp16 group scales (ruling D2), the same sizes; any decoder reads it. Only the
choice of codes and scales differs.

The format fixes the groups: 64 consecutive weights of the row-major flattening, so (when
``cols`` is a multiple of 64, as in every MoE checkpoint) 64 consecutive *input* columns of
one row, each with one fp16 scale. Hence the algorithm:

1. **Static group scales.** Every group's scale is chosen before rounding, by the encoder's
   own importance-weighted search (:mod:`smoe.quant`, ``importance = diag(H)``). GPTQ
   usually picks a group's scale when its sweep reaches the group, from the error-updated
   weights; with act-order the columns of a group are not processed together, so that is
   not possible, and measured without act-order it was no better (below).
2. **GPTQ sweep** (Frantar et al. 2022), in its equivalent Babai form (Chen et al. 2024):
   with the columns in processing order and ``H_p + lambda I = R R^T`` (``R`` upper
   triangular, the Cholesky factor of the reversed matrix, so no inverse is formed), column
   ``k`` is rounded to the nearest level of its (fixed) scale after adding
   ``sum_{j<k} (w_j - q_j) R_jk / R_kk``, the error feedback that GPTQ's update of the later
   columns applies; codes are clamped to the format's levels. Lazy batches of 128 columns
   (one matrix product per batch for the earlier columns, rank-1 updates inside it).
   ``lambda = damp * mean(diag H)``; a dead input (``H_jj = 0``: no token ever used it) gets
   the mean diagonal, which decouples it: it is rounded to nearest, its weight kept (GPTQ
   zeroes it; here zero is not even a level of Q4). If the factorisation fails the
   dampening is raised tenfold, up to four times.
3. **Act-order** (``act_order=True``): columns processed by decreasing ``H_jj`` (ties by
   index), so the inputs that matter most are rounded first, with the most freedom left to
   compensate them.
4. **Refit** (``refit=True``, ``cols % 64 == 0``): given the codes, every row's group scales
   are solved jointly for the least ``e H e^T`` (a ``groups x groups`` linear system per row:
   the groups of a row are coupled through ``H``), clipped to ``[0, 65504]`` and rounded to
   fp16; then a second sweep (2-3) runs at those scales and is refitted in turn (a third
   pass gained < 1 % more).
5. **Coordinate descent** (``descent`` sweeps per pass, default none): each weight in turn
   moves one level up or down when that lowers the dampened objective
   ``e (H + lambda I) e^T``, all rows at once (the gradient kept up to date by rank-1
   updates). It lowers the output error further (4-5 %), but on the trained model below it
   did not lower the loss at Q2 (it fits the calibration statistics of a model whose later
   layers then see other inputs), so it is off by default.
6. **Starts** (``starts``): steps 2-5 run again from other starting scales, the static ones
   times each of :data:`SCALE_STARTS` (0.8 ... 1.2), below.

Every candidate is scored by its exact ``e_i H e_i^T`` per row, the plain encoding
(``encode(w, bits)``) included, and each row keeps the best (with ``cols % 64 != 0``, groups
straddle rows and the choice is per chunk of 64 rows): the result is never worse than the
plain encoder on ``H``, and the :class:`HessianReport` says by how much. An all-zero ``H``
(no calibration token reached the matrix) gives the plain encoding, byte for byte, with
``report.fallback`` saying why; so does an ``H`` whose factorisation fails at every
dampening.

**Measured.** Ratio: output error on *held-out* inputs over the plain encoder's
(``encode(w, bits)``, the default ``optimal`` scales). Variants A-D use ``damp`` 0.01, GPTQ's
usual value; "refit" includes the second pass.

*Synthetic* (``tests/quant/test_hessian.py``'s generator: ``W`` 256 x 512 Student-t(4) x
0.02, seed 100; inputs with 128 shared factors plus noise, lognormal channel scales, 2 %
outlier channels at 10x, seed 101; ``H`` from 8192 samples, the error measured on 8192
others):

==============================================  =====  =====
variant                                          Q4     Q2
==============================================  =====  =====
importance matrix ``diag(H)`` (``--imatrix``)    0.660  0.642
A: GPTQ, natural order, static scales            0.267  0.283
B: A + refit                                     0.258  0.269
C: A + act-order                                 0.223  0.233
D: act-order + refit                             0.217  0.224
D, ``damp`` 0.03                                 0.221  0.225
**the defaults** (D, ``damp`` 0.03, 5 starts)    0.219  0.224
the defaults + ``descent=2``                     0.204  0.204
==============================================  =====  =====

*Trained* (``../shared/models/tiny-moe-py``: all 192 expert matrices, ``H`` of each
expert's own routed inputs over ``calib_ids.npy`` in the float32 model; ratio: output error
on the routed inputs of ``eval_ids.npy``, summed over the matrices; loss: bits/byte over
``eval_ids.npy`` (float32, 1.2142 unquantised) with every expert replaced at once,
*one-shot*: every ``H`` from the unquantised model, no sequential propagation):

==============================================  ======  ======  =======  =======
variant (one start)                              Q4      Q2      Q4 loss  Q2 loss
==============================================  ======  ======  =======  =======
plain encoder                                    1       1       +0.0031  +0.0905
importance matrix ``diag(H)``                                    +0.0033  +0.0879
A: GPTQ, natural order, static scales            0.674   0.669   +0.0027  +0.0672
B: A + refit                                     0.644   0.626   +0.0022  +0.0514
C: A + act-order                                 0.643   0.639   +0.0021  +0.0647
D: act-order + refit                             0.619   0.601   +0.0020  +0.0492
D, ``damp`` 0.03                                 0.617   0.598   +0.0024  +0.0477
D, ``damp`` 0.1                                                  +0.0023  +0.0487
D, ``damp`` 0.03, + ``descent=1``                                +0.0021  +0.0520
D, ``damp`` 0.03, + ``descent=2``                0.598   0.570   +0.0022  +0.0511
D + ``descent=2``                                0.601   0.574   +0.0019  +0.0510
==============================================  ======  ======  =======  =======

So at Q2 one start halves the plain encoder's loss (-47 %) and at Q4 cuts it by a quarter
(the Q4 differences, ~0.0005 bits/byte, are near what any change of codes moves); the
importance matrix alone gains little on this model. The refit of the scales and act-order
each gain most at Q2; more dampening than 0.01 helps at Q2 (0.03 best of 0.01, 0.03, 0.1;
1.0 raised the held-out output error by 8 %). Choosing each group's scale from the
error-updated weights when the sweep reaches it (natural order, or act-order by whole
groups), as GPTQ usually does, was measured in an earlier one-pass version: no better
overall (Q2 +0.0502 against +0.0513 for static scales with act-order in the same run, Q4
+0.0029 against +0.0020), and it rules out act-order by single columns. Sequential
propagation (each layer calibrated on the quantised layers' outputs) is the caller's part;
measured through it (``smoe sculpt --calibrate calib_ids.npy``, each expert's statistics
weighted by its routing weights squared from the second row on, see
:mod:`smoe.sculpt.calibrate.runner`):

=======================================================  =======  =======
sequential ``smoe sculpt --calibrate``, ``damp`` 0.03     Q4 loss  Q2 loss
=======================================================  =======  =======
one start, unweighted statistics                                   +0.0490
one start                                                          +0.0481
3 starts (0.9, 1.0, 1.1), unweighted statistics                    +0.0470
3 starts (0.9, 1.0, 1.1)                                           +0.0454
**the defaults**: 5 starts (0.8 ... 1.2)                  +0.0015  +0.0429
7 starts (0.7 ... 1.3)                                             +0.0438
=======================================================  =======  =======

**Starts** (``starts``, :data:`SCALE_STARTS`): the passes (sweep, refit, sweep, refit) run
from the static scales times each multiple in turn, in increasing order, every row keeping
the best encoding so far (a start's second pass sets out from the scales of that best).
The refit finds the nearest optimum of the scales *given* the codes, and the codes follow
the scales they were rounded at: a start a step away lands in another basin, and at Q2
(four levels) the basins differ most. On synthetic weights they gain almost nothing
(above), on the trained model a tenth of the Q2 loss. Two refinements of sequential
calibration were measured and left out, each worse (one start, unweighted): the asymmetric
target (quantise ``W M``, ``M`` the ridge least-squares map from the quantised model's
routed inputs to the unquantised model's at the same tokens, so that ``W_hat x_q`` matches
``W x``: +0.0521 at ridge 0.1, +0.0513 at 1.0), and down's statistics taken from the
quantised gate and up (+0.0510).

**Memory** (besides the caller's ``w`` and ``h`` and the outputs): one ``cols x cols``
float64 array (the dampened, permuted Cholesky factor, computed in place by blocks of 256:
512 MiB at ``cols`` = 8192, 32 MiB at 2048), plus ``O(chunk x cols)`` for a chunk of rows
(whole multiples of 64 rows, ~16 MiB of float64 per array, about ten such arrays), plus
``O(256 x cols)`` blocks of ``h`` as float64 and the refit's per-row systems (at most
~32 MiB at a time). Rows are processed chunk by chunk; nothing else grows with ``rows x
cols`` but a float32 copy of ``w`` when it is another float type. Measured (tracemalloc):
40 MiB at 64 x 2048 (a 32 MiB factor), 46 MiB at 4096 x 256.

**Determinism.** No randomness; ties are broken by index (stable sorts). The bytes are the
same for the same input with the same numpy and BLAS (the float64 products may round
differently under another BLAS build or thread count, which can move a code at a tie).

**Cost.** ``O(rows x cols^2)`` per pass (the sweep, each descent sweep, the error forms and
the refit each about one ``rows x cols x cols`` product), plus ``cols^3 / 3`` for the
factor: the 192 expert matrices of the trained model above (128 x 256 and 256 x 128) take
~3 s per start on 2 cores, ~15 s with the defaults' five (~11 s per start with
``descent=2``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from smoe.errors import RefusedInput, UsageError
from smoe.quant.encoder import encode
from smoe.quant.packing import pack_into
from smoe.quant.scales import f16_round
from smoe.quant.traits import FP16_MAX, OK_BITS, Overflow, level_center
from smoe_gen.layout import GROUP_SIZE, SUPPORTED_BITS, num_groups, packed_size

__all__ = [
    "SCALE_STARTS",
    "HessianReport",
    "encode_hessian",
    "encode_hessian_into",
    "hessian_error",
    "hessian_fallback",
]

DEFAULT_DAMP = 0.03
"""Default relative dampening ``lambda / mean(diag H)`` (measured in the module's docs: of
0.01, 0.03 and 0.1, 0.03 gave the least loss at Q2 on the trained model)."""

SCALE_STARTS = (0.8, 0.9, 1.0, 1.1, 1.2)
"""The starting group scales, as multiples of the static ones: each start runs the passes
and every row keeps its best (measured in the module's docs: three starts 0.9-1.1 gained
less at Q2, seven 0.7-1.3 no more)."""

_ZERO_H = "h is zero: no calibration input reached this matrix"
"""The fallback of a matrix whose ``h`` is all zero."""

_BLOCK = 128
"""Columns per lazy batch of the sweep."""

_H_BLOCK = 256
"""Rows or columns of ``h`` per block: of the in-place Cholesky factorisation, of the
float64 copies of ``h``'s rows, of the checks."""

_CHUNK_BYTES = 16 << 20
"""Target size of one float64 ``chunk x cols`` array (rows are processed chunk by chunk)."""

_SYSTEM_BYTES = 32 << 20
"""Target size of the refit's per-row linear systems at a time."""

_DAMP_RETRIES = 4
"""Times the dampening is multiplied by 10 when the factorisation fails."""

_PASSES = 2
"""Passes of sweep, descent and refit with ``refit=True`` (the second starts from the
refitted scales; a third gained < 1 % more output error on the trained model)."""

_SYMMETRY = 1e-4
"""``h`` is refused when ``|h[i, j] - h[j, i]|`` exceeds this times ``max(diag h)``."""


@dataclass
class HessianReport:
    """What one :func:`encode_hessian` call measured, for the per-tensor output-error
    estimate a caller records: ``error``, ``plain_error`` and ``signal`` are
    ``tr(E H E^T)`` of the result, of the plain encoder (``encode(w, bits)``) and of the
    weights themselves (``E = W``), in the units of ``h``; ``rows``: the matrix's rows;
    ``rows_plain``: rows that kept the plain encoding (no better found; with ``cols % 64 !=
    0`` counted by chunks of 64 rows); ``damp``: the relative dampening the factorisation
    used (0 when none ran); ``fallback``: why the whole matrix got the plain encoding
    (``None``: it did not).

    >>> import numpy as np
    >>> w = np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 128)
    >>> report = HessianReport()
    >>> _ = encode_hessian(w, np.zeros((128, 128)), 4, report=report)
    >>> report.fallback, report.rows_plain, report.error
    ('h is zero: no calibration input reached this matrix', 2, 0.0)
    """

    error: float = 0.0
    plain_error: float = 0.0
    signal: float = 0.0
    rows: int = 0
    rows_plain: int = 0
    damp: float = 0.0
    fallback: str | None = None

    @property
    def ratio(self) -> float:
        """``error / plain_error`` (1.0 when both are 0): below 1, better than the plain
        encoder on ``h``.

        >>> HessianReport(error=1.0, plain_error=4.0).ratio, HessianReport().ratio
        (0.25, 1.0)
        """
        if self.plain_error > 0:
            return self.error / self.plain_error
        return 1.0 if self.error <= 0 else float("inf")

    @property
    def output_snr_db(self) -> float | None:
        """``10 log10(signal / error)``: the SNR of the output ``W x`` for inputs with
        second moments ``h``; ``None`` when not finite (no error, or no signal).

        >>> HessianReport(error=1.0, signal=1000.0).output_snr_db
        30.0
        """
        if self.error <= 0 or self.signal <= 0:
            return None
        return float(10 * np.log10(self.signal / self.error))

    @property
    def gain_db(self) -> float | None:
        """``10 log10(plain_error / error)``: the output SNR gained over the plain
        encoder; ``None`` when not finite.

        >>> round(HessianReport(error=1.0, plain_error=2.0).gain_db, 2)
        3.01
        """
        if self.error <= 0 or self.plain_error <= 0:
            return None
        return float(10 * np.log10(self.plain_error / self.error))


def hessian_error(w: np.ndarray, w_hat: np.ndarray, h: np.ndarray) -> float:
    """``tr((W - W_hat) H (W - W_hat)^T)``: the expected squared output error
    ``E|(W - W_hat) x|^2`` for inputs with second moments ``H`` (float64 sums, by chunks of
    rows and blocks of ``h``). ``w``, ``w_hat``: ``[rows, cols]`` real arrays; ``h``:
    ``[cols, cols]``.

    >>> import numpy as np
    >>> from smoe.quant import decode, encode
    >>> w = np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 128)
    >>> w_hat = decode(*encode(w, 4), 4, w.shape)
    >>> h = np.eye(128)  # uncorrelated unit inputs: the squared weight error
    >>> bool(np.isclose(hessian_error(w, w_hat, h), np.square(w - w_hat).sum()))
    True
    """
    w = np.asarray(w)
    w_hat = np.asarray(w_hat)
    if w.ndim != 2 or w.dtype.kind not in "fiu":
        raise UsageError(f"w must be a 2-D real array, got shape {w.shape} of {w.dtype}")
    if w_hat.shape != w.shape or w_hat.dtype.kind not in "fiu":
        raise UsageError(f"w_hat must be a real array of w's shape {w.shape}, got {w_hat.shape}")
    _check_h_shape(h, w.shape[1])
    return float(_row_forms(w, w_hat, h).sum())


def encode_hessian(
    w: np.ndarray,
    h: np.ndarray,
    bits: int,
    *,
    damp: float = DEFAULT_DAMP,
    act_order: bool = True,
    refit: bool = True,
    descent: int = 0,
    starts: Sequence[float] = SCALE_STARTS,
    overflow: Overflow = "clip",
    report: HessianReport | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Quantise the matrix ``w [rows, cols]`` to SMOE-Q``bits`` for the least output error
    on inputs with second moments ``h [cols, cols]`` (``X^T X / n``), by the algorithm of
    :mod:`smoe.quant.hessian`.

    ``w``: a 2-D real float array (float32; other float types are read as their float32
    values, as :func:`~smoe.quant.encode` reads them). ``h``: a real float array (float64
    preferred), symmetric, positive semi-definite, finite. ``damp``: dampening, as a
    fraction of ``mean(diag h)``. ``act_order``: process input channels by decreasing
    ``diag(h)``. ``refit``: least-squares refit of the group scales, then a second pass.
    ``descent``: coordinate-descent sweeps over the codes per pass. ``starts``: the
    starting group scales as multiples of the static ones (:data:`SCALE_STARTS`), each row
    keeping the best encoding of all. ``overflow``: as for
    :func:`~smoe.quant.encode`. ``report``: if given, filled in (:class:`HessianReport`).

    Returns ``(packed, scales)`` exactly as :func:`~smoe.quant.encode` does:
    ``uint8[packed_size(n, bits)]`` and little-endian ``float16[num_groups(n)]``, decodable
    by :func:`~smoe.quant.decode` with ``w.shape``. Raises
    :class:`~smoe.errors.UsageError` for arguments of the wrong kind or shape,
    :class:`~smoe.errors.RefusedInput` for an ``h`` that is not finite, not symmetric or has
    a negative diagonal, and :class:`~smoe.quant.errors.NonFiniteWeights` /
    :class:`~smoe.quant.errors.ScaleOverflow` as the encoder does.

    >>> import numpy as np
    >>> from smoe.quant import decode, encode
    >>> rng = np.random.default_rng(0)
    >>> w = (rng.standard_normal((64, 128)) * 0.02).astype(np.float32)
    >>> x = rng.standard_normal((4096, 16)) @ rng.standard_normal((16, 128))  # correlated
    >>> h = x.T @ x / len(x)
    >>> report = HessianReport()
    >>> packed, scales = encode_hessian(w, h, 2, report=report)
    >>> plain_packed, plain_scales = encode(w, 2)
    >>> packed.shape == plain_packed.shape, scales.dtype == plain_scales.dtype
    (True, True)
    >>> w_hat = decode(packed, scales, 2, w.shape)
    >>> bool(np.isclose(hessian_error(w, w_hat, h), report.error))
    True
    >>> report.ratio < 0.2  # the output error, against the plain encoder's
    True
    """
    _check_args(w, h, bits, damp, descent, starts, overflow)
    packed = np.empty(packed_size(w.size, bits), np.uint8)
    scales = np.empty(num_groups(w.size), np.dtype("<f2"))
    encode_hessian_into(
        w,
        h,
        bits,
        packed,
        scales,
        damp=damp,
        act_order=act_order,
        refit=refit,
        descent=descent,
        starts=starts,
        overflow=overflow,
        report=report,
    )
    return packed, scales


def encode_hessian_into(
    w: np.ndarray,
    h: np.ndarray,
    bits: int,
    packed_out: np.ndarray,
    scales_out: np.ndarray,
    *,
    damp: float = DEFAULT_DAMP,
    act_order: bool = True,
    refit: bool = True,
    descent: int = 0,
    starts: Sequence[float] = SCALE_STARTS,
    overflow: Overflow = "clip",
    report: HessianReport | None = None,
) -> None:
    """:func:`encode_hessian` into caller buffers, as :func:`~smoe.quant.encode_into`
    takes them (e.g. slices of a memory-mapped blob): ``packed_out`` writable ``uint8`` of
    ``packed_size(n, bits)`` bytes; ``scales_out`` writable ``num_groups(n)`` fp16 values or
    ``scales_size(n)`` ``uint8`` bytes; both C-contiguous. Working memory: see
    :mod:`smoe.quant.hessian`.

    >>> import numpy as np
    >>> from smoe.quant import packed_size, scales_size
    >>> w = np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 128)
    >>> blob = np.zeros(packed_size(w.size, 4) + scales_size(w.size), np.uint8)
    >>> encode_hessian_into(w, np.eye(128), 4, blob[:128], blob[128:])
    >>> bytes(blob) == b"".join(bytes(a) for a in encode_hessian(w, np.eye(128), 4))
    True
    """
    _check_args(w, h, bits, damp, descent, starts, overflow)
    rows, cols = w.shape
    n = w.size
    packed = _out_view(packed_out, np.uint8, packed_size(n, bits), "packed_out")
    scales = _out_view(scales_out, np.dtype("<f2"), num_groups(n), "scales_out")
    rep = report if report is not None else HessianReport()
    rep.error = rep.plain_error = rep.signal = rep.damp = 0.0
    rep.rows, rep.rows_plain, rep.fallback = rows, rows, None
    plain_packed, plain_scales = encode(w, bits, overflow=overflow)  # refuses NaN, Inf, ...
    _check_h_values(h)
    packed[...] = plain_packed
    scales[...] = plain_scales
    if n == 0:
        return
    w32 = np.asarray(w, np.float32)
    rep.signal = float(_row_forms(w32, None, h).sum())
    diag = np.array(np.diagonal(h), np.float64)
    live = diag > 0
    if not live.any():
        rep.fallback = _ZERO_H
        return
    order = np.argsort(-diag, kind="stable") if act_order else np.arange(cols)
    factored = _factor(h, order, diag, damp)
    static = encode(w32, bits, overflow=overflow, importance=diag)[1]
    job = _Job(w32, h, bits, order, static, refit, descent, starts, plain_packed, plain_scales)
    if isinstance(factored, str):
        rep.fallback = factored
        job.sweep_r = None
    else:
        job.sweep_r, rep.damp = factored
        job.lam = rep.damp * float(diag[live].mean())
    rep.rows_plain = 0
    for r0 in range(0, rows, job.chunk_rows):
        r1 = min(r0 + job.chunk_rows, rows)
        kept, err, plain_err = job.run(r0, r1, packed, scales)
        rep.rows_plain += kept
        rep.error += err
        rep.plain_error += plain_err


def hessian_fallback(
    h: np.ndarray, *, damp: float = DEFAULT_DAMP, act_order: bool = True
) -> str | None:
    """Why :func:`encode_hessian` would give a matrix the plain encoding on ``h`` (what its
    :attr:`HessianReport.fallback` says), or None, without encoding anything: a resumed
    calibration counts the tensors it keeps as the run that wrote them counted them.

    >>> hessian_fallback(np.zeros((64, 64)))
    'h is zero: no calibration input reached this matrix'
    >>> hessian_fallback(np.eye(64)) is None
    True
    """
    diag = np.array(np.diagonal(h), np.float64)
    live = diag > 0
    if not live.any():
        return _ZERO_H
    order = np.argsort(-diag, kind="stable") if act_order else np.arange(len(diag))
    factored = _factor(h, order, diag, damp)
    return factored if isinstance(factored, str) else None


# ---------------------------------------------------------------------------- checks


def _check_args(
    w: object, h: object, bits: int, damp: float, descent: int, starts: object, overflow: str
) -> None:
    """Refuse arguments of the wrong kind or shape (``UsageError``)."""
    if not isinstance(w, np.ndarray) or w.ndim != 2:
        got = f"shape {w.shape}" if isinstance(w, np.ndarray) else type(w).__name__
        raise UsageError(f"w must be a 2-D numpy array [rows, cols], got {got}")
    if w.dtype.kind != "f":
        hint = " (bfloat16 bits: widen them with bf16_to_f32)" if w.dtype == np.uint16 else ""
        raise UsageError(f"w must be a float array, got {w.dtype}{hint}")
    _check_h_shape(h, w.shape[1])
    if bits not in SUPPORTED_BITS:
        raise UsageError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    if not (isinstance(damp, (int, float)) and np.isfinite(damp) and damp >= 0):
        raise UsageError(f"damp must be a finite number >= 0, got {damp!r}")
    if not isinstance(descent, int) or descent < 0:
        raise UsageError(f"descent must be an integer >= 0, got {descent!r}")
    if not _positive_numbers(starts):
        raise UsageError(f"starts must be a non-empty sequence of numbers > 0, got {starts!r}")
    if overflow not in OK_BITS:
        raise UsageError(f"overflow must be 'clip' or 'raise', got {overflow!r}")


def _positive_numbers(v: object) -> bool:
    """Whether ``v`` is a non-empty sequence of finite numbers > 0."""
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or not v:
        return False
    return all(
        isinstance(m, (int, float)) and not isinstance(m, bool) and np.isfinite(m) and m > 0
        for m in v
    )


def _check_h_shape(h: object, cols: int) -> None:
    """Refuse an ``h`` that is not a float array of shape ``(cols, cols)``."""
    if not isinstance(h, np.ndarray):
        raise UsageError(f"h must be a numpy array, got {type(h).__name__}")
    if h.shape != (cols, cols):
        raise UsageError(
            f"h must have shape ({cols}, {cols}) for w's {cols} columns, got {h.shape}"
        )
    if h.dtype.kind != "f":
        raise UsageError(f"h must be a float array, got {h.dtype}")


def _check_h_values(h: np.ndarray) -> None:
    """Refuse an ``h`` that is not finite, has a negative diagonal or is not symmetric
    (``RefusedInput``; by blocks of rows)."""
    cols = len(h)
    d = np.diagonal(h)
    top = float(np.abs(d).max(initial=0.0)) if np.isfinite(d).all() else 0.0
    for i in range(0, cols, _H_BLOCK):
        blk = _h_rows(h, i, i + _H_BLOCK)
        finite = np.isfinite(blk)
        if not finite.all():
            r, c = (int(v) for v in np.argwhere(~finite)[0])
            raise RefusedInput(f"h is not finite: h[{i + r}, {c}] = {float(blk[r, c])}")
        gap = blk - np.asarray(h[:, i : i + _H_BLOCK], np.float64).T
        np.abs(gap, out=gap)
        if gap.size and float(gap.max()) > _SYMMETRY * top:
            r, c = (int(v) for v in np.unravel_index(int(gap.argmax()), gap.shape))
            raise RefusedInput(
                f"h is not symmetric: h[{i + r}, {c}] = {float(blk[r, c])} but "
                f"h[{c}, {i + r}] = {float(h[c, i + r])}"
            )
    if (d < 0).any():
        j = int(np.argmax(d < 0))
        raise RefusedInput(
            f"h must be second moments (positive semi-definite): h[{j}, {j}] = {float(d[j])}"
        )


def _out_view(arr: np.ndarray, dtype: np.dtype | type, count: int, name: str) -> np.ndarray:
    """An output buffer as a flat array of ``count`` ``dtype`` (``uint8`` bytes viewed)."""
    if not isinstance(arr, np.ndarray):
        raise UsageError(f"{name} must be a numpy array, got {type(arr).__name__}")
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        raise UsageError(f"{name} must be writable and C-contiguous")
    flat = arr.reshape(-1)
    dtype = np.dtype(dtype)
    if flat.dtype == np.uint8 and dtype != np.uint8:
        if flat.size != count * dtype.itemsize:
            raise UsageError(f"{name} has {flat.size} bytes, need {count * dtype.itemsize}")
        return flat.view(dtype)
    if flat.dtype.kind != dtype.kind or flat.dtype.itemsize != dtype.itemsize:
        raise UsageError(f"{name} must be {dtype} (or uint8 bytes), got {flat.dtype}")
    if flat.size != count:
        raise UsageError(f"{name} has {flat.size} elements, need {count}")
    return flat


# ---------------------------------------------------------------------------- algebra


def _h_rows(h: np.ndarray, i: int, j: int) -> np.ndarray:
    """Rows ``i:j`` of ``h`` as float64 (a view when they already are)."""
    return np.asarray(h[i:j], np.float64)


def _times_h(e: np.ndarray, h: np.ndarray) -> np.ndarray:
    """``e @ h`` in float64, ``h`` read by blocks of rows."""
    out = np.zeros((len(e), h.shape[1]))
    for i in range(0, h.shape[0], _H_BLOCK):
        out += e[:, i : i + _H_BLOCK] @ _h_rows(h, i, i + _H_BLOCK)
    return out


def _row_forms(w: np.ndarray, w_hat: np.ndarray | None, h: np.ndarray) -> np.ndarray:
    """Per row of ``e = w - w_hat`` (``w`` itself when None): ``e_i H e_i^T`` (float64),
    by chunks of rows."""
    rows, cols = w.shape
    out = np.zeros(rows)
    step = max(1, _CHUNK_BYTES // (8 * max(cols, 1)))
    for r in range(0, rows, step):
        e = np.asarray(w[r : r + step], np.float64)
        if w_hat is not None:
            e = e - np.asarray(w_hat[r : r + step], np.float64)
        out[r : r + step] = np.einsum("ij,ij->i", _times_h(e, h), e)
    return out


def _cholesky_in_place(a: np.ndarray) -> None:
    """The lower Cholesky factor of the symmetric ``a`` (its lower triangle is read) into
    its lower triangle, in place; the strict upper triangle is left with stale values.
    Blocked (right-looking), working memory ``O(n x block)``; ``LinAlgError`` when ``a`` is
    not positive definite."""
    n = len(a)
    b = _H_BLOCK
    for k in range(0, n, b):
        e = min(k + b, n)
        lkk = np.linalg.cholesky(a[k:e, k:e])
        a[k:e, k:e] = lkk
        if e == n:
            break
        panel = np.linalg.solve(lkk, a[e:, k:e].T).T  # L21 = A21 L11^-T
        a[e:, k:e] = panel
        for i in range(e, n, b):
            j = min(i + b, n)
            a[i:j, e:j] -= panel[i - e : j - e] @ panel[: j - e].T


def _factor(
    h: np.ndarray, order: np.ndarray, diag: np.ndarray, damp: float
) -> tuple[np.ndarray, float] | str:
    """``R`` (upper triangular; a reversed view of one ``cols x cols`` array, whose strict
    lower triangle is stale) with ``R R^T = H_p + lambda I`` for ``H_p``, ``h`` in the
    processing ``order`` with dead inputs given the mean live diagonal, and the relative
    dampening used; or why the factorisation failed at every dampening."""
    cols = len(order)
    live = diag > 0
    mean = float(diag[live].mean())
    rev = order[::-1]
    idx = np.arange(cols)
    a = np.empty((cols, cols))
    for attempt in range(_DAMP_RETRIES + 1):
        used = (damp if damp > 0 else 1e-4 if attempt else 0.0) * 10.0**attempt
        for i in range(0, cols, _H_BLOCK):
            a[i : i + _H_BLOCK] = np.asarray(h[rev[i : i + _H_BLOCK]], np.float64)[:, rev]
        d = np.where(live[rev], a[idx, idx], mean)
        a[idx, idx] = d + used * mean
        try:
            _cholesky_in_place(a)
        except np.linalg.LinAlgError:
            continue
        return a[::-1, ::-1], used
    return (
        "h is not positive semi-definite: its factorisation failed at every dampening "
        "up to "
        f"{(damp if damp > 0 else 1e-4) * 10.0**_DAMP_RETRIES:g}"
    )


def _decoded_values(v: np.ndarray, s: np.ndarray, c: float) -> np.ndarray:
    """The decoded values of half-integer levels ``v`` (``code - c``) at float32 scales
    ``s`` (broadcast), as ruling D2 computes them, as float64."""
    return ((v / c).astype(np.float32) * s).astype(np.float64)


class _Job:
    """One :func:`encode_hessian_into` call's fixed parts, run chunk of rows by chunk."""

    def __init__(
        self,
        w32: np.ndarray,
        h: np.ndarray,
        bits: int,
        order: np.ndarray,
        static: np.ndarray,
        refit: bool,
        descent: int,
        starts: Sequence[float],
        plain_packed: np.ndarray,
        plain_scales: np.ndarray,
    ) -> None:
        self.w32, self.h, self.bits, self.order = w32, h, bits, order
        self.static = static.astype(np.float32)
        self.refit, self.descent = refit, descent
        self.starts = tuple(float(m) for m in starts)
        self.plain_packed, self.plain_scales = plain_packed, plain_scales
        self.sweep_r: np.ndarray | None = None
        self.lam = 0.0
        cols = w32.shape[1]
        self.c = level_center(bits)
        self.half = 1 << (bits - 1)
        self.by_row = cols % GROUP_SIZE == 0  # groups and code bytes never straddle rows
        unit = GROUP_SIZE  # chunks of whole groups: multiples of 64 rows
        self.chunk_rows = max(unit, _CHUNK_BYTES // (8 * cols) // unit * unit)

    # -- one chunk

    def run(
        self, r0: int, r1: int, packed: np.ndarray, scales: np.ndarray
    ) -> tuple[int, float, float]:
        """Encode rows ``r0:r1`` into ``packed`` / ``scales`` (which hold the plain
        encoding); the rows kept plain, the chunk's error and its plain error."""
        rows = r1 - r0
        cols = self.w32.shape[1]
        w = self.w32[r0:r1]
        n0, n1 = r0 * cols, r1 * cols
        g0, g1 = n0 // GROUP_SIZE, num_groups(n1)
        p0, p1 = n0 * self.bits // 8, packed_size(n1, self.bits)
        plain_s = self.plain_scales[g0:g1].astype(np.float32)
        plain_v = self._unpack(self.plain_packed[p0:p1], rows * cols).reshape(rows, cols)
        best = _Candidate(plain_v, plain_s, self._forms(w, plain_v, plain_s))
        plain_err = best.err.copy()
        if self.sweep_r is None:
            return rows, float(plain_err.sum()), float(plain_err.sum())
        for m in self.starts:
            best = self._passes(w, f16_round(self.static[g0:g1] * np.float32(m)), best)
        kept = best.plain_rows(plain_err, self.by_row)
        f = (best.v - np.float32(0.5)).reshape(-1)
        pack_into(f, self.bits, packed[p0:p1], np.empty(f.size, np.uint8))
        scales[g0:g1] = best.s.astype(np.float16)
        return kept, float(best.err.sum()), float(plain_err.sum())

    def _passes(self, w: np.ndarray, s: np.ndarray, best: _Candidate) -> _Candidate:
        """Sweeps (and refits) of the chunk ``w`` from the group scales ``s``, each merged
        into ``best`` (a later pass starts from the merged best's scales); the new best."""
        passes = _PASSES if self.refit and self.by_row else 1
        for _ in range(passes):
            v = self._sweep(w, s)
            for _ in range(self.descent):
                v = self._descend(w, v, s)
            best = self._merge(best, _Candidate(v, s, self._forms(w, v, s)))
            if not (self.refit and self.by_row):
                break
            s_fit = self._refit(w, best.v, best.s)
            best = self._merge(best, _Candidate(best.v, s_fit, self._forms(w, best.v, s_fit)))
            s = best.s
        return best

    def _unpack(self, data: np.ndarray, n: int) -> np.ndarray:
        """The levels ``code - c`` (float32 half-integers) of the first ``n`` codes of the
        packed bytes ``data``."""
        per = 8 // self.bits
        codes = (data[:, None] >> (self.bits * np.arange(per, dtype=np.uint8))) & np.uint8(
            (1 << self.bits) - 1
        )
        return codes.reshape(-1)[:n].astype(np.float32) - np.float32(self.c)

    def _scales_of(self, s: np.ndarray, rows: int, col: int) -> np.ndarray:
        """The scales of the weights ``(i, col)`` of a chunk of ``rows`` rows, for the
        chunk's group scales ``s``."""
        cols = self.w32.shape[1]
        if self.by_row:
            return s.reshape(rows, -1)[:, col // GROUP_SIZE]
        return s[(np.arange(rows, dtype=np.int64) * cols + col) // GROUP_SIZE]

    def _decoded(self, v: np.ndarray, s: np.ndarray) -> np.ndarray:
        """The decoded chunk (float64) of levels ``v`` and group scales ``s``."""
        rows, cols = v.shape
        per = np.repeat(s, GROUP_SIZE)[: v.size].reshape(rows, cols)
        return _decoded_values(v, per, self.c)

    def _forms(self, w: np.ndarray, v: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Per row, ``e H e^T`` of the chunk's encoding ``(v, s)``."""
        return _row_forms(w, self._decoded(v, s), self.h)

    def _merge(self, a: _Candidate, b: _Candidate) -> _Candidate:
        """Per row (or for the whole chunk, when groups straddle rows) the better of two
        encodings of the chunk."""
        if not self.by_row:
            return b if b.err.sum() < a.err.sum() else a
        take = b.err < a.err
        rows = len(take)
        v = np.where(take[:, None], b.v, a.v)
        s = np.where(take[:, None], b.s.reshape(rows, -1), a.s.reshape(rows, -1)).reshape(-1)
        return _Candidate(v, s, np.where(take, b.err, a.err))

    # -- the passes

    def _sweep(self, w: np.ndarray, s: np.ndarray) -> np.ndarray:
        """The GPTQ (Babai) sweep of the chunk ``w`` at the fixed group scales ``s``: the
        levels, ``rows x cols``."""
        assert self.sweep_r is not None
        r = self.sweep_r
        rows, cols = w.shape
        order = self.order
        rd = np.array(np.diagonal(r))
        wt = np.asarray(w.T[order], np.float64)  # processing order x rows
        et = np.empty_like(wt)
        vt = np.empty((cols, rows), np.float32)
        half = self.half
        for b in range(0, cols, _BLOCK):
            e = min(b + _BLOCK, cols)
            x = wt[b:e].copy()
            if b:
                x += (r[:b, b:e].T @ et[:b]) / rd[b:e, None]
            for k in range(b, e):
                sk = self._scales_of(s, rows, int(order[k]))
                with np.errstate(divide="ignore"):
                    inv = np.where(sk > 0, self.c / sk.astype(np.float64), 0.0)
                v = np.floor(x[k - b] * inv)
                np.clip(v, -half, half - 1, out=v)
                v += 0.5
                vt[k] = v
                et[k] = wt[k] - _decoded_values(v, sk, self.c)
                if k + 1 < e:
                    x[k - b + 1 :] += np.outer(r[k, k + 1 : e] / rd[k + 1 : e], et[k])
        levels = np.empty((rows, cols), np.float32)
        levels[:, order] = vt.T
        return levels

    def _descend(self, w: np.ndarray, v: np.ndarray, s: np.ndarray) -> np.ndarray:
        """One sweep of coordinate descent over the chunk's levels ``v`` at scales ``s``:
        each weight, column by column for all rows at once, moves one level up or down
        when that lowers ``e (H + lambda I) e^T``."""
        rows, cols = v.shape
        lv = v.copy()
        e = np.asarray(w, np.float64) - self._decoded(lv, s)
        g = _times_h(e, self.h)
        g += self.lam * e  # the gradient's half: e (H + lambda I)
        for j in range(cols):
            sj = self._scales_of(s, rows, j)
            hj = _h_rows(self.h, j, j + 1)[0]
            hjj = hj[j] + self.lam
            vj = lv[:, j]
            q0 = _decoded_values(vj, sj, self.c)
            best_d = np.zeros(rows)
            best_dq = np.zeros(rows)
            best_v = vj.copy()
            for step in (-1.0, 1.0):
                vn = vj + np.float32(step)
                dq = _decoded_values(vn, sj, self.c) - q0  # e_j changes by -dq
                delta = dq * (dq * hjj - 2 * g[:, j])
                better = (np.abs(vn) < self.half) & (delta < best_d)
                best_d = np.where(better, delta, best_d)
                best_dq = np.where(better, dq, best_dq)
                best_v = np.where(better, vn, best_v)
            moved = np.flatnonzero(best_dq)
            if moved.size:
                g[moved] -= np.outer(best_dq[moved], hj)
                g[moved, j] -= self.lam * best_dq[moved]
                lv[moved, j] = best_v[moved]
        return lv

    def _refit(self, w: np.ndarray, v: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Per row, the fp16 group scales minimising ``e H e^T`` for the levels ``v``: the
        normal equations ``M s = b``, ``M_ab = l_a^T H_ab l_b``, ``b_a = l_a^T H_a w``
        (``l_a``: the row's level values in group ``a``), solved per row; a group whose
        inputs are all dead keeps its scale ``s``. Scales clipped to ``[0, 65504]``."""
        rows, cols = v.shape
        gpr = cols // GROUP_SIZE
        lev = (v / self.c).astype(np.float32).astype(np.float64)
        old = s.reshape(rows, gpr).astype(np.float64)
        out = old.copy()
        step = max(1, _SYSTEM_BYTES // (8 * max(cols, gpr * gpr)))
        gi = np.arange(gpr)
        for r0 in range(0, rows, step):
            lv = lev[r0 : r0 + step]
            wr = np.asarray(w[r0 : r0 + step], np.float64)
            m = np.empty((len(lv), gpr, gpr))
            rhs = np.empty((len(lv), gpr))
            for a in range(gpr):
                cs = slice(a * GROUP_SIZE, (a + 1) * GROUP_SIZE)
                t = lv[:, cs] @ _h_rows(self.h, cs.start, cs.stop)  # l_a^T H_a
                m[:, a, :] = (t * lv).reshape(len(lv), gpr, GROUP_SIZE).sum(-1)
                rhs[:, a] = np.einsum("ij,ij->i", t, wr)
            dd = m[:, gi, gi]
            dead = ~(dd > 0)
            m[:, gi, gi] = np.where(dead, 1.0, dd)
            rhs[dead] = old[r0 : r0 + step][dead]
            try:
                fit = np.linalg.solve(m, rhs[..., None])[..., 0]
            except np.linalg.LinAlgError:
                continue  # a singular row: the chunk keeps its scales
            fit[~np.isfinite(fit)] = -1.0
            keep = fit < 0  # a negative optimum: the codes' signs disagree; keep the scale
            out[r0 : r0 + step] = np.where(keep, old[r0 : r0 + step], np.minimum(fit, FP16_MAX))
        return f16_round(out.reshape(-1).astype(np.float32))


@dataclass
class _Candidate:
    """One encoding of a chunk: levels ``v`` (``code - c``, ``rows x cols`` float32), group
    scales ``s`` (float32 fp16 values) and each row's ``e H e^T``."""

    v: np.ndarray
    s: np.ndarray
    err: np.ndarray

    def plain_rows(self, plain_err: np.ndarray, by_row: bool) -> int:
        """Rows of the chunk whose error is the plain one (not improved upon)."""
        if not by_row:
            return len(self.err) if self.err.sum() >= plain_err.sum() else 0
        return int(np.count_nonzero(self.err >= plain_err))
