// Structured outputs: a grammar (JSON schema, any JSON object, regex, EBNF) compiled against the
// tokenizer's vocabulary into a matcher that says, token by token, which next tokens keep the
// output inside the grammar (a bitmask the sampler applies before choosing).
//
// The engine is XGrammar (C++ core, built from its source distribution by cmake/xgrammar.cmake).
// It reports errors by throwing C++ exceptions: this module is the only code that calls it, and
// it catches every exception and returns it as a Status, so nothing throws across its boundary.
// Built without XGrammar (DSINFER_HAVE_XGRAMMAR off), available() is false and every compile()
// returns kUnimplemented (the API answers 400).
//
//   auto c = grammar::Compiler::create(tok, model_vocab, {eos});   // once per server
//   auto g = (*c)->compile({grammar::Kind::kJsonSchema, schema});  // cached by (kind, text)
//   auto m = grammar::Matcher::create(*g);                         // per request
//   std::vector<uint32_t> bits(grammar::mask_words(model_vocab));
//   if (m->fill_mask(bits)) { /* apply: token t allowed iff bit t set */ }
//   m->accept(token);
//
// Thread safety: Compiler is thread-safe (compile() from any thread; concurrent compiles of the
// same key compile once). A Matcher is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsinfer::tokenizer {
class Tokenizer;
}

namespace dsinfer::grammar {

enum class Kind {
  kJsonObject,  // any JSON object (text is ignored)
  kJsonSchema,  // text: a JSON schema
  kRegex,       // text: a regular expression the whole output must match
  kEbnf,        // text: an EBNF grammar (XGrammar's GBNF dialect, root rule `root`)
  // text: an XGrammar structural tag (JSON). Compiled over the marker vocabulary (below): the
  // recipe's DSML tool-call block (grammar/tool_calls.h builds it).
  kStructuralTag,
};
// "json_object", "json_schema", "regex", "grammar", "structural_tag"
const char* kind_name(Kind k);

struct Spec {
  Kind kind = Kind::kJsonObject;
  std::string text;
};

// Whether this build has a grammar engine.
bool available();

// 32-bit words of a mask over `vocab_size` tokens.
inline size_t mask_words(int64_t vocab_size) {
  return static_cast<size_t>((vocab_size + 31) / 32);
}
inline bool mask_allows(std::span<const uint32_t> bits, int32_t token) {
  return (bits[static_cast<size_t>(token) / 32] >> (static_cast<uint32_t>(token) % 32)) & 1u;
}

// A JSON schema as compiled: strings with `format: email` (and no `pattern`) get a pattern for
// the addresses within RFC 5321/1035's limits (dot-atom local part of at most 64 bytes, at most
// four domain labels of at most 63 bytes). The format alone leaves the length open, and a model
// that keeps writing a domain label never finishes; every address the pattern allows is still
// an email address. `schema` itself when it is not JSON or nests deeper than kMaxSchemaDepth.
std::string bounded_schema(const std::string& schema);

// The deepest nesting of `{`/`[` in JSON text (outside strings; a linear scan, no parse).
size_t json_nesting(std::string_view text);
inline constexpr size_t kMaxSchemaDepth = 128;

class Compiled;  // a grammar compiled for one vocabulary (immutable, shared)

class Compiler {
 public:
  // `vocab_size`: the model's (its logits' length; ids the tokenizer lacks are never allowed).
  // `stop_token_ids`: what may end the output once the grammar is complete (EOS). Added (control)
  // tokens are never allowed inside the grammar.
  // `marker_token_ids`: added tokens that kStructuralTag grammars may spell by their text (the
  // DSML token in `<｜DSML｜invoke`). Those grammars compile over a second vocabulary where each
  // marker token has its text, and where no ordinary token can spell a marker's first character
  // (tokens containing it, or ending with the start of its UTF-8 bytes, are never allowed): the
  // text of a marker then comes only from the marker token, as the output parser requires.
  static Result<std::unique_ptr<Compiler>> create(const tokenizer::Tokenizer& tok,
                                                  int32_t vocab_size,
                                                  std::vector<int32_t> stop_token_ids,
                                                  int max_threads = 2,
                                                  std::vector<int32_t> marker_token_ids = {});
  ~Compiler();
  Compiler(const Compiler&) = delete;
  Compiler& operator=(const Compiler&) = delete;

  // Compiles (or returns the cached) grammar. kInvalidArgument with XGrammar's message when the
  // spec does not compile (bad schema, bad regex, bad EBNF); kUnimplemented without XGrammar.
  Result<std::shared_ptr<const Compiled>> compile(const Spec& spec);
  int32_t vocab_size() const;
  size_t cache_entries() const;

  struct Impl;

 private:
  explicit Compiler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Per-request state: where the output is in the grammar.
class Matcher {
 public:
  static Result<std::unique_ptr<Matcher>> create(std::shared_ptr<const Compiled> grammar);
  ~Matcher();
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  // Fills `bits` (mask_words(vocab_size) words) with the tokens allowed next. Returns false when
  // every token is allowed (the mask need not be applied). After termination (a stop token
  // accepted) only the stop tokens are allowed.
  bool fill_mask(std::span<uint32_t> bits);
  // Advances by one token. kInvalidArgument when the grammar does not allow it (the state is
  // then unchanged).
  Status accept(int32_t token);
  // Undoes the last `n` accepted tokens (speculative decoding's rejected drafts).
  Status rollback(int n);
  // The output so far is a complete sentence of the grammar (a stop token may follow).
  bool completed() const;
  // A stop token was accepted after a complete sentence.
  bool terminated() const;
  int32_t vocab_size() const;

  struct Impl;

 private:
  explicit Matcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsinfer::grammar
