// A minimal streaming JSON writer (objects, arrays, numbers, strings, null) whose output
// is always valid RFC 8259 UTF-8 JSON: strings with invalid UTF-8 get U+FFFD for each byte
// that is not part of a well-formed sequence (as the Python CLI's JSON), control characters
// are escaped, NaN/Infinity become null.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace smoe::harness {

/// One JSON scalar: null, an unsigned integer, a double or a string. A non-finite double
/// is written as the string "inf", "-inf" or "nan" (JSON has no such numbers).
class JsonScalar {
public:
    JsonScalar() = default;
    template <std::unsigned_integral T>
    requires(!std::same_as<T, bool>) JsonScalar(T v) : kind_(Kind::uint), u_(v) {}
    template <std::floating_point T>
    JsonScalar(T v) : kind_(Kind::real), d_(static_cast<double>(v)) {}
    JsonScalar(std::string s) : kind_(Kind::text), s_(std::move(s)) {}
    JsonScalar(const char* s) : kind_(Kind::text), s_(s) {}

    bool is_null() const { return kind_ == Kind::null; }
    /// The display text of a finding's value (Python's smoe.findings.display): an integer
    /// as "0x64 (100)", a double as Python's repr ("1e-06", "10000.0", "inf"), a string
    /// as itself; "" for null.
    std::string text() const;

private:
    friend class JsonWriter;
    enum class Kind : uint8_t { null, uint, real, text };
    Kind kind_ = Kind::null;
    uint64_t u_ = 0;
    double d_ = 0;
    std::string s_;
};

/// Python's repr of a double: the shortest digits that read back as ``v``, in positional
/// notation for exponents -4..15 (with ".0" when integral), else as "1e-05"; "inf", "-inf",
/// "nan".
std::string python_repr(double v);

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
    JsonWriter& value(const JsonScalar& v);
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
