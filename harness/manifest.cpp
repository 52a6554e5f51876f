#include "manifest.hpp"

#include "crc32c.hpp"
#include "io.hpp"
#include "json.hpp"
#include "json_read.hpp"

#include <common.hpp>

#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace smoe::harness {

namespace {

using ull = unsigned long long;

constexpr const char* SCHEMA = "smoe-manifest/1";
constexpr const char* CHECKSUM = "crc32c";
constexpr unsigned MAX_DEPTH = 16;
constexpr uint64_t BASE_LIMIT = uint64_t{64} << 20, PER_ENTRY_LIMIT = uint64_t{4} << 10;

/// A scalar member as read: absent, or its kind and (for strings and numbers) value.
struct Scalar {
    bool present = false;
    JsonReader::Kind kind = JsonReader::Kind::null;
    std::string s;
    JsonNumber n;
};

Scalar read_scalar(JsonReader& r) {
    Scalar v;
    v.present = true;
    v.kind = r.peek();
    if (v.kind == JsonReader::Kind::string)
        v.s = r.string();
    else if (v.kind == JsonReader::Kind::number)
        v.n = r.number();
    else
        r.skip();
    return v;
}

/// The first problem found, as (field, message).
struct Problem {
    std::string field, message;
    explicit operator bool() const { return !field.empty(); }
};

/// Why `v` is not an integer below 2^bits, or "" if it is one.
std::string not_integer(const Scalar& v, int bits) {
    if (!v.present)
        return "key missing";
    const char* range = bits == 32 ? "not an integer in [0, 2^32)" : "not an integer in [0, 2^64)";
    if (v.kind != JsonReader::Kind::number || !v.n.is_u64)
        return range;
    if (bits == 32 && v.n.u > UINT32_MAX)
        return range;
    return "";
}

/// A string from the manifest for a one-line message: JSON-quoted (control characters
/// escaped), at most 64 bytes of it.
std::string quoted(const std::string& s) {
    JsonWriter j;
    j.value(std::string_view(s).substr(0, 64));
    return j.str() + (s.size() > 64 ? "..." : "");
}

std::string not_string(const Scalar& v, const char* want, const char* name) {
    if (!v.present)
        return "key missing";
    if (v.kind != JsonReader::Kind::string)
        return "not a string";
    if (v.s != want)
        return std::string(name) + " " + quoted(v.s) + " is not \"" + want + "\"";
    return "";
}

/// Everything the manifest says that is checked, as read in one walk.
struct Walk {
    Scalar schema, checksum, size, experts_count;
    bool has_vault = false, vault_is_object = false;
    bool has_experts = false, experts_is_array = false;
    Problem entry_problem;  // the first entry that is not an object of the right types
    uint64_t listed = 0;
    std::vector<ManifestEntry> entries;
};

void walk_entry(JsonReader& r, size_t i, size_t keep, Walk& w) {
    const std::string at = "manifest/experts/" + std::to_string(i);
    if (r.peek() != JsonReader::Kind::object) {
        if (!w.entry_problem)
            w.entry_problem = {at, "not an object"};
        r.skip();
        return;
    }
    Scalar f[5];
    static const char* const KEYS[5] = {"layer", "expert", "offset", "raw_size", "crc32c"};
    static const int BITS[5] = {32, 32, 64, 64, 32};
    r.object([&](std::string key) {
        for (int k = 0; k < 5; ++k)
            if (key == KEYS[k]) {
                f[k] = read_scalar(r);
                return;
            }
        r.skip();
    });
    for (int k = 0; k < 5 && !w.entry_problem; ++k)
        if (std::string why = not_integer(f[k], BITS[k]); !why.empty())
            w.entry_problem = {at + "/" + KEYS[k], why};
    if (i < keep && !w.entry_problem)
        w.entries.push_back({static_cast<uint32_t>(f[0].n.u), static_cast<uint32_t>(f[1].n.u),
                             static_cast<uint32_t>(f[4].n.u), f[2].n.u, f[3].n.u});
}

Walk walk(std::string_view text, size_t keep) {
    Walk w;
    JsonReader r(text, MAX_DEPTH);
    r.object([&](std::string key) {
        if (key == "schema") {
            w.schema = read_scalar(r);
        } else if (key == "checksum") {
            w.checksum = read_scalar(r);
        } else if (key == "vault") {
            w.has_vault = true;
            w.vault_is_object = r.peek() == JsonReader::Kind::object;
            w.size = w.experts_count = Scalar{};
            if (!w.vault_is_object)
                return r.skip();
            r.object([&](std::string k) {
                if (k == "size")
                    w.size = read_scalar(r);
                else if (k == "experts")
                    w.experts_count = read_scalar(r);
                else
                    r.skip();
            });
        } else if (key == "experts") {
            w.has_experts = true;
            w.experts_is_array = r.peek() == JsonReader::Kind::array;
            w.entry_problem = {};
            w.entries.clear();
            w.listed = 0;
            if (!w.experts_is_array)
                return r.skip();
            r.array([&](size_t i) {
                walk_entry(r, i, keep, w);
                w.listed = i + 1;
            });
        } else {
            r.skip();  // keys this reader does not know are ignored
        }
    });
    return w;
}

}  // namespace

