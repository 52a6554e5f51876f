#include "engine/cache.hpp"

#include "engine/policy.hpp"

#include <common.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

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

constexpr int64_t NONE = -1;

/// Refuses a ring larger than this machine's memory, before it is allocated (a cache is
/// touched whole at once: it would not fit).
void refuse_beyond_memory(const Vault& v, uint64_t slots, uint64_t slot_size) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return;  // unknown: nothing to hold it against
    const uint64_t memory = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
    if (slot_size > 0 && slots > memory / slot_size)
        throw RefusedInput(v.name + ": a cache of " + std::to_string(slots) + " slots of " +
                           std::to_string(slot_size) + " bytes is more than this machine's " +
                           std::to_string(memory) + " bytes of memory");
}

/// A slot's state: EMPTY (nothing), LOADING (a read in flight), READY (the blob's bytes).
enum class State : uint8_t { empty, loading, ready };

struct Slot {
    int64_t entry = NONE;  // the table index it holds or is loading
    State state = State::empty;
    uint32_t pins = 0;
    uint32_t pending = 0;      // chunks of its read still to come
    std::exception_ptr error;  // a failed read, for the acquire waiting on it
};

/// One piece of a blob's read: blobs are read in chunks so that a layer's few large blobs
/// keep every I/O thread busy to the end.
struct Job {
    uint64_t slot, offset, len;
};

/// Bytes of one read (a multiple of the 16 KiB page, as O_DIRECT needs).
constexpr uint64_t CHUNK = uint64_t{1} << 20;
static_assert(CHUNK % PAGE_SIZE == 0);

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
        refuse_beyond_memory(vault, capacity, slot_size);
        fd = open_blob_reads(vault, opt.direct, direct, refused);
        ring = AlignedBuffer(static_cast<size_t>(capacity * slot_size));
#ifdef MADV_HUGEPAGE
        // Huge pages where the kernel gives them on request: an O_DIRECT read pins every page
        // it fills, and fewer pages helped the miss-bound replay here (one I/O thread).
        (void)::madvise(ring.data(), ring.size(), MADV_HUGEPAGE);
