#include "recipe/output_parser.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "recipe/encoder.h"
#include "recipe/pyjson.h"
#include "tokenizer/utf8.h"

namespace dsinfer::recipe {
namespace {

using T = OutputEvent::Type;

const std::string EOS = "<｜end▁of▁sentence｜>";
const std::string BOS = "<｜begin▁of▁sentence｜>";

OutputParserOptions opts(ParseStart start = ParseStart::kReasoningStart) {
  OutputParserOptions o;
  o.start = start;
  return o;
}

std::vector<OutputEvent> run_chunks(const OutputParserOptions& o,
                                    const std::vector<std::string>& chunks,
                                    FinishReason reason) {
  OutputParser p(o);
  std::vector<OutputEvent> all;
  for (const auto& c : chunks) {
    auto ev = p.feed(c);
    all.insert(all.end(), ev.begin(), ev.end());
  }
  auto ev = p.finish(reason);
  all.insert(all.end(), ev.begin(), ev.end());
  return all;
}

// Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF), as JSON parsers
// require: the tokenizer's validator.
bool valid_utf8(std::string_view s) {
  return dsinfer::tokenizer::utf8::is_valid(s);
}

std::string describe(const std::vector<OutputEvent>& evs) {
  std::string s;
  for (const auto& e : evs) {
    switch (e.type) {
      case T::kReasoningDelta:
        s += "R[" + e.text + "]";
        break;
      case T::kContentDelta:
        s += "C[" + e.text + "]";
        break;
      case T::kToolCallStart:
        s.append("S").append(std::to_string(e.tool_index)).append("[").append(e.tool_name);
        s.append("]");
        break;
      case T::kToolCallArgumentsDelta:
        s.append("A").append(std::to_string(e.tool_index)).append("[").append(e.text);
        s.append("]");
        break;
      case T::kToolCallEnd:
        s.append("E").append(std::to_string(e.tool_index));
        break;
      case T::kFinish:
        s += std::string("F[") + finish_reason_name(e.finish) + "|" + e.stop_sequence + "]";
        break;
    }
  }
  return s;
}

void check_invariants(const std::vector<OutputEvent>& evs, bool input_utf8) {
  for (const auto& e : evs) {
    if (e.type == T::kContentDelta || e.type == T::kReasoningDelta) {
      for (const char* bad : {"｜DSML｜", "<think>", "</think>", "<｜end▁of▁sentence｜>"}) {
        // A literal <think> is reasoning text (deepseek-recipe).
        if (e.type == T::kReasoningDelta && std::string_view(bad) == "<think>")
          continue;
        EXPECT_EQ(e.text.find(bad), std::string::npos) << "leaked " << bad << " in " << e.text;
      }
    }
    if (input_utf8 && (e.type == T::kContentDelta || e.type == T::kReasoningDelta ||
                       e.type == T::kToolCallArgumentsDelta)) {
      EXPECT_TRUE(valid_utf8(e.text)) << "delta splits a UTF-8 character: " << e.text;
    }
  }
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back().type, T::kFinish);
}

// Parses `text` whole, split in two at every byte, and one byte per chunk; all must give the same
// coalesced events. Returns them.
std::vector<OutputEvent> parse_all_ways(const OutputParserOptions& o,
                                        const std::string& text,
                                        FinishReason reason = FinishReason::kStop) {
  const bool utf8 = valid_utf8(text);
  const auto whole_raw = run_chunks(o, {text}, reason);
  check_invariants(whole_raw, utf8);
  const auto whole = coalesce_events(whole_raw);
  const std::string want = describe(whole);
  for (size_t i = 1; i < text.size(); ++i) {
    const auto raw = run_chunks(o, {text.substr(0, i), text.substr(i)}, reason);
    check_invariants(raw, utf8);
    const std::string got = describe(coalesce_events(raw));
    if (got != want) {
      ADD_FAILURE() << "split at " << i << "\n got: " << got << "\nwant: " << want;
      break;
    }
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  const auto raw = run_chunks(o, bytes, reason);
  check_invariants(raw, utf8);
  EXPECT_EQ(describe(coalesce_events(raw)), want) << "byte by byte";
  return whole;
}

ParsedMessage parse_all(const OutputParserOptions& o,
                        const std::string& text,
                        FinishReason reason = FinishReason::kStop) {
  return aggregate_events(parse_all_ways(o, text, reason));
}

std::string dsml_v4(const std::string& body) {
  return "<｜DSML｜tool_calls>\n" + body + "</｜DSML｜tool_calls>";
}

// ---- basics ----

// Token-fed text: a marker spelled by ordinary tokens (Kind::kText) is text; the control token
// (Kind::kControl) is the marker; kAny text keeps recognising spellings.
TEST(RecipeOutputParser, TextKindDecidesWhatIsAMarker) {
  using Kind = OutputParser::Kind;
  OutputParserOptions o;
  o.start = ParseStart::kReasoningStart;
  o.parse_tool_calls = true;
  OutputParser p(o);
  std::vector<OutputEvent> ev;
  auto add = [&](std::vector<OutputEvent> e) { ev.insert(ev.end(), e.begin(), e.end()); };
  add(p.feed("a</thi", Kind::kText));
  add(p.feed("nk>b<｜end▁of▁sentence｜>", Kind::kText));
  add(p.feed("</think>", Kind::kControl));
  add(p.feed("c <", Kind::kText));
  add(p.feed("｜DSML｜tool_calls> d", Kind::kText));
  add(p.finish(FinishReason::kStop));
  ParsedMessage m = aggregate_events(ev);
  EXPECT_EQ(m.reasoning, "a</think>b<｜end▁of▁sentence｜>");
  EXPECT_EQ(m.content, "c <｜DSML｜tool_calls> d");
  EXPECT_TRUE(m.tool_calls.empty());

  // The DSML control token opens the block; text around it forms the tags.
  OutputParser q(o);
  ev.clear();
  add(q.feed("r", Kind::kText));
  add(q.feed("</think>", Kind::kControl));
  add(q.feed("\n\n<", Kind::kText));
  add(q.feed("｜DSML｜", Kind::kControl));
  add(q.feed("tool_calls>\n<", Kind::kText));
  add(q.feed("｜DSML｜", Kind::kControl));
  add(q.feed("invoke name=\"f\">\n</", Kind::kText));
  add(q.feed("｜DSML｜", Kind::kControl));
  add(q.feed("invoke>\n</", Kind::kText));
  add(q.feed("｜DSML｜", Kind::kControl));
  add(q.feed("tool_calls>", Kind::kText));
  add(q.finish(FinishReason::kStop));
  m = aggregate_events(ev);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
  EXPECT_EQ(m.finish, FinishReason::kToolCalls);
}

TEST(RecipeOutputParser, ReadmeExample) {
  const auto m = parse_all(opts(), "Simple arithmetic.</think>2 + 2 = 4." + EOS);
  EXPECT_EQ(m.reasoning, "Simple arithmetic.");
  EXPECT_EQ(m.content, "2 + 2 = 4.");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.finish, FinishReason::kStop);
}

TEST(RecipeOutputParser, LeadingNewlinesAndStages) {
  auto m = parse_all(opts(ParseStart::kReasoningStart), "\n\nthink\n</think>\n\nanswer\n");
  EXPECT_EQ(m.reasoning, "think");
  EXPECT_EQ(m.content, "answer\n");
  m = parse_all(opts(ParseStart::kReasoning), "\n\nmore\n\n</think>\n\nanswer");
  EXPECT_EQ(m.reasoning, "\n\nmore");
  EXPECT_EQ(m.content, "answer");
  m = parse_all(opts(ParseStart::kContentStart), "\n\nanswer\n\nmore");
  EXPECT_EQ(m.reasoning, "");
  EXPECT_EQ(m.content, "answer\n\nmore");
  m = parse_all(opts(ParseStart::kContent), "\n\nanswer");
  EXPECT_EQ(m.content, "\n\nanswer");
}

TEST(RecipeOutputParser, StrayThinkTagsInContent) {
  // Chat mode: stray </think> dropped; leading state survives it.
  auto m = parse_all(opts(ParseStart::kContentStart), "\n</think>\n\nHello</think> world");
  EXPECT_EQ(m.content, "Hello world");
  // <think> before any content opens reasoning.
  m = parse_all(opts(ParseStart::kContentStart), "<think>\nhmm</think>\nok");
  EXPECT_EQ(m.reasoning, "hmm");
  EXPECT_EQ(m.content, "ok");
  // Later in content it is dropped; in reasoning it is text (deepseek-recipe).
  m = parse_all(opts(ParseStart::kReasoningStart), "a<think>b</think>c<think>d");
  EXPECT_EQ(m.reasoning, "a<think>b");
  EXPECT_EQ(m.content, "cd");
}

TEST(RecipeOutputParser, DroppedMarkerSealsTheDelta) {
  const auto raw =
      run_chunks(opts(ParseStart::kContentStart), {"x<thi</think>nk>y"}, FinishReason::kStop);
  check_invariants(raw, true);
  ASSERT_GE(raw.size(), 3u);
  EXPECT_EQ(raw[0].text, "x<thi");
  EXPECT_EQ(raw[1].text, "nk>y");
}

TEST(RecipeOutputParser, LoneAngleBracketsAreReleased) {
  auto m = parse_all(opts(ParseStart::kContentStart), "a < b <<c> </thinker> <｜x <|D <");
  EXPECT_EQ(m.content, "a < b <<c> </thinker> <｜x <|D <");
  // A partial marker prefix at the very end is released as text (it is not a marker).
  m = parse_all(opts(ParseStart::kContentStart), "tail <｜DSM");
  EXPECT_EQ(m.content, "tail <｜DSM");
}

TEST(RecipeOutputParser, EosEndsOutput) {
  OutputParser p(opts());
  auto ev = p.feed("r</think>c" + EOS + "ignored</think><｜DSML｜tool_calls>");
  EXPECT_TRUE(p.done());
  EXPECT_TRUE(p.feed("more").empty());
  const auto m = parse_all(opts(), "r</think>c" + EOS + "ignored");
  EXPECT_EQ(m.reasoning, "r");
  EXPECT_EQ(m.content, "c");
  // EOS inside reasoning.
  const auto m2 = parse_all(opts(), "only reasoning" + EOS + "x");
  EXPECT_EQ(m2.reasoning, "only reasoning");
  EXPECT_EQ(m2.content, "");
  // BOS text is dropped.
  EXPECT_EQ(parse_all(opts(ParseStart::kContentStart), "a" + BOS + "b").content, "ab");
}

// eos_spelling_is_text: an EOS spelled in text of unknown kind is text (deepseek-recipe's text
// chunks); the control token still ends the output.
TEST(RecipeOutputParser, EosSpellingIsText) {
  OutputParserOptions o = opts();
  o.eos_spelling_is_text = true;
  std::string reasoning, content;
  for (const OutputEvent& e :
       run_chunks(o, {"r</think>c<｜end▁", "of▁sentence｜>more"}, FinishReason::kStop)) {
    if (e.type == T::kReasoningDelta)
      reasoning += e.text;
    if (e.type == T::kContentDelta)
      content += e.text;
  }
  EXPECT_EQ(reasoning, "r");
  EXPECT_EQ(content, "c" + EOS + "more");
  OutputParser p(o);
  p.feed("r</think>c");
  p.feed(EOS, OutputParser::Kind::kControl);
  EXPECT_TRUE(p.done());
}

TEST(RecipeOutputParser, InReasoning) {
  OutputParser p(opts());
  EXPECT_TRUE(p.in_reasoning());
  p.feed("abc</thi");
  EXPECT_TRUE(p.in_reasoning());
  p.feed("nk>x");
  EXPECT_FALSE(p.in_reasoning());
  OutputParser q(opts(ParseStart::kContentStart));
  EXPECT_FALSE(q.in_reasoning());
}

TEST(RecipeOutputParser, MultibyteCharactersSplitAnywhere) {
  const auto m = parse_all(opts(), "日本語の推論😀</think>答え：é｜ok");
  EXPECT_EQ(m.reasoning, "日本語の推論😀");
  EXPECT_EQ(m.content, "答え：é｜ok");
}

// ---- tool calls ----

std::string oracle_block(const std::string& block, const std::string& prefix) {
  const std::string d = "｜DSML｜";
  return "<" + d + block + ">\n" + "<" + d + prefix + "invoke name=\"submit\">\n" + "<" + d +
         prefix + "parameter name=\"shipping address\" string=\"true\">Paris\n日本</" + d + prefix +
         "parameter>\n" + "<" + d + prefix +
         "parameter name=\" string= mode \" string=\"false\">{\"enabled\":true}</" + d + prefix +
         "parameter>\n" + "<" + d + prefix + "parameter name=\"count\" string=\"false\">2</" + d +
         prefix + "parameter>\n" + "<" + d + prefix +
         "parameter name=\"\" string=\"true\">empty key</" + d + prefix + "parameter>\n" + "</" +
         d + prefix + "invoke>\n" + "</" + d + block + ">";
}

// deepseek-recipe tests/stream_tool_calls.rs, V4 and V4.1 spellings.
TEST(RecipeOutputParser, RecipeOracleShippingAddress) {
  const auto expected = nlohmann::json::parse(
      R"({"shipping address":"Paris\n日本"," string= mode ":{"enabled":true},"count":2,"":"empty key"})");
  for (auto [block, prefix] : {std::pair<std::string, std::string>{"tool_calls", ""},
                               std::pair<std::string, std::string>{" calls", " "}}) {
    const std::string out = oracle_block(block, prefix);
    for (ParseStart s : {ParseStart::kContentStart, ParseStart::kReasoningStart}) {
      const std::string text = s == ParseStart::kReasoningStart ? "r</think>" + out : out;
      const auto m = parse_all(opts(s), text);
      ASSERT_EQ(m.tool_calls.size(), 1u);
      EXPECT_EQ(m.tool_calls[0].name, "submit");
      EXPECT_EQ(m.tool_calls[0].arguments,
                "{\"shipping address\": \"Paris\\n日本\", \" string= mode \": {\"enabled\":true}, "
                "\"count\": 2, \"\": \"empty key\"}");
      EXPECT_EQ(nlohmann::json::parse(m.tool_calls[0].arguments), expected);
      EXPECT_EQ(m.finish, FinishReason::kToolCalls);
      EXPECT_EQ(m.content, "");
    }
  }
}

TEST(RecipeOutputParser, EventShape) {
  const std::string text =
      "r</think>Let me check.\n\n" +
      dsml_v4(
          "<｜DSML｜invoke name=\"f\">\n"
          "<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n"
          "</｜DSML｜invoke>\n"
          "<｜DSML｜invoke name=\"g\">\n\n</｜DSML｜invoke>\n") +
      EOS;
  const auto ev = parse_all_ways(opts(), text);
  EXPECT_EQ(describe(ev),
            "R[r]C[Let me check.]S0[f]A0[{\"a\": \"x\"}]E0S1[g]A1[{}]E1F[tool_calls|]");
}

TEST(RecipeOutputParser, GoldOutput1CompletionRoundTrip) {
  // The first assistant turn of test_output_1, as the model would generate it.
  const std::string text =
      "The user wants to know the weather in Beijing. I should use the get_weather tool."
      "</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"location\" string=\"true\">Beijing</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"unit\" string=\"true\">celsius</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>" +
      EOS;
  const auto m = parse_all(opts(), text);
  EXPECT_EQ(m.reasoning,
            "The user wants to know the weather in Beijing. I should use the get_weather tool.");
  EXPECT_EQ(m.content, "");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"location\": \"Beijing\", \"unit\": \"celsius\"}");
  EXPECT_EQ(m.finish, FinishReason::kToolCalls);
}

