// What every command of smoe-stream shares: the table of commands (usage, help and dispatch
// come from it), the usage error and the parsers of numbers on the command line.
#pragma once

#include <charconv>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace smoe::harness::commands {

using Args = std::vector<std::string>;

/// A command line refused as such (`usage`, exit 2).
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// What a usage error says, as Python's CLI words it: "MESSAGE (see smoe-stream --help)".
std::string usage_message(const UsageError& e);

/// The vault the current command works on, for the one-line error report of an invalid one.
std::string& current_vault();

/// Runs a command's `body`; with `json`, a failure also prints the command's error document
/// ({"schema": `schema`, "ok": false, "error": {"message", "exit_code"}}) on stdout before
/// it goes on to main's one line on stderr. `findings_printed`: the command printed its own
/// findings document for an invalid or too short vault (check), so nothing more for those.
int with_json_errors(bool json, const char* schema, const std::function<int()>& body,
                     bool findings_printed = false);

/// One command: its name, its usage (after "smoe-stream "; continuation lines included), or
/// nullptr for a hidden one (for the test suite), and what runs it.
struct Command {
    const char* name;
    const char* usage;
    int (*run)(const Args& args);
};

/// Every command, in the order usage and help list them.
const std::vector<Command>& table();

/// The usage text (--help): one line per visible command.
std::string usage_text();

/// Runs `name` with `args`; an unknown name is a UsageError naming the visible commands.
int dispatch(const std::string& name, const Args& args);

template <class T>
T parse_uint(const std::string& text, const char* what) {
    T v{};
    auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size())
        throw UsageError(std::string(what) + ": not a valid number: '" + text + "'");
    return v;
}

/// A duration in (0, 86400] seconds.
double parse_seconds(const std::string& text);

// The commands (one file each).
int cmd_check(const Args& args);
int cmd_forward(const Args& args);
int cmd_dequant(const Args& args);
int cmd_bench(const Args& args);
int cmd_generate(const Args& args);
int cmd_replay(const Args& args);
int cmd_cache_check(const Args& args);
int cmd_fuzz(const Args& args);
int cmd_fp16_table(const Args& args);
int cmd_crc32c(const Args& args);
int cmd_rules(const Args& args);
int cmd_exit_codes(const Args& args);
int cmd_shown(const Args& args);
int cmd_decoder_families(const Args& args);

}  // namespace smoe::harness::commands
