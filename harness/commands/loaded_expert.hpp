// forward and dequant: one expert's blob, one pread into a page-aligned buffer.
#pragma once

#include "io.hpp"
#include "quant.hpp"
#include "vault.hpp"

#include <string>

namespace smoe::harness::commands {

struct LoadedExpert {
    Vault vault;
    const Expert* expert = nullptr;
    AlignedBuffer blob;
    QTensor tensors[3];
};

/// Opens and checks the vault and finds the expert (nothing of the blob is read yet).
void open_expert(LoadedExpert& le, const std::string& path, const std::string& layer,
                 const std::string& expert);

/// Reads the expert's blob and points its three tensors into it.
void read_expert(LoadedExpert& le);

}  // namespace smoe::harness::commands
