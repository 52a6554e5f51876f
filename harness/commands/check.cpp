// check: a vault judged against every rule (--deep: every blob, and its manifest).

#include "commands/command.hpp"
#include "io.hpp"
#include "json.hpp"
#include "manifest.hpp"
#include "text.hpp"
#include "vault.hpp"

#include <common.hpp>
#include <exit_codes.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace smoe::harness::commands {

namespace {

std::string hex(const uint8_t* p, size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (size_t k = 0; k < n; ++k) {
        out += digits[p[k] >> 4];
        out += digits[p[k] & 15];
    }
    return out;
}

/// The "schema" key of every --json document of check (docs/JSON.md), the same as
/// smoe.findings.SCHEMA.
constexpr const char* SCHEMA = "smoe-findings/1";

#define MEMBER(obj, f) member(#f, (obj).f)

/// One finding as docs/JSON.md says: code, severity, offset, field, message, expected,
/// actual, expected_text, actual_text.
void write_finding(JsonWriter& j, const Issue& f) {
    j.begin_object().member("code", f.code).member("severity", severity_name(f.severity));
    j.member("offset", f.offset).member("field", f.field).member("message", f.message);
    j.member("expected", f.expected).member("actual", f.actual);
    for (const auto& [key, v] :
         {std::pair{"expected_text", &f.expected}, std::pair{"actual_text", &f.actual}}) {
        j.key(key);
        if (v->is_null())
            j.null();
        else
            j.value(v->text());
    }
    j.end_object();
}

/// What check saw of a vault: its error (none when valid) and the warnings found so far.
struct CheckResult {
    std::optional<Issue> error;
    const Manifest* manifest = nullptr;
    bool deep = false;
};

/// The --json document of check (docs/JSON.md): the findings document of `smoe verify`
/// (schema, vault, size, valid, deep, errors, warnings, findings) and, describing a valid
/// vault (null otherwise), manifest, header, arch, experts, partial, layers, gap_bytes.
std::string check_json(const Vault& v, const CheckResult& r) {
    std::vector<Issue> findings;
    if (r.error)
        findings.push_back(*r.error);
    findings.insert(findings.end(), v.warnings.begin(), v.warnings.end());
    std::stable_sort(findings.begin(), findings.end(), [](const Issue& a, const Issue& b) {
        return a.severity != b.severity ? a.severity < b.severity : a.offset < b.offset;
    });
    const bool valid = !r.error;
    uint64_t warnings = 0;
    for (const Issue& f : findings)
        warnings += f.severity == Severity::warning;
    JsonWriter j;
    j.begin_object().member("schema", SCHEMA).member("vault", v.name).member("size", v.size);
    j.member("valid", valid).member("deep", r.deep);
    j.member("errors", uint64_t{valid ? 0u : 1u}).member("warnings", warnings);
    j.key("findings").begin_array();
    for (const Issue& f : findings)
        write_finding(j, f);
    j.end_array();
    j.key("manifest");  // the manifest checked, or null
    if (valid && r.manifest)
        j.value(r.manifest->path);
    else
        j.null();
    if (!valid) {
        for (const char* key : {"header", "arch", "experts", "partial", "layers", "gap_bytes"})
            j.key(key).null();
        j.end_object();
        return j.str() + "\n";
    }
    const SmoeHeader& h = v.header;
    j.key("header").begin_object().member("magic", hex(h.magic, sizeof h.magic));
    j.MEMBER(h, version).MEMBER(h, num_moe_layers).MEMBER(h, max_experts_per_layer);
    j.MEMBER(h, total_experts).MEMBER(h, table_offset).MEMBER(h, data_offset);
    j.MEMBER(h, group_size).MEMBER(h, bits).MEMBER(h, d_model).MEMBER(h, vocab_size);
    j.MEMBER(h, ffn_dim).MEMBER(h, reserved_ext).end_object();
    j.key("arch");
    if (v.arch) {
        const SmoeArchBlock& a = *v.arch;
        const auto* mt = reinterpret_cast<const char*>(a.model_type);
        j.begin_object().member("magic", hex(a.magic, sizeof a.magic));
        j.MEMBER(a, block_version).MEMBER(a, block_size).MEMBER(a, flags);
        j.member("rope_theta", static_cast<double>(a.rope_theta));
        j.MEMBER(a, num_heads).MEMBER(a, num_kv_heads).MEMBER(a, head_dim).MEMBER(a, moe_top_k);
        j.MEMBER(a, moe_ffn_dim).MEMBER(a, dense_ffn_dim).MEMBER(a, shared_expert_ffn_dim);
        j.MEMBER(a, activation).MEMBER(a, num_hidden_layers);
        j.member("rms_norm_eps", static_cast<double>(a.rms_norm_eps));
        j.member("model_type", std::string(mt, strnlen(mt, MODEL_TYPE_SIZE)));
        j.member("reserved", hex(a.reserved, sizeof a.reserved));
        for (const FlagName& flag : FLAG_NAMES)
            j.member(flag.name, (a.flags & flag.bit) != 0);
        j.end_object();
    } else {
        j.null();
    }
    const uint64_t model_experts = uint64_t{h.num_moe_layers} * h.max_experts_per_layer;
    j.member("experts", static_cast<uint64_t>(v.experts.size()));
    j.member("partial", v.experts.size() < model_experts);
    std::map<uint32_t, uint64_t> per_layer;
    for (const Expert& e : v.experts)
        ++per_layer[e.layer_id];
    j.key("layers").begin_array();
    for (auto [layer, count] : per_layer)
        j.begin_object().member("layer_id", layer).member("experts", count).end_object();
    j.end_array();
    j.member("gap_bytes", v.gap_bytes).end_object();
    return j.str() + "\n";
}

/// A finding as one line, as Python's Finding.line() writes it.
std::string finding_line(const Issue& f) {
    char at[32];
    std::snprintf(at, sizeof at, "0x%llx", static_cast<unsigned long long>(f.offset));
    std::string line = std::string(severity_name(f.severity)) + ": " + f.code + " at offset " + at +
                       " (" + f.field + "): " + f.message;
    if (!f.expected.is_null() || !f.actual.is_null())
        line += " [expected " + (f.expected.is_null() ? "None" : f.expected.text()) + ", got " +
                (f.actual.is_null() ? "None" : f.actual.text()) + "]";
    return line;
}

struct CheckArgs {
    std::string path;
    bool json = false, deep = false, no_manifest = false;
    std::optional<std::string> manifest;
};

CheckArgs parse_check(const std::vector<std::string>& args) {
    CheckArgs c;
    for (size_t k = 0; k < args.size(); ++k) {
        const std::string& a = args[k];
        if (a == "--json") {
            c.json = true;
        } else if (a == "--deep") {
            c.deep = true;
        } else if (a == "--no-manifest") {
            c.no_manifest = true;
        } else if (a == "--manifest" || a.rfind("--manifest=", 0) == 0) {
            if (a == "--manifest" && k + 1 >= args.size())
                throw UsageError("check: --manifest needs a PATH");
            c.manifest = a == "--manifest" ? args[++k] : a.substr(std::strlen("--manifest="));
            if (c.manifest->empty())
                throw UsageError("check: --manifest needs a PATH");
        } else if (!a.empty() && a[0] == '-') {
            throw UsageError("check: unknown option " + a);
        } else if (c.path.empty()) {
            c.path = a;
            current_vault() = a;
        } else {
            throw UsageError("check: one VAULT expected");
        }
    }
    if (c.path.empty())
        throw UsageError("check: VAULT missing");
    if ((c.manifest || c.no_manifest) && !c.deep)
        throw UsageError("check: --manifest and --no-manifest need --deep");
    if (c.manifest && c.no_manifest)
        throw UsageError("check: --manifest and --no-manifest exclude each other");
    return c;
}

/// check: 0 valid, 1 a rule broken (InvalidVault, a manifest that cannot be read included),
/// IoError's kind otherwise (2 unreadable, UnreadableVault among them); with --json the findings
/// document on stdout in every case that judged the vault (a file shorter than a header included),
/// the error document otherwise.
int run_check(const CheckArgs& c) {
    Vault v;
    CheckResult r;
    r.deep = c.deep;
    std::optional<Manifest> manifest;
    auto report = [&](const Issue& error) {
        r.error = error;
        if (c.json)
            std::fputs(check_json(v, r).c_str(), stdout);
    };
    try {
        v.open(c.path);
        if (c.deep) {
            if (!c.no_manifest)
                manifest = load_manifest(c.manifest.value_or(default_manifest_path(c.path)), v,
                                         !c.manifest);
            if (manifest)
                v.deep_check([&](size_t i, std::vector<uint8_t>& scratch) {
                    check_blob_crc(v, *manifest, i, scratch);
                });
            else
                v.deep_check();
        }
    } catch (const InvalidVault& e) {
        report(e.issue);
        throw;
    } catch (const UnreadableVault& e) {  // before IoError: judged, as header.size
        report(e.issue);
        throw;
    }
    r.manifest = manifest ? &*manifest : nullptr;
    if (c.json) {
        std::fputs(check_json(v, r).c_str(), stdout);
    } else {
        const bool partial =
            v.experts.size() < uint64_t{v.header.num_moe_layers} * v.header.max_experts_per_layer;
        std::printf("%s: valid SMOE-Q%u v%u vault, %zu experts%s\n", shown(c.path).c_str(),
                    v.header.bits, v.header.version, v.experts.size(), partial ? " (partial)" : "");
        if (manifest)
            std::printf("manifest %s: size, %zu experts and their CRC-32C match\n",
                        shown(manifest->path).c_str(), v.experts.size());
        for (const Issue& w : v.warnings)
            std::printf("%s\n", shown(finding_line(w)).c_str());
    }
    return 0;
}

}  // namespace

int cmd_check(const Args& args) {
    bool json = false;
    for (size_t k = 0; k < args.size(); ++k) {
        json = json || args[k] == "--json";
        if (args[k] == "--manifest")
            ++k;
        else if (current_vault().empty() && !args[k].empty() && args[k][0] != '-')
            current_vault() = args[k];
    }
    return with_json_errors(
        json, SCHEMA, [&] { return run_check(parse_check(args)); }, true);
}

}  // namespace smoe::harness::commands
