#include "grammar/grammar.h"

#include <algorithm>
#include <exception>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

#include "tokenizer/tokenizer.h"

#if DSINFER_HAVE_XGRAMMAR
#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>
#endif

namespace dsinfer::grammar {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kJsonObject:
      return "json_object";
    case Kind::kJsonSchema:
      return "json_schema";
    case Kind::kRegex:
      return "regex";
    case Kind::kEbnf:
      return "grammar";
    case Kind::kStructuralTag:
      return "structural_tag";
  }
  return "?";
}

namespace {
constexpr const char* kEmailPattern =
    "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,32}(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,31})?"
    "@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
    "{0,3}$";

void bound_emails(nlohmann::ordered_json& node, int depth) {
  if (depth > 256)
    return;
  if (node.is_array()) {
    for (auto& e : node) bound_emails(e, depth + 1);
    return;
  }
  if (!node.is_object())
    return;
  auto f = node.find("format");
  if (f != node.end() && f->is_string() && *f == "email" && !node.contains("pattern")) {
    node.erase(f);
    node["pattern"] = kEmailPattern;
  }
  for (auto& [k, v] : node.items()) {
    // Literal values, not schemas.
    if (k == "enum" || k == "const" || k == "default" || k == "examples")
      continue;
    bound_emails(v, depth + 1);
  }
}
}  // namespace

size_t json_nesting(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

std::string bounded_schema(const std::string& schema) {
  if (json_nesting(schema) > kMaxSchemaDepth)
    return schema;
  auto j = nlohmann::ordered_json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return schema;
  bound_emails(j, 0);
  return j.dump();
}

#if DSINFER_HAVE_XGRAMMAR

bool available() {
  return true;
}

class Compiled {
 public:
  Compiled(xgrammar::CompiledGrammar g, int32_t vocab) : g_(std::move(g)), vocab_(vocab) {}
  const xgrammar::CompiledGrammar& get() const { return g_; }
  int32_t vocab_size() const { return vocab_; }

 private:
  xgrammar::CompiledGrammar g_;
  int32_t vocab_;
};

namespace {
// Grammar sources above this size are refused before compiling (compile time and memory grow
// with them; no real schema or pattern comes near).
constexpr size_t kMaxSpecBytes = 256 * 1024;
// Compiled grammars kept (a full cache is emptied; entries in use stay alive through their
// shared_ptr).
constexpr size_t kMaxCacheEntries = 512;

// Runs `f`, turning any exception (XGrammar reports every error by throwing) into a Status.
template <typename F>
Status guarded(const char* what, F&& f) {
  try {
    f();
    return Status();
  } catch (const std::exception& e) {
    std::string m = e.what();
    // XGrammar prefixes "[time] file:line: " and may append a backtrace: keep the message.
    const size_t check = m.find("Check failed");
    if (check != std::string::npos) {
      m = m.substr(check);
    } else if (!m.empty() && m[0] == '[') {
      const size_t stamp = m.find("] ");
      const size_t colon = stamp == std::string::npos ? stamp : m.find(": ", stamp);
      if (colon != std::string::npos) {
        const std::string where = m.substr(stamp + 2, colon - stamp - 2);
        if (where.find(".cc:") != std::string::npos || where.find(".h:") != std::string::npos)
          m = m.substr(colon + 2);
      }
    }
    if (const size_t nl = m.find("\nStack trace"); nl != std::string::npos)
      m.resize(nl);
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
    return invalid_argument(std::string(what) + ": " + m);
  } catch (...) {
    return invalid_argument(std::string(what) + ": unknown error");
  }
}
}  // namespace

struct Compiler::Impl {
  struct Slot {
    std::once_flag once;
    Status status;
    std::shared_ptr<const Compiled> value;
  };
  int32_t vocab = 0;
  std::unique_ptr<xgrammar::GrammarCompiler> compiler;
  // kStructuralTag grammars: the vocabulary with marker tokens spelled (the same as `compiler`'s
  // when there are no marker tokens).
  std::unique_ptr<xgrammar::GrammarCompiler> marker_compiler;
  mutable std::mutex mu;
  std::map<std::pair<Kind, std::string>, std::shared_ptr<Slot>> cache;
};

Compiler::Compiler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Compiler::~Compiler() = default;

Result<std::unique_ptr<Compiler>> Compiler::create(const tokenizer::Tokenizer& tok,
                                                   int32_t vocab_size,
                                                   std::vector<int32_t> stop_token_ids,
                                                   int max_threads,
                                                   std::vector<int32_t> marker_token_ids) {
  if (vocab_size <= 0)
    return invalid_argument("grammar: vocab_size must be positive");
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size)
      return invalid_argument("grammar: stop token id " + std::to_string(id) + " out of range");
  }
  for (int32_t id : marker_token_ids) {
    if (id < 0 || id >= vocab_size || !tok.has_token(id) || !tok.is_added(id) ||
        tok.token_bytes(id).empty()) {
      return invalid_argument("grammar: marker token id " + std::to_string(id) +
                              " is not an added token with text");
    }
  }
  // The decoded bytes of every ordinary token; "" marks a token the grammar never allows
  // (added/control tokens, ids the tokenizer lacks): XGrammar treats empty ones as special.
  std::vector<std::string> vocab(static_cast<size_t>(vocab_size));
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (tok.has_token(id) && !tok.is_added(id))
      vocab[static_cast<size_t>(id)] = std::string(tok.token_bytes(id));
  }
  auto impl = std::make_unique<Impl>();
  impl->vocab = vocab_size;
  Status s = guarded("grammar: vocabulary", [&] {
    xgrammar::TokenizerInfo info(
        vocab, xgrammar::VocabType::RAW, vocab_size, stop_token_ids, false);
    impl->compiler = std::make_unique<xgrammar::GrammarCompiler>(
        info, max_threads, /*cache_enabled=*/false, /*max_memory_bytes=*/-1);
  });
  if (!s.ok())
    return s;
  if (!marker_token_ids.empty()) {
    // The marker vocabulary: each marker token has its text; an ordinary token that could put a
    // marker's first UTF-8 character into the output (whole, or its first bytes, which a later
    // token would complete) is never allowed, so marker text can only come from marker tokens.
    // (Removing tokens by how they end never leaves a grammar stuck inside a character: the
    // tokens that continue one are all kept.)
    std::vector<std::string> leads;  // each marker's first character (its UTF-8 bytes)
    for (int32_t id : marker_token_ids) {
      const std::string_view text = tok.token_bytes(id);
      size_t n = 1;
      while (n < text.size() && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) ++n;
      leads.emplace_back(text.substr(0, n));
    }
    for (std::string& t : vocab) {
      for (const std::string& lead : leads) {
        // Spelling it across tokens needs a token that ends with a proper prefix of it.
        bool spells = t.find(lead) != std::string::npos;
        for (size_t n = 1; n < lead.size() && !spells; ++n)
          spells = t.size() >= n && t.compare(t.size() - n, n, lead, 0, n) == 0;
        if (spells) {
          t.clear();
          break;
        }
      }
    }
    for (int32_t id : marker_token_ids)
      vocab[static_cast<size_t>(id)] = std::string(tok.token_bytes(id));
    s = guarded("grammar: marker vocabulary", [&] {
      xgrammar::TokenizerInfo info(
          vocab, xgrammar::VocabType::RAW, vocab_size, std::move(stop_token_ids), false);
      impl->marker_compiler = std::make_unique<xgrammar::GrammarCompiler>(
          info, max_threads, /*cache_enabled=*/false, /*max_memory_bytes=*/-1);
    });
    if (!s.ok())
      return s;
  }
  return std::unique_ptr<Compiler>(new Compiler(std::move(impl)));
}

