"""Issue 23: whatever the writer accepts, the verifier accepts (a property, over random
header and arch values; hypothesis, a bounded number of examples).

Every ModelInfo/ArchInfo the writer takes gives a vault with no error finding (warnings are
allowed: they describe a usable vault), manifest included; every one it does not take is
refused as a SmoeError before anything is written, never with another exception.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from smoe.errors import SmoeError
from smoe.format.records import U32_MAX, ArchInfo, ModelInfo
from smoe.format.verify import verify_path
from smoe.vault.writer import VaultWriter
from smoe_gen import layout

from fixtures_data import OLMOE_ARCH
from helpers import refused

EXAMPLES = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,  # the same examples every run: a failure reproduces
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Each draw is a valid value set, then (half the time) one field replaced by anything:
# so about half the draws are accepted and every refusal has one cause.
uint32 = st.one_of(st.integers(0, 8), st.integers(0, U32_MAX))
anything = st.one_of(
    st.sampled_from([0, 1, 16, 17, 255, 256, 257, U32_MAX, U32_MAX + 1, -1]),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-46, 3.5e38, -3.5e38, 2**130, 10**400]),  # underflow / overflow as float32
    st.text(max_size=30),
    st.sampled_from(["a\0b", "q" * 25, "qwén", "", "x\x1b[0m", "x\x7f"]),
)
f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
names = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=24)
dims = st.sampled_from([64, 128])  # d_model and moe_ffn_dim of the expert, when it fits


def _mutated(draw: st.DrawFn, values: dict[str, Any]) -> dict[str, Any]:
    if draw(st.booleans()):
        values[draw(st.sampled_from(sorted(values)))] = draw(anything)
    return values


@st.composite
def models(draw: st.DrawFn) -> ModelInfo:
    values = {
        "num_moe_layers": draw(uint32),
        "max_experts_per_layer": draw(uint32),
        "d_model": draw(st.one_of(dims, st.integers(1, U32_MAX))),
        "vocab_size": draw(uint32),
        "ffn_dim": draw(uint32),
    }
    return ModelInfo(**_mutated(draw, values))


@st.composite
def archs(draw: st.DrawFn) -> ArchInfo:
    kv = draw(st.integers(1, 8))
    values = {
        "rope_theta": draw(st.one_of(st.sampled_from([1e4, 1e6]), f32)),
        "num_heads": kv * draw(st.integers(1, 4)),
        "num_kv_heads": kv,
        "head_dim": draw(st.integers(1, layout.MAX_HEAD_DIM)),
        "moe_top_k": draw(st.integers(1, layout.MAX_MOE_TOP_K)),
        "moe_ffn_dim": draw(st.one_of(dims, uint32)),
        "num_hidden_layers": draw(uint32),
        "rms_norm_eps": draw(st.one_of(st.sampled_from([1e-6, 1e-5]), f32)),
        "model_type": draw(names),
        "norm_topk_prob": draw(st.booleans()),
        "has_qk_norm": draw(st.booleans()),
        "has_dense_layer_0": draw(st.booleans()),
        "dense_ffn_dim": draw(uint32),
        "shared_expert_ffn_dim": draw(uint32),
        "activation": 0,
    }
    flags = ("norm_topk_prob", "has_qk_norm", "has_dense_layer_0")
    mutable = {k: v for k, v in values.items() if k not in flags}
    return ArchInfo(**{**values, **_mutated(draw, mutable)})


def _write(path: Path, model: ModelInfo, arch: ArchInfo | None, version: int) -> None:
    """One vault: one expert when the model can hold one of its shape, else none."""
    rows = arch.moe_ffn_dim if arch is not None else 64
    with VaultWriter(path, model, version=version, arch=arch) as w:
        fits = model.num_moe_layers >= 1 and model.max_experts_per_layer >= 1
        if fits and model.d_model in (64, 128) and rows in (64, 128):
            shapes = [(rows, model.d_model), (rows, model.d_model), (model.d_model, rows)]
            w.add_expert(0, 0, shapes)
            w.begin()
            rng = np.random.default_rng(0)
            w.write_expert(0, 0, [rng.standard_normal(s, np.float32) for s in shapes])
        else:
            w.begin()
        w.commit()


def _accepted_is_valid(tmp_path: Path, model: ModelInfo, arch: ArchInfo | None, version: int):
    folder = Path(os.path.join(tmp_path, f"case{len(os.listdir(tmp_path))}"))
    folder.mkdir()
    path = folder / "v.smoe"
    try:
        _write(path, model, arch, version)
    except SmoeError:
        assert os.listdir(folder) == [], "refused, yet it left files behind"
        return None
    report = verify_path(path, deep=True)
    assert report.errors == [], (asdict(model), arch and asdict(arch), report.errors)
    return report


@EXAMPLES
@given(model=models(), arch=archs())
def test_every_v2_vault_the_writer_accepts_verifies(
    tmp_path: Path, model: ModelInfo, arch: ArchInfo
) -> None:
    _accepted_is_valid(tmp_path, model, arch, 2)


@EXAMPLES
@given(model=models())
def test_every_v1_vault_the_writer_accepts_verifies(tmp_path: Path, model: ModelInfo) -> None:
    _accepted_is_valid(tmp_path, model, None, 1)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(arch=archs())
@example(arch=replace(OLMOE_ARCH, rope_theta=10**400))  # no float holds it
@example(arch=replace(OLMOE_ARCH, rms_norm_eps=-(10**400)))
@example(arch=replace(OLMOE_ARCH, rope_theta=1e10))  # above uint32, a fine float32
@example(arch=replace(OLMOE_ARCH, rope_theta=True))
def test_check_refuses_exactly_what_the_block_cannot_hold(arch: ArchInfo) -> None:
    """The arch rules the verifier applies, restated from the spec: check() passes iff
    they all hold (so the property above is not vacuous: many draws are accepted)."""
    holds = _spec_accepts(arch)
    try:
        arch.check()
    except SmoeError:
        assert not holds, asdict(arch)
        return
    assert holds, asdict(arch)


def _spec_accepts(a: ArchInfo) -> bool:
    ints: dict[str, Any] = {
        k: getattr(a, k)
        for k in (
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "moe_top_k",
            "moe_ffn_dim",
            "num_hidden_layers",
            "dense_ffn_dim",
            "shared_expert_ffn_dim",
            "activation",
        )
    }
    if not all(type(v) is int and 0 <= v <= U32_MAX for v in ints.values()):
        return False
    top = float(np.finfo(np.float32).max)
    for v in (a.rope_theta, a.rms_norm_eps):
        if type(v) not in (int, float) or abs(v) > 2**128:
            return False
        v = float(v)
        if not math.isfinite(v) or abs(v) > top or (v != 0 and float(np.float32(v)) == 0):
            return False
    name = a.model_type
    if not isinstance(name, str):
        return False
    return (
        a.activation == 0
        and 1 <= a.moe_top_k <= layout.MAX_MOE_TOP_K
        and 1 <= a.head_dim <= layout.MAX_HEAD_DIM
        and a.num_heads >= 1
        and a.num_kv_heads >= 1
        and a.num_heads % a.num_kv_heads == 0
        and 1 <= len(name) <= layout.MODEL_TYPE_SIZE
        and all(0x20 <= ord(c) <= 0x7E for c in name)
    )


def test_refused_model_type_writes_nothing(tmp_path: Path) -> None:
    model = ModelInfo(1, 1, 64, 128, 32)
    bad = replace(OLMOE_ARCH, model_type="a\0b")
    line = refused(lambda: VaultWriter(tmp_path / "v.smoe", model, arch=bad))
    assert line.startswith('arch.model_type: "a\\u0000b" has U+0000 at character 1')
    assert os.listdir(tmp_path) == []


def test_provenance_that_is_not_json_is_refused_at_once(tmp_path: Path) -> None:
    """The manifest's tool/source must be strict JSON: refused when the writer is made, not
    with a ValueError at commit, after every blob is written."""
    model = ModelInfo(1, 1, 64, 128, 32)
    for tool, why in (
        ({"x": float("nan")}, "Out of range float values are not JSON compliant: nan"),
        ({"x": {1, 2}}, "Object of type set is not JSON serializable"),
    ):
        line = refused(
            functools.partial(VaultWriter, tmp_path / "v.smoe", model, version=1, tool=tool)
        )
        assert line == f"manifest: the tool and source provenance is not strict JSON ({why})"
    assert os.listdir(tmp_path) == []
