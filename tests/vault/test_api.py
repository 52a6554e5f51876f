"""The numpy-style Python API of the reader: ``Vault`` as a mapping of experts, tensors as
arrays (the docstring examples run in tests/package/test_docstrings.py)."""

from __future__ import annotations

import errno
import importlib
import importlib.util
import json
import os
import pickle
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import DTypeLike

from smoe import quant
from smoe.cli.failures import describe
from smoe.errors import RefusedInput, SmoeError
from smoe.format import view
from smoe.plumbing import fileio
from smoe.vault import reader
from smoe.vault.reader import ExpertView, TensorView, Vault

from fixtures_data import FIXTURES
from helpers import one_line, python, run

Q4 = FIXTURES / "q4_v2.smoe"
MODULES = (reader, view)


# ---- the vault as a mapping of experts -----------------------------------------------------
def test_package_exports_the_vault() -> None:
    from smoe import Vault as exported

    assert exported is Vault


def test_with_block_closes_and_lookups_survive_close() -> None:
    with Vault.open(Q4) as v:
        assert not v.closed
        gate = v[0, 1]["gate_proj"]
    assert v.closed
    assert len(v) == 8 and (0, 1) in v and v.index(0, 1) == 1
    assert np.asarray(gate).shape == (32, 64)  # bytes read before close stay usable
    with pytest.raises(
        SmoeError,
        match=r"q4_v2\.smoe: cannot read \d+ bytes at offset "
        r"\d+: the file is closed$",
    ):
        v[0, 2]
    v.close()  # a second close is harmless
    assert v.closed


def test_close_without_with() -> None:
    v = Vault.open(Q4)
    assert isinstance(v.data, view.FileView)
    fd = v.data.fd
    v.close()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_in_memory_vault_has_nothing_to_close() -> None:
    v = Vault.from_array(np.fromfile(Q4, np.uint8))
    v.close()
    assert not v.closed
    assert np.array_equal(
        np.asarray(v[1, 2]["up_proj"]), Vault.open(Q4)[1, 2]["up_proj"].dequantize()
    )


def test_getitem_is_expert() -> None:
    with Vault.open(Q4) as v:
        for key in v:
            a, b = v[key], v.expert(*key)
            assert isinstance(a, ExpertView)
            assert (a.layer_id, a.expert_id, a.index) == (*key, v.index(*key))
            for ta, tb in zip(a.tensors, b.tensors):
                assert ta.name == tb.name and ta.shape == tb.shape
                assert np.array_equal(ta.packed, tb.packed)
                assert np.array_equal(ta.scales, tb.scales)
        assert v[np.int64(1), np.uint32(3)].expert_id == 3  # numpy integers are ids too


@pytest.mark.parametrize("key", [(0, 4), (2, 0), (-1, 0), (0, -1), (0, 1 << 32), (1 << 32, 0)])
def test_unknown_expert_is_a_key_error(key: tuple[int, int]) -> None:
    with Vault.open(Q4) as v:
        with pytest.raises(
            KeyError,
            match=rf"q4_v2\.smoe: no expert \(layer {key[0]}, "
            rf"expert {key[1]}\)",
        ):
            v[key]
        with pytest.raises(KeyError):
            v.expert(*key)
        assert key not in v


def test_expert_ids_do_not_alias_across_the_u32_boundary() -> None:
    # layer and expert share one 64-bit lookup key: (0, 2**32) must not find (1, 0)
    with Vault.open(Q4) as v:
        assert (1, 0) in v and (0, 1 << 32) not in v


@pytest.mark.parametrize("key", [0, "gate_proj", (0,), (0, 1, 2), slice(None)])
def test_key_that_is_not_a_pair_is_a_type_error(key: object) -> None:
    with Vault.open(Q4) as v:
        with pytest.raises(TypeError, match=r"indexed by \(layer, expert\), e\.g\. vault\[0, 1\]"):
            v[key]  # type: ignore[index]
        assert key not in v


def test_non_integer_ids_are_a_type_error() -> None:
    with Vault.open(Q4) as v:
        with pytest.raises(TypeError):
            v[0, 1.0]  # type: ignore[index]
        assert (0, 1.0) not in v


