#include "tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "base/strings.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace dsinfer::tokenizer {

namespace {

using json = nlohmann::json;

// The GPT-2 pre-tokenization pattern that ByteLevel(use_regex = true) applies (Oniguruma syntax).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Rust regex's Unicode `\w` (used by HF for single_word added tokens). \p{L} and \p{Nl} are
// inside Alphabetic; naming them adds the letters PCRE2's Unicode 14 tables lack (regex.h).
constexpr std::string_view kWordCharPattern =
    R"([\p{Alphabetic}\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  std::unique_ptr<Regex> regex;  // Split pattern; GPT-2 pattern for ByteLevel(use_regex)
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  std::string describe;
};

// Byte trie over added-token spellings, for leftmost-longest matching.
class AddedTrie {
 public:
  AddedTrie() { root_.fill(-1); }
  void insert(std::string_view s, int32_t token) {
    int32_t node = -1;
    for (size_t i = 0; i < s.size(); ++i) {
      const uint8_t b = static_cast<uint8_t>(s[i]);
      int32_t next = -1;
      if (node < 0) {
        next = root_[b];
      } else {
        for (const auto& [byte, child] : nodes_[node].kids) {
          if (byte == b)
            next = child;
        }
      }
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        if (node < 0) {
          root_[b] = next;
        } else {
          nodes_[node].kids.emplace_back(b, next);
        }
      }
      node = next;
    }
    if (node >= 0)
      nodes_[node].token = token;
  }
  bool empty() const { return nodes_.empty(); }
  bool may_start(uint8_t b) const { return root_[b] >= 0; }
  // Index of the longest token that starts at text[pos], or -1; sets *len.
  int32_t longest_at(std::string_view text, size_t pos, size_t* len) const {
    int32_t node = root_[static_cast<uint8_t>(text[pos])];
    int32_t best = -1;
    size_t i = pos + 1;
    while (node >= 0) {
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        *len = i - pos;
      }
      if (i >= text.size())
        break;
      const uint8_t b = static_cast<uint8_t>(text[i]);
      int32_t next = -1;
      for (const auto& [byte, child] : nodes_[node].kids) {
        if (byte == b) {
          next = child;
          break;
        }
      }
      node = next;
      ++i;
    }
    return best;
  }

 private:
  struct Node {
    int32_t token = -1;
    std::vector<std::pair<uint8_t, int32_t>> kids;
  };
  std::array<int32_t, 256> root_;
  std::vector<Node> nodes_;
};

struct Segment {
  std::string_view text;
  int32_t id = -1;  // >= 0: an added token
};

// Work buffers for one encode call.
struct Scratch {
  std::vector<std::string_view> pieces, next;
  std::vector<Span> matches;
  struct Part {
    uint32_t begin, end;
    bool flag;  // is_match, then "remove"
  };
  std::vector<Part> parts, merged;
  std::vector<std::unique_ptr<std::string>> arena;  // prefix-space copies
};

std::string status_where(const std::string& origin, const std::string& what) {
  return origin + ": " + what;
}

const json* find(const json& obj, const char* key) {
  if (!obj.is_object())
    return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// Optional bool field: absent or null -> def.
Result<bool> get_bool(const json& obj, const char* key, bool def, const std::string& where) {
  const json* v = find(obj, key);
  if (v == nullptr || v->is_null())
    return def;
  if (!v->is_boolean())
    return data_loss(where + "." + key + " must be a boolean");
  return v->get<bool>();
}

std::string type_of(const json& obj) {
  const json* t = find(obj, "type");
  return t != nullptr && t->is_string() ? t->get<std::string>() : std::string();
}

bool read_file(const std::string& path, std::string* out, Status* err) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    *err = not_found("tokenizer file not found or unreadable: " + path);
    return false;
  }
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out->append(buf, n);
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad) {
    *err = io_error("error reading " + path);
    return false;
  }
  return true;
}

