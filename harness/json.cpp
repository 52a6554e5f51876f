#include "json.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace smoe::harness {

namespace {

/// Bytes allowed after lead byte `c` at position 1 of a well-formed sequence (Unicode
/// Table 3-7), and the sequence length; 0 for a byte that never starts one.
size_t utf8_shape(uint8_t c, uint8_t& lo, uint8_t& hi) {
    lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;  // no surrogates
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;  // at most U+10FFFF
        return 4;
    }
    return 0;
}

/// Length of the longest prefix of p[0..n) that a well-formed sequence could start with.
size_t utf8_subpart(const uint8_t* p, size_t n) {
    uint8_t lo, hi;
    const size_t want = utf8_shape(p[0], lo, hi);
    if (want == 0)
        return 1;
    size_t k = 1;
    for (; k < want && k < n; ++k) {
        if (p[k] < lo || p[k] > hi)
            break;
        lo = 0x80, hi = 0xBF;
    }
    return k;
}

}  // namespace

size_t utf8_sequence(const uint8_t* p, size_t n) {
    if (n == 0)
        return 0;
    if (p[0] < 0x80)
        return 1;
    uint8_t lo, hi;
    const size_t want = utf8_shape(p[0], lo, hi);
    return want != 0 && utf8_subpart(p, n) == want ? want : 0;
}

std::string python_repr(double v) {
    if (std::isnan(v))
        return "nan";
    if (std::isinf(v))
        return v < 0 ? "-inf" : "inf";
    char buf[40];
    const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    const std::string sci(buf, r.ptr);  // shortest round trip: "-d.ddde-XX"
    const size_t e = sci.find('e');
    const bool neg = sci[0] == '-';
    std::string digits;
    for (size_t k = neg ? 1 : 0; k < e; ++k)
        if (sci[k] != '.')
            digits += sci[k];
    int exp = 0;
    std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exp);
    std::string out = neg ? "-" : "";
    if (exp < -4 || exp >= 16) {  // "1e-05", "1.5e+16"
        out += digits.substr(0, 1);
        if (digits.size() > 1)
            out += "." + digits.substr(1);
        out += exp < 0 ? "e-" : "e+";
        const int mag = exp < 0 ? -exp : exp;
        if (mag < 10)
            out += '0';
        return out + std::to_string(mag);
    }
    if (exp < 0)
        return out + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    const auto whole = static_cast<size_t>(exp) + 1;
    if (digits.size() <= whole)
        return out + digits + std::string(whole - digits.size(), '0') + ".0";
    return out + digits.substr(0, whole) + "." + digits.substr(whole);
}

std::string JsonScalar::text() const {
    switch (kind_) {
        case Kind::null:
            return "";
        case Kind::uint: {
            char buf[48];
            std::snprintf(buf, sizeof buf, "0x%llx (%llu)", static_cast<unsigned long long>(u_),
                          static_cast<unsigned long long>(u_));
            return buf;
        }
        case Kind::real:
            return python_repr(d_);
        case Kind::text:
            return s_;
    }
    return "";
}

JsonWriter& JsonWriter::value(const JsonScalar& v) {
    switch (v.kind_) {
        case JsonScalar::Kind::null:
            return null();
        case JsonScalar::Kind::uint:
            return value(v.u_);
        case JsonScalar::Kind::real:
            return std::isfinite(v.d_) ? value(v.d_) : value(python_repr(v.d_));
        case JsonScalar::Kind::text:
            return value(v.s_);
    }
    return null();
}

JsonWriter& JsonWriter::begin_object() {
    open('{');
    return *this;
}
JsonWriter& JsonWriter::end_object() {
    close('}');
    return *this;
}
JsonWriter& JsonWriter::begin_array() {
    open('[');
    return *this;
}
JsonWriter& JsonWriter::end_array() {
    close(']');
    return *this;
}

JsonWriter& JsonWriter::key(std::string_view k) {
    comma();
    string(k);
    out_ += ": ";
    after_key_ = true;
    return *this;
}

JsonWriter& JsonWriter::value(uint64_t v) {
    comma();
    out_ += std::to_string(v);
    return *this;
}

JsonWriter& JsonWriter::value(bool v) {
    comma();
    out_ += v ? "true" : "false";
    return *this;
}

JsonWriter& JsonWriter::value(double v) {
    comma();
    if (!std::isfinite(v)) {
        out_ += "null";
        return *this;
    }
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, r.ptr);
    return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) {
    comma();
    string(s);
    return *this;
}

JsonWriter& JsonWriter::null() {
    comma();
    out_ += "null";
    return *this;
}

JsonWriter& JsonWriter::raw(std::string_view json) {
    comma();
    out_ += json;
    return *this;
}

void JsonWriter::comma() {
    if (after_key_) {
        after_key_ = false;
        return;
    }
    if (!first_.empty()) {
        if (!first_.back())
            out_ += ", ";
        first_.back() = false;
    }
}

void JsonWriter::open(char c) {
    comma();
    out_ += c;
    first_.push_back(true);
}

void JsonWriter::close(char c) {
    out_ += c;
    first_.pop_back();
}

void JsonWriter::string(std::string_view s) {
    static const char* hex = "0123456789abcdef";
    out_ += '"';
    const auto* p = reinterpret_cast<const uint8_t*>(s.data());
    const size_t n = s.size();
    for (size_t k = 0; k < n;) {
        const uint8_t c = p[k];
        if (c < 0x80) {
            if (c == '"' || c == '\\') {
                out_ += '\\';
                out_ += static_cast<char>(c);
            } else if (c < 0x20 || c == 0x7F) {
                out_ += "\\u00";
                out_ += hex[c >> 4];
                out_ += hex[c & 15];
            } else {
                out_ += static_cast<char>(c);
            }
            ++k;
            continue;
        }
        const size_t len = utf8_sequence(p + k, n - k);
        if (len == 0) {
            // one replacement per byte, as the Python CLI's JSON has it (a path's undecodable
            // bytes are one surrogate each, each one U+FFFD: smoe.cli.console.valid_text)
            out_ += "\\ufffd";
            ++k;
        } else {
            out_.append(s.data() + k, len);  // well-formed UTF-8 passes through
            k += len;
        }
    }
    out_ += '"';
}

}  // namespace smoe::harness
