// cache-check (hidden, for the test suite): drives the expert cache with a seeded random mix of
// acquires (several held at once, up to its capacity), releases and prefetch hints, and after
// every acquire checks every held blob byte for byte (by CRC-32C) against a plain read of the
// vault: a pinned slot is never evicted or overwritten, an acquire beyond the capacity is
// refused (std::logic_error) without changing anything. Prints what it did as JSON.

#include "commands/command.hpp"
#include "crc32c.hpp"
#include "engine/cache.hpp"
#include "json.hpp"
#include "vault.hpp"

#include <algorithm>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace smoe::harness::commands {

namespace {

struct Held {
    uint32_t layer;
    std::vector<uint32_t> experts;
    std::vector<const uint8_t*> data;
};

/// The CRC-32C of every blob's padded bytes, read plainly.
std::vector<uint32_t> blob_crcs(const Vault& v) {
    std::vector<uint32_t> crcs;
    std::vector<uint8_t> buf;
    for (const Expert& e : v.experts) {
        buf.resize(static_cast<size_t>(e.padded_size));
        pread_full(v.fd, buf.data(), buf.size(), e.byte_offset, v.name);
        crcs.push_back(crc32c_update(0, buf.data(), buf.size()));
    }
    return crcs;
}

}  // namespace

int cmd_cache_check(const Args& args) {
    if (args.size() < 4)
        throw UsageError(
            "cache-check: VAULT SLOTS STEPS SEED [--direct] [--io-threads T] [--policy P]");
    current_vault() = args[0];
    Vault v;
    v.open(args[0]);
    engine::CacheOptions opt;
    opt.slots = parse_uint<uint64_t>(args[1], "SLOTS");
    const uint64_t steps = parse_uint<uint64_t>(args[2], "STEPS");
    std::mt19937_64 rng(parse_uint<uint64_t>(args[3], "SEED"));
    opt.direct = false;
    for (size_t k = 4; k < args.size(); ++k) {
        if (args[k] == "--direct")
            opt.direct = true;
        else if (args[k] == "--io-threads" && k + 1 < args.size())
            opt.io_threads = parse_uint<unsigned>(args[++k], "--io-threads");
        else if (args[k] == "--policy" && k + 1 < args.size())
            opt.policy = args[++k];
        else
            throw UsageError("cache-check: unknown option " + args[k]);
    }
    const std::vector<uint32_t> crcs = blob_crcs(v);
    const std::vector<uint32_t> layers = engine::moe_layers(v);
    if (layers.empty())
        throw UsageError("cache-check: a vault without experts");
    engine::ExpertCache cache(v, opt);
    std::vector<Held> held;
    uint64_t acquires = 0, releases = 0, refusals = 0, checked = 0;
    auto layer_experts = [&](uint32_t layer) {
        std::vector<uint32_t> ids;
        for (const Expert& e : v.experts)
            if (e.layer_id == layer)
                ids.push_back(e.expert_id);
        return ids;
    };
    for (uint64_t step = 0; step < steps; ++step) {
        const uint32_t layer = layers[rng() % layers.size()];
        std::vector<uint32_t> ids = layer_experts(layer);
        std::shuffle(ids.begin(), ids.end(), rng);
        const uint64_t most = std::min<uint64_t>(ids.size(), cache.capacity());
        ids.resize(static_cast<size_t>(1 + rng() % most));
        const unsigned what = static_cast<unsigned>(rng() % 8);
        if (what == 0) {
            cache.prefetch(layer, ids);
            continue;
        }
        if (what < 4 && !held.empty()) {  // release one held set
            const size_t i = static_cast<size_t>(rng() % held.size());
            cache.release(held[i].layer, held[i].experts);
            held.erase(held.begin() + static_cast<ptrdiff_t>(i));
            ++releases;
            continue;
        }
        // held sets may share blobs: what is pinned counts distinct blobs
        std::vector<uint64_t> distinct;
        for (const Held& h : held)
            for (uint32_t x : h.experts)
                distinct.push_back(uint64_t{h.layer} << 32 | x);
        for (uint32_t x : ids)
            distinct.push_back(uint64_t{layer} << 32 | x);
        std::sort(distinct.begin(), distinct.end());
        const auto pinned =
            static_cast<uint64_t>(std::unique(distinct.begin(), distinct.end()) - distinct.begin());
        if (pinned > cache.capacity()) {
            try {
                (void)cache.acquire(layer, ids);
                throw std::runtime_error(
                    "cache-check: an acquire beyond the capacity went through");
            } catch (const std::logic_error&) {
                ++refusals;
            }
        } else {
            held.push_back(Held{layer, ids, cache.acquire(layer, ids)});
            ++acquires;
        }
        for (const Held& h : held)
            for (size_t i = 0; i < h.experts.size(); ++i) {
                const Expert* e = v.find(h.layer, h.experts[i]);
                const size_t index = static_cast<size_t>(e - v.experts.data());
                if (crc32c_update(0, h.data[i], static_cast<size_t>(e->padded_size)) != crcs[index])
                    throw std::runtime_error("cache-check: expert " + std::to_string(h.experts[i]) +
                                             " of layer " + std::to_string(h.layer) +
                                             " is not its blob at step " + std::to_string(step));
                ++checked;
            }
    }
    for (const Held& h : held)
        cache.release(h.layer, h.experts);
    cache.wait_idle();
    const engine::CacheCounters& c = cache.counters();
    JsonWriter j;
    j.begin_object().member("slots", cache.capacity()).member("direct", cache.direct());
    j.member("acquires", acquires).member("releases", releases).member("refusals", refusals);
    j.member("checked", checked).member("hits", c.hits).member("misses", c.misses);
    j.member("blobs_read", c.blobs_read).member("bytes_read", c.bytes_read);
    j.member("prefetched", c.prefetched).end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
}

}  // namespace smoe::harness::commands
