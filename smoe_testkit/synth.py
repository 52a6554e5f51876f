"""Synthetic HuggingFace-style MoE checkpoints for benchmarks, demos and tests.

Writes ``config.json`` and safetensors shards the way ``transformers`` names them, with
seeded random weights, one tensor at a time (memory bounded by the largest tensor), so
checkpoints with real model geometry (e.g. Qwen3-30B-A3B's experts) can be made on disk
without torch.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from smoe.interop.safetensors_io import write_file
from smoe.plumbing import fileio

if TYPE_CHECKING:
    from smoe.format.records import ArchInfo

__all__ = ["main", "qwen3_235b_arch", "write_checkpoint", "write_sparse_vault"]

_NP = {"F32": np.float32, "F16": np.float16}


def _values(name: str, shape: tuple[int, ...], seed: int, dtype: str) -> bytes:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    w = rng.standard_normal(shape, dtype=np.float32)
    w *= 0.02
    if len(shape) >= 2:  # a few 8-10x outliers per row, as real checkpoints have
        rows = np.arange(shape[-2])
        w.reshape(-1, shape[-2], shape[-1])[:, rows, (rows * 7 + seed) % shape[-1]] *= 9.0
    if name.endswith("norm.weight"):
        w = np.ones(shape, np.float32)
    if dtype == "BF16":  # round to nearest even
        u = w.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()
    return w.astype(_NP[dtype]).astype(np.dtype(_NP[dtype]).newbyteorder("<")).tobytes()


def _tensor_list(
    model_type: str,
    layers: int,
    experts: int,
    d_model: int,
    ffn: int,
    vocab: int,
    fused: bool = False,
) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of a small but complete decoder."""
    heads, head_dim = 4, 16
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, d_model))]
    for lay in range(layers):
        p = f"model.layers.{lay}"
        out += [
            (f"{p}.input_layernorm.weight", (d_model,)),
            (f"{p}.post_attention_layernorm.weight", (d_model,)),
            (f"{p}.self_attn.q_proj.weight", (heads * head_dim, d_model)),
            (f"{p}.self_attn.k_proj.weight", (heads * head_dim, d_model)),
            (f"{p}.self_attn.v_proj.weight", (heads * head_dim, d_model)),
            (f"{p}.self_attn.o_proj.weight", (d_model, heads * head_dim)),
        ]
        if model_type == "qwen3_moe":
            out += [
                (f"{p}.self_attn.q_norm.weight", (head_dim,)),
                (f"{p}.self_attn.k_norm.weight", (head_dim,)),
            ]
        if model_type == "mixtral":
            out.append((f"{p}.block_sparse_moe.gate.weight", (experts, d_model)))
            for e in range(experts):
                q = f"{p}.block_sparse_moe.experts.{e}"
                out += [
                    (f"{q}.w1.weight", (ffn, d_model)),
                    (f"{q}.w2.weight", (d_model, ffn)),
                    (f"{q}.w3.weight", (ffn, d_model)),
                ]
            continue
        out.append((f"{p}.mlp.gate.weight", (experts, d_model)))
        if fused:
            out += [
                (f"{p}.mlp.experts.gate_up_proj", (experts, 2 * ffn, d_model)),
                (f"{p}.mlp.experts.down_proj", (experts, d_model, ffn)),
            ]
        else:
            for e in range(experts):
                q = f"{p}.mlp.experts.{e}"
                out += [
                    (f"{q}.gate_proj.weight", (ffn, d_model)),
                    (f"{q}.up_proj.weight", (ffn, d_model)),
                    (f"{q}.down_proj.weight", (d_model, ffn)),
                ]
    out += [("model.norm.weight", (d_model,)), ("lm_head.weight", (vocab, d_model))]
    return out


def _write_safetensors(
    path: Path, tensors: list[tuple[str, tuple[int, ...]]], dtype: str, seed: int
) -> None:
    """One shard; each tensor generated and written at its place, one at a time."""
    items = [(name, dtype, shape) for name, shape in tensors]

    def fill(fd: int, i: int, offset: int) -> None:
        name, _, shape = items[i]
        fileio.pwrite_all(fd, _values(name, shape, seed, dtype), offset, path)

    write_file(path, items, fill, metadata={"format": "pt"})


