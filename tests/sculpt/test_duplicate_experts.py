"""One expert matrix stored under two names is refused, naming both tensors (issue #31):
``experts.0.`` and ``experts.00.``, ``gate_proj`` and ``w1``, two containers of one layer, two
fused pairs of one layer, fused and per-expert tensors in one layer. Before, the later copy
won and the other was lost from both the vault and the scout. Each case is a checkpoint the
sculptor wrote before (a synthetic one, the duplicate added with the safetensors library)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from smoe_testkit.synth import write_checkpoint

from helpers import refused, run

SHARD = "model.safetensors"
L0 = "model.layers.0."
L1 = "model.layers.1."
WHY = "refused: one expert matrix stored under two names (which copy is the model's cannot be told)"


def with_copies(root: Path, copies: dict[str, str | np.ndarray]) -> Path:
    """The checkpoint's shard with ``copies`` added: new name -> the name of the tensor to
    copy, or an array."""
    tensors = load_file(root / SHARD)
    for new, old in copies.items():
        tensors[new] = tensors[old].copy() if isinstance(old, str) else old
    save_file(tensors, root / SHARD)
    return root


def per_expert(root: Path) -> Path:
    return write_checkpoint(root, layers=2, experts=2, d_model=64, ffn=32, dtype="F32")


def fused(root: Path) -> Path:
    return write_checkpoint(root, layers=2, experts=2, d_model=64, ffn=32, dtype="F32", fused=True)


CASES = {
    "zero_padded_expert_number": (
        per_expert,
        {L0 + "mlp.experts.00.gate_proj.weight": L0 + "mlp.experts.0.gate_proj.weight"},
        (L0 + "mlp.experts.0.gate_proj.weight", L0 + "mlp.experts.00.gate_proj.weight"),
        "layer 0 expert 0",
    ),
    "gate_proj_and_w1": (
        per_expert,
        {L1 + "mlp.experts.1.w1.weight": L1 + "mlp.experts.1.gate_proj.weight"},
        (L1 + "mlp.experts.1.gate_proj.weight", L1 + "mlp.experts.1.w1.weight"),
        "layer 1 expert 1",
    ),
    "two_containers": (
        per_expert,
        {L0 + "block_sparse_moe.experts.1.down_proj.weight": L0 + "mlp.experts.1.down_proj.weight"},
        (L0 + "block_sparse_moe.experts.1.down_proj.weight", L0 + "mlp.experts.1.down_proj.weight"),
        "layer 0 expert 1",
    ),
    "two_fused_pairs": (
        fused,
        {
            L1 + "block_sparse_moe.experts.gate_up_proj": L1 + "mlp.experts.gate_up_proj",
            L1 + "block_sparse_moe.experts.down_proj": L1 + "mlp.experts.down_proj",
        },
        (L1 + "block_sparse_moe.experts.gate_up_proj", L1 + "mlp.experts.gate_up_proj"),
        "layer 1",
    ),
    "fused_and_per_expert": (
        fused,
        {
            L0 + "mlp.experts.0.gate_proj.weight": np.zeros((32, 64), np.float32),
            L0 + "mlp.experts.0.up_proj.weight": np.zeros((32, 64), np.float32),
            L0 + "mlp.experts.0.down_proj.weight": np.zeros((64, 32), np.float32),
        },
        (L0 + "mlp.experts.0.down_proj.weight", L0 + "mlp.experts.gate_up_proj"),
        "layer 0",
    ),
    "fused_and_another_per_expert": (  # expert 7 is in no fused slab: still two layouts
        fused,
        {
            L0 + "mlp.experts.7.gate_proj.weight": np.zeros((32, 64), np.float32),
            L0 + "mlp.experts.7.up_proj.weight": np.zeros((32, 64), np.float32),
            L0 + "mlp.experts.7.down_proj.weight": np.zeros((64, 32), np.float32),
        },
        (L0 + "mlp.experts.7.down_proj.weight", L0 + "mlp.experts.gate_up_proj"),
        "layer 0",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_matrix_under_two_names_is_refused_naming_both(case: str, tmp_path: Path) -> None:
    make, copies, (first, second), what = CASES[case]
    ck = with_copies(make(tmp_path / "ck"), copies)
    out = tmp_path / "out"
    assert refused(["sculpt", ck, out], 1, unchanged=[ck], absent=out) == (
        f"error: {ck}: {first!r} and {second!r} both hold {what}'s expert weights; {WHY}"
    )
    assert refused(["sculpt", ck, out, "--dry-run"], 1, unchanged=[ck], absent=out).endswith(WHY)


def test_the_checkpoints_without_the_copies_sculpt(tmp_path: Path) -> None:
    """The same checkpoints without the second name are accepted (the refusal is the copy's)."""
    for make in (per_expert, fused):
        ck = make(tmp_path / make.__name__)
        proc = run("sculpt", ck, tmp_path / f"{make.__name__}_out", "--dry-run")
        assert proc.returncode == 0, proc.stderr
