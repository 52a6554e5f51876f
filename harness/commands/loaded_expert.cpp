// forward and dequant: one expert's blob, one pread into a page-aligned buffer.

#include "commands/loaded_expert.hpp"
#include "commands/command.hpp"

namespace smoe::harness::commands {

/// Opens and checks the vault and finds the expert (nothing of the blob is read yet).
void open_expert(LoadedExpert& le, const std::string& path, const std::string& layer,
                 const std::string& expert) {
    const auto l = parse_uint<uint32_t>(layer, "LAYER");
    const auto e = parse_uint<uint32_t>(expert, "EXPERT");
    current_vault() = path;
    le.vault.open(path);
    le.expert = le.vault.find(l, e);
    if (le.expert == nullptr)
        throw UsageError(path + ": no expert " + expert + " in layer " + layer);
}

void read_expert(LoadedExpert& le) {
    le.blob = AlignedBuffer(le.expert->padded_size);
    pread_full(le.vault.fd, le.blob.data(), le.expert->padded_size, le.expert->byte_offset,
               le.vault.name);
    expert_tensors(*le.expert, le.blob.data(), le.vault.header.bits, le.tensors);
}

}  // namespace smoe::harness::commands