// Vocabulary spelling in byte stand-ins -> raw bytes; false if some character is not a stand-in.
bool standins_to_bytes(std::string_view s, std::string* out) {
  out->clear();
  size_t pos = 0;
  while (pos < s.size()) {
    const int b = utf8::char_to_byte(utf8::next_code_point(s, &pos));
    if (b < 0)
      return false;
    out->push_back(static_cast<char>(b));
  }
  return true;
}

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  // Model.
  BpeModel bpe;
  std::unordered_map<std::string, int32_t> vocab;  // spelling -> id (model vocabulary)
  size_t merge_count = 0;
  // Per id.
  std::vector<std::string> id_spelling;  // added-token content or vocabulary spelling
  std::vector<std::string> id_bytes;     // decoded bytes
  std::vector<uint8_t> id_flags;         // kHas | kSpecial | kAdded
  static constexpr uint8_t kHas = 1, kSpecial = 2, kAdded = 4;
  // Added tokens.
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  AddedTrie raw_trie;                // normalized = false
  AddedTrie normalized_trie;         // normalized = true (content normalized)
  std::unique_ptr<Regex> word_char;  // only when some token is single_word
  // Pipeline.
  NormalizerKind normalizer = NormalizerKind::kNone;
  std::vector<PreStep> steps;

  Status load(const json& root);
  Status load_model(const json& model);
  Status load_normalizer(const json* n);
  Status load_pre_tokenizer(const json* p);
  Status load_decoder(const json* d);
  Status load_added(const json* a);
  Status add_pre_step(const json& step, const std::string& where);

  Status split_added(std::string_view text, const AddedTrie& trie, std::vector<Segment>* out) const;
  Status pre_tokenize(std::string_view text, Scratch* s) const;
  Status apply_split(const PreStep& step, std::string_view piece, Scratch* s) const;
  Status encode_text(std::string_view text, Scratch* s, std::vector<int32_t>* out) const;
  Status word_boundary_ok(std::string_view text, size_t start, size_t stop, bool* ok) const;
  Status error(const std::string& what) const { return data_loss(status_where(origin, what)); }
};

// ---------------------------------------------------------------------------------------------
// Loading.

Status Tokenizer::Impl::load(const json& root) {
  if (!root.is_object())
    return error("top level is not a JSON object");
  const json* model = find(root, "model");
  if (model == nullptr || !model->is_object())
    return error("missing object \"model\"");
  DSI_RETURN_IF_ERROR(load_model(*model));
  DSI_RETURN_IF_ERROR(load_normalizer(find(root, "normalizer")));
  DSI_RETURN_IF_ERROR(load_pre_tokenizer(find(root, "pre_tokenizer")));
  DSI_RETURN_IF_ERROR(load_decoder(find(root, "decoder")));
  // post_processor: never applied (encode() is HF's encode with add_special_tokens=False).
  DSI_RETURN_IF_ERROR(load_added(find(root, "added_tokens")));

  // Per-id tables.
  int32_t max_id = -1;
  for (const auto& [s, id] : vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : added) max_id = std::max(max_id, t.id);
  const size_t n = static_cast<size_t>(max_id + 1);
  id_spelling.assign(n, std::string());
  id_bytes.assign(n, std::string());
  id_flags.assign(n, 0);
  std::string bytes;
  auto set_id = [&](int32_t id, const std::string& spelling) {
    id_spelling[id] = spelling;
    id_flags[id] |= kHas;
    // ByteLevel decoder: stand-ins -> bytes; a token with any other character is used verbatim.
    id_bytes[id] = standins_to_bytes(spelling, &bytes) ? bytes : spelling;
  };
  for (const auto& [s, id] : vocab) set_id(id, s);
  for (const AddedToken& t : added) {
    set_id(t.id, t.content);
    id_flags[t.id] |= kAdded;
  }
  // HF skips by content: a vocabulary entry spelled like a special token is special too.
  for (const AddedToken& t : added) {
    if (!t.special)
      continue;
    id_flags[t.id] |= kSpecial;
    auto it = vocab.find(t.content);
    if (it != vocab.end())
      id_flags[it->second] |= kSpecial;
  }
  return Status();
}

