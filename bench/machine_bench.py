"""The machine's own limits, measured in the same run: memory copy and bf16 -> f32."""

from __future__ import annotations

import numpy as np

from bench.figures import best_time, figure
from smoe import quant


def run(quick: bool = False) -> list[dict]:
    n = (32 if quick else 128) << 20  # bytes
    src = np.ones(n, np.uint8)
    dst = np.empty_like(src)
    t = best_time(lambda: np.copyto(dst, src), repeat=5)
    copy = n / t / 1e9
    raw = np.random.default_rng(0).integers(0, 1 << 16, n // 2, dtype=np.uint16)
    t = best_time(lambda: quant.bf16_to_f32(raw), repeat=5)
    conv = n / t / 1e9  # GB/s of bf16 input
    return [figure("machine: memory copy (numpy, single thread)", copy, None, "GB/s",
                   "reference limit", None),
            figure("machine: bf16 -> f32 conversion (GB/s of bf16 in)", conv, copy, "GB/s",
                   "fraction of memory copy", None)]
