// libFuzzer: the recipe OutputParser on arbitrary model output under random chunking.
//
// Input: 4 header bytes (start stage, flags, stop-sequence set + the one-tool-call limit of
// parallel_tool_calls false, chunking seed), then the text;
// byte 0xFF (never in UTF-8) followed by an index byte expands to a marker from kMarkers, so the
// fuzzer reaches deep DSML states quickly.
//
// Checks: (a) no crash (ASan/UBSan); (b) the coalesced events are the same whole, chunked at
// random, and one byte per chunk; (c) no content/reasoning delta contains `｜DSML｜`, `<think>`,
// `</think>` or EOS; plus: exactly one trailing kFinish, tool-call events well nested, and (for
// UTF-8 input) every delta is valid UTF-8 and every call's arguments are a JSON object.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "recipe/output_parser.h"
#include "tokenizer/utf8.h"

namespace {

using dsinfer::recipe::FinishReason;
using dsinfer::recipe::OutputEvent;
using dsinfer::recipe::OutputParser;
using dsinfer::recipe::OutputParserOptions;
using dsinfer::recipe::ParseStart;

const char* const kMarkers[] = {
    "<｜DSML｜",
    "</｜DSML｜",
    "｜DSML｜",
    "<｜DSML｜tool_calls>\n",
    "</｜DSML｜tool_calls>",
    "<｜DSML｜ calls>\n",
    "</｜DSML｜ calls>",
    "<｜DSML｜invoke name=\"f\">\n",
    "<｜DSML｜ invoke name=\"",
    "</｜DSML｜invoke>\n",
    "</｜DSML｜ invoke>",
    "<｜DSML｜parameter name=\"",
    "<｜DSML｜ parameter name=\"k\" string=\"true\">",
    "\" string=\"true\">",
    "\" string=\"false\">",
    "</｜DSML｜parameter>\n",
    "</｜DSML｜ parameter>",
    "<think>",
    "</think>",
    "<｜end▁of▁sentence｜>",
    "<｜begin▁of▁sentence｜>",
    "\n\n",
    "|DSML|",
    "<|DSML|tool_calls>",
    "{\"a\": [1, {\"b\": \"}\"}]}",
    "```json\n",
    "\n```",
    "STOP",
    "日本",
    "<",
    "｜",
    "\xE6\x97",  // truncated UTF-8
};
constexpr size_t kNumMarkers = sizeof(kMarkers) / sizeof(kMarkers[0]);

// Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF), as JSON parsers
// require: the tokenizer's validator.
bool valid_utf8(std::string_view s) {
  return dsinfer::tokenizer::utf8::is_valid(s);
}

bool is_delta(OutputEvent::Type t) {
  return t == OutputEvent::Type::kReasoningDelta || t == OutputEvent::Type::kContentDelta ||
         t == OutputEvent::Type::kToolCallArgumentsDelta;
}

std::vector<OutputEvent> run(const OutputParserOptions& o,
                             const std::string& text,
                             const std::vector<size_t>& cuts,
                             FinishReason reason) {
  OutputParser p(o);
  std::vector<OutputEvent> all;
  size_t at = 0;
  for (size_t c : cuts) {
    auto ev = p.feed(std::string_view(text).substr(at, c - at));
    all.insert(all.end(), ev.begin(), ev.end());
    at = c;
  }
  auto ev = p.feed(std::string_view(text).substr(at));
  all.insert(all.end(), ev.begin(), ev.end());
  ev = p.finish(reason);
  all.insert(all.end(), ev.begin(), ev.end());
  return all;
}

// Token-fed text: pieces of ordinary-token text (Kind::kText) and control tokens (kControl);
// with split, every text piece is also cut into single bytes.
std::vector<OutputEvent> run_pieces(const OutputParserOptions& o,
                                    const std::vector<std::pair<std::string, bool>>& pieces,
                                    bool split,
                                    FinishReason reason) {
  using Kind = OutputParser::Kind;
  OutputParser p(o);
  std::vector<OutputEvent> all;
  auto add = [&](std::vector<OutputEvent> ev) { all.insert(all.end(), ev.begin(), ev.end()); };
  for (const auto& [text, control] : pieces) {
    if (control) {
      add(p.feed(text, Kind::kControl));
    } else if (split) {
      for (size_t i = 0; i < text.size(); ++i) add(p.feed(text.substr(i, 1), Kind::kText));
    } else {
      add(p.feed(text, Kind::kText));
    }
  }
  add(p.finish(reason));
  return all;
}

// `text_spellings`: deltas may spell markers (token-fed text keeps plain-text spellings).
void check(const std::vector<OutputEvent>& evs, bool utf8, bool text_spellings = false) {
  if (evs.empty() || evs.back().type != OutputEvent::Type::kFinish)
    __builtin_trap();
  int32_t open = -1, next = 0;
  for (size_t i = 0; i < evs.size(); ++i) {
    const OutputEvent& e = evs[i];
    if (e.type == OutputEvent::Type::kFinish && i + 1 != evs.size())
      __builtin_trap();
    if (is_delta(e.type) && e.text.empty())
      __builtin_trap();
    if (e.type == OutputEvent::Type::kContentDelta ||
        e.type == OutputEvent::Type::kReasoningDelta) {
      for (const char* bad : {"｜DSML｜", "<think>", "</think>", "<｜end▁of▁sentence｜>"}) {
        // A literal <think> is reasoning text (deepseek-recipe).
        if (text_spellings ||
            (e.type == OutputEvent::Type::kReasoningDelta && std::string_view(bad) == "<think>"))
          continue;
        if (e.text.find(bad) != std::string::npos)
          __builtin_trap();
      }
      if (open >= 0)
        __builtin_trap();  // text inside a tool call
    }
    if (utf8 && is_delta(e.type) && !valid_utf8(e.text))
      __builtin_trap();
    switch (e.type) {
      case OutputEvent::Type::kToolCallStart:
        if (open >= 0 || e.tool_index != next)
          __builtin_trap();
        open = next++;
        break;
      case OutputEvent::Type::kToolCallArgumentsDelta:
        if (open < 0 || e.tool_index != open)
          __builtin_trap();
        break;
      case OutputEvent::Type::kToolCallEnd:
        if (open < 0 || e.tool_index != open)
          __builtin_trap();
        open = -1;
        break;
      default:
        break;
    }
  }
  if (open >= 0)
    __builtin_trap();
  if (utf8) {
    const auto m = dsinfer::recipe::aggregate_events(evs);
    for (const auto& c : m.tool_calls) {
      const auto j = nlohmann::json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object())
        __builtin_trap();
    }
  }
}