Status Tokenizer::Impl::load_model(const json& model) {
  const std::string type = type_of(model);
  if (type.empty() ? find(model, "merges") == nullptr : type != "BPE") {
    return unimplemented(status_where(origin,
                                      "model type \"" +
                                          (type.empty() ? std::string("(none)") : type) +
                                          "\" is not supported (only byte-level BPE)"));
  }
  const json* v = find(model, "vocab");
  if (v == nullptr || !v->is_object())
    return error("model.vocab must be an object");
  vocab.reserve(v->size());
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (!it.value().is_number_integer())
      return error("model.vocab[\"" + it.key() + "\"] is not an integer");
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= INT32_MAX / 2)
      return error(str_format("model.vocab id %lld out of range", static_cast<long long>(id)));
    vocab[it.key()] = static_cast<int32_t>(id);
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* s = find(model, key);
    if (s != nullptr && !s->is_null() && !(s->is_string() && s->get<std::string>().empty())) {
      return unimplemented(status_where(origin, std::string("model.") + key + " is not supported"));
    }
  }
  if (const json* d = find(model, "dropout"); d != nullptr && !d->is_null()) {
    if (!d->is_number())
      return error("model.dropout must be a number or null");
    if (d->get<double>() > 0.0) {
      return unimplemented(
          status_where(origin, "model.dropout > 0 (BPE dropout) is not supported"));
    }
  }
  DSI_ASSIGN_OR_RETURN(const bool byte_fallback, get_bool(model, "byte_fallback", false, "model"));
  DSI_ASSIGN_OR_RETURN(bpe.fuse_unk, get_bool(model, "fuse_unk", false, "model"));
  DSI_ASSIGN_OR_RETURN(bpe.ignore_merges, get_bool(model, "ignore_merges", false, "model"));
  if (const json* u = find(model, "unk_token"); u != nullptr && !u->is_null()) {
    if (!u->is_string())
      return error("model.unk_token must be a string or null");
    auto it = vocab.find(u->get<std::string>());
    if (it == vocab.end())
      return error("model.unk_token \"" + u->get<std::string>() + "\" is not in the vocabulary");
    bpe.unk_id = it->second;
  }

  // Initial symbols for every byte.
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8::append_code_point(utf8::byte_to_char(static_cast<uint8_t>(b)), &ch);
    auto it = vocab.find(ch);
    if (it != vocab.end()) {
      bpe.byte_init[b].ids = {it->second};
      continue;
    }
    if (byte_fallback) {
      std::vector<int32_t> ids;
      for (char c : ch) {
        auto f = vocab.find(str_format("<0x%02X>", static_cast<uint8_t>(c)));
        if (f == vocab.end())
          break;
        ids.push_back(f->second);
      }
      if (ids.size() == ch.size())
        bpe.byte_init[b].ids = ids;
    }
  }

  // Merges: "a b" strings or ["a", "b"] pairs; rank = position.
  const json* m = find(model, "merges");
  if (m == nullptr || m->is_null())
    m = nullptr;
  if (m != nullptr && !m->is_array())
    return error("model.merges must be an array");
  if (m != nullptr) {
    bpe.merges.reserve(m->size());
    int32_t rank = 0;
    std::string a, b;
    for (const json& e : *m) {
      if (e.is_string()) {
        const std::string& s = e.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          return error(str_format(
              "model.merges[%d] \"%s\" is not two tokens separated by a space", rank, s.c_str()));
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        return error(str_format("model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", rank));
      }
      auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
      if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end()) {
        return error(
            str_format("model.merges[%d] (\"%s\", \"%s\") uses a token that is not in "
                       "the vocabulary",
                       rank,
                       a.c_str(),
                       b.c_str()));
      }
      bpe.merges.insert(ia->second, ib->second, {rank, iab->second});
      ++rank;
    }
    merge_count = static_cast<size_t>(rank);
  }
  if (bpe.ignore_merges) {
    std::string bytes;
    for (const auto& [s, id] : vocab) {
      if (standins_to_bytes(s, &bytes))
        bpe.byte_vocab.emplace(bytes, id);
    }
  }
  return Status();
}

Status Tokenizer::Impl::load_normalizer(const json* n) {
  if (n == nullptr || n->is_null())
    return Status();
  std::vector<std::string> kinds;
  std::vector<const json*> todo = {n};
  while (!todo.empty()) {
    const json* cur = todo.back();
    todo.pop_back();
    const std::string type = type_of(*cur);
    if (type == "Sequence") {
      const json* list = find(*cur, "normalizers");
      if (list == nullptr || !list->is_array())
        return error("normalizer Sequence without a list");
      for (auto it = list->rbegin(); it != list->rend(); ++it) todo.push_back(&*it);
    } else {
      kinds.push_back(type);
    }
  }
  if (kinds.empty())
    return Status();
  if (kinds.size() == 1 && kinds[0] == "NFC") {
    normalizer = NormalizerKind::kNfc;
    return Status();
  }
  std::string list;
  for (const std::string& k : kinds) list += (list.empty() ? "" : ", ") + (k.empty() ? "?" : k);
  return unimplemented(
      status_where(origin,
                   "normalizer [" + list +
                       "] is not supported (supported: none, an empty Sequence, or NFC alone)"));
}

