#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/strings.h"

namespace dsinfer::tokenizer {

namespace {

struct OnigExtra {
  const char* name;
  const char* ranges;
};

// Code points that Oniguruma (Unicode 16 in tokenizers 0.23) puts in a general category and
// PCRE2 10.42 (Unicode 14) does not know yet: new ideographs, scripts and emoji.
#include "tokenizer/unicode_onig_extra.inc"

const char* onig_extra(std::string_view category) {
  for (const OnigExtra& e : kOnigExtra) {
    if (category == e.name)
      return e.ranges;
  }
  return nullptr;
}

// Class body (no brackets) for \p{category} with the Unicode-version fix-up.
void append_category(std::string_view category, std::string* out) {
  *out += "\\p{";
  *out += category;
  *out += '}';
  if (const char* extra = onig_extra(category))
    *out += extra;
}

constexpr std::string_view kHexClassBody = "0-9a-fA-F";

void append_word_class_body(std::string* out) {  // Oniguruma's Unicode \w: L, M, N, Pc
  for (std::string_view c : {"L", "M", "N", "Pc"}) append_category(c, out);
}

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Per-thread match resources: one match-data block (group 0 only) and a JIT stack that can grow
// to 8 MiB, so long whitespace or letter runs cannot exhaust the default 32 KiB stack.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (context != nullptr && stack != nullptr)
      pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

std::string pcre2_error(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0)
    return str_format("error %d", code);
  return std::string(reinterpret_cast<const char*>(buf));
}

}  // namespace

Result<std::string> onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t class_start = 0;  // index in `p` just after the opening '[' (and '^')
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size())
        return invalid_argument("regex ends with a lone backslash");
      const char e = p[++i];
      switch (e) {
        case 's':
          out += "\\p{White_Space}";
          break;
        case 'S':
          out += "\\P{White_Space}";
          break;
        case 'w':
        case 'h':
          if (!in_class)
            out += '[';
          if (e == 'w') {
            append_word_class_body(&out);
          } else {
            out += kHexClassBody;
          }
          if (!in_class)
            out += ']';
          break;
        case 'W':
        case 'H':
          if (in_class) {
            return unimplemented(str_format(
                "regex uses \\%c inside a character class, which has no PCRE2 equivalent", e));
          }
          out += "[^";
          if (e == 'W') {
            append_word_class_body(&out);
          } else {
            out += kHexClassBody;
          }
          out += ']';
          break;
        case 'u':
          if (i + 4 < p.size() && is_hex(p[i + 1]) && is_hex(p[i + 2]) && is_hex(p[i + 3]) &&
              is_hex(p[i + 4])) {
            out += "\\x{";
            out += p.substr(i + 1, 4);
            out += '}';
            i += 4;
          } else {
            out += "\\u";
          }
          break;
        case 'p':
        case 'P': {
          // \p{X}, \p{^X}, \P{X}, \pX: general categories get the Unicode-version fix-up.
          std::string_view name;
          size_t end = i;
          if (i + 1 < p.size() && p[i + 1] == '{') {
            const size_t close = p.find('}', i + 2);
            if (close == std::string_view::npos)
              return invalid_argument("unterminated \\p{ in regex");
            name = p.substr(i + 2, close - i - 2);
            end = close;
          } else if (i + 1 < p.size()) {
            name = p.substr(i + 1, 1);
            end = i + 1;
          }
          bool negated = e == 'P';
          if (!name.empty() && name[0] == '^') {
            negated = !negated;
            name.remove_prefix(1);
          }
          if (onig_extra(name) == nullptr || (negated && in_class)) {
            // No fix-up needed (or not expressible inside a class): keep as written.
            out += p.substr(i - 1, end - i + 2);
          } else {
            if (!in_class)
              out += negated ? "[^" : "[";
            append_category(name, &out);
            if (!in_class)
              out += ']';
          }
          i = end;
          break;
        }
        default:
          out += '\\';
          out += e;
          break;
      }
      continue;
    }
    if (!in_class) {
      if (c == '[') {
        in_class = true;
        out += c;
        if (i + 1 < p.size() && p[i + 1] == '^')
          out += p[++i];
        class_start = i + 1;
        continue;
      }
      out += c;
      continue;
    }
    // Inside a character class.
    if (c == ']' && i != class_start) {
      in_class = false;
    } else if (c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {
        const size_t close = p.find(":]", i + 2);
        if (close == std::string_view::npos)
          return invalid_argument("unterminated [: in regex");
        out += p.substr(i, close + 2 - i);
        i = close + 1;
        continue;
      }
      return unimplemented(
          "regex uses a nested character class (Oniguruma syntax), which PCRE2 "
          "does not support");
    } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
      return unimplemented(
          "regex uses a character-class intersection (&&), which PCRE2 does "
          "not support");
    }
    out += c;
  }
  return out;
}

