// `smoe-stream bench`: expert streaming throughput next to the raw read bandwidth of the
// same file (the best of 1, 2 and 4 reader threads, in the same page-cached or O_DIRECT
// mode; stream and raw runs alternate, three rounds, and each side reports its best run),
// and dequant+SwiGLU throughput of the SIMD kernel next to the scalar reference loop.
#pragma once

#include "vault.hpp"

#include <cstdint>
#include <string>

namespace smoe::harness {

struct BenchOptions {
    unsigned threads = 1;  // the stream's threads; 0 ("auto"): the best of 1, 2, 4 and 8
    bool direct = false;   // O_DIRECT (falls back to buffered reads if refused)
    bool random = true;    // pattern: random (per layer, K experts) or seq
    unsigned topk = 0;     // 0: arch.moe_top_k, or 8 for a v1 vault
    double seconds = 2.0;  // the reads take twice this (the search, then the duel); each
                           // compute phase a quarter
    uint64_t seed = 1;
};

/// Runs the benchmark on an open, checked vault and returns its JSON report.
/// Throws IoError if reads fail.
std::string run_bench(const Vault& v, const BenchOptions& o);

}  // namespace smoe::harness