Status Tokenizer::Impl::add_pre_step(const json& step, const std::string& where) {
  const std::string type = type_of(step);
  PreStep s;
  if (type == "Split") {
    const json* pattern = find(step, "pattern");
    const json* re = pattern ? find(*pattern, "Regex") : nullptr;
    const json* lit = pattern ? find(*pattern, "String") : nullptr;
    if (re != nullptr && re->is_string()) {
      DSI_ASSIGN_OR_RETURN(s.regex, Regex::compile(re->get<std::string>()));
      s.describe = "Split(regex)";
    } else if (lit != nullptr && lit->is_string()) {
      DSI_ASSIGN_OR_RETURN(s.regex, Regex::compile_literal(lit->get<std::string>()));
      s.describe = "Split(string)";
    } else {
      return error(where + ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
    const json* b = find(step, "behavior");
    const std::string behavior = b != nullptr && b->is_string() ? b->get<std::string>() : "";
    if (behavior == "Removed") {
      s.behavior = Behavior::kRemoved;
    } else if (behavior == "Isolated") {
      s.behavior = Behavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      s.behavior = Behavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      s.behavior = Behavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      s.behavior = Behavior::kContiguous;
    } else {
      return error(where + ".behavior \"" + behavior + "\" is not a split behavior");
    }
    DSI_ASSIGN_OR_RETURN(s.invert, get_bool(step, "invert", false, where));
  } else if (type == "Digits") {
    DSI_ASSIGN_OR_RETURN(const bool individual, get_bool(step, "individual_digits", false, where));
    DSI_ASSIGN_OR_RETURN(s.regex, Regex::compile(individual ? "[0-9]" : "[0-9]+"));
    s.describe = individual ? "Digits(individual)" : "Digits";
  } else if (type == "ByteLevel") {
    s.kind = PreStep::Kind::kByteLevel;
    DSI_ASSIGN_OR_RETURN(s.add_prefix_space, get_bool(step, "add_prefix_space", true, where));
    DSI_ASSIGN_OR_RETURN(const bool use_regex, get_bool(step, "use_regex", true, where));
    if (use_regex) {
      DSI_ASSIGN_OR_RETURN(s.regex, Regex::compile(kGpt2Pattern));
    }
    s.describe = std::string("ByteLevel(") + (s.add_prefix_space ? "prefix space" : "") +
                 (s.add_prefix_space && use_regex ? ", " : "") + (use_regex ? "GPT-2 regex" : "") +
                 ")";
  } else {
    return unimplemented(
        status_where(origin,
                     where + ": pre-tokenizer \"" + type +
                         "\" is not supported (supported: Sequence, Split, Digits, ByteLevel)"));
  }
  steps.push_back(std::move(s));
  return Status();
}

Status Tokenizer::Impl::load_pre_tokenizer(const json* p) {
  if (p == nullptr || p->is_null()) {
    return unimplemented(status_where(origin,
                                      "no pre_tokenizer: only byte-level BPE (a ByteLevel "
                                      "pre-tokenizer) is supported"));
  }
  if (type_of(*p) == "Sequence") {
    const json* list = find(*p, "pretokenizers");
    if (list == nullptr || !list->is_array())
      return error("pre_tokenizer Sequence without a list");
    for (size_t i = 0; i < list->size(); ++i) {
      DSI_RETURN_IF_ERROR(
          add_pre_step((*list)[i], str_format("pre_tokenizer.pretokenizers[%zu]", i)));
    }
  } else {
    DSI_RETURN_IF_ERROR(add_pre_step(*p, "pre_tokenizer"));
  }
  size_t byte_level = 0;
  for (const PreStep& s : steps) byte_level += s.kind == PreStep::Kind::kByteLevel;
  if (byte_level != 1 || steps.back().kind != PreStep::Kind::kByteLevel) {
    return unimplemented(status_where(
        origin, "the pre-tokenizer must end with exactly one ByteLevel step (byte-level BPE)"));
  }
  return Status();
}

Status Tokenizer::Impl::load_decoder(const json* d) {
  const json* cur = d;
  if (cur != nullptr && type_of(*cur) == "Sequence") {
    const json* list = find(*cur, "decoders");
    cur = list != nullptr && list->is_array() && list->size() == 1 ? &(*list)[0] : nullptr;
  }
  if (cur == nullptr || cur->is_null() || type_of(*cur) != "ByteLevel") {
    return unimplemented(status_where(origin, "only a ByteLevel decoder is supported"));
  }
  return Status();
}

Status Tokenizer::Impl::load_added(const json* a) {
  if (a == nullptr || a->is_null())
    return Status();
  if (!a->is_array())
    return error("added_tokens must be an array");
  for (size_t i = 0; i < a->size(); ++i) {
    const json& e = (*a)[i];
    const std::string where = str_format("added_tokens[%zu]", i);
    const json* id = find(e, "id");
    const json* content = find(e, "content");
    if (id == nullptr || !id->is_number_integer() || content == nullptr || !content->is_string()) {
      return error(where + " needs an integer \"id\" and a string \"content\"");
    }
    AddedToken t;
    const int64_t id64 = id->get<int64_t>();
    if (id64 < 0 || id64 >= INT32_MAX / 2)
      return error(where + ": id out of range");
    t.id = static_cast<int32_t>(id64);
    t.content = content->get<std::string>();
    if (t.content.empty())
      continue;  // HF ignores empty added tokens
    DSI_ASSIGN_OR_RETURN(t.special, get_bool(e, "special", false, where));
    DSI_ASSIGN_OR_RETURN(t.lstrip, get_bool(e, "lstrip", false, where));
    DSI_ASSIGN_OR_RETURN(t.rstrip, get_bool(e, "rstrip", false, where));
    DSI_ASSIGN_OR_RETURN(t.single_word, get_bool(e, "single_word", false, where));
    DSI_ASSIGN_OR_RETURN(t.normalized, get_bool(e, "normalized", !t.special, where));
    added_by_content[t.content] = t.id;
    added.push_back(std::move(t));
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    if (t.normalized) {
      normalized_trie.insert(normalize(normalizer, t.content), static_cast<int32_t>(i));
    } else {
      raw_trie.insert(t.content, static_cast<int32_t>(i));
    }
    if (t.single_word && word_char == nullptr) {
      DSI_ASSIGN_OR_RETURN(word_char, Regex::compile(kWordCharPattern));
    }
  }
  return Status();
}

// ---------------------------------------------------------------------------------------------
// Encoding.

Status Tokenizer::Impl::word_boundary_ok(std::string_view text,
                                         size_t start,
                                         size_t stop,
                                         bool* ok) const {
  *ok = true;
  if (start > 0) {
    size_t b;
    utf8::prev_code_point(text, start, &b);
    DSI_ASSIGN_OR_RETURN(const bool word, word_char->matches_at(text.substr(0, start), b));
    if (word)
      *ok = false;
  }
  if (stop < text.size()) {
    DSI_ASSIGN_OR_RETURN(const bool word, word_char->matches_at(text, stop));
    if (word)
      *ok = false;
  }
  return Status();
}

// HF AddedVocabulary::find_matches: leftmost-longest matches, then single_word / lstrip / rstrip.
Status Tokenizer::Impl::split_added(std::string_view text,
                                    const AddedTrie& trie,
                                    std::vector<Segment>* out) const {
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.may_start(static_cast<uint8_t>(text[pos]))) {
      ++pos;
      continue;
    }
    size_t len = 0;
    const int32_t k = trie.longest_at(text, pos, &len);
    if (k < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;
    const AddedToken& t = added[k];
    if (t.single_word) {
      bool ok;
      DSI_RETURN_IF_ERROR(word_boundary_ok(text, start, stop, &ok));
      if (!ok)
        continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t b;
        if (!utf8::is_white_space(utf8::prev_code_point(text, s, &b)))
          break;
        s = b;
      }
      start = std::max(s, start_offset);
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!utf8::is_white_space(utf8::next_code_point(text, &next)))
          break;
        stop = next;
      }
    }
    if (start_offset < start)
      out->push_back({text.substr(start_offset, start - start_offset), -1});
    out->push_back({std::string_view(), t.id});
    start_offset = stop;
  }
  if (start_offset < text.size())
    out->push_back({text.substr(start_offset), -1});
  return Status();
}

