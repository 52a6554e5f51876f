"""Paths and expectations of the committed fixtures (shared with the C++ tests)."""

from __future__ import annotations

import json
from pathlib import Path

from smoe.format.records import ArchInfo
from smoe_gen import layout

ROOT = Path(__file__).resolve().parent.parent  # the checkout, wherever it is
FIXTURES = ROOT / "fixtures"
CORRUPT = FIXTURES / "corrupt"
CKPTS = FIXTURES / "checkpoints"  # tiny HuggingFace-style checkpoints, one per family
MANIFEST: dict = json.loads((FIXTURES / "MANIFEST.json").read_text())
EXPECTED: dict = json.loads((CORRUPT / "EXPECTED.json").read_text())
GOOD = sorted(MANIFEST)
BAD = sorted(EXPECTED)
# the checkpoints' own manifest (fixtures/checkpoints/MANIFEST.json): what each one holds and
# whether the sculptor converts it or refuses it
CKPT_MANIFEST: dict = json.loads((CKPTS / "MANIFEST.json").read_text())["checkpoints"]
CONVERT = sorted(k for k, v in CKPT_MANIFEST.items() if v["expect"] == "convert")
REFUSE = sorted(k for k, v in CKPT_MANIFEST.items() if v["expect"] == "refuse")

# The arch block and config.json of the v1 fixtures (olmoe-shaped), for the upgrade tests.
OLMOE_ARCH = ArchInfo(
    rope_theta=10000.0,
    num_heads=4,
    num_kv_heads=4,
    head_dim=16,
    moe_top_k=2,
    moe_ffn_dim=32,
    num_hidden_layers=2,
    rms_norm_eps=1e-6,
    model_type="olmoe",
)
OLMOE_CONFIG = {
    "model_type": "olmoe",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "num_experts": 4,
}

# smoe_testkit.synth.write_checkpoint keyword sets: one checkpoint per tensor layout the sculptor
# reads (per-expert BF16, fused 3-D, F16 in 3 shards, Mixtral naming in F32)
CHECKPOINT_LAYOUTS = {
    "per-expert": {"dtype": "BF16"},
    "fused": {"dtype": "BF16", "fused": True},
    "f16-sharded": {"dtype": "F16", "shards": 3},
    "f32-mixtral": {"dtype": "F32", "model_type": "mixtral"},
}


def boundary_values(size: int) -> list[int]:
    """Integers that probe offset and count checks when written into a vault of ``size``
    bytes: small counts, one either side of the header and page sizes, the file's size, the
    largest u32 and a u64 beyond any file."""
    h, p = layout.HEADER_SIZE, layout.PAGE_SIZE
    return [0, 1, 2, 3, 7, h - 1, h, h + 1, 2 * h, p - 1, p, p + 1, size, 2**32 - 1, 2**63]
