// The scout: the model's weights outside the routed experts (a safetensors file beside the
// vault), read the way the vault is: header length and every offset bounded by the file's
// size before anything is allocated, tensors widened to float32 when asked for.
#pragma once

#include "io.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace smoe::harness::engine {

/// One tensor of the scout: dtype, shape and where its bytes lie in the file.
struct ScoutTensor {
    std::string dtype;  // "BF16", "F16" or "F32" (others are refused when read)
    std::vector<uint64_t> shape;
    uint64_t begin = 0, end = 0;  // absolute file offsets
    uint64_t elements() const;
};

/// The largest safetensors header read (the JSON after its 8-byte length).
inline constexpr uint64_t SCOUT_MAX_HEADER = uint64_t{64} << 20;

class Scout {
public:
    /// Opens and checks the file (RefusedInput for a malformed or truncated one, IoError when
    /// it cannot be read): every tensor lies inside the data area, its size matches its dtype
    /// and shape.
    explicit Scout(const std::string& path);

    const ScoutTensor* find(const std::string& name) const;
    /// The tensor as float32, row-major (RefusedInput for an unsupported dtype; the shape is
    /// checked against `shape` when given: a scout of another model is refused naming it).
    std::vector<float> floats(const std::string& name, const std::vector<uint64_t>& shape) const;
    /// A BF16 tensor's raw values (kept as they are: the decoder widens them as it uses them,
    /// so the resident trunk is the scout's size); empty for another dtype. Shape checked as
    /// floats() does.
    std::vector<uint16_t> bf16(const std::string& name, const std::vector<uint64_t>& shape) const;
    const std::map<std::string, ScoutTensor>& tensors() const { return tensors_; }
    const std::string& path() const { return path_; }
    FileId id() const { return in_.id; }

private:
    const ScoutTensor& checked(const std::string& name, const std::vector<uint64_t>& shape) const;
    std::string path_;
    Input in_;
    std::map<std::string, ScoutTensor> tensors_;
};

/// "[a, b]" for messages.
std::string shape_text(const std::vector<uint64_t>& shape);

}  // namespace smoe::harness::engine
