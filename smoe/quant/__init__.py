"""SMOE-Q2/Q4 group quantisation: encode and decode (ruling D2).

A tensor is flattened row-major; every run of ``GROUP_SIZE`` weights (the last run may be
partial) shares one IEEE binary16 scale, and weight ``i`` is stored as a ``bits``-wide
code, packed LSB-first. Decoding is fixed by the format::

    w = (code - c) / c * scale,    c = (2**bits - 1) / 2

The encoder chooses the scales. ``scale="absmax"`` stores each group's absolute maximum
rounded to fp16 (clipped to the largest finite fp16), as the reference Sculptor did for
Q4. ``scale="optimal"`` (the default) aims at the least squared error per group:

* Q4: codes are computed for two candidate scales, ``0.96`` and ``0.89`` times the fp16
  absmax. Each code set gives, from two row sums, the exact error at its own scale and an
  upper bound of the error at any other scale, hence also its least-squares scale. Those
  scales and the absmax itself, rounded to fp16, are scored and the best kept. On
  normal-like weights that is ~0.5 dB better than absmax and within ~0.07 dB of a dense
  search over all fp16 scales. Choosing by bounds, about one group in ten ends up a
  little (up to ~20%) worse than with absmax; the total error is ~11% lower.
* Q2: every code assignment a scale can produce splits a group's sorted magnitudes into
  an inner (``|level| = 1/3``) and an outer (``|level| = 1``) part. All
  ``GROUP_SIZE + 1`` splits are scored in closed form from prefix sums and the best one's
  least-squares scale kept: the exact optimum, then rounded to fp16. Never worse than the
  reference 64-candidate grid search or absmax, beyond that rounding.

With ``importance`` (one value ``h_c >= 0`` per column, e.g. the mean square of each input
channel from a llama.cpp importance matrix, :mod:`smoe.sculpt.source.imatrix`), ``optimal``
minimises the weighted error ``sum(h_c (w - w_hat)^2)`` per group instead, the error of the
output ``W x`` for inputs with those mean squares. The importance is divided by its maximum
and rounded to bfloat16 precision (8 significant bits, far finer than any calibration
resolves it).

* Q2: the exact weighted optimum. The splits are the same; sorted with their importance
  (ties in ``|w|`` broken by it), split ``k`` scores ``b_k^2 / d_k`` with
  ``b_k = 3 sum(h a) - 2 sum(h a)[:k]`` and ``d_k = 9 sum(h) - 8 sum(h)[:k]``.
* Q4: a ladder of four candidate scales (:data:`~smoe.quant.scales.Q4W_FACTORS`, 1.0 down
  to 0.6 times the fp16 absmax: a weighted optimum may clip unimportant weights hard, or
  fit an important one exactly) instead of two, each scored with its weighted
  least-squares scale and the absmax by weighted sums. ~0.17 dB (output SNR) from a dense
  search of the weighted error.
* A group whose weights with importance are all zero (or whose importance is all zero)
  has the same weighted error at every scale: it gets the plain scale. Importance that is
  uniform (all equal, or all zero) gives the plain encoding, byte for byte.

Codes are always the nearest level for the *stored* (fp16-rounded) scale. Large tensors
are processed in chunks of whole groups, so working memory is bounded by the chunk size;
:func:`encode_into` writes straight into caller buffers such as a memory-mapped blob.

Inputs are ``float32``, ``float16`` (or any real float numpy can cast) arrays, or raw
bfloat16 bit patterns as ``uint16`` with ``src_dtype="bf16"``.

Weights the format cannot hold (issue 10):

* NaN and ±Inf are always refused with :class:`NonFiniteWeights` (exact count, first
  position).
* The top level of both widths is 1.0, so the largest magnitude a group can decode to is
  ``FP16_MAX`` (65504). ``overflow="raise"`` (what vault writers use) refuses any
  ``|w| > 65504`` with :class:`ScaleOverflow`; ``overflow="clip"`` (the default of this
  module) clips the scale to 65504, so larger weights decode to ±65504 and the rest of
  their group to multiples of ``65504 / c``.
* Underflow is not refused: a group with ``absmax < 2**-25`` gets scale 0 and decodes to
  zeros, groups below ``2**-14`` get subnormal (coarser) scales. That loses at most
  ~``3e-8`` per weight; when a whole tensor is that small its SNR drops to ~0 dB
  (``N(0, 1e-8)``: 0.9 dB at Q4, against 19.9 dB at ``N(0, 1e-7)``), which the sculpt
  summary warns about (:data:`SNR_FLOOR_DB`).

Both checks ride on the per-group maxima the encoder computes anyway (one integer max per
chunk); only a failure rescans the tensor to count.

The numpy code of this package is the reference encoder. With numba installed (``pip install
'smoe[fast]'``), :mod:`smoe.quant.kernels.encode` encodes tensors of at least
:data:`FAST_MIN_WEIGHTS` weights several times faster, byte for byte the same (the same
scales, codes and refusals; the SNR statistics agree to float rounding), and
:mod:`smoe.quant.kernels.decode` decodes them (:func:`decode`, :func:`decode_bf16`) about ten
times faster, bit for bit the same. ``kernel=`` or the ``SMOE_KERNEL`` environment variable
chooses: ``auto`` (the default), ``numpy`` (this code) or ``fast`` (the compiled code for
every size; an error without numba).

The package, one module per role (this one re-exports the public API):

* :mod:`~smoe.quant.traits`: bit widths, the fp16 ceiling, chunk sizes, SNR floors, the
  argument types;
* :mod:`~smoe.quant.inputs`: what an input array holds, read chunk by chunk as float32;
* :mod:`~smoe.quant.scales`: the choice of each group's scale (absmax, optimal, weighted);
* :mod:`~smoe.quant.importance`: per-column importance as the encoders use it;
* :mod:`~smoe.quant.packing`: codes and their bytes;
* :mod:`~smoe.quant.errors`: weights the format cannot hold;
* :mod:`~smoe.quant.stats`: signal and error power, SNR;
* :mod:`~smoe.quant.dispatch`: numpy or the compiled kernels (:mod:`smoe.quant.kernels`);
* :mod:`~smoe.quant.compiling`: the compiled kernels' first compile, and its notices;
* :mod:`~smoe.quant.first_run`: numpy for a run too small to pay for that compile, and
  :func:`warmup`, every compiled kernel compiled up front (``smoe warmup``);
* :mod:`~smoe.quant.encoder`, :mod:`~smoe.quant.decoder`: the API, chunk by chunk.
"""

