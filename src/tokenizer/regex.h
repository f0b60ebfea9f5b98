// PCRE2 wrapper for the tokenizer's split patterns.
//
// tokenizer.json patterns are written for Oniguruma (Ruby syntax), which Hugging Face tokenizers
// uses. onig_to_pcre2() rewrites the constructs whose meaning differs in PCRE2 (UTF+UCP):
//   \s \S  -> \p{White_Space} / \P{White_Space}. PCRE2's UCP `\s` also matches U+180E (MONGOLIAN
//            VOWEL SEPARATOR, General_Category Zs before Unicode 6.3), Oniguruma's does not.
//   \w \W  -> [\p{L}\p{M}\p{N}\p{Pc}] (Oniguruma's Unicode word class; PCRE2 10.42's lacks M, Pc)
//   \h \H  -> [0-9a-fA-F] (hex digit in Oniguruma; horizontal space in PCRE2)
//   \uHHHH -> \x{HHHH}
//   \p{X}  -> [\p{X}...] for a general category X, adding the code points that Oniguruma (Unicode
//            16 in tokenizers 0.23) has in X but PCRE2 10.42 (Unicode 14) does not know yet: new
//            CJK ideographs, scripts and emoji (unicode_onig_extra.inc).
// and compiles with PCRE2_MULTILINE, since `^`/`$` are line anchors in Ruby syntax.
// Patterns are JIT-compiled when the platform supports it, else run by the interpreter.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsinfer::tokenizer {

// Rewrites an Oniguruma (Ruby syntax) pattern into an equivalent PCRE2 UTF/UCP pattern.
Result<std::string> onig_to_pcre2(std::string_view pattern);

struct Span {
  uint32_t begin;
  uint32_t end;
};

class Regex {
 public:
  // `pattern` is an Oniguruma pattern (translated with onig_to_pcre2).
  static Result<std::unique_ptr<Regex>> compile(std::string_view pattern);
  // Matches `literal` verbatim.
  static Result<std::unique_ptr<Regex>> compile_literal(std::string_view literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All non-overlapping matches in `subject` (valid UTF-8, not checked), left to right, with
  // Oniguruma's find_iter rule for empty matches (an empty match right where the previous match
  // ended is skipped). Appends to `out`. Thread-safe.
  Status find_all(std::string_view subject, std::vector<Span>* out) const;
  // True when a match starts exactly at `offset` (anchored). Thread-safe.
  Result<bool> matches_at(std::string_view subject, size_t offset) const;

  bool jit() const { return jit_; }
  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  static Result<std::unique_ptr<Regex>> build(const std::string& pcre_pattern,
                                              uint32_t extra,
                                              std::string_view shown);
  int match(std::string_view subject, size_t offset, uint32_t options, Span* m) const;

  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
  std::string pattern_;  // as given (for messages)
};

}  // namespace dsinfer::tokenizer
