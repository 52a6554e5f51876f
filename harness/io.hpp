// File I/O helpers: full preads, page-aligned buffers, whole-file read/write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace smoe::harness {

/// The file cannot be read (or written) at all: exit status 2.
struct IoError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// Reads exactly `len` bytes at `offset`, retrying short reads and EINTR.
/// Throws IoError on an error or on end of file (`what` names `name`).
void pread_full(int fd, void* buf, size_t len, uint64_t offset, const std::string& name);

/// Like pread_full but returns the bytes read before end of file (for O_DIRECT tails).
size_t pread_some(int fd, void* buf, size_t len, uint64_t offset, const std::string& name);

struct FreeDeleter {
    void operator()(void* p) const noexcept;
};

/// A zero-initialised buffer of at least `len` bytes starting on a 16 KiB page, as
/// an SSD-streaming engine (and O_DIRECT) needs. `len` is rounded up to whole pages.
class AlignedBuffer {
public:
    AlignedBuffer() = default;
    explicit AlignedBuffer(size_t len);
    uint8_t* data() const { return ptr_.get(); }
    size_t size() const { return size_; }

private:
    std::unique_ptr<uint8_t, FreeDeleter> ptr_;
    size_t size_ = 0;
};

/// Whole-file helpers for the small float32 input/output files.
std::vector<uint8_t> read_whole_file(const std::string& path, size_t max_len);
void write_whole_file(const std::string& path, const void* data, size_t len);

/// Monotonic clock in seconds.
double now_seconds();

}  // namespace smoe::harness
