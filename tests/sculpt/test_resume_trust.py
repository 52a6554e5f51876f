"""``--resume`` takes nothing on the journal's word (issue 23, case 6).

The journal is a hint, never a source of truth. A forged line (the CRC-32C of zeros, what a
never-written blob holds in the partial file, plus the real source CRC-32C) made the resume
keep an expert that was never written: all zeros in the vault, and ``verify --deep`` passed.
Edited SNR values (99.5, nan) went into the manifest, and the resumed summary showed a
compression of 0.73x instead of 1.06x (only this run's experts counted as bytes in). Now a
kept expert's SNRs are recomputed from its blob and its sources (exactly the encoder's
figures), a line its blob contradicts is redone with one warning, and the summary counts
every expert of the vault.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smoe import quant
from smoe.format.manifest import checksum
from smoe.quant.replay import tensor_stats
from smoe.sculpt import SculptOptions, SculptResult, sculpt
from smoe.sculpt.source.checkpoint import Checkpoint
from smoe_testkit.synth import write_checkpoint

from helpers import run

ONE = (
    "resume: redid 1 expert whose journal line does not match its blob in the partial file "
    "(an edited or damaged journal)"
)
TWO = (
    "resume: redid 2 experts whose journal lines do not match their blobs in the partial file "
    "(an edited or damaged journal)"
)
Key = tuple[int, int]


def interrupt_after(n: int) -> Callable[[int, int, int], None]:
    """A progress hook that stops the run like Ctrl-C once ``n`` experts are done."""

    def hook(done: int, total: int, nbytes: int) -> None:
        if done == n:
            raise KeyboardInterrupt

    return hook


def outputs(vault: Path) -> list[bytes]:
    """Vault, scout, manifest and config copy bytes."""
    stem = vault.name.removesuffix(".smoe")
    names = ("smoe", "scout.safetensors", "smoe.manifest.json", "config.json")
    return [(vault.parent / f"{stem}.{n}").read_bytes() for n in names]


def rows(vault: Path) -> dict[Key, dict[str, Any]]:
    """The manifest's entry per expert."""
    doc = json.loads(Path(f"{vault}.manifest.json").read_text())
    return {(r["layer"], r["expert"]): r for r in doc["experts"]}


def exact_snrs(result: SculptResult, key: Key, weighted: bool = False) -> list[float | None]:
    """The full-precision SNR (or weighted SNR) per tensor of one expert, as summed up."""
    table = result.weighted_snr if weighted else result.snr
    assert table is not None
    i = result.snr_keys.index(key)
    return [values[i] for values in table.values()]


def field(v: float | None) -> str:
    return "-" if v is None else repr(v)


class Run:
    """A sculpt of ``model`` into ``out`` stopped once ``n`` experts are journaled, its
    journal to edit, then resumed."""

    def __init__(self, model: Path, out: Path, n: int, **opts: Any) -> None:
        self.model, self.out, self.opts = model, out, opts
        with pytest.raises(KeyboardInterrupt):
            sculpt(model, out, SculptOptions(jobs=1, **opts), progress=interrupt_after(n))
        self.journal = out / f".{model.name}.smoe.journal"
        self.lines = self.journal.read_text().splitlines()
        assert len(self.lines) == n + 1

    def journaled(self) -> list[Key]:
        return [(int(a), int(b)) for a, b, *_ in (ln.split(" ") for ln in self.lines[1:])]

    def edit(self, key: Key, position: int, value: str) -> None:
        """Set field ``position`` of ``key``'s line (6, 7, 8: SNRs; 9, 10, 11: weighted)."""
        i = 1 + self.journaled().index(key)
        parts = self.lines[i].split(" ")
        parts[position] = value
        self.lines[i] = " ".join(parts)

    def resume(self, **more: Any) -> SculptResult:
        self.journal.write_text("\n".join(self.lines) + "\n")
        opts = SculptOptions(jobs=1, resume=True, **{**self.opts, **more})
        result = sculpt(self.model, self.out, opts)
        assert isinstance(result, SculptResult)
        return result


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "qwen", layers=2, experts=4, d_model=64, ffn=32, seed=1
    )


