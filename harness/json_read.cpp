#include "json_read.hpp"

#include "json.hpp"

#include <cstdio>
#include <cstdlib>

namespace smoe::harness {

namespace {

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

}  // namespace

void JsonReader::fail(size_t at, const std::string& what) const {
    throw JsonSyntaxError(at, what);
}

char JsonReader::ws_peek() {
    while (pos_ < text_.size()) {
        const char c = text_[pos_];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            return c;
        ++pos_;
    }
    return '\0';
}

void JsonReader::expect(char c) {
    if (ws_peek() != c)
        fail(std::string("expected '") + c + "'");
    ++pos_;
}

void JsonReader::enter() {
    if (++depth_ > max_depth_)
        fail(pos_ - 1, "nested deeper than " + std::to_string(max_depth_) + " levels");
}

void JsonReader::validate() {
    pos_ = 0;
    depth_ = 0;
    skip();
    ws_peek();
    if (pos_ < text_.size())
        fail("data after the JSON value");
}

JsonReader::Kind JsonReader::peek() {
    const char c = ws_peek();
    if (pos_ >= text_.size())
        fail("unexpected end of the text");
    switch (c) {
        case '{':
            return Kind::object;
        case '[':
            return Kind::array;
        case '"':
            return Kind::string;
        case 't':
        case 'f':
            return Kind::boolean;
        case 'n':
            return Kind::null;
        default:
            if (c == '-' || is_digit(c))
                return Kind::number;
    }
    char buf[48];
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F)
        std::snprintf(buf, sizeof buf, "unexpected character '%c'", c);
    else
        std::snprintf(buf, sizeof buf, "unexpected byte 0x%02x", u);
    fail(buf);
}

void JsonReader::literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word)
        fail("expected '" + std::string(word) + "'");
    pos_ += word.size();
}

bool JsonReader::boolean() {
    if (peek() != Kind::boolean)
        fail("expected true or false");
    const bool value = text_[pos_] == 't';
    literal(value ? "true" : "false");
    return value;
}

void JsonReader::skip() {
    switch (peek()) {
        case Kind::object:
            object([this](std::string) { skip(); });
            break;
        case Kind::array:
            array([this](size_t) { skip(); });
            break;
        case Kind::string:
            string();
            break;
        case Kind::number:
            number();
            break;
        case Kind::boolean:
            literal(text_[pos_] == 't' ? "true" : "false");
            break;
        case Kind::null:
            literal("null");
            break;
    }
}

JsonNumber JsonReader::number() {
    if (peek() != Kind::number)
        fail("expected a number");
    JsonNumber n;
    const size_t start = pos_;
    const bool minus = text_[pos_] == '-';
    if (minus)
        ++pos_;
    if (pos_ >= text_.size() || !is_digit(text_[pos_]))
        fail("expected a digit");
    const size_t digits_at = pos_;
    bool fits = true;
    uint64_t v = 0;
    if (text_[pos_] == '0') {
        ++pos_;
    } else {
        for (; pos_ < text_.size() && is_digit(text_[pos_]); ++pos_) {
            const uint64_t d = static_cast<uint64_t>(text_[pos_] - '0');
            if (v > (UINT64_MAX - d) / 10)
                fits = false;
            else
                v = v * 10 + d;
        }
    }
    bool integer = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
        integer = false;
        ++pos_;
        if (pos_ >= text_.size() || !is_digit(text_[pos_]))
            fail("expected a digit after '.'");
        while (pos_ < text_.size() && is_digit(text_[pos_]))
            ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
        integer = false;
        ++pos_;
        if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-'))
            ++pos_;
        if (pos_ >= text_.size() || !is_digit(text_[pos_]))
            fail("expected a digit in the exponent");
        while (pos_ < text_.size() && is_digit(text_[pos_]))
            ++pos_;
    }
    if (integer && pos_ - digits_at > MAX_INTEGER_DIGITS)
        fail(start, "an integer of " + std::to_string(pos_ - digits_at) + " digits (at most " +
                        std::to_string(MAX_INTEGER_DIGITS) + ", as Python's json reads them)");
    n.is_u64 = integer && fits && (!minus || v == 0);
    n.u = n.is_u64 ? v : 0;
    // the value as a double (the closest; +-inf beyond its range), for settings like 1e-6
    n.value = std::strtod(std::string(text_.substr(start, pos_ - start)).c_str(), nullptr);
    return n;
}

unsigned JsonReader::hex4() {
    unsigned v = 0;
    for (int k = 0; k < 4; ++k, ++pos_) {
        const char c = pos_ < text_.size() ? text_[pos_] : '\0';
        unsigned d;
        if (is_digit(c))
            d = static_cast<unsigned>(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = static_cast<unsigned>(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = static_cast<unsigned>(c - 'A' + 10);
        else
            fail("expected 4 hex digits after \\u");
        v = v * 16 + d;
    }
    return v;
}

std::string JsonReader::string() {
    expect('"');
    std::string out;
    const auto* p = reinterpret_cast<const uint8_t*>(text_.data());
    for (;;) {
        if (pos_ >= text_.size())
            fail("unterminated string");
        const uint8_t c = p[pos_];
        if (c == '"') {
            ++pos_;
            return out;
        }
        if (c < 0x20)
            fail("control character in a string");
        if (c >= 0x80) {
            const size_t len = utf8_sequence(p + pos_, text_.size() - pos_);
            if (len == 0)
                fail("invalid UTF-8 in a string");
            out.append(text_.substr(pos_, len));
            pos_ += len;
            continue;
        }
        ++pos_;
        if (c != '\\') {
            out += static_cast<char>(c);
            continue;
        }
        const char e = pos_ < text_.size() ? text_[pos_] : '\0';
        ++pos_;
        switch (e) {
            case '"':
                out += '"';
                break;
            case '\\':
                out += '\\';
                break;
            case '/':
                out += '/';
                break;
            case 'b':
                out += '\b';
                break;
            case 'f':
                out += '\f';
                break;
            case 'n':
                out += '\n';
                break;
            case 'r':
                out += '\r';
                break;
            case 't':
                out += '\t';
                break;
            case 'u': {
                uint32_t cp = hex4();
                if (cp >= 0xD800 && cp <= 0xDBFF && text_.substr(pos_, 2) == "\\u") {
                    const size_t back = pos_;
                    pos_ += 2;
                    const uint32_t lo = hex4();
                    if (lo >= 0xDC00 && lo <= 0xDFFF)
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    else
                        pos_ = back;  // a lone high surrogate; the next escape stands alone
                }
                if (cp >= 0xD800 && cp <= 0xDFFF)
                    cp = 0xFFFD;  // lone surrogate
                append_utf8(out, cp);
                break;
            }
            default:
                fail(pos_ - 1, "invalid escape in a string");
        }
    }
}

}  // namespace smoe::harness
