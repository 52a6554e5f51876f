"""Checkpoint and config inputs that lie are refused, in one line, before anything is written.

Issue 10: shard names that leave the checkpoint folder, safetensors headers that do not
describe their file (checked at least as strictly as the ``safetensors`` library), config
values of the wrong type, and configs the tensors contradict.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors import safe_open

from smoe.errors import SmoeError
from smoe.interop.safetensors_io import read_header
from smoe_testkit.synth import write_checkpoint

from fixtures_data import FIXTURES
from helpers import refused, run, snapshot


# ---- helpers ---------------------------------------------------------------------------
def checkpoint(root: Path, **kw: object) -> Path:
    return write_checkpoint(root, **{"layers": 2, "experts": 2, "d_model": 64, "ffn": 32, **kw})


def edit_config(root: Path, **changes: object) -> None:
    """Set (or, with None, remove) config.json keys; NaN is written as the literal NaN."""
    cfg = json.loads((root / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (root / "config.json").write_text(json.dumps(cfg))


def rewrite_header(path: Path, edit: Callable[[str], str]) -> str:
    """Replace a safetensors file's JSON header by ``edit(header)``, keeping the data."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = edit(raw[8 : 8 + n].decode())
    data = header.encode()
    path.write_bytes(struct.pack("<Q", len(data)) + data + raw[8 + n :])
    return header


def dry_run(model: Path, tmp_path: Path) -> dict:
    proc = run("sculpt", model, tmp_path / "dry", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ---- case 1: shard names from the index ------------------------------------------------
@pytest.mark.parametrize(
    ("shard", "reason"),
    [
        ("../elsewhere.safetensors", "has a '..' component"),
        ("ABSOLUTE", "is an absolute path"),
        ("sub/../model-00001-of-00002.safetensors", "has a '..' component"),
        ("", "is empty"),
        ("model\x00.safetensors", "has a NUL byte"),
    ],
)
def test_index_naming_a_shard_outside_the_folder_is_refused(
    tmp_path: Path, shard: str, reason: str
) -> None:
    ck = checkpoint(tmp_path / "ck", shards=2)
    elsewhere = tmp_path / "elsewhere.safetensors"  # a real shard: read and copied before
    os.replace(ck / "model-00001-of-00002.safetensors", elsewhere)
    if shard == "ABSOLUTE":
        shard = str(elsewhere)
    index = ck / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"] = {
        k: shard if v == "model-00001-of-00002.safetensors" else v
        for k, v in doc["weight_map"].items()
    }
    index.write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert refused(["sculpt", ck, out], unchanged=[ck, elsewhere], absent=out) == (
        f"error: {index}: tensor 'model.embed_tokens.weight' maps to shard {shard!r}, "
        f"which {reason}; refused: shards must be relative paths inside the checkpoint folder"
    )


@pytest.mark.parametrize(
    ("weight_map", "message"),
    [
        (
            {"model.embed_tokens.weight": 5},
            "tensor 'model.embed_tokens.weight' maps to 5, expected a shard file name (a string)",
        ),
        (
            ["model.safetensors"],
            "no weight_map (expected a JSON object of tensor name -> shard file name)",
        ),
    ],
)
def test_weight_map_must_map_names_to_strings(
    tmp_path: Path, weight_map: object, message: str
) -> None:
    ck = checkpoint(tmp_path / "ck")
    index = ck / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    out = tmp_path / "out"
    assert refused(["sculpt", ck, out], unchanged=[ck], absent=out) == f"error: {index}: {message}"


def hf_snapshot(src: Path, cache: Path, rev: str = "0123abcd") -> Path:
    """``src`` laid out as a HuggingFace cache: snapshots/<rev>/NAME -> ../../blobs/<sha256>."""
    blobs, snap = cache / "blobs", cache / "snapshots" / rev
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for p in sorted(src.iterdir()):
        data = p.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        (snap / p.name).symlink_to(f"../../blobs/{digest}")
    return snap


