// Conformance of the generated header: compile-time layout checks, then read a vault
// written by the Python side and print its fixed structs as JSON for the Python test.
//
// usage: layout_test VAULT      exit 0 ok, 1 short file or bad magic, 2 usage
#include "common.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>

// Independent spellings of the format document's numbers (not the generated constants).
static_assert(sizeof(SmoeHeader) == 64 && sizeof(SmoeArchBlock) == 128);
static_assert(sizeof(ExpertEntry) == 48 && sizeof(TensorDescriptor) == 44);
static_assert(offsetof(ExpertEntry, num_groups) == 36, "D1: unaligned u64");
static_assert(offsetof(TensorDescriptor, packed_offset) == 12, "D1: unaligned u64");
static_assert(offsetof(SmoeArchBlock, model_type) == 60 && offsetof(SmoeArchBlock, reserved) == 84);
static_assert(smoe::PAGE_SIZE == 16384 && smoe::GROUP_SIZE == 64 && smoe::TABLE_OFFSET == 64);
static_assert(smoe::descriptor_offset(10, 0, 0) == 64 + 480);
static_assert(smoe::descriptor_offset(10, 9, 2) == 64 + 480 + 29 * 44);
static_assert(smoe::packed_size(65, 4) == 33 && smoe::packed_size(65, 2) == 17);
static_assert(smoe::scales_size(65) == 4 && smoe::round_up(16385, 16384) == 32768);
static_assert(smoe::code_centre(4) == 7.5f && smoe::code_centre(2) == 1.5f);
// The generated helpers, against values worked out by hand: the table of n entries starts
// at 64, its descriptors at 64 + 48 n and end 132 n later; writers put the arch block on
// the next multiple of 64 and data_offset on the next page (q4_v2.smoe: 8 experts, arch
// block at 1536; a 94 x 128 model: 12,032 experts).
static_assert(smoe::entry_offset(0) == 64 && smoe::entry_offset(2) == 160);
static_assert(smoe::descriptors_offset(10) == 544 && smoe::descriptors_end(10) == 1864);
static_assert(smoe::descriptors_end(8) == 1504 && smoe::writer_reserved_ext(8) == 1536);
static_assert(smoe::writer_reserved_ext(10) == 1920);
static_assert(smoe::writer_data_offset(8, 2) == 16384 && smoe::writer_data_offset(8, 1) == 16384);
static_assert(smoe::descriptors_end(12032) == 2165824);
static_assert(smoe::writer_reserved_ext(12032) == 2165824);
static_assert(smoe::writer_data_offset(12032, 2) == 2179072);  // 133 pages
static_assert(smoe::writer_data_offset(12032, 1) == 2179072);
static_assert(smoe::num_groups(0) == 0 && smoe::num_groups(64) == 1 && smoe::num_groups(65) == 2);
static_assert(smoe::packed_size(uint64_t{1} << 40, 4) == uint64_t{1} << 39);  // no overflow
static_assert(smoe::codes_per_byte(4) == 2 && smoe::codes_per_byte(2) == 4);
static_assert(smoe::max_code(4) == 15 && smoe::max_code(2) == 3);
// Names: descriptor order, flag bits, the rule registry (codes unique, severities named).
static_assert(std::string_view(smoe::TENSOR_NAMES[0]) == "gate_proj");
static_assert(std::string_view(smoe::TENSOR_NAMES[2]) == "down_proj");
static_assert(std::size(smoe::FLAG_NAMES) == 3 && smoe::FLAG_NAMES[0].bit == 1 &&
              smoe::FLAG_NAMES[2].bit == 4);
static_assert(std::string_view(smoe::FLAG_NAMES[1].name) == "has_qk_norm");
static_assert(std::string_view(smoe::rules::HEADER_MAGIC.code) == "header.magic");
static_assert(smoe::rules::TABLE_GAP.severity == smoe::Severity::warning);
static_assert(std::string_view(smoe::severity_name(smoe::Severity::info)) == "info");
constexpr bool rule_codes_unique() {
    for (size_t a = 0; a < std::size(smoe::rules::ALL); ++a)
        for (size_t b = a + 1; b < std::size(smoe::rules::ALL); ++b)
            if (std::string_view(smoe::rules::ALL[a]->code) == smoe::rules::ALL[b]->code)
                return false;
    return true;
}
static_assert(rule_codes_unique());
// The same structs through the smoe:: names.
static_assert(sizeof(smoe::SmoeHeader) == sizeof(::SmoeHeader));

