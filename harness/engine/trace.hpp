// Routing traces (docs/FORMAT.md, "Routing traces", schema smoe-trace/1): which experts each
// (token, layer) asked for, as JSON lines. The decoder writes one (TraceWriter), `replay`
// reads one back (read_trace, bounded) and both compare a cache's hit rate with Belady's
// optimum for the same trace and cache size (belady).
#pragma once

#include "io.hpp"
#include "vault.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace smoe::harness::engine {

/// The "schema" of a trace's first line.
inline constexpr const char* TRACE_SCHEMA = "smoe-trace/1";

/// Longest line read_trace accepts, and most lines.
inline constexpr size_t TRACE_MAX_LINE = 64 * 1024;
inline constexpr uint64_t TRACE_MAX_STEPS = uint64_t{1} << 24;

/// One layer of one token: the experts it asked for, in the order asked; or, for a hint
/// line, the experts the engine guessed it would ask for (ExpertCache::prefetch).
struct TraceStep {
    uint32_t token = 0;
    uint32_t layer = 0;
    std::vector<uint32_t> experts;
    bool hint = false;
};

/// The vault's identity in a trace: the CRC-32C of its header and expert table bytes, as
/// eight lower-case hex digits.
std::string vault_id(const Vault& v);

/// Writes a trace atomically: lines are buffered and written to a temporary file beside
/// `path`, which commit() renames into place (nothing appears at `path` without it).
class TraceWriter {
public:
    TraceWriter(const Vault& v, const std::string& path);
    void record(uint32_t token, uint32_t layer, const std::vector<uint32_t>& experts);
    /// A prefetch hint given before (token, layer) asked (a "hint" line).
    void hint(uint32_t token, uint32_t layer, const std::vector<uint32_t>& experts);
    void commit();

private:
    void flush();
    void line(uint32_t token, uint32_t layer, const char* key,
              const std::vector<uint32_t>& experts);
    AtomicFile file_;
    std::string buf_;
};

/// Reads a trace of `v` (throws RefusedInput naming the line for a malformed one, a trace
/// of another vault, a layer or expert the vault lacks, a repeated expert; IoError when it
/// cannot be read). Bounded: TRACE_MAX_LINE, TRACE_MAX_STEPS, experts per line at most the
/// router's width.
std::vector<TraceStep> read_trace(const std::string& path, const Vault& v);

/// Hits and misses of a cache over a trace.
struct HitCount {
    uint64_t hits = 0, misses = 0;
    double rate() const {
        return hits + misses == 0 ? 0.0 : static_cast<double>(hits) / double(hits + misses);
    }
};

/// Belady's optimum for a cache of `slots` blobs, by demand paging (hint lines are not
/// demands: they are left out): each step's experts are
/// pinned together (a step of more than `slots` experts in batches of `slots`, as the
/// decoder's prefill does), and a miss evicts the unpinned blob used again furthest ahead
/// (never again first). Exact: furthest-in-future is optimal with pinned sets too.
HitCount belady(const std::vector<TraceStep>& steps, uint64_t slots);
double belady_hit_rate(const std::vector<TraceStep>& steps, uint64_t slots);

/// The batches a step of `n` experts is acquired in for a cache of `slots`: [begin, end).
std::vector<std::pair<size_t, size_t>> batches(size_t n, uint64_t slots);

}  // namespace smoe::harness::engine
