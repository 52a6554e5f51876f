#include "io.hpp"

#include <common.hpp>

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace smoe::harness {

namespace {

std::string why(int err) {
    return std::strerror(err);
}

const char* kind(mode_t mode) {
    if (S_ISDIR(mode))
        return "a folder";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    return "not a file";
}

/// Eight random hex digits for a temporary name (getrandom, else pid and clock).
std::string random_suffix() {
    uint32_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r)) {
        timespec ts{};
        clock_gettime(CLOCK_REALTIME, &ts);
        r = static_cast<uint32_t>(ts.tv_nsec) ^ (static_cast<uint32_t>(getpid()) << 12);
    }
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", r);
    return buf;
}

// ---- temporary files that a signal removes -----------------------------------------------
// The handler may only call async-signal-safe functions: it reads a fixed table of paths,
// each published by a flag set after its path is written and cleared before it is reused.
constexpr int MAX_TEMPORARIES = 8;  // dequant holds three at once
char g_temporary[MAX_TEMPORARIES][PATH_MAX];
std::atomic<bool> g_temporary_used[MAX_TEMPORARIES];
static_assert(std::atomic<bool>::is_always_lock_free);

/// Blocks the signals that end the process while it lives (this thread: the writer's), so
/// that a temporary file is never created, renamed or removed without its table entry.
class SignalsHeld {
public:
    SignalsHeld() {
        sigset_t set;
        sigemptyset(&set);
        for (int sig : {SIGINT, SIGTERM, SIGHUP})
            sigaddset(&set, sig);
        pthread_sigmask(SIG_BLOCK, &set, &old_);
    }
    ~SignalsHeld() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
    SignalsHeld(const SignalsHeld&) = delete;
    SignalsHeld& operator=(const SignalsHeld&) = delete;

private:
    sigset_t old_;
};

/// The slot of `path` in the table, or -1 if the table is full or the path too long (the
/// file is then only removed by the destructor).
int register_temporary(const std::string& path) {
    if (path.size() >= PATH_MAX)
        return -1;
    for (int k = 0; k < MAX_TEMPORARIES; ++k)
        if (!g_temporary_used[k].load()) {
            std::memcpy(g_temporary[k], path.c_str(), path.size() + 1);
            g_temporary_used[k].store(true);
            return k;
        }
    return -1;
}

void unregister_temporary(int& slot) {
    if (slot >= 0)
        g_temporary_used[slot].store(false);
    slot = -1;
}

extern "C" void on_signal(int sig) {
    for (int k = 0; k < MAX_TEMPORARIES; ++k)
        if (g_temporary_used[k].load())
            (void)::unlink(g_temporary[k]);
    const bool interrupted = sig == SIGINT;
    const char* line = interrupted ? "smoe-stream: interrupted\n" : "smoe-stream: terminated\n";
    (void)!::write(STDERR_FILENO, line, std::strlen(line));
    ::_exit(interrupted ? exit_codes::INTERRUPTED.status : exit_codes::TERMINATED.status);
}

}  // namespace

void handle_signals() {
    // A write past `ulimit -f` fails with EFBIG (one line, write_failed, the temporary file
    // removed) instead of SIGXFSZ killing the process with its temporary file left.
    ::signal(SIGXFSZ, SIG_IGN);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP})
        sigaddset(&sa.sa_mask, sig);  // one handler at a time
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
        struct sigaction old {};
        // A signal ignored by the parent (nohup, a background job) stays ignored.
        if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler != SIG_IGN)
            ::sigaction(sig, &sa, nullptr);
    }
}

// ---- reading ----------------------------------------------------------------------------

size_t pread_some(int fd, void* buf, size_t len, uint64_t offset, const std::string& name) {
    auto* p = static_cast<uint8_t*>(buf);
    size_t done = 0;
    while (done < len) {
        ssize_t n = ::pread(fd, p + done, len - done, static_cast<off_t>(offset + done));
        if (n < 0) {
            const int err = errno;
            if (err == EINTR)
                continue;
            throw ReadFailed(name + ": cannot read " + std::to_string(len) + " bytes at offset " +
                                 std::to_string(offset) + ": " + why(err),
                             err);
        }
        if (n == 0)
            break;  // end of file
        done += static_cast<size_t>(n);
    }
    return done;
}

