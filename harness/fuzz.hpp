// Hidden `smoe-stream fuzz`: a seeded mutation run of the checker for the test suite.
// Each mutated vault goes into a memfd and is checked (with --deep) in a forked child
// under alarm(), so crashes, hangs and sanitizer aborts are caught per input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace smoe::harness {

struct FuzzOptions {
    uint64_t seed = 1;
    uint64_t count = 1000;
    unsigned timeout_s = 10;
    unsigned jobs = 1;     // children in flight
    std::string save_dir;  // failing inputs are written here when set
};

/// Prints a JSON summary on stdout; returns 0 if every input exited 0, 1 or 2.
int run_fuzz(const FuzzOptions& o, const std::vector<std::string>& files);

}  // namespace smoe::harness
