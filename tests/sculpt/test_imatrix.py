"""llama.cpp importance matrices: both forms read, mapped onto our experts, lies refused.

GGUF files are written with ``gguf``'s own writer in llama-imatrix's layout (keys
general.type, imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size; per weight, in
name order, ``in_sum2`` [n_mat, cols], ``counts`` [n_mat, 1] and ``in_sum``); legacy
``.dat`` files byte by byte as ``save_imatrix_legacy`` writes them.
"""

from __future__ import annotations

import math
import os
import struct
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from smoe.errors import SmoeError
from smoe.plumbing.fileio import NotRegular
from smoe.sculpt.source.checkpoint import Checkpoint
from smoe.sculpt.source.imatrix import (
    ALL_ZERO,
    MERGED_EXPERTS,
    NO_COUNT,
    NO_ENTRY,
    RANGE_BOUND,
    Fallback,
    ImportanceMatrix,
    Raised,
)
from smoe_testkit.synth import write_checkpoint

from fixtures_data import ROOT
from helpers import refused

gguf = pytest.importorskip("gguf", reason="the optional extra smoe[imatrix] (gguf) is missing")

L, E, D, F = 2, 4, 64, 32  # layers, experts, d_model, expert FFN width of the tiny model
SHAPES = ((F, D), (F, D), (D, F))  # gate, up, down as [rows, cols]
ALL = [(lay, e, SHAPES) for lay in range(L) for e in range(E)]