// render_tool_calls -> parser gives back Python-json.dumps arguments, for both dialects.
TEST(RecipeOutputParser, RenderParseRoundTrip) {
  const std::string args =
      "{\"s\": \"a \\\"q\\\"\\n\\t\\\\ 日本 \\u0001\", \"n\": 0.0015, \"o\": {\"k\": [1, true, "
      "null]}, \"e\": \"\", \"neg\": -0.0, \"big\": 12345678901234567890}";
  const std::string py = *py_json_normalize(args);
  const std::vector<ToolCall> calls = {{"1", "f", args}, {"2", "g", "{}"}};
  for (ModelVersion v : {ModelVersion::kV4, ModelVersion::kV41}) {
    const std::string text = "\n\n" + render_tool_calls(calls, v) + EOS;
    const auto m = parse_all(opts(ParseStart::kContentStart), text);
    ASSERT_EQ(m.tool_calls.size(), 2u);
    EXPECT_EQ(m.tool_calls[0].name, "f");
    EXPECT_EQ(m.tool_calls[0].arguments, py);
    EXPECT_EQ(m.tool_calls[1].arguments, "{}");
    EXPECT_EQ(m.content, "");
  }
}

TEST(RecipeOutputParser, DsmlBeforeThinkEndEndsReasoning) {
  for (std::string p : {"", " "}) {
    const std::string block = p.empty() ? "tool_calls" : " calls";
    const std::string text = "I will call it.\n\n<｜DSML｜" + block + ">\n<｜DSML｜" + p +
                             "invoke name=\"f\">\n<｜DSML｜" + p +
                             "parameter name=\"x\" string=\"false\">[1, 2]</｜DSML｜" + p +
                             "parameter>\n</｜DSML｜" + p + "invoke>\n</｜DSML｜" + block + ">";
    const auto m = parse_all(opts(), text);
    EXPECT_EQ(m.reasoning, "I will call it.");
    EXPECT_EQ(m.content, "");
    ASSERT_EQ(m.tool_calls.size(), 1u);
    EXPECT_EQ(m.tool_calls[0].arguments, "{\"x\": [1, 2]}");
  }
}