#endif
        slots.resize(capacity);
        const unsigned threads = std::clamp(opt.io_threads, 1u, MAX_IO_THREADS);
        // hints never take the last worker: a demand read always finds one free
        hint_limit = threads - 1;
        for (unsigned t = 0; t < threads; ++t)
            workers.emplace_back([this] { work(); });
    }

    ~Impl() {
        {
            const std::lock_guard lock(mu);
            stopping = true;
        }
        job_ready.notify_all();
        for (std::thread& t : workers)
            t.join();
    }

    /// The table index of (layer, expert), or std::out_of_range.
    uint32_t entry(uint32_t layer, uint32_t expert) const {
        const Expert* e = v.find(layer, expert);
        if (e == nullptr)
            throw std::out_of_range(v.name + ": no expert " + std::to_string(expert) +
                                    " in layer " + std::to_string(layer));
        return static_cast<uint32_t>(e - v.experts.data());
    }

    uint8_t* slot_data(uint64_t s) const {
        return ring.data() + s * slot_size;
    }

    /// A slot for a new load (under mu): an empty one, else the policy's victim among the
    /// unpinned ready ones; none (NONE) while every other is pinned or loading.
    int64_t claim() {
        std::vector<uint32_t> candidates;
        std::vector<uint64_t> ready;
        for (uint64_t s = 0; s < capacity; ++s) {
            const Slot& x = slots[s];
            if (x.state == State::empty)
                return static_cast<int64_t>(s);
            if (x.state == State::ready && x.pins == 0) {
                candidates.push_back(static_cast<uint32_t>(x.entry));
                ready.push_back(s);
            }
        }
        if (candidates.empty())
            return NONE;
        const uint64_t s = ready[policy->victim(candidates)];
        where[static_cast<size_t>(slots[s].entry)] = NONE;
        slots[s] = Slot{};
        return static_cast<int64_t>(s);
    }

    /// Starts loading table entry `e` into slot `s` (under mu).
    void load(uint32_t e, uint64_t s, bool hint) {
        const Expert& x = v.experts[e];
        Slot& slot = slots[s];
        slot.entry = e;
        slot.state = State::loading;
        where[e] = static_cast<int64_t>(s);
        std::deque<Job>& queue = hint ? hints : demands;
        for (uint64_t at = 0; at < x.padded_size; at += CHUNK) {
            queue.push_back(Job{s, at, std::min(CHUNK, x.padded_size - at)});
            ++slot.pending;
        }
        job_ready.notify_all();
    }

    /// A demand for a blob a hint is loading: its chunks still queued go before the hints.
    void promote(uint64_t s) {
        for (auto it = hints.begin(); it != hints.end();) {
            if (it->slot == s) {
                demands.push_back(*it);
                it = hints.erase(it);
            } else {
                ++it;
            }
        }
        job_ready.notify_all();
    }

    /// An I/O thread: demand reads first, hints only when no demand waits.
    void work() {
        std::unique_lock lock(mu);
        for (;;) {
            job_ready.wait(lock, [&] {
                return stopping || !demands.empty() ||
                       (!hints.empty() && hint_workers < hint_limit);
            });
            if (stopping)
                return;
            const bool hint = demands.empty();
            std::deque<Job>& queue = hint ? hints : demands;
            const Job job = queue.front();
            queue.pop_front();
            hint_workers += hint;
            const Expert& x = v.experts[static_cast<size_t>(slots[job.slot].entry)];
            lock.unlock();
            std::exception_ptr error;
            try {
                pread_full(fd.get(), slot_data(job.slot) + job.offset, static_cast<size_t>(job.len),
                           x.byte_offset + job.offset, v.name);
            } catch (...) {
                error = std::current_exception();
            }
            lock.lock();
            if (hint) {
                --hint_workers;
                job_ready.notify_one();
            }
            finished(job.slot, x, error);
        }
    }

    /// One chunk of slot `s` is read (under mu); the last one makes it ready.
    void finished(uint64_t s, const Expert& x, std::exception_ptr error) {
        Slot& slot = slots[s];
        if (error && !slot.error)
            slot.error = error;
        if (--slot.pending > 0)
            return;
        if (slot.error && slot.pins == 0) {  // a hint nobody waits for: forgotten
            where[static_cast<size_t>(slot.entry)] = NONE;
            slot = Slot{};
        } else {
            slot.state = State::ready;
            if (!slot.error) {
                counters.bytes_read += x.padded_size;
                counters.blobs_read += 1;
            }
        }
        done.notify_all();
    }

    /// Drops this call's pins (under mu) after a failure.
    void unpin(const std::vector<uint64_t>& pinned) {
        for (uint64_t s : pinned)
            slots[s].pins -= 1;
        for (uint64_t s : pinned)
            if (slots[s].error && slots[s].pins == 0) {
                where[static_cast<size_t>(slots[s].entry)] = NONE;
                slots[s] = Slot{};
            }
    }

    static constexpr unsigned MAX_IO_THREADS = 64;

    const Vault& v;
    uint64_t slot_size;
    uint64_t capacity = 0;
    std::unique_ptr<Policy> policy;
    Fd fd;
    bool direct = false;
    std::string refused;
    AlignedBuffer ring;

    std::mutex mu;  // everything below
    std::condition_variable job_ready, done;
    std::vector<Slot> slots;
    std::vector<int64_t> where;  // per table index: its slot, or NONE
    std::deque<Job> demands, hints;
    unsigned hint_limit = 0, hint_workers = 0;  // I/O threads hints may take, and take now
    bool stopping = false;
    CacheCounters counters;
    CacheCounters snapshot;  // what counters() returned last
    std::vector<std::thread> workers;
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
    std::unique_lock lock(m.mu);
    // Room check before anything changes: pinned now plus the new distinct ones.
    uint64_t pinned = 0;
    for (const Slot& x : m.slots)
        pinned += x.pins > 0;
    std::vector<uint32_t> fresh;
    for (uint32_t e : entries)
        if ((m.where[e] == NONE || m.slots[static_cast<size_t>(m.where[e])].pins == 0) &&
            std::find(fresh.begin(), fresh.end(), e) == fresh.end())
            fresh.push_back(e);
    if (pinned + fresh.size() > m.capacity)
        throw std::logic_error("expert cache: " + std::to_string(pinned + fresh.size()) +
                               " experts pinned at once, more than its " +
                               std::to_string(m.capacity) + " slots");
    m.policy->demand(layer, entries);
    // What is resident or on its way is pinned first, so that no load of this call evicts a
    // blob it asks for; a blob a hint is loading counts as a hit (no demand read for it).
    std::vector<uint64_t> mine;  // the slots this call pinned, one per distinct entry
    std::vector<uint32_t> loads;
    for (size_t i = 0; i < entries.size(); ++i) {
        const uint32_t e = entries[i];
        if (std::find(entries.begin(), entries.begin() + static_cast<ptrdiff_t>(i), e) !=
            entries.begin() + static_cast<ptrdiff_t>(i))
            continue;  // a repeat counts once
        if (m.where[e] == NONE) {
            loads.push_back(e);
            continue;
        }
        Slot& x = m.slots[static_cast<size_t>(m.where[e])];
        x.pins += 1;
        if (x.state == State::loading)
            m.promote(static_cast<uint64_t>(m.where[e]));
        mine.push_back(static_cast<uint64_t>(m.where[e]));
        m.counters.hits += 1;
    }
    const double t0 = now_seconds();
    for (uint32_t e : loads) {
        int64_t s = m.claim();
        while (s == NONE) {  // every other slot pinned or loading a hint: wait for one
            m.done.wait(lock);
            s = m.claim();
        }
        m.load(e, static_cast<uint64_t>(s), false);
        m.slots[static_cast<size_t>(s)].pins += 1;
        mine.push_back(static_cast<uint64_t>(s));
        m.counters.misses += 1;
    }
    m.done.wait(lock, [&] {
        return std::all_of(mine.begin(), mine.end(),
                           [&](uint64_t s) { return m.slots[s].state == State::ready; });
    });
    if (!loads.empty())
        m.counters.read_seconds += now_seconds() - t0;
    for (uint64_t s : mine)
        if (m.slots[s].error) {
            const std::exception_ptr error = m.slots[s].error;
            m.unpin(mine);
            std::rethrow_exception(error);
        }
    std::vector<const uint8_t*> out;
    out.reserve(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
        const auto s = static_cast<uint64_t>(m.where[entries[i]]);
        if (std::find(entries.begin(), entries.begin() + static_cast<ptrdiff_t>(i), entries[i]) !=
            entries.begin() + static_cast<ptrdiff_t>(i))
            m.slots[s].pins += 1;  // each occurrence is released once
        out.push_back(m.slot_data(s));
    }
    return out;
}

