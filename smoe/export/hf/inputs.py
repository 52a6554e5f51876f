"""The vault an HF export reads: refused when partial; the scout's dtype."""

from __future__ import annotations

from typing import Any

from smoe.errors import RefusedInput
from smoe.interop.safetensors_io import (
    FLOAT_DTYPES,
    TensorInfo,
)
from smoe.vault.reader import Vault

__all__ = ["refuse_partial", "scout_dtype"]


def _ids(ids: list[int]) -> str:
    """``0..3, 7``: sorted ids as runs."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def refuse_partial(vault: Vault, doc: dict[str, Any] | None) -> None:
    """Every MoE layer the header counts, each with all its experts, or refused naming
    what is missing.

    >>> from smoe.vault.reader import Vault
    >>> refuse_partial(Vault.open("fixtures/q4_v2.smoe"), None)
    >>> refuse_partial(Vault.open("fixtures/partial_vault.smoe"), None)
    Traceback (most recent call last):
    smoe.errors.RefusedInput: fixtures/partial_vault.smoe: a partial vault: it holds 2 of ...
    """
    want_layers = int(vault.header["num_moe_layers"])
    want = int(vault.header["max_experts_per_layer"])
    layer_ids, expert_ids = vault.table["layer_id"], vault.table["expert_id"]
    held = vault.layers()
    problems = []
    if len(held) < want_layers:
        problems.append(
            f"it holds {len(held)} of the model's {want_layers} MoE layers "
            f"(layers {_ids(list(held))}; {want_layers - len(held)} missing)"
        )
    short = []
    for lay in sorted(held):
        have = {int(e) for e in expert_ids[layer_ids == lay]}
        missing = sorted(set(range(want)) - have)
        if missing:
            short.append(f"layer {lay} lacks experts {_ids(missing)} of 0..{want - 1}")
    if short:
        more = f" and {len(short) - 3} more layers" if len(short) > 3 else ""
        problems.append("; ".join(short[:3]) + more)
    if not problems:
        return
    opts = ((doc or {}).get("tool") or {}).get("options") or {}
    how = " ".join(
        f"--{k.replace('_', '-')} {opts[k]}"
        for k in ("max_layers", "max_experts")
        if isinstance(opts.get(k), int)
    )
    made = f" (sculpted with {how})" if how else ""
    raise RefusedInput(
        f"{vault.path}: a partial vault{made}: {'; '.join(problems)}; a "
        "checkpoint needs every expert: sculpt the model again without "
        "--max-layers/--max-experts"
    )


def scout_dtype(scout: dict[str, TensorInfo]) -> str | None:
    """The float dtype holding most of the scout's bytes (None if it has no float tensor).

    >>> from smoe.interop.safetensors_io import read_header
    >>> scout_dtype(read_header("fixtures/checkpoints/qwen3_moe/model.safetensors"))
    'BF16'
    """
    by: dict[str, int] = {}
    for t in scout.values():
        if t.dtype in FLOAT_DTYPES:
            by[t.dtype] = by.get(t.dtype, 0) + t.nbytes
    return max(by, key=lambda d: (by[d], d)) if by else None
