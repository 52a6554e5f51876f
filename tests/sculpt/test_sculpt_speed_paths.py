"""The Sculptor's speed paths give the same bytes as the plain ones (issue 13): a reused
blob buffer, ``O_DIRECT`` reads of experts absent from the page cache (with their
fall-backs: a file system that refuses ``O_DIRECT``, a refused read, a file that shrank),
and blobs written with ``O_DIRECT`` (the same bytes and holes; a refused write continues
through the page cache, a failed one is one error line)."""

from __future__ import annotations

import errno
import fcntl
import gc
import os
from pathlib import Path

import numpy as np
import pytest

from smoe import quant
from smoe.errors import SmoeError
from smoe.format.manifest import checksum
from smoe.format.plan import make_plan
from smoe.plumbing import fileio
from smoe.plumbing.fileio import direct_io
from smoe.sculpt import SculptOptions, SculptResult, sculpt
from smoe.sculpt import expert_reader as reader_mod
from smoe.sculpt.blob_writer import BlobWriter
from smoe.sculpt.expert_reader import ExpertReader, cached_fraction
from smoe.sculpt.source.checkpoint import Checkpoint
from smoe.vault.blob import MatrixInput, encode_blob
from smoe_testkit.synth import write_checkpoint

from fixtures_data import CHECKPOINT_LAYOUTS


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checkpoint]:
    base = tmp_path_factory.mktemp("speed")
    return {
        name: Checkpoint.open(
            write_checkpoint(base / name, layers=2, experts=3, d_model=64, ffn=48, seed=5, **kw)
        )
        for name, kw in CHECKPOINT_LAYOUTS.items()
    }


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("kernel", ["numpy", "fast"])
def test_a_reused_blob_is_byte_identical_to_a_fresh_one(
    bits: int, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kernel == "fast" and quant.fast_kernels(bits, "optimal", kernel="auto") is None:
        pytest.skip("the compiled encoder needs numba (pip install 'smoe[fast]')")
    monkeypatch.setenv(quant.KERNEL_ENV, kernel)
    rows, cols = (257, 301) if kernel == "fast" else (9, 37)  # partial groups, odd sizes
    shapes = ((rows, cols), (rows, cols), (cols, rows))
    slot = make_plan({(0, 0): shapes}, bits, 2).experts[0]
    rng = np.random.default_rng(bits)
    for src in ("bf16", None):
        mats = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        mats[1][3, :] = 0.0  # a zero run
        if src == "bf16":
            mats = [(m.view(np.uint32) >> 16).astype(np.uint16) for m in mats]
        fresh = encode_blob(slot, MatrixInput.each(mats, src), bits, "optimal")
        stale = bytearray(rng.integers(0, 256, slot.raw_size, np.uint8).tobytes())
        reused = encode_blob(slot, MatrixInput.each(mats, src), bits, "optimal", out=stale)
        assert reused is stale and reused == fresh
    with pytest.raises(ValueError, match="out has 3 bytes"):
        encode_blob(slot, MatrixInput.each(mats), bits, "optimal", out=bytearray(3))


def force_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every expert read with O_DIRECT (as if none were page-cached)."""
    monkeypatch.setattr(ExpertReader, "uses_direct", lambda self, ref: self.direct)


@pytest.mark.parametrize("name", sorted(CHECKPOINT_LAYOUTS))
def test_direct_reads_give_the_bytes_and_checksums_of_load(
    ckpts: dict[str, Checkpoint], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    force_direct(monkeypatch)
    with ExpertReader() as reader, ExpertReader(direct=False) as plain:
        for ref in ckpts[name].experts.values():
            mats, crcs = reader.read(ref, slot=ref.expert % 2)
            assert crcs == plain.read(ref)[1] == tuple(checksum(a) for a, _ in ref.load())
            for (a, src), (b, src_b) in zip(mats, ref.load()):
                assert (a.dtype, a.shape, src) == (b.dtype, b.shape, src_b)
                assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
        assert reader.direct_reads == len(ckpts[name].experts)
        assert plain.direct_reads == 0


def test_a_file_system_that_refuses_o_direct_is_read_through_the_cache(
    ckpts: dict[str, Checkpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    force_direct(monkeypatch)
    real = fcntl.fcntl

    def refuse(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")  # as tmpfs answers
        return real(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", refuse)
    ref = ckpts["per-expert"].experts[(1, 2)]
    with ExpertReader() as reader:
        mats, crcs = reader.read(ref)
        assert set(reader._dfds.values()) == {None}
    assert crcs == tuple(checksum(a) for a, _ in ref.load())
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(mats, ref.load()))


def test_a_refused_direct_read_continues_through_the_cache(
    ckpts: dict[str, Checkpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    force_direct(monkeypatch)
    real = os.preadv
    refused = []

    def preadv(fd: int, bufs: list, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, bufs, offset)

    monkeypatch.setattr(reader_mod.os, "preadv", preadv)
    ref = ckpts["fused"].experts[(0, 1)]
    with ExpertReader() as reader:
        for _ in range(2):
            mats, crcs = reader.read(ref)
            assert crcs == tuple(checksum(a) for a, _ in ref.load())
            assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(mats, ref.load()))
    assert 1 <= len(refused) <= len(ref.parts())  # refused once per shard, then not asked


def test_a_shard_that_shrinks_under_a_direct_read_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    force_direct(monkeypatch)
    ck = Checkpoint.open(
        write_checkpoint(tmp_path / "m", layers=1, experts=2, d_model=64, ffn=32, seed=4)
    )
    ref = ck.experts[(0, 1)]
    shard, offset, _ = ref.ranges()[0]
    with ExpertReader() as reader:
        reader.read(ck.experts[(0, 0)])
        os.truncate(shard, offset + 10)
        with pytest.raises(SmoeError) as info:
            reader.read(ref)
    assert str(info.value).startswith(f"{shard}: file shrank while reading")
    assert "\n" not in str(info.value)


def test_cached_fraction_sees_a_file_just_read(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(1 << 16))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 1 << 16, 0)
        share = cached_fraction(fd, 100, 5000)
        assert share is None or share == 1.0
        assert cached_fraction(fd, 0, 0) is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_sculpt_read_with_o_direct_writes_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    ck = write_checkpoint(tmp_path / "ck" / "m", layers=2, experts=8, d_model=64, ffn=48, seed=2)
    plain = sculpt(ck, tmp_path / "plain", SculptOptions(jobs=jobs))
    force_direct(monkeypatch)  # forked workers inherit it
    direct = sculpt(ck, tmp_path / "direct", SculptOptions(jobs=jobs))
    assert not isinstance(plain, dict) and not isinstance(direct, dict)
    names = sorted(p.name for p in (tmp_path / "plain").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "direct").iterdir())
    for name in names:
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "direct" / name).read_bytes()

    def by_key(res: SculptResult | dict) -> dict:  # in any order from two workers
        assert not isinstance(res, dict)
        return {k: [v[i] for v in res.snr.values()] for i, k in enumerate(res.snr_keys)}

    assert by_key(plain) == by_key(direct)


# ---- blob writes: O_DIRECT for whole blocks, the page cache for the rest ------------------
BLOBS = [(16384, 100), (32768, 4096), (49152, 5000), (65536, 12295)]  # (offset, size)


def write_blobs(path: Path, direct: bool) -> tuple[bytes, int, int]:
    """Writes :data:`BLOBS` (distinct bytes each) into a sparse file through a BlobWriter;
    (the file's bytes, its allocated 512-byte blocks, bytes written with O_DIRECT)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, FILE_SIZE)
    dfd: int | None = os.open(path, os.O_WRONLY)
    assert dfd is not None
    if not (direct and direct_io(dfd)):
        os.close(dfd)
        dfd = None
    with BlobWriter[int](os.dup(fd), str(path), dfd) as out:
        done = []
        for i, (offset, n) in enumerate(BLOBS):
            blob = out.buffer(n)
            blob[:] = np.arange(n) % 251 + i
            done += out.write(blob, offset, i)
        done += out.drain()
        written = out.direct_bytes
    assert done == list(range(len(BLOBS)))  # each reported once written, in order
    os.fsync(fd)
    blocks = os.fstat(fd).st_blocks
    os.close(fd)
    return path.read_bytes(), blocks, written


FILE_SIZE = 98304
PAGE = 4096


def first_data(path: Path) -> int | None:
    """Where the file's first data lies (``SEEK_DATA``), None where the call is not there."""
    if not hasattr(os, "SEEK_DATA"):
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_DATA)
    except OSError:
        return None
    finally:
        os.close(fd)


def test_direct_blob_writes_give_the_bytes_and_holes_of_buffered_ones(tmp_path: Path) -> None:
    """The promise, not the file system's allocation: the same bytes, and where the buffered
    file has holes (the zeros between blobs), so has the direct one: its first data is where
    the buffered file's is, and it allocates no more than the blobs' pages and a margin for
    the file system's own choices (block counts differ by file system: 64 or 72)."""
    plain = write_blobs(tmp_path / "plain", direct=False)
    direct = write_blobs(tmp_path / "direct", direct=True)
    assert direct[0] == plain[0]  # the same bytes
    data_pages = sum(-(-(offset % PAGE + n) // PAGE) for offset, n in BLOBS)
    if plain[1] * 512 < FILE_SIZE:  # the file system keeps holes: so does a direct write
        assert direct[1] * 512 <= (data_pages + 4) * PAGE < FILE_SIZE
        assert first_data(tmp_path / "direct") == first_data(tmp_path / "plain")
    probe = os.open(tmp_path / "plain", os.O_WRONLY)
    took = direct_io(probe)  # False where the file system refuses O_DIRECT (e.g. tmpfs)
    os.close(probe)
    assert direct[2] == (4096 + 4096 + 12288 if took else 0)  # whole blocks only
    assert plain[2] == 0


def test_a_refused_direct_write_continues_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwrite
    refused = []

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(fileio.os, "pwrite", pwrite)
    plain = write_blobs(tmp_path / "plain", direct=False)
    direct = write_blobs(tmp_path / "direct", direct=True)
    assert direct == plain  # bytes, blocks, and nothing written with O_DIRECT
    assert len(refused) <= 1  # refused once, then not asked again


def test_a_failed_blob_write_is_one_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio.os, "pwrite", full)
    path = tmp_path / "out"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    with pytest.raises(SmoeError) as info, BlobWriter[int](fd, str(path)) as out:
        for i in range(3):
            list(out.write(out.buffer(8192), i * 8192, i))
        list(out.drain())
    assert str(info.value).startswith(f"{path}: cannot write 8192 bytes at offset 0: No space")


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_sculpt_written_without_o_direct_gives_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    ck = write_checkpoint(tmp_path / "ck" / "m", layers=2, experts=8, d_model=64, ffn=48, seed=3)
    sculpt(ck, tmp_path / "direct", SculptOptions(jobs=jobs))
    monkeypatch.setattr(fileio, "direct_io", lambda fd: False)  # as on tmpfs
    sculpt(ck, tmp_path / "plain", SculptOptions(jobs=jobs))
    names = sorted(p.name for p in (tmp_path / "plain").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "direct").iterdir())
    for name in names:
        plain, direct = tmp_path / "plain" / name, tmp_path / "direct" / name
        assert plain.read_bytes() == direct.read_bytes()
        assert plain.stat().st_blocks == direct.stat().st_blocks  # the padding stays holes


@pytest.mark.parametrize("fail", [False, True])
def test_the_collector_rests_while_the_kernels_load_and_is_whole_again_after(
    ckpts: dict[str, Checkpoint], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool
) -> None:
    seen: dict[str, object] = {}
    prepare = quant.prepare_fast

    def watched(bits: int, scale: quant.ScaleMode = "optimal", *, importance: bool = False) -> bool:
        seen["enabled while loading"] = gc.isenabled()
        return prepare(bits, scale, importance=importance)

    def progress(done: int, total: int, nbytes: int) -> None:
        seen["frozen during the run"] = gc.get_freeze_count() > 0
        if fail:
            raise KeyboardInterrupt

    monkeypatch.setattr(quant, "prepare_fast", watched)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    opts = SculptOptions(jobs=2)  # worker processes: the kernels are loaded first
    if fail:
        with pytest.raises(KeyboardInterrupt):
            sculpt(ckpts["per-expert"].root, tmp_path, opts, progress=progress)
    else:
        sculpt(ckpts["per-expert"].root, tmp_path, opts, progress=progress)
    assert seen == {"enabled while loading": False, "frozen during the run": True}
    assert gc.isenabled() and gc.get_freeze_count() == 0
