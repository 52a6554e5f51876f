#include "text.hpp"

#include "json.hpp"

#include <cstdint>
#include <cstdio>
#include <vector>

namespace smoe::harness {

namespace {

/// One character of a text read as UTF-8: a code point and its bytes, or one byte that is
/// not part of a well-formed sequence (Python's surrogateescape gives each such byte a
/// character of its own).
struct Unit {
    std::string_view bytes;
    uint32_t cp = 0;
    bool ill_formed = false;
};

std::vector<Unit> decode(std::string_view s) {
    std::vector<Unit> out;
    const auto* p = reinterpret_cast<const uint8_t*>(s.data());
    for (size_t k = 0; k < s.size();) {
        const size_t len = utf8_sequence(p + k, s.size() - k);
        if (len == 0) {
            out.push_back({s.substr(k, 1), p[k], true});
            ++k;
            continue;
        }
        uint32_t cp = len == 1 ? p[k] : p[k] & (0x7Fu >> len);
        for (size_t j = 1; j < len; ++j)
            cp = (cp << 6) | (p[k + j] & 0x3Fu);
        out.push_back({s.substr(k, len), cp, false});
        k += len;
    }
    return out;
}

/// Python's str.isspace (the characters its re module's \s matches).
bool is_space(const Unit& u) {
    if (u.ill_formed)
        return false;
    const uint32_t c = u.cp;
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_break(const Unit& u) {
    return !u.ill_formed && (u.cp == '\r' || u.cp == '\n');
}

/// fold_lines on decoded text: runs of whitespace holding a line break -> " ", ends stripped.
std::vector<Unit> fold(const std::vector<Unit>& in) {
    std::vector<Unit> out;
    for (size_t k = 0; k < in.size();) {
        if (!is_space(in[k])) {
            out.push_back(in[k++]);
            continue;
        }
        size_t end = k;
        bool line_break = false;
        for (; end < in.size() && is_space(in[end]); ++end)
            line_break = line_break || is_break(in[end]);
        if (line_break)
            out.push_back({" ", ' ', false});
        else
            out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(k),
                       in.begin() + static_cast<std::ptrdiff_t>(end));
        k = end;
    }
    size_t first = 0, last = out.size();
    while (first < last && is_space(out[first]))
        ++first;
    while (last > first && is_space(out[last - 1]))
        --last;
    return {out.begin() + static_cast<std::ptrdiff_t>(first),
            out.begin() + static_cast<std::ptrdiff_t>(last)};
}

}  // namespace

std::string fold_lines(std::string_view s) {
    std::string out;
    for (const Unit& u : fold(decode(s)))
        out += u.bytes;
    return out;
}

std::string shown(std::string_view s) {
    std::string out;
    for (const Unit& u : fold(decode(s))) {
        if (u.ill_formed || u.cp < 0x20 || (u.cp >= 0x7F && u.cp <= 0x9F)) {
            char esc[5];
            std::snprintf(esc, sizeof esc, "\\x%02x", static_cast<unsigned>(u.cp));
            out += esc;
        } else {
            out += u.bytes;
        }
    }
    return out;
}

}  // namespace smoe::harness
