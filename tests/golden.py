"""A tiny hand-assembled v2 vault, written field by field as golden bytes.

Deliberately independent of the generated layout and of the writer: every format
value here is spelled out, so the tests compare the spec against an independent
reading of the format document.
"""

from __future__ import annotations

import struct

PAGE = 16384

# One expert (layer 1, expert 2), d_model 8, moe_ffn_dim 8: three 8x8 Q4 tensors.
# Each tensor: 64 weights -> 32 packed bytes + one fp16 scale (2 bytes).
HEADER = struct.pack(
    "<8sIIIIQQIIIIII",
    bytes.fromhex("534d4f45deea0001"),  # magic
    2,  # version
    4,  # num_moe_layers
    8,  # max_experts_per_layer
    1,  # total_experts
    64,  # table_offset
    PAGE,  # data_offset
    64,  # group_size
    4,  # bits
    8,  # d_model
    1000,  # vocab_size
    16,  # ffn_dim
    256,  # reserved_ext: 64 + 48 + 132 = 244 -> 256
)
ENTRY = struct.pack("<IIQQQIQ4s", 1, 2, PAGE, 102, PAGE, 64, 3, b"\0\0\0\0")
DESCRIPTORS = b"".join(
    struct.pack("<BB2sIIQQQQ", t, 2, b"\0\0", 8, 8, 34 * t, 32, 34 * t + 32, 2) for t in range(3)
)
ARCH = struct.pack(
    "<4sIIIfIIIIIIIIIf24s44s",
    b"SARC",
    1,  # block_version
    128,  # block_size
    0b011,  # flags: norm_topk_prob | has_qk_norm
    1_000_000.0,  # rope_theta
    4,  # num_heads
    2,  # num_kv_heads
    2,  # head_dim
    8,  # moe_top_k
    8,  # moe_ffn_dim
    0,  # dense_ffn_dim
    0,  # shared_expert_ffn_dim
    0,  # activation (SiLU)
    6,  # num_hidden_layers
    1e-6,  # rms_norm_eps
    b"qwen3_moe",
    b"",
)

# Absolute offsets of the regions, for tests that corrupt a field.
ENTRY_AT = 64
DESCRIPTORS_AT = 64 + 48
ARCH_AT = 256


def tensor_bytes(t: int) -> bytes:
    """Packed codes (code = (i + t) % 16 for weight i) and the fp16 scale 1.0."""
    codes = [(i + t) % 16 for i in range(64)]
    packed = bytes(codes[2 * j] | (codes[2 * j + 1] << 4) for j in range(32))
    return packed + struct.pack("<e", 1.0)


def vault() -> bytearray:
    """The whole 32 KiB golden vault."""
    out = bytearray(2 * PAGE)
    out[0:64] = HEADER
    out[ENTRY_AT : ENTRY_AT + 48] = ENTRY
    out[DESCRIPTORS_AT : DESCRIPTORS_AT + 132] = DESCRIPTORS
    out[ARCH_AT : ARCH_AT + 128] = ARCH
    blob = b"".join(tensor_bytes(t) for t in range(3))
    out[PAGE : PAGE + len(blob)] = blob
    return out


def patch(data: bytearray, offset: int, fmt: str, value: object) -> bytearray:
    """A copy of ``data`` with ``value`` packed (little-endian ``fmt``) at ``offset``."""
    out = bytearray(data)
    struct.pack_into("<" + fmt, out, offset, value)
    return out