TEST(RecipeOutputParser, TextAfterToolBlockDropped) {
  OutputParser p(opts(ParseStart::kContentStart));
  p.feed(dsml_v4("<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n") + "\n\nmore text");
  EXPECT_TRUE(p.done());
  const auto m = parse_all(opts(ParseStart::kContentStart),
                           "before" + dsml_v4("<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n") +
                               "after</think>x<｜DSML｜tool_calls>");
  EXPECT_EQ(m.content, "before");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{}");
}

// max_tool_calls (parallel_tool_calls: false): the output ends when the first call ends, in V4
// and V4.1 spellings and for block-less invokes (the next invoke ends the first call); the
// finish reason is tool_calls and nothing after it is parsed, in every chunking.
TEST(RecipeOutputParser, MaxToolCallsEndsTheOutput) {
  OutputParserOptions o = opts(ParseStart::kContentStart);
  o.max_tool_calls = 1;
  const std::string two_v4 =
      "Let me check." + dsml_v4(
                            "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
                            "string=\"true\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                            "<｜DSML｜invoke name=\"g\">\n</｜DSML｜invoke>\n");
  const std::string two_v41 =
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" "
      "string=\"true\">1</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"g\">\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  const std::string blockless =
      "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1"
      "</｜DSML｜parameter>\n<｜DSML｜invoke name=\"g\">\n</｜DSML｜invoke>\n";
  for (const std::string& text : {two_v4, two_v41, blockless}) {
    const auto m = parse_all(o, text);
    ASSERT_EQ(m.tool_calls.size(), 1u) << text;
    EXPECT_EQ(m.tool_calls[0].name, "f");
    EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": \"1\"}");
    EXPECT_EQ(m.finish, FinishReason::kToolCalls);
    // One byte at a time: done() right after the first call's end, the same events.
    OutputParser p(o);
    std::vector<OutputEvent> all;
    size_t at = 0;
    for (; at < text.size() && !p.done(); ++at) {
      auto ev = p.feed(text.substr(at, 1));
      all.insert(all.end(), ev.begin(), ev.end());
    }
    EXPECT_TRUE(p.done());
    EXPECT_LT(at, text.size());
    auto ev = p.finish(FinishReason::kStop);
    all.insert(all.end(), ev.begin(), ev.end());
    const ParsedMessage b = aggregate_events(all);
    ASSERT_EQ(b.tool_calls.size(), 1u);
    EXPECT_EQ(b.tool_calls[0].arguments, m.tool_calls[0].arguments);
  }
  // Without the limit both calls are parsed.
  EXPECT_EQ(parse_all(opts(ParseStart::kContentStart), two_v4).tool_calls.size(), 2u);
  EXPECT_EQ(parse_all(opts(ParseStart::kContentStart), two_v41).tool_calls.size(), 2u);
}

