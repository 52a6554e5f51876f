// Exact IEEE-754 binary16 -> binary32 widening by bit manipulation.
//
// Every binary16 value (normals, subnormals, +-0, +-inf, NaN with its payload) is
// exactly representable in binary32, so the conversion never rounds. Done with
// integer operations only, so it does not depend on _Float16 or F16C support.
#pragma once

#include <cstdint>
#include <cstring>

namespace smoe::harness {

inline float fp16_to_f32(uint16_t h) noexcept {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (mant << 13);  // inf, or NaN keeping its payload
    } else if (exp != 0) {
        bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);  // normal: rebias
    } else if (mant == 0) {
        bits = sign;  // +-0
    } else {
        // Subnormal: mant * 2^-24. Normalise: shift the leading 1 up to bit 10.
        uint32_t e = 127 - 15 + 1;
        uint32_t m = mant;
        while ((m & 0x400u) == 0) {
            m <<= 1;
            --e;
        }
        bits = sign | (e << 23) | ((m & 0x3FFu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

/// Reads a little-endian binary16 from unaligned bytes and widens it.
inline float load_fp16(const uint8_t* p) noexcept {
    return fp16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

/// A binary16 is finite unless its exponent field is all ones (inf / NaN).
inline bool fp16_is_finite(uint16_t h) noexcept {
    return (h & 0x7C00u) != 0x7C00u;
}

}  // namespace smoe::harness
