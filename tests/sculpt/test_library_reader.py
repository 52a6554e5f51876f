"""LibraryReader (the safetensors library) against ExpertReader (our preads): the same bytes
and CRC-32C on every fixture and synthetic checkpoint, the same strict validation, one-line
errors, FP8 refused, and what a shard that shrinks does to each (SIGBUS with the library)."""

from __future__ import annotations

import json
import signal
import struct
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from smoe.errors import SmoeError
from smoe.interop.safetensors_io import TensorInfo, read_header
from smoe.sculpt.expert_reader import ExpertReader
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef
from smoe_testkit.library_reader import LibraryReader
from smoe_testkit.synth import write_checkpoint

from fixtures_data import CKPTS, CONVERT, ROOT
from helpers import plain_env, python


def same_as_ours(ck: Checkpoint, chunk: int = 1 << 20, mapped: int = 4 << 20) -> int:
    """Every expert read by both readers: identical arrays, dtypes, src dtypes and CRCs."""
    with ExpertReader() as ours, LibraryReader() as lib:
        lib.CHUNK, lib.MAP = chunk, mapped
        for key, ref in ck.experts.items():
            want, want_crcs = ours.read(ref)
            got, got_crcs = lib.read(ref, slot=1)
            for (a, src_a), (b, src_b) in zip(want, got):
                assert (a.dtype, a.shape, src_a) == (b.dtype, b.shape, src_b), key
                assert a.tobytes() == b.tobytes(), key
            assert got_crcs == want_crcs == lib.crcs(ref) == ours.crcs(ref), key
    return len(ck.experts)


@pytest.mark.parametrize("name", CONVERT)
def test_fixture_checkpoints_read_byte_identical(name: str) -> None:
    ck = Checkpoint.open(CKPTS / name)
    assert same_as_ours(ck) == len(ck.experts) > 0
    assert same_as_ours(ck, chunk=100, mapped=300) == len(ck.experts)  # runs of rows, reopened


@pytest.mark.parametrize(
    "kw",
    [
        {"fused": True, "dtype": "BF16"},
        {"fused": True, "dtype": "F32", "shards": 2},
        {"model_type": "mixtral", "dtype": "F16"},
        {"shards": 3},
    ],
    ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()),
)
def test_synthetic_checkpoints_read_byte_identical(tmp_path: Path, kw: dict) -> None:
    root = write_checkpoint(tmp_path / "ck", layers=2, experts=4, d_model=64, ffn=48, **kw)
    ck = Checkpoint.open(root)
    same_as_ours(ck)
    same_as_ours(ck, chunk=64 * 4, mapped=1)  # one row per call for F32, reopened each time