from __future__ import annotations

from smoe.quant.compiling import LOGGER as COMPILE_LOGGER
from smoe.quant.compiling import Warmed
from smoe.quant.decoder import decode, decode_bf16
from smoe.quant.dispatch import fast_kernels, run_choice
from smoe.quant.encoder import encode, encode_into, prepare_fast
from smoe.quant.errors import NonFiniteWeights, ScaleOverflow, UnrepresentableWeights
from smoe.quant.first_run import cache_notes, pick_kernel, run_kernel, warmup
from smoe.quant.hessian import (
    SCALE_STARTS,
    HessianReport,
    encode_hessian,
    encode_hessian_into,
    hessian_error,
    hessian_fallback,
)
from smoe.quant.inputs import as_float32, bf16_to_f32
from smoe.quant.stats import QuantStats, snr_db
from smoe.quant.traits import (
    CHUNK_WEIGHTS,
    FAST_MIN_WEIGHTS,
    FP16_MAX,
    KERNEL_ENV,
    SNR_FLOOR_DB,
    Kernel,
    Overflow,
    ScaleMode,
    SrcDtype,
    level_center,
)
from smoe_gen.layout import num_groups, packed_size, scales_size  # the sizes are re-exported

__all__ = [
    "CHUNK_WEIGHTS",
    "COMPILE_LOGGER",
    "FAST_MIN_WEIGHTS",
    "FP16_MAX",
    "KERNEL_ENV",
    "SCALE_STARTS",
    "SNR_FLOOR_DB",
    "HessianReport",
    "Kernel",
    "NonFiniteWeights",
    "Overflow",
    "QuantStats",
    "ScaleMode",
    "ScaleOverflow",
    "SrcDtype",
    "UnrepresentableWeights",
    "Warmed",
    "as_float32",
    "bf16_to_f32",
    "cache_notes",
    "decode",
    "decode_bf16",
    "encode",
    "encode_hessian",
    "encode_hessian_into",
    "encode_into",
    "fast_kernels",
    "hessian_error",
    "hessian_fallback",
    "level_center",
    "num_groups",
    "packed_size",
    "pick_kernel",
    "prepare_fast",
    "run_choice",
    "run_kernel",
    "scales_size",
    "snr_db",
    "warmup",
]