def write_checkpoint(
    root: str | Path,
    *,
    model_type: str = "qwen3_moe",
    layers: int = 2,
    experts: int = 4,
    d_model: int = 64,
    ffn: int = 32,
    vocab: int = 128,
    top_k: int = 2,
    dtype: str = "BF16",
    seed: int = 0,
    fused: bool = False,
    shards: int = 1,
) -> Path:
    """Write a checkpoint directory (``config.json``, safetensors shards and, with several,
    their index) of ``model_type`` (``qwen3_moe``, ``mixtral`` or ``olmoe``); returns it.

    ``fused``: the experts of a layer as 3-D ``gate_up_proj`` / ``down_proj`` tensors, as
    recent ``transformers`` saves them; ``seed``: the same arguments give the same bytes.

    >>> import os, tempfile
    >>> root = write_checkpoint(tempfile.mkdtemp() + "/ckpt", layers=1, experts=2, shards=2)
    >>> sorted(os.listdir(root))  # doctest: +NORMALIZE_WHITESPACE
    ['config.json', 'model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors',
     'model.safetensors.index.json']
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tensors = _tensor_list(model_type, layers, experts, d_model, ffn, vocab, fused)
    config = {
        "architectures": [
            {
                "qwen3_moe": "Qwen3MoeForCausalLM",
                "mixtral": "MixtralForCausalLM",
                "olmoe": "OlmoeForCausalLM",
            }.get(model_type, "ForCausalLM")
        ],
        "model_type": model_type,
        "hidden_size": d_model,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 16,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "num_experts_per_tok": top_k,
        "dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype],
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    }
    if model_type == "mixtral":
        config.update(num_local_experts=experts, intermediate_size=ffn)
    else:
        config.update(
            num_experts=experts,
            moe_intermediate_size=ffn,
            intermediate_size=4 * ffn,
            norm_topk_prob=model_type == "qwen3_moe",
        )
    (root / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if shards <= 1:
        _write_safetensors(root / "model.safetensors", tensors, dtype, seed)
        return root
    per = -(-len(tensors) // shards)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = tensors[i * per : (i + 1) * per]
        _write_safetensors(root / name, part, dtype, seed)
        weight_map.update({n: name for n, _ in part})
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return root


def qwen3_235b_arch() -> ArchInfo:
    """The arch block of Qwen3-235B-A22B (94 layers, 128 experts of ffn 1536, top-8), the
    geometry of :func:`write_sparse_vault`.

    >>> a = qwen3_235b_arch()
    >>> a.num_hidden_layers, a.moe_ffn_dim, a.moe_top_k, a.num_heads, a.head_dim
    (94, 1536, 8, 64, 128)
    """
    from smoe.format.records import ArchInfo

    return ArchInfo(
        rope_theta=1_000_000.0,
        num_heads=64,
        num_kv_heads=4,
        head_dim=128,
        moe_top_k=8,
        moe_ffn_dim=1536,
        num_hidden_layers=94,
        rms_norm_eps=1e-6,
        model_type="qwen3_moe",
        norm_topk_prob=True,
        has_qk_norm=True,
    )


def write_sparse_vault(
    path: str | Path,
    *,
    layers: int = 94,
    experts: int = 128,
    d_model: int = 4096,
    ffn: int = 1536,
    bits: int = 4,
    version: int = 2,
    vocab: int = 151936,
) -> Path:
    """A vault with real geometry whose blobs are holes (Qwen3-235B-A22B by default).

    Header, table, descriptors and arch block are real; every blob reads as zeros and
    takes no disk space, so a ~113 GB vault costs a few MB.

    >>> import tempfile
    >>> from smoe.vault.reader import Vault
    >>> path = write_sparse_vault(tempfile.mkdtemp() + "/sparse.smoe", layers=2, experts=4)
    >>> path.stat().st_size, path.stat().st_blocks * 512 < 100_000  # bytes, bytes on disk
    (80232448, True)
    >>> with Vault.open(path) as v:
    ...     len(v), v[1, 3]["down_proj"].shape, v[1, 3]["down_proj"].scales.max()
    (8, (4096, 1536), np.float16(0.0))
    """
    from smoe.format.plan import make_plan
    from smoe.format.records import ModelInfo, metadata_bytes
    from smoe.plumbing.atomic import AtomicFile

    shapes = ((ffn, d_model), (ffn, d_model), (d_model, ffn))
    plan = make_plan(
        {(lay, e): shapes for lay in range(layers) for e in range(experts)}, bits, version
    )
    model = ModelInfo(
        num_moe_layers=layers,
        max_experts_per_layer=experts,
        d_model=d_model,
        vocab_size=vocab,
        ffn_dim=12288,
    )
    arch = replace(qwen3_235b_arch(), moe_ffn_dim=ffn, num_hidden_layers=layers)
    with AtomicFile(Path(path)) as out:
        out.pwrite(metadata_bytes(plan, model, arch if version >= 2 else None), 0)
        out.truncate(plan.file_size)
        out.commit()
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    """``python -m smoe_testkit.synth sparse-vault OUT [--version 1]`` or ``checkpoint OUT ...``.

    >>> import tempfile
    >>> main(["checkpoint", tempfile.mkdtemp() + "/tiny", "--model-type", "mixtral"])
    /...tiny: synthetic mixtral checkpoint
    0
    """
    import argparse

    ap = argparse.ArgumentParser(prog="python -m smoe_testkit.synth", description=__doc__)
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("sparse-vault", help="Qwen3-235B-A22B geometry, blobs left as holes")
    p.add_argument("out", type=Path)
    p.add_argument("--version", type=int, default=2, choices=(1, 2))
    p.add_argument("--layers", type=int, default=94)
    p.add_argument("--experts", type=int, default=128)
    p = sub.add_parser("checkpoint", help="a synthetic HF checkpoint directory")
    p.add_argument("out", type=Path)
    p.add_argument("--model-type", default="qwen3_moe", choices=("qwen3_moe", "mixtral", "olmoe"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--ffn", type=int, default=32)
    p.add_argument("--dtype", default="BF16", choices=("BF16", "F16", "F32"))
    p.add_argument("--fused", action="store_true")
    p.add_argument("--shards", type=int, default=1)
    args = ap.parse_args(argv)
    if args.what == "sparse-vault":
        path = write_sparse_vault(
            args.out, layers=args.layers, experts=args.experts, version=args.version
        )
        st = path.stat()
        print(f"{path}: {st.st_size:,} bytes apparent, {st.st_blocks * 512:,} on disk")
    else:
        write_checkpoint(
            args.out,
            model_type=args.model_type,
            layers=args.layers,
            experts=args.experts,
            d_model=args.d_model,
            ffn=args.ffn,
            dtype=args.dtype,
            fused=args.fused,
            shards=args.shards,
        )
        print(f"{args.out}: synthetic {args.model_type} checkpoint")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
