#include "commands/command.hpp"
#include "io.hpp"
#include "json.hpp"
#include "text.hpp"
#include "vault.hpp"

#include <exit_codes.hpp>

#include <cstdio>
#include <new>

namespace smoe::harness::commands {

namespace {

/// {"schema", "ok": false, "error": {"message", "exit_code"}} on stdout.
void print_json_error(const char* schema, const std::string& message, int exit_code) {
    JsonWriter j;
    j.begin_object().member("schema", schema).member("ok", false).key("error").begin_object();
    j.member("message", fold_lines(message));
    j.member("exit_code", static_cast<uint64_t>(exit_code));
    j.end_object().end_object();
    std::fputs((j.str() + "\n").c_str(), stdout);
}

}  // namespace

int with_json_errors(bool json, const char* schema, const std::function<int()>& body,
                     bool findings_printed) {
    try {
        return body();
    } catch (const InvalidVault& e) {
        if (json && !findings_printed)
            print_json_error(schema,
                             current_vault() + ": " + e.issue.code + " at offset " +
                                 std::to_string(e.issue.offset) + " (" + e.issue.field +
                                 "): " + e.issue.message,
                             exit_codes::INVALID.status);
        throw;
    } catch (const UsageError& e) {
        if (json)
            print_json_error(schema, usage_message(e), exit_codes::USAGE.status);
        throw;
    } catch (const IoError& e) {
        // a file shorter than a header: check's findings document says so already
        if (json && !(findings_printed && dynamic_cast<const UnreadableVault*>(&e)))
            print_json_error(schema, e.what(), e.kind->status);
        throw;
    } catch (const std::bad_alloc&) {
        if (json)
            print_json_error(schema, "internal error: out of memory", exit_codes::INTERNAL.status);
        throw;
    }
}

}  // namespace smoe::harness::commands
