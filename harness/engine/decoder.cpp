#include "engine/decoder.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

namespace smoe::harness::engine {

namespace {

float dot(const float* a, const float* b, uint32_t n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k)
            s[k] += a[i + k] * b[i + k];
    float tail = 0;
    for (; i < n; ++i)
        tail += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

float dot_bf16(const uint16_t* a, const float* b, uint32_t n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k)
            s[k] += std::bit_cast<float>(uint32_t{a[i + k]} << 16) * b[i + k];
    float tail = 0;
    for (; i < n; ++i)
        tail += std::bit_cast<float>(uint32_t{a[i]} << 16) * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

float silu(float x) {
    return x / (1.0f + std::exp(-x));
}
float sigmoid(float x) {
    return 1.0f / (1.0f + std::exp(-x));
}

/// The k largest of `score` (ties: the lower index first), in descending order. A NaN (from
/// a damaged weight) ranks below everything, so the order stays a strict weak one.
std::vector<uint32_t> top_k(std::vector<float> score, uint32_t k) {
    for (float& x : score)
        if (std::isnan(x))
            x = -std::numeric_limits<float>::infinity();
    std::vector<uint32_t> idx(score.size());
    std::iota(idx.begin(), idx.end(), 0u);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](uint32_t a, uint32_t b) {
        return score[a] != score[b] ? score[a] > score[b] : a < b;
    });
    idx.resize(k);
    return idx;
}

}  // namespace

void rms_norm(const float* x, const float* w, uint32_t n, float eps, float* out) {
    double ss = 0;
    for (uint32_t i = 0; i < n; ++i)
        ss += double(x[i]) * x[i];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
    for (uint32_t i = 0; i < n; ++i)
        out[i] = w[i] * (x[i] * r);
}

float Linear::dot_row(uint64_t r, const float* x) const {
    return w16.empty() ? dot(w.data() + r * cols, x, cols)
                       : dot_bf16(w16.data() + r * cols, x, cols);
}

void Linear::row(uint64_t r, float* out) const {
    for (uint32_t i = 0; i < cols; ++i)
        out[i] =
            w16.empty() ? w[r * cols + i] : std::bit_cast<float>(uint32_t{w16[r * cols + i]} << 16);
}

void matmul(ThreadPool& pool, const Linear& l, const float* x, size_t T, float* y) {
    pool.parallel_for(l.rows, [&](size_t begin, size_t end, unsigned) {
        for (size_t r = begin; r < end; ++r) {
            const float b = l.bias.empty() ? 0.0f : l.bias[r];
            for (size_t t = 0; t < T; ++t)
                y[t * l.rows + r] = l.dot_row(r, x + t * l.cols) + b;
        }
    });
}

Decoder::Decoder(const Vault& vault, const Model& model, ExpertCache& cache, ThreadPool& pool,
                 uint64_t max_positions)
    : vault_(vault),
      m_(model),
      cache_(cache),
      pool_(pool),
      max_positions_(max_positions),
      k_cache_(model.cfg.layers),
      v_cache_(model.cfg.layers),
      kernels_(pool.size()) {
    const ModelConfig& c = m_.cfg;
    next_moe_.assign(c.layers, c.layers);
    for (uint32_t L = c.layers; L-- > 1;)
        next_moe_[L - 1] = m_.layers[L].moe ? L : next_moe_[L];
    for (uint32_t i = 0; i < c.rotary_dim / 2; ++i)
        inv_freq_.push_back(static_cast<float>(
            1.0 / std::pow(double(c.rope_theta),
                           double(static_cast<float>(2 * i) / static_cast<float>(c.rotary_dim)))));
}

float* Decoder::kv_at(std::vector<std::vector<float>>& blocks, uint64_t pos) {
    const uint64_t kv_rows = uint64_t{m_.cfg.kv_heads} * m_.cfg.head_dim;
    while (blocks.size() <= pos / KV_BLOCK)
        blocks.emplace_back(KV_BLOCK * kv_rows);
    return blocks[pos / KV_BLOCK].data() + pos % KV_BLOCK * kv_rows;
}

const float* Decoder::kv_read(const std::vector<std::vector<float>>& blocks, uint64_t pos) const {
    const uint64_t kv_rows = uint64_t{m_.cfg.kv_heads} * m_.cfg.head_dim;
    return blocks[pos / KV_BLOCK].data() + pos % KV_BLOCK * kv_rows;
}