def test_huggingface_cache_snapshot_of_symlinks_sculpts(tmp_path: Path) -> None:
    plain = checkpoint(tmp_path / "0123abcd", shards=2)
    cache = tmp_path / "hub" / "models--org--tiny-moe"
    snap = hf_snapshot(plain, cache)
    assert all(p.is_symlink() for p in snap.iterdir())
    before = snapshot(cache)
    proc = run("sculpt", snap, tmp_path / "out-cache")
    assert proc.returncode == 0, proc.stderr
    assert run("sculpt", plain, tmp_path / "out-plain").returncode == 0
    for suffix in (".smoe", ".scout.safetensors"):  # stem: the model's name, not the commit
        got = (tmp_path / "out-cache" / f"tiny-moe{suffix}").read_bytes()
        assert got == (tmp_path / "out-plain" / f"0123abcd{suffix}").read_bytes()
    assert snapshot(cache) == before


def test_shard_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    snap = hf_snapshot(checkpoint(tmp_path / "ck", shards=2), tmp_path / "cache")
    fifo = tmp_path / "cache" / "blobs" / "fifo"
    os.mkfifo(fifo)
    shard = snap / "model-00002-of-00002.safetensors"
    shard.unlink()
    shard.symlink_to("../../blobs/fifo")
    out = tmp_path / "out"
    assert (
        refused(["sculpt", snap, out], 2, unchanged=[tmp_path / "cache"], absent=out)
        == f"error: {shard}: not a regular file (a FIFO)"
    )


