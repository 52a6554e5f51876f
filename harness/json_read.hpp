// A strict, bounded JSON reader (RFC 8259) for the integrity manifest: UTF-8 only (an
// ill-formed byte sequence is an error), nesting bounded, non-negative integers read
// exactly up to 2^64 - 1, an integer literal of more than MAX_INTEGER_DIGITS digits refused. It
// walks the text in place: validate() checks a whole document without storing anything, then
// peek/skip/string/number/object/array pick out the values a caller wants.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace smoe::harness {

/// Not JSON: `pos` is the byte offset in the text where reading stopped.
struct JsonSyntaxError : std::runtime_error {
    JsonSyntaxError(size_t p, const std::string& what) : std::runtime_error(what), pos(p) {}
    size_t pos;
};

/// The most digits an integer literal may have: Python's json module refuses a longer one
/// (int() of more than sys.int_info.default_max_str_digits digits, CVE-2020-10735), so a
/// document with one is not JSON that the Python tools read, and is refused here too.
inline constexpr size_t MAX_INTEGER_DIGITS = 4300;

/// A number as written. `is_u64`: an integer literal (no fraction, no exponent, no
/// minus sign unless it is zero) whose value fits in 64 bits, in `u`.
struct JsonNumber {
    bool is_u64 = false;
    uint64_t u = 0;
    double value = 0;  // any number, as the closest double
};

class JsonReader {
public:
    enum class Kind { null, boolean, number, string, array, object };

    JsonReader(std::string_view text, unsigned max_depth) : text_(text), max_depth_(max_depth) {}

    /// Checks that the whole text is one JSON value (whitespace around it allowed).
    void validate();

    /// Kind of the next value (after whitespace).
    Kind peek();
    /// Reads past the next value, checking it.
    void skip();
    /// The next value, a string, decoded (a lone surrogate escape becomes U+FFFD).
    std::string string();
    JsonNumber number();
    /// The next value, true or false.
    bool boolean();

    /// Reads an object; `on_member(std::string key)` must read the member's value.
    template <class F>
    void object(F&& on_member) {
        expect('{');
        enter();
        if (ws_peek() == '}') {
            ++pos_;
        } else {
            for (;;) {
                if (ws_peek() != '"')
                    fail("expected a string key");
                std::string key = string();
                if (ws_peek() != ':')
                    fail("expected ':'");
                ++pos_;
                on_member(std::move(key));
                const char c = ws_peek();
                ++pos_;
                if (c == '}')
                    break;
                if (c != ',')
                    fail(pos_ - 1, "expected ',' or '}'");
            }
        }
        --depth_;
    }

    /// Reads an array; `on_item(size_t index)` must read the item.
    template <class F>
    void array(F&& on_item) {
        expect('[');
        enter();
        if (ws_peek() == ']') {
            ++pos_;
        } else {
            for (size_t i = 0;; ++i) {
                on_item(i);
                const char c = ws_peek();
                ++pos_;
                if (c == ']')
                    break;
                if (c != ',')
                    fail(pos_ - 1, "expected ',' or ']'");
            }
        }
        --depth_;
    }

private:
    [[noreturn]] void fail(const std::string& what) const { fail(pos_, what); }
    [[noreturn]] void fail(size_t at, const std::string& what) const;
    /// Skips whitespace; the next byte, or '\0' at the end (never valid there anyway).
    char ws_peek();
    void expect(char c);
    void enter();
    void literal(std::string_view word);
    unsigned hex4();

    std::string_view text_;
    size_t pos_ = 0;
    unsigned depth_ = 0;
    unsigned max_depth_;
};

}  // namespace smoe::harness