def test_drop_in_for_the_sculptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sculptor run on LibraryReader writes the same files as on ExpertReader."""
    from smoe.sculpt import SculptOptions, sculpt
    from smoe.sculpt import workers as workers_module

    model = tmp_path / "m"
    write_checkpoint(model, layers=1, experts=4, d_model=64, ffn=32, seed=5)
    ours = sculpt(model, tmp_path / "ours", SculptOptions(jobs=1))
    monkeypatch.setattr(workers_module, "ExpertReader", LibraryReader)
    lib = sculpt(model, tmp_path / "lib", SculptOptions(jobs=1))
    for a, b in ((ours.vault, lib.vault), (ours.scout, lib.scout)):
        assert a.read_bytes() == b.read_bytes()


def test_arrays_are_views_of_the_slot_buffer() -> None:
    ck = Checkpoint.open(CKPTS / "qwen3_moe")
    with LibraryReader(slots=2) as lib:
        (a, _), *_ = lib.read(ck.experts[(0, 0)], slot=0)[0]
        first = a.copy()
        lib.read(ck.experts[(0, 1)], slot=1)
        assert np.array_equal(a, first)  # another slot leaves it alone
        lib.read(ck.experts[(0, 1)], slot=0)
        assert not np.array_equal(a, first)  # the same slot reuses it


# ---- errors: one line naming shard and tensor ---------------------------------------------
def test_library_error_is_one_line_naming_shard_and_tensor() -> None:
    ck = Checkpoint.open(CKPTS / "qwen3_moe_fused")
    gu = ck.tensors["model.layers.0.mlp.experts.gate_up_proj"]
    down = ck.tensors["model.layers.0.mlp.experts.down_proj"]
    beyond = gu.shape[0]  # an expert index the tensor does not have
    ref = ExpertRef(
        0, beyond, ((gu, beyond, slice(0, 48)), (gu, beyond, slice(48, 96)), (down, 0, None))
    )
    with LibraryReader() as lib, pytest.raises(SmoeError) as info:
        lib.read(ref)
    assert str(info.value).startswith(
        f"{gu.path}: tensor 'model.layers.0.mlp.experts.gate_up_proj': the safetensors "
        "library failed: Error during slicing"
    )
    assert "\n" not in str(info.value)


def test_shard_changed_since_validation_is_refused(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "ck", layers=1, experts=2, d_model=64, ffn=32)
    ck = Checkpoint.open(root)
    shard = next(root.glob("*.safetensors"))
    with LibraryReader() as lib:
        lib.read(ck.experts[(0, 0)])
        with shard.open("ab") as f:
            f.write(b"\0" * 8)
        with pytest.raises(SmoeError, match=r": changed since it was validated \(size \d+ -> "):
            lib.read(ck.experts[(0, 1)])


def test_tensor_not_as_indexed_is_refused(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "ck", layers=1, experts=2, d_model=64, ffn=32)
    ref = Checkpoint.open(root).experts[(0, 1)]
    info, idx, rows = ref.sources[0]
    moved = TensorInfo(info.name, info.path, info.dtype, info.shape, info.offset + 2, info.nbytes)
    lying = ExpertRef(0, 1, ((moved, idx, rows), *ref.sources[1:]))
    with LibraryReader() as lib, pytest.raises(SmoeError) as e:
        lib.read(lying)
    assert str(e.value) == (
        f"{info.path}: tensor {info.name!r} is not the one indexed (BF16 {list(info.shape)} "
        f"at offset {info.offset + 2}); refused"
    )


def test_bf16_without_ml_dtypes_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = Checkpoint.open(CKPTS / "qwen3_moe").experts[(0, 0)]
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes raises ImportError
    with LibraryReader() as lib, pytest.raises(SmoeError) as e:
        lib.read(ref)
    info = min((t for t, _, _ in ref.sources), key=lambda t: t.offset)  # read first
    assert str(e.value) == (
        f"{info.path}: tensor {info.name!r} is BF16, which the safetensors library reads "
        "only with ml_dtypes installed (pip install ml_dtypes)"
    )


# ---- FP8: refused, never read unscaled ----------------------------------------------------
def edit_shard(shard: Path, edit: Callable[[dict], bytes]) -> None:
    """Rewrite a shard's header with ``edit(header) -> bytes to append to the data``."""
    raw = shard.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    extra = edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    shard.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :] + extra)


def to_fp8(header: dict) -> bytes:
    """Layer 0 expert 0 as F8_E4M3, the same bytes: BF16 gate and up [32, 64] and down
    [64, 32] become three consistent F8 [64, 64] matrices."""
    for role in ("gate_proj", "up_proj", "down_proj"):
        entry = header[f"model.layers.0.mlp.experts.0.{role}.weight"]
        entry["dtype"], entry["shape"] = "F8_E4M3", [64, 64]
    return b""


def with_scales(header: dict) -> bytes:
    """A DeepSeek-V3 style ``weight_scale_inv`` [1, 1] F32 for layer 0 expert 0's gate."""
    end = max(e["data_offsets"][1] for k, e in header.items() if k != "__metadata__")
    header["model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv"] = {
        "dtype": "F32",
        "shape": [1, 1],
        "data_offsets": [end, end + 4],
    }
    return struct.pack("<f", 0.5)


def test_fp8_expert_weights_are_refused_naming_tensor_and_dtype(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "ck", layers=1, experts=2, d_model=64, ffn=32)
    shard = root / "model.safetensors"
    edit_shard(shard, to_fp8)
    with pytest.raises(SmoeError) as e:
        Checkpoint.open(root)
    name = "model.layers.0.mlp.experts.0.gate_proj.weight"
    assert str(e.value) == (
        f"{shard}: tensor {name!r} is F8_E4M3 without scales (neither '{name}_scale_inv' "
        f"nor '{name}_scale' is in the checkpoint); refused: FP8 weights are read only with "
        "their scales"
    )


