// forward: one expert's SwiGLU on one input vector.

#include "commands/command.hpp"
#include "commands/loaded_expert.hpp"

#include <cstdint>
#include <cstring>
#include <vector>

namespace smoe::harness::commands {

int cmd_forward(const Args& args) {
    if (args.size() != 5)
        throw UsageError("forward: VAULT LAYER EXPERT IN.f32 OUT.f32 expected");
    LoadedExpert le;
    open_expert(le, args[0], args[1], args[2]);
    const Input in = open_input(args[3]);
    refuse_same_file(args[4], {{args[0], le.vault.id}, {args[3], in.id}});
    existing_output(args[4]);  // a FIFO or a device there: refused before any work
    read_expert(le);
    const uint32_t d_model = le.tensors[0].cols;
    if (in.size != uint64_t{d_model} * sizeof(float))
        throw UsageError(args[3] + ": " + std::to_string(in.size) + " bytes, expected " +
                         std::to_string(d_model) + " float32 (d_model)");
    const auto x_bytes = read_whole_file(in, args[3], in.size);
    std::vector<float> x(d_model), y(le.tensors[2].rows);
    std::memcpy(x.data(), x_bytes.data(), x_bytes.size());
    ExpertKernel kernel;
    kernel.forward(le.tensors, x.data(), y.data());
    write_whole_file(args[4], y.data(), y.size() * sizeof(float));
    return 0;
}

}  // namespace smoe::harness::commands
