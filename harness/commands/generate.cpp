// generate: a vault run token by token (the streaming decoder, harness/engine/): the scout
// resident, the routed experts read from the vault into the expert cache as the router names
// them. Prints the generated ids (comma-separated), or with --json the smoe-generate/1
// document (docs/JSON.md).
#include "commands/command.hpp"
#include "engine/cache.hpp"
#include "engine/decoder.hpp"
#include "engine/model.hpp"
#include "engine/sampler.hpp"
#include "engine/scout.hpp"
#include "engine/threads.hpp"
#include "engine/trace.hpp"
#include "io.hpp"
#include "json.hpp"
#include "text.hpp"
#include "vault.hpp"

#include <exit_codes.hpp>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace smoe::harness::commands {

namespace {

using namespace smoe::harness::engine;

constexpr const char* SCHEMA = "smoe-generate/1";
/// Prompt tokens that cross the layers together (each layer's expert union read once).
constexpr size_t PREFILL_CHUNK = 64;
/// The most tokens a run holds (prompt + new): bounds the KV cache.
constexpr uint64_t MAX_POSITIONS = uint64_t{1} << 20;
/// The cache when neither --cache-mb nor --cache-slots is given.
constexpr uint64_t DEFAULT_CACHE_MB = 256;

struct GenerateArgs {
    std::string vault, scout, logits, trace;
    std::vector<uint32_t> prompt;
    uint64_t max_new = 0;
    bool have_max_new = false;
    std::optional<uint64_t> cache_mb, cache_slots;
    unsigned io_threads = 1, threads = 1;
    bool direct = true, json = false;
    SamplerOptions sampling;
};

double parse_real(const std::string& text, const char* what, double lo, double hi) {
    double v = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size() || !(v >= lo && v <= hi))
        throw UsageError(std::string(what) + ": not a number in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]: '" + text + "'");
    return v;
}

std::vector<uint32_t> parse_ids(const std::string& text) {
    std::vector<uint32_t> ids;
    size_t at = 0;
    while (at <= text.size()) {
        const size_t comma = std::min(text.find(',', at), text.size());
        ids.push_back(parse_uint<uint32_t>(text.substr(at, comma - at), "--prompt"));
        if (ids.size() > MAX_POSITIONS)
            throw UsageError("--prompt: more than " + std::to_string(MAX_POSITIONS) + " ids");
        at = comma + 1;
    }
    return ids;
}

GenerateArgs parse_generate(const Args& args) {
    GenerateArgs g;
    for (size_t k = 0; k < args.size(); ++k) {
        const std::string& a = args[k];
        auto next = [&]() -> const std::string& {
            if (k + 1 >= args.size())
                throw UsageError("generate: " + a + " needs a value");
            return args[++k];
        };
        if (a == "--prompt") {
            g.prompt = parse_ids(next());
        } else if (a == "--max-new") {
            g.max_new = parse_uint<uint64_t>(next(), "--max-new");
            g.have_max_new = true;
        } else if (a == "--scout") {
            g.scout = next();
        } else if (a == "--cache-mb") {
            g.cache_mb = parse_uint<uint64_t>(next(), "--cache-mb");
        } else if (a == "--cache-slots") {
            g.cache_slots = parse_uint<uint64_t>(next(), "--cache-slots");
        } else if (a == "--io-threads" || a == "--threads") {
            const auto n = parse_uint<unsigned>(next(), a.c_str());
            if (n < 1 || n > 256)
                throw UsageError(a + ": 1..256");
            (a == "--threads" ? g.threads : g.io_threads) = n;
        } else if (a == "--direct" || a == "--buffered") {
            g.direct = a == "--direct";
        } else if (a == "--temperature") {
            g.sampling.temperature = parse_real(next(), "--temperature", 0, 100);
        } else if (a == "--top-k") {
            g.sampling.top_k = parse_uint<uint32_t>(next(), "--top-k");
        } else if (a == "--top-p") {
            g.sampling.top_p = parse_real(next(), "--top-p", 0, 1);
            if (g.sampling.top_p == 0)
                throw UsageError("--top-p: above 0");
        } else if (a == "--seed") {
            g.sampling.seed = parse_uint<uint64_t>(next(), "--seed");
        } else if (a == "--logits") {
            g.logits = next();
        } else if (a == "--trace") {
            g.trace = next();
        } else if (a == "--json") {
            g.json = true;
        } else if (!a.empty() && a[0] == '-') {
            throw UsageError("generate: unknown option " + a);
        } else if (g.vault.empty()) {
            g.vault = a;
            current_vault() = a;
        } else {
            throw UsageError("generate: one VAULT expected");
        }
    }
    if (g.vault.empty())
        throw UsageError("generate: VAULT missing");
    if (g.prompt.empty())
        throw UsageError("generate: --prompt IDS missing");
    if (!g.have_max_new)
        throw UsageError("generate: --max-new N missing");
    if (g.cache_mb && g.cache_slots)
        throw UsageError("generate: --cache-mb and --cache-slots exclude each other");
    if (g.max_new > MAX_POSITIONS - g.prompt.size())
        throw UsageError("--max-new: prompt and new tokens above " + std::to_string(MAX_POSITIONS));
    return g;
}