void Decoder::rope(float* x, uint32_t heads, uint64_t pos) const {
    const uint32_t half = m_.cfg.rotary_dim / 2;
    for (uint32_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos) * inv_freq_[i];
        const float c = std::cos(angle), s = std::sin(angle);
        for (uint32_t h = 0; h < heads; ++h) {
            float* p = x + uint64_t{h} * m_.cfg.head_dim;
            const float a = p[i], b = p[i + half];
            p[i] = a * c - b * s;
            p[i + half] = b * c + a * s;
        }
    }
}

void Decoder::attention(uint32_t layer, const std::vector<float>& h, size_t T,
                        std::vector<float>& out) {
    const ModelConfig& c = m_.cfg;
    const LayerWeights& l = m_.layers[layer];
    const uint32_t D = c.head_dim, q_rows = c.heads * D, kv_rows = c.kv_heads * D;
    std::vector<float> q(T * q_rows), k(T * kv_rows), v(T * kv_rows);
    matmul(pool_, l.q, h.data(), T, q.data());
    matmul(pool_, l.k, h.data(), T, k.data());
    matmul(pool_, l.v, h.data(), T, v.data());
    for (size_t t = 0; t < T; ++t) {
        float* qt = q.data() + t * q_rows;
        float* kt = k.data() + t * kv_rows;
        if (!l.q_norm.empty() && l.qk_norm_per_head) {
            for (uint32_t hd = 0; hd < c.heads; ++hd)
                rms_norm(qt + hd * D, l.q_norm.data(), D, c.eps, qt + hd * D);
            for (uint32_t hd = 0; hd < c.kv_heads; ++hd)
                rms_norm(kt + hd * D, l.k_norm.data(), D, c.eps, kt + hd * D);
        } else if (!l.q_norm.empty()) {
            rms_norm(qt, l.q_norm.data(), q_rows, c.eps, qt);
            rms_norm(kt, l.k_norm.data(), kv_rows, c.eps, kt);
        }
        if (c.rotary_dim > 0) {
            rope(qt, c.heads, pos_ + t);
            rope(kt, c.kv_heads, pos_ + t);
        }
        std::copy(kt, kt + kv_rows, kv_at(k_cache_[layer], pos_ + t));
        std::copy(v.data() + t * kv_rows, v.data() + (t + 1) * kv_rows,
                  kv_at(v_cache_[layer], pos_ + t));
    }
    std::vector<float> ctx(T * q_rows);
    const uint32_t group = c.heads / c.kv_heads;
    pool_.parallel_for(T * c.heads, [&](size_t begin, size_t end, unsigned) {
        std::vector<double> w;
        for (size_t job = begin; job < end; ++job) {
            const size_t t = job / c.heads;
            const uint32_t hd = static_cast<uint32_t>(job % c.heads), g = hd / group;
            const float* qh = q.data() + t * q_rows + hd * D;
            const uint64_t n = pos_ + t + 1;
            w.assign(n, 0.0);
            double top = -std::numeric_limits<double>::infinity(), sum = 0;
            for (uint64_t j = 0; j < n; ++j) {
                w[j] = double(dot(qh, kv_read(k_cache_[layer], j) + g * D, D)) * c.attention_scale;
                top = std::max(top, w[j]);
            }
            for (uint64_t j = 0; j < n; ++j)
                sum += (w[j] = std::exp(w[j] - top));
            float* o = ctx.data() + t * q_rows + hd * D;
            std::fill(o, o + D, 0.0f);
            for (uint64_t j = 0; j < n; ++j) {
                const float p = static_cast<float>(w[j] / sum);
                const float* vj = kv_read(v_cache_[layer], j) + g * D;
                for (uint32_t d = 0; d < D; ++d)
                    o[d] += p * vj[d];
            }
        }
    });
    out.assign(T * c.d_model, 0.0f);
    matmul(pool_, l.o, ctx.data(), T, out.data());
}

