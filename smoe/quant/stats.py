"""How good an encoding is: signal and error power, as SNR in dB (plain, and weighted by
importance: the SNR of the output ``W x``). The encoders accumulate :class:`QuantStats` in
the encoding pass itself; :func:`snr_db` measures a decoded tensor against its weights."""

from __future__ import annotations

import numpy as np

from smoe.quant.traits import CHUNK_WEIGHTS

__all__ = ["QuantStats", "snr_db"]


def snr_db(w: np.ndarray, w_hat: np.ndarray, *, chunk_weights: int = CHUNK_WEIGHTS) -> float:
    """Signal-to-noise ratio ``10 * log10(var(w) / var(w - w_hat))`` in dB (float64 sums).

    ``inf`` when the error is exactly constant (e.g. zero). Computed in chunks.

    >>> import numpy as np
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> round(snr_db(w, w + 0.01 * np.cos(np.arange(64))), 1), snr_db(w, w + 0.5)
    (38.2, inf)
    """
    a = np.asarray(w).reshape(-1)
    b = np.asarray(w_hat).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {np.shape(w)} vs {np.shape(w_hat)}")
    stats = QuantStats()  # the encoder's own accumulator, fed float64 chunks
    for start in range(0, a.size, chunk_weights):
        x = a[start : start + chunk_weights].astype(np.float64)
        stats.add(x, x - b[start : start + chunk_weights])
    return stats.snr_db


