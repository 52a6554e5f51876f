"""The compiled decoder (smoe.quant.kernels.decode) gives the numpy reference's bits.

Every comparison decodes the same codes twice, ``kernel="fast"`` against ``kernel="numpy"``,
to float32 (:func:`quant.decode`) and to bfloat16 bits (:func:`quant.decode_bf16`), and
compares bit patterns (so -0 and every NaN payload count; bfloat16 NaN is 0x7FC0): the
tensors of every committed fixture vault, random codes with partial last groups, every
one of the 65536 fp16 scale patterns with every code, and whole HF exports.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from smoe import quant
from smoe.errors import SmoeError
from smoe.quant import dispatch
from smoe.vault.reader import Vault
from smoe_gen.layout import GROUP_SIZE, SUPPORTED_BITS

from fixtures_data import FIXTURES, GOOD
from helpers import plain_env, python

pytest.importorskip("numba", reason="the compiled decoder is optional: pip install 'smoe[fast]'")

from smoe.quant.kernels import decode as decode_kernels  # (needs numba)


def assert_same(packed: np.ndarray, scales: np.ndarray, bits: int, shape: tuple) -> None:
    """Compiled and numpy decodes agree bit for bit, to float32 and to bfloat16."""
    fast = quant.decode(packed, scales, bits, shape, kernel="fast")
    with np.errstate(invalid="ignore"):  # numpy flags signalling NaN scales
        ref = quant.decode(packed, scales, bits, shape, kernel="numpy")
        ref16 = quant.decode_bf16(packed, scales, bits, shape, kernel="numpy")
    assert fast.shape == ref.shape == tuple(shape) and fast.dtype == np.float32
    np.testing.assert_array_equal(fast.view(np.uint32), ref.view(np.uint32))
    fast16 = quant.decode_bf16(packed, scales, bits, shape, kernel="fast")
    assert fast16.shape == ref16.shape == tuple(shape) and fast16.dtype == np.uint16
    np.testing.assert_array_equal(fast16, ref16)


def random_codes(n: int, bits: int, seed: int, scale_bits: np.ndarray | None = None) -> tuple:
    """Random packed bytes for ``n`` weights and fp16 scales (``scale_bits`` if given, else
    random patterns: any value, NaN and inf included)."""
    rng = np.random.default_rng(seed)
    packed = rng.integers(0, 256, quant.packed_size(n, bits), dtype=np.uint8)
    if scale_bits is None:
        scale_bits = rng.integers(0, 1 << 16, quant.num_groups(n), dtype=np.uint16)
    return packed, scale_bits.view("<f2")


# ---------------------------------------------------------------------------- the switch


def test_kernels_are_used_here() -> None:
    assert dispatch.decode_kernels(1, "fast") is decode_kernels
    assert dispatch.decode_kernels(1 << 30, "numpy") is None
    assert dispatch.decode_kernels(quant.FAST_MIN_WEIGHTS - 1, "auto") is None
    assert dispatch.decode_kernels(quant.FAST_MIN_WEIGHTS, "auto") is decode_kernels


def test_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` keeps tiny tensors on numpy, ``fast`` and large tensors go compiled, and
    ``$SMOE_KERNEL`` is the default."""
    calls: list[int] = []
    spy = ModuleType("spy")
    spy.__dict__["decode_into"] = lambda p, s, bits, out: calls.append(out.size)
    monkeypatch.setitem(dispatch._FAST, "decode", spy)
    for n in (GROUP_SIZE * 2, quant.FAST_MIN_WEIGHTS):
        packed, scales = random_codes(n, 4, n, np.ones(n // GROUP_SIZE, np.float16).view(np.uint16))
        quant.decode(packed, scales, 4, (n,))
        quant.decode_bf16(packed, scales, 4, (n,), kernel="auto")
        quant.decode(packed, scales, 4, (n,), kernel="fast")
    assert calls == [GROUP_SIZE * 2] + [quant.FAST_MIN_WEIGHTS] * 3  # tiny "auto": numpy
    monkeypatch.setenv(quant.KERNEL_ENV, "numpy")
    quant.decode_bf16(packed, scales, 4, (n,))
    assert len(calls) == 4
    monkeypatch.setenv(quant.KERNEL_ENV, "turbo")
    with pytest.raises(SmoeError, match="SMOE_KERNEL must be auto, numpy or fast"):
        quant.decode(packed, scales, 4, (n,))


def test_without_numba_auto_falls_back_and_fast_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(dispatch._FAST, "decode", None)  # as if importing the kernels failed
    n = quant.FAST_MIN_WEIGHTS
    packed, scales = random_codes(n, 4, 0, np.arange(n // GROUP_SIZE, dtype=np.uint16))
    ref = quant.decode(packed, scales, 4, (n,), kernel="numpy")
    np.testing.assert_array_equal(quant.decode(packed, scales, 4, (n,)), ref)
    for decode in (quant.decode, quant.decode_bf16):
        with pytest.raises(SmoeError, match=r"^SMOE_KERNEL=fast needs numba: pip install"):
            decode(packed, scales, 4, (n,), kernel="fast")


def test_checks_come_before_the_kernel() -> None:
    packed, scales = random_codes(130, 4, 0)
    with pytest.raises(ValueError, match="packed must be 65 uint8 bytes for shape"):
        quant.decode_bf16(packed[:-1], scales, 4, (130,), kernel="fast")
    with pytest.raises(ValueError, match="scales must be 3 float16 values"):
        quant.decode(packed, scales[:2], 4, (130,), kernel="fast")
    with pytest.raises(ValueError, match="out must be a C-contiguous uint16 array of shape"):
        quant.decode_bf16(packed, scales, 4, (130,), out=np.empty(130, np.float32))
    with pytest.raises(ValueError, match="out must be a C-contiguous float32 array of shape"):
        quant.decode(packed, scales, 4, (2, 65), out=np.empty((65, 2), np.float32).T)


# ---------------------------------------------------------------------------- fp16 scales


def test_scales_widen_as_numpy_widens_them() -> None:
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    np.testing.assert_array_equal(
        decode_kernels.widen_f16(every).view(np.uint32),
        every.view(np.float16).astype(np.float32).view(np.uint32),
    )


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_every_scale_pattern_with_every_code(bits: int) -> None:
    """One group per fp16 pattern (zeros, subnormals, the largest, inf, every NaN), whose
    bytes run through all 256 values every few groups."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    n = every.size * GROUP_SIZE
    packed = np.resize(np.arange(256, dtype=np.uint8), quant.packed_size(n, bits))
    assert_same(packed, every.view("<f2"), bits, (every.size, GROUP_SIZE))


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_special_scales(bits: int) -> None:
    """Scales 0, -0, subnormal, 65504, inf, NaN with a payload, and a NaN whose rounding
    to bfloat16 would carry into the sign and wrap around to zero (0xFFFF: float32
    0xFFFFE000): every NaN becomes torch's quiet NaN 0x7FC0."""
    specials = np.array(
        [0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7C01, 0x7E00, 0xFFFF],
        np.uint16,
    )
    n = specials.size * GROUP_SIZE - 5  # and a partial last group
    packed, scales = random_codes(n, bits, bits, specials)
    assert_same(packed, scales, bits, (n,))
    bf = quant.decode_bf16(packed, scales, bits, (n,), kernel="fast")
    assert (bf[-(GROUP_SIZE - 5) :] == 0x7FC0).all()  # no level is 0: NaN * level is NaN


# ---------------------------------------------------------------------------- tensors


@pytest.mark.parametrize("name", GOOD)
def test_fixture_vaults(name: str) -> None:
    with Vault.open(FIXTURES / name) as v:
        for _, expert in v.items():
            for t in expert.tensors:
                assert_same(t.packed, t.scales, t.bits, t.shape)
                assert_same(t.packed, t.scales.view(np.uint8), t.bits, t.shape)  # raw bytes


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_partial_last_groups(bits: int) -> None:
    for tail in range(GROUP_SIZE):
        n = 3 * GROUP_SIZE + tail
        assert_same(*random_codes(n, bits, tail), bits, (n,))
    for shape in [(1,), (0,), (7, 9), (3, 5, 7), (17, 129), (256, 257)]:
        n = int(np.prod(shape))
        assert_same(*random_codes(n, bits, n), bits, shape)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_encoded_weights_and_odd_inputs(bits: int) -> None:
    """Real encodes; big-endian fp16 scales; unaligned scale bytes; read-only inputs."""
    rng = np.random.default_rng(bits)
    w = (rng.standard_t(5, (96, 130)) * 0.02).astype(np.float32)
    w[3, :70] = 0.0
    w[5, :] *= 1e-6  # subnormal fp16 scales
    packed, scales = quant.encode(w, bits, kernel="numpy")
    assert_same(packed, scales, bits, w.shape)
    assert_same(packed, scales.astype(">f2"), bits, w.shape)
    raw = np.zeros(scales.nbytes + 1, np.uint8)
    raw[1:] = scales.view(np.uint8)
    assert_same(packed, raw[1:].view("<f2"), bits, w.shape)
    packed.flags.writeable = scales.flags.writeable = False
    assert_same(packed, scales, bits, w.shape)


def test_decode_into_out_buffers() -> None:
    packed, scales = random_codes(1000, 4, 1)
    out = np.full((10, 100), 7, np.uint16)
    assert quant.decode_bf16(packed, scales, 4, (10, 100), out=out, kernel="fast") is out
    np.testing.assert_array_equal(out, quant.decode_bf16(packed, scales, 4, (10, 100)))
    out32 = np.full((10, 100), 7, np.float32)
    assert quant.decode(packed, scales, 4, (10, 100), out=out32, kernel="fast") is out32
    np.testing.assert_array_equal(out32, quant.decode(packed, scales, 4, (10, 100)))


# ---------------------------------------------------------------------------- export


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_export_bytes_do_not_depend_on_the_kernel(
    dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.numpy import save_file

    from smoe.export.hf.checkpoint import export_hf

    scout = tmp_path / "scout.st"
    save_file(  # what the vault's header and table say a scout of its model holds
        {
            "model.embed_tokens.weight": np.zeros((320, 64), np.float32),
            **{f"model.layers.{n}.mlp.gate.weight": np.zeros((4, 64), np.float32) for n in (0, 1)},
        },
        str(scout),
    )
    for name in ("q4_v2.smoe", "q2_v2.smoe"):
        files = []
        for kernel in ("numpy", "fast"):
            monkeypatch.setenv(quant.KERNEL_ENV, kernel)
            out = tmp_path / f"{name}-{dtype}-{kernel}"
            export_hf(FIXTURES / name, out, scout=scout, dtype=dtype, threads=2)
            files.append((out / "model.safetensors").read_bytes())
        assert files[0] == files[1]


def test_first_compile_prints_nothing(tmp_path: Path) -> None:
    """On an empty numba cache (a user's first export) compiling every variant of the
    decoder (float32 and bfloat16 out, read-only and writable codes) writes nothing to
    stderr: no numba warning reaches the user."""

    code = (
        "import sys, numpy as np\n"
        "from smoe import quant\n"
        "from smoe.vault.reader import Vault\n"
        "t = Vault.open(sys.argv[1]).expert(0, 0).tensors[0]\n"
        "for packed in (t.packed, np.array(t.packed)):\n"
        "    for fn in (quant.decode, quant.decode_bf16):\n"
        "        fn(packed, t.scales, t.bits, t.shape, kernel='fast')\n"
    )
    env = plain_env(NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    for bits in ("q4", "q2"):
        proc = python(code, FIXTURES / f"{bits}_v2.smoe", env=env)
        assert (proc.returncode, proc.stderr) == (0, "")
    assert any((tmp_path / "numba").rglob("*.nbi"))  # it did compile into the empty cache