TEST(RecipeOutputParser, RawValues) {
  auto args_of = [](const std::string& raw) {
    const auto m = parse_all(
        opts(ParseStart::kContentStart),
        dsml_v4("<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"v\" string=\"false\">" +
                raw + "</｜DSML｜parameter>\n</｜DSML｜invoke>\n"));
    EXPECT_EQ(m.tool_calls.size(), 1u);
    return m.tool_calls.empty() ? std::string() : m.tool_calls[0].arguments;
  };
  EXPECT_EQ(args_of("42"), "{\"v\": 42}");
  EXPECT_EQ(args_of(" {\"a\": [1, 2.50]} "), "{\"v\":  {\"a\": [1, 2.50]} }");  // verbatim
  EXPECT_EQ(args_of(""), "{\"v\": null}");
  EXPECT_EQ(args_of("  \n"), "{\"v\": null}");
  EXPECT_EQ(args_of("hello \"x\""), "{\"v\": \"hello \\\"x\\\"\"}");  // invalid JSON: quoted
  EXPECT_EQ(args_of("{\"a\": 1"), "{\"v\": \"{\\\"a\\\": 1\"}");
  // nlohmann's lexer stops at NUL; such text must not pass as JSON (fuzzer finding).
  EXPECT_EQ(args_of(std::string("1 \0x", 4)), "{\"v\": \"1 \\u0000x\"}");
}

