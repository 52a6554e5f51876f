// smoe-stream: reads .smoe vaults the way an SSD-streaming MoE engine does.
//
//   smoe-stream check VAULT [--json] [--deep [--manifest PATH | --no-manifest]]
//   smoe-stream forward VAULT LAYER EXPERT IN.f32 OUT.f32
//   smoe-stream dequant VAULT LAYER EXPERT OUT_DIR
//   smoe-stream bench VAULT [--threads N|auto] [--direct] [--pattern seq|random] [--topk K]
//                           [--seconds S] [--seed N]
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
// as a JSON array).

#include "bench.hpp"
#include "crc32c.hpp"
#include "fp16.hpp"
#include "fuzz.hpp"
#include "io.hpp"
#include "json.hpp"
#include "manifest.hpp"
#include "quant.hpp"
#include "text.hpp"
#include "vault.hpp"

#include <common.hpp>
#include <exit_codes.hpp>

#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace smoe;
using namespace smoe::harness;

namespace {

constexpr const char* USAGE =
    "usage: smoe-stream check VAULT [--json] [--deep [--manifest PATH | --no-manifest]]\n"
    "       smoe-stream forward VAULT LAYER EXPERT IN.f32 OUT.f32\n"
    "       smoe-stream dequant VAULT LAYER EXPERT OUT_DIR\n"
    "       smoe-stream bench VAULT [--threads N|auto] [--direct] [--pattern seq|random]\n"
    "                               [--topk K] [--seconds S] [--seed N]\n";

/// The vault the current command works on, for the one-line error report.
std::string g_vault;

/// A command line refused as such (`usage`, exit 2).
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// What a usage error says, as Python's CLI words it: "MESSAGE (see smoe-stream --help)".
std::string usage_message(const UsageError& e) {
    return std::string(e.what()) + " (see smoe-stream --help)";
}

/// The commands, for the message of an unknown one.
constexpr const char* COMMANDS = "'check', 'forward', 'dequant', 'bench'";

template <class T>
T parse_uint(const std::string& text, const char* what) {
    T v{};
    auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size())
        throw UsageError(std::string(what) + ": not a valid number: '" + text + "'");
    return v;
}

double parse_seconds(const std::string& text) {
    double v = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size() || !(v > 0) || v > 86400)
        throw UsageError("--seconds: not a duration in (0, 86400]: '" + text + "'");
    return v;
}

std::string hex(const uint8_t* p, size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (size_t k = 0; k < n; ++k) {
        out += digits[p[k] >> 4];
        out += digits[p[k] & 15];
    }
    return out;
}

// ---- check ------------------------------------------------------------------------------

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
            g_vault = a;
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

