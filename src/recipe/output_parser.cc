#include "recipe/output_parser.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "recipe/pyjson.h"
#include "recipe/tokens.h"

// Design: a staged matcher over a byte buffer. Each stage has a list of literal patterns
// (optionally absorbing a run of '\n' right before them). The match that *ends* first wins (ties:
// list order), which is what a byte-at-a-time matcher does, so the result does not depend on how
// the input is chunked. Text before the match gets the stage's "unmatched" action (emit as
// reasoning/content/argument text, buffer, or drop). When nothing matches, everything except the
// longest suffix that could still start a pattern (and an incomplete UTF-8 tail) is released.

namespace dsinfer::recipe {

namespace {

enum class Stage {
  kReasoning,
  kContent,
  kJsonPre,   // json_output: before the JSON value (dropped)
  kJson,      // json_output: inside the top-level JSON value (content)
  kJsonPost,  // json_output: after it (dropped)
  kToolCalls,
  kToolName,
  kArgs,
  kParamName,
  kParamType,
  kStrValue,
  kRawValue,
  kFinished,
  kCount,
};

enum class Act {
  kThinkEnd,    // reasoning -> content
  kDsml,        // DSML token in text: tool block starts
  kDrop,        // drop the marker
  kThinkStart,  // `<think>` in content
  kEos,
  kStop,  // stop sequence `arg`
  kJsonOpen,
  kJsonFenceEnd,
  kInvoke,  // `invoke name="`
  kBlockEnd,
  kQuote,      // `"` closing a tool or parameter name
  kNameAbort,  // DSML token inside a tool name / parameter name / type
  kParamStart,
  kInvokeEnd,
  kTypeTrue,
  kTypeFalse,
  kValueEnd,
  kValueAbort,
};

struct Pattern {
  Pattern(std::string s_, bool nl_, Act act_, int arg_)
      : s(std::move(s_)), nl(nl_), act(act_), arg(arg_) {}
  std::string s;
  bool nl = false;  // also absorbs a run of '\n' right before it
  Act act = Act::kDrop;
  int arg = 0;
  // Byte ranges of `s` that spell a control token: in token-fed text they must be exactly one
  // control token (set by build_patterns).
  std::vector<std::pair<size_t, size_t>> controls;
};

// Byte mask over the parser's buffer: where each byte came from (OutputParser::Kind).
constexpr char kMaskAny = 'u';
constexpr char kMaskText = 't';
constexpr char kMaskControlStart = 'S';
constexpr char kMaskControlRest = 's';

// Ranges of `s` spelling one of the control tokens the parser knows.
std::vector<std::pair<size_t, size_t>> control_ranges(std::string_view s) {
  // The ASCII `|DSML|` variant is no token at all: counting it here means token-fed text never
  // matches it (it is only recognised in text of unknown kind).
  static constexpr std::string_view kControls[] = {
      tok::kDsml, tok::kDsmlAscii, tok::kThinkStart, tok::kThinkEnd, tok::kEos, tok::kBos};
  std::vector<std::pair<size_t, size_t>> out;
  for (std::string_view c : kControls) {
    for (size_t at = s.find(c); at != std::string_view::npos; at = s.find(c, at + c.size())) {
      out.emplace_back(at, at + c.size());
    }
  }
  return out;
}

bool in_call(Stage s) {
  return s == Stage::kArgs || s == Stage::kParamName || s == Stage::kParamType ||
         s == Stage::kStrValue || s == Stage::kRawValue;
}

// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence.
size_t utf8_safe_len(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80)
      continue;  // continuation byte
    size_t need = 1;
    if (c >= 0xF8) {
      need = 1;
    } else if (c >= 0xF0) {
      need = 4;
    } else if (c >= 0xE0) {
      need = 3;
    } else if (c >= 0xC0) {
      need = 2;
    }
    return need > back ? n - back : n;
  }
  return n;
}

