// Small string helpers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace weft {

std::string trim(std::string_view s);
// `s` with ASCII letters in lower case (names compared case-insensitively, as DNS's).
std::string ascii_lower(std::string_view s);
std::vector<std::string> split(std::string_view s, char sep);
// The longest prefix of `s` of at most `max_bytes` that does not end inside a UTF-8
// character: a message cut to a bound stays valid text.
std::string utf8_prefix(std::string_view s, size_t max_bytes);
// `s` made safe to write to a terminal: control characters other than newline and tab
// (ESC, CR, BEL, DEL, UTF-8's C1 controls) and bytes that are not UTF-8 become visible
// \xNN escapes, so output cannot move the cursor, set the title or clear the screen. A
// backslash stays as it is.
std::string escape_terminal(std::string_view s);
// `bytes` random bytes (getrandom) as lowercase hex: ids and temporary names.
std::string random_hex(size_t bytes);

}  // namespace weft
