"""``smoe sculpt --calibrate`` (issue 24) on tiny checkpoints that transformers writes.

The calibrated vault is checked against the plain one: its experts' output error on
*held-out* inputs (second moments of routed hidden states the calibration never saw) is no
larger; a run is deterministic and resumable to the same bytes; experts no calibration
token reached keep the plain encoder's bytes and are counted; the forward pass holds one
decoder layer at a time; bad DATA and options are refused in one line with nothing written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smoe import quant
from smoe.errors import RefusedInput
from smoe.format.verify import verify_path
from smoe.sculpt import SculptOptions, sculpt
from smoe.vault.reader import Vault

torch = pytest.importorskip("torch", reason="the calibrate extra (torch) is not installed")
pytest.importorskip("transformers", reason="the calibrate extra (transformers) is not installed")

from smoe.sculpt.calibrate.runner import LayerRunner, source_weights  # noqa: E402
from smoe.sculpt.source.checkpoint import Checkpoint  # noqa: E402
from smoe_testkit import tiny  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VOCAB = 96  # the tiny checkpoints' vocabulary (tiny.shrink's vocab_size)


def _ids(seed: int, rows: int, cols: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, (rows, cols), dtype=np.int64)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny Qwen3-MoE (8 experts, top-2) as transformers writes it, with calibration and
    held-out ids from its vocabulary."""
    root = tmp_path_factory.mktemp("calibrate")
    ck = root / "qwen3"
    m = tiny.write("qwen3_moe", ck, overrides={"num_local_experts": 8, "num_experts_per_tok": 2})
    vocab = m.config.vocab_size
    np.save(root / "calib.npy", _ids(1, 24, 32, vocab))
    np.save(root / "heldout.npy", _ids(2, 24, 32, vocab))
    np.save(root / "two.npy", _ids(3, 1, 2, vocab))  # 2 tokens x top-2: at most 4 of 8 experts
    return {"ck": ck, "root": root, "vocab": vocab}


def _sculpt(model: dict, out: Path, bits: int = 2, **kw: Any) -> Any:
    return sculpt(model["ck"], out, SculptOptions(bits=bits, jobs=1, **kw))