Result<std::unique_ptr<Regex>> Regex::build(const std::string& pcre_pattern,
                                            uint32_t extra,
                                            std::string_view shown) {
  pcre2_compile_context* cctx = pcre2_compile_context_create(nullptr);
  if (cctx == nullptr)
    return Status(StatusCode::kResourceExhausted, "pcre2: out of memory");
  pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // PCRE2_LITERAL admits no UCP (nor MULTILINE); neither matters for a literal.
  const uint32_t options =
      (extra & PCRE2_LITERAL) ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP | extra);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre_pattern.data()),
                                   pcre_pattern.size(),
                                   options,
                                   &err,
                                   &err_offset,
                                   cctx);
  pcre2_compile_context_free(cctx);
  if (code == nullptr) {
    return invalid_argument(str_format("cannot compile regex \"%.*s\" at offset %zu: %s",
                                       static_cast<int>(shown.size()),
                                       shown.data(),
                                       static_cast<size_t>(err_offset),
                                       pcre2_error(err).c_str()));
  }
  std::unique_ptr<Regex> re(new Regex());
  re->code_ = code;
  re->pattern_ = std::string(shown);
  // JIT when available; on failure (no JIT support for this CPU, out of executable memory)
  // pcre2_match falls back to the interpreter.
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

Result<std::unique_ptr<Regex>> Regex::compile(std::string_view pattern) {
  auto translated = onig_to_pcre2(pattern);
  if (!translated.ok()) {
    return translated.status().with_context(
        str_format("regex \"%.*s\"", static_cast<int>(pattern.size()), pattern.data()));
  }
  return build(*translated, PCRE2_MULTILINE, pattern);
}

Result<std::unique_ptr<Regex>> Regex::compile_literal(std::string_view literal) {
  return build(std::string(literal), PCRE2_LITERAL, literal);
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

int Regex::match(std::string_view subject, size_t offset, uint32_t options, Span* m) const {
  MatchScratch& s = scratch();
  if (s.data == nullptr)
    return PCRE2_ERROR_NOMEMORY;
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc;
  if (jit_ && options == 0) {
    rc = pcre2_jit_match(code, subj, subject.size(), offset, 0, s.data, s.context);
  } else {
    rc = pcre2_match(
        code, subj, subject.size(), offset, options | PCRE2_NO_UTF_CHECK, s.data, s.context);
  }
  if (rc >= 0) {
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    m->begin = static_cast<uint32_t>(ov[0]);
    m->end = static_cast<uint32_t>(ov[1]);
  }
  return rc;
}

Status Regex::find_all(std::string_view subject, std::vector<Span>* out) const {
  if (subject.size() >= UINT32_MAX)
    return invalid_argument("text too long for the regex splitter");
  size_t search_from = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (search_from <= subject.size()) {
    Span m;
    const int rc = match(subject, search_from, 0, &m);
    if (rc == PCRE2_ERROR_NOMATCH)
      break;
    if (rc < 0) {
      return Status(
          StatusCode::kResourceExhausted,
          str_format("regex \"%s\" failed: %s", pattern_.c_str(), pcre2_error(rc).c_str()));
    }
    if (m.begin == m.end && have_last && last_match_end == m.end) {
      // Empty match where the previous one ended: step over one character and search again.
      if (search_from >= subject.size())
        break;
      size_t step = 1;
      while (search_from + step < subject.size() &&
             (static_cast<uint8_t>(subject[search_from + step]) & 0xC0) == 0x80) {
        ++step;
      }
      search_from += step;
      continue;
    }
    out->push_back(m);
    search_from = m.end;
    have_last = true;
    last_match_end = m.end;
  }
  return Status();
}

Result<bool> Regex::matches_at(std::string_view subject, size_t offset) const {
  Span m;
  const int rc = match(subject, offset, PCRE2_ANCHORED, &m);
  if (rc == PCRE2_ERROR_NOMATCH)
    return false;
  if (rc < 0) {
    return Status(StatusCode::kResourceExhausted,
                  str_format("regex \"%s\" failed: %s", pattern_.c_str(), pcre2_error(rc).c_str()));
  }
  return true;
}

}  // namespace dsinfer::tokenizer
