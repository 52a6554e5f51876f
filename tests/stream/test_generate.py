"""`smoe-stream generate`: its outputs (ids, --json smoe-generate/1, --logits, --trace) and its
refusals, each one line and a non-zero exit with nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import SMOE_STREAM, one_line, run, strict_json

pytest.importorskip("torch", reason="tiny checkpoints need the hf extra (torch)")
pytest.importorskip("transformers", reason="tiny checkpoints need the hf extra")

from smoe.sculpt import SculptOptions, sculpt
from smoe_testkit import tiny

PROMPT = "1,5,9,17,33"


def sculpted(root: Path, model_type: str, overrides: dict[str, Any] | None = None) -> Path:
    tiny.write(model_type, root / "ck", overrides=overrides)
    return sculpt(root / "ck", root / "out", SculptOptions(jobs=1)).vault


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen3_moe vault (2 MoE layers of 4 experts, top-2, vocabulary 128)."""
    return sculpted(tmp_path_factory.mktemp("q3"), "qwen3_moe")


def generate(*args: object) -> Any:
    return run("generate", *args, command=[SMOE_STREAM])


def test_prints_the_generated_ids(smoe_stream: Path, vault: Path) -> None:
    # buffered: O_DIRECT refused (tmpfs) would add a warning
    proc = generate(vault, "--prompt", PROMPT, "--max-new", 6, "--buffered")
    assert proc.returncode == 0 and proc.stderr == ""
    ids = [int(t) for t in proc.stdout.strip().split(",")]
    assert len(ids) == 6 and all(0 <= t < 128 for t in ids)


