#include "vault.hpp"

#include "fp16.hpp"
#include "io.hpp"
#include "json.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <numeric>

namespace smoe::harness {

// The on-disk structs are little-endian and read by memcpy.
static_assert(std::endian::native == std::endian::little, "a little-endian host is assumed");

namespace {

using ull = unsigned long long;  // for printf

/// Findings of one code listed one by one (as smoe.format.verify.MAX_PER_CODE); the rest are
/// summarised in one more.
constexpr size_t MAX_PER_CODE = 20;

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

/// The finding of `rule` at `w` (its severity is the rule's).
Issue finding(const Rule& rule, const Where& w, JsonScalar expected, JsonScalar actual,
              std::string message) {
    return Issue{rule.code,           path(w),           w.offset,     std::move(message),
                 std::move(expected), std::move(actual), rule.severity};
}

std::string vformat(const char* fmt, va_list ap) {
    char msg[320];
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    return msg;
}

/// Throws the finding of a broken error rule of the registry (smoe::rules).
[[noreturn]] [[gnu::format(printf, 5, 6)]] void fail(const Rule& rule, const Where& w,
                                                     JsonScalar expected, JsonScalar actual,
                                                     const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string msg = vformat(fmt, ap);
    va_end(ap);
    throw InvalidVault(finding(rule, w, std::move(expected), std::move(actual), std::move(msg)));
}

/// Records a warning (a rule whose severity is not error).
[[gnu::format(printf, 6, 7)]] void warn(std::vector<Issue>& out, const Rule& rule, const Where& w,
                                        JsonScalar expected, JsonScalar actual, const char* fmt,
                                        ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string msg = vformat(fmt, ap);
    va_end(ap);
    out.push_back(finding(rule, w, std::move(expected), std::move(actual), std::move(msg)));
}

/// "prefix N" (for expected values that are bounds, as the Python verifier words them).
std::string bound(const char* prefix, long long v) {
    return prefix + std::to_string(v);
}

/// Bytes as lower-case hex, separated by `sep` (Python's bytes.hex(sep)).
std::string hex(const uint8_t* p, size_t n, const char* sep = "") {
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (size_t k = 0; k < n; ++k) {
        if (k > 0)
            out += sep;
        out += digits[p[k] >> 4];
        out += digits[p[k] & 15];
    }
    return out;
}

/// A float constant of the spec as the double its shortest decimal denotes (1e-06f ->
/// 1e-06): the value smoe_gen.layout holds, so both languages report the same number.
double spec_decimal(float v) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    double d = 0;
    std::from_chars(buf, r.ptr, d);
    return d;
}

// Field locations, from the generated structs' offsetof (never hand-written).
#define HDR_AT(f)                                    \
    Where {                                          \
        offsetof(SmoeHeader, f), "header", 0, -1, #f \
    }
#define ARCH_AT(f)                                                          \
    Where {                                                                 \
        header.reserved_ext + offsetof(SmoeArchBlock, f), "arch", 0, -1, #f \
    }
#define ENTRY_AT(i, f)                                                   \
    Where {                                                              \
        entry_offset(i) + offsetof(ExpertEntry, f), nullptr, (i), -1, #f \
    }
#define DESC_AT(i, t, f)                                                                     \
    Where {                                                                                  \
        descriptor_offset(n, i, t) + offsetof(TensorDescriptor, f), nullptr, (i), int(t), #f \
    }

/// Index of the first non-zero byte of p[0..len), or len.
size_t first_nonzero(const uint8_t* p, size_t len) {
    for (size_t k = 0; k < len; ++k)
        if (p[k] != 0)
            return k;
    return len;
}

/// Index of the first byte of p[0..len) that does not start a well-formed UTF-8 sequence
/// (strict: no overlong forms, no surrogates, at most U+10FFFF), or len.
size_t first_invalid_utf8(const uint8_t* p, size_t len) {
    for (size_t k = 0, n; k < len; k += n)
        if ((n = utf8_sequence(p + k, len - k)) == 0)
            return k;
    return len;
}

}  // namespace

Vault::~Vault() {
    if (fd >= 0)
        ::close(fd);
}

void Vault::open(const std::string& path) {
    Input in = open_input(path);
    open_fd(in.fd.release(), path);
}

