// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final XOR
// 0xFFFFFFFF): crc32c("123456789") = 0xE3069283. SSE4.2 `crc32` instructions when the
// CPU has them (picked at run time), else a portable slicing-by-8 table loop.
#pragma once

#include <cstddef>
#include <cstdint>

namespace smoe::harness {

/// Continues `crc` (the CRC of the bytes before, 0 for none) over data[0..len), like
/// zlib's crc32(): crc32c_update(crc32c_update(0, a), b) is the CRC of a followed by b.
uint32_t crc32c_update(uint32_t crc, const void* data, size_t len);

/// The two implementations behind crc32c_update, for the tests.
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t len);
/// Only valid when crc32c_have_sse42().
uint32_t crc32c_sse42(uint32_t crc, const void* data, size_t len);
bool crc32c_have_sse42();

}  // namespace smoe::harness