void pread_full(int fd, void* buf, size_t len, uint64_t offset, const std::string& name) {
    // Every caller knows the file's size from fstat, so an end of file is a file that shrank.
    if (const size_t got = pread_some(fd, buf, len, offset, name); got != len)
        throw ReadFailed(name + ": file shrank while reading: " + std::to_string(len) +
                         " bytes at offset " + std::to_string(offset) + ", got " +
                         std::to_string(got));
}

Fd& Fd::operator=(Fd&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0)
            ::close(fd_);
        fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
}

Fd::~Fd() {
    if (fd_ >= 0)
        ::close(fd_);
}

Input open_input(const std::string& path) {
    Input in;
    in.fd = Fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (in.fd.get() < 0) {
        const int err = errno;
        throw IoError(path + ": cannot open: " + why(err), err);
    }
    struct stat st {};
    if (::fstat(in.fd.get(), &st) != 0)
        throw IoError(path + ": cannot stat: " + why(errno));
    if (!S_ISREG(st.st_mode))
        throw IoError(path + ": not a regular file (" + kind(st.st_mode) + ")");
    const int flags = ::fcntl(in.fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(in.fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
        throw IoError(path + ": cannot clear O_NONBLOCK: " + why(errno));
    in.id = FileId{st.st_dev, st.st_ino};
    in.size = static_cast<uint64_t>(st.st_size);
    return in;
}

void refuse_same_file(const std::string& out,
                      const std::vector<std::pair<std::string, FileId>>& inputs) {
    struct stat st {};
    if (::stat(out.c_str(), &st) != 0)
        return;  // absent or unreachable: not an input
    for (const auto& [name, id] : inputs)
        if (st.st_dev == id.dev && st.st_ino == id.ino)
            throw WriteFailed(out + ": the output is the input " + name +
                              " itself; refusing to overwrite an input");
}

std::vector<uint8_t> read_whole_file(const Input& in, const std::string& path, size_t max_len) {
    if (in.size > max_len)
        throw RefusedInput(path + ": " + std::to_string(in.size) + " bytes, more than the " +
                           std::to_string(max_len) + " accepted");
    std::vector<uint8_t> data(static_cast<size_t>(in.size));
    pread_full(in.fd.get(), data.data(), data.size(), 0, path);
    return data;
}

std::vector<uint8_t> read_whole_file(const std::string& path, size_t max_len) {
    return read_whole_file(open_input(path), path, max_len);
}

// ---- writing ----------------------------------------------------------------------------

std::optional<Replaced> existing_output(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || S_ISLNK(st.st_mode))
        return std::nullopt;  // absent or out of reach (creating it says why), or a link
    if (!S_ISREG(st.st_mode))
        throw WriteFailed(path + ": exists and is not a regular file (" + kind(st.st_mode) +
                          "); refusing to replace it");
    return Replaced{st.st_uid, st.st_gid, static_cast<mode_t>(st.st_mode & 07777)};
}

void take_over(int fd, const std::optional<Replaced>& replaced) {
    if (!replaced)
        return;
    // chown before chmod (chown clears set-id bits); the group alone where the owner is not ours
    if (::fchown(fd, replaced->uid, replaced->gid) != 0)
        (void)::fchown(fd, static_cast<uid_t>(-1), replaced->gid);
    (void)::fchmod(fd, replaced->mode);  // a filesystem without modes: the file is still ours
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
    const size_t slash = path_.rfind('/');
    const std::string base = slash == std::string::npos ? path_ : path_.substr(slash + 1);
    dir_ = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
    if (base.empty() || base == "." || base == "..")
        throw WriteFailed(path_ + ": cannot create: not a file name");
    const std::string prefix = (slash == std::string::npos ? "" : path_.substr(0, slash + 1));
    const std::optional<Replaced> replaced = existing_output(path_);
    for (int attempt = 0;; ++attempt) {
        tmp_ = prefix + "." + base + "." + random_suffix() + ".tmp";
        int err = 0;
        {
            const SignalsHeld held;  // created and listed for the signal handler at once
            fd_ = Fd(
                ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666));
            err = errno;
            if (fd_.get() >= 0)
                slot_ = register_temporary(tmp_);
        }
        if (fd_.get() >= 0) {
            take_over(fd_.get(), replaced);  // never wider than the file it replaces
            return;
        }
        if (err != EEXIST || attempt == 100) {
            tmp_.clear();
            throw WriteFailed(path_ + ": cannot create: " + why(err), err);
        }
    }
}