std::string default_manifest_path(const std::string& vault) {
    return vault + ".manifest.json";
}

std::optional<Manifest> load_manifest(const std::string& path, const Vault& v, bool optional) {
    // expected = what the manifest says, actual = what the vault holds (as smoe/format/manifest.py)
    auto bad = [&](const Rule& rule, const std::string& field, uint64_t offset,
                   const std::string& why, JsonScalar expected = {}, JsonScalar actual = {}) {
        return InvalidVault(Issue{rule.code, field, offset, path + ": " + why, expected, actual});
    };
    auto malformed = [&](const std::string& field, const std::string& why) {
        return bad(rules::MANIFEST_MALFORMED, field, 0, why);
    };
    // The sidecar beside the vault is looked for as Python's os.path.lexists does: a name
    // there, even a dangling symlink, is a manifest to check.
    struct stat st {};
    if (optional && ::lstat(path.c_str(), &st) != 0)
        return std::nullopt;
    // A manifest that cannot be read (missing, not a regular file, a failed or short read) is
    // a finding of the check, not a failure to read the vault: manifest.malformed, the
    // message the read's error (as smoe/format/verify/blobs.py's read_manifest says).
    const uint64_t limit = BASE_LIMIT + PER_ENTRY_LIMIT * v.header.total_experts;
    std::vector<uint8_t> bytes;
    try {
        const Input in = open_input(path);
        if (in.size > limit)
            throw InvalidVault(Issue{rules::MANIFEST_MALFORMED.code, "manifest", 0,
                                     path + " is " + std::to_string(in.size) +
                                         " bytes, more than the " + std::to_string(limit) +
                                         " bytes allowed for " +
                                         std::to_string(v.header.total_experts) + " experts"});
        bytes = read_whole_file(in, path, static_cast<size_t>(limit));
    } catch (const IoError& e) {
        throw InvalidVault(Issue{rules::MANIFEST_MALFORMED.code, "manifest", 0, e.what()});
    }
    const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    try {
        JsonReader(text, MAX_DEPTH).validate();
    } catch (const JsonSyntaxError& e) {
        throw malformed("manifest",
                        "not valid JSON at byte " + std::to_string(e.pos) + ": " + e.what());
    }
    if (JsonReader(text, MAX_DEPTH).peek() != JsonReader::Kind::object)
        throw malformed("manifest", "not a JSON object");
    Walk w = walk(text, v.experts.size());

    if (auto why = not_string(w.schema, SCHEMA, "schema"); !why.empty())
        throw malformed("manifest/schema", why);
    if (auto why = not_string(w.checksum, CHECKSUM, "checksum"); !why.empty())
        throw malformed("manifest/checksum", why);
    if (!w.has_vault)
        throw malformed("manifest/vault", "key missing");
    if (!w.vault_is_object)
        throw malformed("manifest/vault", "not an object");
    if (auto why = not_integer(w.size, 64); !why.empty())
        throw malformed("manifest/vault/size", why);
    if (auto why = not_integer(w.experts_count, 64); !why.empty())
        throw malformed("manifest/vault/experts", why);
    if (!w.has_experts)
        throw malformed("manifest/experts", "key missing");
    if (!w.experts_is_array)
        throw malformed("manifest/experts", "not an array");
    if (w.entry_problem)
        throw malformed(w.entry_problem.field, w.entry_problem.message);

    // The manifest belongs to this vault (offsets as smoe/format/manifest.py reports them) ...
    char msg[256];
    const uint64_t actual[2] = {v.size, v.header.total_experts};
    const Scalar* said[2] = {&w.size, &w.experts_count};
    for (int k = 0; k < 2; ++k)
        if (said[k]->n.u != actual[k]) {
            const char* key = k == 0 ? "size" : "experts";
            std::snprintf(msg, sizeof msg,
                          "vault.%s %llu is not this vault's %llu (the manifest belongs to "
                          "another file)",
                          key, ull(said[k]->n.u), ull(actual[k]));
            throw bad(rules::MANIFEST_VAULT, std::string("manifest/vault/") + key, 0, msg,
                      said[k]->n.u, actual[k]);
        }
    // ... and lists the table's blobs, in table order.
    const size_t n = v.experts.size();
    if (w.listed != n) {
        std::snprintf(msg, sizeof msg, "lists %llu experts, the table has %zu", ull(w.listed), n);
        throw bad(rules::MANIFEST_EXPERT, "manifest/experts", 0, msg, w.listed,
                  static_cast<uint64_t>(n));
    }
    for (size_t i = 0; i < n; ++i) {
        const ManifestEntry& m = w.entries[i];
        const Expert& x = v.experts[i];
        const char* keys[4] = {"layer", "expert", "offset", "raw_size"};
        const uint64_t table[4] = {x.layer_id, x.expert_id, x.byte_offset, x.raw_size};
        const uint64_t listed[4] = {m.layer, m.expert, m.offset, m.raw_size};
        for (int k = 0; k < 4; ++k)
            if (listed[k] != table[k]) {
                std::snprintf(msg, sizeof msg,
                              "table entry %zu (layer %u, expert %u) has %s %llu, the manifest "
                              "says %llu",
                              i, x.layer_id, x.expert_id, keys[k], ull(table[k]), ull(listed[k]));
                throw bad(rules::MANIFEST_EXPERT,
                          "manifest/experts/" + std::to_string(i) + "/" + keys[k], x.byte_offset,
                          msg, listed[k], table[k]);
            }
    }
    Manifest m;
    m.path = path;
    m.vault_size = w.size.n.u;
    m.vault_experts = w.experts_count.n.u;
    m.listed = w.listed;
    m.entries = std::move(w.entries);
    return m;
}

void check_blob_crc(const Vault& v, const Manifest& m, size_t i, std::vector<uint8_t>& scratch) {
    const Expert& x = v.experts[i];
    uint32_t crc = 0;
    for (uint64_t done = 0; done < x.raw_size;) {
        const size_t len =
            static_cast<size_t>(std::min<uint64_t>(scratch.size(), x.raw_size - done));
        pread_full(v.fd, scratch.data(), len, x.byte_offset + done, v.name);
        crc = crc32c_update(crc, scratch.data(), len);
        done += len;
    }
    if (crc != m.entries[i].crc32c) {
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "the blob of (layer %u, expert %u) has CRC-32C 0x%08x, the manifest says "
                      "0x%08x",
                      x.layer_id, x.expert_id, crc, m.entries[i].crc32c);
        throw InvalidVault(Issue{rules::MANIFEST_CHECKSUM.code,
                                 "manifest/experts/" + std::to_string(i) + "/crc32c", x.byte_offset,
                                 m.path + ": " + msg, static_cast<uint64_t>(m.entries[i].crc32c),
                                 static_cast<uint64_t>(crc)});
    }
}

}  // namespace smoe::harness