void Decoder::route(const LayerWeights& l, const float* logits, std::vector<uint32_t>& chosen,
                    std::vector<float>& weights) const {
    const ModelConfig& c = m_.cfg;
    const uint32_t E = c.experts;
    std::vector<float> score(E), choice(E);
    if (c.scoring == Scoring::softmax) {
        const float top = *std::max_element(logits, logits + E);
        double sum = 0;
        for (uint32_t e = 0; e < E; ++e)
            sum += (score[e] = std::exp(logits[e] - top));
        for (uint32_t e = 0; e < E; ++e)
            score[e] = static_cast<float>(score[e] / sum);
        choice = score;
    } else {
        for (uint32_t e = 0; e < E; ++e) {
            score[e] = sigmoid(logits[e]);
            choice[e] = score[e] + l.correction_bias[e];
        }
        if (c.n_group > 1) {  // keep the topk_group groups whose two best choices sum highest
            const uint32_t per = E / c.n_group;
            std::vector<float> group(c.n_group);
            for (uint32_t g = 0; g < c.n_group; ++g) {
                std::vector<float> part(choice.begin() + g * per, choice.begin() + (g + 1) * per);
                const auto best = top_k(part, 2);
                group[g] = part[best[0]] + part[best[1]];
            }
            const auto keep = top_k(group, c.topk_group);
            for (uint32_t g = 0; g < c.n_group; ++g)
                if (std::find(keep.begin(), keep.end(), g) == keep.end())
                    std::fill(choice.begin() + g * per, choice.begin() + (g + 1) * per,
                              -std::numeric_limits<float>::infinity());
        }
    }
    chosen = top_k(choice, c.top_k);
    weights.resize(c.top_k);
    float sum = 0;
    for (uint32_t i = 0; i < c.top_k; ++i)
        sum += (weights[i] = score[chosen[i]]);
    const float eps = c.scoring == Scoring::sigmoid ? 1e-20f : 0.0f;
    for (float& w : weights) {
        if (c.norm_topk)
            w /= sum + eps;
        w *= c.routed_scaling;
    }
}

void Decoder::routed(uint32_t layer, const std::vector<float>& h, size_t T,
                     std::vector<float>& out) {
    const ModelConfig& c = m_.cfg;
    const LayerWeights& l = m_.layers[layer];
    std::vector<float> logits(T * c.experts);
    matmul(pool_, l.router, h.data(), T, logits.data());
    std::vector<std::vector<uint32_t>> chosen(T);
    std::vector<std::vector<float>> weights(T);
    std::vector<uint32_t> uni;
    for (size_t t = 0; t < T; ++t) {
        route(l, logits.data() + t * c.experts, chosen[t], weights[t]);
        uni.insert(uni.end(), chosen[t].begin(), chosen[t].end());
    }
    std::sort(uni.begin(), uni.end());
    uni.erase(std::unique(uni.begin(), uni.end()), uni.end());
    steps_.push_back({static_cast<uint32_t>(pos_), layer, uni});
    // each (token, its i-th expert)'s output, summed per token in its router's order
    std::vector<float> part(T * c.top_k * c.d_model, 0.0f);
    for (const auto& [begin, end] : batches(uni.size(), cache_.capacity())) {
        const std::vector<uint32_t> batch(uni.begin() + begin, uni.begin() + end);
        const auto blobs = cache_.acquire(layer, batch);
        if (!guess_.experts.empty()) {  // after the demand: a hint never delays it
            cache_.prefetch(guess_.layer, guess_.experts);
            steps_.push_back(guess_);
            guess_.experts.clear();
        }
        struct Job {
            size_t t, i, b;
        };
        // expert by expert, so that a worker's consecutive jobs reuse a blob while it is in
        // the CPU's caches (a prefill chunk applies each expert to many tokens)
        std::vector<Job> jobs;
        for (size_t b = 0; b < batch.size(); ++b)
            for (size_t t = 0; t < T; ++t)
                for (size_t i = 0; i < c.top_k; ++i)
                    if (chosen[t][i] == batch[b])
                        jobs.push_back({t, i, b});
        const double t0 = now_seconds();
        try {
            pool_.parallel_for(jobs.size(), [&](size_t b0, size_t b1, unsigned worker) {
                for (size_t j = b0; j < b1; ++j) {
                    const Job& job = jobs[j];
                    const Expert* e = vault_.find(layer, batch[job.b]);
                    QTensor qt[3];
                    expert_tensors(*e, blobs[job.b], vault_.header.bits, qt);
                    kernels_[worker].forward(qt, h.data() + job.t * c.d_model,
                                             part.data() + (job.t * c.top_k + job.i) * c.d_model);
                }
            });
        } catch (...) {
            cache_.release(layer, batch);
            throw;
        }
        compute_.seconds += now_seconds() - t0;
        compute_.applied += jobs.size();
        for (const Job& job : jobs)
            compute_.weight_bytes += vault_.find(layer, batch[job.b])->raw_size;
        cache_.release(layer, batch);
    }
    for (size_t t = 0; t < T; ++t)
        for (size_t i = 0; i < c.top_k; ++i)
            for (uint32_t d = 0; d < c.d_model; ++d)
                out[t * c.d_model + d] += weights[t][i] * part[(t * c.top_k + i) * c.d_model + d];
}

