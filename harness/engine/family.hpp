// The families the decoder runs: what each computes beyond the arch block (its router's
// scoring) and which config-copy keys it reads (the family registry's list for engines,
// smoe/families/registry.py `beyond`, and the manifest's source.family.config_keys).
#pragma once

#include <cstdint>
#include <map>
#include <set>
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

/// The settings of a config copy: top-level keys and one level inside objects
/// ("rope_parameters.partial_rotary_factor"), by kind. Bounded (RefusedInput for a
/// malformed or oversized file).
struct ConfigValues {
    std::map<std::string, double> numbers;
    std::map<std::string, std::string> texts;
    std::map<std::string, bool> flags;
    std::set<std::string> set;  // every key whose value is not null
};
ConfigValues read_config(const std::string& path);

/// The numeric settings alone (read_config's numbers).
std::map<std::string, double> read_config_numbers(const std::string& path);

/// The settings of a config copy that change the math and that the decoder does not
/// implement, one "key value" each (empty: none): a RoPE scaling other than the default, a
/// clip of q/k/v. A sliding window is returned apart (0: none), since it changes nothing
/// until the positions outgrow it.
struct Unimplemented {
    std::vector<std::string> keys;
    uint64_t sliding_window = 0;
};
Unimplemented unimplemented(const ConfigValues& cfg);

}  // namespace smoe::harness::engine