/// What one decoding step cost, counted by the cache.
struct StepCost {
    uint32_t token = 0;
    double ms = 0;
    CacheCounters delta;
};

CacheCounters minus(const CacheCounters& a, const CacheCounters& b) {
    CacheCounters d;
    d.hits = a.hits - b.hits;
    d.misses = a.misses - b.misses;
    d.bytes_read = a.bytes_read - b.bytes_read;
    d.blobs_read = a.blobs_read - b.blobs_read;
    d.prefetched = a.prefetched - b.prefetched;
    d.read_seconds = a.read_seconds - b.read_seconds;
    return d;
}

void cost_members(JsonWriter& j, const CacheCounters& c) {
    j.member("bytes", c.bytes_read).member("blobs", c.blobs_read);
    j.member("hits", c.hits).member("misses", c.misses);
}

struct Run {
    std::vector<uint32_t> tokens;
    std::vector<StepCost> steps;  // steps[0]: the prefill
    double prefill_s = 0, decode_s = 0;
    CacheCounters total;
    double belady = 0;
    ExpertCompute compute;
    uint64_t slots = 0;
    bool direct = false;
};

std::string generate_json(const GenerateArgs& g, const Model& m, const Run& r) {
    JsonWriter j;
    j.begin_object().member("schema", SCHEMA).member("ok", true).member("vault", g.vault);
    j.member("model_type", m.cfg.model_type);
    j.key("prompt").begin_array();
    for (uint32_t t : g.prompt)
        j.value(t);
    j.end_array().key("tokens").begin_array();
    for (uint32_t t : r.tokens)
        j.value(t);
    j.end_array();
    auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
    const double decoded = r.tokens.empty() ? 0.0 : double(r.tokens.size() - 1);
    j.member("prefill_tokens_per_s", rate(double(g.prompt.size()), r.prefill_s));
    j.member("decode_tokens_per_s", rate(decoded, r.decode_s));
    j.key("cache").begin_object().member("slots", r.slots).member("direct", r.direct);
    cost_members(j, r.total);
    j.member("prefetched", r.total.prefetched);
    const uint64_t asked = r.total.hits + r.total.misses;
    j.member("hit_rate", asked ? double(r.total.hits) / double(asked) : 0.0);
    j.member("belady_hit_rate", r.belady);
    j.member("read_bytes_per_s", rate(double(r.total.bytes_read), r.total.read_seconds));
    j.end_object();
    j.key("experts").begin_object().member("applied", r.compute.applied);
    j.member("weight_bytes", r.compute.weight_bytes).member("seconds", r.compute.seconds);
    j.member("weight_bytes_per_s", rate(double(r.compute.weight_bytes), r.compute.seconds));
    j.end_object();
    j.key("per_token").begin_array();
    for (size_t i = 0; i < r.steps.size(); ++i) {
        j.begin_object().member("token", r.steps[i].token).member("prefill", i == 0);
        j.member("ms", r.steps[i].ms);
        cost_members(j, r.steps[i].delta);
        j.end_object();
    }
    j.end_array();
    j.key("warnings").begin_array();
    for (const std::string& w : m.warnings)
        j.value(w);
    j.end_array().end_object();
    return j.str() + "\n";
}

/// The outputs named (--logits, --trace), checked before any work: not an input, not
/// something other than a regular file.
void check_outputs(const GenerateArgs& g, const Vault& v, const Scout& s) {
    for (const std::string* out : {&g.logits, &g.trace}) {
        if (out->empty())
            continue;
        refuse_same_file(*out, {{g.vault, v.id}, {s.path(), s.id()}});
        existing_output(*out);
    }
    if (!g.logits.empty() && g.logits == g.trace)
        throw UsageError("generate: --logits and --trace name the same file");
}

/// The KV cache is allocated whole for the run's positions: one larger than this machine's
/// memory is refused before it is touched (the kernel would kill the process instead).
void refuse_oversized_kv(const Model& m, uint64_t positions) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0)
        return;
    const ModelConfig& c = m.cfg;
    const long double need = 2.0L * c.layers * positions * c.kv_heads * c.head_dim * sizeof(float);
    const long double have = static_cast<long double>(pages) * static_cast<long double>(page);
    if (need > have)
        throw UsageError("--max-new: the KV cache of " + std::to_string(positions) +
                         " positions needs " + std::to_string(static_cast<uint64_t>(need)) +
                         " bytes, more than this machine's memory (" +
                         std::to_string(static_cast<uint64_t>(have)) + ")");
}

