#include "bench.hpp"

#include "io.hpp"
#include "json.hpp"
#include "quant.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

namespace smoe::harness {

namespace {

/// A descriptor for the benchmark's reads: O_DIRECT if asked and the filesystem
/// accepts it (some refuse at open, some only at the first read), else buffered.
/// Either way it reads the very file that was checked: the buffered one is a dup of the
/// vault's descriptor, the O_DIRECT one is reopened without blocking and must have the
/// same device and inode.
struct Reader {
    Fd fd;
    bool direct = false;
};

void open_reader(const Vault& v, bool want_direct, Reader& r) {
    if (want_direct) {
        Fd fd(::open(v.name.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK));
        struct stat st {};
        if (fd.get() >= 0 && ::fstat(fd.get(), &st) == 0 &&
            (st.st_dev != v.id.dev || st.st_ino != v.id.ino))
            throw IoError(v.name +
                          ": replaced since it was checked; refusing to read another file");
        if (fd.get() >= 0 && ::fcntl(fd.get(), F_SETFL, O_DIRECT) == 0) {
            AlignedBuffer probe(PAGE_SIZE);
            const uint64_t at = v.experts.empty() ? 0 : v.experts[0].byte_offset;
            if (::pread(fd.get(), probe.data(), PAGE_SIZE, static_cast<off_t>(at)) >= 0) {
                r.fd = std::move(fd);
                r.direct = true;
                return;
            }
        }
        std::fprintf(stderr, "smoe-stream: %s: O_DIRECT refused (%s); using buffered reads\n",
                     v.name.c_str(), std::strerror(errno));
    }
    r.fd = Fd(::fcntl(v.fd, F_DUPFD_CLOEXEC, 0));
    if (r.fd.get() < 0)
        throw IoError(v.name + ": cannot duplicate the descriptor: " + std::strerror(errno));
}

/// The order in which experts are read. seq: table entries in file order. random:
/// token after token, for every layer K distinct random experts of that layer, as
/// the router of a top-K MoE would ask for them.
std::vector<uint32_t> make_jobs(const Vault& v, bool random, unsigned k, uint64_t seed) {
    std::vector<uint32_t> jobs;
    if (!random) {
        for (uint32_t i = 0; i < v.experts.size(); ++i)
            jobs.push_back(i);
        std::stable_sort(jobs.begin(), jobs.end(), [&](uint32_t a, uint32_t b) {
            return v.experts[a].byte_offset < v.experts[b].byte_offset;
        });
        return jobs;
    }
    std::vector<std::vector<uint32_t>> layers;  // the table is sorted by layer
    for (uint32_t i = 0; i < v.experts.size(); ++i) {
        if (i == 0 || v.experts[i].layer_id != v.experts[i - 1].layer_id)
            layers.emplace_back();
        layers.back().push_back(i);
    }
    std::mt19937_64 rng(seed);
    do {  // whole tokens, at least 65536 reads' worth
        for (auto& layer : layers) {
            const size_t pick = std::min<size_t>(k, layer.size());
            for (size_t j = 0; j < pick; ++j) {  // partial Fisher-Yates
                std::swap(layer[j], layer[j + rng() % (layer.size() - j)]);
                jobs.push_back(layer[j]);
            }
        }
    } while (jobs.size() < (1u << 16));
    return jobs;
}

double percentile(std::vector<float>& v, double q) {
    if (v.empty())
        return 0;
    const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
    std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
    return v[k];
}

void sleep_for(double s) {
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

struct Stream {
    uint64_t reads = 0, bytes = 0;
    double elapsed = 0;
    std::vector<float> latency_us;
};

/// N reader threads take expert reads from a shared job counter; each preads a whole
/// padded blob (16 KiB-aligned offset and length) into its slot of a ring of
/// page-aligned buffers, as an engine's I/O pool fills staging buffers.
Stream stream(const Vault& v, const Reader& r, const std::vector<uint32_t>& jobs, unsigned threads,
              double seconds) {
    uint64_t max_blob = 0;
    for (const Expert& e : v.experts)
        max_blob = std::max(max_blob, e.padded_size);
    constexpr unsigned SLOTS = 2;  // ring slots per thread
    std::vector<AlignedBuffer> ring;
    for (unsigned k = 0; k < threads * SLOTS; ++k)
        ring.emplace_back(max_blob);

    std::atomic<uint64_t> next{0};
    std::atomic<bool> stop{false};
    std::vector<Stream> per(threads);
    std::mutex err_mu;
    std::string error;
    auto worker = [&](unsigned t) {
        Stream& st = per[t];
        try {
            for (uint64_t k = 0; !stop.load(std::memory_order_relaxed); ++k) {
                const Expert& e = v.experts[jobs[next.fetch_add(1) % jobs.size()]];
                uint8_t* buf = ring[t * SLOTS + k % SLOTS].data();
                const double t0 = now_seconds();
                pread_full(r.fd.get(), buf, e.padded_size, e.byte_offset, v.name);
                st.latency_us.push_back(static_cast<float>((now_seconds() - t0) * 1e6));
                st.bytes += e.padded_size;
                ++st.reads;
            }
        } catch (const std::exception& ex) {
            std::lock_guard<std::mutex> lock(err_mu);
            error = ex.what();
            stop = true;
        }
    };
    const double t0 = now_seconds();
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back(worker, t);
    for (double end = t0 + seconds; !stop && now_seconds() < end;)
        sleep_for(0.005);
    stop = true;
    for (auto& th : pool)
        th.join();
    if (!error.empty())
        throw IoError(error);
    Stream all;
    all.elapsed = now_seconds() - t0;
    for (Stream& st : per) {
        all.reads += st.reads;
        all.bytes += st.bytes;
        all.latency_us.insert(all.latency_us.end(), st.latency_us.begin(), st.latency_us.end());
    }
    return all;
}

/// Raw read bandwidth of the same file with `threads` threads, each reading its own
/// contiguous share in 8 MiB preads (wrapping within the share) for `seconds`, in the
/// reader's mode (page-cached or O_DIRECT).
struct Raw {
    unsigned threads = 0;
    uint64_t bytes = 0;
    double seconds = 0;
    double gb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

constexpr size_t RAW_CHUNK = size_t{8} << 20;

Raw raw_read(const Vault& v, const Reader& r, unsigned threads, double seconds) {
    const uint64_t share = (v.size / threads + RAW_CHUNK - 1) / RAW_CHUNK * RAW_CHUNK;
    std::vector<uint64_t> bytes(threads, 0);
    std::atomic<bool> stop{false};
    std::mutex err_mu;
    std::string error;
    auto worker = [&](unsigned t) {
        try {
            AlignedBuffer buf(RAW_CHUNK);
            const uint64_t lo = std::min<uint64_t>(v.size, t * share);
            const uint64_t hi = std::min<uint64_t>(v.size, lo + share);
            if (hi <= lo)
                return;
            for (uint64_t off = lo; !stop.load(std::memory_order_relaxed);) {
                const size_t want = static_cast<size_t>(std::min<uint64_t>(RAW_CHUNK, hi - off));
                const size_t n = pread_some(r.fd.get(), buf.data(), want, off, v.name);
                bytes[t] += n;
                off = (n < want || off + n >= hi) ? lo : off + n;
            }
        } catch (const std::exception& ex) {
            std::lock_guard<std::mutex> lock(err_mu);
            error = ex.what();
            stop = true;
        }
    };
    const double t0 = now_seconds();
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back(worker, t);
    for (double end = t0 + seconds; !stop && now_seconds() < end;)
        sleep_for(0.005);
    stop = true;
    for (auto& th : pool)
        th.join();
    if (!error.empty())
        throw IoError(error);
    Raw out;
    out.threads = threads;
    out.seconds = now_seconds() - t0;
    for (uint64_t b : bytes)
        out.bytes += b;
    return out;
}

/// Repeats `fn` for at least `seconds`; returns (iterations, elapsed).
template <class Fn>
std::pair<uint64_t, double> repeat(double seconds, Fn fn) {
    uint64_t iters = 0;
    const double t0 = now_seconds();
    double t = t0;
    do {
        fn();
        ++iters;
        t = now_seconds();
    } while (t - t0 < seconds);
    return {iters, t - t0};
}

}  // namespace

std::string run_bench(const Vault& v, const BenchOptions& o) {
    if (v.experts.empty())
        throw IoError(v.name + ": the vault holds no experts to stream");
    const unsigned threads = std::max(1u, o.threads);
    const unsigned k = o.topk ? o.topk : v.arch ? v.arch->moe_top_k : 8;
    const double side = std::max(0.05, o.seconds / 4);
    Reader r;
    open_reader(v, o.direct, r);

    std::vector<Raw> raws;  // the machine's limit for this file: the best of 1, 2, 4 threads
    const double raw_s = std::max(0.05, o.seconds / 3);  // the three take as long as the stream
    for (unsigned n : {1u, 2u, 4u})
        raws.push_back(raw_read(v, r, n, raw_s));
    const Raw* best_raw = &raws[0];
    for (const Raw& x : raws)
        if (x.gb_per_s() > best_raw->gb_per_s())
            best_raw = &x;
    const auto jobs = make_jobs(v, o.random, k, o.seed);
    Stream st = stream(v, r, jobs, threads, o.seconds);

    // Compute: the largest expert, decoded and run from memory.
    const Expert* big = &v.experts[0];
    for (const Expert& e : v.experts)
        if (e.raw_size > big->raw_size)
            big = &e;
    AlignedBuffer blob(big->padded_size);
    pread_full(r.fd.get(), blob.data(), big->padded_size, big->byte_offset, v.name);
    QTensor t[3];
    expert_tensors(*big, blob.data(), v.header.bits, t);
    std::vector<float> x(t[0].cols), y_fast(t[2].rows), y_ref(t[2].rows);
    std::mt19937 rng(static_cast<uint32_t>(o.seed));
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (float& xi : x)
        xi = uni(rng);
    ExpertKernel kernel;
    const auto [fast_n, fast_s] = repeat(side, [&] { kernel.forward(t, x.data(), y_fast.data()); });
    const auto [ref_n, ref_s] =
        repeat(side, [&] { forward_scalar_reference(t, x.data(), y_ref.data()); });
    double diff = 0, norm = 0;
    for (size_t j = 0; j < y_ref.size(); ++j) {
        diff = std::max(diff, std::fabs(static_cast<double>(y_fast[j]) - y_ref[j]));
        norm = std::max(norm, std::fabs(static_cast<double>(y_ref[j])));
    }

    const double gb = 1e9;
    const double fast_gbps =
        static_cast<double>(big->raw_size) * static_cast<double>(fast_n) / fast_s / gb;
    const double ref_gbps =
        static_cast<double>(big->raw_size) * static_cast<double>(ref_n) / ref_s / gb;
    JsonWriter j;
    j.begin_object();
    j.member("vault", v.name).member("file_size", v.size);
    j.member("experts", static_cast<uint64_t>(v.experts.size()));
    j.member("threads", threads).member("direct", r.direct);
    j.member("pattern", o.random ? "random" : "seq").member("topk", k);
    j.key("stream").begin_object();
    j.member("seconds", st.elapsed).member("reads", st.reads).member("bytes", st.bytes);
    j.member("gb_per_s", static_cast<double>(st.bytes) / st.elapsed / gb);
    j.member("experts_per_s", static_cast<double>(st.reads) / st.elapsed);
    j.member("latency_p50_us", percentile(st.latency_us, 0.50));
    j.member("latency_p99_us", percentile(st.latency_us, 0.99));
    j.end_object();
    j.key("sequential_read").begin_object();  // one thread (kept for older readers)
    j.member("seconds", raws[0].seconds).member("bytes", raws[0].bytes);
    j.member("chunk_bytes", static_cast<uint64_t>(RAW_CHUNK));
    j.member("gb_per_s", raws[0].gb_per_s());
    j.end_object();
    j.key("raw_read").begin_object();  // best of 1, 2, 4 threads in this run's read mode
    j.member("chunk_bytes", static_cast<uint64_t>(RAW_CHUNK)).member("direct", r.direct);
    j.member("gb_per_s", best_raw->gb_per_s()).member("threads", best_raw->threads);
    j.key("runs").begin_array();
    for (const Raw& x : raws) {
        j.begin_object();
        j.member("threads", x.threads).member("seconds", x.seconds).member("bytes", x.bytes);
        j.member("gb_per_s", x.gb_per_s());
        j.end_object();
    }
    j.end_array();
    j.end_object();
    j.key("compute").begin_object();
    j.member("layer_id", big->layer_id).member("expert_id", big->expert_id);
    j.member("weight_bytes", big->raw_size).member("simd", simd_path());
    j.member("gb_per_s", fast_gbps).member("scalar_gb_per_s", ref_gbps);
    j.member("speedup", fast_gbps / ref_gbps);
    j.member("forwards", fast_n).member("scalar_forwards", ref_n);
    j.member("rel_diff_vs_scalar", norm > 0 ? diff / norm : diff);  // max abs diff / max abs
    j.end_object();
    j.end_object();
    return j.str() + "\n";
}

}  // namespace smoe::harness
