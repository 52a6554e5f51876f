#include "engine/policy.hpp"

#include "engine/cache.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace smoe::harness::engine {

namespace {

/// Plain LRU: the blob used longest ago goes (the original engine's policy; the worst case
/// for the layer cycle, where the blob used longest ago is often the next one needed).
class Lru final : public Policy {
public:
    explicit Lru(const Vault& v) : last_(v.experts.size(), 0) {}
    void demand(uint32_t, const std::vector<uint32_t>& entries) override {
        for (uint32_t e : entries)  // a tick each, in the order asked: never a tie
            last_[e] = ++tick_;
    }
    size_t victim(const std::vector<uint32_t>& candidates) override {
        size_t best = 0;
        for (size_t i = 1; i < candidates.size(); ++i)
            if (last_[candidates[i]] < last_[candidates[best]])
                best = i;
        return best;
    }

private:
    uint64_t tick_ = 0;
    std::vector<uint64_t> last_;
};

/// Cycle-aware: every token walks the MoE layers in order, so a blob of layer l can next be
/// used when the walk comes round to l, d layer steps ahead (1..L), and is used then with a
/// probability p learnt from that layer's past visits (an exponential average of "was it
/// chosen"). Its expected distance to its next use is d + L (1 - p) / p; the blob expected
/// furthest ahead is evicted (Belady's rule on expectations).
class Cycle final : public Policy {
public:
    explicit Cycle(const Vault& v) : entries_(v.experts.size()) {
        const std::vector<uint32_t> layers = moe_layers(v);
        pos_of_.assign(layers.empty() ? 1 : layers.back() + 1, 0);
        for (uint32_t i = 0; i < layers.size(); ++i)
            pos_of_[layers[i]] = i;
        cycle_ = std::max<uint32_t>(1, static_cast<uint32_t>(layers.size()));
        visits_.assign(cycle_, 0);
        for (size_t e = 0; e < v.experts.size(); ++e)
            entries_[e].pos = pos_of_[v.experts[e].layer_id];
    }

    void demand(uint32_t layer, const std::vector<uint32_t>& entries) override {
        now_ = pos_of_[layer];
        const uint64_t visit = ++visits_[now_];
        for (uint32_t e : entries) {
            State& s = entries_[e];
            s.p = s.p * std::pow(1 - RATE, static_cast<double>(visit - s.visit)) + RATE;
            s.visit = visit;
        }
    }

    size_t victim(const std::vector<uint32_t>& candidates) override {
        size_t best = 0;
        double worst = -1;
        for (size_t i = 0; i < candidates.size(); ++i) {
            const double ahead = expected_distance(entries_[candidates[i]]);
            if (ahead > worst) {
                worst = ahead;
                best = i;
            }
        }
        return best;
    }

private:
    static constexpr double RATE = 0.3;  // weight of the latest visit in p
    static constexpr double FLOOR = 1e-3;

    struct State {
        uint32_t pos = 0;
        uint64_t visit = 0;  // the visit of its layer at which p was last brought up to date
        double p = 0;
    };

    double expected_distance(const State& s) const {
        const double p = std::max(
            FLOOR, s.p * std::pow(1 - RATE, static_cast<double>(visits_[s.pos] - s.visit)));
        const uint32_t d = (s.pos + cycle_ - now_) % cycle_;
        return (d == 0 ? cycle_ : d) + cycle_ * (1 - p) / p;
    }

    std::vector<State> entries_;
    std::vector<uint32_t> pos_of_;
    std::vector<uint64_t> visits_;
    uint32_t cycle_ = 1;
    uint32_t now_ = 0;
};

}  // namespace

const std::vector<std::string>& policy_names() {
    static const std::vector<std::string> names{"lru", "cycle"};
    return names;
}

std::unique_ptr<Policy> make_policy(const std::string& name, const Vault& v) {
    if (name == "lru")
        return std::make_unique<Lru>(v);
    if (name == "cycle")
        return std::make_unique<Cycle>(v);
    throw std::invalid_argument("unknown eviction policy '" + name + "'");
}

}  // namespace smoe::harness::engine
