// The integrity manifest beside a vault (docs/MANIFEST.md): read strictly, checked against
// the vault's size and table, and every blob's CRC-32C checked during `check --deep`.
#pragma once

#include "vault.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace smoe::harness {

/// One `experts[]` entry: the keys that are checked.
struct ManifestEntry {
    uint32_t layer = 0, expert = 0, crc32c = 0;
    uint64_t offset = 0, raw_size = 0;
};

struct Manifest {
    std::string path;
    uint64_t vault_size = 0, vault_experts = 0;
    uint64_t listed = 0;                 // length of experts[]
    std::vector<ManifestEntry> entries;  // its first entries, at most as many as the table's
};

/// "VAULT.manifest.json".
std::string default_manifest_path(const std::string& vault);

/// Reads the manifest at `path` and checks all but the checksums against the open vault:
/// InvalidVault with code manifest.malformed / manifest.vault / manifest.expert (field
/// "manifest/..."); one that cannot be read (missing, not a regular file, a failed read) is
/// manifest.malformed too, as in `smoe verify`. With `optional` set, nothing at `path`
/// (lstat fails, as Python's os.path.lexists) gives nullopt.
std::optional<Manifest> load_manifest(const std::string& path, const Vault& v, bool optional);

/// Checks the CRC-32C of table entry i's blob (raw_size bytes) against the manifest:
/// InvalidVault manifest.checksum at the blob's byte_offset.
void check_blob_crc(const Vault& v, const Manifest& m, size_t i, std::vector<uint8_t>& scratch);

}  // namespace smoe::harness
