#include "engine/scout.hpp"

#include "fp16.hpp"
#include "json_read.hpp"

#include <cstring>

namespace smoe::harness::engine {

namespace {

uint64_t dtype_bytes(const std::string& dtype) {
    if (dtype == "F32")
        return 4;
    if (dtype == "BF16" || dtype == "F16")
        return 2;
    if (dtype == "F64" || dtype == "I64" || dtype == "U64")
        return 8;
    if (dtype == "I32" || dtype == "U32")
        return 4;
    if (dtype == "I16" || dtype == "U16")
        return 2;
    if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" ||
        dtype == "F8_E5M2")
        return 1;
    return 0;
}

float bf16_to_f32(uint16_t b) {
    const uint32_t bits = uint32_t{b} << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

}  // namespace

uint64_t ScoutTensor::elements() const {
    uint64_t n = 1;
    for (uint64_t d : shape)
        n = d == 0 || n <= UINT64_MAX / d ? n * d : UINT64_MAX;
    return n;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
    std::string s = "[";
    for (size_t k = 0; k < shape.size(); ++k)
        s += (k ? ", " : "") + std::to_string(shape[k]);
    return s + "]";
}

Scout::Scout(const std::string& path) : path_(path), in_(open_input(path)) {
    auto refuse = [&](const std::string& why) { throw RefusedInput(path + ": " + why); };
    if (in_.size < 8)
        refuse("truncated scout: " + std::to_string(in_.size) + " bytes, no safetensors header");
    uint8_t len_bytes[8];
    pread_full(in_.fd.get(), len_bytes, 8, 0, path);
    uint64_t len = 0;
    for (int k = 7; k >= 0; --k)
        len = len << 8 | len_bytes[k];
    if (len > SCOUT_MAX_HEADER || len > in_.size - 8)
        refuse("truncated scout: a header of " + std::to_string(len) + " bytes in a file of " +
               std::to_string(in_.size));
    std::string text(len, '\0');
    pread_full(in_.fd.get(), text.data(), len, 8, path);
    const uint64_t data = 8 + len;
    try {
        JsonReader r(text, 8);
        r.validate();
        JsonReader j(text, 8);
        j.object([&](std::string name) {
            if (name == "__metadata__")
                return j.skip();
            ScoutTensor t;
            bool have_offsets = false;
            j.object([&](std::string key) {
                if (key == "dtype") {
                    t.dtype = j.string();
                } else if (key == "shape") {
                    j.array([&](size_t i) {
                        const JsonNumber n = j.number();
                        if (!n.is_u64 || i >= 8)
                            refuse(name + ": a malformed shape");
                        t.shape.push_back(n.u);
                    });
                } else if (key == "data_offsets") {
                    uint64_t off[2] = {0, 0};
                    j.array([&](size_t i) {
                        const JsonNumber n = j.number();
                        if (!n.is_u64 || i >= 2)
                            refuse(name + ": malformed data_offsets");
                        off[i] = n.u;
                    });
                    have_offsets = true;
                    t.begin = off[0];
                    t.end = off[1];
                } else {
                    j.skip();
                }
            });
            const uint64_t width = dtype_bytes(t.dtype);
            if (!have_offsets || width == 0)
                refuse(name + ": no dtype or data_offsets");
            if (t.begin > t.end || t.end > in_.size - data)
                refuse("truncated scout: " + name + " ends at byte " +
                       std::to_string(data + t.end) + " of " + std::to_string(in_.size));
            const uint64_t n = t.elements();
            if (n > (t.end - t.begin) / width || n * width != t.end - t.begin)
                refuse(name + ": " + std::to_string(t.end - t.begin) + " bytes for " + t.dtype +
                       " " + shape_text(t.shape));
            t.begin += data;
            t.end += data;
            tensors_[name] = std::move(t);
        });
    } catch (const JsonSyntaxError& e) {
        refuse(std::string("not a safetensors header: ") + e.what());
    }
}

const ScoutTensor* Scout::find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

const ScoutTensor& Scout::checked(const std::string& name,
                                  const std::vector<uint64_t>& shape) const {
    const ScoutTensor* t = find(name);
    if (t == nullptr)
        throw RefusedInput(path_ + ": no tensor " + name);
    if (!shape.empty() && t->shape != shape)
        throw RefusedInput(path_ + ": " + name + " is " + shape_text(t->shape) +
                           ", the vault's model needs " + shape_text(shape) +
                           " (a scout of another model?)");
    return *t;
}

std::vector<uint16_t> Scout::bf16(const std::string& name,
                                  const std::vector<uint64_t>& shape) const {
    const ScoutTensor& t = checked(name, shape);
    if (t.dtype != "BF16")
        return {};
    std::vector<uint16_t> out(t.elements());
    pread_full(in_.fd.get(), out.data(), t.end - t.begin, t.begin, path_);
    for (uint16_t& v : out)  // little-endian on disk
        v = static_cast<uint16_t>(reinterpret_cast<const uint8_t*>(&v)[0] |
                                  reinterpret_cast<const uint8_t*>(&v)[1] << 8);
    return out;
}

std::vector<float> Scout::floats(const std::string& name,
                                 const std::vector<uint64_t>& shape) const {
    const ScoutTensor* t = &checked(name, shape);
    const uint64_t n = t->elements();
    std::vector<uint8_t> raw(t->end - t->begin);
    pread_full(in_.fd.get(), raw.data(), raw.size(), t->begin, path_);
    std::vector<float> out(n);
    if (t->dtype == "F32") {
        std::memcpy(out.data(), raw.data(), raw.size());
    } else if (t->dtype == "BF16" || t->dtype == "F16") {
        for (uint64_t k = 0; k < n; ++k) {
            const uint16_t b = static_cast<uint16_t>(raw[2 * k] | raw[2 * k + 1] << 8);
            out[k] = t->dtype == "BF16" ? bf16_to_f32(b) : fp16_to_f32(b);
        }
    } else {
        throw RefusedInput(path_ + ": " + name + " is " + t->dtype +
                           " (the decoder reads BF16, F16 and F32)");
    }
    return out;
}

}  // namespace smoe::harness::engine
