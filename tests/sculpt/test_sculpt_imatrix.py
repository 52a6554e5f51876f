"""``smoe sculpt --imatrix``: importance-weighted sculpts from llama.cpp importance matrices.

The importance matrices are written with ``gguf``'s own writer in llama-imatrix's layout
(and one in the legacy ``.dat`` form), by the helpers of test_imatrix.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf", reason="the optional extra smoe[imatrix] (gguf) is missing")

from test_imatrix import RAISED_ALL, absurd_entries, moe_entries, write_dat, write_gguf

from smoe import quant
from smoe.errors import SmoeError
from smoe.sculpt import SculptOptions, SculptResult, sculpt
from smoe.sculpt.outcome import ExpertOutcome, TensorOutcome
from smoe.sculpt.source.checkpoint import Checkpoint
from smoe.sculpt.source.imatrix import RANGE_BOUND, ImportanceMatrix
from smoe_gen.smoe_kaitai import Smoe
from smoe_testkit.synth import write_checkpoint

from helpers import run

L, E, D, F = 2, 4, 64, 32
TENSORS = ("gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "qwen", layers=L, experts=E, d_model=D, ffn=F, seed=1
    )


@pytest.fixture(scope="module")
def imatrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("imatrix") / "imatrix.gguf", moe_entries())


def blobs(vault: Path) -> dict[tuple[int, int], list[tuple[bytes, bytes]]]:
    """Per expert, (packed, scales) bytes of gate, up, down."""
    s = Smoe.from_bytes(Path(vault).read_bytes())
    return {
        (e.layer_id, e.expert_id): [(bytes(t.packed), bytes(t.scales)) for t in e.tensors]
        for e in s.experts
    }


def manifest_of(vault: Path) -> dict:
    return json.loads(Path(f"{vault}.manifest.json").read_text())


def interrupt_after(n: int):
    def hook(done: int, total: int, nbytes: int) -> None:
        if done == n:
            raise KeyboardInterrupt

    return hook


# ---- the weighted encode is what lands in the vault ------------------------------------------
@pytest.mark.parametrize("jobs", [1, 2])
def test_blobs_are_the_importance_weighted_encodes(
    model: Path, imatrix: Path, tmp_path: Path, jobs: int
) -> None:
    result = sculpt(model, tmp_path, SculptOptions(bits=2, jobs=jobs, imatrix=imatrix))
    got = blobs(result.vault)
    ck = Checkpoint.open(model)
    with ImportanceMatrix.open(imatrix) as m:
        for key, ref in ck.experts.items():
            for i, ((a, src), (rows, cols)) in enumerate(zip(ref.load(), ref.shapes)):
                imp = m.for_expert(key[0], key[1], TENSORS[i], cols, rows)
                packed, scales = quant.encode(a, 2, src_dtype=src, importance=imp, overflow="raise")
                assert got[key][i] == (packed.tobytes(), scales.tobytes()), (key, i)
                plain = quant.encode(a, 2, src_dtype=src)
                assert got[key][i] != (plain[0].tobytes(), plain[1].tobytes())


def test_summary_and_manifest_record_the_imatrix(
    model: Path, imatrix: Path, tmp_path: Path
) -> None:
    result = sculpt(model, tmp_path, SculptOptions(imatrix=imatrix))
    s = result.summary()
    with ImportanceMatrix.open(imatrix) as m:
        info = m.info.as_json()
    assert s["imatrix"] == info
    assert (info["datasets"], info["chunk_count"], info["chunk_size"]) == (
        ["calibration.txt"],
        10,
        512,
    )
    assert set(s["weighted_snr_db"]) == set(TENSORS)
    for name in TENSORS:  # weighting trades weight SNR for output SNR
        assert s["weighted_snr_db"][name]["median"] > s["snr_db"][name]["median"]
    doc = manifest_of(result.vault)
    record = doc["source"]["imatrix"]
    assert record == {**{k: v for k, v in info.items() if k != "path"}, "name": "imatrix.gguf"}
    for entry in doc["experts"]:
        for t in entry["tensors"]:
            assert isinstance(t["snr_db"], float) and isinstance(t["weighted_snr_db"], float)
            assert t["weighted_snr_db"] == round(t["weighted_snr_db"], 4)
    assert s["warnings"] == []


def test_without_imatrix_nothing_changes(model: Path, tmp_path: Path) -> None:
    result = sculpt(model, tmp_path, SculptOptions())
    s = result.summary()
    assert s["imatrix"] is None and s["weighted_snr_db"] is None
    doc = manifest_of(result.vault)
    assert "imatrix" not in doc["source"]
    assert all("weighted_snr_db" not in t for e in doc["experts"] for t in e["tensors"])


def test_uniform_importance_gives_the_plain_vault(model: Path, tmp_path: Path) -> None:
    flat = {
        name: (np.full_like(sums, 7.0), counts) for name, (sums, counts) in moe_entries().items()
    }
    uniform = write_gguf(tmp_path / "flat.gguf", flat)
    a = sculpt(model, tmp_path / "plain", SculptOptions(jobs=1))
    b = sculpt(model, tmp_path / "flat", SculptOptions(jobs=1, imatrix=uniform))
    assert a.vault.read_bytes() == b.vault.read_bytes()
    assert all(
        t["weighted_snr_db"] is None  # uniform importance: the plain encode
        for e in manifest_of(b.vault)["experts"]
        for t in e["tensors"]
    )


def test_legacy_dat_file(model: Path, tmp_path: Path) -> None:
    entries = moe_entries()
    dat = write_dat(tmp_path / "imatrix.dat", entries)
    gguf_file = write_gguf(tmp_path / "imatrix.gguf", entries)
    a = sculpt(model, tmp_path / "a", SculptOptions(bits=2, imatrix=dat))
    b = sculpt(model, tmp_path / "b", SculptOptions(bits=2, imatrix=gguf_file))
    # the same importance up to the legacy form's float32 rounding: nearly all groups agree
    same = [x == y for k in blobs(a.vault) for x, y in zip(blobs(a.vault)[k], blobs(b.vault)[k])]
    assert sum(same) >= len(same) - 2
    assert a.summary()["imatrix"]["format"] == "dat"


# ---- experts without data: unweighted, one warning -------------------------------------------
def test_experts_without_data_fall_back_with_one_warning(model: Path, tmp_path: Path) -> None:
    entries = moe_entries()
    entries["blk.0.ffn_gate_exps.weight"][1][2] = 0  # layer 0 expert 2: gate count 0
    del entries["blk.1.ffn_down_exps.weight"]  # layer 1: no down_proj entry at all
    path = write_gguf(tmp_path / "partial.gguf", entries)
    result = sculpt(model, tmp_path / "out", SculptOptions(bits=4, imatrix=path))
    assert result.summary()["warnings"] == [
        f"{path}: 5 of 24 expert tensors have no importance data (1 count 0, 4 not in the "
        "file); they are quantised unweighted"
    ]
    ck = Checkpoint.open(model)
    got = blobs(result.vault)
    doc = {(e["layer"], e["expert"]): e["tensors"] for e in manifest_of(result.vault)["experts"]}
    for key, t in [((0, 2), 0)] + [((1, e), 2) for e in range(E)]:
        a, src = ck.experts[key].load()[t]
        plain = quant.encode(a, 4, src_dtype=src)
        assert got[key][t] == (plain[0].tobytes(), plain[1].tobytes())
        assert doc[key][t]["weighted_snr_db"] is None
    assert doc[(0, 2)][1]["weighted_snr_db"] is not None  # up takes its own entry


# ---- the range bound (issue 23, case 8) ------------------------------------------------------
def weighted_snrs(vault: Path) -> list[object]:
    return [t["weighted_snr_db"] for e in manifest_of(vault)["experts"] for t in e["tensors"]]


@pytest.mark.parametrize(("low", "shown"), [(1e-30, "1e-30"), (0.0, "0")])
def test_an_absurd_range_is_raised_and_every_weighted_snr_is_finite(
    model: Path, tmp_path: Path, low: float, shown: str
) -> None:
    """One channel 3e38, the rest 1e-30 (or 0): unbounded, the rest became 0 in float32, the
    one channel was encoded exactly and the manifest said null ("quantised unweighted")."""
    path = write_gguf(tmp_path / "absurd.gguf", absurd_entries(low))
    result = sculpt(model, tmp_path / "out", SculptOptions(bits=2, jobs=1, imatrix=path))
    assert [w for w in result.summary()["warnings"] if str(path) in w] == [
        f"{path}: " + RAISED_ALL.format(low=shown)
    ]
    snrs = weighted_snrs(result.vault)
    assert len(snrs) == 3 * L * E
    assert all(isinstance(v, float) and math.isfinite(v) for v in snrs), snrs
    # the raise is exactly "to the floor": a file that holds the floor already gives the
    # same vault
    floor = float(np.float32(3e38)) / RANGE_BOUND
    preraised = write_gguf(tmp_path / "floor.gguf", absurd_entries(floor))
    again = sculpt(model, tmp_path / "again", SculptOptions(bits=2, jobs=1, imatrix=preraised))
    assert again.vault.read_bytes() == result.vault.read_bytes()


def test_the_bounds_worth_of_range_records_finite_weighted_snrs(
    model: Path, tmp_path: Path
) -> None:
    """Every expert tensor spans exactly 1e10 (one channel 1e10, the rest 1): nothing is
    raised, no warning, and every weighted tensor has a finite weighted SNR."""
    entries = {}
    for name, (sums, counts) in moe_entries().items():
        sums = np.ones_like(sums)
        sums[:, 3] = 1e10
        entries[name] = (sums, np.ones_like(counts))
    path = write_gguf(tmp_path / "wide.gguf", entries)
    for jobs in (1, 2):
        result = sculpt(
            model, tmp_path / f"j{jobs}", SculptOptions(bits=2, jobs=jobs, imatrix=path)
        )
        assert all(str(path) not in w for w in result.summary()["warnings"])
        snrs = weighted_snrs(result.vault)
        assert len(snrs) == 3 * L * E
        assert all(isinstance(v, float) and math.isfinite(v) for v in snrs), snrs


# ---- refusals before any work ----------------------------------------------------------------
def test_another_models_imatrix_is_refused_before_any_work(model: Path, tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "other.gguf", moe_entries(d=48))
    out = tmp_path / "out"
    message = (
        f"{path}: tensor 'blk.0.ffn_gate_exps.weight.in_sum2' is [4, 48] (4 experts x "
        "48 input channels), but layer 0 expert 0 gate_proj is [32, 64] (64 input "
        "channels): an importance matrix of another model?"
    )
    for dry_run in (False, True):
        with pytest.raises(SmoeError) as e:
            sculpt(model, out, SculptOptions(imatrix=path, dry_run=dry_run))
        assert str(e.value) == message
    assert not out.exists()
    proc = run("sculpt", model, out, "--imatrix", path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"error: {message}"]
    assert not out.exists()
    fewer = write_gguf(tmp_path / "fewer.gguf", moe_entries(experts=2))
    with pytest.raises(
        SmoeError,
        match="covers 2 experts of 64 input channels, but the checkpoint has 4 experts per layer",
    ):
        sculpt(model, out, SculptOptions(imatrix=fewer, max_experts=2))
    assert not out.exists()


def test_unreadable_or_foreign_files_are_refused(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(SmoeError, match=r"(?i)no such file"):
        sculpt(model, out, SculptOptions(imatrix=tmp_path / "missing.gguf"))
    weights = next(model.glob("*.safetensors"))
    with pytest.raises(SmoeError, match="importance matrix"):
        sculpt(model, out, SculptOptions(imatrix=weights))
    assert not out.exists()


def test_an_output_may_not_be_the_imatrix(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    planted = write_gguf(out / "qwen.smoe", moe_entries())
    before = planted.read_bytes()
    with pytest.raises(SmoeError, match="refusing to overwrite an input"):
        sculpt(model, out, SculptOptions(imatrix=planted))
    assert planted.read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["qwen.smoe"]


def test_dry_run_reports_the_imatrix(model: Path, imatrix: Path, tmp_path: Path) -> None:
    plan = sculpt(model, tmp_path / "out", SculptOptions(imatrix=imatrix, dry_run=True))
    assert plan["imatrix"]["sha256"] == ImportanceMatrix.open(imatrix).info.sha256
    assert plan["warnings"] == []
    assert not (tmp_path / "out").exists()


# ---- resume ----------------------------------------------------------------------------------
def test_resume_is_byte_identical_and_keyed_to_the_imatrix(
    model: Path, imatrix: Path, tmp_path: Path
) -> None:
    clean = sculpt(model, tmp_path / "clean", SculptOptions(jobs=1, imatrix=imatrix))
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        sculpt(model, out, SculptOptions(jobs=1, imatrix=imatrix), progress=interrupt_after(3))
    lines = (out / ".qwen.smoe.journal").read_text().splitlines()
    assert len(lines) == 4 and all(len(ln.split(" ")) == 12 for ln in lines[1:])
    resumed = sculpt(model, out, SculptOptions(jobs=1, resume=True, imatrix=imatrix))
    assert (resumed.experts_resumed, resumed.experts_written) == (3, 5)
    for a, b in (
        (clean.vault, resumed.vault),
        (clean.scout, resumed.scout),
        (Path(f"{clean.vault}.manifest.json"), Path(f"{resumed.vault}.manifest.json")),
    ):
        assert a.read_bytes() == b.read_bytes()
    # another importance matrix (or none) does not resume this run's experts
    other = write_gguf(tmp_path / "other.gguf", moe_entries(seed=5))
    for opts in (SculptOptions(jobs=1, imatrix=other), SculptOptions(jobs=1)):
        with pytest.raises(KeyboardInterrupt):
            sculpt(model, out, SculptOptions(jobs=1, imatrix=imatrix), progress=interrupt_after(3))
        again = sculpt(model, out, SculptOptions(**{**opts.__dict__, "resume": True}))
        assert again.experts_resumed == 0


# ---- the command line ------------------------------------------------------------------------
def test_command_line(model: Path, imatrix: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run("sculpt", model, out, "--imatrix", imatrix, "--json")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["imatrix"]["path"] == str(imatrix)
    assert set(s["weighted_snr_db"]) == set(TENSORS)
    proc = run("sculpt", model, tmp_path / "b", "--imatrix", imatrix)
    assert proc.returncode == 0, proc.stderr
    assert "imatrix-weighted min" in proc.stdout
    assert "10 chunks of calibration.txt" in proc.stdout
    verify = run("verify", "--deep", out / "qwen.smoe")
    assert verify.returncode == 0, verify.stdout


def _expert(key: tuple[int, int], *snrs: tuple[float, float | None]) -> ExpertOutcome:
    """An expert as written, its (SNR, weighted SNR) per tensor: gate, up, down."""
    tensors = tuple(TensorOutcome(source_crc=0, snr=s, weighted_snr=w) for s, w in snrs)
    return ExpertOutcome(key=key, blob_crc=0, tensors=tensors, source_bytes=0)


def test_the_snr_floor_judges_weighted_tensors_by_their_weighted_snr() -> None:
    r = SculptResult(
        Path("v"),
        Path("s"),
        2,
        0,
        0,
        1,
        1,
        1.0,
        experts=(
            _expert((0, 0), (8.0, 14.0), (12.0, 9.5), (9.0, None)),
            _expert((0, 1), (8.0, None), (12.0, 13.0), (15.0, 16.0)),
        ),
        bits=4,
        weighted=True,
    )
    floor = "is below the Q4 floor of 10 dB"
    assert r.snr_warnings() == [
        f"layer 0 expert 0 up_proj: importance-weighted SNR 9.50 dB {floor}",
        f"layer 0 expert 0 down_proj: SNR 9.00 dB {floor}",
        f"layer 0 expert 1 gate_proj: SNR 8.00 dB {floor}",
    ]
    r.SHOW_EACH = 2
    assert r.snr_warnings() == [
        "3 expert tensors have an SNR (importance-weighted where an imatrix applies) below the "
        "Q4 floor of 10 dB; worst: layer 0 expert 1 gate_proj 8.00 dB, layer 0 expert 0 "
        "down_proj 9.00 dB"
    ]
