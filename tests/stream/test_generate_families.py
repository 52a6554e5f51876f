"""The families `smoe-stream generate` runs are the registry's `generate` column, and each
reads from its config copy only keys its registry entry names (the C++ rules, printed by the
hidden `decoder-families` command, against smoe/families/registry.py)."""

from __future__ import annotations

import json
from pathlib import Path

from smoe.cli.families import families
from smoe.families.registry import FAMILIES, ROUTED_SCALING, SIGMOID_BIAS

from helpers import SMOE_STREAM, run

IMPLEMENTED_SEMANTICS = {SIGMOID_BIAS, ROUTED_SCALING}


def decoder_rules() -> list[dict]:
    proc = run("decoder-families", command=[SMOE_STREAM])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_registry_column_is_the_decoders_list(smoe_stream: Path) -> None:
    ran = {r["model_type"] for r in decoder_rules()}
    assert ran == {f.model_type for f in families() if f.generate}
    assert {"qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "granitemoe", "glm4_moe"} <= ran
    assert "minimax_m2" in ran


def test_each_family_reads_only_the_keys_its_entry_names(smoe_stream: Path) -> None:
    for rule in decoder_rules():
        family = FAMILIES[rule["model_type"]]
        named = set(family.beyond) | {f"rope_parameters.{k}" for k in family.beyond}
        named |= {k.removeprefix("rope_parameters.") for k in family.beyond}
        assert set(rule["keys"]) <= named, (family.model_type, rule["keys"])


def test_the_code_fixed_semantics_are_implemented(smoe_stream: Path) -> None:
    """A sigmoid router where the registry says so, and nothing the decoder lacks."""
    for rule in decoder_rules():
        family = FAMILIES[rule["model_type"]]
        assert (rule["scoring"] == "sigmoid") == (SIGMOID_BIAS in family.semantics)
        assert set(family.semantics) <= IMPLEMENTED_SEMANTICS, family.model_type