/// The --json document of a command that failed before it could judge the vault (it
/// cannot be read, or the command line is wrong): {"schema", "ok": false, "error":
/// {"message", "exit_code"}}, as the Python CLI prints it (the message on one line).
void print_json_error(const std::string& message, int exit_code) {
    JsonWriter j;
    j.begin_object().member("schema", SCHEMA).member("ok", false).key("error").begin_object();
    j.member("message", fold_lines(message));
    j.member("exit_code", static_cast<uint64_t>(exit_code));
    j.end_object().end_object();
    std::fputs((j.str() + "\n").c_str(), stdout);
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

int cmd_check(const std::vector<std::string>& args) {
    bool json = false;
    for (size_t k = 0; k < args.size(); ++k) {
        json = json || args[k] == "--json";
        if (args[k] == "--manifest")
            ++k;
        else if (g_vault.empty() && !args[k].empty() && args[k][0] != '-')
            g_vault = args[k];
    }
    try {
        return run_check(parse_check(args));
    } catch (const InvalidVault&) {
        throw;  // the findings document is out
    } catch (const UnreadableVault&) {
        throw;
    } catch (const UsageError& e) {
        if (json)
            print_json_error(usage_message(e), exit_codes::USAGE.status);
        throw;
    } catch (const IoError& e) {
        if (json)
            print_json_error(e.what(), e.kind->status);
        throw;
    } catch (const std::bad_alloc&) {
        if (json)
            print_json_error("internal error: out of memory", exit_codes::INTERNAL.status);
        throw;
    }
}

// ---- forward / dequant: one pread of the blob into a page-aligned buffer ----------------

struct LoadedExpert {
    Vault vault;
    const Expert* expert = nullptr;
    AlignedBuffer blob;
    QTensor tensors[3];
};

/// Opens and checks the vault and finds the expert (nothing of the blob is read yet).
void open_expert(LoadedExpert& le, const std::string& path, const std::string& layer,
                 const std::string& expert) {
    const auto l = parse_uint<uint32_t>(layer, "LAYER");
    const auto e = parse_uint<uint32_t>(expert, "EXPERT");
    g_vault = path;
    le.vault.open(path);
    le.expert = le.vault.find(l, e);
    if (le.expert == nullptr)
        throw UsageError(path + ": no expert " + expert + " in layer " + layer);
}

void read_expert(LoadedExpert& le) {
    le.blob = AlignedBuffer(le.expert->padded_size);
    pread_full(le.vault.fd, le.blob.data(), le.expert->padded_size, le.expert->byte_offset,
               le.vault.name);
    expert_tensors(*le.expert, le.blob.data(), le.vault.header.bits, le.tensors);
}

int cmd_forward(const std::vector<std::string>& args) {
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

int cmd_dequant(const std::vector<std::string>& args) {
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

// ---- bench -------------------------------------------------------------------------------

int cmd_bench(const std::vector<std::string>& args) {
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
    g_vault = path;
    Vault v;
    v.open(path);
    if (o.topk > v.header.max_experts_per_layer)  // no router picks more than a layer has
        throw UsageError("--topk: " + std::to_string(o.topk) + " is more than the " +
                         std::to_string(v.header.max_experts_per_layer) + " experts per layer of " +
                         path);
    std::fputs(run_bench(v, o).c_str(), stdout);
    return 0;
}

// ---- hidden test helpers ------------------------------------------------------------------

int cmd_fuzz(const std::vector<std::string>& args) {
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

int cmd_fp16_table(const std::vector<std::string>& args) {
    if (args.size() != 1)
        throw UsageError("fp16-table: OUT expected");
    std::vector<float> table(65536);
    for (uint32_t h = 0; h < 65536; ++h)
        table[h] = fp16_to_f32(static_cast<uint16_t>(h));
    write_whole_file(args[0], table.data(), table.size() * sizeof(float));
    return 0;
}

int cmd_crc32c(const std::vector<std::string>& args) {
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

int cmd_rules(const std::vector<std::string>& args) {
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

int cmd_exit_codes(const std::vector<std::string>& args) {
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

int cmd_shown(const std::vector<std::string>& args) {
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

}  // namespace

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
        if (cmd == "check")
            return cmd_check(args);
        if (cmd == "forward")
            return cmd_forward(args);
        if (cmd == "dequant")
            return cmd_dequant(args);
        if (cmd == "bench")
            return cmd_bench(args);
        if (cmd == "fuzz")
            return cmd_fuzz(args);
        if (cmd == "fp16-table")
            return cmd_fp16_table(args);
        if (cmd == "crc32c")
            return cmd_crc32c(args);
        if (cmd == "rules")
            return cmd_rules(args);
        if (cmd == "exit-codes")
            return cmd_exit_codes(args);
        if (cmd == "shown")
            return cmd_shown(args);
        if (cmd == "-h" || cmd == "--help" || cmd == "help") {
            std::fputs(USAGE, stdout);
            return 0;
        }
        throw UsageError("argument COMMAND: invalid choice: '" + cmd + "' (choose from " +
                         COMMANDS + ")");
    } catch (const InvalidVault& e) {
        return fail(g_vault + ": " + e.issue.code + " at offset " + std::to_string(e.issue.offset) +
                        " (" + e.issue.field + "): " + e.issue.message,
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