// One Split step on one piece (HF NormalizedString::split with the given behavior).
Status Tokenizer::Impl::apply_split(const PreStep& step, std::string_view piece, Scratch* s) const {
  s->matches.clear();
  DSI_RETURN_IF_ERROR(step.regex->find_all(piece, &s->matches));
  auto& parts = s->parts;
  parts.clear();
  uint32_t prev = 0;
  for (const Span& m : s->matches) {
    if (prev != m.begin)
      parts.push_back({prev, m.begin, step.invert});
    parts.push_back({m.begin, m.end, !step.invert});
    prev = m.end;
  }
  if (prev != piece.size())
    parts.push_back({prev, static_cast<uint32_t>(piece.size()), step.invert});

  auto& out = s->merged;  // (span, remove)
  out.clear();
  switch (step.behavior) {
    case Behavior::kIsolated:
      for (const auto& p : parts) out.push_back({p.begin, p.end, false});
      break;
    case Behavior::kRemoved:
      for (const auto& p : parts) out.push_back(p);
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const auto& p : parts) {
        if (p.flag == previous && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back({p.begin, p.end, false});
        }
        previous = p.flag;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const auto& p : parts) {
        if (p.flag && !previous && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back({p.begin, p.end, false});
        }
        previous = p.flag;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (size_t i = parts.size(); i-- > 0;) {
        const auto& p = parts[i];
        if (p.flag && !previous && !out.empty()) {
          out.back().begin = p.begin;
        } else {
          out.push_back({p.begin, p.end, false});
        }
        previous = p.flag;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  for (const auto& p : out) {
    if (!p.flag && p.end > p.begin)
      s->next.push_back(piece.substr(p.begin, p.end - p.begin));
  }
  return Status();
}

Status Tokenizer::Impl::pre_tokenize(std::string_view text, Scratch* s) const {
  s->pieces.clear();
  if (!text.empty())
    s->pieces.push_back(text);
  for (const PreStep& step : steps) {
    s->next.clear();
    for (std::string_view piece : s->pieces) {
      if (step.kind == PreStep::Kind::kByteLevel) {
        if (step.add_prefix_space && piece[0] != ' ') {
          s->arena.push_back(std::make_unique<std::string>(" "));
          s->arena.back()->append(piece);
          piece = *s->arena.back();
        }
        if (step.regex == nullptr) {
          s->next.push_back(piece);
          continue;
        }
      }
      DSI_RETURN_IF_ERROR(apply_split(step, piece, s));
    }
    std::swap(s->pieces, s->next);
  }
  return Status();
}

Status Tokenizer::Impl::encode_text(std::string_view text,
                                    Scratch* s,
                                    std::vector<int32_t>* out) const {
  if (text.empty())
    return Status();
  std::string normalized;
  if (normalizer != NormalizerKind::kNone) {
    normalized = normalize(normalizer, text);
    text = normalized;
  }
  DSI_RETURN_IF_ERROR(pre_tokenize(text, s));
  for (std::string_view piece : s->pieces) bpe.encode_word(piece, out);
  s->arena.clear();
  return Status();
}

// ---------------------------------------------------------------------------------------------
// Tokenizer.

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
  std::string file = path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    file = path + "/tokenizer.json";
  std::string text;
  Status err;
  if (!read_file(file, &text, &err))
    return err;
  return from_json(text, file);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(std::string_view json_text,
                                                        const std::string& origin) {
  const json root = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (root.is_discarded())
    return data_loss(origin + ": not valid JSON");
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  DSI_RETURN_IF_ERROR(impl->load(root));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Status Tokenizer::encode_append(std::string_view text,
                                bool allow_special,
                                std::vector<int32_t>* out) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!utf8::is_valid(text)) {
    utf8::append_lossy(text, /*final=*/true, &repaired);
    text = repaired;
  }
  thread_local Scratch scratch;
  if (!allow_special || m.added.empty())
    return m.encode_text(text, &scratch, out);

  // Pass 1: tokens matched on the raw text; pass 2: normalized tokens on the normalized
  // remaining pieces (HF AddedVocabulary::extract_and_normalize).
  std::vector<Segment> first, second;
  if (m.raw_trie.empty()) {
    first.push_back({text, -1});
  } else {
    DSI_RETURN_IF_ERROR(m.split_added(text, m.raw_trie, &first));
  }
  std::deque<std::string> normalized_store;  // stable addresses for the segments' views
  for (const Segment& seg : first) {
    if (seg.id >= 0 || m.normalized_trie.empty()) {
      second.push_back(seg);
      continue;
    }
    std::string_view t = seg.text;
    if (m.normalizer != NormalizerKind::kNone) {
      normalized_store.push_back(normalize(m.normalizer, t));
      t = normalized_store.back();
    }
    DSI_RETURN_IF_ERROR(m.split_added(t, m.normalized_trie, &second));
  }
  for (const Segment& seg : second) {
    if (seg.id >= 0) {
      out->push_back(seg.id);
    } else {
      // Normalizing again is harmless: NFC is idempotent.
      DSI_RETURN_IF_ERROR(m.encode_text(seg.text, &scratch, out));
    }
  }
  return Status();
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  DSI_RETURN_IF_ERROR(encode_append(text, allow_special, &ids));
  return ids;
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    if (!has_token(id))
      return invalid_argument(str_format("decode: token id %d has no token", id));
    if (skip_special && (m.id_flags[id] & Impl::kSpecial))
      continue;
    bytes += m.id_bytes[id];
  }
  if (utf8::is_valid(bytes))
    return bytes;
  std::string out;
  out.reserve(bytes.size() + 16);
  utf8::append_lossy(bytes, /*final=*/true, &out);
  return out;
}

