#include "engine/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace smoe::harness::engine {

uint32_t argmax(const std::vector<float>& logits) {
    return static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

uint32_t Sampler::next(const std::vector<float>& logits) {
    if (o_.temperature <= 0)
        return argmax(logits);
    std::vector<uint32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0u);
    auto key = [&](uint32_t i) {  // a NaN ranks last: the order stays a strict weak one
        return std::isnan(logits[i]) ? -HUGE_VALF : logits[i];
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return key(a) > key(b); });
    if (o_.top_k > 0 && o_.top_k < order.size())
        order.resize(o_.top_k);
    std::vector<double> p(order.size());
    const double top = logits[order[0]];
    double sum = 0;
    for (size_t i = 0; i < order.size(); ++i)
        sum += (p[i] = std::exp((logits[order[i]] - top) / o_.temperature));
    size_t keep = order.size();
    double kept = 0;
    for (size_t i = 0; i < order.size(); ++i) {  // the smallest head reaching top_p
        kept += p[i] / sum;
        if (kept >= o_.top_p) {
            keep = i + 1;
            break;
        }
    }
    const double total = std::accumulate(p.begin(), p.begin() + keep, 0.0);
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
    double at = 0;
    for (size_t i = 0; i < keep; ++i)
        if ((at += p[i]) > u)
            return order[i];
    return order[keep - 1];
}

}  // namespace smoe::harness::engine