int run_generate(const GenerateArgs& g) {
    Vault v;
    v.open(g.vault);
    const Scout scout(g.scout.empty() ? beside(g.vault, ".scout.safetensors") : g.scout);
    check_outputs(g, v, scout);
    const Model model = build_model(v, scout, beside(g.vault, ".config.json"));
    for (uint32_t t : g.prompt)
        if (t >= model.cfg.vocab)
            throw RefusedInput("--prompt: token id " + std::to_string(t) +
                               " is outside the vocabulary of " + std::to_string(model.cfg.vocab));
    if (!g.json)
        for (const std::string& w : model.warnings)
            std::fprintf(stderr, "smoe-stream: warning: %s\n", shown(w).c_str());
    CacheOptions co;
    co.slots = g.cache_slots
                   ? *g.cache_slots
                   : ExpertCache::slots_for_bytes(v, g.cache_mb.value_or(DEFAULT_CACHE_MB) << 20);
    if (!g.cache_slots && !g.cache_mb)  // the default: at least what one layer needs
        co.slots = std::max(co.slots, ExpertCache::min_slots(v));
    co.io_threads = g.io_threads;
    co.direct = g.direct;
    ExpertCache cache(v, co);
    if (!cache.direct_refused().empty() && !g.json)
        std::fprintf(stderr, "smoe-stream: warning: %s\n", shown(cache.direct_refused()).c_str());
    const uint64_t positions = g.prompt.size() + std::max<uint64_t>(g.max_new, 1);
    refuse_oversized_kv(model, positions);
    if (model.cfg.sliding_window != 0 && positions > model.cfg.sliding_window)
        throw RefusedInput(g.vault + ": " + std::to_string(positions) +
                           " positions outgrow the config copy's sliding_window of " +
                           std::to_string(model.cfg.sliding_window) +
                           ", which the decoder does not implement");
    ThreadPool pool(g.threads);
    Decoder dec(v, model, cache, pool, positions);
    Sampler sampler(g.sampling);
    Run r;
    // every step's logits go straight to the temporary file (renamed into place at the end)
    std::unique_ptr<AtomicFile> logits_out;
    if (!g.logits.empty())
        logits_out = std::make_unique<AtomicFile>(g.logits);
    double t0 = now_seconds();
    CacheCounters before = cache.counters();
    std::vector<float> logits;
    for (size_t at = 0; at < g.prompt.size(); at += PREFILL_CHUNK)
        logits = dec.feed(std::vector<uint32_t>(
            g.prompt.begin() + at,
            g.prompt.begin() + std::min(g.prompt.size(), at + PREFILL_CHUNK)));
    r.prefill_s = now_seconds() - t0;
    cache.wait_idle();  // a step's hints still in flight count in that step
    StepCost cost{0, r.prefill_s * 1e3, minus(cache.counters(), before)};
    for (uint64_t i = 0; i < g.max_new; ++i) {
        cost.token = sampler.next(logits);
        r.tokens.push_back(cost.token);
        r.steps.push_back(cost);
        if (!g.logits.empty())
            logits_out->write(logits.data(), logits.size() * sizeof(float));
        if (i + 1 == g.max_new)
            break;
        t0 = now_seconds();
        before = cache.counters();
        logits = dec.feed({cost.token});
        const double dt = now_seconds() - t0;
        cache.wait_idle();
        r.decode_s += dt;
        cost = {0, dt * 1e3, minus(cache.counters(), before)};
    }
    r.total = cache.counters();
    r.slots = cache.capacity();
    r.direct = cache.direct();
    r.belady = belady_hit_rate(dec.steps(), cache.capacity());
    r.compute = dec.expert_compute();
    if (!g.trace.empty()) {
        TraceWriter tw(v, g.trace);
        for (const TraceStep& s : dec.steps()) {
            if (s.hint)
                tw.hint(s.token, s.layer, s.experts);
            else
                tw.record(s.token, s.layer, s.experts);
        }
        tw.commit();
    }
    if (logits_out)
        logits_out->commit();
    if (g.json) {
        std::fputs(generate_json(g, model, r).c_str(), stdout);
    } else {
        std::string ids;
        for (uint32_t t : r.tokens)
            ids += (ids.empty() ? "" : ",") + std::to_string(t);
        std::printf("%s\n", ids.c_str());
    }
    return 0;
}

}  // namespace

int cmd_generate(const Args& args) {
    const bool json = std::find(args.begin(), args.end(), "--json") != args.end();
    return with_json_errors(json, SCHEMA, [&] { return run_generate(parse_generate(args)); });
}

}  // namespace smoe::harness::commands
