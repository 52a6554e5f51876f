"""What ``--calibrate`` does between the runner's passes: the quantised experts read back
from the partial vault (the next pass runs on exactly the bytes the vault holds), and the
per-tensor output-error estimates the manifest records."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from smoe import quant
from smoe.format.plan import ExpertSlot
from smoe.plumbing import fileio

__all__ = ["Estimate", "Tally", "decode_blob", "estimate", "partial_fd"]


def decode_blob(fd: int, path: str | os.PathLike, slot: ExpertSlot, bits: int) -> list[np.ndarray]:
    """The three matrices of the blob at ``slot`` of the open vault (or partial) ``fd``,
    dequantised to float32 (what a reader of the vault gets).

    >>> import tempfile
    >>> from smoe.format.plan import make_plan
    >>> from smoe.vault.blob import MatrixInput, encode_blob
    >>> slot = make_plan({(0, 0): ((32, 64), (32, 64), (64, 32))}, bits=4, version=2).experts[0]
    >>> mats = [np.full((32, 64), 0.5), np.full((32, 64), -0.25), np.full((64, 32), 2.0)]
    >>> f = tempfile.TemporaryFile()
    >>> blob = encode_blob(slot, MatrixInput.each(mats), 4, "optimal")
    >>> _ = f.write(bytes(slot.byte_offset) + bytes(blob))
    >>> [float(m[0, 0]) for m in decode_blob(f.fileno(), "v.smoe", slot, 4)]
    [0.5, -0.25, 2.0]
    """
    blob = np.frombuffer(fileio.pread_exact(fd, slot.raw_size, slot.byte_offset, path), np.uint8)
    out = []
    for t in slot.tensors:
        packed = blob[t.packed_offset : t.packed_offset + t.packed_size]
        scales = blob[t.scales_offset : t.scales_offset + t.scales_size]
        out.append(quant.decode(packed, scales, bits, (t.rows, t.cols)))
    return out


@dataclass(frozen=True)
class Estimate:
    """One tensor's calibrated output error, for the manifest: ``tokens`` routed to it,
    ``snr_db`` the output SNR ``10 log10(tr(W H W^T) / tr(E H E^T))`` on the calibration
    inputs' second moments ``H``, ``gain_db`` over the plain encoder on the same ``H``
    (None where not finite).

    >>> Estimate(9, 20.0, 3.0).gain_db
    3.0
    """

    tokens: int
    snr_db: float | None
    gain_db: float | None

    @classmethod
    def of(cls, report: quant.HessianReport, tokens: int) -> Estimate:
        """From the encoder's report.

        >>> Estimate.of(quant.HessianReport(error=1.0, plain_error=2.0, signal=100.0), 9)
        Estimate(tokens=9, snr_db=20.0, gain_db=3.0103)
        """
        return cls(tokens, _round(report.output_snr_db), _round(report.gain_db))

    def entry(self) -> dict[str, Any]:
        """The manifest's per-tensor keys.

        >>> Estimate(9, 20.0, None).entry()
        {'calib_tokens': 9, 'calib_snr_db': 20.0, 'calib_gain_db': None}
        """
        return {
            "calib_tokens": self.tokens,
            "calib_snr_db": self.snr_db,
            "calib_gain_db": self.gain_db,
        }


def _round(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(float(v), 4)


def estimate(w: np.ndarray, w_hat: np.ndarray, h: np.ndarray, bits: int, tokens: int) -> Estimate:
    """The estimate of a tensor already in the vault (a resume keeps it): its error and the
    plain encoder's, on ``h``.

    >>> w = np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 128)
    >>> w_hat = quant.decode(*quant.encode(w, 4), 4, w.shape)
    >>> estimate(w, w_hat, np.eye(128), 4, 5).gain_db  # it is the plain encoding
    0.0
    """
    plain = quant.decode(*quant.encode(w, bits), bits, w.shape)
    report = quant.HessianReport(
        error=quant.hessian_error(w, w_hat, h),
        plain_error=quant.hessian_error(w, plain, h),
        signal=quant.hessian_error(w, np.zeros_like(w), h),
    )
    return Estimate.of(report, tokens)


@dataclass
class Tally:
    """The calibration's counts for the summary and the manifest: experts quantised with
    their statistics, experts that got no token (the plain encoder), tensors whose
    factorisation failed at every dampening (the plain encoder too), per tensor the
    estimates, seconds.

    >>> Tally().calibrated
    0
    """

    calibrated: int = 0
    unrouted: list[tuple[int, int]] = field(default_factory=list)
    failed: int = 0
    estimates: dict[tuple[int, int], list[Estimate | None]] = field(default_factory=dict)
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        """The summary's and the manifest's counts.

        >>> Tally(3, [(0, 2)]).record()["experts_unrouted"]
        1
        """
        gains = [
            e.gain_db
            for row in self.estimates.values()
            for e in row
            if e is not None and e.gain_db is not None
        ]
        return {
            "experts_calibrated": self.calibrated,
            "experts_unrouted": len(self.unrouted),
            "tensors_plain_fallback": self.failed,
            "median_gain_db": _round(float(np.median(gains))) if gains else None,
        }


def partial_fd(path: Path) -> int:
    """The partial vault, open for reading the blobs this run wrote.

    >>> os.close(partial_fd(Path("fixtures/q4_v2.smoe")))
    """
    return os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
