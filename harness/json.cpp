#include "json.hpp"

#include <charconv>
#include <cmath>

namespace smoe::harness {

JsonWriter& JsonWriter::begin_object() { open('{'); return *this; }
JsonWriter& JsonWriter::end_object() { close('}'); return *this; }
JsonWriter& JsonWriter::begin_array() { open('['); return *this; }
JsonWriter& JsonWriter::end_array() { close(']'); return *this; }

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
        if (!first_.back()) out_ += ", ";
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
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out_ += '\\';
            out_ += static_cast<char>(c);
        } else if (c < 0x20) {
            out_ += "\\u00";
            out_ += hex[c >> 4];
            out_ += hex[c & 15];
        } else {
            out_ += static_cast<char>(c);  // UTF-8 passes through
        }
    }
    out_ += '"';
}

}  // namespace smoe::harness
