// The families the decoder runs: what each computes beyond the arch block (its router's
// scoring) and which config-copy keys it reads (the family registry's list for engines,
// smoe/families/registry.py `beyond`, and the manifest's source.family.config_keys).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace smoe::harness::engine {

/// How a router turns logits into the weights of its chosen experts.
enum class Scoring {
    softmax,  // softmax over all experts, top-k, renormalised per the block's flag
    sigmoid,  // sigmoid, top-k of score + correction bias (groups first), weights the scores
};

struct FamilyRule {
    const char* model_type;
    Scoring scoring;
    /// Config-copy keys it reads ("a.b": key b of object a), each with transformers' default.
    std::vector<std::pair<const char*, double>> keys;
};

/// The rule of `model_type`, or nullptr when the decoder does not run it.
const FamilyRule* family_rule(const std::string& model_type);

/// The model types the decoder runs, comma-separated, for messages.
std::string families_run();
/// The same as a list.
std::vector<std::string> split_families();

/// The numeric settings of a config copy: top-level keys and one level
/// inside objects ("rope_parameters.partial_rotary_factor"). Bounded (RefusedInput for a
/// malformed or oversized file).
std::map<std::string, double> read_config_numbers(const std::string& path);

}  // namespace smoe::harness::engine
