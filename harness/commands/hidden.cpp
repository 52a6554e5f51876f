// The hidden commands, for the test suite: fuzz, fp16-table, crc32c, rules, exit-codes, shown.

#include "commands/command.hpp"
#include "crc32c.hpp"
#include "engine/family.hpp"
#include "fp16.hpp"
#include "fuzz.hpp"
#include "io.hpp"
#include "json.hpp"
#include "text.hpp"
#include "vault.hpp"

#include <exit_codes.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

namespace smoe::harness::commands {

int cmd_fuzz(const Args& args) {
    if (args.size() < 3)
        throw UsageError("fuzz: SEED COUNT [--timeout S] [--save DIR] FILE...");
    FuzzOptions o;
    o.seed = parse_uint<uint64_t>(args[0], "SEED");
    o.count = parse_uint<uint64_t>(args[1], "COUNT");
    std::vector<std::string> files;
    for (size_t k = 2; k < args.size(); ++k) {
        if (args[k] == "--timeout" && k + 1 < args.size())
            o.timeout_s = parse_uint<unsigned>(args[++k], "--timeout");
        else if (args[k] == "--jobs" && k + 1 < args.size())
            o.jobs = parse_uint<unsigned>(args[++k], "--jobs");
        else if (args[k] == "--save" && k + 1 < args.size())
            o.save_dir = args[++k];
        else
            files.push_back(args[k]);
    }
    if (files.empty())
        throw UsageError("fuzz: no FILE");
    return run_fuzz(o, files);
}

int cmd_fp16_table(const Args& args) {
    if (args.size() != 1)
        throw UsageError("fp16-table: OUT expected");
    std::vector<float> table(65536);
    for (uint32_t h = 0; h < 65536; ++h)
        table[h] = fp16_to_f32(static_cast<uint16_t>(h));
    write_whole_file(args[0], table.data(), table.size() * sizeof(float));
    return 0;
}

int cmd_crc32c(const Args& args) {
    if (args.size() != 1)
        throw UsageError("crc32c: FILE expected");
    const auto data = read_whole_file(args[0], size_t{1} << 30);
    // Also in pieces of 1, 2, 3, ... bytes: odd starts and lengths, and the chaining.
    auto chunked = [&](auto fn) {
        uint32_t crc = 0;
        for (size_t at = 0, len = 1; at < data.size(); at += len, ++len)
            crc = fn(crc, data.data() + at, std::min(len, data.size() - at));
        return crc;
    };
    const bool sse = crc32c_have_sse42();
    JsonWriter j;
    j.begin_object().member("size", static_cast<uint64_t>(data.size()));
    j.member("crc32c", crc32c_update(0, data.data(), data.size()));
    j.member("portable", crc32c_portable(0, data.data(), data.size()));
    j.member("portable_chunked", chunked(crc32c_portable));
    j.key("sse42");
    if (sse)
        j.value(crc32c_sse42(0, data.data(), data.size()));
    else
        j.null();
    j.key("sse42_chunked");
    if (sse)
        j.value(chunked(crc32c_sse42));
    else
        j.null();
    j.end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
}

int cmd_rules(const Args& args) {
    if (!args.empty())
        throw UsageError("rules: no arguments expected");
    JsonWriter j;
    j.begin_array();
    for (const Rule* r : rules::ALL) {
        j.begin_object().member("code", r->code).member("severity", severity_name(r->severity));
        j.member("load", r->load).member("deep", r->deep).member("ksy", r->ksy);
        j.member("sidecar", r->sidecar).member("rulings", r->rulings);
        j.member("message", r->message).end_object();
    }
    j.end_array();
    std::printf("%s\n", j.str().c_str());
    return 0;
}

int cmd_exit_codes(const Args& args) {
    if (!args.empty())
        throw UsageError("exit-codes: no arguments expected");
    JsonWriter j;
    j.begin_array();
    for (const exit_codes::ExitCode* k : exit_codes::ALL)
        j.begin_object()
            .member("name", k->name)
            .member("status", static_cast<uint64_t>(k->status))
            .member("meaning", k->meaning)
            .end_object();
    j.end_array();
    std::printf("%s\n", j.str().c_str());
    return 0;
}

int cmd_shown(const Args& args) {
    if (args.size() != 1)
        throw UsageError("shown: FILE expected");
    const auto data = read_whole_file(args[0], size_t{64} << 20);
    JsonWriter j;
    j.begin_array();
    for (size_t at = 0; at < data.size();) {
        uint32_t len = 0;
        if (data.size() - at < sizeof len)
            throw RefusedInput(args[0] + ": a length cut short at byte " + std::to_string(at));
        std::memcpy(&len, data.data() + at, sizeof len);
        at += sizeof len;
        if (data.size() - at < len)
            throw RefusedInput(args[0] + ": a text cut short at byte " + std::to_string(at));
        const std::string_view text(reinterpret_cast<const char*>(data.data() + at), len);
        at += len;
        j.begin_array().value(shown(text)).value(fold_lines(text)).end_array();
    }
    j.end_array();
    std::printf("%s\n", j.str().c_str());
    return 0;
}

/// The families generate runs, as JSON: [{"model_type", "scoring", "keys"}] (the config-copy
/// keys each reads), for the test that keeps the registry's `generate` column equal to it.
int cmd_decoder_families(const Args& args) {
    if (!args.empty())
        throw UsageError("decoder-families: no arguments expected");
    JsonWriter j;
    j.begin_array();
    for (const std::string& name : engine::split_families()) {
        const engine::FamilyRule& r = *engine::family_rule(name);
        j.begin_object().member("model_type", name);
        j.member("scoring", r.scoring == engine::Scoring::sigmoid ? "sigmoid" : "softmax");
        j.key("keys").begin_array();
        for (const auto& [key, fallback] : r.keys)
            j.value(key);
        j.end_array().end_object();
    }
    j.end_array();
    std::printf("%s\n", j.str().c_str());
    return 0;
}

}  // namespace smoe::harness::commands