TEST(RecipeOutputParser, NamesAndValuesAreEscaped) {
  const auto m = parse_all(
      opts(ParseStart::kContentStart),
      dsml_v4("<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\\b\tc\" string=\"true\">"
              "line1\nline2\t\"q\" \\ \x01 é</｜DSML｜parameter>\n</｜DSML｜invoke>\n"));
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments,
            "{\"a\\\\b\\tc\": \"line1\\nline2\\t\\\"q\\\" \\\\ \\u0001 é\"}");
  EXPECT_EQ(nlohmann::json::parse(m.tool_calls[0].arguments)["a\\b\tc"],
            "line1\nline2\t\"q\" \\ \x01 é");
}

TEST(RecipeOutputParser, DuplicateParametersKeptInOrder) {
  const auto m =
      parse_all(opts(ParseStart::kContentStart),
                dsml_v4("<｜DSML｜invoke name=\"f\">\n"
                        "<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n"
                        "<｜DSML｜parameter name=\"a\" string=\"false\">2</｜DSML｜parameter>\n"
                        "</｜DSML｜invoke>\n"));
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": \"1\", \"a\": 2}");
}

// ---- truncation / malformed ----

TEST(RecipeOutputParser, TruncatedInsideToolCall) {
  const std::string head = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n";
  struct Case {
    std::string tail;
    std::string args;  // "" = no call
  };
  const Case cases[] = {
      {"", "{}"},
      {"<｜DSML｜param", "{}"},
      {"<｜DSML｜parameter name=\"ke", "{\"ke\": null}"},
      {"<｜DSML｜parameter name=\"key\" str", "{\"key\": null}"},
      {"<｜DSML｜parameter name=\"key\" string=\"true\">partial va", "{\"key\": \"partial va\"}"},
      {"<｜DSML｜parameter name=\"key\" string=\"true\">v</｜DSML｜para", "{\"key\": \"v\"}"},
      {"<｜DSML｜parameter name=\"key\" string=\"false\">[1, 2", "{\"key\": \"[1, 2\"}"},
      {"<｜DSML｜parameter name=\"key\" string=\"false\">123", "{\"key\": 123}"},
      {"<｜DSML｜parameter name=\"key\" string=\"false\">", "{\"key\": null}"},
      {"<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n", "{\"a\": \"1\"}"},
  };
  for (const auto& c : cases) {
    const auto ev =
        parse_all_ways(opts(ParseStart::kContentStart), head + c.tail, FinishReason::kLength);
    const auto m = aggregate_events(ev);
    ASSERT_EQ(m.tool_calls.size(), 1u) << c.tail;
    EXPECT_EQ(m.tool_calls[0].arguments, c.args) << c.tail;
    EXPECT_TRUE(nlohmann::json::accept(m.tool_calls[0].arguments)) << c.tail;
    EXPECT_EQ(m.finish, FinishReason::kLength);
    EXPECT_EQ(ev[ev.size() - 2].type, T::kToolCallEnd);
    EXPECT_EQ(m.content, "");
  }
  // Name not closed: no call at all.
  for (const std::string tail : {"<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_wea",
                                 "<｜DSML｜tool_calls>\n<｜DSML｜inv",
                                 "<｜DSML｜tool"}) {
    const auto m = parse_all(opts(ParseStart::kContentStart), "text" + tail, FinishReason::kLength);
    EXPECT_TRUE(m.tool_calls.empty());
    EXPECT_EQ(m.content, "text");
    EXPECT_EQ(m.finish, FinishReason::kLength);
  }
  // EOS inside a call: completed, finish tool_calls.
  const auto m = parse_all(opts(ParseStart::kContentStart),
                           head + "<｜DSML｜parameter name=\"k\" string=\"true\">v" + EOS);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"k\": \"v\"}");
  EXPECT_EQ(m.finish, FinishReason::kToolCalls);
}