bool is_delta(OutputEvent::Type t) {
  return t == OutputEvent::Type::kReasoningDelta || t == OutputEvent::Type::kContentDelta ||
         t == OutputEvent::Type::kToolCallArgumentsDelta;
}

void append_event(std::vector<OutputEvent>* out, OutputEvent ev) {
  if (is_delta(ev.type) && !out->empty() && out->back().type == ev.type &&
      out->back().tool_index == ev.tool_index) {
    out->back().text.append(ev.text);
    return;
  }
  out->push_back(std::move(ev));
}

}  // namespace

struct OutputParser::Impl {
  OutputParserOptions opt;
  std::vector<Pattern> pats[static_cast<size_t>(Stage::kCount)];
  Stage stage = Stage::kContent;
  bool leading = false;

  std::string buf;
  std::string mask;     // per byte of buf: kMaskAny / kMaskText / kMaskControl*
  size_t pos = 0;       // next unprocessed byte
  size_t scanned = 0;   // no pattern of the current stage ends at or before this offset
  size_t trail_nl = 0;  // number of '\n' bytes at the end of buf

  // JSON value tracking (json_output): the state after the emitted text, and a lookahead scan
  // over the unprocessed bytes that continues across feeds.
  struct JsonScan {
    int depth = 0;
    bool in_str = false;
    bool esc = false;
    // Feeds one byte; true when it closes the top-level value.
    bool step(char c) {
      if (in_str) {
        if (esc) {
          esc = false;
        } else if (c == '\\') {
          esc = true;
        } else if (c == '"') {
          in_str = false;
        }
        return false;
      }
      if (c == '"') {
        in_str = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        return --depth <= 0;
      }
      return false;
    }
  };
  JsonScan json;  // committed
  JsonScan la;    // lookahead state at la_off
  bool la_valid = false;
  size_t la_off = 0;                  // absolute offset in buf
  size_t la_hit = std::string::npos;  // absolute offset just past the closing byte

  // Tool calls.
  std::string name;
  std::string raw;  // string="false" value
  int32_t calls = 0;
  bool has_params = false;

  // Set when a marker is dropped from text: the next text delta starts a new event, so no single
  // delta can spell a marker out of the text around a dropped one ("<thi" + "</think>" + "nk>").
  bool seal = false;

  bool natural_end = false;
  bool stop_matched = false;
  bool finish_sent = false;
  std::string stop_str;

  std::vector<OutputEvent>* out = nullptr;

  explicit Impl(OutputParserOptions o) : opt(std::move(o)) {
    build_patterns();
    switch (opt.start) {
      case ParseStart::kReasoningStart:
        stage = Stage::kReasoning;
        leading = true;
        break;
      case ParseStart::kReasoning:
        stage = Stage::kReasoning;
        break;
      case ParseStart::kContentStart:
        stage = content_stage();
        leading = true;
        break;
      case ParseStart::kContent:
        stage = content_stage();
        break;
      case ParseStart::kToolCalls:
        stage = Stage::kToolCalls;
        break;
    }
  }

  Stage content_stage() const { return opt.json_output ? Stage::kJsonPre : Stage::kContent; }

  std::vector<Pattern>& P(Stage s) { return pats[static_cast<size_t>(s)]; }