def test_json_counts_what_the_cache_did(smoe_stream: Path, vault: Path) -> None:
    plain = generate(vault, "--prompt", PROMPT, "--max-new", 8, "--cache-slots", 3)
    proc = generate(vault, "--prompt", PROMPT, "--max-new", 8, "--cache-slots", 3, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    assert doc["schema"] == "smoe-generate/1" and doc["ok"] is True
    assert ",".join(map(str, doc["tokens"])) == plain.stdout.strip()
    cache, steps = doc["cache"], doc["per_token"]
    assert cache["slots"] == 3 and len(steps) == 8 and steps[0]["prefill"] is True
    for key in ("hits", "misses", "blobs", "bytes"):
        assert sum(s[key] for s in steps) == cache[key], key
    # every miss is one blob read, and so is every prefetch
    assert cache["blobs"] == cache["misses"] + cache["prefetched"] and cache["misses"] > 0
    assert cache["hit_rate"] == pytest.approx(cache["hits"] / (cache["hits"] + cache["misses"]))
    if cache["prefetched"] == 0:  # no demand paging beats the optimum (prefetching may)
        assert cache["hit_rate"] <= cache["belady_hit_rate"] + 1e-12
    for s in steps[1:]:  # each decoded token asks for top-2 in each of 2 MoE layers
        assert s["hits"] + s["misses"] == 4


def test_logits_and_trace(smoe_stream: Path, vault: Path, tmp_path: Path) -> None:
    logits, trace = tmp_path / "l.f32", tmp_path / "t.jsonl"
    proc = generate(vault, "--prompt", PROMPT, "--max-new", 5, "--logits", logits, "--trace", trace)
    assert proc.returncode == 0, proc.stderr
    rows = np.fromfile(logits, dtype=np.float32).reshape(5, 128)
    ids = [int(t) for t in proc.stdout.strip().split(",")]
    assert [int(r.argmax()) for r in rows] == ids  # greedy: each id is its step's argmax
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines[0]["schema"] == "smoe-trace/1"
    steps = [s for s in lines[1:] if "experts" in s]
    # the prompt's chunk and 4 decoded tokens, 2 MoE layers each
    assert [(s["token"], s["layer"]) for s in steps] == [
        (t, layer) for t in (0, 5, 6, 7, 8) for layer in (0, 1)
    ]
    assert all(len(s["experts"]) == 2 for s in steps[2:])
    # while a decoded token's layer 0 runs, layer 1's router applied early names a guess
    hints = [s for s in lines[1:] if "hint" in s]
    assert [(s["token"], s["layer"], len(s["hint"])) for s in hints] == [
        (t, 1, 2) for t in (5, 6, 7, 8)
    ]
    order = [(s["token"], s["layer"], "hint" in s) for s in lines[1:]]
    for t in (5, 6, 7, 8):  # each hint after its token's layer 0, before its layer 1
        assert order.index((t, 0, False)) < order.index((t, 1, True)) < order.index((t, 1, False))


def test_sampling_is_reproducible_by_seed(smoe_stream: Path, vault: Path) -> None:
    args = ("--prompt", PROMPT, "--max-new", 12, "--temperature", "1.5", "--top-k", 20)
    runs = [generate(vault, *args, "--top-p", "0.9", "--seed", 7) for _ in range(2)]
    assert runs[0].returncode == 0 and runs[0].stdout == runs[1].stdout


def test_threads_give_the_same_logits(smoe_stream: Path, vault: Path, tmp_path: Path) -> None:
    outs = []
    for threads in (1, 3):
        out = tmp_path / f"l{threads}.f32"
        proc = generate(
            vault,
            "--prompt",
            PROMPT,
            "--max-new",
            4,
            "--threads",
            threads,
            "--io-threads",
            threads,
            "--logits",
            out,
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(np.fromfile(out, dtype=np.float32))
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=1e-5)


def refusal(proc: Any, code: int = 1) -> str:
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == ""
    return one_line(proc)


def test_refuses_ids_outside_the_vocabulary(smoe_stream: Path, vault: Path) -> None:
    line = refusal(generate(vault, "--prompt", "1,128", "--max-new", 2))
    assert line == "smoe-stream: --prompt: token id 128 is outside the vocabulary of 128"


def test_refuses_a_cache_below_one_layers_top_k(smoe_stream: Path, vault: Path) -> None:
    line = refusal(generate(vault, "--prompt", PROMPT, "--max-new", 2, "--cache-slots", 1))
    assert line.startswith("smoe-stream: ") and "1" in line and "2" in line


def test_refuses_a_scout_of_another_model(smoe_stream: Path, vault: Path, tmp_path: Path) -> None:
    other = sculpted(tmp_path, "qwen3_moe", {"hidden_size": 32})
    scout = other.with_name(other.stem + ".scout.safetensors")
    line = refusal(generate(vault, "--prompt", PROMPT, "--max-new", 2, "--scout", scout))
    assert line == (
        f"smoe-stream: {scout}: model.embed_tokens.weight is [128, 32], the vault's model "
        "needs [128, 64] (a scout of another model?)"
    )


def test_refuses_a_truncated_scout(smoe_stream: Path, vault: Path, tmp_path: Path) -> None:
    scout = tmp_path / "cut.safetensors"
    whole = vault.with_name(vault.stem + ".scout.safetensors").read_bytes()
    scout.write_bytes(whole[: len(whole) // 2])
    line = refusal(generate(vault, "--prompt", PROMPT, "--max-new", 2, "--scout", scout))
    assert line.startswith(f"smoe-stream: {scout}: truncated scout: ")
    scout.write_bytes(whole[:6])
    line = refusal(generate(vault, "--prompt", PROMPT, "--max-new", 2, "--scout", scout))
    assert line == f"smoe-stream: {scout}: truncated scout: 6 bytes, no safetensors header"


def test_refuses_an_output_that_is_an_input(smoe_stream: Path, vault: Path, tmp_path: Path) -> None:
    copy = tmp_path / "v" / vault.name
    shutil.copytree(vault.parent, copy.parent)
    before = copy.read_bytes()
    proc = generate(copy, "--prompt", PROMPT, "--max-new", 2, "--logits", copy)
    assert "refusing to overwrite an input" in refusal(proc)
    assert copy.read_bytes() == before


def test_json_error_document(smoe_stream: Path, vault: Path) -> None:
    proc = generate(vault, "--prompt", "999", "--max-new", 1, "--json")
    assert proc.returncode == 1
    doc = strict_json(proc.stdout)
    assert doc["schema"] == "smoe-generate/1" and doc["ok"] is False
    assert doc["error"]["exit_code"] == 1 and "999" in doc["error"]["message"]


@pytest.mark.parametrize(
    "args",
    [("--max-new", "2"), ("--prompt", "1,,2", "--max-new", "2"), ("--prompt", "1")],
)
def test_usage_errors(smoe_stream: Path, vault: Path, args: tuple[str, ...]) -> None:
    line = refusal(generate(vault, *args), 2)
    assert line.startswith("error: ") and line.endswith("(see smoe-stream --help)")


def test_refuses_a_family_it_does_not_run(smoe_stream: Path, tmp_path: Path) -> None:
    """deepseek_v2's multi-head latent attention: refused naming the keys it lacks."""
    other = sculpted(tmp_path, "deepseek_v2")
    line = refusal(generate(other, "--prompt", PROMPT, "--max-new", 2))
    assert line.startswith(f"smoe-stream: {other}: model type 'deepseek_v2' is not one the ")
    assert line.endswith(
        "it does not implement: topk_method, rope_scaling, q_lora_rank, kv_lora_rank, "
        "qk_nope_head_dim, qk_rope_head_dim, v_head_dim"
    )


def test_refuses_a_partial_vault(smoe_stream: Path, tmp_path: Path) -> None:
    tiny.write("qwen3_moe", tmp_path / "ck")
    part = sculpt(tmp_path / "ck", tmp_path / "out", SculptOptions(jobs=1, max_experts=2)).vault
    line = refusal(generate(part, "--prompt", PROMPT, "--max-new", 2))
    assert line == (
        f"smoe-stream: {part}: a partial vault (layer 0 holds 2 of 4 experts): the decoder "
        "needs every expert the router may pick"
    )


def test_mutated_scouts_never_crash(smoe_stream: Path, vault: Path, tmp_path: Path) -> None:
    """Bytes of the scout's header and length changed at random: a run, or one line."""
    whole = vault.with_name(vault.stem + ".scout.safetensors").read_bytes()
    header_end = 8 + int.from_bytes(whole[:8], "little")
    rng = np.random.default_rng(11)
    scout = tmp_path / "m.safetensors"
    for _ in range(40):
        data = bytearray(whole)
        for at in rng.integers(0, header_end, size=int(rng.integers(1, 4))):
            data[at] = int(rng.integers(0, 256))
        scout.write_bytes(bytes(data))
        proc = generate(vault, "--prompt", PROMPT, "--max-new", 1, "--scout", scout)
        assert proc.returncode in (0, 1), proc.stderr
        if proc.returncode:
            one_line(proc)


def test_the_scouts_shapes_win_over_the_block(
    smoe_stream: Path, vault: Path, tmp_path: Path
) -> None:
    """A block that denies the q/k norms the scout has: a warning, and the same run."""
    copy = tmp_path / "v" / vault.name
    shutil.copytree(vault.parent, copy.parent)
    data = bytearray(copy.read_bytes())
    flags_at = int.from_bytes(data[60:64], "little") + 12  # reserved_ext: the arch block
    data[flags_at] &= ~2  # has_qk_norm off
    copy.write_bytes(bytes(data))
    proc = generate(copy, "--prompt", PROMPT, "--max-new", 4, "--buffered")
    assert proc.returncode == 0
    assert proc.stderr == (
        f"smoe-stream: warning: {copy}: the arch block says has_qk_norm 0, the scout has q/k "
        "norms; the scout's shapes win\n"
    )
    assert proc.stdout == generate(vault, "--prompt", PROMPT, "--max-new", 4).stdout
    doc = strict_json(generate(copy, "--prompt", PROMPT, "--max-new", 1, "--json").stdout)
    assert doc["warnings"] == [proc.stderr.removeprefix("smoe-stream: warning: ").strip()]


def with_config(vault: Path, tmp_path: Path, **settings: Any) -> Path:
    """A copy of the vault and its companions whose config copy sets ``settings``."""
    folder = tmp_path / "copy"
    shutil.copytree(vault.parent, folder)
    config = folder / vault.name.replace(".smoe", ".config.json")
    doc = json.loads(config.read_text())
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key].update(value)
        else:
            doc[key] = value
    config.write_text(json.dumps(doc))
    return folder / vault.name


@pytest.mark.parametrize(
    "settings, named",
    [
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
            "rope_parameters.rope_type yarn",
        ),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.type linear"),
        ({"clip_qkv": 8.0}, "clip_qkv 8"),
    ],
)
def test_refuses_a_config_setting_it_does_not_implement(
    smoe_stream: Path, vault: Path, tmp_path: Path, settings: dict[str, Any], named: str
) -> None:
    """A setting that changes the math and that the decoder does not run is refused in one
    line naming it, never run as if it were not there."""
    copy = with_config(vault, tmp_path, **settings)
    proc = generate(copy, "--prompt", PROMPT, "--max-new", 2, "--buffered")
    line = refusal(proc)
    assert "sets what the decoder does not implement" in line and named in line


def test_a_sliding_window_counts_only_once_outgrown(
    smoe_stream: Path, vault: Path, tmp_path: Path
) -> None:
    """A window the run stays inside changes nothing (the same tokens); one it outgrows is
    refused naming it."""
    copy = with_config(vault, tmp_path, sliding_window=8, use_sliding_window=True)
    plain = generate(vault, "--prompt", PROMPT, "--max-new", 3, "--buffered")
    inside = generate(copy, "--prompt", PROMPT, "--max-new", 3, "--buffered")
    assert inside.returncode == 0 and inside.stdout == plain.stdout
    line = refusal(generate(copy, "--prompt", PROMPT, "--max-new", 6, "--buffered"))
    assert "outgrow the config copy's sliding_window of 8" in line
    off = with_config(vault, tmp_path / "off", sliding_window=8, use_sliding_window=False)
    assert generate(off, "--prompt", PROMPT, "--max-new", 6, "--buffered").returncode == 0
