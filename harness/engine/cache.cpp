#include "engine/cache.hpp"

#include "engine/policy.hpp"

#include <common.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace smoe::harness::engine {

uint32_t vault_top_k(const Vault& v) {
    constexpr uint32_t QWEN3_TOP_K = 8;  // num_experts_per_tok of the Qwen3 MoE family
    return v.arch ? v.arch->moe_top_k : QWEN3_TOP_K;
}

std::vector<uint32_t> moe_layers(const Vault& v) {
    std::vector<uint32_t> layers;
    for (const Expert& e : v.experts)  // the table is sorted by layer
        if (layers.empty() || layers.back() != e.layer_id)
            layers.push_back(e.layer_id);
    return layers;
}

uint64_t ExpertCache::min_slots(const Vault& v) {
    const uint64_t k = std::min<uint64_t>(vault_top_k(v), v.header.max_experts_per_layer);
    return std::max<uint64_t>(k, 1);
}

uint64_t ExpertCache::slot_bytes(const Vault& v) {
    uint64_t most = PAGE_SIZE;
    for (const Expert& e : v.experts)
        most = std::max(most, e.padded_size);
    return round_up(most, PAGE_SIZE);
}

uint64_t ExpertCache::slots_for_bytes(const Vault& v, uint64_t bytes) {
    return bytes / slot_bytes(v);
}

namespace {

/// A descriptor on the very file the vault checked: O_DIRECT when asked for and the file
/// system takes it (some refuse at open, some only at the first read), else a duplicate of
/// the vault's own descriptor; `refused` says why O_DIRECT was not used.
Fd open_reads(const Vault& v, bool want_direct, bool& direct, std::string& refused) {
    direct = false;
    if (want_direct) {
        Fd fd(::open(v.name.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK));
        int err = errno;
        struct stat st {};
        if (fd.get() >= 0 && ::fstat(fd.get(), &st) == 0 &&
            (st.st_dev != v.id.dev || st.st_ino != v.id.ino))
            throw ReadFailed(v.name +
                             ": replaced since it was checked; refusing to read another file");
        if (fd.get() >= 0 && ::fcntl(fd.get(), F_SETFL, O_DIRECT) == 0) {
            AlignedBuffer probe(PAGE_SIZE);
            const uint64_t at = v.experts.empty() ? 0 : v.experts[0].byte_offset;
            if (::pread(fd.get(), probe.data(), PAGE_SIZE, static_cast<off_t>(at)) >= 0) {
                direct = true;
                return fd;
            }
            err = errno;
        } else if (fd.get() >= 0) {
            err = errno;
        }
        refused = v.name + ": O_DIRECT refused (" + std::strerror(err) + "); using buffered reads";
    }
    Fd fd(::fcntl(v.fd, F_DUPFD_CLOEXEC, 0));
    if (fd.get() < 0)
        throw IoError(v.name + ": cannot duplicate the descriptor: " + std::strerror(errno), 0,
                      exit_codes::FAILED);
    return fd;
}

constexpr int64_t NONE = -1;

}  // namespace

struct ExpertCache::Impl {
    Impl(const Vault& vault, const CacheOptions& opt)
        : v(vault),
          slot_size(slot_bytes(vault)),
          policy(make_policy(opt.policy, vault)),
          where(vault.experts.size(), NONE) {
        const uint64_t least = min_slots(vault);
        if (opt.slots < least)
            throw RefusedInput(vault.name + ": a cache of " + std::to_string(opt.slots) +
                               " slots is below one layer's top-k (" + std::to_string(least) +
                               " blobs of " + std::to_string(slot_size) + " bytes)");
        capacity = std::max(least, std::min<uint64_t>(opt.slots, vault.experts.size()));
        fd = open_reads(vault, opt.direct, direct, refused);
        ring = AlignedBuffer(static_cast<size_t>(capacity * slot_size));
        content.assign(capacity, NONE);
        pins.assign(capacity, 0);
    }

    /// The table index of (layer, expert), or std::out_of_range.
    uint32_t entry(uint32_t layer, uint32_t expert) const {
        const Expert* e = v.find(layer, expert);
        if (e == nullptr)
            throw std::out_of_range(v.name + ": no expert " + std::to_string(expert) +
                                    " in layer " + std::to_string(layer));
        return static_cast<uint32_t>(e - v.experts.data());
    }

    uint8_t* slot_data(uint64_t s) const { return ring.data() + s * slot_size; }

    /// A slot for a new load: an empty one, else the policy's victim among the unpinned.
    uint64_t claim() {
        std::vector<uint32_t> candidates;
        std::vector<uint64_t> slots;
        for (uint64_t s = 0; s < capacity; ++s) {
            if (content[s] == NONE)
                return s;
            if (pins[s] == 0) {
                candidates.push_back(static_cast<uint32_t>(content[s]));
                slots.push_back(s);
            }
        }
        if (candidates.empty())
            throw std::logic_error("expert cache: every slot is pinned");
        const uint64_t s = slots[policy->victim(candidates)];
        where[static_cast<size_t>(content[s])] = NONE;
        content[s] = NONE;
        return s;
    }

