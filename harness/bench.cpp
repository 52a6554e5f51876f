#include "bench.hpp"

#include "io.hpp"
#include "json.hpp"
#include "quant.hpp"
#include "text.hpp"

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
#include <memory>
#include <mutex>
#include <random>
#include <thread>

namespace smoe::harness {

namespace {

/// The benchmark's reads (vault.hpp's open_blob_reads), O_DIRECT refused said on stderr.
struct Reader {
    Fd fd;
    bool direct = false;
};

void open_reader(const Vault& v, bool want_direct, Reader& r) {
    std::string refused;
    r.fd = open_blob_reads(v, want_direct, r.direct, refused);
    if (!refused.empty())
        std::fprintf(stderr, "smoe-stream: %s\n", shown(refused).c_str());
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

/// One timed run of a reader: bytes and reads done in `seconds`.
struct Sample {
    uint64_t bytes = 0, reads = 0;
    double seconds = 0;
    double gb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

constexpr unsigned ROUNDS = 3;  // runs of every raw configuration, in the search
constexpr unsigned DUELS = 12;  // then runs each of the stream and the best configuration

/// The fastest of `runs` (an empty Sample if none).
Sample best_of(const std::vector<Sample>& runs) {
    Sample b;
    for (const Sample& s : runs)
        if (s.gb_per_s() > b.gb_per_s())
            b = s;
    return b;
}

/// The median speed of `runs` (0 if none).
double median_gb_per_s(const std::vector<Sample>& runs) {
    std::vector<double> v;
    for (const Sample& s : runs)
        v.push_back(s.gb_per_s());
    if (v.empty())
        return 0;
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

/// The sum of `runs`.
Sample total_of(const std::vector<Sample>& runs) {
    Sample t;
    for (const Sample& s : runs) {
        t.bytes += s.bytes;
        t.reads += s.reads;
        t.seconds += s.seconds;
    }
    return t;
}

/// Runs `body(t, stop)` on `threads` threads until `seconds` have passed (or one throws),
/// joins them and returns the elapsed time; rethrows the first error as ReadFailed.
template <class Body>
double run_threads(unsigned threads, double seconds, Body body) {
    std::atomic<bool> stop{false};
    std::mutex err_mu;
    std::string error;
    auto worker = [&](unsigned t) {
        try {
            body(t, stop);
        } catch (const std::exception& ex) {
            std::lock_guard<std::mutex> lock(err_mu);
            if (error.empty())
                error = ex.what();
            stop = true;
        }
    };
    const double t0 = now_seconds();
    std::vector<std::thread> pool;
    try {
        for (unsigned t = 0; t < threads; ++t)
            pool.emplace_back(worker, t);
    } catch (...) {  // no thread: stop and join those started before rethrowing
        stop = true;
        for (auto& th : pool)
            th.join();
        throw;
    }
    for (double end = t0 + seconds; !stop && now_seconds() < end;)
        sleep_for(std::min(0.005, seconds / 10));
    stop = true;
    for (auto& th : pool)
        th.join();
    const double elapsed = now_seconds() - t0;
    if (!error.empty())
        throw ReadFailed(error);
    return elapsed;
}

constexpr unsigned RING_SLOTS = 2;  // staging buffers per reader thread

/// N reader threads take expert reads from a shared job counter; each preads a whole
/// padded blob (16 KiB-aligned offset and length) into its slot of a ring of
/// page-aligned buffers, as an engine's I/O pool fills staging buffers. Each run goes on
/// where the last one stopped (the next token, the next expert in the file).
class Streamer {
public:
    Streamer(const Vault& v, const Reader& r, std::vector<uint32_t> jobs, unsigned threads)
        : v_(v), r_(r), jobs_(std::move(jobs)), threads_(threads), latency_(threads) {
        uint64_t max_blob = 0;
        for (const Expert& e : v.experts)
            max_blob = std::max(max_blob, e.padded_size);
        for (unsigned k = 0; k < threads * RING_SLOTS; ++k)
            ring_.emplace_back(max_blob);
    }

    Sample run(double seconds) {
        std::vector<Sample> per(threads_);
        const double elapsed = run_threads(threads_, seconds, [&](unsigned t, auto& stop) {
            Sample& s = per[t];
            for (uint64_t k = 0; !stop.load(std::memory_order_relaxed); ++k) {
                const Expert& e = v_.experts[jobs_[next_.fetch_add(1) % jobs_.size()]];
                uint8_t* buf = ring_[t * RING_SLOTS + k % RING_SLOTS].data();
                const double t0 = now_seconds();
                pread_full(r_.fd.get(), buf, e.padded_size, e.byte_offset, v_.name);
                latency_[t].push_back(static_cast<float>((now_seconds() - t0) * 1e6));
                s.bytes += e.padded_size;
                ++s.reads;
            }
        });
        Sample all = total_of(per);  // the threads' bytes and reads, over the run's time
        all.seconds = elapsed;
        return all;
    }

    unsigned threads() const { return threads_; }

    std::vector<Sample> samples;  // the search's runs

    /// Every read's latency so far, in microseconds.
    std::vector<float> latencies_us() const {
        std::vector<float> all;
        for (const auto& l : latency_)
            all.insert(all.end(), l.begin(), l.end());
        return all;
    }

private:
    const Vault& v_;
    const Reader& r_;
    std::vector<uint32_t> jobs_;
    unsigned threads_;
    std::vector<AlignedBuffer> ring_;
    std::vector<std::vector<float>> latency_;  // per thread
    std::atomic<uint64_t> next_{0};
};

/// Raw reads of the same file with `threads` threads, in the reader's mode (page-cached or
/// O_DIRECT), in one of three patterns: `Shares`, each thread reading its own contiguous
/// share in preads of `chunk` bytes (a multiple of 16 KiB, wrapping within it);
/// `Interleaved`, all taking the next `chunk` of the file from a shared counter (as the
/// stream's seq pattern does); `Replay`, all taking the next expert of the stream's own job
/// list (the same experts in the same order, from a cursor of their own) and reading its
/// whole padded blob: the stream's reads without the stream, so that a disk which favours
/// some blocks or orders (a virtual disk's host may cache or promote regions read before)
/// favours both sides alike. Each run goes on where the last one stopped, as the stream
/// does.
constexpr size_t RAW_CHUNK = size_t{8} << 20;

enum class RawPattern { Shares, Interleaved, Replay };

const char* pattern_name(RawPattern p) {
    switch (p) {
        case RawPattern::Shares:
            return "shares";
        case RawPattern::Interleaved:
            return "interleaved";
        case RawPattern::Replay:
            return "replay";
    }
    return "?";
}

class RawReader {
public:
    RawReader(const Vault& v, const Reader& r, unsigned threads, size_t chunk, RawPattern pattern,
              const std::vector<uint32_t>& jobs)
        : v_(v), r_(r), threads_(threads), chunk_(chunk), pattern_(pattern), jobs_(jobs) {
        share_ = (v.size / threads + chunk - 1) / chunk * chunk;
        for (unsigned t = 0; t < threads; ++t)
            at_.push_back(std::min<uint64_t>(v.size, t * share_));
        for (unsigned t = 0; t < threads * RING_SLOTS; ++t)
            bufs_.emplace_back(chunk);
    }

    Sample run(double seconds) {
        std::vector<Sample> per(threads_);
        const double elapsed = run_threads(threads_, seconds, [&](unsigned t, auto& stop) {
            const uint64_t lo = std::min<uint64_t>(v_.size, t * share_);
            const uint64_t hi = std::min<uint64_t>(v_.size, lo + share_);
            if (hi <= lo)
                return;
            const uint64_t chunks = (v_.size + chunk_ - 1) / chunk_;
            uint64_t& off = at_[t];
            uint64_t k = 0;  // the thread's ring slots in turn, as the stream fills its own
            auto buf = [&] { return bufs_[t * RING_SLOTS + k++ % RING_SLOTS].data(); };
            while (pattern_ == RawPattern::Replay && !stop.load(std::memory_order_relaxed)) {
                const Expert& e = v_.experts[jobs_[next_->fetch_add(1) % jobs_.size()]];
                const size_t want = static_cast<size_t>(std::min<uint64_t>(e.padded_size, chunk_));
                per[t].bytes += pread_some(r_.fd.get(), buf(), want, e.byte_offset, v_.name);
                ++per[t].reads;
            }
            while (pattern_ == RawPattern::Interleaved && !stop.load(std::memory_order_relaxed)) {
                const uint64_t at = next_->fetch_add(1) % chunks * chunk_;
                const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk_, v_.size - at));
                per[t].bytes += pread_some(r_.fd.get(), buf(), want, at, v_.name);
                ++per[t].reads;
            }
            while (pattern_ == RawPattern::Shares && !stop.load(std::memory_order_relaxed)) {
                const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk_, hi - off));
                const size_t n = pread_some(r_.fd.get(), buf(), want, off, v_.name);
                per[t].bytes += n;
                ++per[t].reads;
                off = (n < want || off + n >= hi) ? lo : off + n;
            }
        });
        Sample all = total_of(per);  // the threads' bytes and reads, over the run's time
        all.seconds = elapsed;
        return all;
    }