@pytest.fixture(scope="module")
def vaults(model: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The plain and the calibrated Q2 vaults (each sculpted once)."""
    root = tmp_path_factory.mktemp("vaults")
    plain = _sculpt(model, root / "plain")
    calib = _sculpt(model, root / "calib", calibrate=model["root"] / "calib.npy")
    return {"plain": plain, "calib": calib}


def _heldout_hessians(model: dict) -> dict[tuple[int, int], tuple]:
    """Per expert, its routed inputs' second moments over the held-out ids, in the
    unquantised model (the runner, propagating the source experts)."""
    ckpt = Checkpoint.open(model["ck"])
    runner = LayerRunner(ckpt, np.load(model["root"] / "heldout.npy"))
    runner.start()
    out = {}
    for n in ckpt.moe_layers:
        weights = source_weights([ckpt.experts[(n, e)] for e in ckpt.layer_experts(n)])
        for e, st in runner.collect(n, weights).items():
            out[(n, e)] = st.hessians()
        runner.propagate(n)
    return out


def _output_error(vault: Path, model: dict, hs: dict) -> float:
    ckpt = Checkpoint.open(model["ck"])
    total = 0.0
    with Vault.open(vault) as v:
        for (n, e), h in hs.items():
            if h[0] is None:
                continue
            src = source_weights([ckpt.experts[(n, e)]])[e]
            got = [v[n, e][t].dequantize() for t in ("gate_proj", "up_proj", "down_proj")]
            total += sum(quant.hessian_error(w, w_hat, hm) for w, w_hat, hm in zip(src, got, h))
    return total


def test_calibrated_output_error_on_heldout_inputs_is_below_plain(
    model: dict, vaults: dict
) -> None:
    hs = _heldout_hessians(model)
    plain = _output_error(vaults["plain"].vault, model, hs)
    calib = _output_error(vaults["calib"].vault, model, hs)
    assert calib < plain


def test_calibrated_vault_verifies_and_records_the_calibration(model: dict, vaults: dict) -> None:
    res = vaults["calib"]
    assert verify_path(res.vault, deep=True).ok
    manifest = json.loads(res.vault.with_name(res.vault.name + ".manifest.json").read_text())
    cal = manifest["source"]["calibration"]
    data = (model["root"] / "calib.npy").read_bytes()
    import hashlib

    assert cal["sha256"] == hashlib.sha256(data).hexdigest()
    assert (cal["file"], cal["format"], cal["tokens"], cal["sequences"]) == (
        "calib.npy", "npy", 24 * 32, 24,
    )  # fmt: skip
    assert cal["experts_calibrated"] + cal["experts_unrouted"] == len(manifest["experts"])
    tensors = [t for row in manifest["experts"] for t in row["tensors"]]
    calibrated = [t for t in tensors if "calib_snr_db" in t]
    assert calibrated and all(t["calib_tokens"] > 0 for t in calibrated)
    assert all(t["calib_gain_db"] >= 0 for t in calibrated)  # never worse than plain on H


def test_without_calibrate_the_vault_has_no_calibration(vaults: dict) -> None:
    res = vaults["plain"]
    manifest = json.loads(res.vault.with_name(res.vault.name + ".manifest.json").read_text())
    assert "calibration" not in manifest["source"]
    assert res.summary()["calibration"] is None


def _manifest(res: Any) -> bytes:
    return res.vault.with_name(res.vault.name + ".manifest.json").read_bytes()


def test_calibration_is_deterministic(model: dict, vaults: dict, tmp_path: Path) -> None:
    """The same command twice: the same vault and the same manifest, byte for byte (issue
    31: the seconds and peak memory the run measured went into the manifest); what it
    measured is the summary's."""
    again = _sculpt(model, tmp_path / "again", calibrate=model["root"] / "calib.npy")
    first = vaults["calib"]
    assert again.vault.read_bytes() == first.vault.read_bytes()
    assert _manifest(again) == _manifest(first)
    recorded = json.loads(_manifest(first))["source"]["calibration"]
    measured = ("seconds", "peak_rss_bytes", "peak_device_bytes")
    assert not set(measured) & set(recorded)
    assert set(measured) <= set(first.calibration)
    assert {k: v for k, v in first.calibration.items() if k not in measured} == recorded


def test_encoding_workers_share_the_cores_among_their_blas_threads(
    model: dict, vaults: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from smoe.plumbing.cpus import usable_cores
    from smoe.sculpt import workers

    calls = tmp_path / "calls"
    calls.mkdir()

    def record(n: int) -> bool:  # runs in each forked worker
        (calls / str(os.getpid())).write_text(str(n))
        return True

    monkeypatch.setattr(workers, "limit_blas_threads", record)
    res = sculpt(
        model["ck"],
        tmp_path / "three-workers",
        SculptOptions(bits=2, jobs=3, calibrate=model["root"] / "calib.npy"),
    )
    got = sorted(int(p.read_text()) for p in calls.iterdir())
    assert got == [max(1, usable_cores() // 3)] * 6  # 3 workers for the 8 experts of a layer
    assert res.vault.read_bytes() == vaults["calib"].vault.read_bytes()


def test_unrouted_experts_keep_the_plain_encoding(
    model: dict, vaults: dict, tmp_path: Path
) -> None:
    res = _sculpt(model, tmp_path / "two", calibrate=model["root"] / "two.npy")
    cal = res.calibration
    assert cal["experts_unrouted"] >= 4 * 2  # at least 4 of 8 in each of the 2 layers
    manifest = json.loads(res.vault.with_name(res.vault.name + ".manifest.json").read_text())
    plain = vaults["plain"].vault
    with Vault.open(res.vault) as v, Vault.open(plain) as p:
        for row in manifest["experts"]:
            key = (row["layer"], row["expert"])
            routed = "calib_snr_db" in row["tensors"][0]
            same = _codes(v[key]) == _codes(p[key])
            assert same or routed, key  # unrouted: the plain encoder's bytes
    assert (
        sum(1 for row in manifest["experts"] if "calib_snr_db" not in row["tensors"][0])
        == (cal["experts_unrouted"])
    )


def _codes(expert: Any) -> list[bytes]:
    return [bytes(t.packed) + bytes(t.scales) for t in expert.tensors]


def test_an_interrupted_calibration_resumes_to_the_same_bytes(
    model: dict, vaults: dict, tmp_path: Path
) -> None:
    out = tmp_path / "resumed"
    opts = SculptOptions(bits=2, jobs=1, calibrate=model["root"] / "calib.npy")

    def stop(done: int, total: int, bytes_in: int) -> None:
        if done == 10:  # inside layer 1
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sculpt(model["ck"], out, opts, progress=stop)
    res = sculpt(model["ck"], out, SculptOptions(**{**opts.__dict__, "resume": True}))
    assert res.experts_resumed == 10
    first = vaults["calib"]
    assert res.vault.read_bytes() == first.vault.read_bytes()
    # the counts cover the 10 kept experts too (issue 31: 6 calibrated, not 16); the whole
    # manifest is the clean run's
    counts = ("experts_calibrated", "experts_unrouted", "tensors_plain_fallback")
    assert [res.calibration[k] for k in counts] == [first.calibration[k] for k in counts]
    assert res.calibration["experts_calibrated"] + res.calibration["experts_unrouted"] == 16
    assert _manifest(res) == _manifest(first)


def test_a_resume_counts_the_kept_experts_no_token_reached(model: dict, tmp_path: Path) -> None:
    """Two tokens reach at most 4 of a layer's 8 experts: a resume that keeps layer 0 counts
    its unrouted experts as the clean run does (issue 31)."""
    opts = SculptOptions(bits=2, jobs=1, calibrate=model["root"] / "two.npy")
    clean = sculpt(model["ck"], tmp_path / "clean", opts)
    out = tmp_path / "resumed"

    def stop(done: int, total: int, bytes_in: int) -> None:
        if done == 8:  # layer 0 done
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sculpt(model["ck"], out, opts, progress=stop)
    res = sculpt(model["ck"], out, dataclasses.replace(opts, resume=True))
    assert res.experts_resumed == 8
    assert clean.calibration["experts_unrouted"] >= 8
    counts = ("experts_calibrated", "experts_unrouted", "tensors_plain_fallback")
    assert [res.calibration[k] for k in counts] == [clean.calibration[k] for k in counts]
    assert _manifest(res) == _manifest(clean)


def _with_inf(src: Path, dst: Path, name: str) -> None:
    """A copy of the checkpoint ``src`` at ``dst`` whose tensor ``name`` is all inf."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    tensors[name] = torch.full_like(tensors[name], float("inf"))
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})


def test_non_finite_activations_keep_the_layers_done_for_resume(
    model: dict, vaults: dict, tmp_path: Path
) -> None:
    """An inf weight in layer 1 makes its experts' inputs non-finite: the run stops as an
    interruption does, naming the layer, the expert and the cause; layer 0's experts stay
    in the partial vault, and once the weight is mended --resume keeps them and finishes the
    clean run's vault and manifest (issue 31: everything was deleted)."""
    ck = tmp_path / model["ck"].name  # the clean run's name: the same outputs
    _with_inf(model["ck"], ck, "model.layers.1.post_attention_layernorm.weight")
    out = tmp_path / "o"
    args = ("sculpt", ck, out, "--bits", "2", "--calibrate", model["root"] / "calib.npy")
    got = _cli(*args, cwd=tmp_path)
    assert got.returncode == 1
    assert re.fullmatch(
        f"error: {re.escape(str(ck))}: --calibrate: layer 1, expert [0-7]: non-finite "
        r"activations in the routed inputs of its gate_proj and up_proj \((nan|-?inf)\); the "
        "experts done so far are kept in the partial vault: fix the cause, then run the same "
        "command with --resume\n",
        got.stderr,
    ), got.stderr
    stem = ck.name
    assert sorted(p.name for p in out.iterdir()) == [
        f".{stem}.smoe.journal",
        f".{stem}.smoe.partial",
    ]
    shutil.copy(model["ck"] / "model.safetensors", ck / "model.safetensors")  # mended
    got = _cli(*args, "--resume", "--json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["experts_resumed"] == 8  # layer 0's
    first = vaults["calib"]
    assert (out / f"{stem}.smoe").read_bytes() == first.vault.read_bytes()
    assert (out / f"{stem}.smoe.manifest.json").read_bytes() == _manifest(first)


# ---- the command line -----------------------------------------------------------------
def _cli(*args: str | os.PathLike, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "smoe", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_cli_calibrate_prints_its_summary_line(model: dict, tmp_path: Path) -> None:
    got = _cli("sculpt", model["ck"], tmp_path / "o", "--bits", "4", "--calibrate",
               model["root"] / "calib.npy", "--json", cwd=tmp_path)  # fmt: skip
    assert got.returncode == 0, got.stderr
    cal = json.loads(got.stdout)["calibration"]
    assert (cal["file"], cal["tokens"], cal["device"]) == ("calib.npy", 768, "cpu")
    got = _cli("sculpt", model["ck"], tmp_path / "t", "--calibrate",
               model["root"] / "calib.npy", "--calib-max-tokens", "64", cwd=tmp_path)  # fmt: skip
    assert got.returncode == 0, got.stderr
    line = next(x for x in got.stdout.splitlines() if x.startswith("calibration"))
    assert "calib.npy: 64 tokens in 2 sequences on cpu" in line


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d, v: (d / "e.npy").write_bytes(b""), "{p}: empty file, no token ids"),
        (
            lambda d, v: np.save(d / "e.npy", np.array([[1, v]])),
            "{p}: token id {v} at [0, 1] is out of range: ids must be in 0..{m} (vocab_size {v})",
        ),
        (
            lambda d, v: np.save(d / "e.npy", np.zeros((2, 4), np.float32)),
            "{p}: token ids must be integers, got float32",
        ),
    ],
    ids=["empty", "id-past-vocab", "float"],
)
def test_bad_data_is_refused_before_anything_is_written(
    model: dict, tmp_path: Path, make: Any, message: str
) -> None:
    make(tmp_path, model["vocab"])
    path = tmp_path / "e.npy"
    with pytest.raises(RefusedInput) as err:
        _sculpt(model, tmp_path / "o", calibrate=path)
    want = message.format(p=path, v=model["vocab"], m=model["vocab"] - 1)
    assert str(err.value) == want
    assert not (tmp_path / "o").exists()


def test_cli_refuses_bad_data_in_one_line(model: dict, tmp_path: Path) -> None:
    (tmp_path / "e.npy").write_bytes(b"")
    path = tmp_path / "e.npy"
    message = "{p}: empty file, no token ids"
    got = _cli("sculpt", model["ck"], tmp_path / "o", "--calibrate", path, cwd=tmp_path)
    assert got.returncode == 1
    assert (
        got.stderr
        == "error: " + message.format(p=path, v=model["vocab"], m=model["vocab"] - 1) + "\n"
    )
    assert not (tmp_path / "o").exists()


def test_cli_refuses_text_without_a_tokenizer(model: dict, tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("def f():\n    return 1\n")
    got = _cli("sculpt", model["ck"], tmp_path / "o", "--calibrate", "c.txt", cwd=tmp_path)
    assert got.returncode == 1
    assert got.stderr.startswith("error: c.txt: text needs the checkpoint's tokenizer")
    assert len(got.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--scale", "absmax"],
            "--calibrate chooses codes and scales itself; it cannot be given --scale absmax",
        ),
        (
            ["--imatrix", "x.dat"],
            "--calibrate and --imatrix: give one (the calibration's statistics hold the "
            "importance matrix's and more)",
        ),
    ],
    ids=["absmax", "imatrix"],
)
def test_cli_refuses_options_calibration_cannot_go_with(
    model: dict, tmp_path: Path, extra: list[str], message: str
) -> None:
    np.save(tmp_path / "c.npy", np.array([[1, 2]]))
    got = _cli("sculpt", model["ck"], tmp_path / "o", "--calibrate", "c.npy", *extra,
               cwd=tmp_path)  # fmt: skip
    assert (got.returncode, got.stderr) == (2, f"error: {message}\n")


@pytest.mark.parametrize(
    ("change", "cause"),
    [
        ({"decoder_sparse_step": 0}, "ZeroDivisionError: "),
        ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "no-such-rope"}}, "KeyError: "),
    ],
    ids=["sparse-step-0", "unknown-rope-type"],
)
def test_cli_refuses_a_config_transformers_cannot_build(
    model: dict, tmp_path: Path, change: dict, cause: str
) -> None:
    """Values smoe's own reading of the config accepts but transformers' modeling code
    raises on: one line naming the config and the cause, refused before anything is
    written (issue 31: an internal error)."""
    ck = tmp_path / "ck"
    shutil.copytree(model["ck"], ck)
    config = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps(config | change))
    np.save(tmp_path / "c.npy", np.array([[1, 2]]))
    got = _cli("sculpt", ck, tmp_path / "o", "--calibrate", "c.npy", cwd=tmp_path)
    assert got.returncode == 1
    head = (
        f"error: {ck / 'config.json'}: --calibrate: transformers cannot build the model from it: "
    )
    assert got.stderr.startswith(head + cause), got.stderr
    assert len(got.stderr.splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cpu:0", "cuda:1234"])
def test_cli_refuses_a_device_that_is_not_one(model: dict, tmp_path: Path, device: str) -> None:
    np.save(tmp_path / "c.npy", np.array([[1, 2]]))
    got = _cli("sculpt", model["ck"], tmp_path / "o", "--calibrate", "c.npy",
               "--device", device, cwd=tmp_path)  # fmt: skip
    assert (got.returncode, got.stderr) == (
        2,
        f"error: --device {device}: not a device the calibration runs on: give cpu, cuda or "
        "cuda:N (N: a CUDA device's index)\n",
    )
    assert not (tmp_path / "o").exists()


def test_cli_refuses_a_cuda_device_torch_does_not_have(model: dict, tmp_path: Path) -> None:
    """One more than torch has here (none without CUDA): exit 2 before anything is written."""
    np.save(tmp_path / "c.npy", np.array([[1, 2]]))
    device = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    got = _cli("sculpt", model["ck"], tmp_path / "o", "--calibrate", "c.npy",
               "--device", device, cwd=tmp_path)  # fmt: skip
    assert got.returncode == 2
    assert got.stderr.startswith(f"error: --device {device}: ") and got.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("available", "count", "device", "message"),
    [
        (False, 0, "cuda", "--device cuda: no CUDA device is available to torch here"),
        (True, 2, "cuda:2", "--device cuda:2: torch has 2 CUDA devices here (cuda:0 to cuda:1)"),
        (True, 1, "cuda:1", "--device cuda:1: torch has 1 CUDA device here (cuda:0)"),
    ],
)
def test_a_cuda_device_is_checked_against_what_torch_has(
    available: bool, count: int, device: str, message: str
) -> None:
    from types import SimpleNamespace

    from smoe.errors import UsageError
    from smoe.sculpt.calibrate.runner import check_device_present

    cuda = SimpleNamespace(is_available=lambda: available, device_count=lambda: count)
    fake = SimpleNamespace(cuda=cuda)
    with pytest.raises(UsageError) as err:
        check_device_present(fake, device)
    assert str(err.value) == message
    check_device_present(fake, "cpu")
    if available:
        check_device_present(fake, f"cuda:{count - 1}")


