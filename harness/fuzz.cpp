#include "fuzz.hpp"

#include "io.hpp"
#include "json.hpp"
#include "vault.hpp"

#include <common.hpp>

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>

namespace smoe::harness {

namespace {

/// Applies 1-3 random mutations to `data`, biased towards the metadata before
/// data_offset where every byte matters; returns a description of what was done.
std::string mutate(std::vector<uint8_t>& data, std::mt19937_64& rng) {
    const uint64_t size = data.size();
    const uint64_t u32s[] = {0,
                             1,
                             2,
                             3,
                             4,
                             7,
                             8,
                             15,
                             16,
                             17,
                             31,
                             63,
                             64,
                             65,
                             127,
                             128,
                             129,
                             255,
                             256,
                             1000,
                             4095,
                             4096,
                             16383,
                             16384,
                             16385,
                             32768,
                             65535,
                             65536,
                             0x7FFFFFFF,
                             0x80000000,
                             0xFFFFFFFE,
                             0xFFFFFFFF,
                             size,
                             size - 1,
                             size + 1,
                             size / 2,
                             size - PAGE_SIZE};
    const uint64_t u64s[] = {uint64_t{1} << 32,
                             uint64_t{1} << 62,
                             uint64_t{1} << 63,
                             ~uint64_t{0},
                             ~uint64_t{0} - PAGE_SIZE + 1,
                             size * 2,
                             size + PAGE_SIZE};
    std::string what;
    const unsigned n = 1 + rng() % 3;
    for (unsigned m = 0; m < n && !data.empty(); ++m) {
        // The metadata: header, table, descriptors and the arch block after them.
        uint64_t meta = std::min<uint64_t>(data.size(), PAGE_SIZE);
        if (data.size() >= HEADER_SIZE) {
            uint32_t n;
            std::memcpy(&n, data.data() + offsetof(SmoeHeader, total_experts), sizeof n);
            meta =
                std::min<uint64_t>(data.size(), descriptors_end(n) + ARCH_ALIGN + ARCH_BLOCK_SIZE);
        }
        const uint64_t pos = (rng() % 5 ? rng() % meta : rng() % data.size());
        char buf[96];
        switch (rng() % 6) {
            case 0:
            case 1: {  // flip bits of one byte
                const uint8_t x = static_cast<uint8_t>(1 + rng() % 255);
                data[pos] ^= x;
                std::snprintf(buf, sizeof buf, "xor@%llu=%u ", (unsigned long long)pos, x);
                break;
            }
            case 2: {  // a small-int / boundary value into a 4-byte field
                const uint64_t at = pos & ~uint64_t{3};
                const uint32_t val = static_cast<uint32_t>(u32s[rng() % std::size(u32s)]);
                if (at + 4 <= data.size())
                    std::memcpy(data.data() + at, &val, 4);
                std::snprintf(buf, sizeof buf, "u32@%llu=%u ", (unsigned long long)at, val);
                break;
            }
            case 3: {  // a boundary value into an 8-byte field (4-aligned: u64 fields sit at
                       // 0 mod 8 in the header and table, 4 mod 8 in descriptors)
                const uint64_t at = pos & ~uint64_t{3};
                const uint64_t val =
                    rng() % 2 ? u64s[rng() % std::size(u64s)] : u32s[rng() % std::size(u32s)];
                if (at + 8 <= data.size())
                    std::memcpy(data.data() + at, &val, 8);
                std::snprintf(buf, sizeof buf, "u64@%llu=%llu ", (unsigned long long)at,
                              (unsigned long long)val);
                break;
            }
            case 4: {  // truncate: inside the header, the metadata, or anywhere
                const uint64_t r = rng() % 4;
                const uint64_t len = r == 0   ? rng() % (HEADER_SIZE + 8)
                                     : r == 1 ? rng() % (meta + 1)
                                              : rng() % (data.size() + 1);
                data.resize(len);
                std::snprintf(buf, sizeof buf, "truncate=%llu ", (unsigned long long)len);
                break;
            }
            default: {  // copy a 48-byte span (an entry, a descriptor and a bit) elsewhere
                const uint64_t src = rng() % meta, dst = rng() % meta;
                const uint64_t len = std::min<uint64_t>({48, data.size() - src, data.size() - dst});
                std::memmove(data.data() + dst, data.data() + src, len);
                std::snprintf(buf, sizeof buf, "copy%llu->%llu ", (unsigned long long)src,
                              (unsigned long long)dst);
                break;
            }
        }
        what += buf;
    }
    return what;
}

/// Starts a child that checks the vault in `fd` (with --deep) under alarm(); the
/// child's exit status is 0, 1 or 2 like `check`.
pid_t spawn_check(int fd, unsigned timeout_s) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0)
        throw IoError(std::string("fork failed: ") + std::strerror(errno), 0, exit_codes::INTERNAL);
    if (pid == 0) {
        alarm(timeout_s);
        int code = 0;
        try {
            Vault v;
            v.open_fd(dup(fd), "fuzz");
            v.deep_check();
        } catch (const InvalidVault&) {
            code = 1;
        } catch (const IoError&) {
            code = 2;
        }
        std::exit(code);  // exit (not _exit) so LeakSanitizer runs
    }
    return pid;
}