void Decoder::mlp(uint32_t layer, const std::vector<float>& h, size_t T, std::vector<float>& out) {
    const ModelConfig& c = m_.cfg;
    const LayerWeights& l = m_.layers[layer];
    out.assign(T * c.d_model, 0.0f);
    auto swiglu = [&](const DenseMlp& mlp, std::vector<float>& y) {
        const uint32_t width = mlp.gate.rows;
        std::vector<float> g(T * width), u(T * width);
        matmul(pool_, mlp.gate, h.data(), T, g.data());
        matmul(pool_, mlp.up, h.data(), T, u.data());
        for (size_t i = 0; i < g.size(); ++i)
            g[i] = silu(g[i]) * u[i];
        y.assign(T * c.d_model, 0.0f);
        matmul(pool_, mlp.down, g.data(), T, y.data());
    };
    if (!l.moe) {
        swiglu(l.dense, out);
        return;
    }
    routed(layer, h, T, out);
    if (l.shared.present()) {
        std::vector<float> y;
        swiglu(l.shared, y);
        std::vector<float> gate(T, 1.0f);
        if (l.shared_gate.present()) {
            matmul(pool_, l.shared_gate, h.data(), T, gate.data());
            for (float& g : gate)
                g = sigmoid(g);
        }
        for (size_t t = 0; t < T; ++t)
            for (uint32_t d = 0; d < c.d_model; ++d)
                out[t * c.d_model + d] += gate[t] * y[t * c.d_model + d];
    }
}

void Decoder::guess_next(uint32_t layer, const std::vector<float>& x) {
    const uint32_t next = next_moe_[layer];
    if (next >= m_.cfg.layers)
        return;
    const LayerWeights& l = m_.layers[next];
    std::vector<float> h(m_.cfg.d_model), logits(m_.cfg.experts), weights;
    rms_norm(x.data(), l.post_norm.data(), m_.cfg.d_model, m_.cfg.eps, h.data());
    matmul(pool_, l.router, h.data(), 1, logits.data());
    guess_ = {static_cast<uint32_t>(pos_), next, {}, true};
    route(l, logits.data(), guess_.experts, weights);
}

std::vector<float> Decoder::feed(const std::vector<uint32_t>& tokens) {
    const ModelConfig& c = m_.cfg;
    const size_t T = tokens.size();
    if (T == 0 || pos_ + T > max_positions_)
        throw std::logic_error("decoder fed past its KV cache");
    std::vector<float> x(T * c.d_model), h(T * c.d_model), y;
    for (size_t t = 0; t < T; ++t) {
        m_.embed.row(tokens[t], x.data() + t * c.d_model);
        for (uint32_t d = 0; d < c.d_model; ++d)
            x[t * c.d_model + d] *= c.embedding_multiplier;
    }
    for (uint32_t L = 0; L < c.layers; ++L) {
        const LayerWeights& l = m_.layers[L];
        for (size_t t = 0; t < T; ++t)
            rms_norm(x.data() + t * c.d_model, l.input_norm.data(), c.d_model, c.eps,
                     h.data() + t * c.d_model);
        attention(L, h, T, y);
        for (size_t i = 0; i < x.size(); ++i)
            x[i] += y[i] * c.residual_multiplier;
        for (size_t t = 0; t < T; ++t)
            rms_norm(x.data() + t * c.d_model, l.post_norm.data(), c.d_model, c.eps,
                     h.data() + t * c.d_model);
        if (T == 1 && l.moe)
            guess_next(L, x);
        mlp(L, h, T, y);
        for (size_t i = 0; i < x.size(); ++i)
            x[i] += y[i] * c.residual_multiplier;
    }
    pos_ += T;
    std::vector<float> last(c.d_model), logits(c.vocab);
    rms_norm(x.data() + (T - 1) * c.d_model, m_.final_norm.data(), c.d_model, c.eps, last.data());
    // tied: the embeddings are the head (without a copy)
    matmul(pool_, m_.lm_head.present() ? m_.lm_head : m_.embed, last.data(), 1, logits.data());
    for (float& v : logits)
        v /= c.logits_scaling;
    return logits;
}

}  // namespace smoe::harness::engine
