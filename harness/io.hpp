// File I/O helpers: checked preads, inputs that must be regular files, outputs written
// atomically without following links, page-aligned buffers.
#pragma once

#include <exit_codes.hpp>

#include <sys/types.h>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace smoe::harness {

/// A failure with a file, one line naming it. `kind` is its entry in the exit-code table
/// shared with the Python CLI (codegen/exit_codes.yaml): by default `unreadable` (exit 2),
/// an input that cannot be opened or stat'ed or is not a regular file, as Python's
/// UnreadableInput. `err` is the errno behind it, when there is one.
struct IoError : std::runtime_error {
    explicit IoError(const std::string& what, int e = 0,
                     const exit_codes::ExitCode& k = exit_codes::UNREADABLE)
        : std::runtime_error(what), err(e), kind(&k) {}
    int err;
    const exit_codes::ExitCode* kind;
};

/// An input that fails or shrinks while it is read (`failed`, exit 1: Python's pread_exact
/// raises the base SmoeError).
struct ReadFailed : IoError {
    explicit ReadFailed(const std::string& what, int e = 0)
        : IoError(what, e, exit_codes::FAILED) {}
};

/// An input that was read and is refused (`refused`, exit 1: Python's RefusedInput).
struct RefusedInput : IoError {
    explicit RefusedInput(const std::string& what) : IoError(what, 0, exit_codes::REFUSED) {}
};

/// An output that cannot be written or put in place, or that would replace an input or
/// something that is not a regular file (`write_failed`, exit 1: Python's WriteFailed).
struct WriteFailed : IoError {
    explicit WriteFailed(const std::string& what, int e = 0)
        : IoError(what, e, exit_codes::WRITE_FAILED) {}
};

/// Reads exactly `len` bytes at `offset`, retrying short reads and EINTR. Throws
/// ReadFailed on an error ("NAME: cannot read N bytes at offset X: reason") or at end of
/// file ("NAME: file shrank while reading: N bytes at offset X, got M").
void pread_full(int fd, void* buf, size_t len, uint64_t offset, const std::string& name);

/// Like pread_full but returns the bytes read before end of file (for O_DIRECT tails).
size_t pread_some(int fd, void* buf, size_t len, uint64_t offset, const std::string& name);

/// A file descriptor closed on destruction.
class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    Fd& operator=(Fd&& o) noexcept;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd();
    int get() const { return fd_; }
    int release() { return std::exchange(fd_, -1); }

private:
    int fd_ = -1;
};

/// Device and inode: what makes two paths the same file.
struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
};

/// An input opened with O_RDONLY|O_NONBLOCK|O_CLOEXEC and fstat'ed: anything but a regular
/// file (a FIFO, a device, a folder) is refused at once, "PATH: not a regular file (a
/// FIFO)", so nothing can block; O_NONBLOCK is then cleared.
struct Input {
    Fd fd;
    FileId id;
    uint64_t size = 0;
};
Input open_input(const std::string& path);

/// Refuses (WriteFailed) an output that exists and is, through symlinks or hard links, the
/// same file as one of the inputs: "OUT: the output is the input IN itself; refusing to
/// overwrite an input".
void refuse_same_file(const std::string& out,
                      const std::vector<std::pair<std::string, FileId>>& inputs);

/// The owner, group and mode of an output a new file replaces.
struct Replaced {
    uid_t uid = 0;
    gid_t gid = 0;
    mode_t mode = 0;
};

/// lstat of an output about to be replaced: a regular file there gives its owner, group and
/// mode; nothing there (or a symlink, replaced, never followed) gives nullopt; anything else
/// (a FIFO, a device, a folder) is refused (WriteFailed): "OUT: exists and is not a regular
/// file (a FIFO); refusing to replace it", so a rename never lands on it.
std::optional<Replaced> existing_output(const std::string& path);

/// Gives the new file `fd` the owner, group and mode of the one it replaces (nothing for
/// nullopt: the umask's mode stays). An owner or group this process may not give is left.
void take_over(int fd, const std::optional<Replaced>& replaced);

/// A file written under a temporary name beside `path` (created O_CREAT|O_EXCL|
/// O_NOFOLLOW|O_CLOEXEC) and renamed onto `path` when complete, so a symlink planted under
/// the final name is replaced, never followed. Until rename nothing appears under `path`;
/// the destructor removes an uncommitted temporary file, and so does a signal
/// (handle_signals). What is at `path` is checked
/// (existing_output) before the temporary file is created and again just before the
/// rename; the new file takes over the owner, group and mode of the one it replaces.
class AtomicFile {
public:
    explicit AtomicFile(std::string path);
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    ~AtomicFile();

    /// Appends all of `data` (short writes continued, EINTR retried); errors name `path`.
    void write(const void* data, size_t len);
    /// fsync and close the temporary file.
    void finish();
    /// Renames the finished temporary file onto `path`.
    void rename_into_place();
    /// finish, rename, fsync the folder.
    void commit();

    const std::string& path() const { return path_; }
    const std::string& dir() const { return dir_; }

private:
    std::string path_, dir_, tmp_;
    Fd fd_;
    uint64_t written_ = 0;
    bool renamed_ = false;
    int slot_ = -1;  // this temporary file's place in the list a signal removes
};

/// SIGINT and SIGTERM (and SIGHUP) end the process as the exit-code table says: every
/// AtomicFile's temporary file is removed, one line "smoe-stream: interrupted" (or
/// "terminated") goes to stderr, and the status is `interrupted` (130) or `terminated` (143),
/// so that no signal leaves a temporary file behind. SIGXFSZ is ignored: a write past the
/// file size limit (`ulimit -f`) is then an EFBIG WriteFailed. Called once, first thing in main.
void handle_signals();

/// fsync a folder so that a rename in it is durable.
void fsync_dir(const std::string& dir);

/// Writes a whole file atomically (AtomicFile::commit).
void write_whole_file(const std::string& path, const void* data, size_t len);

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

/// Reads a whole regular file of at most `max_len` bytes (opened with open_input; a larger
/// one is RefusedInput).
std::vector<uint8_t> read_whole_file(const std::string& path, size_t max_len);
/// The same on an input already opened.
std::vector<uint8_t> read_whole_file(const Input& in, const std::string& path, size_t max_len);

/// Monotonic clock in seconds.
double now_seconds();

}  // namespace smoe::harness