int32_t Compiler::vocab_size() const {
  return impl_->vocab;
}

size_t Compiler::cache_entries() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cache.size();
}

Result<std::shared_ptr<const Compiled>> Compiler::compile(const Spec& spec) {
  if (spec.text.size() > kMaxSpecBytes) {
    return invalid_argument(std::string("the ") + kind_name(spec.kind) + " is " +
                            std::to_string(spec.text.size()) + " bytes; at most " +
                            std::to_string(kMaxSpecBytes) + " are accepted");
  }
  std::shared_ptr<Impl::Slot> slot;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    std::pair<Kind, std::string> key{spec.kind,
                                     spec.kind == Kind::kJsonObject ? std::string() : spec.text};
    auto it = impl_->cache.find(key);
    if (it == impl_->cache.end()) {
      if (impl_->cache.size() >= kMaxCacheEntries)
        impl_->cache.clear();
      it = impl_->cache.emplace(std::move(key), std::make_shared<Impl::Slot>()).first;
    }
    slot = it->second;
  }
  // Compiles once per key; concurrent callers of the same key wait for that one compile.
  std::call_once(slot->once, [&] {
    xgrammar::GrammarCompiler& c = *impl_->compiler;
    std::optional<xgrammar::CompiledGrammar> g;
    const std::string what = std::string("invalid ") + kind_name(spec.kind);
    slot->status = guarded(what.c_str(), [&] {
      switch (spec.kind) {
        case Kind::kJsonObject:
          // Compact JSON (no free whitespace: a model cannot loop on it), any object.
          g = c.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false);
          break;
        case Kind::kJsonSchema:
          g = c.CompileJSONSchema(bounded_schema(spec.text), /*any_whitespace=*/false);
          break;
        case Kind::kRegex:
          g = c.CompileRegex(spec.text);
          break;
        case Kind::kEbnf:
          g = c.CompileGrammar(spec.text, "root");
          break;
        case Kind::kStructuralTag: {
          xgrammar::GrammarCompiler& mc =
              impl_->marker_compiler ? *impl_->marker_compiler : *impl_->compiler;
          g = mc.CompileStructuralTag(spec.text);
          break;
        }
      }
    });
    if (slot->status.ok())
      slot->value = std::make_shared<const Compiled>(std::move(*g), impl_->vocab);
  });
  if (!slot->status.ok())
    return slot->status;
  return slot->value;
}

