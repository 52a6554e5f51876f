// A minimal streaming JSON writer (objects, arrays, numbers, strings, null) whose output
// is always valid RFC 8259 UTF-8 JSON: strings with invalid UTF-8 get U+FFFD for each
// ill-formed byte sequence, control characters are escaped, NaN/Infinity become null.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace smoe::harness {

/// Length (1-4) of the well-formed UTF-8 sequence at p[0..n) (strict: no overlong forms,
/// no surrogates, at most U+10FFFF), or 0 if the bytes there are ill-formed.
size_t utf8_sequence(const uint8_t* p, size_t n);

class JsonWriter {
public:
    JsonWriter& begin_object();
    JsonWriter& end_object();
    JsonWriter& begin_array();
    JsonWriter& end_array();
    /// The key of the next member of the current object.
    JsonWriter& key(std::string_view k);

    JsonWriter& value(uint64_t v);
    JsonWriter& value(uint32_t v) { return value(static_cast<uint64_t>(v)); }
    JsonWriter& value(bool v);
    /// Shortest text that reads back as the same double; null for inf/NaN.
    JsonWriter& value(double v);
    JsonWriter& value(std::string_view s);
    JsonWriter& value(const char* s) { return value(std::string_view(s)); }
    JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
    JsonWriter& null();
    /// Inserts already-formatted JSON as the next value.
    JsonWriter& raw(std::string_view json);

    template <class T>
    JsonWriter& member(std::string_view k, T v) {
        key(k);
        return value(v);
    }

    const std::string& str() const { return out_; }

private:
    void comma();
    void open(char c);
    void close(char c);
    void string(std::string_view s);

    std::string out_;
    std::vector<bool> first_;
    bool after_key_ = false;
};

}  // namespace smoe::harness