    unsigned threads() const { return threads_; }
    size_t chunk() const { return chunk_; }
    RawPattern pattern() const { return pattern_; }

    std::vector<Sample> samples;  // the search's runs

private:
    const Vault& v_;
    const Reader& r_;
    unsigned threads_;
    size_t chunk_;
    RawPattern pattern_;
    const std::vector<uint32_t>& jobs_;  // Replay: the experts to read, in order
    // RING_SLOTS buffers of `chunk` bytes per thread, used in turn: the reader's own and as
    // many as the stream's ring. On a virtual machine an O_DIRECT read costs more the more
    // distinct memory it lands in (larger buffers, shared between configurations, measured
    // slower), so the limit reads into the same kind of buffers as the stream.
    std::vector<AlignedBuffer> bufs_;
    uint64_t share_ = 0;
    std::vector<uint64_t> at_;  // each thread's next offset in its share
    std::shared_ptr<std::atomic<uint64_t>> next_ = std::make_shared<std::atomic<uint64_t>>(0);
};

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
        throw RefusedInput(v.name + ": the vault holds no experts to stream");
    const unsigned k = o.topk ? o.topk : v.arch ? v.arch->moe_top_k : 8;
    const double side = std::max(0.05, o.seconds / 4);
    Reader r;
    open_reader(v, o.direct, r);

