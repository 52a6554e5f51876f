// The table of commands: usage, help and dispatch all come from it.
#include "commands/command.hpp"

namespace smoe::harness::commands {

const std::vector<Command>& table() {
    static const std::vector<Command> all = {
        {"check", "check VAULT [--json] [--deep [--manifest PATH | --no-manifest]]", cmd_check},
        {"forward", "forward VAULT LAYER EXPERT IN.f32 OUT.f32", cmd_forward},
        {"dequant", "dequant VAULT LAYER EXPERT OUT_DIR", cmd_dequant},
        {"bench",
         "bench VAULT [--threads N|auto] [--direct] [--pattern seq|random]\n"
         "                               [--topk K] [--seconds S] [--seed N]",
         cmd_bench},
        {"generate",
         "generate VAULT --prompt IDS --max-new N [--scout PATH]\n"
         "                               [--cache-mb M | --cache-slots S] [--io-threads T]\n"
         "                               [--threads C] [--direct|--buffered]\n"
         "                               [--temperature X --top-k K --top-p P --seed S]\n"
         "                               [--logits OUT.f32] [--trace OUT.jsonl] [--json]",
         cmd_generate},
        {"replay",
         "replay VAULT TRACE (--cache-mb M | --cache-slots S) [--io-threads T] [--direct]\n"
         "                                [--policy lru|cycle] [--json]",
         cmd_replay},
        // hidden, for the test suite (harness/main.cpp's opening comment says what each does)
        {"fuzz", nullptr, cmd_fuzz},
        {"fp16-table", nullptr, cmd_fp16_table},
        {"crc32c", nullptr, cmd_crc32c},
        {"rules", nullptr, cmd_rules},
        {"exit-codes", nullptr, cmd_exit_codes},
        {"shown", nullptr, cmd_shown},
        {"decoder-families", nullptr, cmd_decoder_families},
        {"cache-check", nullptr, cmd_cache_check},
    };
    return all;
}

std::string usage_text() {
    std::string out;
    for (const Command& c : table()) {
        if (c.usage == nullptr)
            continue;
        out += out.empty() ? "usage: " : "       ";
        out += std::string("smoe-stream ") + c.usage + "\n";
    }
    return out;
}

int dispatch(const std::string& name, const Args& args) {
    std::string choices;
    for (const Command& c : table()) {
        if (c.name == name)
            return c.run(args);
        if (c.usage != nullptr)
            choices += (choices.empty() ? "'" : ", '") + std::string(c.name) + "'";
    }
    throw UsageError("argument COMMAND: invalid choice: '" + name + "' (choose from " + choices +
                     ")");
}

std::string usage_message(const UsageError& e) {
    return std::string(e.what()) + " (see smoe-stream --help)";
}

std::string& current_vault() {
    static std::string vault;
    return vault;
}

double parse_seconds(const std::string& text) {
    double v = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size() || !(v > 0) || v > 86400)
        throw UsageError("--seconds: not a duration in (0, 86400]: '" + text + "'");
    return v;
}

}  // namespace smoe::harness::commands
