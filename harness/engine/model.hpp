// The model a vault describes: the header and the arch block give the math (widths, heads,
// top-k, RoPE base, eps, the router's renormalisation), the scout's tensor names and shapes
// give the structure (q/k norms and their span, biases, dense layers, shared experts and
// their gate, a tied LM head), the config copy only the keys a family's rule names
// (family.hpp). Routed experts stay in the vault (the cache reads them).
#pragma once

#include "engine/family.hpp"
#include "engine/scout.hpp"
#include "vault.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace smoe::harness::engine {

/// A dense weight matrix of the scout, [rows, cols] row-major, with its bias when it has one.
/// BF16 weights stay BF16 (`w16`, widened as used: the resident trunk is the scout's size);
/// other dtypes are widened to float32 once (`w`).
struct Linear {
    std::vector<float> w, bias;
    std::vector<uint16_t> w16;
    uint32_t rows = 0, cols = 0;
    bool present() const { return rows != 0; }
    /// Row r . x (cols floats).
    float dot_row(uint64_t r, const float* x) const;
    /// Row r as floats, into out.
    void row(uint64_t r, float* out) const;
};

/// A SwiGLU MLP held in the scout (a dense layer's, or a shared expert's).
struct DenseMlp {
    Linear gate, up, down;
    bool present() const { return gate.present(); }
};

struct LayerWeights {
    std::vector<float> input_norm, post_norm;
    Linear q, k, v, o;
    std::vector<float> q_norm, k_norm;  // empty: none
    bool qk_norm_per_head = true;       // false: over the whole projection
    bool moe = false;                   // routed experts in the vault
    Linear router;
    std::vector<float> correction_bias;  // sigmoid scoring: added for the choice only
    DenseMlp shared;
    Linear shared_gate;  // [1, d_model]: sigmoid(gate . x) scales the shared expert
    DenseMlp dense;      // a layer without routed experts
};

struct ModelConfig {
    std::string model_type;
    uint32_t d_model = 0, vocab = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
    uint32_t experts = 0, top_k = 0, rotary_dim = 0;
    float eps = 1e-6f, rope_theta = 0;
    bool norm_topk = false;
    Scoring scoring = Scoring::softmax;
    float attention_scale = 0;  // multiplies q.k
    float embedding_multiplier = 1, residual_multiplier = 1, logits_scaling = 1;
    float routed_scaling = 1;
    uint32_t n_group = 1, topk_group = 1;
    uint64_t sliding_window = 0;  // the config copy's attention window (0: none)
};

struct Model {
    ModelConfig cfg;
    Linear embed;  // [vocab, d_model]
    std::vector<float> final_norm;
    Linear lm_head;  // empty when tied to the embeddings
    std::vector<LayerWeights> layers;
    /// Contradictions between the block and the scout, and the v1 defaults taken: one line
    /// each, for the command to print.
    std::vector<std::string> warnings;
};

/// Builds the model (RefusedInput, one line, for what cannot run: a family the decoder does
/// not run, a scout whose shapes contradict the vault, a missing tensor).
/// `config_path`: the config copy (read only for the keys of the family's rule; may be
/// absent when the rule names none).
Model build_model(const Vault& vault, const Scout& scout, const std::string& config_path);

/// The companion files of a vault STEM.smoe: STEM.scout.safetensors, STEM.config.json,
/// STEM.smoe.manifest.json.
std::string beside(const std::string& vault_path, const std::string& suffix);

}  // namespace smoe::harness::engine