# ---- case 2: safetensors headers that lie ------------------------------------------------
A = '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
B = '"b":{"dtype":"F16","shape":[2,2],"data_offsets":[8,16]}'
DATA = bytes(range(16))
LYING = {  # header, data, what we say after "PATH: "; the library refuses each of them too
    "invalid UTF-8": (b'{"\xff":1}', b"", "header is not valid UTF-8 at offset 10 (byte 0xff)"),
    "not an object": ("[1,2]", b"", "header at offset 8 is not a JSON object"),
    "duplicate field": (
        '{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has the key 'dtype' twice",
    ),
    "minus zero offset": (  # found by `make fuzz`: json reads -0 as the int 0
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[-0,8]},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has data_offsets [-0.0, 8], expected two unsigned "
        "64-bit integers",
    ),
    "lone surrogate name": (
        '{"\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' + B + "}",
        DATA,
        "tensor '\\ud800' (entry at offset 9) has a name that is not valid Unicode (lone "
        "surrogate)",
    ),
    "metadata value not a string": (
        '{"__metadata__":{"format":1},' + A + "," + B + "}",
        DATA,
        "__metadata__ (entry at offset 9) key 'format' is 1, expected a string",
    ),
    "metadata not an object": (
        '{"__metadata__":[],' + A + "," + B + "}",
        DATA,
        "__metadata__ (entry at offset 9) is [], expected an object of strings",
    ),
    "metadata lone surrogate": (
        '{"__metadata__":{"k":"\\udc00"},' + A + "," + B + "}",
        DATA,
        "__metadata__ (entry at offset 9) key 'k' is not valid Unicode (lone surrogate)",
    ),
    "unknown dtype": (
        '{"a":{"dtype":"F99","shape":[2],"data_offsets":[0,8]},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has an unsupported dtype \"F99\"",
    ),
    "bool in shape": (
        '{"a":{"dtype":"F32","shape":[true,2],"data_offsets":[0,8]},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has shape [true, 2], expected a list of unsigned "
        "64-bit integers",
    ),
    "negative shape": (
        '{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has shape [-2], expected a list of unsigned 64-bit "
        "integers",
    ),
    "float in shape": (
        '{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has shape [2.0], expected a list of unsigned 64-bit "
        "integers",
    ),
    "shape beyond u64": (
        '{"a":{"dtype":"F32","shape":[18446744073709551617],"data_offsets":[0,8]},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has shape [18446744073709551617], expected a list of "
        "unsigned 64-bit integers",
    ),
    "integer of 5000 digits": (
        '{"a":{"dtype":"F32","shape":[' + "9" * 5000 + '],"data_offsets":[0,8]},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has an integer too long to read",
    ),
    "bools as offsets": (
        '{"a":{"dtype":"U8","shape":[1],"data_offsets":[false,true]},'
        '"b":{"dtype":"F16","shape":[2,2],"data_offsets":[1,9]}}',
        DATA[:9],
        "tensor 'a' (entry at offset 9) has data_offsets [false, true], expected two "
        "unsigned 64-bit integers",
    ),
    "three offsets": (
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has data_offsets [0, 8, 9], expected two unsigned "
        "64-bit integers",
    ),
    "offsets reversed": (
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}',
        DATA[:8],
        "tensor 'a' (entry at offset 9) has data_offsets [8, 0], which end before they begin",
    ),
    "size mismatch": (
        '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has data_offsets [0, 8] holding 8 bytes, but F32 [3] "
        "needs 12",
    ),
    "overlap": (
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        '"b":{"dtype":"F16","shape":[2,2],"data_offsets":[4,12]}}',
        DATA[:12],
        "tensor 'b' data at offset 122 overlaps tensor 'a', which ends at offset 126",
    ),
    "hole": (
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        '"b":{"dtype":"F16","shape":[2,2],"data_offsets":[12,20]}}',
        DATA + b"1234",
        "tensor 'b' data at offset 131 leaves a hole of 4 bytes after tensor 'a', which ends "
        "at offset 127",
    ),
    "hole at the start": (
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
        DATA[:12],
        "tensor 'a' data at offset 67 leaves a hole of 4 bytes after the header, which ends "
        "at offset 63",
    ),
    "bytes after the last tensor": (
        "{" + A + "," + B + "}",
        DATA + b"xx",
        "2 bytes at offset 134 after tensor 'b' belong to no tensor",
    ),
    "data past the end": (
        "{" + A + "," + B + "}",
        DATA[:12],
        "tensor 'b' data ends at offset 134, beyond the end of the file (130 bytes)",
    ),
    "NaN": (
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":NaN},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has NaN, which is not JSON",
    ),
    "entry not an object": (
        '{"a":[1],' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) is [1], expected an object with dtype, shape and "
        "data_offsets",
    ),
    "missing shape": (
        '{"a":{"dtype":"F32","data_offsets":[0,8]},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has no 'shape'",
    ),
    "text after the object": (
        "{" + A + "," + B + "}x",
        DATA,
        "header has data after its JSON object at offset 118",
    ),
    "trailing comma": (
        "{" + A + "," + B + ",}",
        DATA,
        "header is not valid JSON at offset 118 (expecting a quoted key)",
    ),
    "control character in a name": (
        '{"a\x01":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' + B + "}",
        DATA,
        "header is not valid JSON at offset 11 (invalid control character)",
    ),
    "nested too deeply": (
        '{"__metadata__":' + "[" * 5000 + "]" * 5000 + "}",
        b"",
        "__metadata__ (entry at offset 9) is nested too deeply",
    ),
}
STRICTER = {  # the library accepts these; a converter must not guess
    "tensor named twice": (
        "{" + A + "," + A + "," + B + "}",
        DATA,
        "header names tensor 'a' twice, again at offset 62",
    ),
    "empty name": (
        '{"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' + B + "}",
        DATA,
        "tensor '' (entry at offset 9) has an empty name",
    ),
    "null metadata": (
        '{"__metadata__":null,' + A + "," + B + "}",
        DATA,
        "__metadata__ (entry at offset 9) is null, expected an object of strings",
    ),
    "unknown key in an entry": (
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1},' + B + "}",
        DATA,
        "tensor 'a' (entry at offset 9) has an unknown key 'x'",
    ),
}
VALID = {
    "plain": ("{" + A + "," + B + "}", DATA),
    "metadata": ('{"__metadata__":{"format":"pt"},' + A + "," + B + "}", DATA),
    "whitespace around": ("  {" + A + ", " + B + "}    ", DATA),
    "no tensors": ("{}", b""),
    "entries out of offset order": ("{" + B + "," + A + "}", DATA),
    "empty tensors": (
        '{"z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},"y":{"dtype":'
        '"U8","shape":[3,0],"data_offsets":[16,16]},' + A + "," + B + "}",
        DATA,
    ),
}


def safetensors_file(path: Path, header: str | bytes, data: bytes) -> Path:
    raw = header.encode() if isinstance(header, str) else header
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def library_accepts(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="np") as f:
            list(f.keys())
    except Exception:
        return False
    return True


@pytest.mark.parametrize("case", sorted(LYING))
def test_lying_header_refused_like_the_library(tmp_path: Path, case: str) -> None:
    header, data, message = LYING[case]
    path = safetensors_file(tmp_path / "x.safetensors", header, data)
    assert not library_accepts(path)
    with pytest.raises(SmoeError) as info:
        read_header(path)
    assert str(info.value) == f"{path}: {message}"


