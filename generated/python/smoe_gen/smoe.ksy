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
  the descriptors; zero padding up to `ofs_data`; then the expert blobs, each
  zero-padded to a whole number of 16 KiB pages.

  All integers are little-endian and all offsets are absolute byte offsets from
  the start of the file, unless a field says "within the expert blob". A type
  such as `u8` is an 8-byte unsigned integer.

  Names: counts start with `num_`, byte offsets with `ofs_`, byte lengths with
  `len_`; model and quantisation hyperparameters keep the names of the model's
  config (`d_model`, `head_dim`, `moe_top_k`, `group_size`, `bits`, ...). Where a
  name differs from the reference C header's, `-orig-id` gives the header's name,
  which the generated C++ header and numpy layout use (`ofs_data` is
  `data_offset` there).

  Integer expressions are portable to every Kaitai target: each operand and each
  intermediate result that can exceed 2^31 is cast to one explicit unsigned type
  (`.as<u8>`), `valid` bounds are literals (the named constants below hold the same
  values for generated code), and there is no `%` on 8-byte values.
  Without the casts kaitai-struct-compiler 0.11 evaluates mixed expressions as
  32-bit signed integers in Rust, and Go rejects mixed operand types; see
  docs/KAITAI_TARGETS.md.

  Checks sit in lazy instances (the table, the descriptors, the arch block, the
  blob slices and padding): a generated parser checks only what is read. To run
  every check, read `experts` (each entry's `tensors` and `padding`, and each
  descriptor's `packed` and `scales`) and `arch`; docs/FORMAT.md section 9.

  Ruling D1 (packing): the structures are packed, with no implicit alignment
  anywhere; `expert_entry.num_groups` (u8 at offset 36) and
  `tensor_descriptor.ofs_packed` (u8 at offset 12) are unaligned. A C/C++
  mirror must use `#pragma pack(push, 1)` and assert the offset of every field.

  Ruling D6 (versions): readers accept versions 1 and 2 and refuse anything else
  with a clear error; the 8-byte magic never changes with the version. A v1
  vault has no arch block and `ofs_arch` is 0 (non-zero is a warning and is
  ignored). A v2 vault has a valid arch block at `ofs_arch`.

  Tool policies are not part of the format: how `smoe upgrade` edits a v1
  vault in place (ruling D7) and what the Sculptor reads and writes (ruling D8)
  are described in docs/TOOLS.md.

  Ruling R1 (this spec; the format document is silent): the descriptor count per
  expert is fixed at three, one per `tensor_type`, and an empty vault
  (`num_experts` = 0) is well-formed but holds nothing to stream.

  Ruling R2 (this spec): `model_type` must be valid UTF-8; its bytes after the
  first NUL must be zero as well (a NUL-padded name), so that the field is
  canonical and byte-identical vaults have identical names.

  Ruling R5 (this spec): `rope_theta` and `rms_norm_eps` are checked for being
  finite with a warning only; like the other arch values that are not among the
  engine's load rules (D6), they do not make a vault invalid.

  Ruling R6 (this spec): the `norm_topk_prob` flag says only whether the router
  divides the top-k weights it picked by their sum (a softmax over the top-k
  logits alone counts), as the family's modeling code does, not only as a config
  key says; scoring functions, correction biases, routed scaling, expert groups,
  layer patterns and attention variants are not in the arch block (the config
  copy beside the vault carries them). `num_heads` counts attention heads, not
  q_proj rows. A model without rotary embeddings (NoPE) records `rope_theta` 0.
doc-ref:
  - docs/FORMAT.md
  - docs/TOOLS.md
  - docs/KAITAI_TARGETS.md
seq:
  - id: header
    type: file_header
    doc: The fixed 64-byte file header at offset 0; the only part read at open.
instances:
  experts:
    pos: header.ofs_table.as<s8>
    type: expert_entry(_index.as<u4>)
    repeat: expr
    repeat-expr: header.num_experts
    doc: |
      The expert table: `num_experts` entries of 48 bytes from `ofs_table`.
      Ruling D4: sorted by `(layer_id, expert_id)` ascending, pairs unique.
    doc-ref: docs/FORMAT.md D4
  arch:
    pos: header.ofs_arch
    type: arch_block
    if: header.has_arch
    doc: The version-2 arch block ("SARC"), located by `header.ofs_arch`.
    doc-ref: docs/FORMAT.md D6
  len_page:
    value: 16384
    -smoe-const: PAGE_SIZE
    doc: |
      Alignment of `ofs_data`, of every blob offset and of every blob's
      padded size: the 16 KiB hardware page.
  quant_group_size:
    value: 64
    -smoe-const: GROUP_SIZE
    doc: Number of consecutive weights sharing one float16 scale.
  len_scale:
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
    doc: Alignment of the arch block (`ofs_arch`).
  arch_block_version_current:
    value: 1
    -smoe-const: ARCH_BLOCK_VERSION
    doc: The only `arch_block.block_version` defined.
  num_tensors_per_expert:
    value: 3
    -smoe-const: TENSORS_PER_EXPERT
    doc: Descriptors per expert, one per `tensor_type` (gate, up, down).
  num_tensor_dims:
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
    doc: "`arch_block.flags` bit 0: the router divides the selected top-k weights by their sum (R6)."
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
  len_model_type:
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
  file_header:
    -orig-id: header
    -smoe-struct: SmoeHeader
    doc: |
      File header, 64 bytes at offset 0. Everything else is located from it, and
      every count and offset in it is bounded by the file size here, so a huge
      `num_experts` or a wild offset fails at open before anything is allocated.
    seq:
      - id: magic
        contents: [0x53, 0x4d, 0x4f, 0x45, 0xde, 0xea, 0x00, 0x01]
        doc: '"SMOE" followed by the model marker DE EA 00 01; never changes with the version.'
      - id: version
        type: u4
        valid:
          min: 1
          max: 2
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
      - id: num_experts
        -orig-id: total_experts
        type: u4
        valid:
          expr: >-
            _ == 0 or (max_experts_per_layer != 0
            and ((_ - 1).as<u4> / max_experts_per_layer.as<u4>).as<u4> < num_moe_layers.as<u4>)
        doc: |
          Number of entries in the expert table of this file (ruling D5); at most
          `num_moe_layers * max_experts_per_layer` (checked by division, so that no
          target overflows). Bounded by the file size through `ofs_data`.
        doc-ref: docs/FORMAT.md D5
      - id: ofs_table
        -orig-id: table_offset
        type: u8
        valid: 64
        doc: Absolute offset of the first expert table entry; always 64, right after the header.
      - id: ofs_data
        -orig-id: data_offset
        type: u8
        valid:
          expr: >-
            (_.as<u8> & (_root.len_page.as<u8> - 1).as<u8>) == 0
            and _.as<u8> >= ofs_descriptors_end
            and _.as<u8> <= _io.size.as<u8>
        doc: |
          Absolute offset of the first expert blob: a multiple of 16384, at or
          after the end of the descriptors, and inside the file. Ruling D4: v2
          writers set it to `round_up(arch block end, 16384)`, v1 writers to
          `round_up(ofs_descriptors_end, 16384)`.
        doc-ref: docs/FORMAT.md D4
      - id: group_size
        type: u4
        valid: 64
        doc: Quantisation group size; always 64 (ruling D5).
      - id: bits
        type: u4
        valid:
          any-of: [2, 4]
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
      - id: ofs_arch
        -orig-id: reserved_ext
        type: u4
        valid:
          expr: >-
            not has_arch
            or ((_ & (_root.arch_align.as<u4> - 1).as<u4>) == 0
            and _.as<u8> >= ofs_descriptors_end
            and (_.as<u8> + sizeof<arch_block>.as<u8>).as<u8> <= ofs_data.as<u8>)
        doc: |
          v2: absolute offset of the arch block, a multiple of 64, at or after the
          end of the descriptors, with the whole 128-byte block before
          `ofs_data` (ruling D6). v2 writers put it at
          `round_up(ofs_descriptors_end, 64)` (ruling D4). v1: zero; a non-zero value
          is a warning and is ignored.
        doc-ref: docs/FORMAT.md D6
    instances:
      has_arch:
        value: version >= 2
        doc: Whether the vault carries an arch block (version 2 and later).
      ofs_descriptors:
        -orig-id: descriptors_offset
        value: >-
          (ofs_table.as<u8>
          + (num_experts.as<u8> * sizeof<expert_entry>.as<u8>).as<u8>).as<u8>
        doc: Absolute offset of the first tensor descriptor, right after the table (ruling D4).
        doc-ref: docs/FORMAT.md D4
      ofs_descriptors_end:
        -orig-id: descriptors_end
        value: >-
          (ofs_descriptors + (num_experts.as<u8>
          * (_root.num_tensors_per_expert.as<u8> * sizeof<tensor_descriptor>.as<u8>).as<u8>).as<u8>).as<u8>
        doc: Absolute offset one past the last tensor descriptor.
  expert_entry:
    -smoe-struct: ExpertEntry
    doc: |
      One row of the expert table, 48 bytes. Ruling D4: the table is sorted by
      `(layer_id, expert_id)` ascending with unique pairs; writers place blobs in
      table order, back to back from `ofs_data`; readers only require 16 KiB
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
            and (not has_prev or layer_id > prev.layer_id
            or (layer_id == prev.layer_id and _ > prev.expert_id))
        doc: |
          Expert index within the layer; below `max_experts_per_layer`, and
          `(layer_id, expert_id)` strictly greater than the previous entry's
          (sorted and unique, ruling D4).
        doc-ref: docs/FORMAT.md D4
      - id: ofs_blob
        -orig-id: byte_offset
        type: u8
        valid:
          expr: >-
            (_.as<u8> & (_root.len_page.as<u8> - 1).as<u8>) == 0
            and _ >= _root.header.ofs_data
            and _.as<u8> <= _root._io.size.as<u8>
        doc: Absolute offset of this expert's blob; 16 KiB-aligned, at or after `ofs_data`.
      - id: len_raw
        -orig-id: raw_size
        type: u8
        valid:
          expr: _ >= 1 and _.as<u8> <= (_root._io.size.as<u8> - ofs_blob.as<u8>).as<u8>
        doc: |
          Data bytes of the blob before padding: the end of the last scale byte
          (ruling D3).
        doc-ref: docs/FORMAT.md D3
      - id: len_padded
        -orig-id: padded_size
        type: u8
        valid:
          expr: >-
            _.as<u8> == len_padded_expected
            and _.as<u8> <= (_root._io.size.as<u8> - ofs_blob.as<u8>).as<u8>
        doc: "`len_raw` rounded up to a multiple of 16384; the blob with its padding lies inside the file."
      - id: group_size
        type: u4
        valid: _root.header.group_size
        doc: Group size used; equal to `header.group_size` (64).
      - id: num_groups
        type: u8
        valid:
          expr: >-
            _.as<u8> == (tensors[0].num_groups
            + (tensors[1].num_groups + tensors[2].num_groups).as<u8>).as<u8>
        doc: |
          Quantisation groups of the three tensors together: the sum of
          `ceil(num_rows * num_cols / 64)` (ruling D5).
        doc-ref: docs/FORMAT.md D5
      - id: reserved
        contents: [0, 0, 0, 0]
        doc: Must be zero.
    instances:
      has_prev:
        value: idx > 0
        doc: Whether a table entry precedes this one.
      len_padded_expected:
        value: >-
          (((len_raw.as<u8> + (_root.len_page.as<u8> - 1).as<u8>).as<u8>
          / _root.len_page.as<u8>).as<u8> * _root.len_page.as<u8>).as<u8>
        doc: "`len_raw` rounded up to a multiple of 16384."
      ofs_descriptors:
        value: >-
          (_root.header.ofs_descriptors + (idx.as<u8>
          * (_root.num_tensors_per_expert.as<u8> * sizeof<tensor_descriptor>.as<u8>).as<u8>).as<u8>).as<u8>
        doc: Absolute offset of this expert's three descriptors.
      prev:
        pos: >-
          (_root.header.ofs_table.as<u8>
          + ((idx - 1).as<u8> * sizeof<expert_entry>.as<u8>).as<u8>).as<s8>
        type: expert_key
        if: has_prev
        doc: The sort key of the previous table entry, for the ordering rule.
      gate_shape:
        pos: ofs_descriptors.as<s8>
        type: descriptor_shape
        doc: The shape of this expert's gate descriptor, for the shape rules of up and down.
      prev_gate_shape:
        pos: >-
          (ofs_descriptors
          - (_root.num_tensors_per_expert.as<u8> * sizeof<tensor_descriptor>.as<u8>).as<u8>).as<s8>
        type: descriptor_shape
        if: has_prev
        doc: The shape of the previous table entry's gate descriptor, for the layer shape rule.
      tensors:
        pos: ofs_descriptors.as<s8>
        type: tensor_descriptor(_index.as<u1>, ofs_blob, len_raw)
        repeat: expr
        repeat-expr: _root.num_tensors_per_expert
        doc: This expert's three descriptors, gate, up and down, in that order.
      padding:
        io: _root._io
        pos: (ofs_blob.as<u8> + len_raw.as<u8>).as<s8>
        size: (len_padded.as<u8> - len_raw.as<u8>).as<u8>
        type: zero_fill
        doc: The blob's padding from `len_raw` to `len_padded`; must be zero (ruling D3).
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
  descriptor_shape:
    doc: The first 12 bytes of a tensor descriptor, read to check the shape rules.
    seq:
      - id: tensor_type
        type: u1
        doc: Which matrix the descriptor describes.
      - id: num_dims
        type: u1
        doc: Number of dimensions.
      - id: reserved_0
        size: 2
        doc: Reserved.
      - id: num_rows
        type: u4
        doc: Rows of the weight matrix.
      - id: num_cols
        type: u4
        doc: Columns of the weight matrix.
  tensor_descriptor:
    -smoe-struct: TensorDescriptor
    doc: |
      Where one of an expert's weight matrices lies inside its blob, 44 bytes.
      Ruling D3: in the blob, gate, up and down follow each other, each as its
      packed codes immediately followed by its scales, contiguous from blob
      offset 0 with no internal padding. Readers never assume this stride; they
      use these offsets, which must lie inside `[0, len_raw)` without overlap.

      Shape rules (ruling D3): gate and up are `[moe_ffn_dim, d_model]`, down is
      `[d_model, moe_ffn_dim]`: up has gate's shape, down has gate's shape
      transposed, gate's `num_cols` is `header.d_model`, and every expert of a
      layer has the gate rows of the layer's first expert (so all experts of a
      layer share one shape). In a v2 vault gate's rows equal the arch block's
      `moe_ffn_dim` (checked by the verifiers, not here: the arch block is
      optional).

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
      - id: ofs_blob
        type: u8
        doc: Absolute offset of the expert's blob.
      - id: len_raw
        type: u8
        doc: The expert's `len_raw`; every slice lies inside it.
    seq:
      - id: tensor_type
        type: u1
        enum: tensor_type
        valid: >-
          is_gate ? tensor_type::gate_proj
          : is_up ? tensor_type::up_proj : tensor_type::down_proj
        doc: Which matrix this is; the descriptors of an expert come in the order gate, up, down.
      - id: num_dims
        -orig-id: ndim
        type: u1
        valid: 2
        doc: Number of dimensions; always 2.
      - id: reserved_0
        contents: [0, 0]
        doc: Must be zero.
      - id: num_rows
        -orig-id: rows
        type: u4
        valid:
          expr: >-
            _ >= 1
            and (not is_gate or not _parent.has_prev
            or _parent.layer_id != _parent.prev.layer_id
            or _ == _parent.prev_gate_shape.num_rows)
            and (is_gate
            or _ == (is_up ? _parent.gate_shape.num_rows : _parent.gate_shape.num_cols))
        doc: |
          Rows of the weight matrix (its original shape[0], out_features). Gate:
          the same as the previous expert's gate when that expert is of the same
          layer; up: gate's rows; down: gate's columns.
      - id: num_cols
        -orig-id: cols
        type: u4
        valid:
          expr: >-
            _ >= 1 and _.as<u8> <= (len_max_weights / num_rows.as<u8>).as<u8>
            and _ == (is_gate ? _root.header.d_model
            : is_up ? _parent.gate_shape.num_cols : _parent.gate_shape.num_rows)
        doc: |
          Columns of the weight matrix (its original shape[1], in_features). The
          matrix's codes fit in the blob (checked by division, so it cannot
          overflow). Gate: `header.d_model`; up: gate's columns; down: gate's rows.
      - id: ofs_packed
        -orig-id: packed_offset
        type: u8
        valid:
          # `_.as<s8> >= 0` only matters in Java, whose 8-byte integers are signed.
          expr: _.as<s8> >= 0 and _.as<u8> <= len_raw
        doc: Offset of the packed codes within the expert blob, at most `len_raw`.
      - id: len_packed
        -orig-id: packed_size
        type: u8
        valid:
          expr: >-
            _.as<u8> == len_packed_expected
            and _.as<u8> <= (len_raw - ofs_packed.as<u8>).as<u8>
        doc: "Byte size of the packed codes: `ceil(num_rows * num_cols * bits / 8)`, inside `len_raw`."
      - id: ofs_scales
        -orig-id: scales_offset
        type: u8
        valid:
          expr: _.as<s8> >= 0 and _.as<u8> <= len_raw
        doc: Offset of the float16 scales within the expert blob, at most `len_raw`.
      - id: len_scales
        -orig-id: scales_size
        type: u8
        valid:
          expr: >-
            _.as<u8> == len_scales_expected
            and _.as<u8> <= (len_raw - ofs_scales.as<u8>).as<u8>
        doc: "Byte size of the scales: `ceil(num_rows * num_cols / 64) * 2`, inside `len_raw`."
    instances:
      is_gate:
        value: slot == 0
        doc: Whether this is the gate descriptor (slot 0).
      is_up:
        value: slot == 1
        doc: Whether this is the up descriptor (slot 1).
      len_max_weights:
        value: ((len_raw * 8).as<u8> / _root.header.bits.as<u8>).as<u8>
        doc: The most weights whose codes fit in `len_raw` bytes.
      num_weights:
        value: (num_rows.as<u8> * num_cols.as<u8>).as<u8>
        doc: Number of weights, `num_rows * num_cols`.
      num_groups:
        value: >-
          ((num_weights + (_root.header.group_size - 1).as<u8>).as<u8>
          / _root.header.group_size.as<u8>).as<u8>
        doc: Number of quantisation groups, `ceil(num_rows * num_cols / 64)`.
      len_packed_expected:
        value: >-
          (((num_weights * _root.header.bits.as<u8>).as<u8> + 7).as<u8> / 8).as<u8>
        doc: Bytes of packed codes a matrix of this shape takes, `ceil(num_rows * num_cols * bits / 8)`.
      len_scales_expected:
        value: (num_groups * _root.len_scale.as<u8>).as<u8>
        doc: Bytes of scales a matrix of this shape takes, `ceil(num_rows * num_cols / 64) * 2`.
      packed:
        io: _root._io
        pos: (ofs_blob + ofs_packed.as<u8>).as<s8>
        size: len_packed
        doc: The packed codes.
      scales:
        io: _root._io
        pos: (ofs_blob + ofs_scales.as<u8>).as<s8>
        size: len_scales
        doc: The float16 scales, little-endian, one per group.
  arch_block:
    -smoe-struct: SmoeArchBlock
    doc: |
      The vault's birth certificate (v2 only), 128 bytes at `header.ofs_arch`:
      the model constants the engine needs, from the checkpoint's `config.json`.
      Ruling D6: the engine refuses to load unless magic is "SARC",
      `block_version` 1, `len_block` 128, `activation` 0 (SiLU),
      `1 <= moe_top_k <= 16`, `1 <= head_dim <= 256`, `num_heads >= 1`,
      `num_kv_heads >= 1`, `num_heads % num_kv_heads == 0`, flag bits 3..31 and the
      44 reserved bytes zero, `model_type` as ruling R2 says. Warnings, not errors:
      `rms_norm_eps` more than 10% away from 1e-6; values that disagree with the
      tensors of the checkpoint or scout, where shapes win (has_qk_norm,
      has_dense_layer_0, shared_expert_ffn_dim).
    doc-ref: docs/FORMAT.md D6
    seq:
      - id: magic
        contents: SARC
        doc: '"SARC".'
      - id: block_version
        type: u4
        valid: 1
        doc: Version of this block's layout; 1.
      - id: len_block
        -orig-id: block_size
        type: u4
        valid: sizeof<arch_block>
        doc: Size of this block; 128.
      - id: flags
        type: u4
        valid:
          max: 7
        doc: |
          Bit 0 norm_topk_prob, bit 1 has_qk_norm, bit 2 has_dense_layer_0; bits
          3..31 are zero.
      - id: rope_theta
        type: f4
        doc: RoPE base frequency (top-level or inside `rope_parameters` in config.json); 0 without rotary embeddings (R6).
      - id: num_heads
        type: u4
        valid:
          min: 1
        doc: Attention query heads.
      - id: num_kv_heads
        type: u4
        valid:
          expr: _ >= 1 and ((num_heads / _).as<u4> * _.as<u4>).as<u4> == num_heads.as<u4>
        doc: Key/value heads (GQA); at least 1 and divides `num_heads`.
      - id: head_dim
        type: u4
        valid:
          expr: _ >= 1 and _.as<u4> <= _root.max_head_dim.as<u4>
        doc: |
          Attention head dimension, 1..256. Ruling R3 (this spec): for multi-head
          latent attention (DeepSeek V2/V3, whose config has `qk_nope_head_dim` and
          `qk_rope_head_dim`) it is the query/key head width
          `qk_nope_head_dim + qk_rope_head_dim`, whatever `head_dim` config.json holds.
      - id: moe_top_k
        type: u4
        valid:
          min: 1
          max: 16
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
        valid:
          expr: _.as<u4> >= _root.header.num_moe_layers.as<u4>
        doc: |
          Total transformer layers, dense and MoE: at least the header's
          `num_moe_layers`. The block has no field for multi-token-prediction
          layers, so it counts no MoE layer beyond this one.
      - id: rms_norm_eps
        type: f4
        doc: RMS-norm epsilon; the kernels compile 1e-6 and a value more than 10% away warns.
      - id: model_type
        size: 24
        type: nul_padded_utf8
        -smoe-text: UTF-8
        doc: |
          HF `model_type` (e.g. `qwen3_moe`), UTF-8, NUL-padded; a 24-byte name
          has no NUL (ruling R2, checked byte by byte, so that every target
          rejects invalid UTF-8 alike; `model_type.text` is the name). Ruling D6:
          a name is never stored split inside a UTF-8 character; smoe's writer
          refuses a name longer than 24 bytes (or not printable ASCII) rather
          than cut it.
        doc-ref: docs/FORMAT.md R2
      - id: reserved
        size: 44
        type: zero_fill
        doc: Must be zero.
    instances:
      norm_topk_prob:
        value: (flags & _root.flag_norm_topk_prob.as<u4>) != 0
        doc: The router divides the selected top-k routing weights by their sum (R6).
      has_qk_norm:
        value: (flags & _root.flag_has_qk_norm.as<u4>) != 0
        doc: Attention has per-head q/k RMS norms.
      has_dense_layer_0:
        value: (flags & _root.flag_has_dense_layer_0.as<u4>) != 0
        doc: Layer 0 is a dense MLP layer, not an MoE layer.
  nul_padded_utf8:
    doc: |
      A NUL-padded UTF-8 name (ruling R2): well-formed UTF-8 characters up to the
      first NUL or the end, then only NULs.
    seq:
      - id: chars
        type: utf8_char
        repeat: until
        repeat-until: _.b0 == 0 or _io.eof
        doc: The characters, the terminating NUL included when there is one.
      - id: padding
        type: zero_fill
        size-eos: true
        doc: The bytes after the first NUL; all zero.
    instances:
      text:
        pos: 0
        type: strz
        size-eos: true
        encoding: UTF-8
        doc: The name, decoded (valid UTF-8 once `chars` has been read).
  utf8_char:
    doc: |
      One well-formed UTF-8 character (RFC 3629): no overlong forms, no
      surrogates, nothing above U+10FFFF.
    seq:
      - id: b0
        type: u1
        valid:
          expr: >-
            _ < 0x80 or (_ >= 0xc2 and _ <= 0xf4
            and (_io.size - _io.pos).as<u4> >= (_ >= 0xf0 ? 3 : _ >= 0xe0 ? 2 : 1).as<u4>)
        doc: |
          Lead byte: ASCII, or the start of a 2- to 4-byte character whose
          continuation bytes are all inside the field.
      - id: b1
        type: u1
        if: b0 >= 0x80
        valid:
          min: '(b0 == 0xe0 ? 0xa0 : b0 == 0xf0 ? 0x90 : 0x80).as<u1>'
          max: '(b0 == 0xed ? 0x9f : b0 == 0xf4 ? 0x8f : 0xbf).as<u1>'
        doc: First continuation byte; its range depends on the lead byte.
      - id: b2
        type: u1
        if: b0 >= 0xe0
        valid:
          min: 0x80
          max: 0xbf
        doc: Second continuation byte.
      - id: b3
        type: u1
        if: b0 >= 0xf0
        valid:
          min: 0x80
          max: 0xbf
        doc: Third continuation byte.
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
# ---------------------------------------------------------------------------------------
# The rule registry: every validity rule of the format, once. Kaitai ignores keys that
# start with `-`; `make gen` renders this list into smoe_gen.layout (class Rule), into
# generated/cpp/common.hpp (smoe::rules) and into the rules table of SPEC.md. Checkers
# emit findings only under these codes. Per rule:
#   code      stable finding code, `<scope>.<what>`
#   severity  error (the vault must not be used), warning (usable), info
#   load      true: an engine load rule, the engine refuses to load a vault that breaks
#             it (checked when a vault is opened, before any blob is streamed)
#   deep      true: only a deep check, which reads blob contents, can see it
#   ksy       true: this .ksy states it (`valid`, `contents` or the layout itself), so a
#             generated parser that touches every instance rejects a vault breaking it
#   sidecar   true: a rule of the integrity manifest beside a vault (docs/MANIFEST.md),
#             not of the format
#   ruling    the rulings it comes from, as restated in docs/FORMAT.md
#   message   the rule, in one line
-smoe-rules:
  # ---- header (docs/FORMAT.md section 2)
  - code: header.size
    severity: error
    load: true
    ksy: true
    message: the file holds at least the 64-byte header
  - code: header.magic
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: magic is 53 4D 4F 45 DE EA 00 01 ("SMOE" DE EA 00 01), whatever the version
  - code: header.version
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: version is 1 or 2
  - code: header.total_experts
    severity: error
    load: true
    ksy: true
    ruling: [D5]
    message: total_experts is at most num_moe_layers * max_experts_per_layer
  - code: header.table_offset
    severity: error
    load: true
    ksy: true
    message: table_offset is 64, right after the header
  - code: header.group_size
    severity: error
    load: true
    ksy: true
    ruling: [D5]
    message: group_size is 64
  - code: header.bits
    severity: error
    load: true
    ksy: true
    message: bits is 2 (SMOE-Q2) or 4 (SMOE-Q4)
  - code: header.d_model
    severity: error
    load: true
    ksy: true
    ruling: [D5]
    message: d_model is at least 1
  - code: header.data_offset_align
    severity: error
    load: true
    ksy: true
    ruling: [D4]
    message: data_offset is a multiple of 16384
  - code: header.data_offset_bounds
    severity: error
    load: true
    ksy: true
    message: data_offset lies inside the file
  - code: header.table_bounds
    severity: error
    load: true
    ksy: true
    message: the table and the descriptors end at or before data_offset
  - code: header.reserved_ext
    severity: warning
    load: false
    ksy: false
    ruling: [D6]
    message: reserved_ext is 0 in a version 1 vault (any other value is ignored)
  - code: header.ffn_dim
    severity: warning
    load: false
    ksy: false
    ruling: [D5]
    message: >-
      ffn_dim is the dense/shared FFN size (the arch block's when it has one), not
      d_model as the original converter wrote it
  - code: header.partial
    severity: info
    load: false
    ksy: false
    ruling: [D5]
    message: >-
      a partial vault holds fewer than num_moe_layers * max_experts_per_layer experts
  - code: header.gap
    severity: warning
    load: false
    deep: true
    ksy: false
    message: the bytes between the end of the metadata and data_offset are zero
  # ---- arch block (section 5): its placement and the engine's load rules (D6)
  - code: arch.placement
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: >-
      v2: reserved_ext is a multiple of 64, at or after the end of the descriptors,
      and reserved_ext + 128 <= data_offset
  - code: arch.bounds
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: "v2: the 128-byte arch block lies inside the file"
  - code: arch.magic
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: the arch block starts with "SARC"
  - code: arch.block_version
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: block_version is 1
  - code: arch.block_size
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: block_size is 128
  - code: arch.flags
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: flag bits 3..31 are zero
  - code: arch.num_heads
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: num_heads is at least 1
  - code: arch.num_kv_heads
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: num_kv_heads is at least 1 and divides num_heads
  - code: arch.head_dim
    severity: error
    load: true
    ksy: true
    ruling: [D6, R3]
    message: head_dim is in 1..256
  - code: arch.moe_top_k
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: moe_top_k is in 1..16
  - code: arch.num_hidden_layers
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: num_hidden_layers is at least the header's num_moe_layers
  - code: arch.activation
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: activation is 0 (SiLU-gated)
  - code: arch.model_type
    severity: error
    load: true
    ksy: true
    ruling: [D6, R2]
    message: model_type is valid UTF-8, and every byte after its first NUL is NUL
  - code: arch.reserved
    severity: error
    load: true
    ksy: true
    ruling: [D6]
    message: the 44 reserved bytes of the arch block are zero
  - code: arch.rms_norm_eps
    severity: warning
    load: false
    ksy: false
    ruling: [D6, R5]
    message: rms_norm_eps is finite and within 10% of 1e-6, the value the kernels are built for
  - code: arch.rope_theta
    severity: warning
    load: false
    ksy: false
    ruling: [R5]
    message: rope_theta is finite
  - code: arch.moe_ffn_dim
    severity: warning
    load: false
    ksy: false
    ruling: [D3]
    message: moe_ffn_dim equals the rows of the experts' gate_proj (the shapes win)
  # ---- expert table (section 3)
  - code: table.order
    severity: error
    load: true
    ksy: true
    ruling: [D4]
    message: the table is sorted by (layer_id, expert_id) ascending
  - code: table.duplicate
    severity: error
    load: true
    ksy: true
    ruling: [D4]
    message: no (layer_id, expert_id) pair appears twice
  - code: table.layers
    severity: error
    load: true
    ksy: false
    ruling: [R4]
    message: the table holds experts of at most num_moe_layers distinct layers
  - code: table.overlap
    severity: error
    load: true
    ksy: false
    ruling: [D4]
    message: no two blobs (with their padding) overlap
  - code: table.gap
    severity: warning
    load: false
    ksy: false
    ruling: [D4]
    message: blobs lie back to back from data_offset (a gap is reported, not fatal)
  - code: entry.expert_id
    severity: error
    load: true
    ksy: true
    ruling: [D5]
    message: expert_id is below max_experts_per_layer
  - code: entry.byte_offset_align
    severity: error
    load: true
    ksy: true
    ruling: [D4]
    message: byte_offset is a multiple of 16384
  - code: entry.byte_offset
    severity: error
    load: true
    ksy: true
    ruling: [D4]
    message: byte_offset is at or after data_offset
  - code: entry.raw_size
    severity: error
    load: true
    ksy: true
    ruling: [D3]
    message: raw_size is at least 1
  - code: entry.blob_bounds
    severity: error
    load: true
    ksy: true
    ruling: [D4]
    message: the blob, [byte_offset, byte_offset + padded_size), lies inside the file
  - code: entry.padded_size
    severity: error
    load: true
    ksy: true
    ruling: [D3]
    message: padded_size is raw_size rounded up to a multiple of 16384
  - code: entry.group_size
    severity: error
    load: true
    ksy: true
    ruling: [D5]
    message: group_size equals header.group_size
  - code: entry.num_groups
    severity: error
    load: true
    ksy: true
    ruling: [D5]
    message: num_groups is the sum of ceil(rows * cols / 64) over the three tensors
  - code: entry.reserved
    severity: error
    load: true
    ksy: true
    message: the reserved bytes of a table entry are zero
  # ---- tensor descriptors (section 4)
  - code: descriptor.tensor_type
    severity: error
    load: true
    ksy: true
    ruling: [R1]
    message: an expert's three descriptors are gate, up and down, in that order
  - code: descriptor.ndim
    severity: error
    load: true
    ksy: true
    message: ndim is 2
  - code: descriptor.reserved
    severity: error
    load: true
    ksy: true
    message: the reserved bytes of a descriptor are zero
  - code: descriptor.rows
    severity: error
    load: true
    ksy: true
    message: rows is at least 1
  - code: descriptor.cols
    severity: error
    load: true
    ksy: true
    message: cols is at least 1 and the matrix's codes fit in the blob's raw_size
  - code: descriptor.packed_size
    severity: error
    load: true
    ksy: true
    ruling: [D2]
    message: packed_size is ceil(rows * cols * bits / 8)
  - code: descriptor.scales_size
    severity: error
    load: true
    ksy: true
    ruling: [D2]
    message: scales_size is ceil(rows * cols / 64) * 2
  - code: descriptor.slice_bounds
    severity: error
    load: true
    ksy: true
    ruling: [D3]
    message: the packed and scales slices lie inside [0, raw_size) of the blob
  - code: descriptor.slice_overlap
    severity: error
    load: true
    ksy: false
    ruling: [D3]
    message: no two of an expert's six slices overlap
  - code: descriptor.shape
    severity: error
    load: true
    ksy: true
    ruling: [D3]
    message: >-
      up has gate's shape, down has gate's shape transposed, and gate's cols equals
      header.d_model
  - code: layer.shape
    severity: error
    load: true
    ksy: true
    ruling: [D3]
    message: all experts of one layer have the same shapes
  # ---- blob contents (section 6): what only a deep check reads
  - code: blob.padding
    severity: error
    load: false
    deep: true
    ksy: true
    ruling: [D3]
    message: the blob's padding, [raw_size, padded_size), is zero
  - code: blob.scales
    severity: error
    load: false
    deep: true
    ksy: false
    ruling: [D2]
    message: every scale is a finite float16
  - code: blob.packed_tail
    severity: error
    load: false
    deep: true
    ksy: false
    ruling: [D2]
    message: the unused high bits of a tensor's last code byte are zero
  # ---- the integrity manifest beside a vault (docs/MANIFEST.md; not the format)
  - code: manifest.malformed
    severity: error
    load: false
    deep: true
    ksy: false
    sidecar: true
    message: the manifest is a readable smoe-manifest/1 document
  - code: manifest.vault
    severity: error
    load: false
    deep: true
    ksy: false
    sidecar: true
    message: the manifest describes this vault (its size and number of experts)
  - code: manifest.expert
    severity: error
    load: false
    deep: true
    ksy: false
    sidecar: true
    message: the manifest lists the table's experts, in table order, with their offsets and sizes
  - code: manifest.checksum
    severity: error
    load: false
    deep: true
    ksy: false
    sidecar: true
    message: every blob's CRC-32C equals the manifest's
