// The decoder: tokens through the model, layer-major. A chunk of tokens crosses one layer
// at a time: attention (RoPE, GQA, q/k norms, the KV cache), then the router's exact top-k
// for every token, the union of the chosen experts acquired from the cache once for the
// chunk (in batches of at most its capacity), each expert applied straight from its slot by
// the SIMD kernel, the shared expert and the dense layers from the scout.
#pragma once

#include "engine/cache.hpp"
#include "engine/model.hpp"
#include "engine/threads.hpp"
#include "engine/trace.hpp"
#include "quant.hpp"

#include <cstdint>
#include <vector>

namespace smoe::harness::engine {

/// The routed experts' compute, counted where it happens: every expert applied to a token,
/// its blob's bytes (raw_size: codes and scales), the wall time of the kernels' sections.
struct ExpertCompute {
    uint64_t applied = 0, weight_bytes = 0;
    double seconds = 0;
};

class Decoder {
public:
    /// `max_positions`: the most tokens the KV cache holds (prompt + new tokens).
    Decoder(const Vault& vault, const Model& model, ExpertCache& cache, ThreadPool& pool,
            uint64_t max_positions);

    /// Feeds `tokens` at the next positions (layer-major) and returns the logits of the last
    /// one (vocab floats). Each must be below the vocabulary (checked by the caller).
    std::vector<float> feed(const std::vector<uint32_t>& tokens);

    uint64_t position() const { return pos_; }

    /// The routing trace so far: per chunk and MoE layer, the experts acquired (a chunk's
    /// union, sorted), under the position of the chunk's first token; and the hints: while a
    /// decoded token's MoE layer runs, the next MoE layer's router applied early (to the
    /// residual stream as it is, under that layer's norm) names the experts the cache may
    /// prefetch at low priority.
    const std::vector<TraceStep>& steps() const { return steps_; }
    const ExpertCompute& expert_compute() const { return compute_; }

private:
    void attention(uint32_t layer, const std::vector<float>& h, size_t T, std::vector<float>& out);
    void mlp(uint32_t layer, const std::vector<float>& h, size_t T, std::vector<float>& out);
    void routed(uint32_t layer, const std::vector<float>& h, size_t T, std::vector<float>& out);
    void route(const LayerWeights& l, const float* logits, std::vector<uint32_t>& chosen,
               std::vector<float>& weights) const;
    void rope(float* x, uint32_t heads, uint64_t pos) const;
    void guess_next(uint32_t layer, const std::vector<float>& x);

    const Vault& vault_;
    const Model& m_;
    ExpertCache& cache_;
    ThreadPool& pool_;
    std::vector<TraceStep> steps_;
    ExpertCompute compute_;
    std::vector<uint32_t> next_moe_;  // per layer: the next MoE layer (layers when none)
    TraceStep guess_;                 // the next MoE layer's likely experts, to prefetch
    uint64_t max_positions_, pos_ = 0;
    /// The KV cache: per layer, blocks of KV_BLOCK positions x kv_rows, added as positions
    /// are filled (memory follows the tokens seen, not the most a run may see).
    static constexpr uint64_t KV_BLOCK = 256;
    std::vector<std::vector<std::vector<float>>> k_cache_, v_cache_;
    float* kv_at(std::vector<std::vector<float>>& blocks, uint64_t pos);  // adds blocks
    const float* kv_read(const std::vector<std::vector<float>>& blocks, uint64_t pos) const;
    std::vector<ExpertKernel> kernels_;  // one per worker
    std::vector<float> inv_freq_;
};

/// y[t, r] = W[r] . x[t] + b[r] for T inputs, rows split over the pool.
void matmul(ThreadPool& pool, const Linear& l, const float* x, size_t T, float* y);

/// RMS norm of n floats with weight w (eps as the model's).
void rms_norm(const float* x, const float* w, uint32_t n, float eps, float* out);

}  // namespace smoe::harness::engine