def test_cli_without_torch_names_the_extra(model: dict, tmp_path: Path) -> None:
    np.save(tmp_path / "c.npy", np.array([[1, 2]]))
    code = (
        "import sys; sys.modules['torch'] = None; from smoe.cli import main; "
        f"sys.exit(main(['sculpt', {str(model['ck'])!r}, 'o', '--calibrate', 'c.npy']))"
    )
    got = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 2
    assert got.stderr == (
        "error: --calibrate needs torch and transformers (torch is missing): "
        "pip install 'smoe[calibrate]'\n"
    )


# ---- one decoder layer at a time --------------------------------------------------------
def test_calibration_holds_one_layer_at_a_time(tmp_path: Path) -> None:
    """Two layers or twelve, the most model weights held at once is one decoder layer's (its
    float32 parameters, the experts in the stand-in): the model is never held whole. (The
    resident memory this saves is make bench's figure, not a test's: it depends on the
    allocator and the page cache.)"""
    held = {}
    for layers in (2, 12):
        ck = tmp_path / f"l{layers}"
        m = tiny.write("qwen3_moe", ck, overrides={"num_hidden_layers": layers})
        if layers == 2:
            np.save(tmp_path / "c.npy", _ids(0, 4, 16, m.config.vocab_size))
            per_layer = sum(p.numel() for p in m.model.layers[0].parameters()) * 4
        opts = SculptOptions(bits=2, jobs=1, calibrate=tmp_path / "c.npy")
        held[layers] = sculpt(ck, tmp_path / f"o{layers}", opts).calibration["peak_weight_bytes"]
    assert held[2] == held[12] == per_layer, (held, per_layer)
