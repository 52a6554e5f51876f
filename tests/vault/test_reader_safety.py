"""The readers never map the file: a vault that shrinks while it is read gives one clean
error (never SIGBUS), non-regular files are refused at once (never a hang), large ranges
are read in bounded pieces, and `--deep` checks every blob against the manifest."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from smoe.cli.dump import collect, collect_path
from smoe.errors import SmoeError
from smoe.format import manifest, view
from smoe.format.verify import verify, verify_path
from smoe.format.view import FileView
from smoe.plumbing.fileio import NotRegular
from smoe.vault.reader import Vault
from smoe_gen import layout

from fixtures_data import CORRUPT, FIXTURES, GOOD
from helpers import python, refused, run


def write_manifest(vault: Path, out: Path | None = None) -> Path:
    """The manifest of ``vault`` (CRC-32C of every blob as it is now); returns its path."""
    builder = manifest.ManifestBuilder(manifest.tool_info("test", {}))
    slots = []
    with Vault.open(vault) as v:
        for e in v.table:
            layer, expert = int(e["layer_id"]), int(e["expert_id"])
            off, raw = int(e["byte_offset"]), int(e["raw_size"])
            builder.add(layer, expert, manifest.checksum(v.data[off : off + raw]))
            slots.append((layer, expert, off, raw))
        doc = builder.document(vault.name, len(v.data), v.bits, slots)
    out = out or manifest.path_for(vault)
    out.write_bytes(manifest.encode(doc))
    return out


def copy_fixture(tmp_path: Path, name: str = "q4_v2.smoe", with_manifest: bool = True) -> Path:
    path = tmp_path / name
    shutil.copyfile(FIXTURES / name, path)
    if with_manifest:
        write_manifest(path)
    return path


def patch(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)


def errors(report) -> list[tuple[str, int, str, str]]:
    return [(f.code, f.offset, f.path, f.message) for f in report.errors]


# ---- the view ----------------------------------------------------------------------------
def test_file_view_slices_like_numpy(tmp_path: Path) -> None:
    path = copy_fixture(tmp_path, "partial_vault.smoe", with_manifest=False)
    want = np.fromfile(path, np.uint8)
    with FileView.open(path) as v:
        assert len(v) == len(want) == 81920
        for key in (
            slice(0, 64),
            slice(None),
            slice(100, 50),
            slice(81900, 90000),
            slice(-10, None),
            slice(-90000, 10),
            slice(5, 500, 7),
            slice(500, 5, -3),
            slice(None, None, -1),
        ):
            got = v[key]
            assert got.dtype == np.uint8 and not got.flags.writeable
            assert np.array_equal(got, want[key]), key
        assert v[16384] == int(want[16384]) and v[-1] == int(want[-1])
        assert isinstance(v[0], int)
        with pytest.raises(IndexError):
            v[81920]
    assert v.fd == -1  # closed on exit


def test_file_view_refuses_to_allocate_absurd_reads(tmp_path: Path) -> None:
    path = copy_fixture(tmp_path, with_manifest=False)
    with FileView.open(path) as v, pytest.raises(SmoeError) as info:
        v.read(0, 2**62)
    assert str(info.value) == (f"{path}: cannot read {2**62} bytes at offset 0: not enough memory")


def test_vault_data_is_read_on_demand(tmp_path: Path) -> None:
    path = copy_fixture(tmp_path, with_manifest=False)
    with Vault.open(path) as v:
        assert isinstance(v.data, FileView) and len(v.data) == path.stat().st_size
        assert bytes(v.data[:8]) == layout.MAGIC
        e = v.expert(1, 2)
        gate = e["gate_proj"]
        assert gate.packed.base is not None and not gate.packed.flags.writeable
        ref = Vault.from_array(np.fromfile(path, np.uint8)).expert(1, 2).dequantize()
        for name, w in e.dequantize().items():
            assert np.array_equal(w, ref[name]), name


# ---- non-regular files ---------------------------------------------------------------------
def specials(tmp_path: Path) -> list[tuple[Path, str]]:
    fifo = tmp_path / "fifo.smoe"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.smoe"
    folder.mkdir()
    return [(fifo, "a FIFO"), (folder, "a folder"), (Path("/dev/zero"), "a character device")]


def test_non_regular_files_are_refused_in_process(tmp_path: Path) -> None:
    for path, kind in specials(tmp_path):
        for call in (
            lambda p: Vault.open(p),
            lambda p: verify_path(p, deep=True),
            lambda p: collect_path(p, deep=True),
            lambda p: FileView.open(p),
        ):
            with pytest.raises(NotRegular) as info:
                call(path)
            assert str(info.value) == f"{path}: not a regular file ({kind})"


@pytest.mark.parametrize("command", ["verify", "dump"])
def test_non_regular_files_are_refused_by_the_cli(tmp_path: Path, command: str) -> None:
    for path, kind in specials(tmp_path):
        proc = run(command, "--deep", path)
        assert proc.returncode == 2, (path, proc.stderr)
        assert proc.stderr.strip() == f"error: {path}: not a regular file ({kind})"


# ---- a file that shrinks while it is read -------------------------------------------------
class Shrinker:
    """Wraps ``FileView.read``: after ``after`` reads, truncates the file to ``cut`` bytes and
    records the reads that follow."""

    def __init__(self, path: Path, after: int, cut: int) -> None:
        self.path, self.after, self.cut = path, after, cut
        self.calls = 0
        self.later: list[tuple[int, int]] = []
        self.real = FileView.read

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(FileView, "read", lambda fv, offset, n: self.read(fv, offset, n))

    def read(self, fv: FileView, offset: int, n: int) -> np.ndarray:
        if self.calls == self.after:
            os.truncate(self.path, self.cut)
        if self.calls >= self.after:
            self.later.append((offset, n))
        self.calls += 1
        return self.real(fv, offset, n)


def walk_vault(path: Path) -> None:
    with Vault.open(path) as v:
        for key in v:
            v.expert(*key).dequantize()


OPERATIONS: dict[str, Callable[[Path], object]] = {
    "verify --deep": lambda p: verify_path(p, deep=True),
    "dump --deep": lambda p: collect_path(p, deep=True),
    "Vault.expert().dequantize()": walk_vault,
}


def count_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, op: str) -> int:
    path = copy_fixture(tmp_path / "count")
    spy = Shrinker(path, after=-1, cut=0)
    spy.install(monkeypatch)
    OPERATIONS[op](path)
    monkeypatch.undo()
    return spy.calls


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_shrinking_between_any_two_reads_is_one_clean_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, op: str
) -> None:
    (tmp_path / "count").mkdir()
    total = count_reads(monkeypatch, tmp_path, op)
    assert total >= 8  # header, arch, table, and at least the blobs
    for after in range(total):
        for cut in (0, 16384):  # empty, or the metadata without any blob
            work = tmp_path / f"{after}-{cut}"
            work.mkdir()
            path = copy_fixture(work)
            spy = Shrinker(path, after, cut)
            spy.install(monkeypatch)
            try:
                OPERATIONS[op](path)
                failed = None
            except SmoeError as e:
                failed = e
            monkeypatch.undo()
            beyond = [(o, n) for o, n in spy.later if o + n > cut]
            if not beyond:  # every later read lay within what was left
                assert failed is None, (after, cut, failed)
                continue
            assert failed is not None, (after, cut)
            offset, n = beyond[0]
            got = max(0, cut - offset)
            assert str(failed) == (
                f"{path}: file shrank while reading: {n} bytes at offset {offset}, got {got}"
            )


def test_expert_read_after_truncation_names_offset_and_size(tmp_path: Path) -> None:
    path = copy_fixture(tmp_path, with_manifest=False)
    with Vault.open(path) as v:
        os.truncate(path, 16384)
        with pytest.raises(SmoeError) as info:
            v.expert(0, 1).dequantize()
    # expert (0, 1): blob at 32768, its six slices span [0, 3264) of the blob
    assert str(info.value) == (
        f"{path}: file shrank while reading: 3264 bytes at offset 32768, got 0"
    )


# The CLI in a child process (a SIGBUS would kill it, not the test) whose positioned reads
# (``os.preadv``, what FileView reads with) cut the vault to CUT bytes at the first read at
# or past AT: the file shrinks at a chosen moment, between two reads of one run.
SHRINK_AT_READ = """
import os, sys
from smoe.cli import main