# ---- writers ---------------------------------------------------------------------------------
def stats(seed: int, n_mat: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(in_sum2 [n_mat, cols], counts [n_mat]) with outlier channels, as a calibration gives."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 5000, n_mat).astype(np.float32)
    var = rng.lognormal(0, 1, cols) * np.where(rng.random(cols) < 0.05, 100.0, 1.0)
    return (counts[:, None] * var[None, :] * rng.uniform(0.5, 2, (n_mat, cols))).astype(
        np.float32
    ), counts


def moe_entries(
    d: int = D,
    f: int = F,
    experts: int = E,
    layers: int = L,
    seed: int = 0,
    which: tuple[str, ...] = ("gate", "up", "down"),
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for lay in range(layers):
        for i, t in enumerate(which):
            cols = f if t == "down" else d
            out[f"blk.{lay}.ffn_{t}_exps.weight"] = stats(seed * 100 + lay * 10 + i, experts, cols)
        out[f"blk.{lay}.attn_q.weight"] = stats(seed + 7, 1, d)  # a dense weight: ignored
    return out


def write_gguf(
    path: Path,
    entries: dict[str, tuple[np.ndarray, np.ndarray]],
    *,
    general_type: object = "imatrix",
    datasets: object = ("calibration.txt",),
    chunk_count: object = 10,
    chunk_size: object = 512,
    in_sum: bool = True,
    extra: Sequence[tuple[str, object, object]] = (),
    alignment: int | None = None,
) -> Path:
    """An importance matrix as llama-imatrix writes it (None drops a key; a tuple
    (value, GGUFValueType) writes it with that type; ``extra`` keys follow)."""
    vt = gguf.GGUFValueType
    w = gguf.GGUFWriter(path, "unused")
    w.kv_data[0].pop(gguf.Keys.General.ARCHITECTURE)  # llama-imatrix writes no architecture
    for key, value, vtype in (
        (gguf.Keys.General.TYPE, general_type, vt.STRING),
        (gguf.Keys.IMatrix.DATASETS, datasets, vt.ARRAY),
        (gguf.Keys.IMatrix.CHUNK_COUNT, chunk_count, vt.UINT32),
        (gguf.Keys.IMatrix.CHUNK_SIZE, chunk_size, vt.UINT32),
    ):
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], vt):
            value, vtype = value
        if value is not None:
            w.add_key_value(
                key,
                list(value) if vtype == vt.ARRAY else value,
                vtype,
                sub_type=vt.STRING if vtype == vt.ARRAY else None,
            )
    for key, value, vtype in extra:
        w.add_key_value(key, value, vtype)
    if alignment:
        w.add_custom_alignment(alignment)
    for name, (sums, counts) in sorted(entries.items()):
        w.add_tensor(f"{name}.in_sum2", np.asarray(sums, np.float32))
        c = np.asarray(counts, np.float32)
        w.add_tensor(f"{name}.counts", c.reshape(-1, 1))
        if in_sum:
            w.add_tensor(f"{name}.in_sum", np.asarray(sums, np.float32) / 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def legacy_values(
    sums: np.ndarray, counts: np.ndarray, chunk_size: int = 512
) -> tuple[int, np.ndarray]:
    """(ncall, values) as save_imatrix_legacy computes them, in float32 like llama.cpp."""
    ncall = int((counts.max() + chunk_size - 1) // chunk_size)
    c = np.where(counts == 0, np.float32(1), counts).astype(np.float32)[:, None]
    s = np.where(counts[:, None] == 0, np.float32(1), sums).astype(np.float32)
    return ncall, ((s / c) * np.float32(ncall)).astype(np.float32).ravel()


def dat_bytes(entries: list[tuple[bytes, int, int, bytes]], trailer: bytes = b"") -> bytes:
    out = struct.pack("<i", len(entries))
    for name, ncall, nval, values in entries:
        out += struct.pack("<i", len(name)) + name + struct.pack("<ii", ncall, nval) + values
    return out + trailer


def trailer(chunks: int = 10, dataset: bytes = b"calibration.txt") -> bytes:
    return struct.pack("<ii", chunks, len(dataset)) + dataset


def write_dat(
    path: Path, entries: dict[str, tuple[np.ndarray, np.ndarray]], tail: bytes | None = None
) -> Path:
    """A legacy file in save_imatrix_legacy's layout (sorted names, trailer)."""
    rows = []
    for name, (sums, counts) in sorted(entries.items()):
        ncall, values = legacy_values(sums, counts)
        rows.append((name.encode(), ncall, values.size, values.astype("<f4").tobytes()))
    path.write_bytes(dat_bytes(rows, trailer() if tail is None else tail))
    return path


def tensor_offset(path: Path, name: str) -> int:
    """Where gguf's own reader says a tensor's data is."""
    return next(t.data_offset for t in gguf.GGUFReader(path).tensors if t.name == name)


def patched(path: Path, old: bytes, new: bytes) -> Path:
    data = path.read_bytes()
    assert data.count(old) == 1 and len(old) == len(new)
    path.write_bytes(data.replace(old, new))
    return path


# ---- reading ---------------------------------------------------------------------------------
def test_gguf_importance_is_in_sum2_over_counts(tmp_path: Path) -> None:
    entries = moe_entries()
    entries["blk.1.ffn_down_exps.weight"][1][2] = 0
    path = write_gguf(tmp_path / "imatrix.gguf", entries, datasets=("a.txt", "b.txt"))
    with ImportanceMatrix.open(path) as m:
        assert (m.info.format, m.info.datasets, m.info.chunk_count, m.info.chunk_size) == (
            "gguf",
            ("a.txt", "b.txt"),
            10,
            512,
        )
        assert m.info.entries == 3 * L + L  # expert weights plus the dense attn_q
        for lay, e, _ in ALL:
            for t, cols in zip(("gate", "up", "down"), (D, D, F)):
                got = m.for_expert(lay, e, f"{t}_proj", cols)
                s, c = entries[f"blk.{lay}.ffn_{t}_exps.weight"]
                if lay == 1 and t == "down" and e == 2:
                    assert got is None
                    continue
                assert got.dtype == np.float32 and got.shape == (cols,)
                np.testing.assert_allclose(got, s[e] / c[e], rtol=1e-6)
        assert m.fallbacks == [Fallback(1, 2, "down_proj", NO_COUNT)]
        assert m.check(ALL, n_experts=E) == [Fallback(1, 2, "down_proj", NO_COUNT)]


def test_gguf_offsets_agree_with_gguf_reader(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "imatrix.gguf", moe_entries(), in_sum=True)
    reader = gguf.GGUFReader(path)
    with ImportanceMatrix.open(path) as m:
        for t in reader.tensors:
            if t.name.endswith(".in_sum2"):
                entry = m.entries[t.name.removesuffix(".in_sum2")]
                assert (entry.offset, entry.size) == (t.data_offset, t.n_elements)
            if t.name.endswith(".counts"):
                entry = m.entries[t.name.removesuffix(".counts")]
                np.testing.assert_array_equal(entry.counts, t.data.ravel())


def test_info_hashes_the_whole_file(tmp_path: Path) -> None:
    import hashlib

    import crc32c

    path = write_gguf(tmp_path / "imatrix.gguf", moe_entries())
    data = path.read_bytes()
    with ImportanceMatrix.open(path) as m:
        assert (m.info.size, m.info.crc32c, m.info.sha256) == (
            len(data),
            crc32c.crc32c(data),
            hashlib.sha256(data).hexdigest(),
        )
        assert m.info.as_json()["sha256"] == hashlib.sha256(data).hexdigest()
        assert repr(m) == f"ImportanceMatrix({str(path)!r}, gguf, {2 * 3 + 2} entries)"


def test_legacy_dat_importance_is_value_over_ncall(tmp_path: Path) -> None:
    entries = moe_entries()
    entries["blk.0.ffn_up_exps.weight"][1][3] = 0  # llama.cpp writes 1 * ncall for it
    del entries["blk.1.ffn_gate_exps.weight"]  # entries without any data are left out
    del entries["blk.1.ffn_up_exps.weight"]
    path = write_dat(tmp_path / "imatrix.dat", entries)
    with ImportanceMatrix.open(path) as m:
        assert (m.info.format, m.info.datasets, m.info.chunk_count, m.info.chunk_size) == (
            "dat",
            ("calibration.txt",),
            10,
            None,
        )
        s, c = entries["blk.0.ffn_gate_exps.weight"]
        np.testing.assert_allclose(m.for_expert(0, 1, "gate_proj", D), s[1] / c[1], rtol=1e-5)
        s, c = entries["blk.1.ffn_down_exps.weight"]
        np.testing.assert_allclose(m.for_expert(1, 3, "down_proj", F), s[3] / c[3], rtol=1e-5)
        fallbacks = m.check(ALL, n_experts=E)
    assert fallbacks == [Fallback(0, 3, "up_proj", NO_COUNT)] + [
        Fallback(1, e, t, NO_ENTRY) for e in range(E) for t in ("gate_proj", "up_proj")
    ]
    assert m.fallback_warning(fallbacks, 3 * L * E) == (
        f"{path}: 9 of 24 expert tensors have no importance data (1 count 0, 8 not in the "
        "file); they are quantised unweighted"
    )


@pytest.mark.parametrize(
    "tail",
    [b"", struct.pack("<i", 7), trailer(7, b"")],
    ids=["no trailer", "chunk count only", "empty dataset"],
)
def test_legacy_trailer_is_optional(tmp_path: Path, tail: bytes) -> None:
    path = write_dat(tmp_path / "imatrix.dat", moe_entries(), tail=tail)
    with ImportanceMatrix.open(path) as m:
        assert m.info.datasets == ()
        assert m.info.chunk_count == (7 if tail else None)


def test_legacy_per_expert_names_of_early_2024(tmp_path: Path) -> None:
    rows = []
    for lay in range(L):
        for e in range(E):
            for t, cols in (("gate", D), ("up", D), ("down", F)):
                values = np.full(cols, 2.0 + e, np.float32) * 3
                rows.append((f"blk.{lay}.ffn_{t}.{e}.weight".encode(), 3, cols, values.tobytes()))
    path = tmp_path / "old.dat"
    path.write_bytes(dat_bytes(rows))
    with ImportanceMatrix.open(path) as m:
        np.testing.assert_array_equal(m.for_expert(1, 2, "down_proj", F), np.full(F, 4.0))
        assert m.check(ALL, n_experts=E) == []


def test_legacy_converted_to_gguf_keeps_one_count(tmp_path: Path) -> None:
    """``llama-imatrix --in-file x.dat -o x.gguf`` stores a 3-D weight as one long row."""
    entries = {name: (s.reshape(1, -1), c[:1]) for name, (s, c) in moe_entries().items()}
    path = write_gguf(tmp_path / "converted.gguf", entries)
    with ImportanceMatrix.open(path) as m:
        s, c = entries["blk.0.ffn_down_exps.weight"]
        np.testing.assert_allclose(
            m.for_expert(0, 3, "down_proj", F), s[0, 3 * F : 4 * F] / c[0], rtol=1e-6
        )
        assert m.check(ALL, n_experts=E) == []


def test_gate_and_up_share_their_input(tmp_path: Path) -> None:
    """gate and up read the same activations: one entry, or the fused gate_up, serves both."""
    only_up = moe_entries(which=("up", "down"))
    with ImportanceMatrix.open(write_gguf(tmp_path / "up.gguf", only_up)) as m:
        s, c = only_up["blk.0.ffn_up_exps.weight"]
        np.testing.assert_allclose(m.for_expert(0, 1, "gate_proj", D), s[1] / c[1], rtol=1e-6)
    fused = moe_entries(which=("gate_up", "down"))
    with ImportanceMatrix.open(write_gguf(tmp_path / "fused.gguf", fused)) as m:
        s, c = fused["blk.1.ffn_gate_up_exps.weight"]
        for t in ("gate_proj", "up_proj"):
            np.testing.assert_allclose(m.for_expert(1, 2, t, D), s[2] / c[2], rtol=1e-6)


def test_all_zero_row_falls_back(tmp_path: Path) -> None:
    entries = moe_entries()
    entries["blk.0.ffn_gate_exps.weight"][0][1] = 0
    with ImportanceMatrix.open(write_gguf(tmp_path / "imatrix.gguf", entries)) as m:
        assert m.for_expert(0, 1, "gate_proj", D) is None
        assert m.check(ALL) == [Fallback(0, 1, "gate_proj", ALL_ZERO)]


def test_mapping_onto_a_synthetic_checkpoint(tmp_path: Path) -> None:
    ck = Checkpoint.open(
        write_checkpoint(tmp_path / "model", layers=L, experts=E, d_model=D, ffn=F)
    )
    refs = [(r.layer, r.expert, r.shapes) for r in ck.experts.values()]
    entries = moe_entries()
    for path in (write_gguf(tmp_path / "i.gguf", entries), write_dat(tmp_path / "i.dat", entries)):
        with ImportanceMatrix.open(path) as m:
            assert m.check(refs, n_experts=E) == []
            for ref in ck.experts.values():
                for t, (rows, cols) in zip(("gate", "up", "down"), ref.shapes):
                    s, c = entries[f"blk.{ref.layer}.ffn_{t}_exps.weight"]
                    got = m.for_expert(ref.layer, ref.expert, f"{t}_proj", cols, rows)
                    np.testing.assert_allclose(got, s[ref.expert] / c[ref.expert], rtol=1e-5)


# ---- a matrix of another model ---------------------------------------------------------------
def test_wrong_width_is_refused_naming_both_shapes(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "imatrix.gguf", moe_entries(d=48))
    with ImportanceMatrix.open(path) as m, pytest.raises(SmoeError) as e:
        m.check(ALL)
    assert str(e.value) == (
        f"{path}: tensor 'blk.0.ffn_gate_exps.weight.in_sum2' is [4, 48] (4 experts x 48 input "
        "channels), but layer 0 expert 0 gate_proj is [32, 64] (64 input channels): an "
        "importance matrix of another model?"
    )


def test_wrong_expert_count_is_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "imatrix.gguf", moe_entries(experts=2))
    with ImportanceMatrix.open(path) as m:
        with pytest.raises(SmoeError) as e:
            m.check(ALL, n_experts=E)
        assert str(e.value) == (
            f"{path}: tensor 'blk.0.ffn_gate_exps.weight.in_sum2' covers 2 experts of 64 input "
            "channels, but the checkpoint has 4 experts per layer: an importance matrix of "
            "another model?"
        )
        with pytest.raises(SmoeError) as e:
            m.for_expert(1, 3, "down_proj", F)
        assert str(e.value) == (
            f"{path}: tensor 'blk.1.ffn_down_exps.weight.in_sum2' covers 2 experts, but the "
            "checkpoint has layer 1 expert 3: an importance matrix of another model?"
        )


def test_legacy_values_that_are_not_whole_rows_are_refused(tmp_path: Path) -> None:
    path = write_dat(tmp_path / "imatrix.dat", moe_entries(f=20))
    with ImportanceMatrix.open(path) as m, pytest.raises(SmoeError) as e:
        m.for_expert(0, 0, "down_proj", F, rows=D)
    assert str(e.value) == (
        f"{path}: legacy entry 'blk.0.ffn_down_exps.weight' holds 80 values, not whole rows of "
        "32, but layer 0 expert 0 down_proj is [64, 32] (32 input channels): an importance "
        "matrix of another model?"
    )
    # 4 experts x 24 channels are 3 rows of 32: only the expert count tells
    path = write_dat(tmp_path / "imatrix.dat", moe_entries(f=24))
    with ImportanceMatrix.open(path) as m, pytest.raises(SmoeError) as e:
        m.check(ALL, n_experts=E)
    assert str(e.value) == (
        f"{path}: legacy entry 'blk.0.ffn_down_exps.weight' covers 3 experts of 32 input "
        "channels, but the checkpoint has 4 experts per layer: an importance matrix of another "
        "model?"
    )


def test_a_dense_models_matrix_is_refused(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "dense.gguf",
        {f"blk.{lay}.ffn_{t}.weight": stats(lay, 1, D) for lay in range(L) for t in ("gate", "up")},
    )
    with ImportanceMatrix.open(path) as m, pytest.raises(SmoeError) as e:
        m.check(ALL)
    assert str(e.value) == (
        f"{path}: has no entry for any routed-expert tensor of this model "
        "(blk.L.ffn_gate_exps.weight, ffn_up_exps, ffn_down_exps): an importance matrix of "
        "another model, or of a dense one?"
    )


def test_a_file_changed_after_opening_is_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "imatrix.gguf", moe_entries())
    with ImportanceMatrix.open(path) as m:
        with open(path, "r+b") as f:
            f.seek(0, os.SEEK_END)
            f.write(b"\0" * 32)
        with pytest.raises(SmoeError) as e:
            m.for_expert(0, 0, "gate_proj", D)
    assert str(e.value) == (
        f"{path}: changed while smoe was reading it (size or modification "
        "time differ from when it was opened)"
    )


