"""What a sculpt is asked to make (:class:`SculptOptions`) and what it did
(:class:`SculptResult`, whose :meth:`~SculptResult.summary` the CLI prints)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from smoe import quant
from smoe.sculpt.outcome import ExpertOutcome
from smoe_gen import layout
from smoe_gen.layout import TENSOR_NAMES

__all__ = ["PLAN_SCHEMA", "SUMMARY_SCHEMA", "SculptOptions", "SculptResult", "finite", "spread"]


SUMMARY_SCHEMA = "smoe-sculpt/1"
"""The ``schema`` of a sculpt's summary (``smoe sculpt --json``; docs/JSON.md)."""
PLAN_SCHEMA = "smoe-sculpt-plan/1"
"""The ``schema`` of a dry run's plan (``smoe sculpt --dry-run --json``; docs/JSON.md)."""


@dataclass(frozen=True)
class SculptOptions:
    """What :func:`smoe.sculpt.sculpt` makes: bit width, format version, which experts, how many
    worker processes, resume, scale choice, output name, importance matrix, calibration, and
    the manifest's metadata (title, description, license).

    >>> SculptOptions(bits=2, max_layers=1, jobs=2).bits
    2
    """

    bits: int = layout.BITS_Q4
    version: int = layout.VERSION_MAX
    max_layers: int | None = None
    max_experts: int | None = None
    jobs: int | None = None
    """Worker processes; None: the usable cores. Never more than there are batches."""
    resume: bool = False
    dry_run: bool = False
    scale: str = "optimal"
    name: str | None = None
    """The outputs' stem (``<name>.smoe``, ...); None: the model folder's name."""
    imatrix: str | Path | None = None
    """A llama.cpp importance matrix (GGUF or legacy ``.dat``): ``optimal`` scales minimise
    the error weighted by each input channel's mean square; None: the plain error."""
    calibrate: str | Path | None = None
    """Calibration data (token ids ``.npy``/``.safetensors``, or text for the checkpoint's
    tokenizer): the model runs over it layer by layer and every expert with routed tokens is
    quantised for the least output error (:mod:`smoe.sculpt.calibrate`); None: the plain
    encoder."""
    device: str = "cpu"
    """Where the calibration's forward passes run (``cpu``, ``cuda``, ``cuda:N``)."""
    calib_seq_len: int = 512
    """Tokens per calibration sequence, for text and 1-D ids (2-D ids give their own)."""
    calib_max_tokens: int | None = None
    """At most this many calibration tokens (whole sequences); None: all."""
    replace: bool = True
    """Replace an existing vault (``smoe sculpt`` passes ``--force``; False: an existing
    vault is refused before any work, :class:`~smoe.errors.OutputExists`, and never
    replaced at the commit)."""
    title: str | None = None
    """The vault's human-readable name, the manifest's ``metadata.name`` (``--title``; not
    ``name``, the outputs' stem); None: none."""
    description: str | None = None
    """The manifest's ``metadata.description``; None: none."""
    license: str | None = None
    """The manifest's ``metadata.license`` (an SPDX id or expression); None: none."""