  void build_patterns() {
    std::vector<std::string> tokens = {std::string(tok::kDsml)};
    if (opt.accept_ascii_dsml)
      tokens.emplace_back(tok::kDsmlAscii);
    const std::string eos(tok::kEos), bos(tok::kBos);
    const std::string think_start(tok::kThinkStart), think_end(tok::kThinkEnd);

    // Every DSML token occurrence in text (`</TOKEN`, `<TOKEN`, bare TOKEN; longest first).
    auto add_dsml_in_text = [&](std::vector<Pattern>* v) {
      for (const auto& t : tokens) {
        v->push_back({"</" + t, true, Act::kDsml, 0});
        v->push_back({"<" + t, true, Act::kDsml, 0});
        v->push_back({t, true, Act::kDsml, 0});
      }
    };
    auto add_stops = [&](std::vector<Pattern>* v) {
      for (size_t i = 0; i < opt.stop_sequences.size(); ++i) {
        if (!opt.stop_sequences[i].empty()) {
          v->push_back({opt.stop_sequences[i], false, Act::kStop, static_cast<int>(i)});
        }
      }
    };
    auto add_block_ends = [&](std::vector<Pattern>* v) {
      for (const auto& t : tokens) {
        for (const char* b : {"tool_calls>", " calls>", "function_calls>"}) {
          v->push_back({"</" + t + b, false, Act::kBlockEnd, 0});
        }
      }
    };
    auto add_name_abort = [&](std::vector<Pattern>* v) {
      for (const auto& t : tokens) v->push_back({t, false, Act::kNameAbort, 0});
    };
    auto add_eos = [&](std::vector<Pattern>* v) { v->push_back({eos, false, Act::kEos, 0}); };

    {
      auto& v = P(Stage::kReasoning);
      v.push_back({think_end, true, Act::kThinkEnd, 0});
      add_dsml_in_text(&v);
      // A literal `<think>` inside reasoning is reasoning text (deepseek-recipe keeps it).
      add_eos(&v);
      v.push_back({bos, false, Act::kDrop, 0});
    }
    {
      auto& v = P(Stage::kContent);
      add_stops(&v);
      add_dsml_in_text(&v);
      v.push_back({think_end, false, Act::kDrop, 0});
      v.push_back({think_start, false, Act::kThinkStart, 0});
      add_eos(&v);
      v.push_back({bos, false, Act::kDrop, 0});
    }
    {
      auto& v = P(Stage::kJsonPre);
      add_dsml_in_text(&v);
      v.push_back({think_end, false, Act::kDrop, 0});
      v.push_back({think_start, false, Act::kDrop, 0});
      add_eos(&v);
      v.push_back({bos, false, Act::kDrop, 0});
      v.push_back({"{", false, Act::kJsonOpen, 0});
      v.push_back({"[", false, Act::kJsonOpen, 0});
    }
    {
      auto& v = P(Stage::kJson);
      add_stops(&v);
      add_dsml_in_text(&v);
      v.push_back({think_end, false, Act::kDrop, 0});
      v.push_back({think_start, false, Act::kDrop, 0});
      add_eos(&v);
      v.push_back({bos, false, Act::kDrop, 0});
      v.push_back({"\n```", false, Act::kJsonFenceEnd, 0});
    }
    {
      auto& v = P(Stage::kJsonPost);
      add_dsml_in_text(&v);
      add_eos(&v);
    }
    {
      auto& v = P(Stage::kToolCalls);
      v.push_back({"invoke name=\"", false, Act::kInvoke, 0});
      add_block_ends(&v);
      add_eos(&v);
    }
    {
      auto& v = P(Stage::kToolName);
      v.push_back({"\"", false, Act::kQuote, 0});
      add_name_abort(&v);
      add_eos(&v);
    }
    {
      auto& v = P(Stage::kArgs);
      v.push_back({"parameter name=\"", false, Act::kParamStart, 0});
      v.push_back({"invoke name=\"", false, Act::kInvoke, 0});
      for (const auto& t : tokens) {
        v.push_back({"</" + t + "invoke>", false, Act::kInvokeEnd, 0});
        v.push_back({"</" + t + " invoke>", false, Act::kInvokeEnd, 0});
      }
      add_block_ends(&v);
      add_eos(&v);
    }
    {
      auto& v = P(Stage::kParamName);
      v.push_back({"\"", false, Act::kQuote, 0});
      add_name_abort(&v);
      add_eos(&v);
    }
    {
      auto& v = P(Stage::kParamType);
      v.push_back({"true\">", false, Act::kTypeTrue, 0});
      v.push_back({"false\">", false, Act::kTypeFalse, 0});
      add_name_abort(&v);
      add_eos(&v);
    }
    for (Stage s : {Stage::kStrValue, Stage::kRawValue}) {
      auto& v = P(s);
      for (const auto& t : tokens) {
        v.push_back({"</" + t, false, Act::kValueEnd, 0});
        v.push_back({"<" + t, false, Act::kValueAbort, 0});
      }
      add_eos(&v);
    }
    for (auto& v : pats) {
      for (Pattern& p : v) {
        if (p.act != Act::kStop)
          p.controls = control_ranges(p.s);
      }
    }
  }

