"""VaultWriter: golden bytes, order independence, state machine, validation, atomicity."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from smoe.errors import SmoeError, WriterStateError
from smoe.format.records import ArchInfo, ModelInfo
from smoe.vault.writer import VaultWriter, write_vault
from smoe_gen.smoe_kaitai import Smoe

import golden as g

GOLDEN_MODEL = ModelInfo(
    num_moe_layers=4, max_experts_per_layer=8, d_model=8, vocab_size=1000, ffn_dim=16
)
GOLDEN_ARCH = ArchInfo(
    rope_theta=1_000_000.0,
    num_heads=4,
    num_kv_heads=2,
    head_dim=2,
    moe_top_k=8,
    moe_ffn_dim=8,
    num_hidden_layers=6,
    rms_norm_eps=1e-6,
    model_type="qwen3_moe",
    norm_topk_prob=True,
    has_qk_norm=True,
)
MODEL = ModelInfo(num_moe_layers=3, max_experts_per_layer=4, d_model=16, vocab_size=50, ffn_dim=8)
ARCH = replace(GOLDEN_ARCH, moe_ffn_dim=8)
SHAPES = [(8, 16), (8, 16), (16, 8)]


def exactly(error: type[Exception], message: str):
    """pytest.raises that wants this message word for word."""
    return pytest.raises(error, match="^" + re.escape(message) + "$")


def weights(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 0.02, s).astype(np.float32) for s in SHAPES]


def test_writer_output_equals_golden_bytes(tmp_path: Path) -> None:
    path = tmp_path / "golden.smoe"
    with VaultWriter(path, GOLDEN_MODEL, bits=4, version=2, arch=GOLDEN_ARCH) as w:
        w.add_expert(1, 2, [(8, 8)] * 3)
        w.begin()
        enc = []
        for t in range(3):
            raw = g.tensor_bytes(t)
            enc.append((np.frombuffer(raw[:32], np.uint8), np.frombuffer(raw[32:], "<f2")))
        w.write_encoded(1, 2, enc)
        w.commit()
    assert path.read_bytes() == bytes(g.vault())


def test_any_add_order_gives_identical_bytes(tmp_path: Path) -> None:
    experts = {(lay, e): weights(10 * lay + e) for lay in range(2) for e in range(3)}
    outputs = []
    for i, order in enumerate(
        [
            sorted(experts),
            sorted(experts, reverse=True),
            [(1, 0), (0, 2), (1, 2), (0, 0), (1, 1), (0, 1)],
        ]
    ):
        path = tmp_path / f"v{i}.smoe"
        with VaultWriter(path, MODEL, arch=ARCH) as w:
            for key in order:
                w.add_expert(*key, SHAPES)
            w.begin()
            for key in reversed(order):
                w.write_expert(*key, experts[key])
            w.commit()
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    s = Smoe.from_bytes(outputs[0])
    assert [(e.layer_id, e.expert_id) for e in s.experts] == sorted(experts)


def test_blobs_back_to_back_and_v1_layout(tmp_path: Path) -> None:
    experts = {(0, e): weights(e) for e in range(3)}
    plan2 = write_vault(tmp_path / "a.smoe", MODEL, experts, arch=ARCH)
    plan1 = write_vault(tmp_path / "b.smoe", MODEL, experts, version=1)
    for plan in (plan1, plan2):
        offsets = [e.byte_offset for e in plan.experts]
        assert offsets[0] == plan.data_offset
        assert all(b == a + e.padded_size for a, b, e in zip(offsets, offsets[1:], plan.experts))
    # descriptors end at 64 + 3 * 48 + 9 * 44 = 604; the arch block goes at round_up(604, 64)
    assert (plan2.descriptors_end, plan2.reserved_ext, plan2.data_offset) == (604, 640, 16384)
    assert (plan1.reserved_ext, plan1.data_offset) == (0, 16384)
    v1 = Smoe.from_bytes((tmp_path / "b.smoe").read_bytes())
    assert v1.header.version == 1 and v1.arch is None


def test_state_machine_refuses_out_of_order_calls(tmp_path: Path) -> None:
    w = VaultWriter(tmp_path / "s.smoe", MODEL, arch=ARCH)
    with exactly(WriterStateError, "write: the writer is declaring, it must be streaming"):
        w.write_expert(0, 0, weights(0))
    with exactly(WriterStateError, "commit: the writer is declaring, it must be streaming"):
        w.commit()
    w.add_expert(0, 0, SHAPES)
    w.add_expert(0, 1, SHAPES)
    w.begin()
    with exactly(WriterStateError, "add_expert: the writer is streaming, it must be declaring"):
        w.add_expert(0, 2, SHAPES)
    with exactly(WriterStateError, "begin: the writer is streaming, it must be declaring"):
        w.begin()
    w.write_expert(0, 1, weights(1))
    with exactly(SmoeError, "layer 0 expert 1: written twice"):
        w.write_expert(0, 1, weights(1))
    with exactly(SmoeError, "layer 0 expert 3: not declared with add_expert"):
        w.write_expert(0, 3, weights(1))
    with exactly(SmoeError, "commit: 1 declared experts were not written: layer 0 expert 0"):
        w.commit()
    w.write_expert(0, 0, weights(0))
    w.commit()
    with exactly(WriterStateError, "abort: the vault is already committed"):
        w.abort()
    with exactly(WriterStateError, "commit: the writer is committed, it must be streaming"):
        w.commit()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda w: w.add_expert(0, 0, SHAPES),
            "layer 0 expert 0: added twice (duplicate (layer_id, expert_id))",
        ),
        (
            lambda w: w.add_expert(0, 1, [(8, 16), (8, 16), (8, 16)]),
            "layer 0 expert 1: down_proj shape (8, 16) is not the transpose of gate_proj shape "
            "(8, 16)",
        ),
        (
            lambda w: w.add_expert(0, 1, [(8, 16), (4, 16), (16, 8)]),
            "layer 0 expert 1: up_proj shape (4, 16) differs from gate_proj shape (8, 16)",
        ),
        (
            lambda w: w.add_expert(0, 1, [(8, 12), (8, 12), (12, 8)]),
            "layer 0 expert 1: gate_proj has 12 columns, d_model is 16",
        ),
        (
            lambda w: w.add_expert(0, 1, [(4, 16), (4, 16), (16, 4)]),
            "layer 0 expert 1: gate_proj has 4 rows, arch.moe_ffn_dim is 8",
        ),
        (
            lambda w: w.add_expert(0, 1, [(8, 16, 1), (8, 16), (16, 8)]),
            "layer 0 expert 1: gate_proj shape (8, 16, 1) is not 2-D with positive uint32 "
            "dimensions",
        ),
        (
            lambda w: w.add_expert(0, 4, SHAPES),
            "layer 0 expert 4: expert_id must be below max_experts_per_layer 4",
        ),
        (lambda w: w.add_expert(-1, 0, SHAPES), "layer -1 expert 0: layer_id -1 is not a uint32"),
        (
            lambda w: [w.add_expert(lay, 0, SHAPES) for lay in (1, 2, 3)],
            "layer 3 expert 0: more MoE layers than num_moe_layers 3",
        ),
    ],
)
def test_input_validation_names_expert_and_field(tmp_path: Path, call, message) -> None:
    w = VaultWriter(tmp_path / "v.smoe", MODEL, arch=ARCH)
    w.add_expert(0, 0, SHAPES)
    with pytest.raises(SmoeError) as info:
        call(w)
    assert str(info.value) == message


def test_shapes_consistent_within_a_layer(tmp_path: Path) -> None:
    model = replace(MODEL, d_model=16)
    w = VaultWriter(tmp_path / "v.smoe", model, version=1)
    w.add_expert(0, 0, SHAPES)
    w.add_expert(1, 0, [(4, 16), (4, 16), (16, 4)])  # another layer may differ
    with pytest.raises(SmoeError) as info:
        w.add_expert(0, 1, [(4, 16), (4, 16), (16, 4)])
    assert str(info.value) == (
        "layer 0 expert 1: shapes [(4, 16), (4, 16), (16, 4)] differ "
        "from the other experts of layer 0 [(8, 16), (8, 16), (16, 8)]"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"moe_top_k": 0}, "arch.moe_top_k: 0 is outside 1..16"),
        ({"moe_top_k": 17}, "arch.moe_top_k: 17 is outside 1..16"),
        ({"head_dim": 300}, "arch.head_dim: 300 is outside 1..256"),
        ({"num_kv_heads": 3}, "arch.num_heads: 4 is not divisible by num_kv_heads 3"),
        ({"num_kv_heads": 0}, "arch.num_kv_heads: must be at least 1, got 0"),
        ({"num_heads": 0}, "arch.num_heads: must be at least 1, got 0"),
        (
            {"activation": 1},
            "arch.activation: 1 is not 0 (SiLU), the only activation the kernels implement",
        ),
        ({"rope_theta": float("inf")}, "arch.rope_theta: inf is not a finite float32"),
    ],
)
def test_arch_limits_of_d6(tmp_path: Path, change: dict, message: str) -> None:
    with pytest.raises(SmoeError) as info:
        VaultWriter(tmp_path / "v.smoe", MODEL, arch=replace(ARCH, **change))
    assert str(info.value) == message


def test_other_refusals(tmp_path: Path) -> None:
    p = tmp_path / "v.smoe"
    for kwargs, message in [
        ({"bits": 3, "arch": ARCH}, "bits: 3 is not one of [2, 4]"),
        ({"version": 3, "arch": ARCH}, "version: 3 is outside 1..2"),
        ({"version": 2}, "version 2 needs an arch block (arch=ArchInfo(...))"),
    ]:
        with pytest.raises(SmoeError) as info:
            VaultWriter(p, MODEL, **kwargs)
        assert str(info.value) == message
    with pytest.raises(SmoeError) as info:
        VaultWriter(p, replace(MODEL, d_model=0), arch=ARCH)
    assert str(info.value) == "header.d_model: must be at least 1, got 0"


def test_model_type_refused_never_cut() -> None:
    # issue 23: a name the field cannot hold as it is is refused (tests/format/
    # test_records_validation.py has every case); 24 characters fill it without a NUL
    assert replace(ARCH, model_type="y" * 24).model_type_bytes() == b"y" * 24
    for name in ("x" * 22 + "é" + "ü", "y" * 30, "x" * 23 + "é"):
        with pytest.raises(SmoeError, match=r"^arch\.model_type: "):
            replace(ARCH, model_type=name).model_type_bytes()


def test_exception_midway_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "v.smoe"
    with pytest.raises(RuntimeError, match="boom"), VaultWriter(path, MODEL, arch=ARCH) as w:
        w.add_expert(0, 0, SHAPES)
        w.add_expert(0, 1, SHAPES)
        w.begin()
        w.write_expert(0, 0, weights(0))
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_existing_file_survives_a_failed_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "v.smoe"
    write_vault(path, MODEL, {(0, 0): weights(0)}, arch=ARCH)
    before = path.read_bytes()
    with pytest.raises(SmoeError), VaultWriter(path, MODEL, arch=ARCH) as w:
        w.add_expert(0, 0, SHAPES)
        w.begin()
        w.commit()  # expert never written
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.smoe", "v.smoe.manifest.json"]


def test_sigkill_midway_leaves_no_final_file(tmp_path: Path) -> None:
    path = tmp_path / "v.smoe"
    script = textwrap.dedent(f"""
        import os, sys, numpy as np
        from smoe.vault.writer import VaultWriter
        from smoe.format.records import ModelInfo
        m = ModelInfo(1, 64, 16, 50, 8)
        w = VaultWriter({str(path)!r}, m, version=1)
        for e in range(64):
            w.add_expert(0, e, [(8, 16), (8, 16), (16, 8)])
        w.begin()
        for e in range(64):
            w.write_expert(0, e, [np.ones((8, 16), np.float32), np.ones((8, 16), np.float32),
                                  np.ones((16, 8), np.float32)])
            if e == 20:
                print("midway", flush=True)
                sys.stdin.readline()
        w.commit()
    """)
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:  # closes its pipes: no descriptor left for a later test to trip on
        assert proc.stdout.readline() == "midway\n"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not path.exists()
    leftovers = list(tmp_path.iterdir())
    assert all(p.name.startswith(".v.smoe.") and p.name.endswith(".tmp") for p in leftovers)


def test_file_mode_follows_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_vault(tmp_path / "v.smoe", MODEL, {(0, 0): weights(0)}, arch=ARCH)
    finally:
        os.umask(old)
    assert (tmp_path / "v.smoe").stat().st_mode & 0o777 == 0o640


def test_round_trip_through_kaitai(tmp_path: Path) -> None:
    from smoe import quant

    experts = {k: weights(i) for i, k in enumerate(itertools.product(range(2), range(2)))}
    for bits in (2, 4):
        path = tmp_path / f"q{bits}.smoe"
        write_vault(path, MODEL, experts, bits=bits, arch=ARCH)
        s = Smoe.from_bytes(Path(path).read_bytes())
        for e in s.experts:
            for d, w in zip(e.tensors, experts[(e.layer_id, e.expert_id)]):
                got = quant.decode(
                    np.frombuffer(d.packed, np.uint8),
                    np.frombuffer(d.scales, "<f2"),
                    bits,
                    (d.num_rows, d.num_cols),
                )
                want_p, want_s = quant.encode(w, bits)
                assert np.array_equal(got, quant.decode(want_p, want_s, bits, w.shape))


def test_an_arch_of_fewer_layers_than_moe_layers_is_refused(tmp_path: Path) -> None:
    """Rule arch.num_hidden_layers: no vault is written that the verifier would reject."""
    with exactly(
        SmoeError,
        "arch.num_hidden_layers: 2 is less than num_moe_layers 3 (the arch block counts every "
        "layer; it has no field for multi-token-prediction layers)",
    ):
        VaultWriter(tmp_path / "v.smoe", MODEL, arch=replace(ARCH, num_hidden_layers=2))
    assert not (tmp_path / "v.smoe").exists()
