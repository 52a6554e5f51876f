// Opening a .smoe vault the way the engine does: header, arch block, expert table and
// descriptors read with pread, every rule checked before anything is trusted, and the
// (layer, expert) -> entry map built. Blob bytes are only read by deep_check().
#pragma once

#include "io.hpp"
#include "json.hpp"

#include <common.hpp>

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace smoe::harness {

/// One finding: a rule of the spec's registry (smoe::rules in common.hpp) broken, or noted,
/// at one place. `field` is the path of the field at fault as in
/// fixtures/corrupt/EXPECTED.json; `offset` the absolute offset of that field (or of the
/// offending byte for blob contents); `expected` and `actual` the values, as the Python
/// verifier reports them (docs/JSON.md).
struct Issue {
    std::string code;
    std::string field;
    uint64_t offset = 0;
    std::string message;
    JsonScalar expected{};
    JsonScalar actual{};
    Severity severity = Severity::error;
};

/// Thrown when a vault breaks a rule: exit status 1.
struct InvalidVault : std::exception {
    explicit InvalidVault(Issue i) : issue(std::move(i)) {}
    const char* what() const noexcept override { return issue.message.c_str(); }
    Issue issue;
};

/// Thrown when a file is too short to hold a header (rules::HEADER_SIZE): an unreadable
/// input, exit status 2. what() reads like a broken rule: "NAME: CODE at offset 0 (header):
/// MESSAGE".
struct UnreadableVault : IoError {
    UnreadableVault(const std::string& name, Issue i)
        : IoError(name + ": " + i.code + " at offset " + std::to_string(i.offset) + " (" + i.field +
                  "): " + i.message),
          issue(std::move(i)) {}
    Issue issue;
};

/// One weight matrix of an expert, from its descriptor (offsets within the blob).
struct Tensor {
    uint32_t rows = 0, cols = 0;
    uint64_t packed_offset = 0, packed_size = 0;
    uint64_t scales_offset = 0, scales_size = 0;
    uint64_t weights() const { return uint64_t{rows} * cols; }
};

/// One expert table entry with its three descriptors (gate, up, down).
struct Expert {
    uint32_t layer_id = 0, expert_id = 0;
    uint64_t byte_offset = 0, raw_size = 0, padded_size = 0;
    Tensor tensors[TENSORS_PER_EXPERT];
};

/// An open, checked vault. Owns the file descriptor.
class Vault {
public:
    Vault() = default;
    Vault(const Vault&) = delete;
    Vault& operator=(const Vault&) = delete;
    ~Vault();

    /// Opens `path` read-only (open_input: anything but a regular file is refused without
    /// blocking) and runs every load check (throws IoError, InvalidVault).
    void open(const std::string& path);
    /// Same on an already open descriptor, which the vault takes over.
    void open_fd(int fd, const std::string& name);

    /// Called after each blob passed its checks, with its table index and a scratch buffer.
    using BlobHook = std::function<void(size_t, std::vector<uint8_t>&)>;
    /// Also reads the blobs: padding zero, scales finite, unused code bits zero; then
    /// `after_blob` (e.g. the manifest's checksum), blob by blob in table order.
    void deep_check(const BlobHook& after_blob = {}) const;

    /// The entry for (layer, expert), or nullptr.
    const Expert* find(uint32_t layer, uint32_t expert) const;

    std::string name;
    int fd = -1;
    FileId id;  // device and inode of the file opened
    uint64_t size = 0;
    SmoeHeader header{};
    std::optional<SmoeArchBlock> arch;  // v2 only
    std::vector<Expert> experts;        // table order
    std::vector<Issue> warnings;        // non-fatal findings (D4 gaps, D6 warnings, ...)
    uint64_t gap_bytes = 0;             // bytes between blobs that no blob uses

private:
    void check_header();
    void check_arch();
    void check_table();
    void check_overlap();
    void check_blob(size_t i, std::vector<uint8_t>& scratch) const;
    std::unordered_map<uint64_t, uint32_t> index_;
};

/// A descriptor to read the blobs of the very file `v` checked: O_DIRECT when asked for and
/// the file system takes it (some refuse at open, some only at the first read, so one page is
/// read to find out), else a duplicate of the vault's own descriptor, with `refused` saying
/// why O_DIRECT was not used. A file replaced since the check is refused (ReadFailed).
Fd open_blob_reads(const Vault& v, bool want_direct, bool& direct, std::string& refused);

}  // namespace smoe::harness