  // Whether pattern `p` found at buf offset `f` is a marker: each control-token spelling in it
  // must be one control token in the buffer (or text of unknown kind, except an EOS with
  // eos_spelling_is_text).
  bool controls_ok(const Pattern& p, size_t f) const {
    const bool any_ok = !(p.act == Act::kEos && opt.eos_spelling_is_text);
    for (const auto& [a, b] : p.controls) {
      const char first = mask[f + a];
      if (first != kMaskControlStart && (first != kMaskAny || !any_ok))
        return false;
      for (size_t i = f + a + 1; i < f + b; ++i) {
        if (mask[i] != kMaskAny && mask[i] != kMaskControlRest)
          return false;
      }
      if (first == kMaskControlStart && f + b < mask.size() && mask[f + b] == kMaskControlRest)
        return false;
    }
    return true;
  }

  // ---- event output ----

  void emit(OutputEvent::Type t, std::string_view text, int32_t index = -1) {
    if (text.empty())
      return;
    OutputEvent ev;
    ev.type = t;
    ev.text = std::string(text);
    ev.tool_index = index;
    if (seal) {
      seal = false;
      out->push_back(std::move(ev));
      return;
    }
    append_event(out, std::move(ev));
  }

  void emit_args(std::string_view text) {
    if (!opt.parse_tool_calls)
      return;
    emit(OutputEvent::Type::kToolCallArgumentsDelta, text, calls - 1);
  }

  void emit_args_escaped(std::string_view text) {
    if (!opt.parse_tool_calls || text.empty())
      return;
    std::string e;
    py_json_escape_append(text, &e);
    emit_args(e);
  }

  void start_call() {
    if (opt.parse_tool_calls) {
      OutputEvent ev;
      ev.type = OutputEvent::Type::kToolCallStart;
      ev.tool_index = calls;
      ev.tool_name = name;
      out->push_back(std::move(ev));
      ++calls;
    }
    name.clear();
    has_params = false;
  }

  void end_call_event() {
    if (!opt.parse_tool_calls)
      return;
    OutputEvent ev;
    ev.type = OutputEvent::Type::kToolCallEnd;
    ev.tool_index = calls - 1;
    out->push_back(std::move(ev));
  }

  std::string raw_value_json() const {
    if (raw.find_first_not_of(" \t\r\n") == std::string::npos)
      return "null";
    // nlohmann's lexer stops at a NUL byte, so text with one is never taken as JSON.
    if (raw.find('\0') == std::string::npos && nlohmann::ordered_json::accept(raw))
      return raw;
    return py_json_quote(raw);
  }

  // Closes whatever is open in the current parameter (the parameter stays in the object).
  void close_param() {
    switch (stage) {
      case Stage::kParamName:
        emit_args("\": null");
        break;
      case Stage::kParamType:
        emit_args("null");
        break;
      case Stage::kStrValue:
        emit_args("\"");
        break;
      case Stage::kRawValue:
        emit_args(raw_value_json());
        raw.clear();
        break;
      default:
        break;
    }
  }

  // Completes the call in progress (if any): closes the open parameter and the object and emits
  // ToolCallEnd. A call whose name has not closed yet is dropped.
  void complete_call() {
    if (!in_call(stage)) {
      name.clear();
      return;
    }
    close_param();
    const bool any = has_params || stage != Stage::kArgs;
    emit_args(any ? "}" : "{}");
    end_call_event();
    has_params = false;
  }

  // ---- matching ----

