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
    
    .. seealso::
       docs/FORMAT.md
    
    
    .. seealso::
       docs/TOOLS.md
    
    
    .. seealso::
       docs/KAITAI_TARGETS.md
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
        self.header = Smoe.FileHeader(self._io, self, self._root)


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
        """The vault's birth certificate (v2 only), 128 bytes at `header.ofs_arch`:
        the model constants the engine needs, from the checkpoint's `config.json`.
        Ruling D6: the engine refuses to load unless magic is "SARC",
        `block_version` 1, `len_block` 128, `activation` 0 (SiLU),
        `1 <= moe_top_k <= 16`, `1 <= head_dim <= 256`, `num_heads >= 1`,
        `num_kv_heads >= 1`, `num_heads % num_kv_heads == 0`, flag bits 3..31 and the
        44 reserved bytes zero, `model_type` as ruling R2 says. Warnings, not errors:
        `rms_norm_eps` more than 10% away from 1e-6; values that disagree with the
        tensors of the checkpoint or scout, where shapes win (has_qk_norm,
        has_dense_layer_0, shared_expert_ffn_dim).
        
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
            if not self.block_version == 1:
                raise kaitaistruct.ValidationNotEqualError(1, self.block_version, self._io, u"/types/arch_block/seq/1")
            self.len_block = self._io.read_u4le()
            if not self.len_block == 128:
                raise kaitaistruct.ValidationNotEqualError(128, self.len_block, self._io, u"/types/arch_block/seq/2")
            self.flags = self._io.read_u4le()
            if not self.flags <= 7:
                raise kaitaistruct.ValidationGreaterThanError(7, self.flags, self._io, u"/types/arch_block/seq/3")
            self.rope_theta = self._io.read_f4le()
            self.num_heads = self._io.read_u4le()
            if not self.num_heads >= 1:
                raise kaitaistruct.ValidationLessThanError(1, self.num_heads, self._io, u"/types/arch_block/seq/5")
            self.num_kv_heads = self._io.read_u4le()
            _ = self.num_kv_heads
            if not  ((_ >= 1) and (((self.num_heads // _) * _) == self.num_heads)) :
                raise kaitaistruct.ValidationExprError(self.num_kv_heads, self._io, u"/types/arch_block/seq/6")
            self.head_dim = self._io.read_u4le()
            _ = self.head_dim
            if not  ((_ >= 1) and (_ <= self._root.max_head_dim)) :
                raise kaitaistruct.ValidationExprError(self.head_dim, self._io, u"/types/arch_block/seq/7")
            self.moe_top_k = self._io.read_u4le()
            if not self.moe_top_k >= 1:
                raise kaitaistruct.ValidationLessThanError(1, self.moe_top_k, self._io, u"/types/arch_block/seq/8")
            if not self.moe_top_k <= 16:
                raise kaitaistruct.ValidationGreaterThanError(16, self.moe_top_k, self._io, u"/types/arch_block/seq/8")
            self.moe_ffn_dim = self._io.read_u4le()
            self.dense_ffn_dim = self._io.read_u4le()
            self.shared_expert_ffn_dim = self._io.read_u4le()
            self.activation = KaitaiStream.resolve_enum(Smoe.Activation, self._io.read_u4le())
            if not self.activation == Smoe.Activation.silu:
                raise kaitaistruct.ValidationNotEqualError(Smoe.Activation.silu, self.activation, self._io, u"/types/arch_block/seq/12")
            self.num_hidden_layers = self._io.read_u4le()
            _ = self.num_hidden_layers
            if not _ >= self._root.header.num_moe_layers:
                raise kaitaistruct.ValidationExprError(self.num_hidden_layers, self._io, u"/types/arch_block/seq/13")
            self.rms_norm_eps = self._io.read_f4le()
            self._raw_model_type = self._io.read_bytes(24)
            _io__raw_model_type = KaitaiStream(BytesIO(self._raw_model_type))
            self.model_type = Smoe.NulPaddedUtf8(_io__raw_model_type, self, self._root)
            self._raw_reserved = self._io.read_bytes(44)
            _io__raw_reserved = KaitaiStream(BytesIO(self._raw_reserved))
            self.reserved = Smoe.ZeroFill(_io__raw_reserved, self, self._root)


        def _fetch_instances(self):
            pass
            self.model_type._fetch_instances()
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
            """The router divides the selected top-k routing weights by their sum (R6)."""
            if hasattr(self, '_m_norm_topk_prob'):
                return self._m_norm_topk_prob

            self._m_norm_topk_prob = self.flags & self._root.flag_norm_topk_prob != 0
            return getattr(self, '_m_norm_topk_prob', None)


    class DescriptorShape(KaitaiStruct):
        """The first 12 bytes of a tensor descriptor, read to check the shape rules."""
        def __init__(self, _io, _parent=None, _root=None):
            super(Smoe.DescriptorShape, self).__init__(_io)
            self._parent = _parent
            self._root = _root
            self._read()

        def _read(self):
            self.tensor_type = self._io.read_u1()
            self.num_dims = self._io.read_u1()
            self.reserved_0 = self._io.read_bytes(2)
            self.num_rows = self._io.read_u4le()
            self.num_cols = self._io.read_u4le()


        def _fetch_instances(self):
            pass


    class ExpertEntry(KaitaiStruct):
        """One row of the expert table, 48 bytes. Ruling D4: the table is sorted by
        `(layer_id, expert_id)` ascending with unique pairs; writers place blobs in
        table order, back to back from `ofs_data`; readers only require 16 KiB
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
            if not  ((_ < self._root.header.max_experts_per_layer) and ( (((not (self.has_prev))) or (self.layer_id > self.prev.layer_id) or ( ((self.layer_id == self.prev.layer_id) and (_ > self.prev.expert_id)) )) )) :
                raise kaitaistruct.ValidationExprError(self.expert_id, self._io, u"/types/expert_entry/seq/1")
            self.ofs_blob = self._io.read_u8le()
            _ = self.ofs_blob
            if not  ((_ & (self._root.len_page - 1) == 0) and (_ >= self._root.header.ofs_data) and (_ <= self._root._io.size())) :
                raise kaitaistruct.ValidationExprError(self.ofs_blob, self._io, u"/types/expert_entry/seq/2")
            self.len_raw = self._io.read_u8le()
            _ = self.len_raw
            if not  ((_ >= 1) and (_ <= (self._root._io.size() - self.ofs_blob))) :
                raise kaitaistruct.ValidationExprError(self.len_raw, self._io, u"/types/expert_entry/seq/3")
            self.len_padded = self._io.read_u8le()
            _ = self.len_padded
            if not  ((_ == self.len_padded_expected) and (_ <= (self._root._io.size() - self.ofs_blob))) :
                raise kaitaistruct.ValidationExprError(self.len_padded, self._io, u"/types/expert_entry/seq/4")
            self.group_size = self._io.read_u4le()
            if not self.group_size == self._root.header.group_size:
                raise kaitaistruct.ValidationNotEqualError(self._root.header.group_size, self.group_size, self._io, u"/types/expert_entry/seq/5")
            self.num_groups = self._io.read_u8le()
            _ = self.num_groups
            if not _ == (self.tensors[0].num_groups + (self.tensors[1].num_groups + self.tensors[2].num_groups)):
                raise kaitaistruct.ValidationExprError(self.num_groups, self._io, u"/types/expert_entry/seq/6")
            self.reserved = self._io.read_bytes(4)
            if not self.reserved == b"\x00\x00\x00\x00":
                raise kaitaistruct.ValidationNotEqualError(b"\x00\x00\x00\x00", self.reserved, self._io, u"/types/expert_entry/seq/7")


        def _fetch_instances(self):
            pass
            _ = self.gate_shape
            if hasattr(self, '_m_gate_shape'):
                pass
                self._m_gate_shape._fetch_instances()

            _ = self.padding
            if hasattr(self, '_m_padding'):
                pass
                self._m_padding._fetch_instances()

            _ = self.prev
            if hasattr(self, '_m_prev'):
                pass
                self._m_prev._fetch_instances()

            _ = self.prev_gate_shape
            if hasattr(self, '_m_prev_gate_shape'):
                pass
                self._m_prev_gate_shape._fetch_instances()

            _ = self.tensors
            if hasattr(self, '_m_tensors'):
                pass
                for i in range(len(self._m_tensors)):
                    pass
                    self._m_tensors[i]._fetch_instances()



        @property
        def gate_shape(self):
            """The shape of this expert's gate descriptor, for the shape rules of up and down."""
            if hasattr(self, '_m_gate_shape'):
                return self._m_gate_shape

            _pos = self._io.pos()
            self._io.seek(self.ofs_descriptors)
            self._m_gate_shape = Smoe.DescriptorShape(self._io, self, self._root)
            self._io.seek(_pos)
            return getattr(self, '_m_gate_shape', None)

        @property
        def has_prev(self):
            """Whether a table entry precedes this one."""
            if hasattr(self, '_m_has_prev'):
                return self._m_has_prev

            self._m_has_prev = self.idx > 0
            return getattr(self, '_m_has_prev', None)

        @property
        def len_padded_expected(self):
            """`len_raw` rounded up to a multiple of 16384."""
            if hasattr(self, '_m_len_padded_expected'):
                return self._m_len_padded_expected

            self._m_len_padded_expected = (((self.len_raw + (self._root.len_page - 1)) // self._root.len_page) * self._root.len_page)
            return getattr(self, '_m_len_padded_expected', None)

        @property
        def ofs_descriptors(self):
            """Absolute offset of this expert's three descriptors."""
            if hasattr(self, '_m_ofs_descriptors'):
                return self._m_ofs_descriptors

            self._m_ofs_descriptors = (self._root.header.ofs_descriptors + (self.idx * (self._root.num_tensors_per_expert * 44)))
            return getattr(self, '_m_ofs_descriptors', None)

        @property
        def padding(self):
            """The blob's padding from `len_raw` to `len_padded`; must be zero (ruling D3).
            
            .. seealso::
               docs/FORMAT.md D3
            """
            if hasattr(self, '_m_padding'):
                return self._m_padding

            io = self._root._io
            _pos = io.pos()
            io.seek((self.ofs_blob + self.len_raw))
            self._raw__m_padding = io.read_bytes((self.len_padded - self.len_raw))
            _io__raw__m_padding = KaitaiStream(BytesIO(self._raw__m_padding))
            self._m_padding = Smoe.ZeroFill(_io__raw__m_padding, self, self._root)
            io.seek(_pos)
            return getattr(self, '_m_padding', None)

        @property
        def prev(self):
            """The sort key of the previous table entry, for the ordering rule."""
            if hasattr(self, '_m_prev'):
                return self._m_prev

            if self.has_prev:
                pass
                _pos = self._io.pos()
                self._io.seek((self._root.header.ofs_table + ((self.idx - 1) * 48)))
                self._m_prev = Smoe.ExpertKey(self._io, self, self._root)
                self._io.seek(_pos)

            return getattr(self, '_m_prev', None)

        @property
        def prev_gate_shape(self):
            """The shape of the previous table entry's gate descriptor, for the layer shape rule."""
            if hasattr(self, '_m_prev_gate_shape'):
                return self._m_prev_gate_shape

            if self.has_prev:
                pass
                _pos = self._io.pos()
                self._io.seek((self.ofs_descriptors - (self._root.num_tensors_per_expert * 44)))
                self._m_prev_gate_shape = Smoe.DescriptorShape(self._io, self, self._root)
                self._io.seek(_pos)

            return getattr(self, '_m_prev_gate_shape', None)

        @property
        def tensors(self):
            """This expert's three descriptors, gate, up and down, in that order."""
            if hasattr(self, '_m_tensors'):
                return self._m_tensors

            _pos = self._io.pos()
            self._io.seek(self.ofs_descriptors)
            self._m_tensors = []
            for i in range(self._root.num_tensors_per_expert):
                self._m_tensors.append(Smoe.TensorDescriptor(i, self.ofs_blob, self.len_raw, self._io, self, self._root))

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


    class FileHeader(KaitaiStruct):
        """File header, 64 bytes at offset 0. Everything else is located from it, and
        every count and offset in it is bounded by the file size here, so a huge
        `num_experts` or a wild offset fails at open before anything is allocated.
        """
        def __init__(self, _io, _parent=None, _root=None):
            super(Smoe.FileHeader, self).__init__(_io)
            self._parent = _parent
            self._root = _root
            self._read()

        def _read(self):
            self.magic = self._io.read_bytes(8)
            if not self.magic == b"\x53\x4D\x4F\x45\xDE\xEA\x00\x01":
                raise kaitaistruct.ValidationNotEqualError(b"\x53\x4D\x4F\x45\xDE\xEA\x00\x01", self.magic, self._io, u"/types/file_header/seq/0")
            self.version = self._io.read_u4le()
            if not self.version >= 1:
                raise kaitaistruct.ValidationLessThanError(1, self.version, self._io, u"/types/file_header/seq/1")
            if not self.version <= 2:
                raise kaitaistruct.ValidationGreaterThanError(2, self.version, self._io, u"/types/file_header/seq/1")
            self.num_moe_layers = self._io.read_u4le()
            self.max_experts_per_layer = self._io.read_u4le()
            self.num_experts = self._io.read_u4le()
            _ = self.num_experts
            if not  ((_ == 0) or ( ((self.max_experts_per_layer != 0) and (((_ - 1) // self.max_experts_per_layer) < self.num_moe_layers)) )) :
                raise kaitaistruct.ValidationExprError(self.num_experts, self._io, u"/types/file_header/seq/4")
            self.ofs_table = self._io.read_u8le()
            if not self.ofs_table == 64:
                raise kaitaistruct.ValidationNotEqualError(64, self.ofs_table, self._io, u"/types/file_header/seq/5")
            self.ofs_data = self._io.read_u8le()
            _ = self.ofs_data
            if not  ((_ & (self._root.len_page - 1) == 0) and (_ >= self.ofs_descriptors_end) and (_ <= self._io.size())) :
                raise kaitaistruct.ValidationExprError(self.ofs_data, self._io, u"/types/file_header/seq/6")
            self.group_size = self._io.read_u4le()
            if not self.group_size == 64:
                raise kaitaistruct.ValidationNotEqualError(64, self.group_size, self._io, u"/types/file_header/seq/7")
            self.bits = self._io.read_u4le()
            if not  ((self.bits == 2) or (self.bits == 4)) :
                raise kaitaistruct.ValidationNotAnyOfError(self.bits, self._io, u"/types/file_header/seq/8")
            self.d_model = self._io.read_u4le()
            if not self.d_model >= 1:
                raise kaitaistruct.ValidationLessThanError(1, self.d_model, self._io, u"/types/file_header/seq/9")
            self.vocab_size = self._io.read_u4le()
            self.ffn_dim = self._io.read_u4le()
            self.ofs_arch = self._io.read_u4le()
            _ = self.ofs_arch
            if not  (((not (self.has_arch))) or ( ((_ & (self._root.arch_align - 1) == 0) and (_ >= self.ofs_descriptors_end) and ((_ + 128) <= self.ofs_data)) )) :
                raise kaitaistruct.ValidationExprError(self.ofs_arch, self._io, u"/types/file_header/seq/12")


        def _fetch_instances(self):
            pass

        @property
        def has_arch(self):
            """Whether the vault carries an arch block (version 2 and later)."""
            if hasattr(self, '_m_has_arch'):
                return self._m_has_arch

            self._m_has_arch = self.version >= 2
            return getattr(self, '_m_has_arch', None)

        @property
        def ofs_descriptors(self):
            """Absolute offset of the first tensor descriptor, right after the table (ruling D4).
            
            .. seealso::
               docs/FORMAT.md D4
            """
            if hasattr(self, '_m_ofs_descriptors'):
                return self._m_ofs_descriptors

            self._m_ofs_descriptors = (self.ofs_table + (self.num_experts * 48))
            return getattr(self, '_m_ofs_descriptors', None)

        @property
        def ofs_descriptors_end(self):
            """Absolute offset one past the last tensor descriptor."""
            if hasattr(self, '_m_ofs_descriptors_end'):
                return self._m_ofs_descriptors_end

            self._m_ofs_descriptors_end = (self.ofs_descriptors + (self.num_experts * (self._root.num_tensors_per_expert * 44)))
            return getattr(self, '_m_ofs_descriptors_end', None)


    class NulPaddedUtf8(KaitaiStruct):
        """A NUL-padded UTF-8 name (ruling R2): well-formed UTF-8 characters up to the
        first NUL or the end, then only NULs.
        """
        def __init__(self, _io, _parent=None, _root=None):
            super(Smoe.NulPaddedUtf8, self).__init__(_io)
            self._parent = _parent
            self._root = _root
            self._read()

        def _read(self):
            self.chars = []
            i = 0
            while True:
                _ = Smoe.Utf8Char(self._io, self, self._root)
                self.chars.append(_)
                if  ((_.b0 == 0) or (self._io.is_eof())) :
                    break
                i += 1
            self._raw_padding = self._io.read_bytes_full()
            _io__raw_padding = KaitaiStream(BytesIO(self._raw_padding))
            self.padding = Smoe.ZeroFill(_io__raw_padding, self, self._root)


        def _fetch_instances(self):
            pass
            for i in range(len(self.chars)):
                pass
                self.chars[i]._fetch_instances()

            self.padding._fetch_instances()
            _ = self.text
            if hasattr(self, '_m_text'):
                pass


        @property
        def text(self):
            """The name, decoded (valid UTF-8 once `chars` has been read)."""
            if hasattr(self, '_m_text'):
                return self._m_text

            _pos = self._io.pos()
            self._io.seek(0)
            self._m_text = (KaitaiStream.bytes_terminate(self._io.read_bytes_full(), 0, False)).decode(u"UTF-8")
            self._io.seek(_pos)
            return getattr(self, '_m_text', None)


    class TensorDescriptor(KaitaiStruct):
        """Where one of an expert's weight matrices lies inside its blob, 44 bytes.
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
        
        .. seealso::
           docs/FORMAT.md D2, D3
        """
        def __init__(self, slot, ofs_blob, len_raw, _io, _parent=None, _root=None):
            super(Smoe.TensorDescriptor, self).__init__(_io)
            self._parent = _parent
            self._root = _root
            self.slot = slot
            self.ofs_blob = ofs_blob
            self.len_raw = len_raw
            self._read()

        def _read(self):
            self.tensor_type = KaitaiStream.resolve_enum(Smoe.TensorType, self._io.read_u1())
            if not self.tensor_type == (Smoe.TensorType.gate_proj if self.is_gate else (Smoe.TensorType.up_proj if self.is_up else Smoe.TensorType.down_proj)):
                raise kaitaistruct.ValidationNotEqualError((Smoe.TensorType.gate_proj if self.is_gate else (Smoe.TensorType.up_proj if self.is_up else Smoe.TensorType.down_proj)), self.tensor_type, self._io, u"/types/tensor_descriptor/seq/0")
            self.num_dims = self._io.read_u1()
            if not self.num_dims == 2:
                raise kaitaistruct.ValidationNotEqualError(2, self.num_dims, self._io, u"/types/tensor_descriptor/seq/1")
            self.reserved_0 = self._io.read_bytes(2)
            if not self.reserved_0 == b"\x00\x00":
                raise kaitaistruct.ValidationNotEqualError(b"\x00\x00", self.reserved_0, self._io, u"/types/tensor_descriptor/seq/2")
            self.num_rows = self._io.read_u4le()
            _ = self.num_rows
            if not  ((_ >= 1) and ( (((not (self.is_gate))) or ((not (self._parent.has_prev))) or (self._parent.layer_id != self._parent.prev.layer_id) or (_ == self._parent.prev_gate_shape.num_rows)) ) and ( ((self.is_gate) or (_ == (self._parent.gate_shape.num_rows if self.is_up else self._parent.gate_shape.num_cols))) )) :
                raise kaitaistruct.ValidationExprError(self.num_rows, self._io, u"/types/tensor_descriptor/seq/3")
            self.num_cols = self._io.read_u4le()
            _ = self.num_cols
            if not  ((_ >= 1) and (_ <= (self.len_max_weights // self.num_rows)) and (_ == (self._root.header.d_model if self.is_gate else (self._parent.gate_shape.num_cols if self.is_up else self._parent.gate_shape.num_rows)))) :
                raise kaitaistruct.ValidationExprError(self.num_cols, self._io, u"/types/tensor_descriptor/seq/4")
            self.ofs_packed = self._io.read_u8le()
            _ = self.ofs_packed
            if not  ((_ >= 0) and (_ <= self.len_raw)) :
                raise kaitaistruct.ValidationExprError(self.ofs_packed, self._io, u"/types/tensor_descriptor/seq/5")
            self.len_packed = self._io.read_u8le()
            _ = self.len_packed
            if not  ((_ == self.len_packed_expected) and (_ <= (self.len_raw - self.ofs_packed))) :
                raise kaitaistruct.ValidationExprError(self.len_packed, self._io, u"/types/tensor_descriptor/seq/6")
            self.ofs_scales = self._io.read_u8le()
            _ = self.ofs_scales
            if not  ((_ >= 0) and (_ <= self.len_raw)) :
                raise kaitaistruct.ValidationExprError(self.ofs_scales, self._io, u"/types/tensor_descriptor/seq/7")
            self.len_scales = self._io.read_u8le()
            _ = self.len_scales
            if not  ((_ == self.len_scales_expected) and (_ <= (self.len_raw - self.ofs_scales))) :
                raise kaitaistruct.ValidationExprError(self.len_scales, self._io, u"/types/tensor_descriptor/seq/8")


        def _fetch_instances(self):
            pass
            _ = self.packed
            if hasattr(self, '_m_packed'):
                pass

            _ = self.scales
            if hasattr(self, '_m_scales'):
                pass


        @property
        def is_gate(self):
            """Whether this is the gate descriptor (slot 0)."""
            if hasattr(self, '_m_is_gate'):
                return self._m_is_gate

            self._m_is_gate = self.slot == 0
            return getattr(self, '_m_is_gate', None)

        @property
        def is_up(self):
            """Whether this is the up descriptor (slot 1)."""
            if hasattr(self, '_m_is_up'):
                return self._m_is_up

            self._m_is_up = self.slot == 1
            return getattr(self, '_m_is_up', None)

        @property
        def len_max_weights(self):
            """The most weights whose codes fit in `len_raw` bytes."""
            if hasattr(self, '_m_len_max_weights'):
                return self._m_len_max_weights

            self._m_len_max_weights = ((self.len_raw * 8) // self._root.header.bits)
            return getattr(self, '_m_len_max_weights', None)

        @property
        def len_packed_expected(self):
            """Bytes of packed codes a matrix of this shape takes, `ceil(num_rows * num_cols * bits / 8)`."""
            if hasattr(self, '_m_len_packed_expected'):
                return self._m_len_packed_expected

            self._m_len_packed_expected = (((self.num_weights * self._root.header.bits) + 7) // 8)
            return getattr(self, '_m_len_packed_expected', None)

        @property
        def len_scales_expected(self):
            """Bytes of scales a matrix of this shape takes, `ceil(num_rows * num_cols / 64) * 2`."""
            if hasattr(self, '_m_len_scales_expected'):
                return self._m_len_scales_expected

            self._m_len_scales_expected = (self.num_groups * self._root.len_scale)
            return getattr(self, '_m_len_scales_expected', None)

        @property
        def num_groups(self):
            """Number of quantisation groups, `ceil(num_rows * num_cols / 64)`."""
            if hasattr(self, '_m_num_groups'):
                return self._m_num_groups

            self._m_num_groups = ((self.num_weights + (self._root.header.group_size - 1)) // self._root.header.group_size)
            return getattr(self, '_m_num_groups', None)

        @property
        def num_weights(self):
            """Number of weights, `num_rows * num_cols`."""
            if hasattr(self, '_m_num_weights'):
                return self._m_num_weights

            self._m_num_weights = (self.num_rows * self.num_cols)
            return getattr(self, '_m_num_weights', None)

        @property
        def packed(self):
            """The packed codes."""
            if hasattr(self, '_m_packed'):
                return self._m_packed

            io = self._root._io
            _pos = io.pos()
            io.seek((self.ofs_blob + self.ofs_packed))
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
            io.seek((self.ofs_blob + self.ofs_scales))
            self._m_scales = io.read_bytes(self.len_scales)
            io.seek(_pos)
            return getattr(self, '_m_scales', None)


    class Utf8Char(KaitaiStruct):
        """One well-formed UTF-8 character (RFC 3629): no overlong forms, no
        surrogates, nothing above U+10FFFF.
        """
        def __init__(self, _io, _parent=None, _root=None):
            super(Smoe.Utf8Char, self).__init__(_io)
            self._parent = _parent
            self._root = _root
            self._read()

        def _read(self):
            self.b0 = self._io.read_u1()
            _ = self.b0
            if not  ((_ < 128) or ( ((_ >= 194) and (_ <= 244) and ((self._io.size() - self._io.pos()) >= (3 if _ >= 240 else (2 if _ >= 224 else 1)))) )) :
                raise kaitaistruct.ValidationExprError(self.b0, self._io, u"/types/utf8_char/seq/0")
            if self.b0 >= 128:
                pass
                self.b1 = self._io.read_u1()
                if not self.b1 >= (160 if self.b0 == 224 else (144 if self.b0 == 240 else 128)):
                    raise kaitaistruct.ValidationLessThanError((160 if self.b0 == 224 else (144 if self.b0 == 240 else 128)), self.b1, self._io, u"/types/utf8_char/seq/1")
                if not self.b1 <= (159 if self.b0 == 237 else (143 if self.b0 == 244 else 191)):
                    raise kaitaistruct.ValidationGreaterThanError((159 if self.b0 == 237 else (143 if self.b0 == 244 else 191)), self.b1, self._io, u"/types/utf8_char/seq/1")

            if self.b0 >= 224:
                pass
                self.b2 = self._io.read_u1()
                if not self.b2 >= 128:
                    raise kaitaistruct.ValidationLessThanError(128, self.b2, self._io, u"/types/utf8_char/seq/2")
                if not self.b2 <= 191:
                    raise kaitaistruct.ValidationGreaterThanError(191, self.b2, self._io, u"/types/utf8_char/seq/2")

            if self.b0 >= 240:
                pass
                self.b3 = self._io.read_u1()
                if not self.b3 >= 128:
                    raise kaitaistruct.ValidationLessThanError(128, self.b3, self._io, u"/types/utf8_char/seq/3")
                if not self.b3 <= 191:
                    raise kaitaistruct.ValidationGreaterThanError(191, self.b3, self._io, u"/types/utf8_char/seq/3")



        def _fetch_instances(self):
            pass
            if self.b0 >= 128:
                pass

            if self.b0 >= 224:
                pass

            if self.b0 >= 240:
                pass



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
        """The version-2 arch block ("SARC"), located by `header.ofs_arch`.
        
        .. seealso::
           docs/FORMAT.md D6
        """
        if hasattr(self, '_m_arch'):
            return self._m_arch

        if self.header.has_arch:
            pass
            _pos = self._io.pos()
            self._io.seek(self.header.ofs_arch)
            self._m_arch = Smoe.ArchBlock(self._io, self, self._root)
            self._io.seek(_pos)

        return getattr(self, '_m_arch', None)

    @property
    def arch_align(self):
        """Alignment of the arch block (`ofs_arch`)."""
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
        """The expert table: `num_experts` entries of 48 bytes from `ofs_table`.
        Ruling D4: sorted by `(layer_id, expert_id)` ascending, pairs unique.
        
        .. seealso::
           docs/FORMAT.md D4
        """
        if hasattr(self, '_m_experts'):
            return self._m_experts

        _pos = self._io.pos()
        self._io.seek(self.header.ofs_table)
        self._m_experts = []
        for i in range(self.header.num_experts):
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
        """`arch_block.flags` bit 0: the router divides the selected top-k weights by their sum (R6)."""
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
    def len_model_type(self):
        """Byte size of `arch_block.model_type`."""
        if hasattr(self, '_m_len_model_type'):
            return self._m_len_model_type

        self._m_len_model_type = 24
        return getattr(self, '_m_len_model_type', None)

    @property
    def len_page(self):
        """Alignment of `ofs_data`, of every blob offset and of every blob's
        padded size: the 16 KiB hardware page.
        """
        if hasattr(self, '_m_len_page'):
            return self._m_len_page

        self._m_len_page = 16384
        return getattr(self, '_m_len_page', None)

    @property
    def len_scale(self):
        """Size of one scale (IEEE-754 binary16)."""
        if hasattr(self, '_m_len_scale'):
            return self._m_len_scale

        self._m_len_scale = 2
        return getattr(self, '_m_len_scale', None)

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
    def num_tensor_dims(self):
        """Rank of every expert weight matrix."""
        if hasattr(self, '_m_num_tensor_dims'):
            return self._m_num_tensor_dims

        self._m_num_tensor_dims = 2
        return getattr(self, '_m_num_tensor_dims', None)

    @property
    def num_tensors_per_expert(self):
        """Descriptors per expert, one per `tensor_type` (gate, up, down)."""
        if hasattr(self, '_m_num_tensors_per_expert'):
            return self._m_num_tensors_per_expert

        self._m_num_tensors_per_expert = 3
        return getattr(self, '_m_num_tensors_per_expert', None)

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


