// smoe-stream: reads .smoe vaults the way an SSD-streaming MoE engine does.
// The commands are in harness/commands/ (one file each; commands/table.cpp lists them).
//
//   smoe-stream check VAULT [--json] [--deep [--manifest PATH | --no-manifest]]
//   smoe-stream forward VAULT LAYER EXPERT IN.f32 OUT.f32
//   smoe-stream dequant VAULT LAYER EXPERT OUT_DIR
//   smoe-stream bench VAULT [--threads N|auto] [--direct] [--pattern seq|random] [--topk K]
//                           [--seconds S] [--seed N]
//   smoe-stream replay VAULT TRACE (--cache-mb M | --cache-slots S) [--io-threads T] [--direct]
//                                  [--policy lru|cycle] [--json]
//
// check --deep also checks the integrity manifest (docs/MANIFEST.md), VAULT.manifest.json
// beside the vault when it exists: its vault size, expert list and every blob's CRC-32C.
// --manifest PATH names another manifest (which must exist), --no-manifest skips it.
// With --json, check prints one JSON document on stdout (docs/JSON.md, schema
// "smoe-findings/1"): the findings document of `smoe verify --json` whenever it judged the
// vault (valid, a rule broken, or a file shorter than a header), with its first error and
// the warnings it saw, plus a description of a valid vault; {"schema", "ok": false,
// "error": {"message", "exit_code"}} when the vault cannot be read or the command line is
// wrong.
//
// Inputs must be regular files (a FIFO or a device is refused at once). Outputs (OUT.f32,
// OUT_DIR/{gate,up,down}.f32) are written to a new temporary file beside them, fsync'ed and
// renamed onto the final name (a symlink there is replaced, never followed; a file there
// passes on its owner, group and mode); an output that is the same file as an input, or
// that is not a regular file (a FIFO, a device), is refused before anything is written.
//
// Exit status: the table shared with the Python CLI (codegen/exit_codes.yaml, generated into
// exit_codes.hpp): 0 valid / done; 1 the vault or its manifest breaks a rule (one line on
// stderr naming the rule's code, offset and field; a bad magic too; a manifest that cannot
// be read is manifest.malformed, as `smoe verify` says), an input that fails or shrinks
// while it is read, an input refused, a failed write (an output that is an input or not a
// regular file included), an internal error; 2 a file that cannot be read at all (missing,
// not a regular file, shorter than a header) or a usage error. Every failure is one line on
// stderr, `smoe-stream: MESSAGE`, a usage error `error: MESSAGE (see smoe-stream --help)` as
// Python's; names in it (and in check's lines on stdout) are shown as the Python CLI shows
// them (text.hpp: one line, control bytes and ill-formed UTF-8 as \xNN).
// Hidden, for the test suite: `fuzz SEED COUNT [--timeout S] [--jobs N] [--save DIR] FILE...`,
// `fp16-table OUT` (all 65536 binary16 values widened to float32), `crc32c FILE` (the
// file's CRC-32C by each implementation, as JSON) and `rules` (the rule registry compiled
// into this program, smoe::rules::ALL, as a JSON array), `exit-codes` (the exit-code table
// compiled into it, exit_codes::ALL, as a JSON array) and `shown FILE` (FILE: texts, each a
// little-endian u32 length and its bytes; prints [shown(text), fold_lines(text)] for each,
// as a JSON array); `cache-check VAULT SLOTS STEPS SEED [--direct] [--io-threads T]
// [--policy P]` (the expert cache under a seeded mix of acquires, releases and hints, every
// held blob checked against the vault after every acquire; what it did as JSON);
// `decoder-families` (the families generate runs, the config keys each reads and its
// router's scoring, as a JSON array).

#include "commands/command.hpp"
#include "io.hpp"
#include "text.hpp"
#include "vault.hpp"

#include <exit_codes.hpp>

#include <cstdio>
#include <new>
#include <string>
#include <vector>

using namespace smoe;
using namespace smoe::harness;
using namespace smoe::harness::commands;

/// The one stderr line of a failure: "smoe-stream: MESSAGE", the message as the Python CLI
/// shows it (one line, no control bytes); returns `status`.
int fail(const std::string& message, int status) {
    std::fprintf(stderr, "smoe-stream: %s\n", shown(message).c_str());
    return status;
}

int main(int argc, char** argv) {
    handle_signals();  // SIGINT 130, SIGTERM 143, no temporary file left
    std::vector<std::string> args(argv + 1, argv + argc);
    const std::string cmd = args.empty() ? "" : args[0];
    if (!args.empty())
        args.erase(args.begin());
    try {
        if (cmd.empty())
            throw UsageError("the following arguments are required: COMMAND");
        if (cmd == "-h" || cmd == "--help" || cmd == "help") {
            std::fputs(usage_text().c_str(), stdout);
            return 0;
        }
        return dispatch(cmd, args);
    } catch (const InvalidVault& e) {
        return fail(current_vault() + ": " + e.issue.code + " at offset " +
                        std::to_string(e.issue.offset) + " (" + e.issue.field +
                        "): " + e.issue.message,
                    exit_codes::INVALID.status);
    } catch (const UsageError& e) {  // one line, as Python's argparse-based usage errors
        std::fprintf(stderr, "error: %s\n", shown(usage_message(e)).c_str());
        return exit_codes::USAGE.status;
    } catch (const IoError& e) {
        return fail(e.what(), e.kind->status);
    } catch (const std::bad_alloc&) {
        return fail("internal error: out of memory", exit_codes::INTERNAL.status);
    } catch (const std::exception& e) {
        return fail(std::string("internal error: ") + e.what(), exit_codes::INTERNAL.status);
    }
}
