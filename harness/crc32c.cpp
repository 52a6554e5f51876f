#include "crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace smoe::harness {

namespace {

constexpr uint32_t POLY = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

/// table[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
constexpr std::array<std::array<uint32_t, 256>, 8> make_tables() {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t b = 0; b < 256; ++b) {
        uint32_t c = b;
        for (int k = 0; k < 8; ++k)
            c = (c >> 1) ^ (POLY & (0u - (c & 1u)));
        t[0][b] = c;
    }
    for (size_t k = 1; k < 8; ++k)
        for (uint32_t b = 0; b < 256; ++b)
            t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    return t;
}
constexpr auto TABLES = make_tables();

}  // namespace

uint32_t crc32c_portable(uint32_t crc, const void* data, size_t len) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint32_t c = ~crc;
    for (; len >= 8; p += 8, len -= 8) {
        uint32_t lo, hi;
        std::memcpy(&lo, p, 4);
        std::memcpy(&hi, p + 4, 4);
        lo ^= c;  // little-endian host (asserted in vault.cpp)
        c = TABLES[7][lo & 0xFF] ^ TABLES[6][(lo >> 8) & 0xFF] ^ TABLES[5][(lo >> 16) & 0xFF] ^
            TABLES[4][lo >> 24] ^ TABLES[3][hi & 0xFF] ^ TABLES[2][(hi >> 8) & 0xFF] ^
            TABLES[1][(hi >> 16) & 0xFF] ^ TABLES[0][hi >> 24];
    }
    for (; len > 0; ++p, --len)
        c = (c >> 8) ^ TABLES[0][(c ^ *p) & 0xFF];
    return ~c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const void* data,
                                                        size_t len) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint64_t c = ~crc;
    for (; len > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; ++p, --len)
        c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
    }
    for (; len > 0; ++p, --len)
        c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
    return ~static_cast<uint32_t>(c);
}

bool crc32c_have_sse42() {
    static const bool have = __builtin_cpu_supports("sse4.2");
    return have;
}
#else
uint32_t crc32c_sse42(uint32_t crc, const void* data, size_t len) {
    return crc32c_portable(crc, data, len);
}

bool crc32c_have_sse42() {
    return false;
}
#endif

uint32_t crc32c_update(uint32_t crc, const void* data, size_t len) {
    return crc32c_have_sse42() ? crc32c_sse42(crc, data, len) : crc32c_portable(crc, data, len);
}

}  // namespace smoe::harness