  struct Match {
    bool found = false;
    size_t start = 0;  // relative to pos
    size_t end = 0;
    const Pattern* p = nullptr;  // null: JSON value complete
  };

  Match find_match(std::string_view rest) {
    Match best;
    for (const Pattern& p : P(stage)) {
      const size_t len = p.s.size();
      size_t from = pos;
      if (scanned >= pos + len)
        from = scanned - len + 1;
      size_t f = buf.find(p.s, from);
      while (f != std::string::npos && !p.controls.empty() && !controls_ok(p, f)) {
        f = buf.find(p.s, f + 1);
      }
      if (f == std::string::npos)
        continue;
      const size_t end = f + len - pos;
      if (!best.found || end < best.end) {
        best.found = true;
        best.end = end;
        best.start = f - pos;
        best.p = &p;
      }
    }
    if (stage == Stage::kJson) {
      if (!la_valid) {
        la = json;
        la_off = pos;
        la_hit = std::string::npos;
        la_valid = true;
      }
      while (la_hit == std::string::npos && la_off < buf.size()) {
        if (la.step(buf[la_off++]))
          la_hit = la_off;
      }
      if (la_hit != std::string::npos) {
        // The value ends at la_hit; a pattern ending at the same byte keeps priority.
        const size_t end = la_hit - pos;
        if (!best.found || end < best.end) {
          best.found = true;
          best.start = end;
          best.end = end;
          best.p = nullptr;
        }
      }
    }
    if (best.found && best.p != nullptr && best.p->nl) {
      while (best.start > 0 && rest[best.start - 1] == '\n') --best.start;
    }
    return best;
  }

  // Longest suffix of `rest` that could still begin a pattern of the current stage.
  size_t hold_len(std::string_view rest) {
    size_t h = 0;
    for (const Pattern& p : P(stage)) {
      size_t k = std::min(p.s.size() - 1, rest.size());
      for (; k > 0; --k) {
        if (rest.substr(rest.size() - k) == std::string_view(p.s).substr(0, k))
          break;
      }
      size_t hp = k;
      if (p.nl) {
        if (k == 0) {
          hp = std::min(trail_nl, rest.size());
        } else {
          size_t j = rest.size() - k;
          while (j > 0 && rest[j - 1] == '\n') --j;
          hp = rest.size() - j;
        }
      }
      h = std::max(h, hp);
    }
    return h;
  }

  void track_json(std::string_view text) {
    for (char c : text) json.step(c);
  }

  // Text that matched no pattern.
  void unmatched(std::string_view text) {
    if (text.empty())
      return;
    switch (stage) {
      case Stage::kReasoning:
        emit(OutputEvent::Type::kReasoningDelta, text);
        leading = false;
        break;
      case Stage::kContent:
        emit(OutputEvent::Type::kContentDelta, text);
        leading = false;
        break;
      case Stage::kJson:
        track_json(text);
        emit(OutputEvent::Type::kContentDelta, text);
        break;
      case Stage::kToolName:
        name.append(text);
        break;
      case Stage::kParamName:
      case Stage::kStrValue:
        emit_args_escaped(text);
        break;
      case Stage::kRawValue:
        raw.append(text);
        break;
      default:  // markup / dropped text
        break;
    }
  }

  // max_tool_calls: the calls allowed have all been made.
  bool call_limit_reached() const {
    return opt.parse_tool_calls && opt.max_tool_calls > 0 && calls >= opt.max_tool_calls;
  }

  void set_stage(Stage s) {
    stage = s;
    if (s == Stage::kFinished)
      natural_end = true;
  }