void Vault::open_fd(int f, const std::string& path) {
    fd = f;
    name = path;
    struct stat st {};
    if (::fstat(fd, &st) != 0)
        throw IoError(name + ": cannot stat: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode))
        throw IoError(name + ": not a regular file");
    id = FileId{st.st_dev, st.st_ino};
    size = static_cast<uint64_t>(st.st_size);
    if (size < HEADER_SIZE)  // unreadable (exit 2), reported like a broken rule
        throw UnreadableVault(
            name, Issue{rules::HEADER_SIZE.code, "header", 0,
                        "file of " + std::to_string(size) + " bytes is shorter than the " +
                            std::to_string(HEADER_SIZE) + "-byte header",
                        HEADER_SIZE, size});
    pread_full(fd, &header, sizeof header, 0, name);
    check_header();
    if (header.version >= VERSION_WITH_ARCH)
        check_arch();
    check_table();
    check_overlap();
    std::stable_sort(warnings.begin(), warnings.end(), [](const Issue& a, const Issue& b) {
        return a.severity != b.severity ? a.severity < b.severity : a.offset < b.offset;
    });
}

// ---- header ---------------------------------------------------------------------------
// Everything is bounded here before anything else is read or allocated: the table and
// descriptors end at or before data_offset, which is inside the file, and the arch
// block lies in the gap between them. Expected and actual values are the Python
// verifier's (smoe/format/verify/__init__.py), so that both report the same finding.
void Vault::check_header() {
    const SmoeHeader& h = header;
    if (!has_magic(h))
        fail(rules::HEADER_MAGIC, HDR_AT(magic), hex(MAGIC, sizeof MAGIC, " "),
             hex(h.magic, sizeof h.magic, " "), "magic is not %s", MAGIC_HEX);
    if (h.version < VERSION_MIN || h.version > VERSION_MAX)
        fail(rules::HEADER_VERSION, HDR_AT(version),
             std::to_string(VERSION_MIN) + ".." + std::to_string(VERSION_MAX), h.version,
             "version %u is not supported (readers accept %u..%u)", h.version, VERSION_MIN,
             VERSION_MAX);
    const uint64_t model_experts = uint64_t{h.num_moe_layers} * h.max_experts_per_layer;
    if (h.total_experts > model_experts)
        fail(rules::HEADER_TOTAL_EXPERTS, HDR_AT(total_experts), model_experts, h.total_experts,
             "total_experts %u exceeds num_moe_layers * max_experts_per_layer = %llu",
             h.total_experts, ull(model_experts));
    if (h.table_offset != TABLE_OFFSET)
        fail(rules::HEADER_TABLE_OFFSET, HDR_AT(table_offset), TABLE_OFFSET, h.table_offset,
             "table_offset %llu is not %llu", ull(h.table_offset), ull(TABLE_OFFSET));
    if (h.data_offset % PAGE_SIZE != 0)
        fail(rules::HEADER_DATA_OFFSET_ALIGN, HDR_AT(data_offset),
             round_up(h.data_offset, PAGE_SIZE), h.data_offset,
             "data_offset %llu is not a multiple of %u", ull(h.data_offset), PAGE_SIZE);
    const uint64_t desc_end = descriptors_end(h.total_experts);  // < 2^40: no overflow
    if (desc_end > h.data_offset)
        fail(rules::HEADER_TABLE_BOUNDS, HDR_AT(total_experts),
             bound("<= ", static_cast<long long>(h.data_offset)), desc_end,
             "the table and descriptors of %u experts end at %llu, after data_offset %llu",
             h.total_experts, ull(desc_end), ull(h.data_offset));
    if (h.data_offset > size)
        fail(rules::HEADER_DATA_OFFSET_BOUNDS, HDR_AT(data_offset),
             bound("<= ", static_cast<long long>(size)), h.data_offset,
             "data_offset %llu is beyond the end of the file (%llu bytes)", ull(h.data_offset),
             ull(size));
    if (h.group_size != GROUP_SIZE)
        fail(rules::HEADER_GROUP_SIZE, HDR_AT(group_size), GROUP_SIZE, h.group_size,
             "group_size %u is not %u", h.group_size, GROUP_SIZE);
    if (h.bits != BITS_Q2 && h.bits != BITS_Q4)
        fail(rules::HEADER_BITS, HDR_AT(bits),
             std::to_string(BITS_Q2) + " or " + std::to_string(BITS_Q4), h.bits,
             "bits %u is not %u or %u", h.bits, BITS_Q2, BITS_Q4);
    if (h.d_model < 1)
        fail(rules::HEADER_D_MODEL, HDR_AT(d_model), ">= 1", h.d_model, "d_model is 0");
    if (h.version >= VERSION_WITH_ARCH) {
        const uint64_t ext = h.reserved_ext;
        if (ext + ARCH_BLOCK_SIZE > size)  // (then also misplaced: data_offset <= size)
            fail(rules::ARCH_BOUNDS, HDR_AT(reserved_ext),
                 bound("<= ", static_cast<long long>(size) - ARCH_BLOCK_SIZE), ext,
                 "the arch block at %llu runs past the end of the file (%llu bytes)", ull(ext),
                 ull(size));
        if (ext % ARCH_ALIGN != 0 || ext < desc_end || ext + ARCH_BLOCK_SIZE > h.data_offset)
            fail(rules::ARCH_PLACEMENT, HDR_AT(reserved_ext),
                 "multiple of " + std::to_string(ARCH_ALIGN) + " in [" + std::to_string(desc_end) +
                     ", " +
                     std::to_string(static_cast<long long>(h.data_offset) - ARCH_BLOCK_SIZE) + "]",
                 ext,
                 "arch block at %llu must be a multiple of %u, at or after the end of the "
                 "descriptors (%llu) and end at or before data_offset (%llu)",
                 ull(ext), ARCH_ALIGN, ull(desc_end), ull(h.data_offset));
    } else if (h.reserved_ext != 0) {
        warn(warnings, rules::HEADER_RESERVED_EXT, HDR_AT(reserved_ext), 0u, h.reserved_ext,
             "reserved_ext %u in a version 1 vault is ignored (D6)", h.reserved_ext);
    }
}

// ---- arch block (v2): the engine's load rules, ruling D6 -------------------------------
void Vault::check_arch() {
    SmoeArchBlock a{};
    pread_full(fd, &a, sizeof a, header.reserved_ext, name);
    if (!has_arch_magic(a))
        fail(rules::ARCH_MAGIC, ARCH_AT(magic), hex(ARCH_MAGIC, sizeof ARCH_MAGIC, " "),
             hex(a.magic, sizeof a.magic, " "), "arch block magic is not \"SARC\"");
    if (a.block_version != ARCH_BLOCK_VERSION)
        fail(rules::ARCH_BLOCK_VERSION, ARCH_AT(block_version), ARCH_BLOCK_VERSION, a.block_version,
             "block_version %u is not %u", a.block_version, ARCH_BLOCK_VERSION);
    if (a.block_size != ARCH_BLOCK_SIZE)
        fail(rules::ARCH_BLOCK_SIZE, ARCH_AT(block_size), ARCH_BLOCK_SIZE, a.block_size,
             "block_size %u is not %u", a.block_size, ARCH_BLOCK_SIZE);
    if ((a.flags & ~FLAGS_KNOWN_MASK) != 0)
        fail(rules::ARCH_FLAGS, ARCH_AT(flags), a.flags & FLAGS_KNOWN_MASK, a.flags,
             "flags 0x%x has bits beyond 0x%x set", a.flags, FLAGS_KNOWN_MASK);
    if (a.num_heads < 1)
        fail(rules::ARCH_NUM_HEADS, ARCH_AT(num_heads), ">= 1", a.num_heads, "num_heads is 0");
    if (a.num_kv_heads < 1)
        fail(rules::ARCH_NUM_KV_HEADS, ARCH_AT(num_kv_heads), ">= 1", a.num_kv_heads,
             "num_kv_heads is 0");
    if (a.num_heads % a.num_kv_heads != 0)
        fail(rules::ARCH_NUM_KV_HEADS, ARCH_AT(num_kv_heads),
             "a divisor of " + std::to_string(a.num_heads), a.num_kv_heads,
             "num_kv_heads %u does not divide num_heads %u", a.num_kv_heads, a.num_heads);
    const std::string head_range = "1.." + std::to_string(MAX_HEAD_DIM);
    if (a.head_dim < 1 || a.head_dim > MAX_HEAD_DIM)
        fail(rules::ARCH_HEAD_DIM, ARCH_AT(head_dim), head_range, a.head_dim,
             "head_dim %u is outside 1..%u", a.head_dim, MAX_HEAD_DIM);
    const std::string top_k_range = "1.." + std::to_string(MAX_MOE_TOP_K);
    if (a.moe_top_k < 1 || a.moe_top_k > MAX_MOE_TOP_K)
        fail(rules::ARCH_MOE_TOP_K, ARCH_AT(moe_top_k), top_k_range, a.moe_top_k,
             "moe_top_k %u is outside 1..%u", a.moe_top_k, MAX_MOE_TOP_K);
    // The block counts every layer and has no field for multi-token-prediction layers.
    if (a.num_hidden_layers < header.num_moe_layers)
        fail(rules::ARCH_NUM_HIDDEN_LAYERS, ARCH_AT(num_hidden_layers),
             ">= " + std::to_string(header.num_moe_layers), a.num_hidden_layers,
             "num_hidden_layers %u is less than the header's num_moe_layers %u",
             a.num_hidden_layers, header.num_moe_layers);
    if (a.activation != static_cast<uint32_t>(Activation::silu))
        fail(rules::ARCH_ACTIVATION, ARCH_AT(activation), 0u, a.activation,
             "activation %u is not 0 (SiLU), the only one the kernels implement", a.activation);
    // model_type: UTF-8, NUL-padded (zeros after the first NUL).
    const auto* mt = reinterpret_cast<const uint8_t*>(a.model_type);
    const size_t len = std::find(mt, mt + MODEL_TYPE_SIZE, 0) - mt;
    if (size_t k = first_invalid_utf8(mt, len); k < len)
        fail(rules::ARCH_MODEL_TYPE, ARCH_AT(model_type).plus(k), "UTF-8", hex(mt, MODEL_TYPE_SIZE),
             "model_type is not valid UTF-8 (byte %zu)", k);
    if (size_t k = first_nonzero(mt + len, MODEL_TYPE_SIZE - len); len + k < MODEL_TYPE_SIZE)
        fail(rules::ARCH_MODEL_TYPE, ARCH_AT(model_type).plus(len + k), 0u, mt[len + k],
             "model_type has a non-zero byte after its NUL terminator");
    if (size_t k = first_nonzero(a.reserved, sizeof a.reserved); k < sizeof a.reserved)
        fail(rules::ARCH_RESERVED, ARCH_AT(reserved).plus(k), 0u, a.reserved[k],
             "reserved byte %zu is not zero", k);
    // Warnings, not errors (D6, R5): one per field.
    if (!std::isfinite(a.rope_theta))
        warn(warnings, rules::ARCH_ROPE_THETA, ARCH_AT(rope_theta), "finite", a.rope_theta,
             "rope_theta is not finite");
    const float eps = a.rms_norm_eps;
    if (!std::isfinite(eps))
        warn(warnings, rules::ARCH_RMS_NORM_EPS, ARCH_AT(rms_norm_eps), "finite", eps,
             "rms_norm_eps is not finite");
    else if (std::fabs(eps - REFERENCE_RMS_NORM_EPS) >
             RMS_NORM_EPS_TOLERANCE * REFERENCE_RMS_NORM_EPS)
        warn(warnings, rules::ARCH_RMS_NORM_EPS, ARCH_AT(rms_norm_eps),
             spec_decimal(REFERENCE_RMS_NORM_EPS), eps,
             "rms_norm_eps %g differs from the kernels' %g by more than %g%%",
             static_cast<double>(eps), static_cast<double>(REFERENCE_RMS_NORM_EPS),
             static_cast<double>(RMS_NORM_EPS_TOLERANCE) * 100);
    arch = a;
}

// ---- expert table and descriptors --------------------------------------------------------
void Vault::check_table() {
    const uint64_t n = header.total_experts;
    const uint32_t bits = header.bits;
    // Bounded by check_header: descriptors_end(n) <= data_offset <= file size.
    std::vector<uint8_t> meta(descriptors_end(n) - TABLE_OFFSET);
    pread_full(fd, meta.data(), meta.size(), TABLE_OFFSET, name);

    experts.reserve(n);
    index_.reserve(n);
    size_t layer_first = 0;  // first entry of the current layer (the table is sorted)
    for (uint64_t i = 0; i < n; ++i) {
        ExpertEntry e;
        std::memcpy(&e, meta.data() + (entry_offset(i) - TABLE_OFFSET), sizeof e);
        Expert x;
        x.layer_id = e.layer_id;
        x.expert_id = e.expert_id;
        x.byte_offset = e.byte_offset;
        x.raw_size = e.raw_size;
        x.padded_size = e.padded_size;

        if (x.expert_id >= header.max_experts_per_layer)
            fail(rules::ENTRY_EXPERT_ID, ENTRY_AT(i, expert_id),
                 bound("< ", header.max_experts_per_layer), x.expert_id,
                 "expert_id %u is not below max_experts_per_layer %u", x.expert_id,
                 header.max_experts_per_layer);
        if (i > 0) {  // sorted by (layer_id, expert_id), pairs unique (D4)
            const Expert& p = experts.back();
            if (x.layer_id < p.layer_id)
                fail(rules::TABLE_ORDER, ENTRY_AT(i, layer_id), {}, {},
                     "layer_id %u follows layer_id %u", x.layer_id, p.layer_id);
            if (x.layer_id == p.layer_id && x.expert_id < p.expert_id)
                fail(rules::TABLE_ORDER, ENTRY_AT(i, expert_id), {}, {},
                     "(layer %u, expert %u) follows expert %u", x.layer_id, x.expert_id,
                     p.expert_id);
            if (x.layer_id == p.layer_id && x.expert_id == p.expert_id)
                fail(rules::TABLE_DUPLICATE, ENTRY_AT(i, expert_id), {}, {},
                     "(layer %u, expert %u) appears twice", x.layer_id, x.expert_id);
        }
        // The blob: aligned, at or after data_offset, inside the file. Sizes are
        // compared by subtraction from the file size, so nothing can overflow.
        if (x.byte_offset % PAGE_SIZE != 0)
            fail(rules::ENTRY_BYTE_OFFSET_ALIGN, ENTRY_AT(i, byte_offset),
                 round_up(x.byte_offset, PAGE_SIZE), x.byte_offset,
                 "byte_offset %llu is not a multiple of %u", ull(x.byte_offset), PAGE_SIZE);
        if (x.byte_offset < header.data_offset)
            fail(rules::ENTRY_BYTE_OFFSET, ENTRY_AT(i, byte_offset),
                 bound(">= ", static_cast<long long>(header.data_offset)), x.byte_offset,
                 "byte_offset %llu is before data_offset %llu", ull(x.byte_offset),
                 ull(header.data_offset));
        if (x.byte_offset >= size)
            fail(rules::ENTRY_BLOB_BOUNDS, ENTRY_AT(i, byte_offset),
                 bound("< ", static_cast<long long>(size)), x.byte_offset,
                 "blob at %llu starts at or after the end of the file (%llu bytes)",
                 ull(x.byte_offset), ull(size));
        if (x.raw_size == 0)
            fail(rules::ENTRY_RAW_SIZE, ENTRY_AT(i, raw_size), ">= 1", x.raw_size, "raw_size is 0");
        const uint64_t room = size - x.byte_offset;
        if (x.raw_size > room)
            fail(rules::ENTRY_BLOB_BOUNDS, ENTRY_AT(i, raw_size), room, x.raw_size,
                 "blob of %llu bytes at %llu runs past the end of the file (%llu bytes)",
                 ull(x.raw_size), ull(x.byte_offset), ull(size));
        const uint64_t want_pad = round_up(x.raw_size, PAGE_SIZE);  // raw_size <= size
        if (x.padded_size != want_pad)
            fail(rules::ENTRY_PADDED_SIZE, ENTRY_AT(i, padded_size), want_pad, x.padded_size,
                 "padded_size %llu is not raw_size %llu rounded up to %u", ull(x.padded_size),
                 ull(x.raw_size), PAGE_SIZE);
        if (x.padded_size > room)
            fail(rules::ENTRY_BLOB_BOUNDS, ENTRY_AT(i, padded_size), room, x.padded_size,
                 "padded blob of %llu bytes at %llu runs past the end of the file (%llu bytes)",
                 ull(x.padded_size), ull(x.byte_offset), ull(size));
        if (e.group_size != header.group_size)
            fail(rules::ENTRY_GROUP_SIZE, ENTRY_AT(i, group_size), header.group_size, e.group_size,
                 "group_size %u is not header.group_size %u", e.group_size, header.group_size);

        // Its three descriptors: slices inside [0, raw_size), sizes from the shape (D2).
        const uint64_t raw = x.raw_size;
        uint64_t groups = 0;
        for (uint32_t t = 0; t < TENSORS_PER_EXPERT; ++t) {
            TensorDescriptor d;
            std::memcpy(&d, meta.data() + (descriptor_offset(n, i, t) - TABLE_OFFSET), sizeof d);
            if (d.tensor_type != t)
                fail(rules::DESCRIPTOR_TENSOR_TYPE, DESC_AT(i, t, tensor_type), t, d.tensor_type,
                     "tensor_type %u is not %u (%s)", d.tensor_type, t, TENSOR_NAMES[t]);
            if (d.ndim != TENSOR_NDIM)
                fail(rules::DESCRIPTOR_NDIM, DESC_AT(i, t, ndim), TENSOR_NDIM, d.ndim,
                     "ndim %u is not %u", d.ndim, TENSOR_NDIM);
            if (size_t k = first_nonzero(d.reserved_0, sizeof d.reserved_0);
                k < sizeof d.reserved_0)
                fail(rules::DESCRIPTOR_RESERVED, DESC_AT(i, t, reserved_0).plus(k), {}, {},
                     "reserved_0 is not zero");
            if (d.rows < 1)
                fail(rules::DESCRIPTOR_ROWS, DESC_AT(i, t, rows), ">= 1", d.rows, "rows is 0");
            if (d.cols < 1)
                fail(rules::DESCRIPTOR_COLS, DESC_AT(i, t, cols), ">= 1", d.cols, "cols is 0");
            const uint64_t w = uint64_t{d.rows} * d.cols;                         // < 2^64
            const uint64_t psize = packed_size(w, bits), ssize = scales_size(w);  // no overflow
            if (psize > raw)  // the most columns that fit, by division (no overflow)
                fail(rules::DESCRIPTOR_COLS, DESC_AT(i, t, cols), raw * 8 / bits / d.rows, d.cols,
                     "a %u x %u matrix does not fit in raw_size %llu", d.rows, d.cols, ull(raw));
            if (d.packed_offset > raw)
                fail(rules::DESCRIPTOR_SLICE_BOUNDS, DESC_AT(i, t, packed_offset), {},
                     d.packed_offset, "packed_offset %llu is beyond raw_size %llu",
                     ull(d.packed_offset), ull(raw));
            if (d.packed_size != psize)
                fail(rules::DESCRIPTOR_PACKED_SIZE, DESC_AT(i, t, packed_size), psize,
                     d.packed_size, "packed_size %llu is not ceil(%llu * %u / 8) = %llu",
                     ull(d.packed_size), ull(w), bits, ull(psize));
            if (d.packed_size > raw - d.packed_offset)
                fail(rules::DESCRIPTOR_SLICE_BOUNDS, DESC_AT(i, t, packed_offset), {},
                     d.packed_offset, "packed codes [%llu, +%llu) run past raw_size %llu",
                     ull(d.packed_offset), ull(d.packed_size), ull(raw));
            if (d.scales_offset > raw)
                fail(rules::DESCRIPTOR_SLICE_BOUNDS, DESC_AT(i, t, scales_offset), {},
                     d.scales_offset, "scales_offset %llu is beyond raw_size %llu",
                     ull(d.scales_offset), ull(raw));
            if (d.scales_size != ssize)
                fail(rules::DESCRIPTOR_SCALES_SIZE, DESC_AT(i, t, scales_size), ssize,
                     d.scales_size, "scales_size %llu is not ceil(%llu / %u) * %u = %llu",
                     ull(d.scales_size), ull(w), GROUP_SIZE, SCALE_BYTES, ull(ssize));
            if (d.scales_size > raw - d.scales_offset)
                fail(rules::DESCRIPTOR_SLICE_BOUNDS, DESC_AT(i, t, scales_offset), {},
                     d.scales_offset, "scales [%llu, +%llu) run past raw_size %llu",
                     ull(d.scales_offset), ull(d.scales_size), ull(raw));
            x.tensors[t] = Tensor{d.rows,        d.cols,          d.packed_offset,
                                  d.packed_size, d.scales_offset, d.scales_size};
            groups += num_groups(w);
        }
        if (e.num_groups != groups)
            fail(rules::ENTRY_NUM_GROUPS, ENTRY_AT(i, num_groups), groups, e.num_groups,
                 "num_groups %llu is not the tensors' %llu", ull(e.num_groups), ull(groups));
        if (size_t k = first_nonzero(e.reserved, sizeof e.reserved); k < sizeof e.reserved)
            fail(rules::ENTRY_RESERVED, ENTRY_AT(i, reserved).plus(k), {}, {},
                 "reserved is not zero");

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
                fail(rules::DESCRIPTOR_SLICE_OVERLAP, slices[k].at, {}, {},
                     "slice at %llu overlaps the slice at %llu (%s)", ull(slices[k].off),
                     ull(slices[k - 1].off), path(slices[k - 1].at).c_str());

        // Shapes (D3): up = gate, down = gate transposed (named at the first tensor that
        // does not fit the gate), gate's cols = d_model; the same in a layer.
        const Tensor &g = x.tensors[0], &u = x.tensors[1], &dn = x.tensors[2];
        const bool up_ok = u.rows == g.rows && u.cols == g.cols;
        if (!up_ok || dn.rows != g.cols || dn.cols != g.rows)
            fail(rules::DESCRIPTOR_SHAPE, up_ok ? DESC_AT(i, 2, rows) : DESC_AT(i, 1, rows), {}, {},
                 "shapes gate %ux%u, up %ux%u, down %ux%u: up must equal gate and down its "
                 "transpose",
                 g.rows, g.cols, u.rows, u.cols, dn.rows, dn.cols);
        if (g.cols != header.d_model)
            fail(rules::DESCRIPTOR_SHAPE, DESC_AT(i, 0, cols), header.d_model, g.cols,
                 "gate_proj has %u cols, header.d_model is %u", g.cols, header.d_model);
        if (i > 0 && x.layer_id == experts[layer_first].layer_id) {
            const uint32_t first_rows = experts[layer_first].tensors[0].rows;
            if (g.rows != first_rows)
                fail(rules::LAYER_SHAPE, DESC_AT(i, 0, rows), {}, {},
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
        fail(rules::TABLE_LAYERS, HDR_AT(num_moe_layers), layers, header.num_moe_layers,
             "the table holds %zu layers, more than num_moe_layers %u", layers,
             header.num_moe_layers);
    if (arch) {  // D3: the shapes win; named by the first expert that disagrees
        const uint32_t moe = arch->moe_ffn_dim;
        size_t differ = 0;
        const Expert* first = nullptr;
        for (const Expert& x : experts)
            if (x.tensors[0].rows != moe && ++differ == 1)
                first = &x;
        if (first != nullptr)
            warn(warnings, rules::ARCH_MOE_FFN_DIM,
                 Where{header.reserved_ext + offsetof(SmoeArchBlock, moe_ffn_dim), "arch", 0, -1,
                       "moe_ffn_dim"},
                 first->tensors[0].rows, moe,
                 "moe_ffn_dim %u disagrees with the experts' gate_proj rows %u (%zu experts); "
                 "shapes win",
                 moe, first->tensors[0].rows, differ);
    }
}

// No two blobs (with their padding) overlap; gaps between them are reported (D4), each
// by the entry of the blob after it, at most MAX_PER_CODE one by one.
void Vault::check_overlap() {
    std::vector<uint32_t> order(experts.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return experts[a].byte_offset < experts[b].byte_offset;
    });
    uint64_t end = header.data_offset;
    std::vector<uint64_t> gaps;  // entries whose blob follows unused bytes
    for (size_t k = 0; k < order.size(); ++k) {
        const uint64_t i = order[k];
        const Expert& x = experts[i];
        if (k > 0 && x.byte_offset < end) {
            const uint32_t prev = order[k - 1];
            fail(rules::TABLE_OVERLAP, ENTRY_AT(i, byte_offset), {}, {},
                 "blob at %llu overlaps the blob of experts[%u] [%llu, %llu)", ull(x.byte_offset),
                 prev, ull(experts[prev].byte_offset), ull(end));
        }
        if (k == 0 && x.byte_offset != end)
            warn(warnings, rules::TABLE_GAP, ENTRY_AT(i, byte_offset), end, x.byte_offset,
                 "the first blob does not start at data_offset");
        if (k > 0 && x.byte_offset > end)
            gaps.push_back(i);
        gap_bytes += x.byte_offset - end;
        end = x.byte_offset + x.padded_size;  // <= size
    }
    for (size_t k = 0; k < gaps.size() && k <= MAX_PER_CODE; ++k) {
        const uint64_t i = gaps[k];
        if (k < MAX_PER_CODE)
            warn(warnings, rules::TABLE_GAP, ENTRY_AT(i, byte_offset), {}, {},
                 "unused bytes before this blob (blobs are not back to back)");
        else
            warn(warnings, rules::TABLE_GAP, ENTRY_AT(i, byte_offset), {}, {},
                 "and %zu more like the above", gaps.size() - MAX_PER_CODE);
    }
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
        if (after_blob)
            after_blob(i, scratch);
    }
}

void Vault::check_blob(size_t i, std::vector<uint8_t>& scratch) const {
    const Expert& x = experts[i];
    const uint32_t bits = header.bits;
    for (uint32_t t = 0; t < TENSORS_PER_EXPERT; ++t) {
        const Tensor& d = x.tensors[t];
        // Unused high bits of the last code byte are zero (D2).
        if (const uint64_t used = (d.weights() % codes_per_byte(bits)) * bits; used != 0) {
            const uint64_t at = x.byte_offset + d.packed_offset + d.packed_size - 1;
            uint8_t last = 0;
            pread_full(fd, &last, 1, at, name);
            if ((last >> used) != 0)
                fail(rules::BLOB_PACKED_TAIL, Where{at, nullptr, i, int(t), "packed"}, 0u, last,
                     "unused high bits of the last code byte are not zero");
        }
        // Scales are finite fp16, read in chunks (a chunk is a whole number of scales).
        const uint64_t base = x.byte_offset + d.scales_offset;
        for (uint64_t done = 0; done < d.scales_size;) {
            const size_t len =
                static_cast<size_t>(std::min<uint64_t>(scratch.size(), d.scales_size - done));
            pread_full(fd, scratch.data(), len, base + done, name);
            for (size_t k = 0; k + 1 < len; k += 2) {
                const uint16_t h = static_cast<uint16_t>(scratch[k] | (scratch[k + 1] << 8));
                if (!fp16_is_finite(h))
                    fail(rules::BLOB_SCALES, Where{base + done + k, nullptr, i, int(t), "scales"},
                         "finite", fp16_to_f32(h), "scale %llu is not finite",
                         ull((done + k) / SCALE_BYTES));
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
            fail(rules::BLOB_PADDING, Where{pad + done + k, nullptr, i, -1, "padding"}, 0u,
                 scratch[k], "padding byte at blob offset %llu is not zero",
                 ull(x.raw_size + done + k));
        done += len;
    }
}

Fd open_blob_reads(const Vault& v, bool want_direct, bool& direct, std::string& refused) {
    direct = false;
    if (want_direct) {
        Fd fd(::open(v.name.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK));
        int err = errno;
        struct stat st {};
        if (fd.get() >= 0 && ::fstat(fd.get(), &st) == 0 &&
            (st.st_dev != v.id.dev || st.st_ino != v.id.ino))
            throw ReadFailed(v.name +
                             ": replaced since it was checked; refusing to read another file");
        if (fd.get() >= 0 && ::fcntl(fd.get(), F_SETFL, O_DIRECT) == 0) {
            AlignedBuffer probe(PAGE_SIZE);
            const uint64_t at = v.experts.empty() ? 0 : v.experts[0].byte_offset;
            if (::pread(fd.get(), probe.data(), PAGE_SIZE, static_cast<off_t>(at)) >= 0) {
                direct = true;
                return fd;
            }
            err = errno;
        } else if (fd.get() >= 0) {
            err = errno;
        }
        refused = v.name + ": O_DIRECT refused (" + std::strerror(err) + "); using buffered reads";
    }
    Fd fd(::fcntl(v.fd, F_DUPFD_CLOEXEC, 0));
    if (fd.get() < 0)
        throw IoError(v.name + ": cannot duplicate the descriptor: " + std::strerror(errno), 0,
                      exit_codes::FAILED);
    return fd;
}

}  // namespace smoe::harness