@pytest.fixture(scope="module")
def fresh(model: Path, tmp_path_factory: pytest.TempPathFactory) -> SculptResult:
    result = sculpt(model, tmp_path_factory.mktemp("fresh"), SculptOptions(jobs=1))
    assert isinstance(result, SculptResult)
    return result


# ---- (a) a forged line for an expert never written --------------------------------------------
@pytest.mark.parametrize("snrs", ["zero blob", "fresh run"])
def test_a_forged_line_for_a_never_written_expert_is_redone(
    model: Path, fresh: SculptResult, tmp_path: Path, snrs: str
) -> None:
    """The CRC of zeros (the partial's untouched bytes) and the real source CRCs, with the
    SNRs a blob of zeros has against any source (0 dB: only the zero check stops it) or with
    the fresh run's (the recomputed SNR stops it as well)."""
    r = Run(model, tmp_path / "out", 3)
    key = (1, 3)  # the last expert in file order: not written yet
    assert key not in r.journaled()
    entry = rows(fresh.vault)[key]
    offset, size = entry["offset"], entry["raw_size"]
    partial = (r.out / ".qwen.smoe.partial").read_bytes()
    assert not any(partial[offset : offset + size])  # never written: zeros
    sources = [checksum(a) for a, _ in Checkpoint.open(model).experts[key].load()]
    values = [0.0] * 3 if snrs == "zero blob" else exact_snrs(fresh, key)
    forged = [*key, checksum(bytes(size)), *sources]
    r.lines.append(" ".join([*map(str, forged), *map(field, values)]))
    result = r.resume()
    assert (result.experts_resumed, result.experts_written) == (3, 5)
    assert result.warnings == [ONE]
    vault = r.out / "qwen.smoe"
    assert any(vault.read_bytes()[offset : offset + size])
    assert outputs(vault) == outputs(fresh.vault)  # the weights (and all else) of a fresh run
    proc = run("verify", "--deep", vault)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- (b) edited SNR values ------------------------------------------------------------------
def test_edited_snr_values_are_replaced_by_the_true_ones(
    model: Path, fresh: SculptResult, tmp_path: Path
) -> None:
    r = Run(model, tmp_path / "out", 5)
    first, second, third = r.journaled()[:3]
    r.edit(first, 6, "99.5")
    r.edit(first, 7, "nan")
    true = exact_snrs(fresh, second)[2]
    assert true is not None
    r.edit(second, 8, repr(float(np.nextafter(true, np.inf))))  # one unit in the last place
    r.edit(third, 7, repr(exact_snrs(fresh, third)[1]))  # rewritten as it was: still kept
    result = r.resume()
    assert (result.experts_resumed, result.experts_written) == (3, 5)
    assert result.warnings == [TWO]
    assert rows(r.out / "qwen.smoe") == rows(fresh.vault)
    assert outputs(r.out / "qwen.smoe") == outputs(fresh.vault)
    for key in fresh.snr_keys:
        assert exact_snrs(result, key) == exact_snrs(fresh, key)


def test_a_line_of_another_kind_is_redone(model: Path, fresh: SculptResult, tmp_path: Path) -> None:
    """Weighted SNR fields on a line of a run without an importance matrix: edited."""
    r = Run(model, tmp_path / "out", 3)
    key = r.journaled()[0]
    i = 1 + r.journaled().index(key)
    r.lines[i] += " 1.0 2.0 3.0"
    result = r.resume()
    assert (result.experts_resumed, result.experts_written) == (2, 6)
    assert result.warnings == [ONE]
    assert outputs(r.out / "qwen.smoe") == outputs(fresh.vault)


def test_a_damaged_blob_or_changed_source_is_redone_without_the_warning(
    model: Path, fresh: SculptResult, tmp_path: Path
) -> None:
    """A blob whose CRC is not the journal's is damaged (or the line is): redone, as
    before, with no word (the journal cannot tell which)."""
    r = Run(model, tmp_path / "out", 3)
    offset = rows(fresh.vault)[r.journaled()[1]]["offset"]
    with open(r.out / ".qwen.smoe.partial", "r+b") as f:
        f.seek(offset + 10)
        f.write(b"\xff" * 4)
    result = r.resume()
    assert (result.experts_resumed, result.experts_written) == (2, 6)
    assert result.warnings == []
    assert outputs(r.out / "qwen.smoe") == outputs(fresh.vault)


