"""The manifest's per-tensor ``index`` and ``rows`` are bounded by the vault they describe
(issue 23, item 7): an ``index`` past the header's ``max_experts_per_layer`` or ``rows`` that
do not hold the tensor's rows within the expert is a ``manifest.expert`` finding of
``verify --deep``, and ``export --hf`` refuses it naming the field, before it allocates
anything by it (an ``index`` of 10**12 built a set of 10**12 integers)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from smoe_testkit.synth import write_checkpoint

from helpers import python, refused, run

STEM = "fused4"
MEMORY_CAP = 2 << 30  # bytes of address space for a command a regression would blow up
CAPPED = (
    f"import resource, sys; cap = {MEMORY_CAP}; resource.setrlimit(resource.RLIMIT_AS, "
    "(cap, cap)); from smoe.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.fixture(scope="module")
def sculpted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Q4 vault (and its manifest) of a 4-expert, 2-layer fused 3-D checkpoint."""
    root = tmp_path_factory.mktemp("fused")
    ckpt = write_checkpoint(root / "ckpt", experts=4, fused=True)
    proc = run("sculpt", ckpt, root / "out", "--jobs", "1", "--name", STEM)
    assert proc.returncode == 0, proc.stderr
    return root / "out"


@pytest.fixture
def edited(sculpted: Path, tmp_path: Path) -> Callable[[Callable[[dict[str, Any]], None]], Path]:
    """``edited(change)``: a copy of the sculpted outputs whose manifest ``change`` edited;
    returns the vault."""

    def make(change: Callable[[dict[str, Any]], None]) -> Path:
        out = tmp_path / "out"
        shutil.copytree(sculpted, out)
        path = out / f"{STEM}.smoe.manifest.json"
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc))
        return out / f"{STEM}.smoe"

    return make


def findings(vault: Path) -> tuple[int, list[tuple[str, str]]]:
    proc = run("verify", "--deep", "--json", vault)
    doc = json.loads(proc.stdout)
    return proc.returncode, [(f["code"], f["field"]) for f in doc["findings"]]


def tensor(doc: dict[str, Any], i: int, t: int) -> dict[str, Any]:
    entry: dict[str, Any] = doc["experts"][i]["tensors"][t]
    return entry


def test_the_sculpted_manifest_is_valid_and_records_fused_sources(sculpted: Path) -> None:
    doc = json.loads((sculpted / f"{STEM}.smoe.manifest.json").read_text())
    assert [tensor(doc, 3, t)["index"] for t in range(3)] == [3, 3, 3]
    assert tensor(doc, 3, 0)["rows"] == [0, 32]
    assert findings(sculpted / f"{STEM}.smoe") == (0, [])


@pytest.mark.parametrize(
    ("t", "key", "value"),
    [
        (2, "index", 10**12),
        (2, "index", 4),  # the first past max_experts_per_layer
        (0, "index", -1),
        (0, "index", "3"),
        (1, "rows", [10**12, 10**12 + 32]),
        (1, "rows", [32, 65]),  # not the tensor's 32 rows
        (0, "rows", [32, 64, 96]),
        (0, "rows", "0:32"),
    ],
)
def test_an_index_or_rows_out_of_bounds_is_a_manifest_finding(
    edited: Callable[[Callable[[dict[str, Any]], None]], Path], t: int, key: str, value: object
) -> None:
    vault = edited(lambda doc: tensor(doc, 3, t).__setitem__(key, value))
    assert findings(vault) == (1, [("manifest.expert", f"manifest/experts/3/tensors/{t}/{key}")])


def test_verify_names_the_bound(edited: Callable[[Callable[[dict[str, Any]], None]], Path]) -> None:
    vault = edited(lambda doc: tensor(doc, 3, 2).__setitem__("index", 10**12))
    proc = run("verify", "--deep", vault)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0] == (
        "error: manifest.expert at offset 0x10000 (manifest/experts/3/tensors/2/index): "
        "layer 0 expert 3: down_proj's index is 1000000000000, expected an expert index "
        "below max_experts_per_layer 4"
    )


def test_tensors_that_are_not_three_objects_are_a_manifest_finding(
    edited: Callable[[Callable[[dict[str, Any]], None]], Path],
) -> None:
    vault = edited(lambda doc: doc["experts"][1]["tensors"].pop())
    assert findings(vault) == (1, [("manifest.expert", "manifest/experts/1/tensors")])


