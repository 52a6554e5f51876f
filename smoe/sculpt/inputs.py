"""What a sculpt reads, chosen and checked before anything is written: the experts, the
worker count, the importance matrix."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from smoe.errors import UsageError
from smoe.plumbing.cpus import usable_cores
from smoe.sculpt.options import SculptOptions
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef
from smoe_gen.layout import TENSOR_NAMES

if TYPE_CHECKING:
    from smoe.sculpt.source.imatrix import ImportanceMatrix

__all__ = ["open_imatrix", "resolve_jobs", "select"]


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