def test_the_warning_on_the_command_line(model: Path, fresh: SculptResult, tmp_path: Path) -> None:
    r = Run(model, tmp_path / "out", 3)
    r.edit(r.journaled()[0], 6, "99.5")
    r.journal.write_text("\n".join(r.lines) + "\n")
    proc = run("sculpt", model, r.out, "--resume", "--jobs", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [f"warning: {ONE}"]
    assert "2 (+6 resumed)" not in proc.stdout and "6 (+2 resumed)" in proc.stdout
    assert outputs(r.out / "qwen.smoe") == outputs(fresh.vault)
    r = Run(model, tmp_path / "again", 3)  # and in --json's summary
    r.edit(r.journaled()[0], 6, "99.5")
    r.journal.write_text("\n".join(r.lines) + "\n")
    proc = run("sculpt", model, r.out, "--resume", "--jobs", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["warnings"] == [ONE]
    assert (summary["experts_resumed"], summary["experts_written"]) == (2, 6)


# ---- (c) the resumed summary ----------------------------------------------------------------
def test_the_resumed_summary_counts_every_expert_of_the_vault(
    model: Path, fresh: SculptResult, tmp_path: Path
) -> None:
    r = Run(model, tmp_path / "out", 5)
    result = r.resume()
    assert (result.experts_resumed, result.experts_written) == (5, 3)
    got, want = result.summary(), fresh.summary()
    for name in ("compression_ratio", "expert_bytes_in", "vault_bytes", "snr_db", "snr_exact"):
        assert got[name] == want[name], name
    assert result.bytes_in == fresh.bytes_in
    assert sorted(result.snr_keys) == sorted(fresh.snr_keys)
    assert got["throughput_mb_s"] == result.bytes_in / 1e6 / result.seconds


def test_progress_counts_the_kept_experts_bytes(
    model: Path, fresh: SculptResult, tmp_path: Path
) -> None:
    r = Run(model, tmp_path / "out", 4)
    seen: list[tuple[int, int, int]] = []
    r.journal.write_text("\n".join(r.lines) + "\n")
    sculpt(
        model,
        r.out,
        SculptOptions(jobs=1, resume=True),
        progress=lambda done, total, nbytes: seen.append((done, total, nbytes)),
    )
    assert [d for d, _, _ in seen] == [5, 6, 7, 8]
    assert seen[-1] == (8, 8, fresh.bytes_in)


# ---- with an importance matrix --------------------------------------------------------------
def test_edited_weighted_snrs_are_redone(model: Path, tmp_path: Path) -> None:
    pytest.importorskip("gguf", reason="the optional extra smoe[imatrix] (gguf) is missing")
    from test_imatrix import moe_entries, write_gguf

    imatrix = write_gguf(tmp_path / "imatrix.gguf", moe_entries())
    clean = sculpt(model, tmp_path / "clean", SculptOptions(jobs=1, imatrix=imatrix))
    assert isinstance(clean, SculptResult)
    r = Run(model, tmp_path / "out", 4, imatrix=imatrix)
    r.edit(r.journaled()[1], 10, "99.5")
    result = r.resume()
    assert (result.experts_resumed, result.experts_written) == (3, 5)
    assert result.warnings == [ONE]
    assert outputs(r.out / "qwen.smoe") == outputs(clean.vault)
    got, want = result.summary(), clean.summary()
    assert got["weighted_snr_db"] == want["weighted_snr_db"]
    assert got["compression_ratio"] == want["compression_ratio"]


# ---- the compiled encoder's figures, recomputed exactly -------------------------------------
@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every tensor through the compiled encoder (numba), whatever its size."""
    pytest.importorskip("numba", reason="the optional extra smoe[fast] (numba) is missing")
    monkeypatch.setenv(quant.KERNEL_ENV, "fast")
    yield


@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize("bits", [2, 4])
def test_the_compiled_encoders_snrs_are_recomputed_exactly(
    model: Path, tmp_path: Path, bits: int
) -> None:
    clean = sculpt(model, tmp_path / "clean", SculptOptions(jobs=1, bits=bits))
    assert isinstance(clean, SculptResult)
    r = Run(model, tmp_path / "out", 5, bits=bits)
    r.edit(r.journaled()[0], 6, "99.5")
    result = r.resume()
    assert (result.experts_resumed, result.experts_written) == (4, 4)
    assert result.warnings == [ONE]
    assert outputs(r.out / "qwen.smoe") == outputs(clean.vault)


@pytest.mark.parametrize("first", ["numpy", "fast"])
def test_a_resume_under_the_other_kernel_still_keeps_the_experts(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """``$SMOE_KERNEL`` changed between the run and its resume: each tensor's SNR is
    recomputed the other way too before it is called edited."""
    pytest.importorskip("numba", reason="the optional extra smoe[fast] (numba) is missing")
    monkeypatch.setenv(quant.KERNEL_ENV, first)
    clean = sculpt(model, tmp_path / "clean", SculptOptions(jobs=1))
    assert isinstance(clean, SculptResult)
    r = Run(model, tmp_path / "out", 5)
    monkeypatch.setenv(quant.KERNEL_ENV, "fast" if first == "numpy" else "numpy")
    result = r.resume()
    assert (result.experts_resumed, result.experts_written) == (5, 3)
    assert result.warnings == []
    assert rows(r.out / "qwen.smoe") == rows(clean.vault)


def test_large_tensors_take_the_compiled_path_and_are_kept(tmp_path: Path) -> None:
    """Tensors of ``FAST_MIN_WEIGHTS`` weights: the compiled encoder under ``auto``."""
    pytest.importorskip("numba", reason="the optional extra smoe[fast] (numba) is missing")
    big = write_checkpoint(tmp_path / "big", layers=1, experts=4, d_model=256, ffn=256, seed=2)
    assert quant.FAST_MIN_WEIGHTS <= 256 * 256
    clean = sculpt(big, tmp_path / "clean", SculptOptions(jobs=1))
    assert isinstance(clean, SculptResult)
    r = Run(big, tmp_path / "out", 3)
    result = r.resume()
    assert (result.experts_resumed, result.experts_written) == (3, 1)
    assert outputs(r.out / "big.smoe") == outputs(clean.vault)


# ---- tensor_stats is the encoder's own figure -------------------------------------------------
@pytest.mark.parametrize("kernel", ["numpy", "fast"])
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("shape", [(32, 64), (100, 77), (3, 5), (640, 1030)])
@pytest.mark.parametrize("src", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("scale", ["optimal", "absmax"])
def test_tensor_stats_are_the_encoders_to_the_last_bit(
    kernel: str,
    bits: int,
    shape: tuple[int, int],
    src: str,
    weighted: bool,
    scale: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if kernel == "fast":
        pytest.importorskip("numba", reason="the optional extra smoe[fast] (numba) is missing")
    monkeypatch.setenv(quant.KERNEL_ENV, kernel)
    rng = np.random.default_rng(sum(shape) + bits)
    w32 = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    choices: dict[str, tuple[np.ndarray, Any]] = {
        "f32": (w32, None),
        "bf16": ((w32.view(np.uint32) >> 16).astype(np.uint16), "bf16"),
        "f16": (w32.astype(np.float16), None),
    }
    weights, dtype = choices[src]
    importance = rng.random(shape[1]) ** 4 if weighted else None
    packed = np.empty(quant.packed_size(w32.size, bits), np.uint8)
    scales = np.empty(quant.scales_size(w32.size), np.uint8)
    stats = quant.QuantStats()
    mode: Any = scale
    quant.encode_into(
        weights, bits, packed, scales, mode, src_dtype=dtype, stats=stats, importance=importance
    )
    compiled = quant.fast_kernels(bits, scale, w32.size) is not None
    got = tensor_stats(weights, dtype, bits, packed, scales, importance, compiled=compiled)
    assert got is not None
    assert (got.snr_db, got.weighted_snr_db) == (stats.snr_db, stats.weighted_snr_db)
    packed[packed.size // 2] ^= 0x11  # another code: another figure (or, compiled, refused)
    other = tensor_stats(weights, dtype, bits, packed, scales, importance, compiled=compiled)
    assert other is None or other.snr_db != stats.snr_db
