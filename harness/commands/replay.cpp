// replay: streams a routing trace through the expert cache with real reads and no compute,
// for cache-size and policy sweeps; reports hits, misses, bytes and throughput beside
// Belady's optimum for the same trace and cache size (docs/JSON.md, smoe-replay/1).

#include "commands/command.hpp"
#include "engine/cache.hpp"
#include "engine/trace.hpp"
#include "io.hpp"
#include "json.hpp"
#include "text.hpp"
#include "vault.hpp"

#include <exit_codes.hpp>

#include <algorithm>
#include <cstdio>
#include <new>
#include <optional>
#include <string>

namespace smoe::harness::commands {

namespace {

constexpr const char* SCHEMA = "smoe-replay/1";
constexpr uint64_t MAX_CACHE_MB = uint64_t{1} << 30;  // a petabyte: any real machine's memory

struct ReplayArgs {
    std::string vault, trace;
    std::optional<uint64_t> cache_mb, cache_slots;
    engine::CacheOptions cache;
    bool json = false;
};

ReplayArgs parse(const Args& args) {
    ReplayArgs r;
    r.cache.direct = false;
    r.cache.policy = engine::DEFAULT_POLICY;
    std::vector<std::string> positional;
    for (size_t k = 0; k < args.size(); ++k) {
        const std::string& a = args[k];
        auto next = [&]() -> const std::string& {
            if (k + 1 >= args.size())
                throw UsageError("replay: " + a + " needs a value");
            return args[++k];
        };
        if (a == "--cache-mb") {
            r.cache_mb = parse_uint<uint64_t>(next(), "--cache-mb");
            if (*r.cache_mb > MAX_CACHE_MB)
                throw UsageError("--cache-mb: at most " + std::to_string(MAX_CACHE_MB));
        } else if (a == "--cache-slots") {
            r.cache_slots = parse_uint<uint64_t>(next(), "--cache-slots");
        } else if (a == "--io-threads") {
            r.cache.io_threads = parse_uint<unsigned>(next(), "--io-threads");
            if (r.cache.io_threads < 1 || r.cache.io_threads > 64)
                throw UsageError("--io-threads: 1..64");
        } else if (a == "--direct") {
            r.cache.direct = true;
        } else if (a == "--policy") {
            r.cache.policy = next();
            const auto& names = engine::policy_names();
            if (std::find(names.begin(), names.end(), r.cache.policy) == names.end()) {
                std::string choices;
                for (const std::string& n : names)
                    choices += (choices.empty() ? "'" : ", '") + n + "'";
                throw UsageError("--policy: invalid choice: '" + r.cache.policy +
                                 "' (choose from " + choices + ")");
            }
        } else if (a == "--json") {
            r.json = true;
        } else if (!a.empty() && a[0] == '-') {
            throw UsageError("replay: unknown option " + a);
        } else {
            positional.push_back(a);
        }
    }
    if (positional.size() != 2)
        throw UsageError("replay: VAULT and TRACE expected");
    if (r.cache_mb.has_value() == r.cache_slots.has_value())
        throw UsageError("replay: one of --cache-mb and --cache-slots expected");
    r.vault = positional[0];
    r.trace = positional[1];
    return r;
}

/// What a replay measured.
struct Replayed {
    uint64_t steps = 0, requests = 0, hints = 0;
    engine::CacheCounters counters;
    engine::HitCount belady;
    uint64_t capacity = 0, slot_bytes = 0;
    bool direct = false;
    double seconds = 0;
};

Replayed replay(const Vault& v, const std::vector<engine::TraceStep>& steps,
                const engine::CacheOptions& opt) {
    engine::ExpertCache cache(v, opt);
    if (!cache.direct_refused().empty())
        std::fprintf(stderr, "smoe-stream: warning: %s\n", shown(cache.direct_refused()).c_str());
    Replayed r;
    r.capacity = cache.capacity();
    r.slot_bytes = engine::ExpertCache::slot_bytes(v);
    r.direct = cache.direct();
    const double t0 = now_seconds();
    for (const engine::TraceStep& s : steps) {
        if (s.hint) {
            cache.prefetch(s.layer, s.experts);
            ++r.hints;
            continue;
        }
        for (const auto& [b, e] : engine::batches(s.experts.size(), r.capacity)) {
            const std::vector<uint32_t> batch(s.experts.begin() + static_cast<ptrdiff_t>(b),
                                              s.experts.begin() + static_cast<ptrdiff_t>(e));
            (void)cache.acquire(s.layer, batch);
            cache.release(s.layer, batch);
        }
        r.requests += s.experts.size();
    }
    cache.wait_idle();  // hints still in flight: their bytes count
    r.seconds = now_seconds() - t0;
    r.steps = steps.size() - r.hints;
    r.counters = cache.counters();
    r.belady = engine::belady(steps, r.capacity);
    return r;
}

double ratio(double a, double b) {
    return b > 0 ? a / b : 0.0;
}

std::string json_report(const ReplayArgs& a, const Replayed& r) {
    const engine::CacheCounters& c = r.counters;
    const double rate = engine::HitCount{c.hits, c.misses}.rate();
    JsonWriter j;
    j.begin_object().member("schema", SCHEMA).member("ok", true);
    j.member("vault", a.vault).member("trace", a.trace).member("policy", a.cache.policy);
    j.member("slots", r.capacity).member("slot_bytes", r.slot_bytes);
    j.member("cache_bytes", r.capacity * r.slot_bytes);
    j.member("io_threads", a.cache.io_threads).member("direct", r.direct);
    j.member("steps", r.steps).member("hints", r.hints).member("requests", r.requests);
    j.member("hits", c.hits).member("misses", c.misses).member("hit_rate", rate);
    j.member("belady_hits", r.belady.hits).member("belady_hit_rate", r.belady.rate());
    j.key("of_belady");  // null where Belady hits nothing
    if (r.belady.hits > 0)
        j.value(rate / r.belady.rate());
    else
        j.null();
    j.member("bytes_read", c.bytes_read).member("blobs_read", c.blobs_read);
    j.member("prefetched", c.prefetched);
    j.member("read_seconds", c.read_seconds);
    j.member("read_bytes_per_s", ratio(static_cast<double>(c.bytes_read), c.read_seconds));
    j.member("seconds", r.seconds);
    j.member("steps_per_s", ratio(static_cast<double>(r.steps), r.seconds));
    j.end_object();
    return j.str() + "\n";
}

std::string text_report(const ReplayArgs& a, const Replayed& r) {
    const engine::CacheCounters& c = r.counters;
    const double rate = engine::HitCount{c.hits, c.misses}.rate();
    char buf[1536];
    std::snprintf(
        buf, sizeof buf,
        "replay: %llu steps, %llu requests, policy %s, %llu slots of %llu bytes, %s reads\n"
        "hits %llu, misses %llu: hit rate %.4f (Belady %.4f: %.3f of it)\n"
        "read %llu bytes in %llu blobs (%llu on hints): %.1f MB/s over %.3f s of reads; "
        "%.0f steps/s\n",
        static_cast<unsigned long long>(r.steps), static_cast<unsigned long long>(r.requests),
        a.cache.policy.c_str(), static_cast<unsigned long long>(r.capacity),
        static_cast<unsigned long long>(r.slot_bytes), r.direct ? "O_DIRECT" : "buffered",
        static_cast<unsigned long long>(c.hits), static_cast<unsigned long long>(c.misses), rate,
        r.belady.rate(), ratio(rate, r.belady.rate()),
        static_cast<unsigned long long>(c.bytes_read),
        static_cast<unsigned long long>(c.blobs_read),
        static_cast<unsigned long long>(c.prefetched),
        ratio(static_cast<double>(c.bytes_read), c.read_seconds) / 1e6, c.read_seconds,
        ratio(static_cast<double>(r.steps), r.seconds));
    return buf;
}

int run_replay(const ReplayArgs& a) {
    current_vault() = a.vault;
    Vault v;
    v.open(a.vault);
    const std::vector<engine::TraceStep> steps = engine::read_trace(a.trace, v);
    engine::CacheOptions opt = a.cache;
    opt.slots =
        a.cache_slots ? *a.cache_slots : engine::ExpertCache::slots_for_bytes(v, *a.cache_mb << 20);
    const Replayed r = replay(v, steps, opt);
    std::fputs((a.json ? json_report(a, r) : text_report(a, r)).c_str(), stdout);
    return 0;
}

}  // namespace

int cmd_replay(const Args& args) {
    const bool json = std::find(args.begin(), args.end(), "--json") != args.end();
    return with_json_errors(json, SCHEMA, [&] { return run_replay(parse(args)); });
}

}  // namespace smoe::harness::commands
