// Eviction policies of the expert cache: small strategy objects chosen by name. The cache
// tells a policy each layer's demand as it comes (the layers of a token in order, token
// after token) and asks it for a victim among the unpinned resident blobs when a load needs
// a slot. Blobs are named by their index in the vault's expert table.
#pragma once

#include "vault.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace smoe::harness::engine {

class Policy {
public:
    virtual ~Policy() = default;
    /// A layer asks for these blobs (before any of them is loaded).
    virtual void demand(uint32_t layer, const std::vector<uint32_t>& entries) = 0;
    /// A hint: these blobs are likely asked for soon (the engine's early-router guesses).
    virtual void hint(uint32_t /*layer*/, const std::vector<uint32_t>& /*entries*/) {}
    /// Which of `candidates` (resident, unpinned; never empty) to evict: its index.
    virtual size_t victim(const std::vector<uint32_t>& candidates) = 0;
};

/// The policy named `name` (one of policy_names(); std::invalid_argument otherwise).
std::unique_ptr<Policy> make_policy(const std::string& name, const Vault& v);

}  // namespace smoe::harness::engine