AtomicFile::~AtomicFile() {
    fd_ = Fd();
    const SignalsHeld held;
    if (!renamed_ && !tmp_.empty())
        ::unlink(tmp_.c_str());
    unregister_temporary(slot_);
}

void AtomicFile::write(const void* data, size_t len) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t done = 0; done < len;) {
        const ssize_t n =
            ::pwrite(fd_.get(), p + done, len - done, static_cast<off_t>(written_ + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            throw WriteFailed(path_ + ": cannot write " + std::to_string(len - done) +
                              " bytes at offset " + std::to_string(written_ + done) + ": " +
                              (n < 0 ? why(errno) : std::string("the write made no progress")));
        done += static_cast<size_t>(n);
    }
    written_ += len;
}

void AtomicFile::finish() {
    if (fd_.get() < 0)
        return;
    if (::fsync(fd_.get()) != 0)
        throw WriteFailed(path_ + ": cannot flush to disk (fsync): " + why(errno));
    if (::close(fd_.release()) != 0)
        throw WriteFailed(path_ + ": cannot close: " + why(errno));
}

void AtomicFile::rename_into_place() {
    finish();
    if (const std::optional<Replaced> replaced = existing_output(path_)) {  // checked again
        Fd fd(::open(tmp_.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
        if (fd.get() >= 0)
            take_over(fd.get(), replaced);
    }
    int err = 0;
    {
        const SignalsHeld held;  // renamed and struck off the signal handler's list at once
        if (::rename(tmp_.c_str(), path_.c_str()) == 0) {
            renamed_ = true;
            unregister_temporary(slot_);
        } else {
            err = errno;
        }
    }
    if (!renamed_) {
        const std::string name = tmp_.substr(tmp_.rfind('/') + 1);
        throw WriteFailed(path_ + ": cannot rename " + name + " onto it: " + why(err));
    }
}

void AtomicFile::commit() {
    rename_into_place();
    fsync_dir(dir_);
}

void fsync_dir(const std::string& dir) {
    Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (fd.get() < 0)
        throw WriteFailed(dir + ": cannot open the folder to flush it: " + why(errno));
    // EINVAL: a filesystem that cannot fsync folders (the rename is then as durable as it gets).
    if (::fsync(fd.get()) != 0 && errno != EINVAL)
        throw WriteFailed(dir + ": cannot flush to disk (fsync): " + why(errno));
}

void write_whole_file(const std::string& path, const void* data, size_t len) {
    AtomicFile f(path);
    f.write(data, len);
    f.commit();
}

// ---- memory and time ----------------------------------------------------------------------

void FreeDeleter::operator()(void* p) const noexcept {
    std::free(p);
}

AlignedBuffer::AlignedBuffer(size_t len) {
    size_ = static_cast<size_t>(round_up(len == 0 ? 1 : len, PAGE_SIZE));
    void* p = std::aligned_alloc(PAGE_SIZE, size_);
    if (p == nullptr)
        throw std::bad_alloc();
    std::memset(p, 0, size_);
    ptr_.reset(static_cast<uint8_t*>(p));
}

double now_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace smoe::harness