def test_unknown_tensor_name_is_a_key_error() -> None:
    with Vault.open(Q4) as v:
        e = v[1, 0]
    with pytest.raises(KeyError) as info:
        e["gate"]
    assert not isinstance(info.value, ValueError)
    assert info.value.args[0] == (
        "no tensor 'gate' in expert (layer 1, expert 0); it has gate_proj, up_proj, down_proj"
    )
    assert "gate" not in e and "gate_proj" in e


def test_iteration_len_keys_items_layers() -> None:
    with Vault.open(Q4) as v:
        want = [(layer, expert) for layer in (0, 1) for expert in range(4)]
        assert len(v) == 8 and list(v) == want and v.keys() == want
        assert v.layers() == {0: 4, 1: 4}
        items = v.items()
        first_key, first = next(items)  # lazy: one expert read per step
        assert first_key == (0, 0) and first.index == 0
        rest = list(items)
        assert [k for k, _ in rest] == want[1:]
        assert all(e.index == i for i, (_, e) in enumerate(rest, 1))
        e = v[1, 1]
    assert tuple(e) == e.keys() == ("gate_proj", "up_proj", "down_proj") and len(e) == 3


def test_reprs_are_one_line_and_show_no_bytes() -> None:
    with Vault.open(Q4) as v:
        assert repr(v) == "Vault('" + str(Q4) + "', v2, Q4, 8 experts in 2 layers)"
        e = v[0, 2]
    assert repr(e) == (
        "ExpertView(layer 0, expert 2: gate_proj 32x64, up_proj 32x64, down_proj 64x32, Q4)"
    )
    assert repr(e["down_proj"]) == "TensorView('down_proj', 64x32, Q4)"


# ---- tensors as arrays ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def tensors() -> list[TensorView]:
    with Vault.open(FIXTURES / "partial_groups.smoe") as v:  # partial groups, odd shapes
        q4 = [t for _, e in v.items() for t in e.tensors]
    with Vault.open(FIXTURES / "q2_v2.smoe") as v:
        q2 = list(v[v.keys()[-1]].tensors)
    return q4 + q2


def test_asarray_is_the_dequantised_array(tensors: list[TensorView]) -> None:
    for t in tensors:
        ref = quant.decode(np.array(t.packed), np.array(t.scales), t.bits, (t.rows, t.cols))
        w = np.asarray(t)
        assert w.dtype == np.float32 and w.shape == t.shape == (t.rows, t.cols)
        assert np.array_equal(w, ref) and np.array_equal(t.dequantize(), ref)
        assert np.array_equal(np.array(t, copy=True), ref)
        assert w.flags.writeable and not np.shares_memory(w, t.packed)


def test_float_dtypes_are_cast_from_float32(tensors: list[TensorView]) -> None:
    t = tensors[0]
    w = t.dequantize()
    for dtype in (np.float16, "float16", np.dtype("<f8"), "float64", np.float32, "f4"):
        got = t.dequantize(dtype=dtype)
        assert got.dtype == np.dtype(dtype) and np.array_equal(got, w.astype(dtype))
        assert np.array_equal(np.asarray(t, dtype=dtype), got)
    halves = t.dequantize(np.float16)
    assert np.isfinite(halves).all()  # |w| <= fp16 scale: float16 never overflows
    per_expert = ExpertView(0, 0, 0, (t, t, t)).dequantize(dtype="float64")
    assert all(a.dtype == np.float64 for a in per_expert.values())


@pytest.mark.parametrize(
    "dtype", [np.int8, "int32", np.uint8, bool, np.complex64, object, "U4", "V2", "datetime64[s]"]
)
def test_non_float_dtypes_are_refused(tensors: list[TensorView], dtype: DTypeLike) -> None:
    if importlib.util.find_spec("ml_dtypes") is not None:  # loaded, whatever ran before:
        importlib.import_module("ml_dtypes")  # it registers float types of its own
    t = tensors[0]
    with pytest.raises(
        TypeError,
        match=r"^cannot dequantize to .*: not a float dtype "
        r"\(float16, float32, float64, or bfloat16 with "
        r"ml_dtypes installed\)$",
    ):
        t.dequantize(dtype)
    with pytest.raises(TypeError, match="not a float dtype"):
        np.asarray(t, dtype=dtype)
    with pytest.raises(TypeError, match="not a float dtype"):
        ExpertView(0, 0, 0, (t, t, t)).dequantize(dtype)


