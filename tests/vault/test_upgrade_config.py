"""``upgrade --config`` refuses a config the vault contradicts (issue 23, case 5).

The arch block an upgrade writes comes from a config.json; every field of it that the
vault's header, table or descriptors can contradict is checked before anything is written,
and a contradiction is refused naming both values (the vault proves it: a warning would
leave a vault whose export transformers refuses): top-k above the experts per layer, the
expert count, ``num_hidden_layers`` not above the table's highest MoE layer (plus
``num_nextn_predict_layers``), the hidden size against ``d_model``, the vocabulary against
the header's, the experts' width against their descriptors. In place, with ``--out`` and
with ``--force`` alike: the vault stays byte for byte as it was, nothing new appears.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from smoe.vault.reader import Vault
from smoe.vault.upgrade import upgrade

from fixtures_data import FIXTURES
from fixtures_data import OLMOE_ARCH as ARCH
from fixtures_data import OLMOE_CONFIG as CONFIG
from helpers import refused, run

ANOTHER = "the config describes another model"

CASES = [  # the three of the issue first
    ({"num_experts_per_tok": 16}, "num_experts_per_tok is 16, but {v} has 4 experts per layer"),
    ({"num_hidden_layers": 1}, "num_hidden_layers is 1, but {v} holds experts of layer 1"),
    ({"hidden_size": 128}, "hidden_size is 128, but {v} has d_model 64"),
    ({"vocab_size": 100}, "vocab_size is 100, but {v} has vocab_size 320"),
    ({"num_experts": 8}, "num_experts is 8, but {v} has 4 experts per layer"),
    (
        {"moe_intermediate_size": 48},
        "moe_intermediate_size is 48, but {v} has moe_ffn_dim 32 (its experts' gate rows)",
    ),
    (  # olmoe's experts' width is intermediate_size (the registry's spelling wins)
        {"intermediate_size": 64},
        "intermediate_size is 64, but {v} has moe_ffn_dim 32 (its experts' gate rows)",
    ),
]
IDS = [next(iter(c)) for c, _ in CASES]


def vault_in(tmp_path: Path, name: str = "q4_v1.smoe") -> Path:
    folder = tmp_path / "v"
    folder.mkdir()
    shutil.copy(FIXTURES / name, folder)
    shutil.copy(FIXTURES / f"{name}.manifest.json", folder)
    return folder / name


def config(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, **changes}))
    return path


@pytest.mark.parametrize(("changes", "fact"), CASES, ids=IDS)
def test_a_contradicting_config_is_refused_in_place(
    changes: dict, fact: str, tmp_path: Path
) -> None:
    vault, cfg = vault_in(tmp_path), config(tmp_path, **changes)
    want = f"error: {cfg}: {fact.format(v=vault)}: {ANOTHER}"
    assert refused(["upgrade", vault, "--config", cfg], 1, unchanged=[vault.parent, cfg]) == want
    assert Vault.open(vault).geometry.version == 1


@pytest.mark.parametrize(("changes", "fact"), CASES, ids=IDS)
def test_a_contradicting_config_is_refused_with_out(
    changes: dict, fact: str, tmp_path: Path
) -> None:
    vault, cfg = vault_in(tmp_path), config(tmp_path, **changes)
    out = tmp_path / "new.smoe"
    argv = ["upgrade", vault, "--config", cfg, "--out", out]
    line = refused(argv, 1, unchanged=[vault.parent, cfg], absent=out)
    assert line == f"error: {cfg}: {fact.format(v=vault)}: {ANOTHER}"
    assert sorted(tmp_path.iterdir()) == sorted([vault.parent, cfg])  # no lock, no temp file


@pytest.mark.parametrize(("changes", "fact"), CASES[:3], ids=IDS[:3])
def test_force_re_stamps_only_what_the_vault_allows(
    changes: dict, fact: str, tmp_path: Path
) -> None:
    """A v2 vault's block is being replaced, so it is not what the config is compared
    with; its header and table still are."""
    vault, cfg = vault_in(tmp_path, "q4_v2.smoe"), config(tmp_path, **changes)
    argv = ["upgrade", vault, "--force", "--config", cfg]
    line = refused(argv, 1, unchanged=[vault.parent, cfg])
    assert line == f"error: {cfg}: {fact.format(v=vault)}: {ANOTHER}"


def test_a_config_the_vault_agrees_with_is_accepted(tmp_path: Path) -> None:
    """The fixture's own config is accepted."""
    vault, cfg = vault_in(tmp_path), config(tmp_path)
    proc = run("upgrade", vault, "--config", cfg, "--out", tmp_path / "same.smoe")
    assert proc.returncode == 0, proc.stderr
    assert int(Vault.open(tmp_path / "same.smoe").arch["num_hidden_layers"]) == 2


def test_more_moe_layers_than_num_hidden_layers_is_refused(tmp_path: Path) -> None:
    """A DeepSeek-V3-style config whose multi-token-prediction layer holds the table's last
    MoE layer (num_hidden_layers 1 + num_nextn_predict_layers 1 for MoE layers 0 and 1):
    the arch block has no field for MTP layers, and a num_hidden_layers below the header's
    num_moe_layers breaks rule arch.num_hidden_layers; refused, nothing written."""
    vault = vault_in(tmp_path)
    mtp = config(tmp_path, num_hidden_layers=1, num_nextn_predict_layers=1)
    assert refused(["upgrade", vault, "--config", mtp], 1, unchanged=[vault.parent, mtp]) == (
        f"error: {vault}: arch.num_hidden_layers 1 is less than the vault's num_moe_layers 2 "
        "(the arch block has no field for multi-token-prediction layers)"
    )


def test_the_api_refuses_an_arch_the_vault_contradicts(tmp_path: Path) -> None:
    """Without a config (``upgrade(vault, arch)``, or ``--model``): the arch block itself."""
    vault = vault_in(tmp_path)
    out = tmp_path / "new.smoe"
    for arch, want in (
        (
            replace(ARCH, moe_top_k=16),
            f"{vault}: arch.moe_top_k 16 is more than the vault's 4 experts per layer",
        ),
        (
            replace(ARCH, num_hidden_layers=1),
            f"{vault}: arch.num_hidden_layers 1 disagrees with the vault's table, which holds "
            "experts of layer 1",
        ),
        (
            replace(ARCH, moe_ffn_dim=48),
            f"{vault}: arch.moe_ffn_dim 48 disagrees with the vault's expert shapes (32 rows)",
        ),
    ):
        assert refused(lambda a=arch: upgrade(vault, a), unchanged=[vault.parent]) == want
        line = refused(lambda a=arch: upgrade(vault, a, out=out), unchanged=[vault.parent])
        assert line == want and not out.exists()