namespace {

bool read_at(std::FILE* f, long off, void* out, size_t n) {
    return std::fseek(f, off, SEEK_SET) == 0 && std::fread(out, 1, n, f) == n;
}

std::string u(unsigned long long v) {
    return std::to_string(v);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: layout_test VAULT\n");
        return 2;
    }
    std::FILE* f = std::fopen(argv[1], "rb");
    if (!f) {
        std::perror(argv[1]);
        return 1;
    }
    SmoeHeader h;
    if (!read_at(f, 0, &h, sizeof h) || !smoe::has_magic(h)) {
        std::fprintf(stderr, "%s: short file or bad magic at offset 0\n", argv[1]);
        return 1;
    }
    std::string out = "{\"header\": {";
    out += "\"version\": " + u(h.version) + ", \"num_moe_layers\": " + u(h.num_moe_layers) +
           ", \"max_experts_per_layer\": " + u(h.max_experts_per_layer) +
           ", \"total_experts\": " + u(h.total_experts) +
           ", \"table_offset\": " + u(h.table_offset) + ", \"data_offset\": " + u(h.data_offset) +
           ", \"group_size\": " + u(h.group_size) + ", \"bits\": " + u(h.bits) +
           ", \"d_model\": " + u(h.d_model) + ", \"vocab_size\": " + u(h.vocab_size) +
           ", \"ffn_dim\": " + u(h.ffn_dim) + ", \"reserved_ext\": " + u(h.reserved_ext) + "}";
    if (h.total_experts > 0) {
        ExpertEntry e;
        TensorDescriptor d;
        if (!read_at(f, static_cast<long>(h.table_offset), &e, sizeof e) ||
            !read_at(f, static_cast<long>(smoe::descriptor_offset(h.total_experts, 0, 2)), &d,
                     sizeof d)) {
            std::fprintf(stderr, "%s: short file in the table\n", argv[1]);
            return 1;
        }
        out += ", \"expert0\": {\"layer_id\": " + u(e.layer_id) +
               ", \"expert_id\": " + u(e.expert_id) + ", \"byte_offset\": " + u(e.byte_offset) +
               ", \"raw_size\": " + u(e.raw_size) + ", \"padded_size\": " + u(e.padded_size) +
               ", \"num_groups\": " + u(e.num_groups) + "}";
        out += ", \"expert0_down\": {\"tensor_type\": " + u(d.tensor_type) +
               ", \"rows\": " + u(d.rows) + ", \"cols\": " + u(d.cols) +
               ", \"packed_offset\": " + u(d.packed_offset) +
               ", \"packed_size\": " + u(d.packed_size) +
               ", \"scales_offset\": " + u(d.scales_offset) +
               ", \"scales_size\": " + u(d.scales_size) + "}";
    }
    if (h.version >= smoe::VERSION_WITH_ARCH) {
        SmoeArchBlock a;
        if (!read_at(f, static_cast<long>(h.reserved_ext), &a, sizeof a) ||
            !smoe::has_arch_magic(a)) {
            std::fprintf(stderr, "%s: no arch block at offset %u\n", argv[1], h.reserved_ext);
            return 1;
        }
        char name[sizeof a.model_type + 1] = {};
        std::memcpy(name, a.model_type, sizeof a.model_type);
        out += ", \"arch\": {\"flags\": " + u(a.flags) + ", \"num_heads\": " + u(a.num_heads) +
               ", \"num_kv_heads\": " + u(a.num_kv_heads) + ", \"head_dim\": " + u(a.head_dim) +
               ", \"moe_top_k\": " + u(a.moe_top_k) +
               ", \"rope_theta\": " + std::to_string(a.rope_theta) + ", \"model_type\": \"" + name +
               "\"}";
    }
    out += "}\n";
    std::fputs(out.c_str(), stdout);
    std::fclose(f);
    return 0;
}