class QuantStats:
    """Signal and error power of one or more encodes; see ``encode_into(stats=...)``.

    Keeps count, sum and sum of squares per chunk (numpy encoder: float32 BLAS dot products
    summed in float64, a chunk whose float32 sums overflow redone in float64; compiled
    encoder: float32 sums of 16 weights per lane, summed in float64): weights and errors
    are near zero-mean, so ``sumsq - sum**2 / n`` loses nothing that matters for a figure
    in dB, and it costs a fraction of a decode.

    Encodes with importance ``h`` (per weight) also add ``sum(h w^2)`` and ``sum(h err^2)``:
    :attr:`weighted_snr_db` is their ratio, the expected SNR of the output ``W x`` for
    inputs whose channels are uncorrelated with mean squares ``h`` (what an importance
    matrix holds). Powers, not variances: the output's mean is part of its signal.

    >>> import numpy as np
    >>> from smoe.quant import encode_into, packed_size
    >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
    >>> stats = QuantStats()
    >>> for bits in (4, 2):  # one accumulator over several encodes
    ...     _ = encode_into(w, bits, np.empty(packed_size(w.size, bits), np.uint8),
    ...                     np.empty(2, "<f2"), stats=stats)
    >>> stats.n, round(stats.snr_db, 1), stats.weighted_snr_db
    (256, 14.8, None)
    """

    _RESOLUTION = 1e-4
    """Variances below this fraction of the mean square are taken as zero: float32 sums
    cannot resolve them (e.g. the error of a constant tensor)."""

    def __init__(self) -> None:
        self.n = 0
        self.sums = [0.0, 0.0, 0.0, 0.0]  # signal sum, signal sumsq, error sum, error sumsq
        self.weighted_n = 0  # weights counted with importance
        self.wsums = [0.0, 0.0]  # sum(h w^2), sum(h err^2)

    def add_sums(self, n: int, sums: np.ndarray, unit: float = 1.0) -> None:
        """Add ``sum(w), sum(w^2), sum(err), sum(err^2)`` of ``n`` weights, and if ``sums``
        has six, ``sum(h w^2), sum(h err^2)`` (``h`` in units of ``unit``).

        >>> import numpy as np
        >>> stats = QuantStats()
        >>> stats.add_sums(128, np.array([0.0, 43.0, 0.0, 0.043]))  # error power 1/1000
        >>> round(stats.snr_db, 1)
        30.0
        """
        self.n += int(n)
        for k in range(4):
            self.sums[k] += float(sums[k])
        if len(sums) > 4:
            self.weighted_n += int(n)
            self.wsums[0] += float(sums[4]) * unit
            self.wsums[1] += float(sums[5]) * unit

    def add(
        self, w: np.ndarray, err: np.ndarray, h: np.ndarray | None = None, unit: float = 1.0
    ) -> None:
        """Add weights ``w`` and their errors ``err`` (float32 or float64, any shape), with
        per-weight importance ``h`` (shaped like ``w``, in units of ``unit``) if given.

        >>> import numpy as np
        >>> w = np.linspace(-1, 1, 128, dtype=np.float32)
        >>> stats = QuantStats()
        >>> err = 0.01 * np.cos(np.arange(128, dtype=np.float32))
        >>> stats.add(w, err, h=np.ones(128, np.float32))
        >>> round(stats.snr_db, 1), round(stats.weighted_snr_db, 1)
        (38.3, 38.3)
        """
        x, e = w.reshape(-1), err.reshape(-1)
        self.n += x.size
        with np.errstate(over="ignore", invalid="ignore"):
            part = [float(v) for v in (x.sum(), np.dot(x, x), e.sum(), np.dot(e, e))]
        if not np.isfinite(part).all():
            x, e = x.astype(np.float64), e.astype(np.float64)
            part = [float(v) for v in (x.sum(), np.dot(x, x), e.sum(), np.dot(e, e))]
        for k, v in enumerate(part):
            self.sums[k] += v
        if h is not None:
            hx = h.reshape(-1)
            with np.errstate(over="ignore", invalid="ignore"):
                wpart = [float(np.dot(hx * x, x)), float(np.dot(hx * e, e))]
            if not np.isfinite(wpart).all():
                x, e, hx = x.astype(np.float64), e.astype(np.float64), hx.astype(np.float64)
                wpart = [float(np.dot(hx * x, x)), float(np.dot(hx * e, e))]
            self.weighted_n += x.size
            self.wsums[0] += wpart[0] * unit
            self.wsums[1] += wpart[1] * unit

    def _m2(self, s: float, ss: float) -> float:
        m2 = ss - s * s / self.n if self.n else 0.0
        return m2 if m2 > ss * self._RESOLUTION else 0.0

    @property
    def snr_db(self) -> float:
        """``10 * log10(var(w) / var(w - w_hat))`` as :func:`snr_db` gives it: ``inf`` when
        the error has no variance, ``-inf`` when only the signal has none.

        >>> import numpy as np
        >>> from smoe.quant import encode_into
        >>> stats = QuantStats()
        >>> encode_into(np.zeros(64, np.float32), 4, np.empty(32, np.uint8), np.empty(1, "<f2"),
        ...             stats=stats)
        >>> stats.snr_db  # all zeros: encoded exactly
        inf
        """
        sig = self._m2(self.sums[0], self.sums[1])
        err = self._m2(self.sums[2], self.sums[3])
        if err == 0:
            return float("inf")
        if sig == 0:
            return float("-inf")
        return float(10 * np.log10(sig / err))

    @property
    def finite_snr_db(self) -> float | None:
        """:attr:`snr_db`, or ``None`` (JSON ``null``) when it is not finite: the encode is
        exact up to a constant offset (e.g. an all-zero tensor) or the tensor is constant.

        >>> import numpy as np
        >>> from smoe.quant import encode_into
        >>> stats = QuantStats()
        >>> encode_into(np.zeros(64, np.float32), 4, np.empty(32, np.uint8), np.empty(1, "<f2"),
        ...             stats=stats)
        >>> stats.finite_snr_db is None
        True
        """
        v = self.snr_db
        return v if np.isfinite(v) else None

    @property
    def weighted_snr_db(self) -> float | None:
        """``10 * log10(sum(h w^2) / sum(h err^2))``, ``None`` (JSON ``null``) when no encode
        had importance or the ratio is not finite (no error, or no weighted signal).

        >>> import numpy as np
        >>> from smoe.quant import encode_into
        >>> w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)  # two groups
        >>> stats = QuantStats()
        >>> imp = np.r_[np.ones(32), np.full(32, 100.0)]
        >>> encode_into(w, 4, np.empty(64, np.uint8), np.empty(2, "<f2"), stats=stats,
        ...             importance=imp)
        >>> round(stats.weighted_snr_db, 1), round(stats.snr_db, 1)  # output SNR, weight SNR
        (24.4, 19.2)
        """
        sig, err = self.wsums
        if not self.weighted_n or err <= 0 or sig <= 0:
            return None
        v = float(10 * np.log10(sig / err))
        return v if np.isfinite(v) else None