/// One input in flight: its memfd stays untouched until its child has been reaped.
struct Slot {
    int fd = -1;
    pid_t pid = 0;
    uint64_t k = 0;
    size_t base = 0;
    std::string what;
};

struct Failure {
    uint64_t k;
    size_t base;
    std::string what, status;
};

}  // namespace

int run_fuzz(const FuzzOptions& o, const std::vector<std::string>& files) {
    std::vector<std::vector<uint8_t>> bases;
    for (const auto& f : files)
        bases.push_back(read_whole_file(f, size_t{64} << 20));
    std::vector<Slot> slots(std::max(1u, o.jobs));
    for (Slot& sl : slots) {
        sl.fd = memfd_create("smoe-fuzz", MFD_CLOEXEC);
        if (sl.fd < 0)
            throw IoError(std::string("memfd_create failed: ") + std::strerror(errno), 0,
                          exit_codes::INTERNAL);
    }
    uint64_t exits[3] = {0, 0, 0};
    std::vector<Failure> failures;

    // Waits for one child and files its outcome; returns its slot.
    auto reap = [&]() -> Slot& {
        int st = 0;
        pid_t pid;
        while ((pid = waitpid(-1, &st, 0)) < 0 && errno == EINTR) {
        }
        if (pid < 0)
            throw IoError(std::string("waitpid failed: ") + std::strerror(errno), 0,
                          exit_codes::INTERNAL);
        Slot* sl = &slots[0];
        for (Slot& c : slots)
            if (c.pid == pid)
                sl = &c;
        sl->pid = 0;
        if (WIFEXITED(st) && WEXITSTATUS(st) <= 2) {
            ++exits[WEXITSTATUS(st)];
            return *sl;
        }
        failures.push_back({sl->k, sl->base, sl->what,
                            WIFEXITED(st)             ? "exit " + std::to_string(WEXITSTATUS(st))
                            : WTERMSIG(st) == SIGALRM ? "timeout"
                                                      : "signal " + std::to_string(WTERMSIG(st))});
        if (!o.save_dir.empty()) {
            struct stat sb {};
            std::vector<uint8_t> bytes;
            if (fstat(sl->fd, &sb) == 0)
                bytes.resize(static_cast<size_t>(sb.st_size));
            pread_full(sl->fd, bytes.data(), bytes.size(), 0, "memfd");
            write_whole_file(o.save_dir + "/case-" + std::to_string(sl->k) + ".smoe", bytes.data(),
                             bytes.size());
        }
        return *sl;
    };

    std::mt19937_64 rng(o.seed);
    // One buffer for all cases: freed memory would sit in ASan's quarantine and make
    // every fork copy more page tables.
    std::vector<uint8_t> data;
    size_t largest = 0;
    for (const auto& b : bases)
        largest = std::max(largest, b.size());
    data.reserve(largest);
    size_t running = 0;
    for (uint64_t k = 0; k < o.count && !bases.empty(); ++k) {
        Slot* sl = nullptr;
        for (Slot& c : slots)
            if (c.pid == 0)
                sl = &c;
        if (sl == nullptr) {
            sl = &reap();
            --running;
        }
        sl->k = k;
        sl->base = k % bases.size();
        data.assign(bases[sl->base].begin(), bases[sl->base].end());
        sl->what = mutate(data, rng);
        if (ftruncate(sl->fd, 0) != 0 ||
            (!data.empty() &&
             pwrite(sl->fd, data.data(), data.size(), 0) != static_cast<ssize_t>(data.size())))
            throw IoError(std::string("memfd write failed: ") + std::strerror(errno), 0,
                          exit_codes::INTERNAL);
        sl->pid = spawn_check(sl->fd, o.timeout_s);
        ++running;
    }
    for (; running > 0; --running)
        reap();
    for (Slot& sl : slots)
        ::close(sl.fd);

    std::sort(failures.begin(), failures.end(),
              [](const Failure& a, const Failure& b) { return a.k < b.k; });
    JsonWriter j;
    j.begin_object().member("seed", o.seed).member("runs", o.count);
    j.key("exit_codes").begin_object();
    for (int c = 0; c < 3; ++c)
        j.member(std::to_string(c), exits[c]);
    j.end_object();
    j.member("failed", static_cast<uint64_t>(failures.size())).key("failures").begin_array();
    for (const Failure& f : failures)
        j.begin_object()
            .member("case", f.k)
            .member("base", files[f.base])
            .member("mutations", f.what)
            .member("status", f.status)
            .end_object();
    j.end_array().end_object();
    std::printf("%s\n", j.str().c_str());
    return failures.empty() ? 0 : 1;
}

}  // namespace smoe::harness
