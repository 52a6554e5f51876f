"""How the Sculptor reads experts: byte ranges, reused buffers, CRC-32C while reading, file
order, worker processes (issue 13). The output itself is pinned by test_sculpt.py and
test_sculpt_safety.py."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from smoe.errors import SmoeError
from smoe.format.manifest import checksum
from smoe.format.plan import make_plan
from smoe.interop.safetensors_io import read_array
from smoe.sculpt import Job, SculptOptions, file_order, sculpt
from smoe.sculpt import workers as workers_mod
from smoe.sculpt.expert_reader import ExpertReader
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef
from smoe_testkit.synth import write_checkpoint

from fixtures_data import CHECKPOINT_LAYOUTS


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checkpoint]:
    base = tmp_path_factory.mktemp("pipeline")
    out = {}
    for name, kw in CHECKPOINT_LAYOUTS.items():
        path = write_checkpoint(base / name, layers=2, experts=4, d_model=64, ffn=32, seed=3, **kw)
        out[name] = Checkpoint.open(path)
    return out


def whole_tensor_slice(ref: ExpertRef) -> list[np.ndarray]:
    """Each matrix cut out of its whole source tensor (the reference for ranges)."""
    out = []
    for info, idx, rows in ref.sources:
        arr = read_array(info)
        if idx is not None:
            arr = arr[idx]
        out.append(arr if rows is None else arr[rows])
    return out


@pytest.mark.parametrize("name", sorted(CHECKPOINT_LAYOUTS))
def test_load_reads_exactly_each_matrix(ckpts: dict[str, Checkpoint], name: str) -> None:
    for ref in ckpts[name].experts.values():
        loaded = ref.load()
        for (arr, src), want, (_, _, n) in zip(loaded, whole_tensor_slice(ref), ref.ranges()):
            assert arr.dtype == want.dtype and arr.shape == want.shape
            assert np.array_equal(arr.view(np.uint8), want.view(np.uint8))
            assert arr.nbytes == n
            assert src == ("bf16" if CHECKPOINT_LAYOUTS[name]["dtype"] == "BF16" else None)


def test_fused_rows_are_disjoint_ranges_of_one_slab(ckpts: dict[str, Checkpoint]) -> None:
    ref = ckpts["fused"].experts[(1, 2)]
    (gp, go, gn), (up, uo, un), (dp, do, dn) = ref.ranges()
    assert dp == ref.sources[2][0].path
    gu = ref.sources[0][0]
    slab = gu.nbytes // gu.shape[0]
    assert gp == up and go == gu.offset + 2 * slab and uo == go + gn and gn == un == slab // 2
    down = ref.sources[2][0]
    assert do == down.offset + 2 * (down.nbytes // down.shape[0]) and dn == gn


@pytest.mark.parametrize("name", sorted(CHECKPOINT_LAYOUTS))
def test_reader_matches_load_and_checksums(ckpts: dict[str, Checkpoint], name: str) -> None:
    with ExpertReader() as reader:
        for ref in ckpts[name].experts.values():
            mats, crcs = reader.read(ref)
            loaded = ref.load()
            assert crcs == tuple(checksum(a) for a, _ in loaded)
            for (a, src), (b, src_b) in zip(mats, loaded):
                assert (a.dtype, a.shape, src) == (b.dtype, b.shape, src_b)
                assert a.flags.c_contiguous and a.flags.aligned
                assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
            assert reader.crcs(ref) == crcs


def test_reader_reuses_its_buffers_and_keeps_the_other_slot(
    ckpts: dict[str, Checkpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ExpertReader, "CHUNK", 1000)  # many chunks, a partial last one
    refs = list(ckpts["per-expert"].experts.values())
    with ExpertReader() as reader:
        first, crcs0 = reader.read(refs[0], slot=0)
        kept = [a.copy() for a, _ in first]
        second, _ = reader.read(refs[1], slot=1)
        assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(second, refs[1].load()))
        assert all(np.array_equal(a, b) for (a, _), b in zip(first, kept))
        third, crcs2 = reader.read(refs[2], slot=0)
        assert third[0][0].base is first[0][0].base  # the same buffer, no new allocation
        assert crcs0 == tuple(checksum(k) for k in kept)
        assert crcs2 == tuple(checksum(a) for a, _ in refs[2].load())
        assert reader.crcs(refs[2], slot=1) == crcs2  # through a 1000-byte window


def test_a_larger_expert_grows_the_buffer(tmp_path: Path) -> None:
    small = Checkpoint.open(
        write_checkpoint(tmp_path / "s", layers=1, experts=2, d_model=64, ffn=32, seed=1)
    )
    big = Checkpoint.open(
        write_checkpoint(tmp_path / "b", layers=1, experts=2, d_model=128, ffn=64, seed=2)
    )
    with ExpertReader(slots=1) as reader:
        for ref in (*small.experts.values(), *big.experts.values(), *small.experts.values()):
            mats, _ = reader.read(ref)
            assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(mats, ref.load()))


def test_a_shard_that_shrinks_is_one_error_naming_it(tmp_path: Path) -> None:
    ck = Checkpoint.open(
        write_checkpoint(tmp_path / "m", layers=1, experts=2, d_model=64, ffn=32, seed=4)
    )
    ref = ck.experts[(0, 1)]
    shard, offset, _ = ref.ranges()[0]
    with ExpertReader() as reader:
        reader.read(ck.experts[(0, 0)])  # the descriptor is open before the file shrinks
        os.truncate(shard, offset + 10)
        with pytest.raises(SmoeError) as info:
            reader.read(ref)
    assert str(info.value).startswith(f"{shard}: file shrank while reading")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["per-expert", "fused", "f16-sharded"])
def test_file_order_follows_shard_and_offset(ckpts: dict[str, Checkpoint], name: str) -> None:
    ck = ckpts[name]
    refs = list(ck.experts.values())
    plan = make_plan({(r.layer, r.expert): r.shapes for r in refs}, 4, 2)
    slots = {e.key: e for e in plan.experts}
    jobs = [Job(r, slots[(r.layer, r.expert)], 4, "optimal") for r in reversed(refs)]
    ordered = file_order(jobs)
    assert sorted(j.ref.layer * 100 + j.ref.expert for j in ordered) == sorted(
        r.layer * 100 + r.expert for r in refs
    )
    starts = [min((str(p), o) for p, o, _ in j.ref.ranges()) for j in ordered]
    assert starts == sorted(starts)


def test_a_worker_that_dies_stops_the_run_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = write_checkpoint(tmp_path / "ck" / "m", layers=2, experts=8, d_model=64, ffn=32, seed=6)
    real = workers_mod.encode_blob

    def dies_on_one(slot, *args, **kwargs):
        if (slot.layer_id, slot.expert_id) == (1, 5):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(slot, *args, **kwargs)

    monkeypatch.setattr(workers_mod, "encode_blob", dies_on_one)  # forked workers inherit it
    out = tmp_path / "out"
    with pytest.raises(SmoeError) as info:
        sculpt(ck, out, SculptOptions(jobs=2))
    assert re.fullmatch(
        r"sculpt: worker process \d+ died \(killed by SIGKILL\); nothing was "
        r"committed",
        str(info.value),
    ), str(info.value)
    assert sorted(p.name for p in out.iterdir()) == []  # no partial, journal or lock left
    monkeypatch.setattr(workers_mod, "encode_blob", real)
    res = sculpt(ck, out, SculptOptions(jobs=2))  # the lock was released
    assert res.experts_written == 16


class Unpicklable(Exception):
    """An exception whose pickle cannot be loaded (its __init__ needs two arguments)."""

    def __init__(self, what: str, where: int) -> None:
        super().__init__(f"{what} at {where}")


def test_a_worker_error_that_does_not_pickle_arrives_as_its_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = write_checkpoint(tmp_path / "ck" / "m", layers=2, experts=8, d_model=64, ffn=32, seed=7)

    def fails(slot, *args, **kwargs):
        raise Unpicklable("odd failure", slot.expert_id)

    monkeypatch.setattr(workers_mod, "encode_blob", fails)
    out = tmp_path / "out"
    with pytest.raises(SmoeError) as info:
        sculpt(ck, out, SculptOptions(jobs=2))
    assert re.fullmatch(r"Unpicklable: odd failure at \d", str(info.value)), str(info.value)
    assert sorted(p.name for p in out.iterdir()) == []


def test_a_shard_swapped_for_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    ck = Checkpoint.open(
        write_checkpoint(tmp_path / "m", layers=1, experts=2, d_model=64, ffn=32, seed=8)
    )
    ref = ck.experts[(0, 0)]
    shard = ref.ranges()[0][0]
    shard.unlink()
    os.mkfifo(shard)
    for read in (lambda: ExpertReader().read(ref), ref.load):
        with pytest.raises(SmoeError) as info:
            read()
        assert str(info.value) == f"{shard}: not a regular file (a FIFO)"


def test_name_sets_the_outputs_stem_and_must_be_a_plain_name(tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / "ck" / "m", layers=1, experts=2, d_model=64, ffn=32, seed=9)
    res = sculpt(ck, tmp_path / "out", SculptOptions(jobs=1, name="given"))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "given.config.json",
        "given.scout.safetensors",
        "given.smoe",
        "given.smoe.manifest.json",
    ]
    assert res.vault == tmp_path / "out" / "given.smoe"
    for bad in ("../up", "", "..", "a/b"):
        with pytest.raises(SmoeError) as info:
            sculpt(ck, tmp_path / "bad", SculptOptions(jobs=1, name=bad))
        assert str(info.value).startswith(f"output name {bad!r}: not a file name stem")
    assert not (tmp_path / "bad").exists() and not (tmp_path / "up.smoe").exists()