@pytest.mark.parametrize("case", sorted(STRICTER))
def test_header_refused_where_the_library_guesses(tmp_path: Path, case: str) -> None:
    header, data, message = STRICTER[case]
    path = safetensors_file(tmp_path / "x.safetensors", header, data)
    with pytest.raises(SmoeError) as info:
        read_header(path)
    assert str(info.value) == f"{path}: {message}"


@pytest.mark.parametrize("case", sorted(VALID))
def test_valid_header_accepted_like_the_library(tmp_path: Path, case: str) -> None:
    path = safetensors_file(tmp_path / "x.safetensors", *VALID[case])
    ours = read_header(path)
    raw = path.read_bytes()
    with safe_open(str(path), framework="np") as f:
        assert sorted(ours) == sorted(f.keys())
        for name, info in ours.items():
            want = f.get_tensor(name)
            assert info.shape == want.shape
            assert (
                raw[info.offset : info.offset + info.nbytes]
                == want.astype(want.dtype.newbyteorder("<")).tobytes()
            )


def test_header_length_limit_is_the_library_s(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 100_000_001) + b"{}")
    with pytest.raises(SmoeError) as info:
        read_header(path)
    assert str(info.value) == (
        f"{path}: header length 100000001 at offset 0 exceeds the "
        "safetensors limit of 100000000 bytes"
    )


def test_lying_shard_header_stops_the_sculpt(tmp_path: Path) -> None:
    ck = checkpoint(tmp_path / "ck")
    shard = ck / "model.safetensors"
    # before: the scout was written with this name and could not be opened afterwards
    header = rewrite_header(
        shard, lambda h: h.replace('"model.norm.weight"', '"model.norm\\ud800.weight"')
    )
    at = 8 + header.index('"model.norm\\ud800.weight"')
    out = tmp_path / "out"
    assert refused(["sculpt", ck, out], unchanged=[ck], absent=out) == (
        f"error: {shard}: tensor 'model.norm\\ud800.weight' (entry at offset {at}) has a name "
        "that is not valid Unicode (lone surrogate)"
    )


def test_bytes_after_the_last_tensor_stop_the_sculpt(tmp_path: Path) -> None:
    ck = checkpoint(tmp_path / "ck")
    shard = ck / "model.safetensors"
    last = max(read_header(shard).values(), key=lambda t: t.offset)
    size = shard.stat().st_size
    with shard.open("ab") as f:
        f.write(b"\0" * 16)
    out = tmp_path / "out"
    assert (
        refused(["sculpt", ck, out], unchanged=[ck], absent=out)
        == f"error: {shard}: 16 bytes at offset {size} after tensor {last.name!r} "
        "belong to no tensor"
    )


# ---- case 3: configs that lie -------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"norm_topk_prob": "false"},
            'norm_topk_prob is "false", expected a JSON boolean (true or false)',
        ),
        ({"num_experts_per_tok": True}, "num_experts_per_tok is true, expected a positive integer"),
        ({"num_attention_heads": 4.0}, "num_attention_heads is 4.0, expected a positive integer"),
        (
            {"first_k_dense_replace": -1},
            "first_k_dense_replace is -1, expected a non-negative integer",
        ),
        (
            {"rope_parameters": {"rope_theta": "1e6"}},
            'rope_parameters.rope_theta is "1e6", expected a finite number > 0',
        ),
        ({"rms_norm_eps": float("nan")}, "rms_norm_eps is NaN, expected a finite number >= 0"),
        ({"hidden_act": ["silu"]}, 'hidden_act is ["silu"], expected a string'),
        # found by `make fuzz` (config target): a lone surrogate, floats beyond float32
        (
            {"model_type": "\ud800"},
            'model_type is "\\ud800", which is not valid Unicode (a lone surrogate)',
        ),
    ],
)
def test_config_value_of_the_wrong_type_is_refused(
    tmp_path: Path, changes: dict, message: str
) -> None:
    ck = checkpoint(tmp_path / "ck")
    edit_config(ck, **changes)
    out = tmp_path / "out"
    assert (
        refused(["sculpt", ck, out], unchanged=[ck], absent=out)
        == f"error: {ck}/config.json: {message}"
    )


def test_config_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    ck = checkpoint(tmp_path / "ck")
    cfg = ck / "config.json"
    cfg.write_bytes(cfg.read_bytes().replace(b'"silu"', b'"sil\xfc"'))
    at = cfg.read_bytes().index(b"\xfc")
    out = tmp_path / "out"
    assert (
        refused(["sculpt", ck, out], unchanged=[ck], absent=out)
        == f"error: {cfg}: not valid UTF-8 at offset {at} (byte 0xfc)"
    )