bool same(const std::vector<OutputEvent>& a, const std::vector<OutputEvent>& b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].type != b[i].type || a[i].text != b[i].text || a[i].tool_index != b[i].tool_index ||
        a[i].tool_name != b[i].tool_name || a[i].finish != b[i].finish ||
        a[i].stop_sequence != b[i].stop_sequence) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4)
    return 0;
  OutputParserOptions o;
  o.start = static_cast<ParseStart>(data[0] % 5);
  o.parse_tool_calls = (data[0] & 0x08) == 0;
  o.json_output = (data[0] & 0x10) != 0;
  o.accept_ascii_dsml = (data[0] & 0x20) == 0;
  const FinishReason reason = static_cast<FinishReason>((data[0] >> 6) % 3);  // stop/length/tc
  switch (data[1] % 4) {
    case 1:
      o.stop_sequences = {"STOP"};
      break;
    case 2:
      o.stop_sequences = {"\n\n", "}", ""};
      break;
    case 3:
      o.stop_sequences = {"<", "日本", "</think"};
      break;
    default:
      break;
  }
  o.max_tool_calls = (data[1] & 0x04) != 0 ? 1 : 0;
  uint32_t seed = (static_cast<uint32_t>(data[2]) << 8) | data[3] | 1u;

  std::string text;
  for (size_t i = 4; i < size; ++i) {
    if (data[i] == 0xFF && i + 1 < size) {
      text += kMarkers[data[++i] % kNumMarkers];
    } else {
      text.push_back(static_cast<char>(data[i]));
    }
  }
  const bool utf8 = valid_utf8(text);

  const auto whole = run(o, text, {}, reason);
  check(whole, utf8);
  const auto want = dsinfer::recipe::coalesce_events(whole);

  std::vector<size_t> cuts;
  for (size_t at = 0;;) {
    seed = seed * 1103515245u + 12345u;
    at += 1 + (seed >> 16) % 16;
    if (at >= text.size())
      break;
    cuts.push_back(at);
  }
  const auto chunked = run(o, text, cuts, reason);
  check(chunked, utf8);
  if (!same(dsinfer::recipe::coalesce_events(chunked), want))
    __builtin_trap();

  // Token-fed: the 0xFF markers as control tokens, everything else as ordinary-token text. The
  // events must not depend on how the text pieces are cut.
  std::vector<std::pair<std::string, bool>> pieces;
  for (size_t i = 4; i < size; ++i) {
    if (data[i] == 0xFF && i + 1 < size) {
      pieces.emplace_back(kMarkers[data[++i] % kNumMarkers], true);
    } else if (pieces.empty() || pieces.back().second) {
      pieces.emplace_back(std::string(1, static_cast<char>(data[i])), false);
    } else {
      pieces.back().first.push_back(static_cast<char>(data[i]));
    }
  }
  const auto tok_whole = run_pieces(o, pieces, false, reason);
  check(tok_whole, utf8, /*text_spellings=*/true);
  if (text.size() <= 512) {
    const auto tok_bytes = run_pieces(o, pieces, true, reason);
    check(tok_bytes, utf8, /*text_spellings=*/true);
    if (!same(dsinfer::recipe::coalesce_events(tok_bytes),
              dsinfer::recipe::coalesce_events(tok_whole)))
      __builtin_trap();
  }

  if (text.size() <= 512) {
    std::vector<size_t> bytes;
    for (size_t i = 1; i < text.size(); ++i) bytes.push_back(i);
    const auto one = run(o, text, bytes, reason);
    check(one, utf8);
    if (!same(dsinfer::recipe::coalesce_events(one), want))
      __builtin_trap();
  }
  return 0;
}
