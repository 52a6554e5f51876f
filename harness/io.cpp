#include "io.hpp"

#include <common.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace smoe::harness {

namespace {
std::string errno_text(const std::string& what, const std::string& name) {
    return name + ": " + what + ": " + std::strerror(errno);
}
}  // namespace

size_t pread_some(int fd, void* buf, size_t len, uint64_t offset, const std::string& name) {
    auto* p = static_cast<uint8_t*>(buf);
    size_t done = 0;
    while (done < len) {
        ssize_t n = ::pread(fd, p + done, len - done, static_cast<off_t>(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            throw IoError(errno_text("read of " + std::to_string(len) + " bytes at offset " +
                                         std::to_string(offset) + " failed",
                                     name));
        }
        if (n == 0) break;  // end of file
        done += static_cast<size_t>(n);
    }
    return done;
}

void pread_full(int fd, void* buf, size_t len, uint64_t offset, const std::string& name) {
    if (pread_some(fd, buf, len, offset, name) != len)
        throw IoError(name + ": unexpected end of file reading " + std::to_string(len) +
                      " bytes at offset " + std::to_string(offset));
}

void FreeDeleter::operator()(void* p) const noexcept { std::free(p); }

AlignedBuffer::AlignedBuffer(size_t len) {
    size_ = static_cast<size_t>(round_up(len == 0 ? 1 : len, PAGE_SIZE));
    void* p = std::aligned_alloc(PAGE_SIZE, size_);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, size_);
    ptr_.reset(static_cast<uint8_t*>(p));
}

std::vector<uint8_t> read_whole_file(const std::string& path, size_t max_len) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(errno_text("cannot open", path));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) > max_len) {
        ::close(fd);
        throw IoError(path + ": not a regular file of at most " + std::to_string(max_len) +
                      " bytes");
    }
    std::vector<uint8_t> data(static_cast<size_t>(st.st_size));
    try {
        pread_full(fd, data.data(), data.size(), 0, path);
    } catch (...) {
        ::close(fd);
        throw;
    }
    ::close(fd);
    return data;
}

void write_whole_file(const std::string& path, const void* data, size_t len) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw IoError(errno_text("cannot create", path));
    const auto* p = static_cast<const uint8_t*>(data);
    size_t done = 0;
    while (done < len) {
        ssize_t n = ::write(fd, p + done, len - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            int saved = errno;
            ::close(fd);
            errno = saved;
            throw IoError(errno_text("write failed", path));
        }
        done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0) throw IoError(errno_text("close failed", path));
}

double now_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace smoe::harness