TEST(RecipeOutputParser, MalformedBlocksNeverLeak) {
  // Missing </invoke> before the next invoke; a value left open before the next parameter;
  // garbage between tags; the block never closes.
  const std::string text =
      "ok<｜DSML｜tool_calls>\ngarbage <b>\n<｜DSML｜invoke name=\"f\">\nnoise"
      "<｜DSML｜parameter name=\"a\" string=\"true\">open value"
      "<｜DSML｜parameter name=\"b\" string=\"false\">7</｜DSML｜parameter>\n"
      "<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"c\" "
      "string=\"maybe\">x</｜DSML｜parameter>"
      "\n</｜DSML｜invoke>\nstuff after";
  const auto m = parse_all(opts(ParseStart::kContentStart), text);
  EXPECT_EQ(m.content, "ok");
  ASSERT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": \"open value\", \"b\": 7}");
  EXPECT_EQ(m.tool_calls[1].name, "g");
  EXPECT_EQ(m.tool_calls[1].arguments, "{\"c\": null}");
  EXPECT_EQ(m.finish, FinishReason::kToolCalls);
  // A closing tag or bare DSML token in content switches to markup mode (nothing leaks).
  const auto m2 = parse_all(opts(ParseStart::kContentStart), "a</｜DSML｜invoke>b｜DSML｜c");
  EXPECT_EQ(m2.content, "a");
  EXPECT_TRUE(m2.tool_calls.empty());
  EXPECT_EQ(m2.finish, FinishReason::kStop);
  // ASCII-bar variant is recognised too.
  const auto m3 =
      parse_all(opts(ParseStart::kContentStart),
                "hi\n\n<|DSML|tool_calls>\n<|DSML|invoke name=\"f\">\n<|DSML|parameter name=\"a\" "
                "string=\"true\">1</|DSML|parameter>\n</|DSML|invoke>\n</|DSML|tool_calls>");
  EXPECT_EQ(m3.content, "hi");
  ASSERT_EQ(m3.tool_calls.size(), 1u);
  EXPECT_EQ(m3.tool_calls[0].arguments, "{\"a\": \"1\"}");
  // Tool name containing a DSML token: the invoke is dropped.
  const auto m4 =
      parse_all(opts(ParseStart::kContentStart),
                "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f>\n<｜DSML｜parameter "
                "name=\"a\" string=\"true\">1</｜DSML｜parameter>\n</｜DSML｜tool_calls>");
  EXPECT_TRUE(m4.tool_calls.empty());
}

