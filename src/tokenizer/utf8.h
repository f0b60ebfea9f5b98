// UTF-8 helpers for the tokenizer: validation, lossy repair with U+FFFD, and the GPT-2
// byte <-> printable-character map used by byte-level BPE vocabularies.
//
// Lossy repair follows the Unicode "maximal subpart" practice (Unicode 15, section 3.9, U+FFFD
// substitution): each maximal prefix of a well-formed sequence that cannot be completed becomes one
// U+FFFD. This is what Rust's String::from_utf8_lossy (used by Hugging Face tokenizers' ByteLevel
// decoder) and Python's bytes.decode("utf-8", errors="replace") produce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsinfer::tokenizer::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// True when `s` is entirely well-formed UTF-8.
bool is_valid(std::string_view s);

// Appends `s` to `out`, replacing every maximal ill-formed subpart with U+FFFD. When `final` is
// false, a trailing sequence that is cut short by the end of `s` (but valid so far) is left
// unconsumed, so that it can be completed by later bytes. Returns the number of bytes consumed.
size_t append_lossy(std::string_view s, bool final, std::string* out);

// Decodes one code point at `s[*pos]` (which must be valid UTF-8) and advances *pos.
uint32_t next_code_point(std::string_view s, size_t* pos);
// Decodes the code point that ends at `s[end]` (exclusive; `s[..end]` valid UTF-8); sets *start.
uint32_t prev_code_point(std::string_view s, size_t end, size_t* start);
void append_code_point(uint32_t cp, std::string* out);

// Unicode White_Space (the set Rust's char::is_whitespace and regex `\s` use).
bool is_white_space(uint32_t cp);

// GPT-2 byte-level map: byte -> code point of its printable stand-in, and back
// (-1 when a code point is not a stand-in).
uint32_t byte_to_char(uint8_t b);
int char_to_byte(uint32_t cp);

}  // namespace dsinfer::tokenizer::utf8