# ---- not an importance matrix ----------------------------------------------------------------
def test_fifo_and_folder_are_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "imatrix.gguf"
    os.mkfifo(fifo)
    with pytest.raises(NotRegular) as e:
        ImportanceMatrix.open(fifo)
    assert str(e.value) == f"{fifo}: not a regular file (a FIFO)"
    with pytest.raises(NotRegular) as e:
        ImportanceMatrix.open(tmp_path)
    assert str(e.value) == f"{tmp_path}: not a regular file (a folder)"


def test_without_the_gguf_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_gguf(tmp_path / "imatrix.gguf", moe_entries())
    monkeypatch.setitem(sys.modules, "gguf", None)
    assert refused(partial(ImportanceMatrix.open, path)) == (
        f"{path}: a GGUF importance matrix is read with the gguf package: "
        "pip install 'smoe[imatrix]'"
    )


def test_the_merged_expert_names_are_gguf_s() -> None:
    mt, names = gguf.MODEL_TENSOR, gguf.TENSOR_NAMES
    kinds = {"gate": mt.FFN_GATE_EXP, "gate_up": mt.FFN_GATE_UP_EXP, "up": mt.FFN_UP_EXP,
             "down": mt.FFN_DOWN_EXP}  # fmt: skip
    ours = {n for order in MERGED_EXPERTS.values() for n in order}
    assert ours == {names[t].replace("{bid}", "{L}") for t in kinds.values()}