@dataclass
class SculptResult:
    """What a sculpt did; ``summary()`` is what the CLI prints.

    >>> import tempfile
    >>> from smoe.sculpt import sculpt
    >>> res = sculpt("fixtures/checkpoints/qwen3_moe", tempfile.mkdtemp(), SculptOptions(jobs=1))
    >>> res.vault.name, res.experts_written, res.bytes_in, res.vault_bytes
    ('qwen3_moe.smoe', 16, 294912, 278528)
    """

    vault: Path
    scout: Path
    experts_written: int
    experts_resumed: int
    bytes_in: int
    """Source bytes of every expert in the vault (a resume's kept ones too): the compression
    ratio's numerator."""
    vault_bytes: int
    scout_bytes: int
    seconds: float
    experts: tuple[ExpertOutcome, ...] = ()
    """Every expert in the vault (a resume's kept ones first), as written."""
    warnings: list[str] = field(default_factory=list)
    bits: int | None = None
    """Bit width of the run: selects ``quant.SNR_FLOOR_DB`` (no SNR warnings if None)."""
    weighted: bool = False
    """Quantised with an importance matrix: :attr:`weighted_snr` is shown."""
    imatrix: dict[str, Any] | None = None
    """The importance matrix used (``ImatrixInfo.as_json()``), or None."""
    config: Path | None = None
    """The copy of the model's config.json committed beside the vault."""
    placement: dict[str, Any] | None = None
    """What went where (:meth:`Checkpoint.placement`): experts to the vault, the rest to
    the scout by part of the model."""
    calibration: dict[str, Any] | None = None
    """With ``--calibrate``: the data (file, format, bytes, SHA-256, sequences, tokens), the
    device, the counts (experts calibrated, unrouted, tensors that fell back to the plain
    encoder), the median output-SNR gain over the plain encoder, seconds and peak memory."""
    phases: dict[str, float] | None = None
    """Seconds of ``setup`` (checkpoint, plan, resume checks, compiled kernels loaded),
    ``experts`` (reading, quantising and writing them) and ``commit`` (scout, fsyncs,
    renames); together ``seconds``."""

    SHOW_EACH = 3
    """Up to this many low-SNR tensors get a warning line each; more collapse into one."""

    @property
    def snr(self) -> dict[str, list[float | None]]:
        """Per tensor name, the SNR of every expert in the vault, in :attr:`experts` order.

        >>> from smoe.sculpt.outcome import ExpertOutcome, TensorOutcome
        >>> t = TensorOutcome(source_crc=0, snr=7.25)
        >>> figures = (Path("m.smoe"), Path("s"), 1, 0, 1, 1, 1, 1.0)
        >>> SculptResult(*figures, experts=(ExpertOutcome((3, 5), 0, (t, t, t), 1),)).snr
        {'gate_proj': [7.25], 'up_proj': [7.25], 'down_proj': [7.25]}
        """
        return {
            name: [o.tensors[i].snr for o in self.experts] for i, name in enumerate(TENSOR_NAMES)
        }

    @property
    def weighted_snr(self) -> dict[str, list[float | None]] | None:
        """With an importance matrix: per tensor name, the importance-weighted SNR of every
        expert in the vault (as :attr:`snr`; None for a tensor quantised unweighted).

        >>> figures = (Path("m.smoe"), Path("s"), 1, 0, 1, 1, 1, 1.0)
        >>> SculptResult(*figures).weighted_snr is None
        True
        """
        if not self.weighted:
            return None
        return {
            name: [o.tensors[i].weighted_snr for o in self.experts]
            for i, name in enumerate(TENSOR_NAMES)
        }

    @property
    def snr_keys(self) -> list[tuple[int, int]]:
        """(layer, expert) of every expert in the vault, in :attr:`experts` order.

        >>> from smoe.sculpt.outcome import ExpertOutcome, TensorOutcome
        >>> t = TensorOutcome(source_crc=0, snr=7.25)
        >>> figures = (Path("m.smoe"), Path("s"), 1, 0, 1, 1, 1, 1.0)
        >>> SculptResult(*figures, experts=(ExpertOutcome((3, 5), 0, (t, t, t), 1),)).snr_keys
        [(3, 5)]
        """
        return [o.key for o in self.experts]

    def summary(self) -> dict:
        """The CLI's summary (``smoe sculpt --json``, schema :data:`SUMMARY_SCHEMA`, keys in
        docs/JSON.md); JSON-safe (RFC 8259: no NaN or Infinity anywhere).

        ``snr_db``: per tensor name, ``{"min", "median"}`` in dB over the experts in the
        vault (those a resume kept, recomputed from their blobs, included),
        or ``None`` when none has a finite SNR. ``snr_exact``: how many expert tensors
        have no finite SNR (``QuantStats.finite_snr_db`` is ``None``, or a value is
        NaN/±Inf: encoded exactly up to a constant offset, e.g. all zeros, or constant);
        they are left out of min/median.
        ``snr_floor_db``: the bit width's floor (``quant.SNR_FLOOR_DB``); ``warnings``:
        the checkpoint's (and the importance matrix's), then one per tensor below the floor
        (or one line for many; the importance-weighted SNR where there is one).
        ``phases_s``: seconds of setup, experts and commit (see :attr:`phases`).
        ``placement``: what went where (the expert tensors to the vault, the others to the
        scout by part of the model), or None.
        ``imatrix``: the importance matrix used (path, format, size, CRC-32C, SHA-256,
        datasets, chunk count and size, entries) or None; ``weighted_snr_db``: with it, per
        tensor name ``{"min", "median"}`` of the importance-weighted SNR (the expected SNR of
        the output ``W x``), or None.

        >>> from smoe.sculpt.outcome import ExpertOutcome, TensorOutcome
        >>> low, exact = TensorOutcome(source_crc=0, snr=6.5), TensorOutcome(0, float("nan"))
        >>> experts = (ExpertOutcome((0, 0), 0, (low, exact, exact), 4096),)
        >>> res = SculptResult(Path("m.smoe"), Path("m.scout.safetensors"), 1, 0, 4096, 2048,
        ...                    64, 0.5, experts, bits=4)
        >>> s = res.summary()
        >>> s["compression_ratio"], s["throughput_mb_s"], s["snr_db"]["gate_proj"], s["snr_exact"]
        (2.0, 0.008192, {'min': 6.5, 'median': 6.5}, 2)
        >>> s["warnings"]
        ['layer 0 expert 0 gate_proj: SNR 6.50 dB is below the Q4 floor of 10 dB']
        """
        snr, exact = {}, 0
        for t, values in self.snr.items():
            real = [v for v in values if finite(v)]
            exact += len(values) - len(real)
            snr[t] = spread(real)
        weighted = None
        if self.weighted_snr is not None:
            weighted = {
                t: spread([v for v in values if finite(v)])
                for t, values in self.weighted_snr.items()
            }
        floor = quant.SNR_FLOOR_DB.get(self.bits) if self.bits is not None else None
        mb_in = self.bytes_in / 1e6
        return {
            "schema": SUMMARY_SCHEMA,
            "vault": str(self.vault),
            "scout": str(self.scout),
            "config": None if self.config is None else str(self.config),
            "experts_written": self.experts_written,
            "experts_resumed": self.experts_resumed,
            "expert_bytes_in": self.bytes_in,
            "vault_bytes": self.vault_bytes,
            "scout_bytes": self.scout_bytes,
            "compression_ratio": self.bytes_in / self.vault_bytes if self.vault_bytes else None,
            "seconds": self.seconds,
            "phases_s": self.phases,
            "throughput_mb_s": mb_in / self.seconds if self.seconds > 0 else None,
            "snr_db": snr,
            "snr_exact": exact,
            "snr_floor_db": floor,
            "imatrix": self.imatrix,
            "weighted_snr_db": weighted,
            "placement": self.placement,
            "calibration": self.calibration,
            "warnings": self.warnings + self.snr_warnings(),
        }

    def snr_warnings(self) -> list[str]:
        """Expert tensors whose SNR is below the floor for ``bits``, worst first when
        there are more than :attr:`SHOW_EACH` (then as one line with a count). A tensor
        quantised with importance is judged by its importance-weighted SNR: weighting
        lowers the plain one on purpose.

        >>> from smoe.sculpt.outcome import ExpertOutcome, TensorOutcome
        >>> up, none = TensorOutcome(source_crc=0, snr=7.25), TensorOutcome(0, None)
        >>> experts = (ExpertOutcome((3, 5), 0, (none, up, none), 1),)
        >>> figures = (Path("m.smoe"), Path("s"), 1, 0, 1, 1, 1, 1.0)
        >>> SculptResult(*figures, experts=experts, bits=2).snr_warnings()
        []
        >>> SculptResult(*figures, experts=experts, bits=4).snr_warnings()
        ['layer 3 expert 5 up_proj: SNR 7.25 dB is below the Q4 floor of 10 dB']
        """
        floor = quant.SNR_FLOOR_DB.get(self.bits) if self.bits is not None else None
        if floor is None:
            return []
        low = []  # (snr, (layer, expert), tensor ordinal, who, tensor name, weighted)
        for j, t in enumerate(TENSOR_NAMES):
            for o in self.experts:
                w = o.tensors[j].weighted_snr if self.weighted else None
                weighted = finite(w)
                v = w if weighted else o.tensors[j].snr
                if finite(v) and v < floor:
                    who = f"layer {o.key[0]} expert {o.key[1]}"
                    low.append((v, o.key, j, who, t, weighted))
        below = f"the Q{self.bits} floor of {floor:g} dB"
        if len(low) <= self.SHOW_EACH:
            return [
                f"{who} {t}: {'importance-weighted ' if w else ''}SNR {v:.2f} dB is below {below}"
                for v, _, _, who, t, w in sorted(low, key=lambda x: x[1:3])
            ]
        worst = ", ".join(
            f"{who} {t} {v:.2f} dB" for v, _, _, who, t, _ in sorted(low)[: self.SHOW_EACH]
        )
        how = " (importance-weighted where an imatrix applies)" if self.weighted_snr else ""
        return [f"{len(low)} expert tensors have an SNR{how} below {below}; worst: {worst}"]


def finite(v: float | None) -> TypeGuard[float]:
    """A real SNR: not None, NaN or ±Inf (an expert tensor encoded exactly has none).

    >>> finite(6.5), finite(None), finite(float("inf"))
    (True, False, False)
    """
    return v is not None and float("-inf") < v < float("inf")


def spread(values: list[float]) -> dict[str, float] | None:
    """``{"min", "median"}`` of finite values, or None when there are none.

    >>> spread([3.0, 1.0, 2.0]), spread([])
    ({'min': 1.0, 'median': 2.0}, None)
    """
    return {"min": min(values), "median": statistics.median(values)} if values else None
