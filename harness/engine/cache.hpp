// The expert cache of the streaming decoder: a ring of 16 KiB-aligned slots, each holding one
// expert blob read whole (ExpertEntry byte_offset, padded_size) by a pool of I/O threads with
// O_DIRECT (buffered where the file system refuses it), kept as a cache after use and evicted
// only to make room for a new load, never while pinned. Which resident blob a load evicts is
// the eviction policy's choice (a small strategy object chosen by name: policy_names()).
#pragma once

#include "vault.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace smoe::harness::engine {

struct CacheOptions {
    uint64_t slots = 0;       // blobs the ring holds (each slot = the vault's largest padded_size,
                              // 16 KiB aligned)
    unsigned io_threads = 1;  // pread workers
    bool direct = true;       // O_DIRECT; falls back to buffered (warning) where refused
    std::string policy = "cycle";  // eviction policy, one of policy_names()
};

struct CacheCounters {  // counted where the work happens
    uint64_t hits = 0, misses = 0, bytes_read = 0, blobs_read = 0, prefetched = 0;
    double read_seconds = 0;  // wall time the demand reads took (for achieved throughput)
};

/// The eviction policies by name ("lru", "cycle", ...); the first is the default's peer
/// (plain LRU), DEFAULT_POLICY the one the engine uses.
const std::vector<std::string>& policy_names();
inline constexpr const char* DEFAULT_POLICY = "cycle";

/// Routed experts per token the vault's model picks: the arch block's moe_top_k; a v1
/// vault has no block and takes the Qwen3 family's 8.
uint32_t vault_top_k(const Vault& v);

/// The MoE layers of the vault (the layers its expert table names), ascending: the cycle
/// every token walks.
std::vector<uint32_t> moe_layers(const Vault& v);

class ExpertCache {
public:
    /// Throws RefusedInput when opt.slots < min_slots(vault), or for an unknown policy
    /// (std::invalid_argument: a caller bug, names are checked by the command line).
    ExpertCache(const Vault& vault, const CacheOptions& opt);
    ~ExpertCache();  // joins the I/O threads
    ExpertCache(const ExpertCache&) = delete;
    ExpertCache& operator=(const ExpertCache&) = delete;

    /// One layer's top-k blobs (vault_top_k, at most the router's width).
    static uint64_t min_slots(const Vault& v);
    /// Slots that fit in `bytes`.
    static uint64_t slots_for_bytes(const Vault& v, uint64_t bytes);
    /// Bytes of one slot: the vault's largest padded_size (at least one 16 KiB page).
    static uint64_t slot_bytes(const Vault& v);

    /// The slots of the ring: opt.slots, but never more than the vault has blobs (a larger
    /// cache would hold nothing more) nor fewer than min_slots.
    uint64_t capacity() const;

    /// Makes (layer, experts[i]) resident and pinned; returns each blob's bytes (offset 0 of
    /// the blob) in the same order. Blocks until all are ready. At most capacity() distinct
    /// experts pinned at once (throws std::logic_error otherwise: a caller bug), each one an
    /// entry of the vault (std::out_of_range otherwise). A read that fails throws its
    /// ReadFailed here.
    std::vector<const uint8_t*> acquire(uint32_t layer, const std::vector<uint32_t>& experts);
    /// Unpins them (they stay cached until evicted by a new load).
    void release(uint32_t layer, const std::vector<uint32_t>& experts);
    /// Low-priority hint (may be a no-op): these will likely be needed soon; never delays a
    /// demand read.
    void prefetch(uint32_t layer, const std::vector<uint32_t>& experts);

    /// Waits until no read is in flight (hints included): counters() are then final.
    void wait_idle();

    const CacheCounters& counters() const;
    bool direct() const;  // false when O_DIRECT was refused (buffered reads)
    /// Why O_DIRECT was refused ("" when it was not asked for or not refused): the one
    /// warning a command prints.
    const std::string& direct_refused() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace smoe::harness::engine