  void apply(std::string_view rest, const Match& m) {
    unmatched(rest.substr(0, m.start));
    if (m.p == nullptr) {  // JSON value complete
      set_stage(Stage::kJsonPost);
      return;
    }
    const Pattern& p = *m.p;
    switch (p.act) {
      case Act::kThinkEnd:
        stage = content_stage();
        leading = true;
        break;
      case Act::kDsml:
        stage = Stage::kToolCalls;
        break;
      case Act::kDrop:
        seal = true;
        break;
      case Act::kThinkStart:
        if (leading) {
          stage = Stage::kReasoning;  // reasoning opened before any content
        } else {
          seal = true;
        }
        break;
      case Act::kEos:
        complete_call();
        set_stage(Stage::kFinished);
        break;
      case Act::kStop:
        stop_matched = true;
        stop_str = p.s;
        set_stage(Stage::kFinished);
        break;
      case Act::kJsonOpen:
        json = JsonScan();
        json.depth = 1;
        emit(OutputEvent::Type::kContentDelta, p.s);
        stage = Stage::kJson;
        break;
      case Act::kJsonFenceEnd:
        stage = Stage::kJsonPost;
        break;
      case Act::kInvoke:
        complete_call();
        name.clear();
        stage = Stage::kToolName;
        if (call_limit_reached())
          set_stage(Stage::kFinished);
        break;
      case Act::kBlockEnd:
        complete_call();
        set_stage(Stage::kFinished);
        break;
      case Act::kQuote:
        if (stage == Stage::kToolName) {
          start_call();
          stage = Stage::kArgs;
        } else {  // parameter name
          emit_args("\": ");
          stage = Stage::kParamType;
        }
        break;
      case Act::kNameAbort:
        if (stage == Stage::kToolName) {
          name.clear();
          stage = Stage::kToolCalls;
        } else {
          close_param();
          stage = Stage::kArgs;
        }
        break;
      case Act::kParamStart:
        emit_args(has_params ? ", \"" : "{\"");
        has_params = true;
        stage = Stage::kParamName;
        break;
      case Act::kInvokeEnd:
        complete_call();
        stage = Stage::kToolCalls;
        if (call_limit_reached())
          set_stage(Stage::kFinished);
        break;
      case Act::kTypeTrue:
        emit_args("\"");
        stage = Stage::kStrValue;
        break;
      case Act::kTypeFalse:
        raw.clear();
        stage = Stage::kRawValue;
        break;
      case Act::kValueEnd:
      case Act::kValueAbort:
        close_param();
        stage = Stage::kArgs;
        break;
    }
  }

  void run(bool at_end) {
    for (;;) {
      if (stage == Stage::kFinished) {
        pos = buf.size();
        break;
      }
      if (leading && (stage == Stage::kReasoning || stage == Stage::kContent)) {
        while (pos < buf.size() && buf[pos] == '\n') ++pos;
      }
      if (pos >= buf.size())
        break;
      std::string_view rest(buf);
      rest.remove_prefix(pos);
      const Match m = find_match(rest);
      if (m.found) {
        apply(rest, m);
        pos += m.end;
        scanned = pos;
        la_valid = false;
        continue;
      }
      scanned = buf.size();
      size_t n = rest.size();
      if (!at_end) {
        n -= hold_len(rest);
        n = utf8_safe_len(rest.substr(0, n));
      }
      unmatched(rest.substr(0, n));
      pos += n;
      break;
    }
    if (pos == buf.size()) {
      buf.clear();
      mask.clear();
      pos = 0;
      scanned = 0;
      trail_nl = 0;
      la_valid = false;
    } else if (pos > 4096 && pos > buf.size() / 2) {
      buf.erase(0, pos);
      mask.erase(0, pos);
      scanned = scanned > pos ? scanned - pos : 0;
      if (la_valid) {
        la_off -= pos;
        if (la_hit != std::string::npos)
          la_hit -= pos;
      }
      pos = 0;
    }
  }
};

