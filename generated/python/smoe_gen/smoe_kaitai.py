# This is a generated file! Please edit source .ksy file and use kaitai-struct-compiler to rebuild
# type: ignore

import kaitaistruct
from kaitaistruct import KaitaiStruct, KaitaiStream, BytesIO
from enum import IntEnum


if getattr(kaitaistruct, 'API_VERSION', (0, 9)) < (0, 11):
    raise Exception("Incompatible Kaitai Struct Python API: 0.11 or later is required, but you have %s" % (kaitaistruct.__version__))

class Smoe(KaitaiStruct):
    """A `.smoe` vault holds the routed-expert weights of a Mixture-of-Experts
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
    
    .. seealso::
       docs/FORMAT.md
    
    
    .. seealso::
       docs/TOOLS.md
    """

    class Activation(IntEnum):
        silu = 0

    class TensorType(IntEnum):
        gate_proj = 0
        up_proj = 1
        down_proj = 2
    def __init__(self, _io, _parent=None, _root=None):
        super(Smoe, self).__init__(_io)
        self._parent = _parent
        self._root = _root or self
        self._read()

    def _read(self):
        self.header = Smoe.Header(self._io, self, self._root)


    def _fetch_instances(self):
        pass
        self.header._fetch_instances()
        _ = self.arch
        if hasattr(self, '_m_arch'):
            pass
            self._m_arch._fetch_instances()

        _ = self.experts
        if hasattr(self, '_m_experts'):
            pass
            for i in range(len(self._m_experts)):
                pass
                self._m_experts[i]._fetch_instances()



    class ArchBlock(KaitaiStruct):
        """The vault's birth certificate (v2 only), 128 bytes at `header.reserved_ext`:
        the model constants the engine needs, from the checkpoint's `config.json`.
        Ruling D6: the engine refuses to load unless magic is "SARC",
        `block_version` 1, `block_size` 128, `activation` 0 (SiLU),
        `1 <= moe_top_k <= 16`, `1 <= head_dim <= 256`, `num_heads >= 1`,
        `num_kv_heads >= 1`, `num_heads % num_kv_heads == 0`, flag bits 3..31 and the
        44 reserved bytes zero. Warnings, not errors: `rms_norm_eps` more than 10%
        away from 1e-6; values that disagree with the tensors of the checkpoint or
        scout, where shapes win (has_qk_norm, has_dense_layer_0,
        shared_expert_ffn_dim).
        
        .. seealso::
           docs/FORMAT.md D6
        """
        def __init__(self, _io, _parent=None, _root=None):
            super(Smoe.ArchBlock, self).__init__(_io)
            self._parent = _parent
            self._root = _root
            self._read()

        def _read(self):
            self.magic = self._io.read_bytes(4)
            if not self.magic == b"\x53\x41\x52\x43":
                raise kaitaistruct.ValidationNotEqualError(b"\x53\x41\x52\x43", self.magic, self._io, u"/types/arch_block/seq/0")
            self.block_version = self._io.read_u4le()
            if not self.block_version == self._root.arch_block_version_current:
                raise kaitaistruct.ValidationNotEqualError(self._root.arch_block_version_current, self.block_version, self._io, u"/types/arch_block/seq/1")
            self.block_size = self._io.read_u4le()
            if not self.block_size == 128:
                raise kaitaistruct.ValidationNotEqualError(128, self.block_size, self._io, u"/types/arch_block/seq/2")
            self.flags = self._io.read_u4le()
            _ = self.flags
            if not _ & ~(self._root.flags_known_mask) == 0:
                raise kaitaistruct.ValidationExprError(self.flags, self._io, u"/types/arch_block/seq/3")
            self.rope_theta = self._io.read_f4le()
            self.num_heads = self._io.read_u4le()
            if not self.num_heads >= 1:
                raise kaitaistruct.ValidationLessThanError(1, self.num_heads, self._io, u"/types/arch_block/seq/5")
            self.num_kv_heads = self._io.read_u4le()
            _ = self.num_kv_heads
            if not  ((_ >= 1) and (self.num_heads % _ == 0)) :
                raise kaitaistruct.ValidationExprError(self.num_kv_heads, self._io, u"/types/arch_block/seq/6")
            self.head_dim = self._io.read_u4le()
            if not self.head_dim >= 1:
                raise kaitaistruct.ValidationLessThanError(1, self.head_dim, self._io, u"/types/arch_block/seq/7")
            if not self.head_dim <= self._root.max_head_dim:
                raise kaitaistruct.ValidationGreaterThanError(self._root.max_head_dim, self.head_dim, self._io, u"/types/arch_block/seq/7")
            self.moe_top_k = self._io.read_u4le()
            if not self.moe_top_k >= 1:
                raise kaitaistruct.ValidationLessThanError(1, self.moe_top_k, self._io, u"/types/arch_block/seq/8")
            if not self.moe_top_k <= self._root.max_moe_top_k:
                raise kaitaistruct.ValidationGreaterThanError(self._root.max_moe_top_k, self.moe_top_k, self._io, u"/types/arch_block/seq/8")
            self.moe_ffn_dim = self._io.read_u4le()
            self.dense_ffn_dim = self._io.read_u4le()
            self.shared_expert_ffn_dim = self._io.read_u4le()
            self.activation = KaitaiStream.resolve_enum(Smoe.Activation, self._io.read_u4le())
            if not self.activation == Smoe.Activation.silu:
                raise kaitaistruct.ValidationNotEqualError(Smoe.Activation.silu, self.activation, self._io, u"/types/arch_block/seq/12")
            self.num_hidden_layers = self._io.read_u4le()
            self.rms_norm_eps = self._io.read_f4le()
            self.model_type = (KaitaiStream.bytes_terminate(self._io.read_bytes(24), 0, False)).decode(u"UTF-8")
            self._raw_reserved = self._io.read_bytes(44)
            _io__raw_reserved = KaitaiStream(BytesIO(self._raw_reserved))
            self.reserved = Smoe.ZeroFill(_io__raw_reserved, self, self._root)


        def _fetch_instances(self):
            pass
            self.reserved._fetch_instances()

        @property
        def has_dense_layer_0(self):
            """Layer 0 is a dense MLP layer, not an MoE layer."""
            if hasattr(self, '_m_has_dense_layer_0'):
                return self._m_has_dense_layer_0

            self._m_has_dense_layer_0 = self.flags & self._root.flag_has_dense_layer_0 != 0
            return getattr(self, '_m_has_dense_layer_0', None)

        @property
        def has_qk_norm(self):
            """Attention has per-head q/k RMS norms."""
            if hasattr(self, '_m_has_qk_norm'):
                return self._m_has_qk_norm

            self._m_has_qk_norm = self.flags & self._root.flag_has_qk_norm != 0
            return getattr(self, '_m_has_qk_norm', None)

        @property
        def norm_topk_prob(self):
            """Renormalise the selected top-k routing weights."""
            if hasattr(self, '_m_norm_topk_prob'):
                return self._m_norm_topk_prob

            self._m_norm_topk_prob = self.flags & self._root.flag_norm_topk_prob != 0
            return getattr(self, '_m_norm_topk_prob', None)


    class ExpertEntry(KaitaiStruct):
        """One row of the expert table, 48 bytes. Ruling D4: the table is sorted by
        `(layer_id, expert_id)` ascending with unique pairs; writers place blobs in
        table order, back to back from `data_offset`; readers only require 16 KiB
        alignment, bounds inside the file and no overlap (gaps are reported, not
        fatal).
        
        .. seealso::
           docs/FORMAT.md D4
        """
        def __init__(self, idx, _io, _parent=None, _root=None):
            super(Smoe.ExpertEntry, self).__init__(_io)
            self._parent = _parent
            self._root = _root
            self.idx = idx
            self._read()

        def _read(self):
            self.layer_id = self._io.read_u4le()
            self.expert_id = self._io.read_u4le()
            _ = self.expert_id
            if not  ((_ < self._root.header.max_experts_per_layer) and ( ((self.idx == 0) or (self.layer_id > self.prev.layer_id) or ( ((self.layer_id == self.prev.layer_id) and (_ > self.prev.expert_id)) )) )) :
                raise kaitaistruct.ValidationExprError(self.expert_id, self._io, u"/types/expert_entry/seq/1")
            self.byte_offset = self._io.read_u8le()
            _ = self.byte_offset
            if not  ((_ % self._root.page_size == 0) and (_ >= self._root.header.data_offset) and (_ <= self._root._io.size())) :
                raise kaitaistruct.ValidationExprError(self.byte_offset, self._io, u"/types/expert_entry/seq/2")
            self.raw_size = self._io.read_u8le()
            _ = self.raw_size
            if not  ((_ >= 1) and (_ <= self._root._io.size() - self.byte_offset)) :
                raise kaitaistruct.ValidationExprError(self.raw_size, self._io, u"/types/expert_entry/seq/3")
            self.padded_size = self._io.read_u8le()
            _ = self.padded_size
            if not  ((_ == (((self.raw_size + self._root.page_size) - 1) // self._root.page_size) * self._root.page_size) and (_ <= self._root._io.size() - self.byte_offset)) :
                raise kaitaistruct.ValidationExprError(self.padded_size, self._io, u"/types/expert_entry/seq/4")
            self.group_size = self._io.read_u4le()
            if not self.group_size == self._root.header.group_size:
                raise kaitaistruct.ValidationNotEqualError(self._root.header.group_size, self.group_size, self._io, u"/types/expert_entry/seq/5")
            self.num_groups = self._io.read_u8le()
            _ = self.num_groups
            if not _ == (self.tensors[0].num_groups + self.tensors[1].num_groups) + self.tensors[2].num_groups:
                raise kaitaistruct.ValidationExprError(self.num_groups, self._io, u"/types/expert_entry/seq/6")
            self.reserved = self._io.read_bytes(4)
            if not self.reserved == b"\x00\x00\x00\x00":
                raise kaitaistruct.ValidationNotEqualError(b"\x00\x00\x00\x00", self.reserved, self._io, u"/types/expert_entry/seq/7")


        def _fetch_instances(self):
            pass
            _ = self.padding
            if hasattr(self, '_m_padding'):
                pass
                self._m_padding._fetch_instances()

            _ = self.prev
            if hasattr(self, '_m_prev'):
                pass
                self._m_prev._fetch_instances()

            _ = self.tensors
            if hasattr(self, '_m_tensors'):
                pass
                for i in range(len(self._m_tensors)):
                    pass
                    self._m_tensors[i]._fetch_instances()



        @property
        def padding(self):
            """The blob's padding from `raw_size` to `padded_size`; must be zero (ruling D3).
            
            .. seealso::
               docs/FORMAT.md D3
            """
            if hasattr(self, '_m_padding'):
                return self._m_padding

            io = self._root._io
            _pos = io.pos()
            io.seek(self.byte_offset + self.raw_size)
            self._raw__m_padding = io.read_bytes(self.padded_size - self.raw_size)
            _io__raw__m_padding = KaitaiStream(BytesIO(self._raw__m_padding))
            self._m_padding = Smoe.ZeroFill(_io__raw__m_padding, self, self._root)
            io.seek(_pos)
            return getattr(self, '_m_padding', None)

        @property
        def prev(self):
            """The sort key of the previous table entry, for the ordering rule."""
            if hasattr(self, '_m_prev'):
                return self._m_prev

            if self.idx > 0:
                pass
                _pos = self._io.pos()
                self._io.seek(self._root.header.table_offset + (self.idx - 1) * 48)
                self._m_prev = Smoe.ExpertKey(self._io, self, self._root)
                self._io.seek(_pos)

            return getattr(self, '_m_prev', None)

        @property
        def tensors(self):
            """This expert's three descriptors, gate, up and down, in that order."""
            if hasattr(self, '_m_tensors'):
                return self._m_tensors

            _pos = self._io.pos()
            self._io.seek(self._root.header.descriptors_offset + (self.idx * self._root.tensors_per_expert) * 44)
            self._m_tensors = []
            for i in range(self._root.tensors_per_expert):
                self._m_tensors.append(Smoe.TensorDescriptor(i, self.byte_offset, self.raw_size, self._io, self, self._root))

            self._io.seek(_pos)
            return getattr(self, '_m_tensors', None)


    class ExpertKey(KaitaiStruct):
        """The first two fields of an expert table entry, read to check the table's order."""
        def __init__(self, _io, _parent=None, _root=None):
            super(Smoe.ExpertKey, self).__init__(_io)
            self._parent = _parent
            self._root = _root
            self._read()

        def _read(self):
            self.layer_id = self._io.read_u4le()
            self.expert_id = self._io.read_u4le()


        def _fetch_instances(self):
            pass


    class Header(KaitaiStruct):
        """File header, 64 bytes at offset 0. Everything else is located from it, and
        every count and offset in it is bounded by the file size here, so a huge
        `total_experts` or a wild offset fails at open before anything is allocated.
        """
        def __init__(self, _io, _parent=None, _root=None):
            super(Smoe.Header, self).__init__(_io)
            self._parent = _parent
            self._root = _root
            self._read()

        def _read(self):
            self.magic = self._io.read_bytes(8)
            if not self.magic == b"\x53\x4D\x4F\x45\xDE\xEA\x00\x01":
                raise kaitaistruct.ValidationNotEqualError(b"\x53\x4D\x4F\x45\xDE\xEA\x00\x01", self.magic, self._io, u"/types/header/seq/0")
            self.version = self._io.read_u4le()
            if not self.version >= self._root.version_min:
                raise kaitaistruct.ValidationLessThanError(self._root.version_min, self.version, self._io, u"/types/header/seq/1")
            if not self.version <= self._root.version_max:
                raise kaitaistruct.ValidationGreaterThanError(self._root.version_max, self.version, self._io, u"/types/header/seq/1")
            self.num_moe_layers = self._io.read_u4le()
            self.max_experts_per_layer = self._io.read_u4le()
            self.total_experts = self._io.read_u4le()
            _ = self.total_experts
            if not _ <= self.num_moe_layers * self.max_experts_per_layer:
                raise kaitaistruct.ValidationExprError(self.total_experts, self._io, u"/types/header/seq/4")
            self.table_offset = self._io.read_u8le()
            if not self.table_offset == 64:
                raise kaitaistruct.ValidationNotEqualError(64, self.table_offset, self._io, u"/types/header/seq/5")
            self.data_offset = self._io.read_u8le()
            _ = self.data_offset
            if not  ((_ % self._root.page_size == 0) and (_ >= self.descriptors_end) and (_ <= self._io.size())) :
                raise kaitaistruct.ValidationExprError(self.data_offset, self._io, u"/types/header/seq/6")
            self.group_size = self._io.read_u4le()
            if not self.group_size == self._root.quant_group_size:
                raise kaitaistruct.ValidationNotEqualError(self._root.quant_group_size, self.group_size, self._io, u"/types/header/seq/7")
            self.bits = self._io.read_u4le()
            if not  ((self.bits == self._root.bits_q2) or (self.bits == self._root.bits_q4)) :
                raise kaitaistruct.ValidationNotAnyOfError(self.bits, self._io, u"/types/header/seq/8")
            self.d_model = self._io.read_u4le()
            if not self.d_model >= 1:
                raise kaitaistruct.ValidationLessThanError(1, self.d_model, self._io, u"/types/header/seq/9")
            self.vocab_size = self._io.read_u4le()
            self.ffn_dim = self._io.read_u4le()
            self.reserved_ext = self._io.read_u4le()
            _ = self.reserved_ext
            if not  ((self.version < self._root.version_with_arch) or ( ((_ % self._root.arch_align == 0) and (_ >= self.descriptors_end) and (_ + 128 <= self.data_offset)) )) :
                raise kaitaistruct.ValidationExprError(self.reserved_ext, self._io, u"/types/header/seq/12")


        def _fetch_instances(self):
            pass

        @property
        def descriptors_end(self):
            """Absolute offset one past the last tensor descriptor."""
            if hasattr(self, '_m_descriptors_end'):
                return self._m_descriptors_end

            self._m_descriptors_end = self.descriptors_offset + (self.total_experts * self._root.tensors_per_expert) * 44
            return getattr(self, '_m_descriptors_end', None)

        @property
        def descriptors_offset(self):
            """Absolute offset of the first tensor descriptor, right after the table (ruling D4).
            
            .. seealso::
               docs/FORMAT.md D4
            """
            if hasattr(self, '_m_descriptors_offset'):
                return self._m_descriptors_offset

            self._m_descriptors_offset = self.table_offset + self.total_experts * 48
            return getattr(self, '_m_descriptors_offset', None)


    class TensorDescriptor(KaitaiStruct):
        """Where one of an expert's weight matrices lies inside its blob, 44 bytes.
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
        
        .. seealso::
           docs/FORMAT.md D2, D3
        """
        def __init__(self, slot, blob_offset, raw_size, _io, _parent=None, _root=None):
            super(Smoe.TensorDescriptor, self).__init__(_io)
            self._parent = _parent
            self._root = _root
            self.slot = slot
            self.blob_offset = blob_offset
            self.raw_size = raw_size
            self._read()

        def _read(self):
            self.tensor_type = KaitaiStream.resolve_enum(Smoe.TensorType, self._io.read_u1())
            _ = self.tensor_type
            if not int(_) == self.slot:
                raise kaitaistruct.ValidationExprError(self.tensor_type, self._io, u"/types/tensor_descriptor/seq/0")
            self.ndim = self._io.read_u1()
            if not self.ndim == self._root.tensor_ndim:
                raise kaitaistruct.ValidationNotEqualError(self._root.tensor_ndim, self.ndim, self._io, u"/types/tensor_descriptor/seq/1")
            self.reserved_0 = self._io.read_bytes(2)
            if not self.reserved_0 == b"\x00\x00":
                raise kaitaistruct.ValidationNotEqualError(b"\x00\x00", self.reserved_0, self._io, u"/types/tensor_descriptor/seq/2")
            self.rows = self._io.read_u4le()
            if not self.rows >= 1:
                raise kaitaistruct.ValidationLessThanError(1, self.rows, self._io, u"/types/tensor_descriptor/seq/3")
            self.cols = self._io.read_u4le()
            _ = self.cols
            if not  ((_ >= 1) and (_ <= ((self.raw_size * 8) // self._root.header.bits) // self.rows)) :
                raise kaitaistruct.ValidationExprError(self.cols, self._io, u"/types/tensor_descriptor/seq/4")
            self.packed_offset = self._io.read_u8le()
            if not self.packed_offset <= self.raw_size:
                raise kaitaistruct.ValidationGreaterThanError(self.raw_size, self.packed_offset, self._io, u"/types/tensor_descriptor/seq/5")
            self.packed_size = self._io.read_u8le()
            _ = self.packed_size
            if not  ((_ == self.len_packed) and (_ <= self.raw_size - self.packed_offset)) :
                raise kaitaistruct.ValidationExprError(self.packed_size, self._io, u"/types/tensor_descriptor/seq/6")
            self.scales_offset = self._io.read_u8le()
            if not self.scales_offset <= self.raw_size:
                raise kaitaistruct.ValidationGreaterThanError(self.raw_size, self.scales_offset, self._io, u"/types/tensor_descriptor/seq/7")
            self.scales_size = self._io.read_u8le()
            _ = self.scales_size
            if not  ((_ == self.len_scales) and (_ <= self.raw_size - self.scales_offset)) :
                raise kaitaistruct.ValidationExprError(self.scales_size, self._io, u"/types/tensor_descriptor/seq/8")


        def _fetch_instances(self):
            pass
            _ = self.packed
            if hasattr(self, '_m_packed'):
                pass

            _ = self.scales
            if hasattr(self, '_m_scales'):
                pass


        @property
        def len_packed(self):
            """Bytes of packed codes a matrix of this shape takes, `ceil(rows * cols * bits / 8)`."""
            if hasattr(self, '_m_len_packed'):
                return self._m_len_packed

            self._m_len_packed = (self.num_weights * self._root.header.bits + 7) // 8
            return getattr(self, '_m_len_packed', None)

        @property
        def len_scales(self):
            """Bytes of scales a matrix of this shape takes, `ceil(rows * cols / 64) * 2`."""
            if hasattr(self, '_m_len_scales'):
                return self._m_len_scales

            self._m_len_scales = self.num_groups * self._root.scale_bytes
            return getattr(self, '_m_len_scales', None)

        @property
        def num_groups(self):
            """Number of quantisation groups, `ceil(rows * cols / 64)`."""
            if hasattr(self, '_m_num_groups'):
                return self._m_num_groups

            self._m_num_groups = ((self.num_weights + self._root.header.group_size) - 1) // self._root.header.group_size
            return getattr(self, '_m_num_groups', None)

        @property
        def num_weights(self):
            """Number of weights, `rows * cols`."""
            if hasattr(self, '_m_num_weights'):
                return self._m_num_weights

            self._m_num_weights = self.rows * self.cols
            return getattr(self, '_m_num_weights', None)

        @property
        def packed(self):
            """The packed codes."""
            if hasattr(self, '_m_packed'):
                return self._m_packed

            io = self._root._io
            _pos = io.pos()
            io.seek(self.blob_offset + self.packed_offset)
            self._m_packed = io.read_bytes(self.len_packed)
            io.seek(_pos)
            return getattr(self, '_m_packed', None)

        @property
        def scales(self):
            """The float16 scales, little-endian, one per group."""
            if hasattr(self, '_m_scales'):
                return self._m_scales

            io = self._root._io
            _pos = io.pos()
            io.seek(self.blob_offset + self.scales_offset)
            self._m_scales = io.read_bytes(self.len_scales)
            io.seek(_pos)
            return getattr(self, '_m_scales', None)


    class ZeroFill(KaitaiStruct):
        """A run of bytes that must all be zero (reserved fields and blob padding)."""
        def __init__(self, _io, _parent=None, _root=None):
            super(Smoe.ZeroFill, self).__init__(_io)
            self._parent = _parent
            self._root = _root
            self._read()

        def _read(self):
            self.bytes = []
            i = 0
            while not self._io.is_eof():
                self.bytes.append(self._io.read_u1())
                if not self.bytes[i] == 0:
                    raise kaitaistruct.ValidationNotEqualError(0, self.bytes[i], self._io, u"/types/zero_fill/seq/0")
                i += 1



        def _fetch_instances(self):
            pass
            for i in range(len(self.bytes)):
                pass



    @property
    def arch(self):
        """The version-2 arch block ("SARC"), located by `header.reserved_ext`.
        
        .. seealso::
           docs/FORMAT.md D6
        """
        if hasattr(self, '_m_arch'):
            return self._m_arch

        if self.header.version >= self.version_with_arch:
            pass
            _pos = self._io.pos()
            self._io.seek(self.header.reserved_ext)
            self._m_arch = Smoe.ArchBlock(self._io, self, self._root)
            self._io.seek(_pos)

        return getattr(self, '_m_arch', None)

    @property
    def arch_align(self):
        """Alignment of the arch block (`reserved_ext`)."""
        if hasattr(self, '_m_arch_align'):
            return self._m_arch_align

        self._m_arch_align = 64
        return getattr(self, '_m_arch_align', None)

    @property
    def arch_block_version_current(self):
        """The only `arch_block.block_version` defined."""
        if hasattr(self, '_m_arch_block_version_current'):
            return self._m_arch_block_version_current

        self._m_arch_block_version_current = 1
        return getattr(self, '_m_arch_block_version_current', None)

    @property
    def bits_q2(self):
        """Bit depth of SMOE-Q2."""
        if hasattr(self, '_m_bits_q2'):
            return self._m_bits_q2

        self._m_bits_q2 = 2
        return getattr(self, '_m_bits_q2', None)

    @property
    def bits_q4(self):
        """Bit depth of SMOE-Q4."""
        if hasattr(self, '_m_bits_q4'):
            return self._m_bits_q4

        self._m_bits_q4 = 4
        return getattr(self, '_m_bits_q4', None)

    @property
    def experts(self):
        """The expert table: `total_experts` entries of 48 bytes from `table_offset`.
        Ruling D4: sorted by `(layer_id, expert_id)` ascending, pairs unique.
        
        .. seealso::
           docs/FORMAT.md D4
        """
        if hasattr(self, '_m_experts'):
            return self._m_experts

        _pos = self._io.pos()
        self._io.seek(self.header.table_offset)
        self._m_experts = []
        for i in range(self.header.total_experts):
            self._m_experts.append(Smoe.ExpertEntry(i, self._io, self, self._root))

        self._io.seek(_pos)
        return getattr(self, '_m_experts', None)

    @property
    def flag_has_dense_layer_0(self):
        """`arch_block.flags` bit 2: layer 0 has a dense MLP instead of experts."""
        if hasattr(self, '_m_flag_has_dense_layer_0'):
            return self._m_flag_has_dense_layer_0

        self._m_flag_has_dense_layer_0 = 4
        return getattr(self, '_m_flag_has_dense_layer_0', None)

    @property
    def flag_has_qk_norm(self):
        """`arch_block.flags` bit 1: attention applies RMS norm to q and k per head."""
        if hasattr(self, '_m_flag_has_qk_norm'):
            return self._m_flag_has_qk_norm

        self._m_flag_has_qk_norm = 2
        return getattr(self, '_m_flag_has_qk_norm', None)

    @property
    def flag_norm_topk_prob(self):
        """`arch_block.flags` bit 0: renormalise the selected top-k routing weights."""
        if hasattr(self, '_m_flag_norm_topk_prob'):
            return self._m_flag_norm_topk_prob

        self._m_flag_norm_topk_prob = 1
        return getattr(self, '_m_flag_norm_topk_prob', None)

    @property
    def flags_known_mask(self):
        """The flag bits defined so far; bits 3..31 must be zero."""
        if hasattr(self, '_m_flags_known_mask'):
            return self._m_flags_known_mask

        self._m_flags_known_mask = 7
        return getattr(self, '_m_flags_known_mask', None)

    @property
    def max_head_dim(self):
        """Largest `head_dim` the engine accepts."""
        if hasattr(self, '_m_max_head_dim'):
            return self._m_max_head_dim

        self._m_max_head_dim = 256
        return getattr(self, '_m_max_head_dim', None)

    @property
    def max_moe_top_k(self):
        """Largest `moe_top_k` the engine accepts."""
        if hasattr(self, '_m_max_moe_top_k'):
            return self._m_max_moe_top_k

        self._m_max_moe_top_k = 16
        return getattr(self, '_m_max_moe_top_k', None)

    @property
    def model_type_size(self):
        """Byte size of `arch_block.model_type`."""
        if hasattr(self, '_m_model_type_size'):
            return self._m_model_type_size

        self._m_model_type_size = 24
        return getattr(self, '_m_model_type_size', None)

    @property
    def page_size(self):
        """Alignment of `data_offset`, of every blob offset and of every blob's
        padded size: the 16 KiB hardware page.
        """
        if hasattr(self, '_m_page_size'):
            return self._m_page_size

        self._m_page_size = 16384
        return getattr(self, '_m_page_size', None)

    @property
    def quant_group_size(self):
        """Number of consecutive weights sharing one float16 scale."""
        if hasattr(self, '_m_quant_group_size'):
            return self._m_quant_group_size

        self._m_quant_group_size = 64
        return getattr(self, '_m_quant_group_size', None)

    @property
    def reference_rms_norm_eps(self):
        """The RMS-norm epsilon the engine's kernels are compiled with. Ruling D6: an
        `rms_norm_eps` that differs from it by more than 10% is a warning.
        """
        if hasattr(self, '_m_reference_rms_norm_eps'):
            return self._m_reference_rms_norm_eps

        self._m_reference_rms_norm_eps = 0.000001
        return getattr(self, '_m_reference_rms_norm_eps', None)

    @property
    def rms_norm_eps_tolerance(self):
        """Relative difference of `rms_norm_eps` from the reference that warns."""
        if hasattr(self, '_m_rms_norm_eps_tolerance'):
            return self._m_rms_norm_eps_tolerance

        self._m_rms_norm_eps_tolerance = 0.1
        return getattr(self, '_m_rms_norm_eps_tolerance', None)

    @property
    def scale_bytes(self):
        """Size of one scale (IEEE-754 binary16)."""
        if hasattr(self, '_m_scale_bytes'):
            return self._m_scale_bytes

        self._m_scale_bytes = 2
        return getattr(self, '_m_scale_bytes', None)

    @property
    def tensor_ndim(self):
        """Rank of every expert weight matrix."""
        if hasattr(self, '_m_tensor_ndim'):
            return self._m_tensor_ndim

        self._m_tensor_ndim = 2
        return getattr(self, '_m_tensor_ndim', None)

    @property
    def tensors_per_expert(self):
        """Descriptors per expert, one per `tensor_type` (gate, up, down)."""
        if hasattr(self, '_m_tensors_per_expert'):
            return self._m_tensors_per_expert

        self._m_tensors_per_expert = 3
        return getattr(self, '_m_tensors_per_expert', None)

    @property
    def version_max(self):
        """Newest format version readers accept, and the one writers produce by default."""
        if hasattr(self, '_m_version_max'):
            return self._m_version_max

        self._m_version_max = 2
        return getattr(self, '_m_version_max', None)

    @property
    def version_min(self):
        """Oldest format version readers accept."""
        if hasattr(self, '_m_version_min'):
            return self._m_version_min

        self._m_version_min = 1
        return getattr(self, '_m_version_min', None)

    @property
    def version_with_arch(self):
        """First format version that carries an arch block."""
        if hasattr(self, '_m_version_with_arch'):
            return self._m_version_with_arch

        self._m_version_with_arch = 2
        return getattr(self, '_m_version_with_arch', None)