def test_things_that_are_not_dtypes_are_refused(tensors: list[TensorView]) -> None:
    with pytest.raises(TypeError, match=r"^cannot dequantize to 'float17': not a dtype"):
        tensors[0].dequantize("float17")
    with pytest.raises(TypeError, match=r"^cannot dequantize to 3\.5: not a dtype"):
        tensors[0].dequantize(3.5)  # type: ignore[arg-type]


def test_copy_false_cannot_be_honoured(tensors: list[TensorView]) -> None:
    t = tensors[0]
    with pytest.raises(ValueError, match="decoding always makes one"):
        t.__array__(copy=False)
    assert np.array_equal(t.__array__(copy=True), t.__array__(np.float32, None))


def test_bfloat16_with_ml_dtypes(tensors: list[TensorView]) -> None:
    ml_dtypes = pytest.importorskip(
        "ml_dtypes", reason="ml_dtypes is not installed (optional, for bfloat16)"
    )
    t = tensors[1]
    w = t.dequantize()
    for dtype in ("bfloat16", ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16)):
        got = t.dequantize(dtype)
        assert got.dtype == ml_dtypes.bfloat16
        assert np.array_equal(got.view(np.uint16), w.astype(ml_dtypes.bfloat16).view(np.uint16))
        assert np.asarray(t, dtype=dtype).dtype == ml_dtypes.bfloat16
    assert t.dequantize("float8_e4m3fn").dtype == ml_dtypes.float8_e4m3fn
    with pytest.raises(TypeError, match=r"^cannot dequantize to int4: not a float dtype"):
        t.dequantize(ml_dtypes.int4)


def test_bfloat16_without_ml_dtypes_names_the_package() -> None:
    # a fresh interpreter where ``import ml_dtypes`` fails, installed or not
    code = textwrap.dedent("""
        import sys
        sys.modules["ml_dtypes"] = None
        from smoe.vault.reader import Vault
        t = Vault.open(sys.argv[1])[0, 0]["gate_proj"]
        try:
            t.dequantize("bfloat16")
        except TypeError as e:
            print(e)
    """)
    proc = python(code, Q4)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        "cannot dequantize to 'bfloat16': bfloat16 needs the ml_dtypes package "
        "(pip install ml-dtypes)\n"
    )


# ---- opening: the errors Python code expects (issue 33) ------------------------------------
def test_a_missing_vault_is_a_file_not_found_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.smoe"
    with pytest.raises(FileNotFoundError) as caught:
        Vault.open(missing)
    e = caught.value
    assert e.errno == errno.ENOENT and e.filename == str(missing)
    assert isinstance(e, fileio.NotRegular)  # the CLI's kind: one line, exit status 2
    assert str(e) == f"{missing}: cannot open: No such file or directory"
    assert describe(e) == (str(e), 2)


def test_a_folder_is_an_is_a_directory_error(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError) as caught:
        Vault.open(tmp_path)
    assert isinstance(caught.value, fileio.NotRegular)
    assert describe(caught.value) == (f"{tmp_path}: not a regular file (a folder)", 2)


def test_each_failed_open_is_the_os_error_open_raises() -> None:
    cases = [
        (FileNotFoundError(errno.ENOENT, "No such file or directory"), FileNotFoundError),
        (PermissionError(errno.EACCES, "Permission denied"), PermissionError),
        (OSError(errno.ELOOP, "Too many levels of symbolic links"), OSError),
    ]
    for cause, kind in cases:
        e = fileio.CannotOpen.of("v.smoe", cause)
        assert isinstance(e, kind) and isinstance(e, fileio.NotRegular)
        assert (e.errno, e.filename) == (cause.errno, "v.smoe")
        assert describe(e) == (f"v.smoe: cannot open: {cause.strerror}", 2)