def test_a_legacy_dat_file_needs_no_gguf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)
    with ImportanceMatrix.open(ROOT / "fixtures" / "imatrix_tiny.dat") as imatrix:
        assert (imatrix.info.format, imatrix.info.entries) == ("dat", 1)


def gguf_case(tmp_path: Path, **kw: object) -> Path:
    return write_gguf(tmp_path / "imatrix.gguf", moe_entries(), **kw)


def test_gguf_header_refusals(tmp_path: Path) -> None:
    vt = gguf.GGUFValueType
    p = gguf_case(tmp_path, general_type="model")
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: not a llama.cpp importance matrix: general.type at offset 24 is 'model', "
        "expected 'imatrix' (a GGUF model is not an importance matrix; llama-imatrix "
        "makes one)"
    )
    p = gguf_case(tmp_path, general_type=None)
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: not a llama.cpp importance matrix: no general.type key (llama-imatrix "
        "writes general.type = imatrix)"
    )
    p = gguf_case(tmp_path, general_type=(7, vt.UINT32))
    assert (
        refused(partial(ImportanceMatrix.open, p))
        == f"{p}: key general.type at offset 24 is UINT32, expected a STRING"
    )
    p = gguf_case(tmp_path, chunk_count=None)
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: has no imatrix.chunk_count key (llama-imatrix writes imatrix.datasets, "
        "imatrix.chunk_count and imatrix.chunk_size; llama-quantize refuses a file "
        "without them)"
    )
    p = gguf_case(tmp_path, chunk_size=(512, vt.INT32))
    at = tensor_info_offset(p, 0, "imatrix.chunk_size")
    assert (
        refused(partial(ImportanceMatrix.open, p))
        == f"{p}: key imatrix.chunk_size at offset {at} is INT32, expected UINT32"
    )
    p = gguf_case(tmp_path, datasets=("x", vt.STRING))
    at = tensor_info_offset(p, 0, "imatrix.datasets")
    assert (
        refused(partial(ImportanceMatrix.open, p))
        == f"{p}: key imatrix.datasets at offset {at} is STRING, expected an array of STRING"
    )


