// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (the DeepSeek V4 vocabulary,
// and any tokenizer.json of the same kind: model BPE over GPT-2 byte stand-ins, a ByteLevel
// pre-tokenizer optionally preceded by Split/Digits steps, a ByteLevel decoder).
//
// Conformance target: Hugging Face `tokenizers` (Tokenizer.encode with add_special_tokens=False,
// Tokenizer.decode). See docs/tokenizer.md.
//
//   auto tok = Tokenizer::load("tokenizer.json");        // Result<std::unique_ptr<Tokenizer>>
//   auto ids = (*tok)->encode("Hello <think>", false);   // "<think>" stays plain text
//   auto ids2 = (*tok)->encode("Hello <think>", true);   // "<think>" -> its added-token id
//   auto text = (*tok)->decode(*ids);
//
// All const methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsinfer::tokenizer {

// One entry of tokenizer.json's `added_tokens`.
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;      // skipped by decode(skip_special = true)
  bool lstrip = false;       // a match absorbs the whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // only matches when not inside a word
  bool normalized = false;   // matched against normalized text (after the plain-text pass)
};

class Tokenizer {
 public:
  // `path` is a tokenizer.json file, or a directory that contains one.
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& path);
  // Parses tokenizer.json text; `origin` names the source in error messages.
  static Result<std::unique_ptr<Tokenizer>> from_json(std::string_view json_text,
                                                      const std::string& origin = "tokenizer.json");
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text -> ids. allow_special = false: every byte of `text` is ordinary text, so spellings of
  // added/special tokens ("<｜User｜>", "<think>") are tokenized like any other characters.
  // allow_special = true: added tokens (special or not) are split out first, as HF's encode does.
  // Invalid UTF-8 is repaired before tokenizing: each maximal ill-formed subpart becomes U+FFFD
  // (what Python's bytes.decode("utf-8", "replace") gives). No BOS/EOS is added (the
  // tokenizer.json post_processor is not applied). Fails only if a split regex hits a PCRE2 limit.
  Result<std::vector<int32_t>> encode(std::string_view text, bool allow_special = false) const;
  // Same, appending to *out.
  Status encode_append(std::string_view text, bool allow_special, std::vector<int32_t>* out) const;

  // Ids -> text: the bytes of every token concatenated (ByteLevel decoder), with ill-formed UTF-8
  // replaced by U+FFFD (one per maximal subpart, like HF). skip_special drops the added tokens
  // marked `special`. An id with no token is an InvalidArgument error.
  Result<std::string> decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The pre-tokenizer's pieces for `text` (no added-token matching), as raw UTF-8. For tests.
  Result<std::vector<std::string>> pre_tokenize(std::string_view text) const;

  // Vocabulary spelling (byte stand-ins, e.g. "Ġthe") or added-token content -> id.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string_view> id_to_token(int32_t id) const;
  // The id of the added token spelled `content` (nothing for a plain vocabulary entry).
  std::optional<int32_t> added_token_id(std::string_view content) const;
  // Whether `id` is an added token (special or not): the control tokens of a prompt format.
  bool is_added(int32_t id) const;
  // The bytes that `id` contributes to decoded text (before UTF-8 repair); empty if no token.
  std::string_view token_bytes(int32_t id) const;
  bool has_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // Largest id + 1 (129280 for DeepSeek V4).
  int32_t vocab_size() const;
  const std::vector<AddedToken>& added_tokens() const;
  // One line for logs: sizes, pre-tokenizer steps, whether the regexes are JIT-compiled.
  std::string summary() const;
  // Drops the BPE word cache (benchmarks measure cold and warm encoding).
  void clear_cache() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: feed ids one at a time, get back only complete UTF-8 text; bytes of a
// character split across tokens are held until the character is complete. The concatenation of
// every feed() result and flush() equals Tokenizer::decode of all ids.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tok_(&tokenizer), skip_special_(skip_special) {}

  // Text that became complete with this id (possibly empty). Error for an id with no token.
  Result<std::string> feed(int32_t id);
  // Everything still held; a truncated character at the end becomes U+FFFD. Resets the state.
  std::string flush();
  void reset() { pending_.clear(); }
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dsinfer::tokenizer
