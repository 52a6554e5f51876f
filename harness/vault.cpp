#include "vault.hpp"

#include "fp16.hpp"
#include "io.hpp"
#include "json.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <numeric>
#include <sys/stat.h>
#include <unistd.h>

namespace smoe::harness {

// The on-disk structs are little-endian and read by memcpy.
static_assert(std::endian::native == std::endian::little, "a little-endian host is assumed");

namespace {

using ull = unsigned long long;  // for printf

/// Where a broken rule sits: the absolute offset, and the field path, which is
/// "<scope>.<name>" for the header and arch block, "experts[i].<name>" or
/// "experts[i].tensors[t].<name>" inside the table.
struct Where {
    uint64_t offset;
    const char* scope;  // "header", "arch", or nullptr for a table entry
    uint64_t expert;
    int tensor;  // -1: the entry itself
    const char* name;
    Where plus(uint64_t delta) const { return {offset + delta, scope, expert, tensor, name}; }
};

std::string path(const Where& w) {
    char buf[96];
    if (w.scope != nullptr)
        std::snprintf(buf, sizeof buf, "%s.%s", w.scope, w.name);
    else if (w.tensor < 0)
        std::snprintf(buf, sizeof buf, "experts[%llu].%s", ull(w.expert), w.name);
    else
        std::snprintf(buf, sizeof buf, "experts[%llu].tensors[%d].%s", ull(w.expert), w.tensor,
                      w.name);
    return buf;
}

[[noreturn]] [[gnu::format(printf, 3, 4)]] void fail(const char* code, const Where& w,
                                                     const char* fmt, ...) {
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    throw InvalidVault(Issue{code, path(w), w.offset, msg});
}

// Field locations, from the generated structs' offsetof (never hand-written).
#define HDR_AT(f) Where{offsetof(SmoeHeader, f), "header", 0, -1, #f}
#define ARCH_AT(f) Where{header.reserved_ext + offsetof(SmoeArchBlock, f), "arch", 0, -1, #f}
#define ENTRY_AT(i, f) \
    Where{TABLE_OFFSET + (i) * EXPERT_ENTRY_SIZE + offsetof(ExpertEntry, f), nullptr, (i), -1, #f}
#define DESC_AT(i, t, f) \
    Where{descriptor_offset(n, i, t) + offsetof(TensorDescriptor, f), nullptr, (i), int(t), #f}

/// Index of the first non-zero byte of p[0..len), or len.
size_t first_nonzero(const uint8_t* p, size_t len) {
    for (size_t k = 0; k < len; ++k)
        if (p[k] != 0) return k;
    return len;
}

/// Strict UTF-8 (no overlong forms, no surrogates, at most U+10FFFF).
bool valid_utf8(const uint8_t* p, size_t len) {
    for (size_t k = 0, n; k < len; k += n)
        if ((n = utf8_sequence(p + k, len - k)) == 0) return false;
    return true;
}

const char* const TENSOR_NAMES[TENSORS_PER_EXPERT] = {"gate_proj", "up_proj", "down_proj"};

}  // namespace

Vault::~Vault() {
    if (fd >= 0) ::close(fd);
}

void Vault::open(const std::string& path) {
    Input in = open_input(path);
    open_fd(in.fd.release(), path);
}

void Vault::open_fd(int f, const std::string& path) {
    fd = f;
    name = path;
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw IoError(name + ": cannot stat: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw IoError(name + ": not a regular file");
    id = FileId{st.st_dev, st.st_ino};
    size = static_cast<uint64_t>(st.st_size);
    if (size < HEADER_SIZE)
        throw IoError(name + ": " + std::to_string(size) + " bytes, shorter than the " +
                      std::to_string(HEADER_SIZE) + "-byte header");
    pread_full(fd, &header, sizeof header, 0, name);
    check_header();
    if (header.version >= VERSION_WITH_ARCH) check_arch();
    check_table();
    check_overlap();
}

// ---- header ---------------------------------------------------------------------------
// Everything is bounded here before anything else is read or allocated: the table and
// descriptors end at or before data_offset, which is inside the file, and the arch
// block lies in the gap between them.
void Vault::check_header() {
    const SmoeHeader& h = header;
    if (!has_magic(h)) fail("header.magic", HDR_AT(magic), "magic is not 53 4D 4F 45 DE EA 00 01");
    if (h.version < VERSION_MIN || h.version > VERSION_MAX)
        fail("header.version", HDR_AT(version),
             "version %u is not supported (readers accept %u..%u)", h.version, VERSION_MIN,
             VERSION_MAX);
    const uint64_t model_experts = uint64_t{h.num_moe_layers} * h.max_experts_per_layer;
    if (h.total_experts > model_experts)
        fail("header.total_experts", HDR_AT(total_experts),
             "total_experts %u exceeds num_moe_layers * max_experts_per_layer = %llu",
             h.total_experts, ull(model_experts));
    if (h.table_offset != TABLE_OFFSET)
        fail("header.table_offset", HDR_AT(table_offset), "table_offset %llu is not %llu",
             ull(h.table_offset), ull(TABLE_OFFSET));
    if (h.data_offset % PAGE_SIZE != 0)
        fail("header.data_offset_align", HDR_AT(data_offset),
             "data_offset %llu is not a multiple of %u", ull(h.data_offset), PAGE_SIZE);
    const uint64_t desc_end = descriptors_end(h.total_experts);  // < 2^40: no overflow
    if (desc_end > h.data_offset)
        fail("header.table_bounds", HDR_AT(total_experts),
             "the table and descriptors of %u experts end at %llu, after data_offset %llu",
             h.total_experts, ull(desc_end), ull(h.data_offset));
    if (h.data_offset > size)
        fail("header.data_offset_bounds", HDR_AT(data_offset),
             "data_offset %llu is beyond the end of the file (%llu bytes)", ull(h.data_offset),
             ull(size));
    if (h.group_size != GROUP_SIZE)
        fail("header.group_size", HDR_AT(group_size), "group_size %u is not %u", h.group_size,
             GROUP_SIZE);
    if (h.bits != BITS_Q2 && h.bits != BITS_Q4)
        fail("header.bits", HDR_AT(bits), "bits %u is not %u or %u", h.bits, BITS_Q2, BITS_Q4);
    if (h.d_model < 1) fail("header.d_model", HDR_AT(d_model), "d_model is 0");
    if (h.version >= VERSION_WITH_ARCH) {
        const uint64_t ext = h.reserved_ext;
        if (ext % ARCH_ALIGN != 0 || ext < desc_end || ext + ARCH_BLOCK_SIZE > h.data_offset)
            fail("arch.placement", HDR_AT(reserved_ext),
                 "arch block at %llu must be a multiple of %u, at or after the end of the "
                 "descriptors (%llu) and end at or before data_offset (%llu)",
                 ull(ext), ARCH_ALIGN, ull(desc_end), ull(h.data_offset));
    } else if (h.reserved_ext != 0) {
        warnings.push_back("header.reserved_ext: " + std::to_string(h.reserved_ext) +
                           " in a version 1 vault is ignored (D6)");
    }
}

// ---- arch block (v2): the engine's load rules, ruling D6 -------------------------------
void Vault::check_arch() {
    SmoeArchBlock a{};
    pread_full(fd, &a, sizeof a, header.reserved_ext, name);
    if (!has_arch_magic(a)) fail("arch.magic", ARCH_AT(magic), "arch block magic is not \"SARC\"");
    if (a.block_version != ARCH_BLOCK_VERSION)
        fail("arch.block_version", ARCH_AT(block_version), "block_version %u is not %u",
             a.block_version, ARCH_BLOCK_VERSION);
    if (a.block_size != ARCH_BLOCK_SIZE)
        fail("arch.block_size", ARCH_AT(block_size), "block_size %u is not %u", a.block_size,
             ARCH_BLOCK_SIZE);
    if ((a.flags & ~FLAGS_KNOWN_MASK) != 0)
        fail("arch.flags", ARCH_AT(flags), "flags 0x%x has bits beyond 0x%x set", a.flags,
             FLAGS_KNOWN_MASK);
    if (a.num_heads < 1) fail("arch.num_heads", ARCH_AT(num_heads), "num_heads is 0");
    if (a.num_kv_heads < 1 || a.num_heads % a.num_kv_heads != 0)
        fail("arch.num_kv_heads", ARCH_AT(num_kv_heads),
             "num_kv_heads %u does not divide num_heads %u", a.num_kv_heads, a.num_heads);
    if (a.head_dim < 1 || a.head_dim > MAX_HEAD_DIM)
        fail("arch.head_dim", ARCH_AT(head_dim), "head_dim %u is outside 1..%u", a.head_dim,
             MAX_HEAD_DIM);
    if (a.moe_top_k < 1 || a.moe_top_k > MAX_MOE_TOP_K)
        fail("arch.moe_top_k", ARCH_AT(moe_top_k), "moe_top_k %u is outside 1..%u", a.moe_top_k,
             MAX_MOE_TOP_K);
    if (a.activation != static_cast<uint32_t>(Activation::silu))
        fail("arch.activation", ARCH_AT(activation),
             "activation %u is not 0 (SiLU), the only one the kernels implement", a.activation);
    // model_type: UTF-8, NUL-padded (zeros after the first NUL).
    const auto* mt = reinterpret_cast<const uint8_t*>(a.model_type);
    const size_t len = std::find(mt, mt + MODEL_TYPE_SIZE, 0) - mt;
    if (!valid_utf8(mt, len))
        fail("arch.model_type", ARCH_AT(model_type), "model_type is not valid UTF-8");
    if (size_t k = first_nonzero(mt + len, MODEL_TYPE_SIZE - len); len + k < MODEL_TYPE_SIZE)
        fail("arch.model_type", ARCH_AT(model_type).plus(len + k),
             "model_type has a non-zero byte after its NUL terminator");
    if (size_t k = first_nonzero(a.reserved, sizeof a.reserved); k < sizeof a.reserved)
        fail("arch.reserved", ARCH_AT(reserved).plus(k), "reserved byte %zu is not zero", k);
    // Warnings, not errors (D6).
    const float eps = a.rms_norm_eps, theta = a.rope_theta;
    if (!std::isfinite(eps) || !std::isfinite(theta))
        warnings.push_back("arch: rope_theta or rms_norm_eps is not finite");
    else if (std::fabs(eps - REFERENCE_RMS_NORM_EPS) > RMS_NORM_EPS_TOLERANCE * REFERENCE_RMS_NORM_EPS)
        warnings.push_back("arch.rms_norm_eps: " + std::to_string(eps) +
                           " differs from the kernels' 1e-6 by more than 10%");
    arch = a;
}

// ---- expert table and descriptors --------------------------------------------------------
void Vault::check_table() {
    const uint64_t n = header.total_experts;
    const uint32_t bits = header.bits;
    // Bounded by check_header: descriptors_end(n) <= data_offset <= file size.
    std::vector<uint8_t> meta(descriptors_end(n) - TABLE_OFFSET);
    pread_full(fd, meta.data(), meta.size(), TABLE_OFFSET, name);
    const uint8_t* desc_base = meta.data() + (descriptors_offset(n) - TABLE_OFFSET);

    experts.reserve(n);
    index_.reserve(n);
    size_t layer_first = 0;  // first entry of the current layer (the table is sorted)
    for (uint64_t i = 0; i < n; ++i) {
        ExpertEntry e;
        std::memcpy(&e, meta.data() + i * EXPERT_ENTRY_SIZE, sizeof e);
        Expert x;
        x.layer_id = e.layer_id;
        x.expert_id = e.expert_id;
        x.byte_offset = e.byte_offset;
        x.raw_size = e.raw_size;
        x.padded_size = e.padded_size;

        if (x.expert_id >= header.max_experts_per_layer)
            fail("entry.expert_id", ENTRY_AT(i, expert_id),
                 "expert_id %u is not below max_experts_per_layer %u", x.expert_id,
                 header.max_experts_per_layer);
        if (i > 0) {  // sorted by (layer_id, expert_id), pairs unique (D4)
            const Expert& p = experts.back();
            if (x.layer_id < p.layer_id)
                fail("table.order", ENTRY_AT(i, layer_id), "layer_id %u follows layer_id %u",
                     x.layer_id, p.layer_id);
            if (x.layer_id == p.layer_id && x.expert_id < p.expert_id)
                fail("table.order", ENTRY_AT(i, expert_id),
                     "(layer %u, expert %u) follows expert %u", x.layer_id, x.expert_id,
                     p.expert_id);
            if (x.layer_id == p.layer_id && x.expert_id == p.expert_id)
                fail("table.duplicate", ENTRY_AT(i, expert_id),
                     "(layer %u, expert %u) appears twice", x.layer_id, x.expert_id);
        }
        // The blob: aligned, at or after data_offset, inside the file. Sizes are
        // compared by subtraction from the file size, so nothing can overflow.
        if (x.byte_offset % PAGE_SIZE != 0)
            fail("entry.byte_offset_align", ENTRY_AT(i, byte_offset),
                 "byte_offset %llu is not a multiple of %u", ull(x.byte_offset), PAGE_SIZE);
        if (x.byte_offset < header.data_offset)
            fail("entry.byte_offset", ENTRY_AT(i, byte_offset),
                 "byte_offset %llu is before data_offset %llu", ull(x.byte_offset),
                 ull(header.data_offset));
        if (x.byte_offset >= size)
            fail("entry.blob_bounds", ENTRY_AT(i, byte_offset),
                 "blob at %llu starts at or after the end of the file (%llu bytes)",
                 ull(x.byte_offset), ull(size));
        if (x.raw_size == 0) fail("entry.raw_size", ENTRY_AT(i, raw_size), "raw_size is 0");
        if (x.raw_size > size - x.byte_offset)
            fail("entry.blob_bounds", ENTRY_AT(i, raw_size),
                 "blob of %llu bytes at %llu runs past the end of the file (%llu bytes)",
                 ull(x.raw_size), ull(x.byte_offset), ull(size));
        if (x.padded_size != round_up(x.raw_size, PAGE_SIZE))  // raw_size <= size: no overflow
            fail("entry.padded_size", ENTRY_AT(i, padded_size),
                 "padded_size %llu is not raw_size %llu rounded up to %u", ull(x.padded_size),
                 ull(x.raw_size), PAGE_SIZE);
        if (x.padded_size > size - x.byte_offset)
            fail("entry.blob_bounds", ENTRY_AT(i, padded_size),
                 "padded blob of %llu bytes at %llu runs past the end of the file (%llu bytes)",
                 ull(x.padded_size), ull(x.byte_offset), ull(size));
        if (e.group_size != header.group_size)
            fail("entry.group_size", ENTRY_AT(i, group_size),
                 "group_size %u is not header.group_size %u", e.group_size, header.group_size);

        // Its three descriptors: slices inside [0, raw_size), sizes from the shape (D2).
        const uint64_t raw = x.raw_size;
        uint64_t groups = 0;
        for (uint32_t t = 0; t < TENSORS_PER_EXPERT; ++t) {
            TensorDescriptor d;
            std::memcpy(&d, desc_base + (i * TENSORS_PER_EXPERT + t) * TENSOR_DESCRIPTOR_SIZE,
                        sizeof d);
            if (d.tensor_type != t)
                fail("descriptor.tensor_type", DESC_AT(i, t, tensor_type),
                     "tensor_type %u is not %u (%s)", d.tensor_type, t, TENSOR_NAMES[t]);
            if (d.ndim != TENSOR_NDIM)
                fail("descriptor.ndim", DESC_AT(i, t, ndim), "ndim %u is not %u", d.ndim,
                     TENSOR_NDIM);
            if (size_t k = first_nonzero(d.reserved_0, sizeof d.reserved_0); k < sizeof d.reserved_0)
                fail("descriptor.reserved", DESC_AT(i, t, reserved_0).plus(k),
                     "reserved_0 is not zero");
            if (d.rows < 1) fail("descriptor.rows", DESC_AT(i, t, rows), "rows is 0");
            const uint64_t w = uint64_t{d.rows} * d.cols;  // < 2^64
            const uint64_t psize = packed_size(w, bits), ssize = scales_size(w);  // no overflow
            if (d.cols < 1 || psize > raw)
                fail("descriptor.cols", DESC_AT(i, t, cols),
                     "a %u x %u matrix does not fit in raw_size %llu", d.rows, d.cols, ull(raw));
            if (d.packed_offset > raw)
                fail("descriptor.slice_bounds", DESC_AT(i, t, packed_offset),
                     "packed_offset %llu is beyond raw_size %llu", ull(d.packed_offset), ull(raw));
            if (d.packed_size != psize)
                fail("descriptor.packed_size", DESC_AT(i, t, packed_size),
                     "packed_size %llu is not ceil(%llu * %u / 8) = %llu", ull(d.packed_size),
                     ull(w), bits, ull(psize));
            if (d.packed_size > raw - d.packed_offset)
                fail("descriptor.slice_bounds", DESC_AT(i, t, packed_offset),
                     "packed codes [%llu, +%llu) run past raw_size %llu", ull(d.packed_offset),
                     ull(d.packed_size), ull(raw));
            if (d.scales_offset > raw)
                fail("descriptor.slice_bounds", DESC_AT(i, t, scales_offset),
                     "scales_offset %llu is beyond raw_size %llu", ull(d.scales_offset), ull(raw));
            if (d.scales_size != ssize)
                fail("descriptor.scales_size", DESC_AT(i, t, scales_size),
                     "scales_size %llu is not ceil(%llu / %u) * %u = %llu", ull(d.scales_size),
                     ull(w), GROUP_SIZE, SCALE_BYTES, ull(ssize));
            if (d.scales_size > raw - d.scales_offset)
                fail("descriptor.slice_bounds", DESC_AT(i, t, scales_offset),
                     "scales [%llu, +%llu) run past raw_size %llu", ull(d.scales_offset),
                     ull(d.scales_size), ull(raw));
            x.tensors[t] = Tensor{d.rows, d.cols, d.packed_offset, d.packed_size,
                                  d.scales_offset, d.scales_size};
            groups += num_groups(w);
        }
        if (e.num_groups != groups)
            fail("entry.num_groups", ENTRY_AT(i, num_groups),
                 "num_groups %llu is not the tensors' %llu", ull(e.num_groups), ull(groups));
        if (size_t k = first_nonzero(e.reserved, sizeof e.reserved); k < sizeof e.reserved)
            fail("entry.reserved", ENTRY_AT(i, reserved).plus(k), "reserved is not zero");

        // The six slices must not overlap each other (D3); all are non-empty.
        struct Slice {
            uint64_t off, len;
            Where at;
        };
        Slice slices[2 * TENSORS_PER_EXPERT];
        for (uint32_t t = 0; t < TENSORS_PER_EXPERT; ++t) {
            const Tensor& d = x.tensors[t];
            slices[2 * t] = {d.packed_offset, d.packed_size, DESC_AT(i, t, packed_offset)};
            slices[2 * t + 1] = {d.scales_offset, d.scales_size, DESC_AT(i, t, scales_offset)};
        }
        std::stable_sort(std::begin(slices), std::end(slices),
                         [](const Slice& a, const Slice& b) { return a.off < b.off; });
        for (size_t k = 1; k < std::size(slices); ++k)
            if (slices[k].off < slices[k - 1].off + slices[k - 1].len)  // both <= raw_size
                fail("descriptor.slice_overlap", slices[k].at,
                     "slice at %llu overlaps the slice at %llu (%s)", ull(slices[k].off),
                     ull(slices[k - 1].off), path(slices[k - 1].at).c_str());

        // Shapes (D3): gate and up [ffn, d_model], down [d_model, ffn]; the same in a layer.
        const Tensor &g = x.tensors[0], &u = x.tensors[1], &dn = x.tensors[2];
        if (g.cols != header.d_model)
            fail("descriptor.shape", DESC_AT(i, 0, cols),
                 "gate_proj has %u cols, header.d_model is %u", g.cols, header.d_model);
        if (u.rows != g.rows)
            fail("descriptor.shape", DESC_AT(i, 1, rows), "up_proj has %u rows, gate_proj %u",
                 u.rows, g.rows);
        if (u.cols != g.cols)
            fail("descriptor.shape", DESC_AT(i, 1, cols), "up_proj has %u cols, gate_proj %u",
                 u.cols, g.cols);
        if (dn.rows != g.cols)
            fail("descriptor.shape", DESC_AT(i, 2, rows),
                 "down_proj has %u rows, gate_proj %u cols", dn.rows, g.cols);
        if (dn.cols != g.rows)
            fail("descriptor.shape", DESC_AT(i, 2, cols),
                 "down_proj has %u cols, gate_proj %u rows", dn.cols, g.rows);
        if (i > 0 && x.layer_id == experts[layer_first].layer_id) {
            const uint32_t first_rows = experts[layer_first].tensors[0].rows;
            if (g.rows != first_rows)
                fail("layer.shape", DESC_AT(i, 0, rows),
                     "gate_proj has %u rows, experts[%zu] of the same layer %u", g.rows,
                     layer_first, first_rows);
        } else {
            layer_first = i;
        }
        index_.emplace((uint64_t{x.layer_id} << 32) | x.expert_id, static_cast<uint32_t>(i));
        experts.push_back(x);
    }

    size_t layers = 0;  // distinct layer ids (the table is sorted)
    for (size_t i = 0; i < experts.size(); ++i)
        layers += i == 0 || experts[i].layer_id != experts[i - 1].layer_id;
    if (layers > header.num_moe_layers)  // D5: the model has no more MoE layers than that
        fail("table.layers", HDR_AT(num_moe_layers),
             "the table holds %zu layers, more than num_moe_layers %u", layers,
             header.num_moe_layers);
    if (arch && !experts.empty() && arch->moe_ffn_dim != experts[0].tensors[0].rows)
        warnings.push_back("arch.moe_ffn_dim: " + std::to_string(arch->moe_ffn_dim) +
                           " differs from the experts' gate_proj rows " +
                           std::to_string(experts[0].tensors[0].rows) + " (shapes win)");
}

// No two blobs (with their padding) overlap; gaps between them are reported (D4).
void Vault::check_overlap() {
    std::vector<uint32_t> order(experts.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return experts[a].byte_offset < experts[b].byte_offset;
    });
    uint64_t end = header.data_offset;
    for (size_t k = 0; k < order.size(); ++k) {
        const Expert& x = experts[order[k]];
        if (k > 0 && x.byte_offset < end) {
            const uint32_t prev = order[k - 1];
            fail("table.overlap", ENTRY_AT(uint64_t{order[k]}, byte_offset),
                 "blob at %llu overlaps the blob of experts[%u] [%llu, %llu)",
                 ull(x.byte_offset), prev, ull(experts[prev].byte_offset), ull(end));
        }
        gap_bytes += x.byte_offset - end;
        end = x.byte_offset + x.padded_size;  // <= size
    }
    if (gap_bytes != 0)
        warnings.push_back(std::to_string(gap_bytes) +
                           " bytes between blobs are unused (D4: not fatal)");
}

const Expert* Vault::find(uint32_t layer, uint32_t expert) const {
    auto it = index_.find((uint64_t{layer} << 32) | expert);
    return it == index_.end() ? nullptr : &experts[it->second];
}

// ---- deep: blob contents ------------------------------------------------------------------
void Vault::deep_check(const BlobHook& after_blob) const {
    // A bounded chunk, never more than the file, and even so scales never straddle chunks.
    std::vector<uint8_t> scratch(
        std::max<uint64_t>(2, std::min<uint64_t>(size, 1 << 20) & ~uint64_t{1}));
    for (size_t i = 0; i < experts.size(); ++i) {
        check_blob(i, scratch);
        if (after_blob) after_blob(i, scratch);
    }
}

void Vault::check_blob(size_t i, std::vector<uint8_t>& scratch) const {
    const Expert& x = experts[i];
    const uint32_t bits = header.bits;
    for (uint32_t t = 0; t < TENSORS_PER_EXPERT; ++t) {
        const Tensor& d = x.tensors[t];
        // Unused high bits of the last code byte are zero (D2).
        if (const uint64_t used = (d.weights() % 8) * bits % 8; used != 0) {
            const uint64_t at = x.byte_offset + d.packed_offset + d.packed_size - 1;
            uint8_t last = 0;
            pread_full(fd, &last, 1, at, name);
            if ((last >> used) != 0)
                fail("blob.packed_tail", Where{at, nullptr, i, int(t), "packed"},
                     "unused high bits of the last code byte are not zero");
        }
        // Scales are finite fp16, read in chunks (a chunk is a whole number of scales).
        const uint64_t base = x.byte_offset + d.scales_offset;
        for (uint64_t done = 0; done < d.scales_size;) {
            const size_t len = static_cast<size_t>(std::min<uint64_t>(scratch.size(), d.scales_size - done));
            pread_full(fd, scratch.data(), len, base + done, name);
            for (size_t k = 0; k + 1 < len; k += 2) {
                const uint16_t h = static_cast<uint16_t>(scratch[k] | (scratch[k + 1] << 8));
                if (!fp16_is_finite(h))
                    fail("blob.scales", Where{base + done + k, nullptr, i, int(t), "scales"},
                         "scale %llu is not finite", ull((done + k) / SCALE_BYTES));
            }
            done += len;
        }
    }
    // Padding from raw_size to padded_size is zero (D3).
    const uint64_t pad = x.byte_offset + x.raw_size, pad_len = x.padded_size - x.raw_size;
    for (uint64_t done = 0; done < pad_len;) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(scratch.size(), pad_len - done));
        pread_full(fd, scratch.data(), len, pad + done, name);
        if (size_t k = first_nonzero(scratch.data(), len); k < len)
            fail("blob.padding", Where{pad + done + k, nullptr, i, -1, "padding"},
                 "padding byte at blob offset %llu is not zero", ull(x.raw_size + done + k));
        done += len;
    }
}

}  // namespace smoe::harness