Result<std::vector<std::string>> Tokenizer::pre_tokenize(std::string_view text) const {
  std::string repaired;
  if (!utf8::is_valid(text)) {
    utf8::append_lossy(text, true, &repaired);
    text = repaired;
  }
  std::string normalized;
  if (impl_->normalizer != NormalizerKind::kNone) {
    normalized = normalize(impl_->normalizer, text);
    text = normalized;
  }
  Scratch s;
  DSI_RETURN_IF_ERROR(impl_->pre_tokenize(text, &s));
  return std::vector<std::string>(s.pieces.begin(), s.pieces.end());
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end()) {
    return it->second;
  }
  if (auto it = impl_->vocab.find(key); it != impl_->vocab.end())
    return it->second;
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::added_token_id(std::string_view content) const {
  if (auto it = impl_->added_by_content.find(std::string(content));
      it != impl_->added_by_content.end()) {
    return it->second;
  }
  return std::nullopt;
}

bool Tokenizer::is_added(int32_t id) const {
  return has_token(id) && (impl_->id_flags[id] & Impl::kAdded);
}

std::optional<std::string_view> Tokenizer::id_to_token(int32_t id) const {
  if (!has_token(id))
    return std::nullopt;
  return std::string_view(impl_->id_spelling[id]);
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  return has_token(id) ? std::string_view(impl_->id_bytes[id]) : std::string_view();
}