@pytest.mark.parametrize("kind", ["folder", "FIFO"])
def test_config_that_is_not_a_file_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    ck = checkpoint(tmp_path / "ck")
    cfg = ck / "config.json"
    cfg.unlink()
    cfg.mkdir() if kind == "folder" else os.mkfifo(cfg)
    out = tmp_path / "out"
    assert (
        refused(["sculpt", ck, out], 2, unchanged=[ck], absent=out)
        == f"error: {cfg}: not a regular file ({'a folder' if kind == 'folder' else 'a FIFO'})"
    )


def test_attention_config_the_tensors_contradict_ambiguously_is_refused(tmp_path: Path) -> None:
    ck = checkpoint(tmp_path / "ck", model_type="olmoe")  # no per-head q_norm to tell
    edit_config(ck, head_dim=8)  # q_proj [64, 64]: 4 heads of 16, or 8 heads of 8?
    out = tmp_path / "out"
    assert refused(["sculpt", ck, out], unchanged=[ck], absent=out) == (
        f"error: {ck}: model.layers.0.self_attn.q_proj.weight has 64 rows, k_proj.weight 64, but "
        "config.json says num_attention_heads 4 × head_dim 8 = 32 and num_key_value_heads "
        "4 × head_dim 8 = 32; refused: either head_dim or the head counts could be wrong"
    )


@pytest.mark.parametrize(
    ("changes", "arch", "warning"),
    [
        (
            {"head_dim": 8},
            {"head_dim": 16},  # qwen3's per-head q_norm [16] settles it
            "head_dim: config.json says 8, the tensors say 16",
        ),
        (
            {"num_key_value_heads": 2},
            {"num_kv_heads": 4},
            "num_key_value_heads: config.json says 2, the tensors say 4",
        ),
    ],
)
def test_attention_config_explained_by_one_change_uses_the_tensors(
    tmp_path: Path, changes: dict, arch: dict, warning: str
) -> None:
    ck = checkpoint(tmp_path / "ck")
    edit_config(ck, **changes)
    plan = dry_run(ck, tmp_path)
    assert {k: plan["arch"][k] for k in arch} == arch
    assert plan["warnings"] == [
        f"{warning} (model.layers.0.self_attn.q_proj.weight has 64 "
        "rows, k_proj.weight 64); using the tensors"
    ]


def test_layer_count_from_the_tensors(tmp_path: Path) -> None:
    ck = checkpoint(tmp_path / "ck")
    edit_config(ck, num_hidden_layers=1)  # accepted silently before: MoE layers 0 and 1
    plan = dry_run(ck, tmp_path)
    assert plan["arch"]["num_hidden_layers"] == 2
    assert plan["warnings"] == [
        "num_hidden_layers: config.json says 1, the tensors say 2; using the tensors"
    ]
    edit_config(ck, num_hidden_layers=1, num_nextn_predict_layers=1)  # DeepSeek-V3's MTP
    out = tmp_path / "out"
    assert refused(["sculpt", ck, out], unchanged=[ck], absent=out) == (  # 2 MoE layers in 1
        f"error: {ck}: the tensors have 2 MoE layers, more than num_hidden_layers 1; refused: "
        "the arch block counts every MoE layer in num_hidden_layers and has no field for "
        "multi-token-prediction layers"
    )
    mtp = tmp_path / "mtp"  # a dense layer 0: MoE layers 1 and 2 fit num_hidden_layers 2
    shutil.copytree(FIXTURES / "checkpoints" / "deepseek_v2", mtp)
    edit_config(mtp, num_hidden_layers=2, num_nextn_predict_layers=1)
    plan = dry_run(mtp, tmp_path)
    assert plan["arch"]["num_hidden_layers"] == 2
    assert (
        "num_hidden_layers: config.json says 2; the tensors' model.layers.2 is a "
        "multi-token-prediction layer (num_nextn_predict_layers 1), kept beyond "
        "num_hidden_layers"
    ) in plan["warnings"]
    edit_config(ck, num_hidden_layers=3, num_nextn_predict_layers=None)
    out = tmp_path / "out"
    assert refused(["sculpt", ck, out], unchanged=[ck], absent=out) == (
        f"error: {ck}: num_hidden_layers: config.json says 3, but the tensors have layers 0..1 "
        "only (no model.layers.2); refused"
    )


