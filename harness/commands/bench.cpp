// bench: the vault's read and expert-kernel throughput.

#include "bench.hpp"
#include "commands/command.hpp"
#include "vault.hpp"

#include <cstdio>
#include <string>

namespace smoe::harness::commands {

int cmd_bench(const Args& args) {
    BenchOptions o;
    std::string path;
    for (size_t k = 0; k < args.size(); ++k) {
        const std::string& a = args[k];
        auto next = [&]() -> const std::string& {
            if (k + 1 >= args.size())
                throw UsageError("bench: " + a + " needs a value");
            return args[++k];
        };
        if (a == "--threads") {
            const std::string& n = next();
            o.threads = n == "auto" ? 0 : parse_uint<unsigned>(n, "--threads");
            if (n != "auto" && (o.threads < 1 || o.threads > 256))
                throw UsageError("--threads: 1..256 or auto");
        } else if (a == "--direct") {
            o.direct = true;
        } else if (a == "--pattern") {
            const std::string& p = next();
            if (p != "seq" && p != "random")
                throw UsageError("--pattern: seq or random");
            o.random = p == "random";
        } else if (a == "--topk") {
            o.topk = parse_uint<unsigned>(next(), "--topk");
            if (o.topk < 1)
                throw UsageError("--topk: at least 1");
        } else if (a == "--seconds") {
            o.seconds = parse_seconds(next());
        } else if (a == "--seed") {
            o.seed = parse_uint<uint64_t>(next(), "--seed");
        } else if (!a.empty() && a[0] == '-') {
            throw UsageError("bench: unknown option " + a);
        } else if (path.empty()) {
            path = a;
        } else {
            throw UsageError("bench: one VAULT expected");
        }
    }
    if (path.empty())
        throw UsageError("bench: VAULT missing");
    current_vault() = path;
    Vault v;
    v.open(path);
    if (o.topk > v.header.max_experts_per_layer)  // no router picks more than a layer has
        throw UsageError("--topk: " + std::to_string(o.topk) + " is more than the " +
                         std::to_string(v.header.max_experts_per_layer) + " experts per layer of " +
                         path);
    std::fputs(run_bench(v, o).c_str(), stdout);
    return 0;
}

}  // namespace smoe::harness::commands