bool Tokenizer::has_token(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_flags.size() &&
         (impl_->id_flags[id] & Impl::kHas);
}

bool Tokenizer::is_special(int32_t id) const {
  return has_token(id) && (impl_->id_flags[id] & Impl::kSpecial);
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->id_flags.size());
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}

std::string Tokenizer::summary() const {
  const Impl& m = *impl_;
  std::string steps;
  bool jit = true;
  for (const PreStep& s : m.steps) {
    steps += (steps.empty() ? "" : " + ") + s.describe;
    if (s.regex != nullptr)
      jit = jit && s.regex->jit();
  }
  return str_format(
      "byte-level BPE: %d ids (%zu vocab, %zu merges, %zu added), normalizer %s, "
      "pre-tokenizer %s, regex %s",
      vocab_size(),
      m.vocab.size(),
      m.merge_count,
      m.added.size(),
      m.normalizer == NormalizerKind::kNfc ? "NFC" : "none",
      steps.c_str(),
      jit ? "JIT" : "interpreted");
}

void Tokenizer::clear_cache() const {
  impl_->bpe.clear_cache();
}

// ---------------------------------------------------------------------------------------------
// IncrementalDecoder.

Result<std::string> IncrementalDecoder::feed(int32_t id) {
  if (!tok_->has_token(id)) {
    return invalid_argument(str_format("decode: token id %d has no token", id));
  }
  std::string out;
  if (skip_special_ && tok_->is_special(id))
    return out;
  pending_ += tok_->token_bytes(id);
  const size_t used = utf8::append_lossy(pending_, /*final=*/false, &out);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out;
  utf8::append_lossy(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

}  // namespace dsinfer::tokenizer