path, at, cut = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
real = os.preadv

def preadv(fd, buffers, offset, *flags):
    if offset >= at and os.path.getsize(path) > cut:
        os.truncate(path, cut)
    return real(fd, buffers, offset, *flags)

os.preadv = preadv
sys.exit(main(sys.argv[4:]))
"""


def test_cli_verify_of_a_vault_truncated_while_it_runs(tmp_path: Path) -> None:
    """Cut to half its size once the metadata is read: blobs 0-2 and blob 3's 3264 bytes at
    65536 lie before the cut (73728), blob 3's padding read (13120 bytes at 68800) is the
    first that crosses it."""
    path = copy_fixture(tmp_path)
    size = path.stat().st_size
    with Vault.open(path) as v:
        metadata = v.geometry.data_offset
    proc = python(SHRINK_AT_READ, path, metadata, size // 2, "verify", "--deep", path)
    assert path.stat().st_size == size // 2  # the shim did cut it
    assert proc.stdout == ""
    assert refused(proc, 1) == (
        f"error: {path}: file shrank while reading: 13120 bytes at offset 68800, got 4928"
    )


# ---- bounded reads ----------------------------------------------------------------------
def test_large_ranges_are_read_in_bounded_pieces(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "pad.smoe"
    shutil.copyfile(CORRUPT / "nonzero_padding.smoe", path)
    patch(path, 1700, b"\x05")  # also a non-zero byte in the gap before data_offset
    want = errors(verify(np.fromfile(path, np.uint8), deep=True))
    assert [c for c, *_ in want] == ["blob.padding"]
    sizes: list[tuple[int, int]] = []
    real = FileView.read

    def spy(fv: FileView, offset: int, n: int) -> np.ndarray:
        sizes.append((offset, n))
        return real(fv, offset, n)

    monkeypatch.setattr(FileView, "read", spy)
    monkeypatch.setattr(view, "CHUNK", 1000)
    report = verify_path(path, deep=True)
    assert errors(report) == want
    gap = [f for f in report.findings if f.code == "header.gap"]
    assert [(f.offset, f.actual) for f in gap] == [(1700, 5)]
    blob_reads = [n for offset, n in sizes if offset >= 1504]  # after the descriptors
    assert blob_reads and max(blob_reads) <= 1000


# ---- the manifest -------------------------------------------------------------------------
def test_matching_manifest_passes_and_absent_manifest_verifies_as_before(
    tmp_path: Path,
) -> None:
    path = copy_fixture(tmp_path)
    before = verify(np.fromfile(FIXTURES / "q4_v2.smoe", np.uint8), deep=True)
    assert verify_path(path, deep=True).findings == before.findings
    explicit = verify_path(path, deep=True, manifest=manifest.path_for(path))
    assert explicit.findings == before.findings
    manifest.path_for(path).unlink()
    assert verify_path(path, deep=True).findings == before.findings


@pytest.mark.parametrize("name", GOOD)
def test_fixtures_pass_the_manifest_written_beside_them(tmp_path: Path, name: str) -> None:
    assert verify_path(FIXTURES / name, deep=True).errors == []
    side = manifest.path_for(FIXTURES / name)
    if side.exists():  # written by fixtures/generate.py: a damaged copy is caught
        path = copy_fixture(tmp_path, name, with_manifest=False)
        shutil.copyfile(side, manifest.path_for(path))
        with Vault.open(path) as v:
            first = int(v.table["byte_offset"][0])
        patch(path, first, bytes([path.read_bytes()[first] ^ 1]))
        assert [(f.code, f.offset) for f in verify_path(path, deep=True).errors] == [
            ("manifest.checksum", first)
        ]


@pytest.mark.parametrize("damage", ["flip", "zero"])
def test_damaged_blob_is_a_checksum_error_at_its_offset(tmp_path: Path, damage: str) -> None:
    path = copy_fixture(tmp_path)
    doc = json.loads(manifest.path_for(path).read_text())
    want_crc = doc["experts"][5]["crc32c"]
    blob = 98304  # experts[5] = (layer 1, expert 1)
    if damage == "flip":
        patch(path, blob + 10, bytes([path.read_bytes()[blob + 10] ^ 0x10]))
    else:
        patch(path, blob, bytes(3264))
    got_crc = manifest.checksum(path.read_bytes()[blob : blob + 3264])
    report = verify_path(path, deep=True)
    assert errors(report) == [
        (
            "manifest.checksum",
            blob,
            "manifest/experts/5/crc32c",
            "layer 1 expert 1: the blob's CRC-32C differs from the manifest (the blob was "
            "changed or damaged)",
        )
    ]
    assert (report.errors[0].expected, report.errors[0].actual) == (want_crc, got_crc)
    assert verify_path(path, deep=False).errors == []  # only --deep reads blobs
    assert verify_path(path, deep=True, manifest=None).errors == []
    dump, dumped = collect_path(path, deep=True)
    assert dumped.findings == report.findings
    assert dump["findings"] == [f.to_dict() for f in report.findings]
    in_memory = verify(np.fromfile(path, np.uint8), deep=True, manifest=doc)
    assert in_memory.findings == report.findings


def test_manifest_of_another_vault(tmp_path: Path) -> None:
    path = copy_fixture(tmp_path)
    other = write_manifest(FIXTURES / "partial_vault.smoe", tmp_path / "other.json")
    report = verify_path(path, deep=True, manifest=other)
    assert errors(report) == [
        (
            "manifest.vault",
            0,
            "manifest/vault/size",
            "the manifest describes a vault with size 81920, this one has 147456 (it belongs "
            "to another file)",
        ),
        (
            "manifest.vault",
            0,
            "manifest/vault/experts",
            "the manifest describes a vault with experts 4, this one has 8 (it belongs to "
            "another file)",
        ),
    ]


def test_malformed_manifests(tmp_path: Path) -> None:
    path = copy_fixture(tmp_path)
    side = manifest.path_for(path)
    good = json.loads(side.read_text())
    cases = {
        "json": (b'{"schema": ', "manifest", f"{side} is not UTF-8 JSON ("),
        "schema": (
            json.dumps({**good, "schema": "smoe-manifest/9"}).encode(),
            "manifest/schema",
            "is 'smoe-manifest/9', expected 'smoe-manifest/1'",
        ),
        "nan": (
            json.dumps(good)
            .replace('"checksum": "crc32c"', '"checksum": "crc32c", "x": NaN')
            .encode(),
            "manifest",
            f"{side} is not UTF-8 JSON (NaN is not JSON)",
        ),
    }
    for name, (raw, where, message) in cases.items():
        side.write_bytes(raw)
        report = verify_path(path, deep=True)
        (f,) = report.errors
        assert (f.code, f.offset, f.path) == ("manifest.malformed", 0, where), name
        assert f.message.startswith(message) if name == "json" else f.message == message, name
        dump, _ = collect_path(path, deep=True)
        assert [d["code"] for d in dump["findings"] if d["severity"] == "error"] == [
            "manifest.malformed"
        ]
        assert verify_path(path, deep=False).errors == []  # not read without --deep
        assert verify_path(path, deep=True, manifest=None).errors == []


def test_missing_or_special_manifest_is_named(tmp_path: Path) -> None:
    path = copy_fixture(tmp_path, with_manifest=False)
    missing = tmp_path / "nope.json"
    (f,) = verify_path(path, deep=True, manifest=missing).errors
    assert (f.code, f.path, f.message) == (
        "manifest.malformed",
        "manifest",
        f"{missing}: cannot open: No such file or directory",
    )
    fifo = manifest.path_for(path)
    os.mkfifo(fifo)  # beside the vault: found by "auto", refused without blocking
    (f,) = verify_path(path, deep=True).errors
    assert (f.code, f.message) == ("manifest.malformed", f"{fifo}: not a regular file (a FIFO)")


def test_collect_of_an_array_takes_the_manifest_beside_its_path(tmp_path: Path) -> None:
    path = copy_fixture(tmp_path)
    patch(path, 16384, b"\xff")
    data = np.fromfile(path, np.uint8)
    _, report = collect(path, data, deep=True)
    assert [f.code for f in report.errors] == ["manifest.checksum"]
    _, without = collect(path, data, deep=True, manifest=None)
    assert without.errors == []


def test_truncated_blob_table_skips_the_manifest(tmp_path: Path) -> None:
    path = copy_fixture(tmp_path)
    os.truncate(path, 147456 - 16384)  # the last blob now lies beyond the end
    codes = {f.code for f in verify_path(path, deep=True).errors}
    assert "entry.blob_bounds" in codes and not any(c.startswith("manifest") for c in codes)
