#include "engine/trace.hpp"

#include "crc32c.hpp"
#include "engine/cache.hpp"
#include "json.hpp"
#include "json_read.hpp"

#include <common.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <unordered_map>

namespace smoe::harness::engine {

std::string vault_id(const Vault& v) {
    // The table as stored (bounded by the vault's load checks: it lies inside the file).
    std::vector<uint8_t> table(v.experts.size() * sizeof(ExpertEntry));
    pread_full(v.fd, table.data(), table.size(), v.header.table_offset, v.name);
    uint32_t crc = crc32c_update(0, &v.header, sizeof v.header);
    crc = crc32c_update(crc, table.data(), table.size());
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", crc);
    return buf;
}

namespace {

/// The first line of a trace of `v`.
std::string header_line(const Vault& v) {
    JsonWriter j;
    j.begin_object().member("schema", TRACE_SCHEMA).key("vault").begin_object();
    j.member("size", v.size).member("num_moe_layers", v.header.num_moe_layers);
    j.member("num_experts", v.header.max_experts_per_layer).member("top_k", vault_top_k(v));
    j.member("id", vault_id(v)).end_object().end_object();
    return j.str() + "\n";
}

}  // namespace

TraceWriter::TraceWriter(const Vault& v, const std::string& path) : file_(path) {
    buf_ = header_line(v);
}

void TraceWriter::record(uint32_t token, uint32_t layer, const std::vector<uint32_t>& experts) {
    line(token, layer, "experts", experts);
}

void TraceWriter::hint(uint32_t token, uint32_t layer, const std::vector<uint32_t>& experts) {
    line(token, layer, "hint", experts);
}

void TraceWriter::line(uint32_t token, uint32_t layer, const char* key,
                       const std::vector<uint32_t>& experts) {
    JsonWriter j;
    j.begin_object().member("token", token).member("layer", layer).key(key).begin_array();
    for (uint32_t e : experts)
        j.value(e);
    j.end_array().end_object();
    buf_ += j.str();
    buf_ += '\n';
    if (buf_.size() >= (size_t{1} << 20))
        flush();
}

void TraceWriter::flush() {
    file_.write(buf_.data(), buf_.size());
    buf_.clear();
}

void TraceWriter::commit() {
    flush();
    file_.commit();
}

// ---- reading ------------------------------------------------------------------------------

namespace {

/// Refuses line `n` of the trace at `path`.
[[noreturn]] void refuse(const std::string& path, uint64_t n, const std::string& why) {
    throw RefusedInput(path + ": line " + std::to_string(n) + ": " + why);
}

/// A non-negative integer of at most `most`.
uint64_t bounded(JsonReader& r, uint64_t most, const char* what) {
    if (r.peek() != JsonReader::Kind::number)
        throw JsonSyntaxError(0, std::string(what) + " is not a number");
    const JsonNumber n = r.number();
    if (!n.is_u64 || n.u > most)
        throw JsonSyntaxError(
            0, std::string(what) + " is not an integer in 0.." + std::to_string(most));
    return n.u;
}

std::string text(JsonReader& r, const char* what) {
    if (r.peek() != JsonReader::Kind::string)
        throw JsonSyntaxError(0, std::string(what) + " is not a string");
    return r.string();
}

/// The trace's first line: its schema and vault, checked against `v`.
void check_header(std::string_view line, const Vault& v, const std::string& path) {
    JsonReader r(line, 4);
    std::string schema;
    std::map<std::string, std::string> got;  // the vault's keys as written
    r.object([&](std::string key) {
        if (key == "schema") {
            schema = text(r, "schema");
        } else if (key == "vault") {
            if (r.peek() != JsonReader::Kind::object)
                throw JsonSyntaxError(0, "vault is not an object");
            r.object([&](std::string k) {
                if (k == "id")
                    got[k] = text(r, "vault.id");
                else if (k == "size" || k == "num_moe_layers" || k == "num_experts" || k == "top_k")
                    got[k] = std::to_string(
                        bounded(r, std::numeric_limits<uint64_t>::max(), ("vault." + k).c_str()));
                else
                    r.skip();
            });
        } else {
            r.skip();
        }
    });
    if (schema != TRACE_SCHEMA)
        throw JsonSyntaxError(
            0, "not a routing trace (schema '" + schema + "', expected '" + TRACE_SCHEMA + "')");
    const std::pair<const char*, std::string> want[] = {
        {"id", vault_id(v)},
        {"size", std::to_string(v.size)},
        {"num_moe_layers", std::to_string(v.header.num_moe_layers)},
        {"num_experts", std::to_string(v.header.max_experts_per_layer)},
        {"top_k", std::to_string(vault_top_k(v))},
    };
    for (const auto& [key, value] : want) {
        const auto it = got.find(key);
        if (it == got.end())
            throw JsonSyntaxError(0, std::string("vault.") + key + " missing");
        if (it->second != value)
            refuse(path, 1,
                   "a trace of another vault (its " + std::string(key) + " " + it->second + ", " +
                       v.name + "'s " + value + ")");
    }
}

/// One (token, layer) line, checked against `v`.
TraceStep parse_step(std::string_view line, const Vault& v) {
    JsonReader r(line, 3);
    TraceStep s;
    bool have_token = false, have_layer = false, have_experts = false;
    r.object([&](std::string key) {
        if (key == "token") {
            s.token = static_cast<uint32_t>(bounded(r, UINT32_MAX, "token"));
            have_token = true;
        } else if (key == "layer") {
            s.layer = static_cast<uint32_t>(bounded(r, UINT32_MAX, "layer"));
            have_layer = true;
        } else if (key == "experts" || key == "hint") {
            if (have_experts)
                throw JsonSyntaxError(0, "both experts and hint");
            s.hint = key == "hint";
            if (r.peek() != JsonReader::Kind::array)
                throw JsonSyntaxError(0, key + " is not an array");
            r.array([&](size_t i) {
                if (i >= v.header.max_experts_per_layer)
                    throw JsonSyntaxError(0, "more experts than the router's " +
                                                 std::to_string(v.header.max_experts_per_layer));
                s.experts.push_back(static_cast<uint32_t>(bounded(r, UINT32_MAX, "expert")));
            });
            have_experts = true;
        } else {
            r.skip();
        }
    });
    if (!have_token || !have_layer || !have_experts)
        throw JsonSyntaxError(0, std::string(!have_token   ? "token"
                                             : !have_layer ? "layer"
                                                           : "experts") +
                                     " missing");
    if (s.experts.empty())
        throw JsonSyntaxError(0, "no experts");
    for (size_t i = 0; i < s.experts.size(); ++i) {
        if (v.find(s.layer, s.experts[i]) == nullptr)
            throw JsonSyntaxError(0, "no expert " + std::to_string(s.experts[i]) + " in layer " +
                                         std::to_string(s.layer) + " of the vault");
        if (std::find(s.experts.begin(), s.experts.begin() + static_cast<ptrdiff_t>(i),
                      s.experts[i]) != s.experts.begin() + static_cast<ptrdiff_t>(i))
            throw JsonSyntaxError(0, "expert " + std::to_string(s.experts[i]) + " repeated");
    }
    return s;
}

}  // namespace

std::vector<TraceStep> read_trace(const std::string& path, const Vault& v) {
    const Input in = open_input(path);
    std::vector<TraceStep> steps;
    std::string line;
    std::vector<char> chunk(size_t{1} << 16);
    uint64_t at = 0, n = 0;
    bool header = false;
    auto take = [&](std::string_view l) {
        ++n;
        try {
            JsonReader(l, 4).validate();
            if (!header) {
                check_header(l, v, path);
                header = true;
            } else {
                if (steps.size() >= TRACE_MAX_STEPS)
                    refuse(path, n, "more than " + std::to_string(TRACE_MAX_STEPS) + " steps");
                steps.push_back(parse_step(l, v));
            }
        } catch (const JsonSyntaxError& e) {
            refuse(path, n, e.what());
        }
    };
    for (;;) {
        const size_t got = pread_some(in.fd.get(), chunk.data(), chunk.size(), at, path);
        if (got == 0)
            break;
        at += got;
        for (size_t k = 0; k < got; ++k) {
            if (chunk[k] != '\n') {
                if (line.size() >= TRACE_MAX_LINE)
                    refuse(path, n + 1, "longer than " + std::to_string(TRACE_MAX_LINE) + " bytes");
                line += chunk[k];
                continue;
            }
            take(line);
            line.clear();
        }
    }
    if (!line.empty())
        take(line);  // a last line without its newline
    if (!header)
        refuse(path, 1, "empty: no smoe-trace/1 header line");
    return steps;
}

// ---- Belady's optimum ---------------------------------------------------------------------

std::vector<std::pair<size_t, size_t>> batches(size_t n, uint64_t slots) {
    std::vector<std::pair<size_t, size_t>> out;
    const size_t step = static_cast<size_t>(std::max<uint64_t>(1, slots));
    for (size_t b = 0; b < n; b += step)
        out.emplace_back(b, std::min(n, b + step));
    return out;
}

HitCount belady(const std::vector<TraceStep>& steps, uint64_t slots) {
    if (slots == 0)
        throw std::invalid_argument("belady: a cache of no slots");
    // The request sequence, batch by batch; a blob is (layer << 32 | expert).
    std::vector<uint64_t> seq;
    std::vector<size_t> batch_end;  // per request: the end of its batch in seq
    for (const TraceStep& s : steps)
        for (const auto& [b, e] : batches(s.hint ? 0 : s.experts.size(), slots)) {
            for (size_t i = b; i < e; ++i)
                seq.push_back(uint64_t{s.layer} << 32 | s.experts[i]);
            for (size_t i = b; i < e; ++i)
                batch_end.push_back(seq.size());
        }
    constexpr size_t NEVER = std::numeric_limits<size_t>::max();
    std::vector<size_t> next(seq.size(), NEVER);
    {
        std::unordered_map<uint64_t, size_t> seen;
        for (size_t i = seq.size(); i-- > 0;) {
            const auto it = seen.find(seq[i]);
            next[i] = it == seen.end() ? NEVER : it->second;
            seen[seq[i]] = i;
        }
    }
    HitCount c;
    std::unordered_map<uint64_t, size_t> resident;  // blob -> its next use
    std::set<std::pair<size_t, uint64_t>> by_next;  // (next use, blob), unpinned only
    std::vector<uint64_t> pinned;                   // the current batch's, out of by_next
    size_t end = 0;
    for (size_t i = 0; i < seq.size(); ++i) {
        if (i == end) {  // a new batch: the last one's blobs may go again
            for (uint64_t b : pinned)
                by_next.emplace(resident[b], b);
            pinned.clear();
            end = batch_end[i];
        }
        const uint64_t blob = seq[i];
        if (const auto it = resident.find(blob); it != resident.end()) {
            by_next.erase({it->second, blob});
            ++c.hits;
        } else {
            if (resident.size() >= slots) {
                const auto victim = std::prev(by_next.end());  // furthest ahead
                resident.erase(victim->second);
                by_next.erase(victim);
            }
            ++c.misses;
        }
        resident[blob] = next[i];
        pinned.push_back(blob);
    }
    return c;
}

double belady_hit_rate(const std::vector<TraceStep>& steps, uint64_t slots) {
    return belady(steps, slots).rate();
}

}  // namespace smoe::harness::engine
