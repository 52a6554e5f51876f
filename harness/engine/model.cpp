#include "engine/model.hpp"

#include <sys/stat.h>

#include "json_read.hpp"

#include <common.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

namespace smoe::harness::engine {

namespace {

/// The format document's Qwen3-family defaults, which a v1 vault (no arch block) runs with.
struct V1Defaults {
    static constexpr float rope_theta = 1e6f, eps = 1e-6f;
    static constexpr uint32_t top_k = 8, head_dim = 128;
    static constexpr bool norm_topk = true;
};

/// Where a language model's layers live, and the names of its pieces (transformers' own).
constexpr const char* PREFIXES[] = {"model.", "model.language_model.", ""};
constexpr const char* CONTAINERS[] = {"mlp", "block_sparse_moe"};
constexpr const char* ROUTERS[] = {"gate.weight", "router.layer.weight"};
constexpr const char* CORRECTION_BIASES[] = {"e_score_correction_bias",
                                             "gate.e_score_correction_bias"};
constexpr const char* SHARED[] = {"shared_expert.", "shared_experts."};

[[noreturn]] void refuse(const Scout& s, const std::string& why) {
    throw RefusedInput(s.path() + ": " + why);
}

std::vector<uint64_t> dims(std::initializer_list<uint32_t> d) {
    return std::vector<uint64_t>(d.begin(), d.end());
}

Linear linear(const Scout& s, const std::string& name, uint32_t rows, uint32_t cols) {
    Linear l;
    l.w16 = s.bf16(name + ".weight", dims({rows, cols}));
    if (l.w16.empty())
        l.w = s.floats(name + ".weight", dims({rows, cols}));
    l.rows = rows;
    l.cols = cols;
    if (s.find(name + ".bias"))
        l.bias = s.floats(name + ".bias", dims({rows}));
    return l;
}

/// A SwiGLU MLP under `at` ("...gate_proj" etc.), its width from the scout's shapes.
DenseMlp dense_mlp(const Scout& s, const std::string& at, uint32_t d_model) {
    const ScoutTensor* g = s.find(at + "gate_proj.weight");
    if (g == nullptr || g->shape.size() != 2 || g->shape[1] != d_model || g->shape[0] == 0 ||
        g->shape[0] > (uint64_t{1} << 20))
        refuse(s, at + "gate_proj.weight: missing or not [width, " + std::to_string(d_model) + "]");
    const auto width = static_cast<uint32_t>(g->shape[0]);
    DenseMlp m;
    m.gate = linear(s, at + "gate_proj", width, d_model);
    m.up = linear(s, at + "up_proj", width, d_model);
    m.down = linear(s, at + "down_proj", d_model, width);
    return m;
}

std::string find_prefix(const Scout& s) {
    for (const char* p : PREFIXES)
        if (s.find(std::string(p) + "embed_tokens.weight"))
            return p;
    refuse(s, "no token embedding (embed_tokens.weight)");
}

uint32_t scout_layers(const Scout& s, const std::string& prefix) {
    uint32_t n = 0;
    while (n < 100000 && s.find(prefix + "layers." + std::to_string(n) + ".input_layernorm.weight"))
        ++n;
    return n;
}

/// The keys of the manifest's source.family.config_keys (what an engine must read beyond the
/// block), or empty when there is no readable manifest.
std::vector<std::string> manifest_config_keys(const std::string& path) {
    std::vector<std::string> keys;
    try {
        const auto bytes = read_whole_file(path, size_t{256} << 20);
        const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
        JsonReader(text, 64).validate();
        JsonReader j(text, 64);
        auto skip_unless = [&](const std::string& k, const char* want, auto&& then) {
            if (k == want && j.peek() == JsonReader::Kind::object)
                then();
            else
                j.skip();
        };
        j.object([&](std::string k) {
            skip_unless(k, "source", [&] {
                j.object([&](std::string k2) {
                    skip_unless(k2, "family", [&] {
                        j.object([&](std::string k3) {
                            if (k3 == "config_keys" && j.peek() == JsonReader::Kind::array)
                                j.array([&](size_t) {
                                    if (j.peek() == JsonReader::Kind::string)
                                        keys.push_back(j.string());
                                    else
                                        j.skip();
                                });
                            else
                                j.skip();
                        });
                    });
                });
            });
        });
    } catch (const std::exception&) {
        keys.clear();
    }
    return keys;
}

/// Config keys beyond the block that the decoder answers from the scout's shapes (biases,
/// q/k norms, dense layers, shared experts) or may ignore (multi-token prediction layers,
/// which no vault holds).
constexpr const char* ANSWERED_BY_SHAPES[] = {
    "attention_bias",
    "qkv_bias",
    "use_qk_norm",
    "first_k_dense_replace",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "mlp_only_layers",
    "decoder_sparse_step",
    "num_nextn_predict_layers",
};

/// Whether the decoder implements config key `key` for some family it runs.
bool implemented(const std::string& key) {
    for (const char* k : ANSWERED_BY_SHAPES)
        if (key == k)
            return true;
    for (const std::string& run : split_families())
        for (const auto& [k, dflt] : family_rule(run)->keys)
            if (key == k || "rope_parameters." + key == k)
                return true;
    return false;
}

[[noreturn]] void refuse_family(const Vault& v, const std::string& model_type) {
    std::string missing;
    for (const std::string& key : manifest_config_keys(beside(v.name, ".smoe.manifest.json")))
        if (!implemented(key))
            missing += (missing.empty() ? "" : ", ") + key;
    std::string why = v.name + ": model type '" + model_type + "' is not one the decoder runs (" +
                      families_run() + ")";
    why += missing.empty() ? "; its computation beyond the arch block is not implemented"
                           : "; it does not implement: " + missing;
    throw RefusedInput(why);
}

std::string block_model_type(const SmoeArchBlock& a) {
    const auto* mt = reinterpret_cast<const char*>(a.model_type);
    return std::string(mt, strnlen(mt, sizeof a.model_type));
}

/// The math: from the block (v2), or the Qwen3 defaults with the scout's shapes (v1).
ModelConfig config_of(const Vault& v, const Scout& s, const std::string& prefix,
                      std::vector<std::string>& warnings) {
    ModelConfig c;
    c.d_model = v.header.d_model;
    c.vocab = v.header.vocab_size;
    c.experts = v.header.max_experts_per_layer;
    if (v.arch) {
        const SmoeArchBlock& a = *v.arch;
        c.model_type = block_model_type(a);
        c.layers = a.num_hidden_layers;
        c.heads = a.num_heads;
        c.kv_heads = a.num_kv_heads;
        c.head_dim = a.head_dim;
        c.top_k = a.moe_top_k;
        c.eps = a.rms_norm_eps;
        c.rope_theta = a.rope_theta;
        c.norm_topk = (a.flags & 1u) != 0;
        return c;
    }
    c.model_type = "qwen3_moe";
    const ScoutTensor* qn = s.find(prefix + "layers.0.self_attn.q_norm.weight");
    c.head_dim = qn && qn->shape.size() == 1 && qn->shape[0] > 0 && qn->shape[0] <= 256
                     ? static_cast<uint32_t>(qn->shape[0])
                     : V1Defaults::head_dim;
    const ScoutTensor* q = s.find(prefix + "layers.0.self_attn.q_proj.weight");
    const ScoutTensor* k = s.find(prefix + "layers.0.self_attn.k_proj.weight");
    if (!q || !k || q->shape.size() != 2 || k->shape.size() != 2 || q->shape[0] % c.head_dim ||
        k->shape[0] % c.head_dim || k->shape[0] == 0 || q->shape[0] > (uint64_t{1} << 24))
        refuse(s, "a v1 vault's scout without layer 0's q_proj and k_proj in whole heads");
    c.heads = static_cast<uint32_t>(q->shape[0] / c.head_dim);
    c.kv_heads = static_cast<uint32_t>(k->shape[0] / c.head_dim);
    c.layers = scout_layers(s, prefix);
    c.top_k = V1Defaults::top_k;
    c.eps = V1Defaults::eps;
    c.rope_theta = V1Defaults::rope_theta;
    c.norm_topk = V1Defaults::norm_topk;
    warnings.push_back(v.name +
                       ": a v1 vault (no arch block): running it with the Qwen3 family's "
                       "defaults (rope_theta 1e6, eps 1e-6, top-k 8, top-k renormalised), "
                       "heads and head_dim from the scout's shapes");
    return c;
}

/// The family's config-copy keys, into the config (only the keys its rule names).
void apply_family(ModelConfig& c, const FamilyRule& rule, const std::string& config_path,
                  std::vector<std::string>& warnings) {
    c.scoring = rule.scoring;
    // read whenever it is there (the settings no rule names may still change the math);
    // required when the rule names keys
    struct stat st {};
    ConfigValues all;
    if (!rule.keys.empty() || ::stat(config_path.c_str(), &st) == 0)
        all = read_config(config_path);
    const Unimplemented u = unimplemented(all);
    if (!u.keys.empty()) {
        std::string what;
        for (const std::string& k : u.keys)
            what += (what.empty() ? "" : ", ") + k;
        throw RefusedInput(config_path + ": sets what the decoder does not implement: " + what);
    }
    c.sliding_window = u.sliding_window;
    const std::map<std::string, double>& cfg = all.numbers;
    auto key = [&](const char* name, double fallback) {
        for (const auto& [k, dflt] : rule.keys)
            if (std::string(k) == name) {
                auto it = cfg.find(name);
                return it == cfg.end() ? dflt : it->second;
            }
        return fallback;
    };
    // the rotary share of a head: rope_parameters' partial_rotary_factor, else the top-level
    // one, else a legacy rotary_dim (released MiniMax-M2 configs), else the family's default
    const bool names_rotary_dim = key("rotary_dim", -1) >= 0 && cfg.count("rotary_dim");
    double partial = key("rope_parameters.partial_rotary_factor", -1);
    if (!cfg.count("rope_parameters.partial_rotary_factor")) {
        if (cfg.count("partial_rotary_factor"))
            partial = key("partial_rotary_factor", partial);
        else if (names_rotary_dim)
            partial = cfg.at("rotary_dim") / c.head_dim;
        else
            partial = key("partial_rotary_factor", partial < 0 ? 1.0 : partial);
    }
    if (!(partial > 0 && partial <= 1))
        throw RefusedInput(config_path + ": partial_rotary_factor " + std::to_string(partial) +
                           " outside (0, 1]");
    c.rotary_dim = c.rope_theta > 0 ? static_cast<uint32_t>(c.head_dim * partial) & ~1u : 0;
    c.embedding_multiplier = static_cast<float>(key("embedding_multiplier", 1));
    c.residual_multiplier = static_cast<float>(key("residual_multiplier", 1));
    c.logits_scaling = static_cast<float>(key("logits_scaling", 1));
    if (c.logits_scaling == 0)
        throw RefusedInput(config_path + ": logits_scaling 0");
    const double attn = key("attention_multiplier", 0);
    c.attention_scale = attn != 0 ? static_cast<float>(attn)
                                  : static_cast<float>(1.0 / std::sqrt(double(c.head_dim)));
    c.routed_scaling = static_cast<float>(key("routed_scaling_factor", 1));
    const double groups = key("n_group", 1), top_groups = key("topk_group", 1);
    if (!(groups >= 1 && groups <= c.experts && top_groups >= 1 && top_groups <= groups) ||
        c.experts % static_cast<uint32_t>(groups) != 0)
        throw RefusedInput(config_path + ": n_group / topk_group do not divide the experts");
    c.n_group = static_cast<uint32_t>(groups);
    c.topk_group = static_cast<uint32_t>(top_groups);
    if (c.n_group > 1 && c.experts / c.n_group < 2)
        throw RefusedInput(config_path + ": groups of fewer than 2 experts");
    (void)warnings;
}

void load_attention(const Scout& s, const std::string& at, const ModelConfig& c, LayerWeights& l) {
    const uint32_t q_rows = c.heads * c.head_dim, kv_rows = c.kv_heads * c.head_dim;
    l.q = linear(s, at + "q_proj", q_rows, c.d_model);
    l.k = linear(s, at + "k_proj", kv_rows, c.d_model);
    l.v = linear(s, at + "v_proj", kv_rows, c.d_model);
    l.o = linear(s, at + "o_proj", c.d_model, q_rows);
    const ScoutTensor* qn = s.find(at + "q_norm.weight");
    const ScoutTensor* kn = s.find(at + "k_norm.weight");
    if ((qn == nullptr) != (kn == nullptr))
        refuse(s, at + ": a q norm without a k norm, or the reverse");
    if (qn == nullptr)
        return;
    l.qk_norm_per_head = qn->shape == dims({c.head_dim});
    l.q_norm = s.floats(at + "q_norm.weight", dims({l.qk_norm_per_head ? c.head_dim : q_rows}));
    l.k_norm = s.floats(at + "k_norm.weight", dims({l.qk_norm_per_head ? c.head_dim : kv_rows}));
}

void load_mlp(const Scout& s, const std::string& layer_at, const ModelConfig& c, bool moe,
              LayerWeights& l) {
    l.moe = moe;
    for (const char* container : CONTAINERS) {
        const std::string at = layer_at + container + ".";
        if (!moe) {
            if (s.find(at + "gate_proj.weight")) {
                l.dense = dense_mlp(s, at, c.d_model);
                return;
            }
            continue;
        }
        for (const char* router : ROUTERS) {
            if (!s.find(at + router))
                continue;
            const std::string name = at + router;
            l.router = linear(s, name.substr(0, name.size() - std::strlen(".weight")), c.experts,
                              c.d_model);
            for (const char* bias : CORRECTION_BIASES)
                if (s.find(at + bias))
                    l.correction_bias = s.floats(at + bias, dims({c.experts}));
            for (const char* shared : SHARED)
                if (s.find(at + shared + "gate_proj.weight"))
                    l.shared = dense_mlp(s, at + shared, c.d_model);
            if (s.find(at + "shared_expert_gate.weight"))
                l.shared_gate = linear(s, at + "shared_expert_gate", 1, c.d_model);
            return;
        }
    }
    refuse(s, layer_at + (moe ? ": no router for the vault's experts"
                              : ": no experts in the vault and no dense MLP in the scout"));
}

/// Warnings where the block's structural fields and the scout's shapes disagree (the
/// scout wins: "shapes don't lie").
void compare_block(const Vault& v, const Model& m, std::vector<std::string>& warnings) {
    if (!v.arch)
        return;
    const SmoeArchBlock& a = *v.arch;
    auto warn = [&](const std::string& what) {
        warnings.push_back(v.name + ": the arch block " + what + "; the scout's shapes win");
    };
    const bool qk = !m.layers.empty() && !m.layers[0].q_norm.empty();
    if (qk != ((a.flags & 2u) != 0))
        warn(std::string("says has_qk_norm ") + ((a.flags & 2u) ? "1" : "0") + ", the scout " +
             (qk ? "has" : "has no") + " q/k norms");
    const bool dense0 = !m.layers.empty() && !m.layers[0].moe;
    if (dense0 != ((a.flags & 4u) != 0))
        warn(std::string("says has_dense_layer_0 ") + ((a.flags & 4u) ? "1" : "0") +
             ", the scout's layer 0 is " + (dense0 ? "dense" : "MoE"));
    for (const LayerWeights& l : m.layers) {
        if (l.shared.present() && l.shared.gate.rows != a.shared_expert_ffn_dim) {
            warn("says shared_expert_ffn_dim " + std::to_string(a.shared_expert_ffn_dim) +
                 ", the scout's shared expert is " + std::to_string(l.shared.gate.rows) + " wide");
            break;
        }
        if (l.moe && !l.shared.present() && a.shared_expert_ffn_dim != 0) {
            warn("says shared_expert_ffn_dim " + std::to_string(a.shared_expert_ffn_dim) +
                 ", the scout has no shared expert");
            break;
        }
    }
}

/// The MoE layers of the vault, each whole (every expert of the router's width) and each
/// expert's matrices the shapes the kernel is given (gate, up [I, d_model], down
/// [d_model, I]): a partial vault or an odd expert cannot run.
std::set<uint32_t> check_experts(const Vault& v, const ModelConfig& c) {
    std::map<uint32_t, uint32_t> per_layer;
    for (const Expert& e : v.experts) {
        if (e.layer_id >= c.layers)
            throw RefusedInput(v.name + ": experts of layer " + std::to_string(e.layer_id) +
                               " in a model of " + std::to_string(c.layers) + " layers");
        const Tensor* t = e.tensors;
        if (t[0].cols != c.d_model || t[1].cols != c.d_model || t[2].rows != c.d_model ||
            t[1].rows != t[0].rows || t[2].cols != t[0].rows)
            throw RefusedInput(v.name + ": expert " + std::to_string(e.expert_id) + " of layer " +
                               std::to_string(e.layer_id) +
                               ": its matrices are not a SwiGLU expert of d_model " +
                               std::to_string(c.d_model));
        ++per_layer[e.layer_id];
    }
    std::set<uint32_t> layers;
    for (const auto& [layer, n] : per_layer) {
        if (n != c.experts)
            throw RefusedInput(v.name + ": a partial vault (layer " + std::to_string(layer) +
                               " holds " + std::to_string(n) + " of " + std::to_string(c.experts) +
                               " experts): the decoder needs every expert the router may pick");
        layers.insert(layer);
    }
    return layers;
}

}  // namespace

std::string beside(const std::string& vault_path, const std::string& suffix) {
    std::string stem = vault_path;
    const std::string ext = ".smoe";
    if (stem.size() > ext.size() && stem.compare(stem.size() - ext.size(), ext.size(), ext) == 0)
        stem.resize(stem.size() - ext.size());
    return stem + suffix;
}

Model build_model(const Vault& v, const Scout& s, const std::string& config_path) {
    Model m;
    const std::string prefix = find_prefix(s);
    m.cfg = config_of(v, s, prefix, m.warnings);
    ModelConfig& c = m.cfg;
    const FamilyRule* rule = family_rule(c.model_type);
    if (rule == nullptr)
        refuse_family(v, c.model_type);
    apply_family(c, *rule, config_path, m.warnings);
    if (c.top_k == 0 || c.top_k > c.experts)
        throw RefusedInput(v.name + ": top-k " + std::to_string(c.top_k) + " of " +
                           std::to_string(c.experts) + " experts per layer");
    if (c.layers == 0 || c.layers > 4096)
        throw RefusedInput(v.name + ": " + std::to_string(c.layers) + " layers");
    m.embed = linear(s, prefix + "embed_tokens", c.vocab, c.d_model);
    m.final_norm = s.floats(prefix + "norm.weight", dims({c.d_model}));
    if (s.find("lm_head.weight"))
        m.lm_head = linear(s, "lm_head", c.vocab, c.d_model);
    const std::set<uint32_t> moe = check_experts(v, c);
    const uint32_t in_scout = scout_layers(s, prefix);
    if (in_scout != c.layers)
        refuse(s, std::to_string(in_scout) + " layers, the vault's model has " +
                      std::to_string(c.layers) + " (a scout of another model?)");
    m.layers.resize(c.layers);
    for (uint32_t L = 0; L < c.layers; ++L) {
        const std::string at = prefix + "layers." + std::to_string(L) + ".";
        LayerWeights& l = m.layers[L];
        l.input_norm = s.floats(at + "input_layernorm.weight", dims({c.d_model}));
        l.post_norm = s.floats(at + "post_attention_layernorm.weight", dims({c.d_model}));
        load_attention(s, at + "self_attn.", c, l);
        load_mlp(s, at, c, moe.count(L) != 0, l);
        if (l.moe && c.scoring == Scoring::sigmoid && l.correction_bias.empty())
            l.correction_bias.assign(c.experts, 0.0f);
    }
    compare_block(v, m, m.warnings);
    return m;
}

}  // namespace smoe::harness::engine