def test_export_refuses_a_huge_index_naming_the_field(
    edited: Callable[[Callable[[dict[str, Any]], None]], Path], tmp_path: Path
) -> None:
    """Refused before anything is allocated by it (under a cap on the address space, a
    regression is a MemoryError, not a machine out of memory)."""
    vault = edited(lambda doc: tensor(doc, 3, 2).__setitem__("index", 10**12))
    manifest = Path(f"{vault}.manifest.json")
    line = refused(
        lambda: python(CAPPED, "export", "--hf", vault, tmp_path / "hf"),
        unchanged=[vault.parent],
        absent=tmp_path / "hf",
    )
    assert line == (
        f"error: {manifest}: experts[3].tensors[2].index is 1000000000000, expected an "
        "expert index below max_experts_per_layer 4"
    )


def test_export_refuses_rows_outside_the_expert(
    edited: Callable[[Callable[[dict[str, Any]], None]], Path], tmp_path: Path
) -> None:
    vault = edited(lambda doc: tensor(doc, 3, 1).__setitem__("rows", [10**12, 10**12 + 32]))
    manifest = Path(f"{vault}.manifest.json")
    line = refused(
        lambda: python(CAPPED, "export", "--hf", vault, tmp_path / "hf"),
        unchanged=[vault.parent],
        absent=tmp_path / "hf",
    )
    assert line == (
        f"error: {manifest}: experts[3].tensors[1].rows is [1000000000000, 1000000000032], "
        "expected [start, start + 32] within the expert's 128 rows"
    )


def test_export_names_the_missing_slab_without_counting_to_it(
    edited: Callable[[Callable[[dict[str, Any]], None]], Path], tmp_path: Path
) -> None:
    """Indices inside the bound that leave a slab empty: the first empty one is named."""

    def shift(doc: dict[str, Any]) -> None:
        for t in range(3):
            tensor(doc, 0, t)["index"] = 3  # expert 0 claims slab 3 too: slab 0 is empty
        for t in range(3):
            tensor(doc, 3, t)["index"] = 3

    vault = edited(shift)
    line = refused(lambda: python(CAPPED, "export", "--hf", vault, tmp_path / "hf"))
    assert line.startswith(f"error: {vault}.manifest.json: ")
    assert "model.layers.0.mlp.experts." in line


def test_permuted_source_names_are_a_manifest_finding(
    edited: Callable[[Callable[[dict[str, Any]], None]], Path],
) -> None:
    """Experts 1 and 2 given each other's sources: export --hf would write each under the
    other's name (issue 23, case 4); verify --deep names the first one."""

    def swap(doc: dict[str, Any]) -> None:
        rows = doc["experts"]
        rows[1]["tensors"], rows[2]["tensors"] = rows[2]["tensors"], rows[1]["tensors"]

    vault = edited(swap)
    proc = run("verify", "--deep", vault)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0] == (
        "error: manifest.expert at offset 0x8000 (manifest/experts/1/tensors/0/index): "
        "layer 0 expert 1: gate_proj's index is 2, the entry is expert 1 (its slab of "
        "'model.layers.0.mlp.experts.gate_up_proj')"
    )


def test_a_source_of_another_role_is_a_manifest_finding(
    edited: Callable[[Callable[[dict[str, Any]], None]], Path],
) -> None:
    vault = edited(lambda doc: tensor(doc, 0, 2).__setitem__("source", tensor(doc, 0, 0)["source"]))
    assert findings(vault) == (1, [("manifest.expert", "manifest/experts/0/tensors/2/source")])


def test_export_refuses_permuted_sources(
    edited: Callable[[Callable[[dict[str, Any]], None]], Path], tmp_path: Path
) -> None:
    """Never each expert's weights under another expert's name (issue 23, case 4)."""

    def swap(doc: dict[str, Any]) -> None:
        rows = doc["experts"]
        rows[1]["tensors"], rows[2]["tensors"] = rows[2]["tensors"], rows[1]["tensors"]

    vault = edited(swap)
    manifest = Path(f"{vault}.manifest.json")
    line = refused(
        ["export", "--hf", vault, tmp_path / "hf"], unchanged=[vault.parent], absent=tmp_path / "hf"
    )
    assert line == (
        f"error: {manifest}: experts[1].tensors[0].index is 2, the entry is expert 1 (its "
        "slab of 'model.layers.0.mlp.experts.gate_up_proj')"
    )
