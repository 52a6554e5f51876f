// The next token from a step's logits: greedy (the first of the largest) unless a
// temperature is given, then top-k and top-p (nucleus) filtering and a draw from a seeded
// generator, so that a seed reproduces a run.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace smoe::harness::engine {

struct SamplerOptions {
    double temperature = 0;  // 0: greedy
    uint32_t top_k = 0;      // 0: all
    double top_p = 1;        // 1: all
    uint64_t seed = 0;
};

class Sampler {
public:
    explicit Sampler(const SamplerOptions& o) : o_(o), rng_(o.seed) {}
    uint32_t next(const std::vector<float>& logits);

private:
    SamplerOptions o_;
    std::mt19937_64 rng_;
};

/// The index of the largest logit (the first of equals).
uint32_t argmax(const std::vector<float>& logits);

}  // namespace smoe::harness::engine