    void read(uint32_t e, uint64_t s) {
        const Expert& x = v.experts[e];
        const double t0 = now_seconds();
        pread_full(fd.get(), slot_data(s), static_cast<size_t>(x.padded_size), x.byte_offset,
                   v.name);
        counters.read_seconds += now_seconds() - t0;
        counters.bytes_read += x.padded_size;
        counters.blobs_read += 1;
    }

    const Vault& v;
    uint64_t slot_size;
    uint64_t capacity = 0;
    std::unique_ptr<Policy> policy;
    Fd fd;
    bool direct = false;
    std::string refused;
    AlignedBuffer ring;
    std::vector<int64_t> content;  // per slot: the table index it holds, or NONE
    std::vector<uint32_t> pins;    // per slot
    std::vector<int64_t> where;    // per table index: its slot, or NONE
    CacheCounters counters;
};

ExpertCache::ExpertCache(const Vault& vault, const CacheOptions& opt)
    : impl_(std::make_unique<Impl>(vault, opt)) {}

ExpertCache::~ExpertCache() = default;

uint64_t ExpertCache::capacity() const {
    return impl_->capacity;
}

std::vector<const uint8_t*> ExpertCache::acquire(uint32_t layer,
                                                 const std::vector<uint32_t>& experts) {
    Impl& m = *impl_;
    std::vector<uint32_t> entries;
    entries.reserve(experts.size());
    for (uint32_t x : experts)
        entries.push_back(m.entry(layer, x));
    // Room check before anything changes: pinned now plus the new distinct ones.
    uint64_t pinned = 0;
    for (uint64_t s = 0; s < m.capacity; ++s)
        pinned += m.pins[s] > 0;
    std::vector<uint32_t> fresh;
    for (uint32_t e : entries)
        if ((m.where[e] == NONE || m.pins[static_cast<size_t>(m.where[e])] == 0) &&
            std::find(fresh.begin(), fresh.end(), e) == fresh.end())
            fresh.push_back(e);
    if (pinned + fresh.size() > m.capacity)
        throw std::logic_error("expert cache: " + std::to_string(pinned + fresh.size()) +
                               " experts pinned at once, more than its " +
                               std::to_string(m.capacity) + " slots");
    m.policy->demand(layer, entries);
    // Hits are pinned first, so that no load of this call evicts a blob it asks for.
    std::vector<uint64_t> pinned_now;  // unpinned again if a read fails
    std::vector<uint32_t> loads;
    for (size_t i = 0; i < entries.size(); ++i) {
        const uint32_t e = entries[i];
        if (std::find(entries.begin(), entries.begin() + i, e) != entries.begin() + i)
            continue;  // a repeat counts once
        if (m.where[e] == NONE) {
            loads.push_back(e);
        } else {
            pinned_now.push_back(static_cast<uint64_t>(m.where[e]));
            m.pins[pinned_now.back()] += 1;
            m.counters.hits += 1;
        }
    }
    try {
        for (uint32_t e : loads) {
            const uint64_t s = m.claim();
            m.read(e, s);
            m.content[s] = e;
            m.where[e] = static_cast<int64_t>(s);
            m.pins[s] += 1;
            pinned_now.push_back(s);
            m.counters.misses += 1;
        }
    } catch (...) {
        for (uint64_t s : pinned_now)
            m.pins[s] -= 1;
        throw;
    }
    std::vector<const uint8_t*> out;
    out.reserve(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
        const auto s = static_cast<uint64_t>(m.where[entries[i]]);
        if (std::find(entries.begin(), entries.begin() + i, entries[i]) != entries.begin() + i)
            m.pins[s] += 1;  // each occurrence is released once
        out.push_back(m.slot_data(s));
    }
    return out;
}

void ExpertCache::release(uint32_t layer, const std::vector<uint32_t>& experts) {
    Impl& m = *impl_;
    for (uint32_t x : experts) {
        const uint32_t e = m.entry(layer, x);
        if (m.where[e] == NONE || m.pins[static_cast<size_t>(m.where[e])] == 0)
            throw std::logic_error("expert cache: release of an expert not acquired");
        m.pins[static_cast<size_t>(m.where[e])] -= 1;
    }
}

void ExpertCache::prefetch(uint32_t, const std::vector<uint32_t>&) {}

const CacheCounters& ExpertCache::counters() const {
    return impl_->counters;
}

bool ExpertCache::direct() const {
    return impl_->direct;
}

const std::string& ExpertCache::direct_refused() const {
    return impl_->refused;
}

}  // namespace smoe::harness::engine
