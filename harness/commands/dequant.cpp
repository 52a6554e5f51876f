// dequant: one expert's three matrices, dequantised to float32 files.

#include "commands/command.hpp"
#include "commands/loaded_expert.hpp"

#include <sys/stat.h>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

namespace smoe::harness::commands {

int cmd_dequant(const Args& args) {
    if (args.size() != 4)
        throw UsageError("dequant: VAULT LAYER EXPERT OUT_DIR expected");
    LoadedExpert le;
    open_expert(le, args[0], args[1], args[2]);
    const char* names[3] = {"gate.f32", "up.f32", "down.f32"};
    std::vector<std::string> outs;
    for (const char* n : names) {
        outs.push_back(args[3] + "/" + n);
        refuse_same_file(outs.back(), {{args[0], le.vault.id}});
        existing_output(outs.back());  // all three checked before any is written
    }
    read_expert(le);
    if (::mkdir(args[3].c_str(), 0777) != 0 && errno != EEXIST)
        throw WriteFailed(args[3] + ": cannot create the folder: " + std::strerror(errno));
    // All three are written and flushed before the first is renamed into place.
    std::vector<std::unique_ptr<AtomicFile>> files;
    for (int t = 0; t < 3; ++t) {
        const QTensor& q = le.tensors[t];
        std::vector<float> w(uint64_t{q.rows} * q.cols);  // <= 16x the blob: justified
        dequantize(q, 0, w.size(), w.data());
        files.push_back(std::make_unique<AtomicFile>(outs[t]));
        files.back()->write(w.data(), w.size() * sizeof(float));
        files.back()->finish();
    }
    for (auto& f : files)
        f->rename_into_place();
    fsync_dir(args[3]);
    return 0;
}

}  // namespace smoe::harness::commands