OutputParser::OutputParser(OutputParserOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

OutputParser::~OutputParser() = default;

std::vector<OutputEvent> OutputParser::feed(std::string_view text, Kind kind) {
  std::vector<OutputEvent> events;
  Impl& s = *impl_;
  if (s.finish_sent || text.empty())
    return events;
  if (s.stage == Stage::kFinished)
    return events;
  s.out = &events;
  s.buf.append(text);
  switch (kind) {
    case Kind::kAny:
      s.mask.append(text.size(), kMaskAny);
      break;
    case Kind::kText:
      s.mask.append(text.size(), kMaskText);
      break;
    case Kind::kControl:
      s.mask.push_back(kMaskControlStart);
      s.mask.append(text.size() - 1, kMaskControlRest);
      break;
  }
  const size_t last = text.find_last_not_of('\n');
  s.trail_nl = last == std::string_view::npos ? s.trail_nl + text.size() : text.size() - last - 1;
  s.run(/*at_end=*/false);
  s.out = nullptr;
  return events;
}

std::vector<OutputEvent> OutputParser::finish(FinishReason backend_reason) {
  std::vector<OutputEvent> events;
  Impl& s = *impl_;
  if (s.finish_sent)
    return events;
  s.out = &events;
  s.run(/*at_end=*/true);
  if (in_call(s.stage) || s.stage == Stage::kToolName)
    s.complete_call();
  s.out = nullptr;

  OutputEvent fin;
  fin.type = OutputEvent::Type::kFinish;
  const bool cut = backend_reason == FinishReason::kLength ||
                   backend_reason == FinishReason::kAborted ||
                   backend_reason == FinishReason::kError;
  if (s.stop_matched) {
    fin.finish = FinishReason::kStopSequence;
    fin.stop_sequence = s.stop_str;
  } else if (cut && !s.natural_end) {
    fin.finish = backend_reason;
  } else if (s.calls > 0) {
    fin.finish = FinishReason::kToolCalls;
  } else {
    fin.finish = FinishReason::kStop;
  }
  events.push_back(std::move(fin));
  s.finish_sent = true;
  s.stage = Stage::kFinished;
  return events;
}

bool OutputParser::done() const {
  return impl_->stage == Stage::kFinished;
}

bool OutputParser::in_reasoning() const {
  return impl_->stage == Stage::kReasoning;
}

int32_t OutputParser::tool_calls_started() const {
  return impl_->calls;
}

std::vector<OutputEvent> coalesce_events(const std::vector<OutputEvent>& events) {
  std::vector<OutputEvent> out;
  for (const auto& e : events) {
    if (is_delta(e.type) && e.text.empty())
      continue;
    append_event(&out, e);
  }
  return out;
}

ParsedMessage aggregate_events(const std::vector<OutputEvent>& events) {
  ParsedMessage m;
  for (const auto& e : events) {
    switch (e.type) {
      case OutputEvent::Type::kReasoningDelta:
        m.reasoning.append(e.text);
        break;
      case OutputEvent::Type::kContentDelta:
        m.content.append(e.text);
        break;
      case OutputEvent::Type::kToolCallStart:
        if (e.tool_index >= 0 && static_cast<size_t>(e.tool_index) >= m.tool_calls.size()) {
          m.tool_calls.resize(static_cast<size_t>(e.tool_index) + 1);
        }
        if (e.tool_index >= 0)
          m.tool_calls[static_cast<size_t>(e.tool_index)].name = e.tool_name;
        break;
      case OutputEvent::Type::kToolCallArgumentsDelta:
        if (e.tool_index >= 0 && static_cast<size_t>(e.tool_index) < m.tool_calls.size()) {
          m.tool_calls[static_cast<size_t>(e.tool_index)].arguments.append(e.text);
        }
        break;
      case OutputEvent::Type::kToolCallEnd:
        break;
      case OutputEvent::Type::kFinish:
        m.finish = e.finish;
        m.stop_sequence = e.stop_sequence;
        break;
    }
  }
  return m;
}

ParsedMessage parse_completion(std::string_view text,
                               const OutputParserOptions& options,
                               FinishReason backend_reason) {
  OutputParser parser(options);
  std::vector<OutputEvent> events = parser.feed(text);
  std::vector<OutputEvent> tail = parser.finish(backend_reason);
  events.insert(events.end(), tail.begin(), tail.end());
  return aggregate_events(events);
}

}  // namespace dsinfer::recipe