void ExpertCache::release(uint32_t layer, const std::vector<uint32_t>& experts) {
    Impl& m = *impl_;
    std::vector<uint32_t> entries;
    for (uint32_t x : experts)
        entries.push_back(m.entry(layer, x));
    const std::lock_guard lock(m.mu);
    for (uint32_t e : entries)
        if (m.where[e] == NONE || m.slots[static_cast<size_t>(m.where[e])].pins == 0)
            throw std::logic_error("expert cache: release of an expert not acquired");
    for (uint32_t e : entries)
        m.slots[static_cast<size_t>(m.where[e])].pins -= 1;
}

void ExpertCache::prefetch(uint32_t layer, const std::vector<uint32_t>& experts) {
    Impl& m = *impl_;
    std::vector<uint32_t> entries;
    for (uint32_t x : experts)
        if (const Expert* e = m.v.find(layer, x))  // a hint may name anything: ignored
            entries.push_back(static_cast<uint32_t>(e - m.v.experts.data()));
    const std::lock_guard lock(m.mu);
    m.policy->hint(layer, entries);
    for (uint32_t e : entries) {
        if (m.where[e] != NONE || m.hint_limit == 0)
            continue;
        const int64_t s = m.claim();
        if (s == NONE)
            return;
        m.load(e, static_cast<uint64_t>(s), true);
        m.counters.prefetched += 1;
    }
}

void ExpertCache::wait_idle() {
    Impl& m = *impl_;
    std::unique_lock lock(m.mu);
    m.done.wait(lock, [&] {
        return std::none_of(m.slots.begin(), m.slots.end(),
                            [](const Slot& x) { return x.state == State::loading; });
    });
}

const CacheCounters& ExpertCache::counters() const {
    const std::lock_guard lock(impl_->mu);
    impl_->snapshot = impl_->counters;
    return impl_->snapshot;
}

bool ExpertCache::direct() const {
    return impl_->direct;
}

const std::string& ExpertCache::direct_refused() const {
    return impl_->refused;
}

}  // namespace smoe::harness::engine