@pytest.mark.parametrize("fp8", [True, False], ids=["F8_E4M3", "BF16"])
def test_block_scaled_weights_are_never_read_unscaled(tmp_path: Path, fp8: bool) -> None:
    """FP8 gate with its scale is read; then up (FP8, no scale) is refused. A BF16 weight
    with a scale is refused: its values are not the weights without it."""
    root = write_checkpoint(tmp_path / "ck", layers=1, experts=2, d_model=64, ffn=32)
    shard = root / "model.safetensors"
    edit_shard(shard, lambda h: (to_fp8(h) if fp8 else b"") + with_scales(h))
    with pytest.raises(SmoeError) as e:
        Checkpoint.open(root)
    experts = "model.layers.0.mlp.experts.0"
    if fp8:
        name = f"{experts}.up_proj.weight"
        expected = (
            f"{shard}: tensor {name!r} is F8_E4M3 without scales (neither '{name}_scale_inv' "
            f"nor '{name}_scale' is in the checkpoint); refused: FP8 weights are read only "
            "with their scales"
        )
    else:
        name = f"{experts}.gate_proj.weight"
        expected = (
            f"{shard}: tensor {name!r} is BF16 with scales in '{name}_scale_inv'; refused: "
            "its values are not the weights without the scales; only FP8 weights are read "
            "with scales"
        )
    assert str(e.value) == expected


def test_library_reader_refuses_fp8_itself(tmp_path: Path) -> None:
    """Even given an FP8 tensor by hand (Checkpoint.open reads it only with its scales)."""
    root = write_checkpoint(tmp_path / "ck", layers=1, experts=2, d_model=64, ffn=32)
    shard = root / "model.safetensors"
    edit_shard(shard, to_fp8)
    tensors = read_header(shard)
    parts = [
        tensors[f"model.layers.0.mlp.experts.0.{r}.weight"]
        for r in ("gate_proj", "up_proj", "down_proj")
    ]
    ref = ExpertRef(0, 0, tuple((t, None, None) for t in parts))
    with LibraryReader() as lib, pytest.raises(SmoeError) as e:
        lib.read(ref)
    first = min(parts, key=lambda t: t.offset)  # read first
    assert str(e.value) == (
        f"{shard}: tensor {first.name!r} is F8_E4M3; refused: expert weights must be "
        "BF16, F16 or F32"
    )


# ---- a shard that shrinks while being read --------------------------------------------------
SHRINK = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    import smoe_testkit.library_reader as lr
    from smoe.sculpt.source.checkpoint import Checkpoint
    from smoe.sculpt.expert_reader import ExpertReader

    root, which = Path(sys.argv[1]), sys.argv[2]
    shard = root / "model.safetensors"
    ck = Checkpoint.open(root)
    last = max(ck.experts.values(), key=lambda r: max(o for _, o, _ in r.ranges()))

    def shrink():
        os.truncate(shard, os.path.getsize(shard) // 2)

    if which == "library, mapped":  # the shard shrinks after the library has mapped it
        opened = lr.safe_open

        def safe_open(*args, **kw):
            handle = opened(*args, **kw)
            shrink()
            return handle

        lr.safe_open = safe_open
    reader = ExpertReader() if which == "ours" else lr.LibraryReader()
    if which != "library, mapped":
        reader.read(ck.experts[(0, 0)])
        shrink()
    try:
        reader.read(last)
    except Exception as e:
        print(type(e).__name__, str(e).replace(str(shard), "SHARD"))
    """
)


@pytest.mark.parametrize(
    ("which", "outcome"),
    [
        ("ours", "SmoeError SHARD: file shrank while reading"),
        ("library", "SmoeError SHARD: changed since it was validated"),
        ("library, mapped", -signal.SIGBUS),
    ],
)
def test_shard_that_shrinks(tmp_path: Path, which: str, outcome: str | int) -> None:
    """Ours stops with one line; the library is refused a shard that changed before it is
    opened, but one that shrinks while it is mapped kills the process with SIGBUS, which is
    why LibraryReader is not the default."""
    root = write_checkpoint(tmp_path / "ck", layers=1, experts=8, d_model=128, ffn=64)
    proc = python(SHRINK, root, which, cwd=ROOT, env=plain_env(PYTHONFAULTHANDLER=""))
    if isinstance(outcome, int):
        assert proc.returncode == outcome, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(outcome), proc.stdout