struct Matcher::Impl {
  std::shared_ptr<const Compiled> grammar;
  std::optional<xgrammar::GrammarMatcher> m;
};

Matcher::Matcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Matcher::~Matcher() = default;

Result<std::unique_ptr<Matcher>> Matcher::create(std::shared_ptr<const Compiled> grammar) {
  if (!grammar)
    return invalid_argument("grammar: no compiled grammar");
  auto impl = std::make_unique<Impl>();
  impl->grammar = std::move(grammar);
  Status s = guarded("grammar: matcher", [&] { impl->m.emplace(impl->grammar->get()); });
  if (!s.ok())
    return s;
  return std::unique_ptr<Matcher>(new Matcher(std::move(impl)));
}

int32_t Matcher::vocab_size() const {
  return impl_->grammar->vocab_size();
}

bool Matcher::fill_mask(std::span<uint32_t> bits) {
  DSI_CHECK(bits.size() == mask_words(vocab_size()), "grammar mask: %zu words", bits.size());
  int64_t shape[1] = {static_cast<int64_t>(bits.size())};
  DLTensor t{};
  t.data = bits.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLInt, 32, 1};
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  bool need = true;
  Status s = guarded("grammar: mask", [&] { need = impl_->m->FillNextTokenBitmask(&t); });
  // The tensor is shaped as XGrammar checks it (size checked above): a failure is a bug.
  DSI_CHECK(s.ok(), "%s", s.message().c_str());
  return need;
}

Status Matcher::accept(int32_t token) {
  if (token < 0 || token >= vocab_size())
    return invalid_argument("grammar: token " + std::to_string(token) + " out of range");
  bool ok = false;
  Status s = guarded("grammar: accept", [&] { ok = impl_->m->AcceptToken(token); });
  if (!s.ok())
    return s;
  if (!ok)
    return invalid_argument("grammar: token " + std::to_string(token) + " is not allowed here");
  return Status();
}

Status Matcher::rollback(int n) {
  return guarded("grammar: rollback", [&] { impl_->m->Rollback(n); });
}

bool Matcher::completed() const {
  return impl_->m->IsCompleted();
}
bool Matcher::terminated() const {
  return impl_->m->IsTerminated();
}

#else  // !DSINFER_HAVE_XGRAMMAR

bool available() {
  return false;
}

class Compiled {};

struct Compiler::Impl {
  int32_t vocab = 0;
};
Compiler::Compiler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Compiler::~Compiler() = default;

Result<std::unique_ptr<Compiler>> Compiler::create(const tokenizer::Tokenizer&,
                                                   int32_t vocab_size,
                                                   std::vector<int32_t>,
                                                   int,
                                                   std::vector<int32_t>) {
  auto impl = std::make_unique<Impl>();
  impl->vocab = vocab_size;
  return std::unique_ptr<Compiler>(new Compiler(std::move(impl)));
}
int32_t Compiler::vocab_size() const {
  return impl_->vocab;
}
size_t Compiler::cache_entries() const {
  return 0;
}
Result<std::shared_ptr<const Compiled>> Compiler::compile(const Spec& spec) {
  return unimplemented(std::string("structured outputs (") + kind_name(spec.kind) +
                       ") are not available: this server was built without XGrammar");
}

struct Matcher::Impl {};
Matcher::Matcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Matcher::~Matcher() = default;
Result<std::unique_ptr<Matcher>> Matcher::create(std::shared_ptr<const Compiled>) {
  return unimplemented("structured outputs are not available: built without XGrammar");
}
bool Matcher::fill_mask(std::span<uint32_t>) {
  return false;
}
Status Matcher::accept(int32_t) {
  return Status();
}
Status Matcher::rollback(int) {
  return Status();
}
bool Matcher::completed() const {
  return false;
}
bool Matcher::terminated() const {
  return false;
}
int32_t Matcher::vocab_size() const {
  return 0;
}

#endif

}  // namespace dsinfer::grammar