def test_gguf_version_and_counts_refusals(tmp_path: Path) -> None:
    p = gguf_case(tmp_path)
    data = bytearray(p.read_bytes())
    for version, message in (
        (1, "GGUF version 1 at offset 4; llama.cpp and smoe read versions 2 and 3"),
        (
            3 << 24,
            "GGUF version at offset 4 reads 0x3000000: a big-endian "
            "file; only little-endian GGUF is read",
        ),
    ):
        data[4:8] = struct.pack("<I", version)
        p.write_bytes(data)
        assert refused(partial(ImportanceMatrix.open, p)) == f"{p}: {message}"
    data[4:8] = struct.pack("<I", 3)
    data[8:16] = struct.pack("<Q", 1 << 40)
    p.write_bytes(data)
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: {1 << 40} tensors (count at offset 8) and 4 key-values (count at offset "
        f"16) cannot fit in {len(data)} bytes"
    )


def test_gguf_truncated_or_padded_is_refused(tmp_path: Path) -> None:
    p = gguf_case(tmp_path)
    data = p.read_bytes()
    p.write_bytes(data[:-40])
    with pytest.raises(
        SmoeError,
        match=r"tensor data runs from offset \d+ to "
        f"{len(data)}, beyond the end of the file \\({len(data) - 40} bytes; "
        r"truncated\?\)$",
    ):
        ImportanceMatrix.open(p)
    p.write_bytes(data + b"\0" * 5)
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: 5 bytes at offset {len(data)} after the last tensor "
        "('blk.1.ffn_up_exps.weight.in_sum') belong to no tensor"
    )
    at = tensor_info_offset(p, 0, "blk.1.attn_q.weight.in_sum2")
    p.write_bytes(data[: at + 5])
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: tensor 12 name length at offset {at} needs 8 bytes, but the file ends at "
        f"offset {at + 5} (truncated?)"
    )
    p.write_bytes(data[:30])
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: 24 tensors (count at offset 8) and 4 key-values (count at offset 16) "
        "cannot fit in 30 bytes"
    )


def test_gguf_duplicates_are_refused(tmp_path: Path) -> None:
    p = gguf_case(tmp_path, extra=[("imatrix.chunk_sizX", 1, gguf.GGUFValueType.UINT32)])
    p = patched(p, b"imatrix.chunk_sizX", b"imatrix.chunk_size")
    first, again = (tensor_info_offset(p, i, "imatrix.chunk_size") for i in (0, 1))
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: key 'imatrix.chunk_size' at offset {again} appears twice (first at offset {first})"
    )
    entries = moe_entries()
    entries["blk.0.ffn_gate_exps.weigh2"] = entries["blk.0.ffn_gate_exps.weight"]
    p = write_gguf(tmp_path / "dup.gguf", entries, in_sum=False)
    p = patched(p, b"blk.0.ffn_gate_exps.weigh2.in_sum2", b"blk.0.ffn_gate_exps.weight.in_sum2")
    first, again = (tensor_info_offset(p, i, "blk.0.ffn_gate_exps.weight.in_sum2") for i in (0, 1))
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: tensor 'blk.0.ffn_gate_exps.weight.in_sum2' at offset {again} appears "
        f"twice (first at offset {first})"
    )


def tensor_info_offset(path: Path, nth: int, name: str) -> int:
    """Offset of the ``nth`` GGUF string ``name`` (a key or a tensor info) in the file."""
    data = path.read_bytes()
    key = struct.pack("<Q", len(name)) + name.encode()
    at = -1
    for _ in range(nth + 1):
        at = data.index(key, at + 1)
    return at


