meta:
  id: smoe
  title: SMOE vault of 2/4-bit quantised Mixture-of-Experts expert weights
  file-extension: smoe
  license: MIT
  ks-version: 0.11
  endian: le
doc: |
  A `.smoe` vault holds the routed-expert weights of a Mixture-of-Experts
  transformer, quantised to 2 or 4 bits, laid out so that an inference engine
  can stream exactly the experts a token needs straight from an SSD. Every
  expert blob starts on a 16 KiB page boundary (the Apple Silicon hardware page).

  File map: the 64-byte header at offset 0; the expert table (one 48-byte entry
  per expert) immediately after it; the tensor descriptors (three 44-byte
  descriptors per expert, gate/up/down, in table order) immediately after the
  table; in version 2 the 128-byte "SARC" arch block at the 64-byte-aligned end of
  the descriptors; zero padding up to `data_offset`; then the expert blobs, each
  zero-padded to a whole number of 16 KiB pages.

  All integers are little-endian and all offsets are absolute byte offsets from
  the start of the file, unless a field says "within the expert blob".

  Ruling D1 (packing): the structures are packed, with no implicit alignment
  anywhere; `expert_entry.num_groups` (u8 at offset 36) and
  `tensor_descriptor.packed_offset` (u8 at offset 12) are unaligned. A C/C++
  mirror must use `#pragma pack(push, 1)` and assert the offset of every field.

  Ruling D6 (versions): readers accept versions 1 and 2 and refuse anything else
  with a clear error; the 8-byte magic never changes with the version. A v1
  vault has no arch block and `reserved_ext` is 0 (non-zero is a warning and is
  ignored). A v2 vault has a valid arch block at `reserved_ext`.

  Tool policies are not part of the format: how `smoe upgrade` edits a v1
  vault in place (ruling D7) and what the Sculptor reads and writes (ruling D8)
  are described in docs/TOOLS.md.

  Ruling R1 (this spec; the format document is silent): the descriptor count per
  expert is fixed at three, one per `tensor_type`, and an empty vault
  (`total_experts` = 0) is well-formed but holds nothing to stream.

  Ruling R2 (this spec): `model_type` must be valid UTF-8; its bytes after the
  first NUL must be zero as well (a NUL-padded name), so that the field is
  canonical and byte-identical vaults have identical names.

  Ruling R5 (this spec): `rope_theta` and `rms_norm_eps` are checked for being
  finite with a warning only; like the other arch values that are not among the
  engine's load rules (D6), they do not make a vault invalid.
doc-ref:
  - docs/FORMAT.md
  - docs/TOOLS.md
seq:
  - id: header
    type: header
    doc: The fixed 64-byte file header at offset 0; the only part read at open.