TEST(RecipeOutputParser, ParseToolCallsOffSwallowsMarkup) {
  OutputParserOptions o = opts(ParseStart::kContentStart);
  o.parse_tool_calls = false;
  const auto m =
      parse_all(o, "answer\n\n" + dsml_v4("<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n"));
  EXPECT_EQ(m.content, "answer");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.finish, FinishReason::kStop);
}

TEST(RecipeOutputParser, StartInsideToolBlock) {
  const auto m =
      parse_all(opts(ParseStart::kToolCalls),
                "\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
}

// ---- stop sequences ----

TEST(RecipeOutputParser, StopSequencesContentOnly) {
  OutputParserOptions o = opts();
  o.stop_sequences = {"STOP", "", "\n\n##"};
  auto m = parse_all(o, "reasoning STOP here</think>answer STOP tail");
  EXPECT_EQ(m.reasoning, "reasoning STOP here");
  EXPECT_EQ(m.content, "answer ");
  EXPECT_EQ(m.finish, FinishReason::kStopSequence);
  EXPECT_EQ(m.stop_sequence, "STOP");
  m = parse_all(o, "r</think>a\n\n## b");
  EXPECT_EQ(m.content, "a");
  EXPECT_EQ(m.stop_sequence, "\n\n##");
  // Not inside tool arguments.
  m = parse_all(o,
                "r</think>" + dsml_v4("<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter "
                                      "name=\"a\" string=\"true\">STOP</｜DSML｜parameter>\n"
                                      "</｜DSML｜invoke>\n"));
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"a\": \"STOP\"}");
  EXPECT_EQ(m.finish, FinishReason::kToolCalls);
  // Overlapping stops: the one that ends first wins.
  o.stop_sequences = {"abcd", "bc"};
  m = parse_all(o, "</think>xabcd");
  EXPECT_EQ(m.content, "xa");
  EXPECT_EQ(m.stop_sequence, "bc");
  // A stop string with a multibyte character, split anywhere.
  o.stop_sequences = {"終わり"};
  m = parse_all(o, "</think>本文終わり後");
  EXPECT_EQ(m.content, "本文");
  EXPECT_EQ(m.finish, FinishReason::kStopSequence);
}