def test_gguf_entry_refusals(tmp_path: Path) -> None:
    entries = moe_entries()
    p = write_gguf(tmp_path / "a.gguf", entries, in_sum=False)
    p = patched(p, b"blk.1.ffn_up_exps.weight.counts", b"blk.1.ffn_up_exps.weight.countz")
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: tensor 'blk.1.ffn_up_exps.weight.in_sum2' has no "
        "'blk.1.ffn_up_exps.weight.counts' beside it (llama-imatrix writes in_sum2 and "
        "counts per weight)"
    )

    bad = {
        k: (s, c.astype(np.float16)) if k.startswith("blk.0.ffn_down") else (s, c)
        for k, (s, c) in moe_entries().items()
    }
    p = tmp_path / "b.gguf"
    w = gguf.GGUFWriter(p, "x")
    w.add_type("imatrix")
    w.add_array(gguf.Keys.IMatrix.DATASETS, ["c.txt"])
    w.add_uint32(gguf.Keys.IMatrix.CHUNK_COUNT, 1)
    w.add_uint32(gguf.Keys.IMatrix.CHUNK_SIZE, 512)
    for name, (s, c) in sorted(bad.items()):
        w.add_tensor(f"{name}.in_sum2", s)
        w.add_tensor(f"{name}.counts", c.reshape(-1, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    at = tensor_info_offset(p, 0, "blk.0.ffn_down_exps.weight.counts")
    assert (
        refused(partial(ImportanceMatrix.open, p))
        == f"{p}: tensor 'blk.0.ffn_down_exps.weight.counts' at offset {at} is F16, expected F32"
    )

    entries = moe_entries()
    entries["blk.0.ffn_down_exps.weight"] = (
        entries["blk.0.ffn_down_exps.weight"][0],
        np.ones(3, np.float32),
    )
    p = write_gguf(tmp_path / "c.gguf", entries)
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: tensor 'blk.0.ffn_down_exps.weight.in_sum2' has ne [32, 4] but "
        "'blk.0.ffn_down_exps.weight.counts' holds 3 counts (in_sum2 is [values per "
        "matrix, matrices], one count per matrix)"
    )


@pytest.mark.parametrize(("count", "shown"), [(-3.0, "-3.0"), (2.5, "2.5"), (math.inf, "inf")])
def test_gguf_counts_must_be_whole_and_not_negative(
    tmp_path: Path, count: float, shown: str
) -> None:
    entries = moe_entries()
    entries["blk.1.ffn_gate_exps.weight"][1][2] = count
    p = write_gguf(tmp_path / "imatrix.gguf", entries)
    at = tensor_offset(p, "blk.1.ffn_gate_exps.weight.counts") + 8
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: tensor 'blk.1.ffn_gate_exps.weight.counts' holds {shown} at offset {at} "
        "(matrix 2): counts are whole numbers >= 0"
    )


@pytest.mark.parametrize(
    ("value", "why"), [(math.nan, "not finite"), (-math.inf, "not finite"), (-1.5, "negative")]
)
def test_gguf_sums_must_be_finite_and_not_negative(tmp_path: Path, value: float, why: str) -> None:
    entries = moe_entries()
    entries["blk.1.ffn_up_exps.weight"][0][3, 5] = value
    p = write_gguf(tmp_path / "imatrix.gguf", entries)
    at = tensor_offset(p, "blk.1.ffn_up_exps.weight.in_sum2") + 4 * (3 * D + 5)
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: tensor 'blk.1.ffn_up_exps.weight.in_sum2' holds {value!r} at offset {at} "
        f"(expert 3, channel 5): a sum of squares is finite and >= 0, this one is {why}"
    )


def test_gguf_positive_infinity_is_refused(tmp_path: Path) -> None:
    entries = moe_entries()
    entries["blk.0.ffn_down_exps.weight"][0][2, 7] = math.inf
    p = write_gguf(tmp_path / "imatrix.gguf", entries)
    at = tensor_offset(p, "blk.0.ffn_down_exps.weight.in_sum2") + 4 * (2 * F + 7)
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: tensor 'blk.0.ffn_down_exps.weight.in_sum2' holds inf at offset {at} "
        "(expert 2, channel 7): a sum of squares is finite and >= 0, this one is not finite"
    )


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (math.nan, "not finite"),
        (math.inf, "not finite"),
        (-math.inf, "not finite"),
        (-0.5, "negative"),
    ],
)
def test_legacy_sums_must_be_finite_and_not_negative(
    tmp_path: Path, value: float, why: str
) -> None:
    p = tmp_path / "imatrix.dat"
    values = np.array([1, 2, value, 3], "<f4").tobytes()
    p.write_bytes(dat_bytes([(b"blk.0.ffn_down_exps.weight", 2, 4, values)]))
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: legacy entry 'blk.0.ffn_down_exps.weight' holds {value!r} at offset 50 "
        f"(value 2): a sum of squares is finite and >= 0, this one is {why}"
    )


