// tokenizer.json normalizers that the tokenizer implements: none, or NFC (Unicode canonical
// composition; the tables come from unicode_nfc_tables.inc, Unicode 14).
#pragma once

#include <string>
#include <string_view>

namespace dsinfer::tokenizer {

enum class NormalizerKind { kNone, kNfc };

// `text` must be valid UTF-8.
std::string normalize(NormalizerKind kind, std::string_view text);
std::string nfc(std::string_view text);

}  // namespace dsinfer::tokenizer
