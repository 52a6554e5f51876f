"""What a sculpt reads, chosen and checked before anything is written: the experts, the
worker count, the importance matrix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from smoe.errors import UsageError
from smoe.plumbing.cpus import usable_cores
from smoe.sculpt.options import SculptOptions
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef
from smoe_gen.layout import TENSOR_NAMES

if TYPE_CHECKING:
    from smoe.sculpt.calibrate.data import CalibrationData
    from smoe.sculpt.source.imatrix import ImportanceMatrix

__all__ = [
    "check_calibrate_options",
    "check_device",
    "open_calibration",
    "open_imatrix",
    "resolve_jobs",
    "select",
]

_DEVICE = re.compile(r"cpu|cuda(:[0-9]{1,3})?")
"""The devices ``--device`` takes: the CPU, the current CUDA device, or one by index."""


def select(ckpt: Checkpoint, opts: SculptOptions) -> list[ExpertRef]:
    """The experts to write: the first ``max_layers`` MoE layers, ``max_experts`` each.

    >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
    >>> [(r.layer, r.expert) for r in select(ck, SculptOptions(max_layers=1, max_experts=2))]
    [(0, 0), (0, 1)]
    """
    for name in ("max_layers", "max_experts"):
        value = getattr(opts, name)
        if value is not None and value < 1:  # an API caller (the CLI refuses it first)
            raise UsageError(f"--{name.replace('_', '-')}: must be at least 1, got {value}")
    layers = ckpt.moe_layers[: opts.max_layers]
    out = []
    for lay in layers:
        for e in ckpt.layer_experts(lay)[: opts.max_experts]:
            out.append(ckpt.experts[(lay, e)])
    return out


def resolve_jobs(jobs: int | None) -> int:
    """``--jobs``: None means the usable cores; anything below 1 is refused (the CLI's
    parser refuses it first).

    >>> resolve_jobs(3), resolve_jobs(None) >= 1
    (3, True)
    >>> resolve_jobs(0)
    Traceback (most recent call last):
    smoe.errors.UsageError: --jobs: must be at least 1, got 0
    """
    if jobs is None:
        return usable_cores()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"--jobs: must be at least 1, got {jobs}")
    return jobs


def open_imatrix(
    path: str | Path, refs: list[ExpertRef], n_experts: int
) -> tuple[ImportanceMatrix, str | None]:
    """The importance matrix at ``path``, opened, validated and mapped onto ``refs`` before
    any work (a file of another model is refused, one SmoeError line), and the one warning
    about the expert tensors it has no data for (quantised unweighted) and those whose
    importance spans more than its range bound (raised to it), or None.

    >>> ck = Checkpoint.open("fixtures/checkpoints/olmoe")
    >>> matrix, warning = open_imatrix("fixtures/imatrix_tiny.dat", select(ck, SculptOptions()), 4)
    >>> matrix.info.entries, warning.split(": ")[1]
    (1, '20 of 24 expert tensors have no importance data (20 not in the file); they are ...')
    >>> matrix.close()
    """
    from smoe.sculpt.source.imatrix import ImportanceMatrix

    matrix = ImportanceMatrix.open(path)
    try:
        fallbacks = matrix.check([(r.layer, r.expert, r.shapes) for r in refs], n_experts)
    except BaseException:
        matrix.close()
        raise
    return matrix, matrix.warning(fallbacks, len(TENSOR_NAMES) * len(refs))


def check_calibrate_options(opts: SculptOptions) -> None:
    """Refuse the options ``--calibrate`` cannot go with, before any input is read.

    >>> check_calibrate_options(SculptOptions(calibrate="x.npy", imatrix="m.dat"))
    Traceback (most recent call last):
    smoe.errors.UsageError: --calibrate and --imatrix: give one (the calibration's ...
    """
    check_device(opts.device)
    if opts.calibrate is None:
        return
    if opts.scale != "optimal":
        raise UsageError(
            f"--calibrate chooses codes and scales itself; it cannot be given --scale {opts.scale}"
        )
    if opts.imatrix is not None:
        raise UsageError(
            "--calibrate and --imatrix: give one (the calibration's statistics hold the "
            "importance matrix's and more)"
        )


def check_device(device: str) -> None:
    """Refuse a ``--device`` that is not ``cpu``, ``cuda`` or ``cuda:N`` (a usage error, before
    any input is read; whether torch has that device is asked once torch is imported).

    >>> check_device("cuda:1")
    >>> check_device("tpu")
    Traceback (most recent call last):
    smoe.errors.UsageError: --device tpu: not a device the calibration runs on: give cpu, ...
    """
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise UsageError(
            f"--device {device}: not a device the calibration runs on: give cpu, cuda or "
            "cuda:N (N: a CUDA device's index)"
        )


def open_calibration(ckpt: Checkpoint, opts: SculptOptions, vocab_size: int) -> CalibrationData:
    """``--calibrate``'s DATA, read and checked before any work: the options it cannot go
    with refused (usage errors), torch and transformers present, every id in the model's
    vocabulary, the device there, the model buildable from its config.

    >>> ck = Checkpoint.open("fixtures/checkpoints/olmoe")
    >>> open_calibration(ck, SculptOptions(calibrate="x.npy", scale="absmax"), 320)
    Traceback (most recent call last):
    smoe.errors.UsageError: --calibrate chooses codes and scales itself; it cannot be ...
    """
    from smoe.sculpt.calibrate.data import load_calibration
    from smoe.sculpt.calibrate.runner import check_device_present, import_torch, meta_model

    check_calibrate_options(opts)
    assert opts.calibrate is not None
    data = load_calibration(  # bad DATA is refused before torch's seconds of import
        opts.calibrate,
        vocab_size=vocab_size,
        model_dir=ckpt.root,
        seq_len=opts.calib_seq_len,
        max_tokens=opts.calib_max_tokens,
    )
    check_device_present(import_torch(), opts.device)
    meta_model(ckpt)  # a config transformers cannot build is refused before anything is written
    return data
