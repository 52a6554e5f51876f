"""What one expert's quantisation gives back, as named records: the worker builds an
:class:`ExpertOutcome`, the driver adopts it (writer, journal, tally), the manifest and the
summary show it. A new per-tensor measure is a field of :class:`TensorOutcome`, set where
it is computed and read where it is shown."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from smoe import quant

__all__ = ["ExpertOutcome", "TensorOutcome"]


@dataclass(frozen=True)
class TensorOutcome:
    """One tensor of an expert as written: the CRC-32C of its source bytes as read, its SNR
    (dB; None when no finite figure: all-zero or exact) and, quantised with an importance
    matrix, its weighted SNR; calibrated, the Hessian-aware encoder's report.

    >>> TensorOutcome(source_crc=7, snr=12.5).weighted_snr is None
    True
    """

    source_crc: int
    snr: float | None
    weighted_snr: float | None = None
    report: quant.HessianReport | None = None


@dataclass(frozen=True)
class ExpertOutcome:
    """One expert as written: its key (layer, expert), its blob's CRC-32C, its tensors
    (gate, up, down) and the bytes of its source matrices as stored.

    >>> t = TensorOutcome(source_crc=1, snr=10.0, weighted_snr=11.0)
    >>> o = ExpertOutcome(key=(0, 1), blob_crc=9, tensors=(t, t, t), source_bytes=64)
    >>> o.sources, o.snrs, o.weighted
    ((1, 1, 1), (10.0, 10.0, 10.0), (11.0, 11.0, 11.0))
    """

    key: tuple[int, int]
    blob_crc: int
    tensors: tuple[TensorOutcome, ...]
    source_bytes: int
    calibrated: bool = False  # encoded with the calibration's statistics (reports set)

    @property
    def sources(self) -> tuple[int, ...]:
        """Per tensor, the CRC-32C of its source bytes.

        >>> ExpertOutcome((0, 0), 1, (TensorOutcome(5, None),), 0).sources
        (5,)
        """
        return tuple(t.source_crc for t in self.tensors)

    @property
    def snrs(self) -> tuple[float | None, ...]:
        """Per tensor, its SNR (dB).

        >>> ExpertOutcome((0, 0), 1, (TensorOutcome(5, 9.5),), 0).snrs
        (9.5,)
        """
        return tuple(t.snr for t in self.tensors)

    @property
    def weighted(self) -> tuple[float | None, ...]:
        """Per tensor, its importance-weighted SNR (None without an importance matrix).

        >>> ExpertOutcome((0, 0), 1, (TensorOutcome(5, 9.5),), 0).weighted
        (None,)
        """
        return tuple(t.weighted_snr for t in self.tensors)

    @property
    def reports(self) -> list[quant.HessianReport | None] | None:
        """Per tensor, the Hessian-aware encoder's report (None: not calibrated).

        >>> ExpertOutcome((0, 0), 1, (TensorOutcome(5, 9.5),), 0).reports is None
        True
        """
        return [t.report for t in self.tensors] if self.calibrated else None

    def unweighted(self) -> ExpertOutcome:
        """The same outcome without weighted SNRs (a calibrated run records none).

        >>> t = TensorOutcome(source_crc=1, snr=10.0, weighted_snr=11.0)
        >>> ExpertOutcome((0, 1), 9, (t,), 64).unweighted().weighted
        (None,)
        """
        return replace(self, tensors=tuple(replace(t, weighted_snr=None) for t in self.tensors))
