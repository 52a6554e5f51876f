// Text for the terminal, the same as the Python CLI's (smoe/cli/console.py): a message or
// a name is one line, and no byte of it can start a terminal escape sequence.
#pragma once

#include <string>
#include <string_view>

namespace smoe::harness {

/// `s` on one line, as Python's console.fold_lines: each run of whitespace (the
/// characters of Python's str.isspace, read as UTF-8) that holds a CR or LF becomes one
/// space, and whitespace at both ends is dropped. Bytes that are not well-formed UTF-8
/// are kept as they are.
std::string fold_lines(std::string_view s);

/// `s` for the terminal, as Python's console.shown: fold_lines, then each byte that is not
/// part of well-formed UTF-8 as "\xNN", and each of U+0000-U+001F and U+007F-U+009F (C0,
/// DEL, C1: ESC, CSI, OSC, BEL, ...) as "\xNN" of its code point; everything else as it is.
/// "a\x1b[31m\nb" -> "a\\x1b[31m b"; a path byte 0xFF -> "\\xff".
std::string shown(std::string_view s);

}  // namespace smoe::harness