// ---- JSON mode ----

TEST(RecipeOutputParser, JsonOutput) {
  OutputParserOptions o = opts(ParseStart::kContentStart);
  o.json_output = true;
  auto m =
      parse_all(o, "Here you go:\n```json\n{\"a\": \"}\\\"{\", \"b\": [1, {\"c\": 2}]}\n```\nbye");
  EXPECT_EQ(m.content, "{\"a\": \"}\\\"{\", \"b\": [1, {\"c\": 2}]}");
  m = parse_all(o, "[1, 2] trailing {\"x\": 1}");
  EXPECT_EQ(m.content, "[1, 2]");
  m = parse_all(o, "r</think>{\"unterminated\": ");
  EXPECT_EQ(m.content, "{\"unterminated\": ");
  // Tool calls may still follow the JSON.
  m = parse_all(o, "{\"a\": 1}\n\n" + dsml_v4("<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n"));
  EXPECT_EQ(m.content, "{\"a\": 1}");
  EXPECT_EQ(m.tool_calls.size(), 1u);
  // Reasoning first.
  o.start = ParseStart::kReasoningStart;
  m = parse_all(o, "think {x}</think>\n{\"k\": true}");
  EXPECT_EQ(m.reasoning, "think {x}");
  EXPECT_EQ(m.content, "{\"k\": true}");
}

// ---- finish reasons ----

TEST(RecipeOutputParser, FinishReasons) {
  const std::string call_block = dsml_v4("<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n");
  struct Case {
    std::string text;
    FinishReason backend;
    FinishReason want;
  };
  const Case cases[] = {
      {"r</think>done", FinishReason::kStop, FinishReason::kStop},
      {"r</think>cut", FinishReason::kLength, FinishReason::kLength},
      {"r</think>done" + EOS, FinishReason::kLength, FinishReason::kStop},
      {"r</think>" + call_block, FinishReason::kStop, FinishReason::kToolCalls},
      {"r</think>" + call_block, FinishReason::kLength, FinishReason::kToolCalls},
      {"r</think>" + call_block.substr(0, call_block.size() - 5),
       FinishReason::kLength,
       FinishReason::kLength},
      {"r</think>x", FinishReason::kAborted, FinishReason::kAborted},
      {"r</think>x", FinishReason::kError, FinishReason::kError},
      {"r</think>x" + EOS, FinishReason::kAborted, FinishReason::kStop},
      {"still thinking", FinishReason::kLength, FinishReason::kLength},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(parse_all(opts(), c.text, c.backend).finish, c.want) << c.text;
  }
  EXPECT_STREQ(finish_reason_name(FinishReason::kStop), "stop");
  EXPECT_STREQ(finish_reason_name(FinishReason::kLength), "length");
  EXPECT_STREQ(finish_reason_name(FinishReason::kToolCalls), "tool_calls");
  EXPECT_STREQ(finish_reason_name(FinishReason::kStopSequence), "stop_sequence");
  // finish() is emitted once.
  OutputParser p(opts());
  EXPECT_EQ(p.finish(FinishReason::kStop).size(), 1u);
  EXPECT_TRUE(p.finish(FinishReason::kStop).empty());
  EXPECT_TRUE(p.feed("x").empty());
}

TEST(RecipeOutputParser, LongNewlineRunsStayLinear) {
  std::string text = "r</think>a";
  text.append(200000, '\n');
  text += "b";
  OutputParser p(opts());
  std::vector<OutputEvent> all;
  for (char c : text) {
    auto ev = p.feed(std::string(1, c));
    all.insert(all.end(), ev.begin(), ev.end());
  }
  auto ev = p.finish(FinishReason::kStop);
  all.insert(all.end(), ev.begin(), ev.end());
  EXPECT_EQ(aggregate_events(all).content.size(), 200002u);
}

}  // namespace
}  // namespace dsinfer::recipe