def test_open_errors_survive_pickling(tmp_path: Path) -> None:
    """Worker processes send their errors back pickled: the class and message arrive."""
    with pytest.raises(OSError) as caught:
        Vault.open(tmp_path / "gone.smoe")
    back = pickle.loads(pickle.dumps(caught.value))
    assert type(back) is type(caught.value) and str(back) == str(caught.value)


def test_vault_of_a_path_says_to_use_open() -> None:
    with pytest.raises(TypeError, match=r"Vault\.open\('x\.smoe'\)"):
        Vault("x.smoe")  # type: ignore[call-arg, arg-type]
    with pytest.raises(TypeError, match=r"Vault\.open"):
        Vault(path=Q4)  # type: ignore[call-arg]


def test_cli_error_for_a_missing_vault_stays_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.smoe"
    r = run("verify", missing)
    assert r.returncode == 2 and r.stdout == ""
    assert one_line(r) == f"error: {missing}: cannot open: No such file or directory"


# ---- metadata and provenance from the manifest (issue 33) ----------------------------------
def _copy_with_manifest(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None] | None = None
) -> Path:
    vault = tmp_path / "v.smoe"
    vault.write_bytes(Q4.read_bytes())
    doc = json.loads((FIXTURES / "q4_v2.smoe.manifest.json").read_text())
    if edit is not None:
        edit(doc)
    (tmp_path / "v.smoe.manifest.json").write_text(json.dumps(doc))
    return vault


def test_metadata_and_provenance_come_from_the_manifest(tmp_path: Path) -> None:
    vault = _copy_with_manifest(tmp_path)
    r = run("meta", vault, "--set", "name=tiny OLMoE", "--set", "license=apache-2.0")
    assert r.returncode == 0, r.stderr
    with Vault.open(vault) as v:
        assert v.metadata == {"license": "apache-2.0", "name": "tiny OLMoE"}
        p = v.provenance
    doc = json.loads((tmp_path / "v.smoe.manifest.json").read_text())
    assert p == {"source": doc["source"], "tool": doc["tool"]}
    assert json.loads(json.dumps(p)) == p
    p["source"]["model_type"] = "changed"  # a copy: the vault's own answer is unchanged
    with Vault.open(vault) as v:
        assert v.provenance["source"]["model_type"] == "olmoe"  # type: ignore[index]


def test_without_a_manifest_metadata_is_empty_and_provenance_none(tmp_path: Path) -> None:
    vault = tmp_path / "bare.smoe"
    vault.write_bytes(Q4.read_bytes())
    with Vault.open(vault) as v:
        assert v.metadata == {} and v.provenance is None
    memory = Vault.from_array(np.fromfile(Q4, np.uint8))
    assert memory.metadata == {} and memory.provenance is None


def test_metadata_that_breaks_the_rules_is_refused(tmp_path: Path) -> None:
    vault = _copy_with_manifest(tmp_path, lambda d: d.update(metadata={"Name": "x"}))
    with Vault.open(vault) as v, pytest.raises(RefusedInput, match="manifest/metadata breaks"):
        v.metadata  # noqa: B018 (the property is the read)


def test_a_manifest_of_another_vault_is_refused(tmp_path: Path) -> None:
    vault = _copy_with_manifest(tmp_path, lambda d: d["vault"].update(size=1))
    with Vault.open(vault) as v, pytest.raises(RefusedInput, match="describes another vault"):
        v.provenance  # noqa: B018


def test_an_oversized_manifest_is_refused_unread(tmp_path: Path) -> None:
    vault = _copy_with_manifest(tmp_path)
    side = tmp_path / "v.smoe.manifest.json"
    with open(side, "r+b") as f:  # a sparse file far above the bound for 8 experts
        f.truncate(1 << 30)
    with Vault.open(vault) as v, pytest.raises(SmoeError, match="more than the"):
        v.metadata  # noqa: B018