instances:
  experts:
    pos: header.table_offset
    type: expert_entry(_index)
    repeat: expr
    repeat-expr: header.total_experts
    doc: |
      The expert table: `total_experts` entries of 48 bytes from `table_offset`.
      Ruling D4: sorted by `(layer_id, expert_id)` ascending, pairs unique.
    doc-ref: docs/FORMAT.md D4
  arch:
    pos: header.reserved_ext
    type: arch_block
    if: header.version >= version_with_arch
    doc: The version-2 arch block ("SARC"), located by `header.reserved_ext`.
    doc-ref: docs/FORMAT.md D6
  page_size:
    value: 16384
    -smoe-const: PAGE_SIZE
    doc: |
      Alignment of `data_offset`, of every blob offset and of every blob's
      padded size: the 16 KiB hardware page.
  quant_group_size:
    value: 64
    -smoe-const: GROUP_SIZE
    doc: Number of consecutive weights sharing one float16 scale.
  scale_bytes:
    value: 2
    -smoe-const: SCALE_BYTES
    doc: Size of one scale (IEEE-754 binary16).
  bits_q2:
    value: 2
    -smoe-const: BITS_Q2
    doc: Bit depth of SMOE-Q2.
  bits_q4:
    value: 4
    -smoe-const: BITS_Q4
    doc: Bit depth of SMOE-Q4.
  version_min:
    value: 1
    -smoe-const: VERSION_MIN
    doc: Oldest format version readers accept.
  version_max:
    value: 2
    -smoe-const: VERSION_MAX
    doc: Newest format version readers accept, and the one writers produce by default.
  version_with_arch:
    value: 2
    -smoe-const: VERSION_WITH_ARCH
    doc: First format version that carries an arch block.
  arch_align:
    value: 64
    -smoe-const: ARCH_ALIGN
    doc: Alignment of the arch block (`reserved_ext`).
  arch_block_version_current:
    value: 1
    -smoe-const: ARCH_BLOCK_VERSION
    doc: The only `arch_block.block_version` defined.
  tensors_per_expert:
    value: 3
    -smoe-const: TENSORS_PER_EXPERT
    doc: Descriptors per expert, one per `tensor_type` (gate, up, down).
  tensor_ndim:
    value: 2
    -smoe-const: TENSOR_NDIM
    doc: Rank of every expert weight matrix.
  max_moe_top_k:
    value: 16
    -smoe-const: MAX_MOE_TOP_K
    doc: Largest `moe_top_k` the engine accepts.
  max_head_dim:
    value: 256
    -smoe-const: MAX_HEAD_DIM
    doc: Largest `head_dim` the engine accepts.
  flag_norm_topk_prob:
    value: 1
    -smoe-const: FLAG_NORM_TOPK_PROB
    doc: "`arch_block.flags` bit 0: renormalise the selected top-k routing weights."
  flag_has_qk_norm:
    value: 2
    -smoe-const: FLAG_HAS_QK_NORM
    doc: "`arch_block.flags` bit 1: attention applies RMS norm to q and k per head."
  flag_has_dense_layer_0:
    value: 4
    -smoe-const: FLAG_HAS_DENSE_LAYER_0
    doc: "`arch_block.flags` bit 2: layer 0 has a dense MLP instead of experts."
  flags_known_mask:
    value: 7
    -smoe-const: FLAGS_KNOWN_MASK
    doc: The flag bits defined so far; bits 3..31 must be zero.
  model_type_size:
    value: 24
    -smoe-const: MODEL_TYPE_SIZE
    doc: Byte size of `arch_block.model_type`.
  reference_rms_norm_eps:
    value: 0.000001
    -smoe-const: REFERENCE_RMS_NORM_EPS
    doc: |
      The RMS-norm epsilon the engine's kernels are compiled with. Ruling D6: an
      `rms_norm_eps` that differs from it by more than 10% is a warning.
  rms_norm_eps_tolerance:
    value: 0.1
    -smoe-const: RMS_NORM_EPS_TOLERANCE
    doc: Relative difference of `rms_norm_eps` from the reference that warns.