    // The raw reads: the machine's limit for this file is the best plain read, with 1, 2, 4,
    // 8 threads (and the stream's count, up to 16), in 8 MiB preads of contiguous shares, in
    // preads of the stream's request size (the largest padded blob) taken in file order from
    // a shared counter, and in preads of whole blobs in the stream's own order (the stream's
    // reads without the stream). A search runs every raw configuration, and the stream with
    // each thread count it may use (o.threads, or with 0 ("auto") 1, 2, 4 and 8), ROUNDS
    // times, round-robin, so that each sees several moments of a shared disk; the fastest
    // raw run of all is the file's read limit. Then the stream's fastest thread count and
    // the fastest raw configuration of its own pattern (the best thread count for those very
    // reads) alternate DUELS times each, taking turns to go first, and each side's figure is
    // the median of its duel runs: like for like, the same reads chosen the same way, as
    // many runs, at the same moments. A virtual disk whose speed depends on which blocks were
    // read lately, or on how many requests are in flight, sways both alike. Every run lasts
    // an equal share of twice `seconds`.
    uint64_t max_blob = 0;
    for (const Expert& e : v.experts)
        max_blob = std::max(max_blob, e.padded_size);
    std::vector<unsigned> raw_threads = {1u, 2u, 4u, 8u};
    if (o.threads > 0 && o.threads <= 16 &&
        std::find(raw_threads.begin(), raw_threads.end(), o.threads) == raw_threads.end())
        raw_threads.push_back(o.threads);
    const std::pair<RawPattern, size_t> kinds[] = {
        {RawPattern::Shares, RAW_CHUNK},
        {RawPattern::Interleaved, static_cast<size_t>(max_blob)},
        {RawPattern::Replay, static_cast<size_t>(max_blob)},
    };
    const std::vector<uint32_t> jobs = make_jobs(v, o.random, k, o.seed);
    std::vector<RawReader> raws;
    raws.reserve(raw_threads.size() * std::size(kinds));
    for (const auto& [pattern, chunk] : kinds)
        for (unsigned n : raw_threads)
            raws.emplace_back(v, r, n, chunk, pattern, jobs);
    std::vector<std::unique_ptr<Streamer>> streamers;
    for (unsigned n :
         o.threads > 0 ? std::vector<unsigned>{o.threads} : std::vector<unsigned>{1u, 2u, 4u, 8u})
        streamers.push_back(std::make_unique<Streamer>(v, r, jobs, n));
    const size_t configs = raws.size() + streamers.size();
    const double slot =
        std::max(0.02, 2 * o.seconds / static_cast<double>(ROUNDS * configs + 2 * DUELS));
    for (unsigned round = 0; round < ROUNDS; ++round)
        for (size_t c = 0; c < configs; ++c) {
            const size_t i = (c + round) % configs;
            if (i < raws.size())
                raws[i].samples.push_back(raws[i].run(slot));
            else
                streamers[i - raws.size()]->samples.push_back(
                    streamers[i - raws.size()]->run(slot));
        }
    const RawReader* fastest = &raws[0];  // of every pattern: the file's read limit
    RawReader* best_raw = nullptr;        // of the stream's own pattern: the duel's
    for (RawReader& x : raws) {
        if (best_of(x.samples).gb_per_s() > best_of(fastest->samples).gb_per_s())
            fastest = &x;
        if (x.pattern() == RawPattern::Replay &&
            (best_raw == nullptr ||
             best_of(x.samples).gb_per_s() > best_of(best_raw->samples).gb_per_s()))
            best_raw = &x;
    }
    Streamer* stream = streamers[0].get();
    for (const auto& x : streamers)
        if (best_of(x->samples).gb_per_s() > best_of(stream->samples).gb_per_s())
            stream = x.get();
    std::vector<Sample> stream_runs, raw_runs;
    for (unsigned d = 0; d < DUELS; ++d) {
        if (d % 2 == 0)
            raw_runs.push_back(best_raw->run(slot));
        stream_runs.push_back(stream->run(slot));
        if (d % 2 == 1)
            raw_runs.push_back(best_raw->run(slot));
    }
    const unsigned threads = stream->threads();
    const Sample st_best = best_of(stream_runs), st_all = total_of(stream_runs);
    std::vector<float> latency_us = stream->latencies_us();

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
    j.member("rounds", ROUNDS).member("duels", DUELS).member("run_seconds", slot);
    j.key("stream").begin_object();  // gb_per_s: the median run; experts_per_s: over all
    j.member("seconds", st_all.seconds).member("reads", st_all.reads).member("bytes", st_all.bytes);
    j.member("gb_per_s", median_gb_per_s(stream_runs));
    j.member("best_gb_per_s", st_best.gb_per_s());
    j.member("experts_per_s", static_cast<double>(st_all.reads) / st_all.seconds);
    j.member("mean_gb_per_s", st_all.gb_per_s());
    j.member("latency_p50_us", percentile(latency_us, 0.50));
    j.member("latency_p99_us", percentile(latency_us, 0.99));
    j.key("runs_gb_per_s").begin_array();
    for (const Sample& x : stream_runs)
        j.value(x.gb_per_s());
    j.end_array();
    j.key("search").begin_array();  // per thread count tried: its best run, every run
    for (const auto& x : streamers) {
        j.begin_object().member("threads", x->threads());
        j.member("gb_per_s", best_of(x->samples).gb_per_s());
        j.key("runs_gb_per_s").begin_array();
        for (const Sample& y : x->samples)
            j.value(y.gb_per_s());
        j.end_array();
        j.end_object();
    }
    j.end_array();
    j.end_object();
    const Sample one_all = total_of(raws[0].samples);
    j.key("sequential_read").begin_object();  // one thread (kept for older readers)
    j.member("seconds", one_all.seconds).member("bytes", one_all.bytes);
    j.member("chunk_bytes", static_cast<uint64_t>(RAW_CHUNK));
    j.member("gb_per_s", best_of(raws[0].samples).gb_per_s());
    j.end_object();
    j.key("raw_read").begin_object();  // the duel's configuration: its median duel run
    j.member("chunk_bytes", static_cast<uint64_t>(best_raw->chunk())).member("direct", r.direct);
    j.member("gb_per_s", median_gb_per_s(raw_runs));
    j.member("best_gb_per_s", best_of(raw_runs).gb_per_s());
    j.member("threads", best_raw->threads()).member("pattern", pattern_name(best_raw->pattern()));
    j.key("duel_runs_gb_per_s").begin_array();
    for (const Sample& x : raw_runs)
        j.value(x.gb_per_s());
    j.end_array();
    j.key("file_limit").begin_object();  // the search's fastest run, of any pattern
    j.member("gb_per_s", best_of(fastest->samples).gb_per_s());
    j.member("threads", fastest->threads()).member("pattern", pattern_name(fastest->pattern()));
    j.member("chunk_bytes", static_cast<uint64_t>(fastest->chunk()));
    j.end_object();
    j.key("runs").begin_array();  // per configuration of the search: totals, best, every run
    for (const RawReader& x : raws) {
        const Sample all = total_of(x.samples);
        j.begin_object();
        j.member("threads", x.threads()).member("chunk_bytes", static_cast<uint64_t>(x.chunk()));
        j.member("pattern", pattern_name(x.pattern()));
        j.member("interleaved", x.pattern() == RawPattern::Interleaved);
        j.member("seconds", all.seconds).member("bytes", all.bytes);
        j.member("gb_per_s", best_of(x.samples).gb_per_s());
        j.key("runs_gb_per_s").begin_array();
        for (const Sample& y : x.samples)
            j.value(y.gb_per_s());
        j.end_array();
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