def test_hidden_size_from_the_embedding(tmp_path: Path) -> None:
    ck = checkpoint(tmp_path / "ck")
    edit_config(ck, hidden_size=128)  # head_dim is explicit: only d_model is at stake
    plan = dry_run(ck, tmp_path)
    assert plan["model"]["d_model"] == 64 and plan["arch"]["head_dim"] == 16
    assert plan["warnings"] == [
        "hidden_size: config.json says 128, the tensors say 64; using the tensors"
    ]
    edit_config(ck, head_dim=None)  # now head_dim = hidden_size / heads: 32 or 16?
    out = tmp_path / "out"
    assert refused(["sculpt", ck, out], unchanged=[ck], absent=out) == (
        f"error: {ck}: hidden_size: config.json says 128, model.embed_tokens.weight has 64 "
        "columns; refused: config.json has no head_dim, and hidden_size / "
        "num_attention_heads would be 32 by the config, 16 by the tensors"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_theta": 3.5e38}, "arch.rope_theta: 3.5e+38 is not a finite float32"),
        ({"rms_norm_eps": 1e300}, "arch.rms_norm_eps: 1e+300 is not a finite float32"),
        ({"rope_theta": 1e-50}, "arch.rope_theta: 1e-50 underflows to 0 as a float32"),
    ],
)
def test_config_floats_beyond_float32_are_one_line(
    tmp_path: Path, changes: dict, message: str
) -> None:
    """Found by `make fuzz`: a numpy overflow warning used to precede the error."""
    ck = checkpoint(tmp_path / "ck")
    edit_config(ck, **changes)
    out = tmp_path / "out"
    assert refused(["sculpt", ck, out], unchanged=[ck], absent=out) == f"error: {message}"


def test_upgrade_refuses_a_family_the_format_cannot_hold(tmp_path: Path) -> None:
    """Found by `make fuzz`: `upgrade --config` stamped SiLU into a GELU model's vault."""
    ck = checkpoint(tmp_path / "ck")
    proc = run("sculpt", ck, tmp_path / "v1", "--format-version", "1")
    assert proc.returncode == 0, proc.stderr
    vault = tmp_path / "v1" / "ck.smoe"
    cfg = tmp_path / "config.json"
    for change, reason in (
        (
            '"hidden_act": "gelu"',
            "hidden_act 'gelu' refused: only SiLU-gated (SwiGLU) experts can be represented",
        ),
        (
            '"model_type": "gpt_oss"',
            "model_type 'gpt_oss' refused: gpt-oss experts interleave "
            "gate/up, carry biases and clamp the activation; only bias-free SiLU-gated (SwiGLU) "
            "experts can be represented",
        ),
    ):
        text = json.loads((ck / "config.json").read_text())
        key, value = json.loads("{" + change + "}").popitem()
        text[key] = value
        cfg.write_text(json.dumps(text))
        out = tmp_path / "v2.smoe"
        assert (
            refused(
                ["upgrade", vault, "--config", cfg, "--out", out],
                unchanged=[vault, cfg],
                absent=out,
            )
            == f"error: {cfg}: {reason}"
        )


def test_upgrade_checks_the_config_it_is_given(tmp_path: Path) -> None:
    ck = checkpoint(tmp_path / "ck")
    proc = run("sculpt", ck, tmp_path / "v1", "--format-version", "1")
    assert proc.returncode == 0, proc.stderr
    vault = tmp_path / "v1" / "ck.smoe"
    cfg = tmp_path / "config.json"
    cfg.write_text(
        (ck / "config.json")
        .read_text()
        .replace('"num_experts_per_tok": 2', '"num_experts_per_tok": "2"')
    )
    out = tmp_path / "v2.smoe"
    assert (
        refused(
            ["upgrade", vault, "--config", cfg, "--out", out],
            unchanged=[vault, cfg],
            absent=out,
        )
        == f'error: {cfg}: num_experts_per_tok is "2", expected a positive integer'
    )
    cfg.write_bytes(b'{"model_type": "qwen3\xff"}')
    assert (
        refused(
            ["upgrade", vault, "--config", cfg, "--out", out],
            unchanged=[vault, cfg],
            absent=out,
        )
        == f"error: {cfg}: not valid UTF-8 at offset 21 (byte 0xff)"
    )