types:
  header:
    -smoe-struct: SmoeHeader
    doc: |
      File header, 64 bytes at offset 0. Everything else is located from it, and
      every count and offset in it is bounded by the file size here, so a huge
      `total_experts` or a wild offset fails at open before anything is allocated.
    seq:
      - id: magic
        contents: [0x53, 0x4d, 0x4f, 0x45, 0xde, 0xea, 0x00, 0x01]
        doc: '"SMOE" followed by the model marker DE EA 00 01; never changes with the version.'
      - id: version
        type: u4
        valid:
          min: _root.version_min
          max: _root.version_max
        doc: Format version; readers accept 1 and 2 and refuse anything else (ruling D6).
        doc-ref: docs/FORMAT.md D6
      - id: num_moe_layers
        type: u4
        doc: |
          Number of transformer layers of the model that hold MoE experts. Ruling
          D5: the model's value, also in a partial vault that stores fewer layers.
          Ruling R4 (this spec): the table holds experts of at most this many distinct
          layers; more is an error (verifier code `table.layers`; not expressible here).
        doc-ref: docs/FORMAT.md D5
      - id: max_experts_per_layer
        type: u4
        doc: |
          Routed-expert count (router width) of the widest MoE layer of the model.
          Ruling D5: engines size the router from it, so a partial vault (a subset
          of the experts) keeps the model's value; every `expert_id` is below it.
        doc-ref: docs/FORMAT.md D5
      - id: total_experts
        type: u4
        valid:
          expr: _.as<u8> <= num_moe_layers.as<u8> * max_experts_per_layer.as<u8>
        doc: |
          Number of entries in the expert table of this file (ruling D5); at most
          `num_moe_layers * max_experts_per_layer`. Bounded by the file size
          through `data_offset`.
        doc-ref: docs/FORMAT.md D5
      - id: table_offset
        type: u8
        valid: sizeof<header>
        doc: Absolute offset of the first expert table entry; always 64, right after the header.
      - id: data_offset
        type: u8
        valid:
          expr: _ % _root.page_size == 0 and _ >= descriptors_end and _ <= _io.size
        doc: |
          Absolute offset of the first expert blob: a multiple of 16384, at or
          after the end of the descriptors, and inside the file. Ruling D4: v2
          writers set it to `round_up(arch block end, 16384)`, v1 writers to
          `round_up(descriptors_end, 16384)`.
        doc-ref: docs/FORMAT.md D4
      - id: group_size
        type: u4
        valid: _root.quant_group_size
        doc: Quantisation group size; always 64 (ruling D5).
      - id: bits
        type: u4
        valid:
          any-of: [_root.bits_q2, _root.bits_q4]
        doc: Bits per weight code; 2 for SMOE-Q2, 4 for SMOE-Q4.
      - id: d_model
        type: u4
        valid:
          min: 1
        doc: Hidden size, from `model.embed_tokens.weight` `[vocab, d_model]` (ruling D5).
        doc-ref: docs/FORMAT.md D5
      - id: vocab_size
        type: u4
        doc: Vocabulary size, from `model.embed_tokens.weight` `[vocab, d_model]` (ruling D5).
        doc-ref: docs/FORMAT.md D5
      - id: ffn_dim
        type: u4
        doc: |
          Dense/shared FFN intermediate size (ruling D5): rows of the layer-0 dense
          `gate_proj` if the model has a dense layer; else rows of the shared
          expert's `gate_proj`; else the config's `intermediate_size`. The
          reference Sculptor wrote the first expert tensor's shape[0] instead
          (usually `d_model`), so readers never take routed-expert shapes from it:
          those come from the descriptors, and v2 carries `moe_ffn_dim`,
          `dense_ffn_dim` and `shared_expert_ffn_dim`. The verifier warns on such
          vaults.
        doc-ref: docs/FORMAT.md D5
      - id: reserved_ext
        type: u4
        valid:
          expr: >-
            version < _root.version_with_arch
            or (_ % _root.arch_align == 0 and _ >= descriptors_end
            and _.as<u8> + sizeof<arch_block> <= data_offset)
        doc: |
          v2: absolute offset of the arch block, a multiple of 64, at or after the
          end of the descriptors, with the whole 128-byte block before
          `data_offset` (ruling D6). v2 writers put it at
          `round_up(descriptors_end, 64)` (ruling D4). v1: zero; a non-zero value
          is a warning and is ignored.
        doc-ref: docs/FORMAT.md D6
    instances:
      descriptors_offset:
        value: table_offset + total_experts.as<u8> * sizeof<expert_entry>
        doc: Absolute offset of the first tensor descriptor, right after the table (ruling D4).
        doc-ref: docs/FORMAT.md D4
      descriptors_end:
        value: >-
          descriptors_offset
          + total_experts.as<u8> * _root.tensors_per_expert * sizeof<tensor_descriptor>
        doc: Absolute offset one past the last tensor descriptor.
  expert_entry:
    -smoe-struct: ExpertEntry
    doc: |
      One row of the expert table, 48 bytes. Ruling D4: the table is sorted by
      `(layer_id, expert_id)` ascending with unique pairs; writers place blobs in
      table order, back to back from `data_offset`; readers only require 16 KiB
      alignment, bounds inside the file and no overlap (gaps are reported, not
      fatal).
    doc-ref: docs/FORMAT.md D4
    params:
      - id: idx
        type: u4
        doc: Position of this entry in the table.
    seq:
      - id: layer_id
        type: u4
        doc: Transformer layer index of this expert (not an index among MoE layers).
      - id: expert_id
        type: u4
        valid:
          expr: >-
            _ < _root.header.max_experts_per_layer
            and (idx == 0 or layer_id > prev.layer_id
            or (layer_id == prev.layer_id and _ > prev.expert_id))
        doc: |
          Expert index within the layer; below `max_experts_per_layer`, and
          `(layer_id, expert_id)` strictly greater than the previous entry's
          (sorted and unique, ruling D4).
        doc-ref: docs/FORMAT.md D4
      - id: byte_offset
        type: u8
        valid:
          expr: >-
            _ % _root.page_size == 0 and _ >= _root.header.data_offset
            and _ <= _root._io.size
        doc: Absolute offset of this expert's blob; 16 KiB-aligned, at or after `data_offset`.
      - id: raw_size
        type: u8
        valid:
          expr: _ >= 1 and _ <= _root._io.size - byte_offset
        doc: |
          Data bytes of the blob before padding: the end of the last scale byte
          (ruling D3).
        doc-ref: docs/FORMAT.md D3
      - id: padded_size
        type: u8
        valid:
          expr: >-
            _ == (raw_size + _root.page_size - 1) / _root.page_size * _root.page_size
            and _ <= _root._io.size - byte_offset
        doc: "`raw_size` rounded up to a multiple of 16384; the blob with its padding lies inside the file."
      - id: group_size
        type: u4
        valid: _root.header.group_size
        doc: Group size used; equal to `header.group_size` (64).
      - id: num_groups
        type: u8
        valid:
          expr: _ == tensors[0].num_groups + tensors[1].num_groups + tensors[2].num_groups
        doc: |
          Quantisation groups of the three tensors together: the sum of
          `ceil(rows * cols / 64)` (ruling D5).
        doc-ref: docs/FORMAT.md D5
      - id: reserved
        contents: [0, 0, 0, 0]
        doc: Must be zero.
    instances:
      prev:
        pos: _root.header.table_offset + (idx - 1).as<u8> * sizeof<expert_entry>
        type: expert_key
        if: idx > 0
        doc: The sort key of the previous table entry, for the ordering rule.
      tensors:
        pos: _root.header.descriptors_offset + idx.as<u8> * _root.tensors_per_expert * sizeof<tensor_descriptor>
        type: tensor_descriptor(_index, byte_offset, raw_size)
        repeat: expr
        repeat-expr: _root.tensors_per_expert
        doc: This expert's three descriptors, gate, up and down, in that order.
      padding:
        io: _root._io
        pos: byte_offset + raw_size
        size: padded_size - raw_size
        type: zero_fill
        doc: The blob's padding from `raw_size` to `padded_size`; must be zero (ruling D3).
        doc-ref: docs/FORMAT.md D3
  expert_key:
    doc: The first two fields of an expert table entry, read to check the table's order.
    seq:
      - id: layer_id
        type: u4
        doc: Transformer layer index.
      - id: expert_id
        type: u4
        doc: Expert index within the layer.
  tensor_descriptor:
    -smoe-struct: TensorDescriptor
    doc: |
      Where one of an expert's weight matrices lies inside its blob, 44 bytes.
      Ruling D3: in the blob, gate, up and down follow each other, each as its
      packed codes immediately followed by its scales, contiguous from blob
      offset 0 with no internal padding. Readers never assume this stride; they
      use these offsets, which must lie inside `[0, raw_size)` without overlap.
      Shapes: gate and up are `[moe_ffn_dim, d_model]`, down is
      `[d_model, moe_ffn_dim]`.

      Ruling D2 (normative decoding): the matrix `[rows, cols]` (HuggingFace
      `nn.Linear.weight`, `[out_features, in_features]`) is flattened row-major,
      weight `i` = `W[i // cols, i % cols]`, `n = rows * cols`. Groups are
      consecutive runs of 64 weights; the last may be partial and still has one
      scale. Scales are little-endian IEEE binary16, one per group, finite (an
      all-zero group may use any finite scale). Codes are packed LSB-first:
      weight `i` occupies bits `(i % (8 / bits)) * bits` of byte
      `i // (8 / bits)`; unused high bits of the last byte are zero.
      SMOE-Q4: `w = (code - 7.5) / 7.5 * scale`, code 0..15 (16 symmetric levels,
      no exact zero). SMOE-Q2: `w = (code - 1.5) / 1.5 * scale`, code 0..3.
      How an encoder picks each scale is its own freedom; decoding is fixed.
    doc-ref: docs/FORMAT.md D2, D3
    params:
      - id: slot
        type: u1
        doc: Position of this descriptor among its expert's three (0 gate, 1 up, 2 down).
      - id: blob_offset
        type: u8
        doc: Absolute offset of the expert's blob.
      - id: raw_size
        type: u8
        doc: The expert's `raw_size`; every slice lies inside it.
    seq:
      - id: tensor_type
        type: u1
        enum: tensor_type
        valid:
          expr: _.to_i == slot
        doc: Which matrix this is; the descriptors of an expert come in the order gate, up, down.
      - id: ndim
        type: u1
        valid: _root.tensor_ndim
        doc: Number of dimensions; always 2.
      - id: reserved_0
        contents: [0, 0]
        doc: Must be zero.
      - id: rows
        type: u4
        valid:
          min: 1
        doc: Rows of the weight matrix (its original shape[0], out_features).
      - id: cols
        type: u4
        valid:
          expr: _ >= 1 and _ <= raw_size * 8 / _root.header.bits / rows
        doc: |
          Columns of the weight matrix (its original shape[1], in_features). The
          matrix's codes fit in the blob (checked by division, so it cannot
          overflow).
      - id: packed_offset
        type: u8
        valid:
          max: raw_size
        doc: Offset of the packed codes within the expert blob.
      - id: packed_size
        type: u8
        valid:
          expr: >-
            _ == len_packed and _ <= raw_size - packed_offset
        doc: "Byte size of the packed codes: `ceil(rows * cols * bits / 8)`, inside `raw_size`."
      - id: scales_offset
        type: u8
        valid:
          max: raw_size
        doc: Offset of the float16 scales within the expert blob.
      - id: scales_size
        type: u8
        valid:
          expr: _ == len_scales and _ <= raw_size - scales_offset
        doc: "Byte size of the scales: `ceil(rows * cols / 64) * 2`, inside `raw_size`."
    instances:
      num_weights:
        value: rows.as<u8> * cols.as<u8>
        doc: Number of weights, `rows * cols`.
      num_groups:
        value: (num_weights + _root.header.group_size - 1) / _root.header.group_size
        doc: Number of quantisation groups, `ceil(rows * cols / 64)`.
      len_packed:
        value: (num_weights * _root.header.bits + 7) / 8
        doc: Bytes of packed codes a matrix of this shape takes, `ceil(rows * cols * bits / 8)`.
      len_scales:
        value: num_groups * _root.scale_bytes
        doc: Bytes of scales a matrix of this shape takes, `ceil(rows * cols / 64) * 2`.
      packed:
        io: _root._io
        pos: blob_offset + packed_offset
        size: len_packed
        doc: The packed codes.
      scales:
        io: _root._io
        pos: blob_offset + scales_offset
        size: len_scales
        doc: The float16 scales, little-endian, one per group.
  arch_block:
    -smoe-struct: SmoeArchBlock
    doc: |
      The vault's birth certificate (v2 only), 128 bytes at `header.reserved_ext`:
      the model constants the engine needs, from the checkpoint's `config.json`.
      Ruling D6: the engine refuses to load unless magic is "SARC",
      `block_version` 1, `block_size` 128, `activation` 0 (SiLU),
      `1 <= moe_top_k <= 16`, `1 <= head_dim <= 256`, `num_heads >= 1`,
      `num_kv_heads >= 1`, `num_heads % num_kv_heads == 0`, flag bits 3..31 and the
      44 reserved bytes zero. Warnings, not errors: `rms_norm_eps` more than 10%
      away from 1e-6; values that disagree with the tensors of the checkpoint or
      scout, where shapes win (has_qk_norm, has_dense_layer_0,
      shared_expert_ffn_dim).
    doc-ref: docs/FORMAT.md D6
    seq:
      - id: magic
        contents: SARC
        doc: '"SARC".'
      - id: block_version
        type: u4
        valid: _root.arch_block_version_current
        doc: Version of this block's layout; 1.
      - id: block_size
        type: u4
        valid: sizeof<arch_block>
        doc: Size of this block; 128.
      - id: flags
        type: u4
        valid:
          expr: (_ & ~_root.flags_known_mask) == 0
        doc: |
          Bit 0 norm_topk_prob, bit 1 has_qk_norm, bit 2 has_dense_layer_0; bits
          3..31 are zero.
      - id: rope_theta
        type: f4
        doc: RoPE base frequency (top-level or inside `rope_parameters` in config.json).
      - id: num_heads
        type: u4
        valid:
          min: 1
        doc: Attention query heads.
      - id: num_kv_heads
        type: u4
        valid:
          expr: _ >= 1 and num_heads % _ == 0
        doc: Key/value heads (GQA); at least 1 and divides `num_heads`.
      - id: head_dim
        type: u4
        valid:
          min: 1
          max: _root.max_head_dim
        doc: |
          Attention head dimension, 1..256. Ruling R3 (this spec): for multi-head
          latent attention (DeepSeek V2/V3, whose config has `qk_nope_head_dim` and
          `qk_rope_head_dim`) it is the query/key head width
          `qk_nope_head_dim + qk_rope_head_dim`, whatever `head_dim` config.json holds.
      - id: moe_top_k
        type: u4
        valid:
          min: 1
          max: _root.max_moe_top_k
        doc: Routed experts per token, 1..16.
      - id: moe_ffn_dim
        type: u4
        doc: Routed expert intermediate size.
      - id: dense_ffn_dim
        type: u4
        doc: Intermediate size of the dense layer(s); 0 when there are none.
      - id: shared_expert_ffn_dim
        type: u4
        doc: Shared expert intermediate size; 0 = no shared expert.
      - id: activation
        type: u4
        enum: activation
        valid: activation::silu
        doc: Expert activation; only SiLU/SwiGLU (0) is implemented by the kernels.
      - id: num_hidden_layers
        type: u4
        doc: Total transformer layers, dense and MoE.
      - id: rms_norm_eps
        type: f4
        doc: RMS-norm epsilon; the kernels compile 1e-6 and a value more than 10% away warns.
      - id: model_type
        type: strz
        size: 24
        encoding: UTF-8
        doc: |
          HF `model_type` (e.g. `qwen3_moe`), UTF-8, NUL-padded; a 24-byte name
          has no NUL. Ruling D6: writers truncate to 24 bytes without splitting a
          UTF-8 character.
      - id: reserved
        size: 44
        type: zero_fill
        doc: Must be zero.
    instances:
      norm_topk_prob:
        value: (flags & _root.flag_norm_topk_prob) != 0
        doc: Renormalise the selected top-k routing weights.
      has_qk_norm:
        value: (flags & _root.flag_has_qk_norm) != 0
        doc: Attention has per-head q/k RMS norms.
      has_dense_layer_0:
        value: (flags & _root.flag_has_dense_layer_0) != 0
        doc: Layer 0 is a dense MLP layer, not an MoE layer.
  zero_fill:
    doc: A run of bytes that must all be zero (reserved fields and blob padding).
    seq:
      - id: bytes
        type: u1
        repeat: eos
        valid: 0
        doc: Each byte is zero.
enums:
  tensor_type:
    0:
      id: gate_proj
      doc: Gate projection, `[moe_ffn_dim, d_model]`.
    1:
      id: up_proj
      doc: Up projection, `[moe_ffn_dim, d_model]`.
    2:
      id: down_proj
      doc: Down projection, `[d_model, moe_ffn_dim]`.
  activation:
    0:
      id: silu
      doc: SiLU-gated (SwiGLU) experts, the only activation the kernels implement.
