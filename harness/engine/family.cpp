#include "engine/family.hpp"

#include "io.hpp"
#include "json_read.hpp"

#include <cstdio>

namespace smoe::harness::engine {

namespace {

const std::vector<FamilyRule>& rules() {
    static const std::vector<FamilyRule> all = {
        {"qwen3_moe", Scoring::softmax, {}},
        {"mixtral", Scoring::softmax, {}},
        {"olmoe", Scoring::softmax, {}},
        // the shared expert's width comes from the scout's shapes; its gate when the scout
        // has one
        {"qwen2_moe", Scoring::softmax, {{"shared_expert_intermediate_size", 0}}},
        {"granitemoe",
         Scoring::softmax,
         {{"embedding_multiplier", 1},
          {"attention_multiplier", 0},  // 0: 1/sqrt(head_dim), as when absent
          {"residual_multiplier", 1},
          {"logits_scaling", 1}}},
        // no key says so: minimax_m2 scores with a sigmoid plus a correction bias
        {"minimax_m2",
         Scoring::sigmoid,
         {{"rope_parameters.partial_rotary_factor", 1}, {"rotary_dim", 0}}},
        {"glm4_moe",
         Scoring::sigmoid,
         {{"rope_parameters.partial_rotary_factor", 0.5},
          {"partial_rotary_factor", 0.5},
          {"routed_scaling_factor", 1},
          {"n_group", 1},
          {"topk_group", 1}}},
    };
    return all;
}

/// A config copy larger than this is not a config.
constexpr size_t CONFIG_MAX_BYTES = size_t{16} << 20;

}  // namespace

const FamilyRule* family_rule(const std::string& model_type) {
    for (const FamilyRule& r : rules())
        if (model_type == r.model_type)
            return &r;
    return nullptr;
}

std::string families_run() {
    std::string s;
    for (const FamilyRule& r : rules())
        s += (s.empty() ? "" : ", ") + std::string(r.model_type);
    return s;
}

std::vector<std::string> split_families() {
    std::vector<std::string> out;
    for (const FamilyRule& r : rules())
        out.emplace_back(r.model_type);
    return out;
}

ConfigValues read_config(const std::string& path) {
    const auto bytes = read_whole_file(path, CONFIG_MAX_BYTES);
    const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    ConfigValues out;
    try {
        JsonReader(text, 64).validate();
        JsonReader j(text, 64);
        auto value = [&](const std::string& key, auto&& self, int depth) -> void {
            const JsonReader::Kind kind = j.peek();
            if (kind != JsonReader::Kind::null)
                out.set.insert(key);
            switch (kind) {
                case JsonReader::Kind::number:
                    out.numbers[key] = j.number().value;
                    break;
                case JsonReader::Kind::string:
                    out.texts[key] = j.string();
                    break;
                case JsonReader::Kind::boolean:
                    out.flags[key] = j.boolean();
                    break;
                case JsonReader::Kind::object:
                    if (depth == 0) {
                        j.object([&](std::string k) { self(key + "." + k, self, depth + 1); });
                        break;
                    }
                    j.skip();
                    break;
                default:
                    j.skip();
            }
        };
        j.object([&](std::string key) { value(key, value, 0); });
    } catch (const JsonSyntaxError& e) {
        throw RefusedInput(path + ": not a JSON config: " + e.what());
    }
    return out;
}

std::map<std::string, double> read_config_numbers(const std::string& path) {
    return read_config(path).numbers;
}

namespace {

/// A setting's value as a config writes it (8, 0.5), for messages.
std::string shown_number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

}  // namespace

Unimplemented unimplemented(const ConfigValues& cfg) {
    Unimplemented u;
    auto text = [&](const std::string& key) {
        auto it = cfg.texts.find(key);
        return it == cfg.texts.end() ? std::string() : it->second;
    };
    // RoPE scaling (YaRN, linear, dynamic, llama3, ...): only the plain rotation is run
    for (const char* key :
         {"rope_parameters.rope_type", "rope_scaling.rope_type", "rope_scaling.type"}) {
        const std::string kind = text(key);
        if (!kind.empty() && kind != "default")
            u.keys.push_back(std::string(key) + " " + kind);
    }
    if (cfg.set.count("rope_scaling") && text("rope_scaling.rope_type").empty() &&
        text("rope_scaling.type").empty())
        u.keys.emplace_back("rope_scaling (set, of no type the decoder knows)");
    if (auto it = cfg.numbers.find("clip_qkv"); it != cfg.numbers.end())
        u.keys.push_back("clip_qkv " + shown_number(it->second));
    auto window = cfg.numbers.find("sliding_window");
    auto use = cfg.flags.find("use_sliding_window");
    if (window != cfg.numbers.end() && window->second >= 1 &&
        (use == cfg.flags.end() || use->second))
        u.sliding_window =
            window->second >= 1e18 ? uint64_t{1} << 60 : static_cast<uint64_t>(window->second);
    return u;
}

}  // namespace smoe::harness::engine