# ---- the range bound: entries below 1e-10 of their tensor's largest are raised -----------------
def absurd_entries(low: float = 1e-30) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Issue 23 case 8: in every expert tensor channel 3 is 3e38, every other ``low``."""
    out = {}
    for name, (sums, counts) in moe_entries().items():
        sums = np.full_like(sums, low)
        sums[:, 3] = 3e38
        out[name] = (sums, np.ones_like(counts))
    return out


RAISED_ALL = (
    "24 of 24 expert tensors have importance spanning more than 1e10 (largest / smallest "
    "entry; widest: layer 0 expert 0 gate_proj, 3e+38 / {low}); their entries below 1e-10 "
    "of their largest are raised to that"
)


@pytest.mark.parametrize("form", ["gguf", "dat"])
@pytest.mark.parametrize(("low", "shown"), [(1e-30, "1e-30"), (0.0, "0")])
def test_an_absurd_range_is_raised_to_the_bound_with_one_warning(
    tmp_path: Path, form: str, low: float, shown: str
) -> None:
    entries = absurd_entries(low)
    writer = write_gguf if form == "gguf" else write_dat
    path = writer(tmp_path / f"imatrix.{form}", entries)
    top = float(np.float32(3e38))
    with ImportanceMatrix.open(path) as m:
        assert m.check(ALL, n_experts=E) == []
        assert len(m.raised) == 3 * L * E
        assert m.raised[0] == Raised(0, 0, "gate_proj", top, float(np.float32(low)))
        assert m.warning([], 3 * L * E) == f"{path}: " + RAISED_ALL.format(low=shown)
        assert m.fallback_warning([], 3 * L * E) is None  # nothing is quantised unweighted
        for lay, e, _ in ALL:
            for t, cols in (("gate_proj", D), ("up_proj", D), ("down_proj", F)):
                got = m.for_expert(lay, e, t, cols)
                want = np.full(cols, np.float32(top / RANGE_BOUND))
                want[3] = np.float32(top)
                np.testing.assert_array_equal(got, want)
                assert got.min() > 0 and got.max() / got.min() <= RANGE_BOUND * (1 + 1e-6)
        # with fallbacks too: still one line, the file named once
        fallbacks = [Fallback(1, 0, "up_proj", NO_COUNT)]
        assert m.warning(fallbacks, 3 * L * E) == (
            f"{path}: 1 of 24 expert tensors have no importance data (1 count 0); they are "
            "quantised unweighted; " + RAISED_ALL.format(low=shown)
        )


def test_a_range_of_the_bound_is_kept_as_it_is(tmp_path: Path) -> None:
    entries = moe_entries()
    sums, counts = entries["blk.0.ffn_up_exps.weight"]
    sums[1] = 1.0  # 1e10 exactly (both exact in float32): within the bound
    sums[1, 9] = 1e10
    counts[1] = 1
    sums[2] = 1.0  # just beyond it
    sums[2, 9] = 2e10
    sums[2, 10] = 1.5
    counts[2] = 1
    path = write_gguf(tmp_path / "imatrix.gguf", entries)
    with ImportanceMatrix.open(path) as m:
        assert m.check(ALL, n_experts=E) == []
        assert m.raised == [Raised(0, 2, "up_proj", 2e10, 1.0)]
        assert m.warning([], 3 * L * E) == (
            f"{path}: 1 of 24 expert tensors have importance spanning more than 1e10 (largest / "
            "smallest entry; widest: layer 0 expert 2 up_proj, 2e+10 / 1); their entries below "
            "1e-10 of their largest are raised to that"
        )
        np.testing.assert_array_equal(m.for_expert(0, 1, "up_proj", D), sums[1])
        raised = m.for_expert(0, 2, "up_proj", D)
        assert (raised[9], raised[10], raised[0]) == (2e10, 2.0, 2.0)  # 1.5 too: below 2
    with ImportanceMatrix.open(write_gguf(tmp_path / "real.gguf", moe_entries())) as m:
        m.check(ALL, n_experts=E)
        assert m.raised == []  # lognormal channels with 100x outliers: far inside the bound


def test_importance_below_float32s_range_keeps_its_ratios(tmp_path: Path) -> None:
    """A row whose floor would underflow float32 is scaled by a power of two: no entry
    becomes 0, the ratios stay."""
    entries = moe_entries()
    sums, counts = entries["blk.1.ffn_down_exps.weight"]
    sums[0] = 1e-40  # subnormal float32
    sums[0, 5] = 1e-36
    counts[0] = 4
    with ImportanceMatrix.open(write_gguf(tmp_path / "imatrix.gguf", entries)) as m:
        assert m.check(ALL, n_experts=E) == [] and m.raised == []
        got = m.for_expert(1, 0, "down_proj", F).astype(np.float64)
        want = sums[0].astype(np.float64)
        assert got.min() > 0
        np.testing.assert_allclose(got / got[5], want / want[5], rtol=1e-6)


# ---- legacy refusals -------------------------------------------------------------------------
def test_legacy_refusals(tmp_path: Path) -> None:
    p = tmp_path / "imatrix.dat"
    one = (b"blk.0.ffn_down_exps.weight", 2, 4, np.ones(4, "<f4").tobytes())
    cases = [
        (b"\x01\x02", f"{p}: 2 bytes, too short for an importance matrix"),
        (
            b"not an imatrix at all, just text\n",
            f"{p}: not a llama.cpp importance matrix: no GGUF magic, and as a legacy .dat file its "
            f"entry count {struct.unpack('<i', b'not ')[0]} at offset 0 cannot fit in 33 bytes",
        ),
        (
            struct.pack("<i", 0) + b"\0" * 20,
            f"{p}: not a llama.cpp importance matrix: no GGUF magic, and as a legacy .dat file its "
            "entry count 0 at offset 0 is not positive",
        ),
        (
            dat_bytes([one])[:4] + struct.pack("<i", 999) + dat_bytes([one])[8:],
            f"{p}: legacy entry 0 at offset 4 has a name length of 999; 42 bytes are left for the "
            "name and values (not an importance matrix?)",
        ),
        (
            dat_bytes([(one[0], -1, 4, one[3])]),
            f"{p}: legacy entry 0 ('blk.0.ffn_down_exps.weight') has ncall -1 at offset 34; it "
            "counts chunks, >= 0",
        ),
        (
            dat_bytes([(one[0], 2, 5, one[3])]),
            f"{p}: legacy entry 0 ('blk.0.ffn_down_exps.weight') has nval 5 at offset 38; 16 bytes "
            "are left for its values",
        ),
        (
            dat_bytes([one, one]),
            f"{p}: legacy entry 1 at offset 58 names 'blk.0.ffn_down_exps.weight' again (first at "
            "offset 4)",
        ),
        (
            dat_bytes([(b"\xffbad", 2, 4, one[3])]),
            f"{p}: legacy entry 0 at offset 4 has a name that is not valid UTF-8 (byte 0xff at "
            "offset 8)",
        ),
        (
            dat_bytes([one], b"\0\0"),
            f"{p}: 2 bytes at offset 58 after the last entry are too few for the chunk count (4 "
            "bytes; truncated?)",
        ),
        (dat_bytes([one], struct.pack("<i", -4)), f"{p}: chunk count -4 at offset 58 is negative"),
        (
            dat_bytes([one], struct.pack("<ii", 1, 50) + b"x"),
            f"{p}: dataset name length 50 at offset 62; 1 bytes are left",
        ),
        (
            dat_bytes([one], trailer(1, b"c.txt") + b"junk"),
            f"{p}: 4 bytes at offset 71 after the dataset name belong to nothing",
        ),
        (
            dat_bytes([(one[0], 2, 4, np.array([1, 2, -0.5, 3], "<f4").tobytes())]),
            f"{p}: legacy entry 'blk.0.ffn_down_exps.weight' holds -0.5 at offset 50 (value 2): a "
            "sum of squares is finite and >= 0, this one is negative",
        ),
    ]
    for data, message in cases:
        p.write_bytes(data)
        assert refused(partial(ImportanceMatrix.open, p)) == message


# ---- robustness: every cut and every flipped header byte gives one clean line -----------------
def open_or_refuse(path: Path) -> None:
    try:
        ImportanceMatrix.open(path).close()
    except SmoeError as e:
        assert "\n" not in str(e) and str(e).startswith(f"{path}: ")


def test_every_truncation_is_refused(tmp_path: Path) -> None:
    small = moe_entries(d=8, f=4, experts=2, layers=1)
    for name, source in (
        ("i.gguf", write_gguf(tmp_path / "src.gguf", small)),
        ("i.dat", write_dat(tmp_path / "src.dat", small)),
    ):
        data = source.read_bytes()
        p = tmp_path / name
        # a legacy file may end after its entries or after its chunk count
        valid = (
            {len(data) - len(trailer()), len(data) - len(trailer()) + 4}
            if name == "i.dat"
            else set()
        )
        header = (
            tensor_offset(source, "blk.0.attn_q.weight.in_sum2") if name == "i.gguf" else len(data)
        )
        for cut in [*range(header), *range(header, len(data), 7)]:
            p.write_bytes(data[:cut])
            if cut in valid:
                ImportanceMatrix.open(p).close()
                continue
            with pytest.raises(SmoeError):
                ImportanceMatrix.open(p)


def test_flipped_header_bytes_never_escape_as_other_errors(tmp_path: Path) -> None:
    small = moe_entries(d=8, f=4, experts=2, layers=1)
    for name, source in (
        ("i.gguf", write_gguf(tmp_path / "src.gguf", small, in_sum=False)),
        ("i.dat", write_dat(tmp_path / "src.dat", small)),
    ):
        data = source.read_bytes()
        end = tensor_offset(source, "blk.0.attn_q.weight.in_sum2") if name == "i.gguf" else 200
        p = tmp_path / name
        for i in range(min(end, len(data))):
            for flip in (0x01, 0x80, 0xFF):
                mutated = bytearray(data)
                mutated[i] ^= flip
                p.write_bytes(mutated)
                open_or_refuse(p)


def test_gguf_tensor_info_refusals(tmp_path: Path) -> None:
    name = "blk.0.ffn_down_exps.weight.counts"
    source = gguf_case(tmp_path)
    data = source.read_bytes()
    at = tensor_info_offset(source, 0, name)
    dims = at + 8 + len(name)  # u32 n_dims, u64 ne[2], u32 type, u64 offset
    offset = struct.unpack_from("<Q", data, dims + 4 + 16 + 4)[0]
    cases = [
        (
            dims,
            struct.pack("<I", 5),
            f"tensor {name!r} at offset {at} has 5 dimensions (at most 4)",
        ),
        (
            dims + 20,
            struct.pack("<I", 99),
            f"tensor {name!r} at offset {at} has unknown ggml type 99",
        ),
        (
            dims + 20,
            struct.pack("<I", gguf.GGMLQuantizationType.Q4_0),
            f"tensor {name!r} at offset {at} has rows of 1 elements, not a multiple of Q4_0's "
            "block of 32",
        ),
        (
            dims + 24,
            struct.pack("<Q", offset + 32),
            f"tensor {name!r} at offset {at} has data offset {offset + 32}, expected {offset} "
            "(tensors follow each other, each padded to 32 bytes)",
        ),
    ]
    p = tmp_path / "bad.gguf"
    for where, new, message in cases:
        mutated = bytearray(data)
        mutated[where : where + len(new)] = new
        p.write_bytes(mutated)
        assert refused(partial(ImportanceMatrix.open, p)) == f"{p}: {message}"


def test_gguf_alignment_and_empty_file_refusals(tmp_path: Path) -> None:
    vt = gguf.GGUFValueType
    p = gguf_case(tmp_path, extra=[("general.alignment", 48, vt.UINT32)])
    at = tensor_info_offset(p, 0, "general.alignment")
    assert (
        refused(partial(ImportanceMatrix.open, p))
        == f"{p}: key general.alignment at offset {at} is 48, not a power of two"
    )
    p = gguf_case(tmp_path, extra=[("general.alignment", 64, vt.UINT64)])
    assert (
        refused(partial(ImportanceMatrix.open, p))
        == f"{p}: key general.alignment at offset {at} is UINT64, expected UINT32"
    )
    p = write_gguf(tmp_path / "empty.gguf", {})
    assert refused(partial(ImportanceMatrix.open, p)) == (
        f"{p}: holds no tensors (an importance matrix has an in_sum2 and a counts tensor "
        "per weight)"
    )
    with ImportanceMatrix.open(gguf_case(tmp_path, alignment=64)) as m:
        assert m.entries["blk.1.ffn_up_exps.weight"].offset % 64 == 0
