#include "recipe/encoder.h"

#include <gtest/gtest.h>

#include <string>

#include "recipe/pyjson.h"
#include "test_util.h"

namespace dsinfer::recipe {
namespace {

using testing::conversation_from_json;
using testing::fixture_path;
using testing::read_text_file;

const std::string B = "<｜begin▁of▁sentence｜>";
const std::string E = "<｜end▁of▁sentence｜>";
const std::string U = "<｜User｜>";
const std::string A = "<｜Assistant｜>";
const std::string SYS = "<｜System｜>";
const std::string S = "You are a helpful assistant.";
const std::string kAbsMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";
const std::string kBeyondMax =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
    "exhaustively decompose the problem into its most fundamental components, trace every causal "
    "chain to its root, and resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple "
    "angles and are certain that no assumption remains unchecked and no error remains "
    "undiscovered.\n\n";

std::string v41_effort(int n) {
  return "Reasoning Effort: " + std::to_string(n) +
         " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
}

Message msg(Role r, std::string content) {
  Message m;
  m.role = r;
  m.content = std::move(content);
  return m;
}
Message sys(std::string c) {
  return msg(Role::kSystem, std::move(c));
}
Message user(std::string c) {
  return msg(Role::kUser, std::move(c));
}
Message asst(std::string c,
             std::optional<std::string> reasoning = std::nullopt,
             std::vector<ToolCall> calls = {}) {
  Message m = msg(Role::kAssistant, std::move(c));
  m.reasoning_content = std::move(reasoning);
  m.tool_calls = std::move(calls);
  return m;
}
Message tool(std::string c, std::string id) {
  Message m = msg(Role::kTool, std::move(c));
  m.tool_call_id = std::move(id);
  return m;
}
ToolCall call(std::string id, std::string name, std::string args) {
  return ToolCall{std::move(id), std::move(name), std::move(args)};
}

ToolSpec weather_tool() {
  return ToolSpec{"get_weather",
                  "{\"name\": \"get_weather\", \"description\": \"Get the weather\", "
                  "\"parameters\": {\"type\": \"object\", \"properties\": {\"location\": "
                  "{\"type\": \"string\"}}}}"};
}

// Most expectations here are the Python reference encoders' (gold outputs); they render with
// RenderOptions::python_reference. render_recipe: deepseek-recipe's form (the default options).
RenderOptions reference_options() {
  RenderOptions o;
  o.python_reference = true;
  return o;
}

std::string render(const Conversation& c,
                   ModelVersion v,
                   const RenderOptions& o = reference_options()) {
  auto r = render_prompt(c, v, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::string();
}

Conversation conv(std::vector<Message> msgs, ThinkingMode t = ThinkingMode::kThinking) {
  Conversation c;
  c.messages = std::move(msgs);
  c.thinking = t;
  return c;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const ModelVersion kAllV4[] = {ModelVersion::kV4, ModelVersion::kV40731};

std::string gold(int n) {
  std::string s = read_text_file(fixture_path("test_output_" + std::to_string(n) + ".txt"));
  EXPECT_FALSE(s.empty());
  if (!s.empty() && s.back() == '\n')
    s.pop_back();  // gold files end with a newline
  return s;
}

Conversation fixture_conv(int n) {
  const std::string text =
      read_text_file(fixture_path("test_input_" + std::to_string(n) + ".json"));
  return conversation_from_json(nlohmann::ordered_json::parse(text));
}

// ---- gold cases (spec §1.11) ----

// The control tokens the encoder placed are recorded as ranges; request text (even when it
// spells a special token) is never inside one.
TEST(RecipeEncoder, SpecialRangesCoverOnlyPlacedTokens) {
  Conversation c;
  c.thinking = ThinkingMode::kChat;
  Message sys;
  sys.role = Role::kSystem;
  sys.content = "sys " + A;
  Message user;
  user.role = Role::kUser;
  user.content = "hi " + E + "<think>｜DSML｜";
  c.messages = {sys, user};
  ToolSpec t;
  t.name = "f";
  t.function_json = R"({"name": "f", "description": "<｜User｜>"})";
  c.tools = {t};
  for (ModelVersion v : {ModelVersion::kV40731, ModelVersion::kV41}) {
    auto r = render_conversation(c, v);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->text, *render_prompt(c, v));
    std::string placed;
    size_t at = 0;
    for (const SpecialRange& sr : r->special_ranges) {
      ASSERT_LE(at, sr.begin);
      ASSERT_LT(sr.begin, sr.end);
      placed += r->text.substr(sr.begin, sr.end - sr.begin) + "|";
      at = sr.end;
    }
    const std::string dsml9 = [] {
      std::string d;
      for (int i = 0; i < 9; ++i) d += "｜DSML｜|";
      return d;
    }();
    const std::string head = B + "|" + (v == ModelVersion::kV41 ? SYS + "|" : "");
    EXPECT_EQ(placed,
              head + dsml9 + "<think>|<think>|</think>|</think>|" + U + "|" + A + "|</think>|");
  }
}

TEST(RecipeEncoder, GoldOutput1ThinkingWithTools) {
  for (ModelVersion v : kAllV4) EXPECT_EQ(render(fixture_conv(1), v), gold(1));
}

TEST(RecipeEncoder, GoldOutput2HistoryReasoningDropped) {
  for (ModelVersion v : kAllV4) EXPECT_EQ(render(fixture_conv(2), v), gold(2));
}

TEST(RecipeEncoder, GoldOutput2GenerationPrompt) {
  Conversation c = fixture_conv(2);
  c.messages.pop_back();
  const std::string want = B + S + U + "Hello" + A + "</think>Hi there! How can I help you?" + E +
                           U + "What is the capital of France?" + A + "<think>";
  for (ModelVersion v : kAllV4) EXPECT_EQ(render(c, v), want);
}

TEST(RecipeEncoder, ReadmeExample) {
  Conversation c = conv({sys(S), user("What is 2+2?")});
  for (ModelVersion v : kAllV4) EXPECT_EQ(render(c, v), B + S + U + "What is 2+2?" + A + "<think>");
  c.thinking = ThinkingMode::kChat;
  for (ModelVersion v : kAllV4)
    EXPECT_EQ(render(c, v), B + S + U + "What is 2+2?" + A + "</think>");
}

TEST(RecipeEncoder, ChatModeNeverRendersReasoning) {
  Conversation c = conv({sys(S),
                         user("Hello"),
                         asst("Hi there! How can I help you?", "greet"),
                         user("What is the capital of France?"),
                         asst("The capital of France is Paris.", "Paris")},
                        ThinkingMode::kChat);
  const std::string want = B + S + U + "Hello" + A + "</think>Hi there! How can I help you?" + E +
                           U + "What is the capital of France?" + A +
                           "</think>The capital of France is Paris." + E;
  for (ModelVersion v : kAllV4) EXPECT_EQ(render(c, v), want);
  c.messages.pop_back();
  for (ModelVersion v : kAllV4) {
    EXPECT_EQ(render(c, v),
              B + S + U + "Hello" + A + "</think>Hi there! How can I help you?" + E + U +
                  "What is the capital of France?" + A + "</think>");
  }
}

// swift alignment test: tools turn drop_thinking off, so every turn keeps its reasoning.
TEST(RecipeEncoder, ToolsKeepHistoryReasoning) {
  Conversation c = fixture_conv(1);  // tools = get_weather + search
  c.messages = {sys(S),
                user("What's the weather in Beijing?"),
                asst("",
                     "Need the get_weather tool.",
                     {call("c1", "get_weather", "{\"location\": \"Beijing\"}")}),
                tool("{\"temperature\": 22}", "c1"),
                asst("It is 22°C in Beijing.", "Got it, answer now."),
                user("And Shanghai?"),
                asst("It is 26°C in Shanghai.", "Same tool, new city.")};
  const std::string g1 = gold(1);
  const std::string head = g1.substr(0, g1.find(U));  // BOS + system + tools block
  const std::string want =
      head + U + "What's the weather in Beijing?" + A +
      "<think>Need the get_weather tool.</think>\n\n"
      "<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"location\" string=\"true\">Beijing</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>" +
      E + U + "<tool_result>{\"temperature\": 22}</tool_result>" + A +
      "<think>Got it, answer now.</think>It is 22°C in Beijing." + E + U + "And Shanghai?" + A +
      "<think>Same tool, new city.</think>It is 26°C in Shanghai." + E;
  for (ModelVersion v : kAllV4) EXPECT_EQ(render(c, v), want);
}

// swift alignment test: parallel calls, results joined by a blank line in one user turn.
TEST(RecipeEncoder, ParallelToolResultsOneUserTurn) {
  Conversation c = fixture_conv(1);
  c.messages = {sys(S),
                user("weather in Beijing and Shanghai?"),
                asst("Let me check both.",
                     "Two cities, call the tool twice.",
                     {call("a", "get_weather", "{\"location\": \"Beijing\"}"),
                      call("b", "get_weather", "{\"location\": \"Shanghai\"}")}),
                tool("{\"temperature\": 22}", "a"),
                tool("{\"temperature\": 26}", "b"),
                asst("Beijing 22°C, Shanghai 26°C.", "Both done.")};
  const std::string g1 = gold(1);
  const std::string head = g1.substr(0, g1.find(U));
  const std::string want =
      head + U + "weather in Beijing and Shanghai?" + A +
      "<think>Two cities, call the tool twice.</think>Let me check both.\n\n"
      "<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"location\" string=\"true\">Beijing</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"location\" string=\"true\">Shanghai</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>" +
      E + U + "<tool_result>{\"temperature\": 22}</tool_result>\n\n" +
      "<tool_result>{\"temperature\": 26}</tool_result>" + A +
      "<think>Both done.</think>Beijing 22°C, Shanghai 26°C." + E;
  for (ModelVersion v : kAllV4) EXPECT_EQ(render(c, v), want);
}

// ---- tools block ----

TEST(RecipeEncoder, ToolsBlockExactV4AndV41) {
  const std::vector<ToolSpec> tools = {weather_tool(), ToolSpec{"x", "{\"name\": \"x\"}"}};
  const std::string schemas = weather_tool().function_json + "\n{\"name\": \"x\"}";
  auto expected = [&](const std::string& blk, const std::string& inv, const std::string& par) {
    const std::string d = "｜DSML｜";
    return "## Tools\n\nYou have access to a set of tools to help answer the user's question. "
           "You can invoke tools by writing a \"<" +
           d + blk + ">\" block like the following:\n\n<" + d + blk + ">\n<" + d + inv +
           " name=\"$TOOL_NAME\">\n<" + d + par +
           " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + d + par +
           ">\n...\n</" + d + inv + ">\n<" + d + inv + " name=\"$TOOL_NAME2\">\n...\n</" + d + inv +
           ">\n</" + d + blk +
           ">\n\nString parameters should be specified as is and set `string=\"true\"`. For all "
           "other types (numbers, booleans, arrays, objects), pass the value in JSON format and "
           "set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you "
           "MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls "
           "or final response.\n\nOtherwise, output directly after </think> with tool calls or "
           "final response.\n\n### Available Tool Schemas\n\n" +
           schemas +
           "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to "
           "invoke tool calls.\n";
  };
  EXPECT_EQ(render_tools_block(tools, ModelVersion::kV4),
            expected("tool_calls", "invoke", "parameter"));
  EXPECT_EQ(render_tools_block(tools, ModelVersion::kV40731),
            expected("tool_calls", "invoke", "parameter"));
  EXPECT_EQ(render_tools_block(tools, ModelVersion::kV41),
            expected(" calls", " invoke", " parameter"));
  // The gold block is the same text.
  const std::string g1 = gold(1);
  const std::string gold_tools =
      g1.substr(B.size() + S.size() + 2, g1.find(U) - B.size() - S.size() - 2);
  EXPECT_EQ(render_tools_block(fixture_conv(1).tools, ModelVersion::kV4), gold_tools);
}

TEST(RecipeEncoder, ToolsWithoutSystemMessageInsertEmptySystem) {
  Conversation c = conv({user("hi")});
  c.tools = {weather_tool()};
  const std::string tb = render_tools_block(c.tools, ModelVersion::kV4);
  for (ModelVersion v : kAllV4) EXPECT_EQ(render(c, v), B + "\n\n" + tb + U + "hi" + A + "<think>");
  // V4.1: the inserted system message is a leading system message, so it gets <｜System｜>.
  const std::string tb41 = render_tools_block(c.tools, ModelVersion::kV41);
  EXPECT_EQ(render(c, ModelVersion::kV41),
            B + SYS + v41_effort(75) + "\n\n" + tb41 + U + "hi" + A + "<think>");
  // V4.1: a system message that is not first does not receive the tools. V4 hoists it.
  c.messages = {user("hi"), sys("late")};
  c.thinking = ThinkingMode::kChat;
  EXPECT_EQ(render(c, ModelVersion::kV4), B + "late\n\n" + tb + U + "hi" + A + "</think>");
  EXPECT_EQ(render(c, ModelVersion::kV41),
            B + SYS + "\n\n" + tb41 + U + "hi" + SYS + "late" + A + "</think>");
}

TEST(RecipeEncoder, SystemMessagesV4MergedV41InPlace) {
  Conversation c = conv({sys("one"), sys("two"), user("q")}, ThinkingMode::kChat);
  c.tools = {weather_tool()};
  const std::string tb = render_tools_block(c.tools, ModelVersion::kV4);
  const std::string tb41 = render_tools_block(c.tools, ModelVersion::kV41);
  EXPECT_EQ(render(c, ModelVersion::kV4), B + "one\n\ntwo\n\n" + tb + U + "q" + A + "</think>");
  EXPECT_EQ(render(c, ModelVersion::kV41),
            B + SYS + "one\n\n" + tb41 + SYS + "two" + U + "q" + A + "</think>");
  // V4: empty system messages are skipped; users around a hoisted system message merge.
  c.tools.clear();
  c.messages = {sys(""), user("a"), sys("mid"), user("b")};
  EXPECT_EQ(render(c, ModelVersion::kV40731), B + "mid" + U + "a\n\nb" + A + "</think>");
  c.messages = {sys(""), user("a")};
  EXPECT_EQ(render(c, ModelVersion::kV4), B + U + "a" + A + "</think>");
}

TEST(RecipeEncoder, ResponseFormatBlock) {
  Conversation c = conv({sys(S), user("q")}, ThinkingMode::kChat);
  c.response_format_json = "{\"type\": \"json_object\"}";
  const std::string rf =
      "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to "
      "reply:\n{\"type\": \"json_object\"}";
  EXPECT_EQ(render(c, ModelVersion::kV4), B + S + rf + U + "q" + A + "</think>");
  c.tools = {weather_tool()};
  EXPECT_EQ(render(c, ModelVersion::kV40731),
            B + S + "\n\n" + render_tools_block(c.tools, ModelVersion::kV4) + rf + U + "q" + A +
                "</think>");
  c.tools.clear();
  c.messages = {user("q")};  // inserted empty system message
  EXPECT_EQ(render(c, ModelVersion::kV4), B + rf + U + "q" + A + "</think>");
  EXPECT_EQ(render(c, ModelVersion::kV41), B + SYS + rf + U + "q" + A + "</think>");
}

// json_object without a schema (deepseek-recipe): V4 fixed text, V4.1 the schema block.
TEST(RecipeEncoder, JsonObjectResponseFormat) {
  Conversation c = conv({sys(S), user("q")}, ThinkingMode::kChat);
  c.json_output = true;
  EXPECT_EQ(render(c, ModelVersion::kV4),
            B + S +
                "\n\nYou are a helpful assistant designed to output JSON.\n## Response "
                "Format:\n\nReply with JSON object ONLY." +
                U + "q" + A + "</think>");
  EXPECT_EQ(render(c, ModelVersion::kV41),
            B + SYS + S +
                "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to "
                "reply:\n{\"type\": \"json_object\"}" +
                U + "q" + A + "</think>");
  c.messages = {user("q")};
  EXPECT_EQ(render(c, ModelVersion::kV40731),
            B +
                "\n\nYou are a helpful assistant designed to output JSON.\n## Response "
                "Format:\n\nReply with JSON object ONLY." +
                U + "q" + A + "</think>");
  EXPECT_TRUE(parser_options_for(c, ModelVersion::kV4).json_output);
}

// tool_choice required / named: the prompt opens the tool block (deepseek-recipe) and the
// parser starts inside it.
TEST(RecipeEncoder, ToolChoiceRequiredPrefillsToolBlock) {
  for (ModelVersion v : {ModelVersion::kV4, ModelVersion::kV40731, ModelVersion::kV41}) {
    const std::string opener =
        v == ModelVersion::kV41 ? "\n\n<｜DSML｜ calls>\n" : "\n\n<｜DSML｜tool_calls>\n";
    for (ToolChoice tc : {ToolChoice::kRequired, ToolChoice::kNamed}) {
      Conversation c = conv({sys(S), user("q")}, ThinkingMode::kChat);
      c.tools = {weather_tool()};
      c.tool_choice = tc;
      c.tool_choice_name = "get_weather";
      std::string out = render(c, v);
      EXPECT_TRUE(out.size() > opener.size() &&
                  out.substr(out.size() - opener.size() - A.size() - 8) == A + "</think>" + opener)
          << out;
      EXPECT_EQ(parser_options_for(c, v).start, ParseStart::kToolCalls);
      // Thinking mode: rendered the same way after <think>.
      c.thinking = ThinkingMode::kThinking;
      out = render(c, v);
      EXPECT_EQ(out.substr(out.size() - opener.size() - 7), "<think>" + opener);
      // A tool result as the last message also ends with a generation prompt.
      c.messages = {user("q"), asst("", "r", {call("x", "get_weather", "{}")}), tool("res", "x")};
      out = render(c, v);
      EXPECT_EQ(out.substr(out.size() - opener.size()), opener);
      EXPECT_EQ(parser_options_for(c, v).start, ParseStart::kToolCalls);
      // No generation prompt at the end: no prefill.
      RenderOptions o;
      o.add_generation_prompt = false;
      EXPECT_FALSE(ends_with(render(c, v, o), opener));
      EXPECT_NE(parser_options_for(c, v, o).start, ParseStart::kToolCalls);
      // Prefix continuation: no prefill.
      Message p = asst("partial");
      p.prefix = true;
      c.messages = {user("q"), p};
      EXPECT_FALSE(ends_with(render(c, v), opener));
      EXPECT_EQ(parser_options_for(c, v).start, ParseStart::kContent);
      // V4: a final latest_reminder does not open a turn; neither does V4.1's.
      c.messages = {user("q"), msg(Role::kLatestReminder, "r")};
      EXPECT_FALSE(ends_with(render(c, v), opener));
      EXPECT_NE(parser_options_for(c, v).start, ParseStart::kToolCalls);
    }
    // auto / none: nothing.
    Conversation c = conv({user("q")});
    c.tools = {weather_tool()};
    c.tool_choice = ToolChoice::kAuto;
    EXPECT_FALSE(ends_with(render(c, v), opener));
    EXPECT_EQ(parser_options_for(c, v).start, ParseStart::kReasoningStart);
  }
}

// tool_choice none offers no tools (no tools block, reasoning history dropped as without tools);
// a named tool_choice lists only that tool (deepseek-recipe).
TEST(RecipeEncoder, ToolChoiceSelectsOfferedTools) {
  const ToolSpec x{"x", "{\"name\": \"x\"}"};
  for (ModelVersion v : {ModelVersion::kV40731, ModelVersion::kV41}) {
    Conversation c = conv({user("q")}, ThinkingMode::kChat);
    const std::string plain = render(c, v);
    c.tools = {weather_tool(), x};
    c.tool_choice = ToolChoice::kNone;
    EXPECT_EQ(render(c, v), plain);
    EXPECT_FALSE(parser_options_for(c, v).parse_tool_calls);
    c.tool_choice = ToolChoice::kNamed;
    c.tool_choice_name = x.name;
    Conversation only_x = conv({user("q")}, ThinkingMode::kChat);
    only_x.tools = {x};
    only_x.tool_choice = ToolChoice::kRequired;
    EXPECT_EQ(render(c, v), render(only_x, v));
  }
}

// ---- DSML rendering ----

TEST(RecipeEncoder, DsmlToolCallsV4AndV41) {
  const std::vector<ToolCall> calls = {
      call(
          "1", "f", "{\"s\": \"a \\\"q\\\"\\n日本\", \"n\": 1.0, \"o\": {\"b\": [1, 2.50, null]}}"),
      call("2", "g", "{}")};
  EXPECT_EQ(
      render_tool_calls(calls, ModelVersion::kV4),
      "<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"s\" string=\"true\">a \"q\"\n日本</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"n\" string=\"false\">1.0</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"o\" string=\"false\">{\"b\": [1, 2.5, null]}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"g\">\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>");
  EXPECT_EQ(render_tool_calls(calls, ModelVersion::kV41),
            "<｜DSML｜ calls>\n"
            "<｜DSML｜ invoke name=\"f\">\n"
            "<｜DSML｜ parameter name=\"s\" string=\"true\">a \"q\"\n日本</｜DSML｜ parameter>\n"
            "<｜DSML｜ parameter name=\"n\" string=\"false\">1.0</｜DSML｜ parameter>\n"
            "<｜DSML｜ parameter name=\"o\" string=\"false\">{\"b\": [1, 2.5, null]}</｜DSML｜ "
            "parameter>\n"
            "</｜DSML｜ invoke>\n"
            "<｜DSML｜ invoke name=\"g\">\n\n</｜DSML｜ invoke>\n"
            "</｜DSML｜ calls>");
}

TEST(RecipeEncoder, DsmlArgumentsThatAreNotAnObject) {
  auto one = [](const std::string& args) {
    return render_tool_calls({call("1", "f", args)}, ModelVersion::kV4);
  };
  auto wrapped = [](const std::string& raw) {
    return "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter "
           "name=\"arguments\" "
           "string=\"true\">" +
           raw + "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  };
  EXPECT_EQ(one("not json"), wrapped("not json"));
  EXPECT_EQ(one("[1,2]"), wrapped("[1,2]"));
  EXPECT_EQ(one(""), wrapped(""));
  EXPECT_EQ(one("\"just a string\""), wrapped("\"just a string\""));
  EXPECT_EQ(one(std::string("{}\0x", 4)), wrapped(std::string("{}\0x", 4)));
  // A JSON string holding an object is not decoded again (deepseek-recipe).
  EXPECT_EQ(one("\"{\\\"a\\\": 1}\""), wrapped("\"{\\\"a\\\": 1}\""));
  // No parameters: V4 closes the invoke on the next line, V4.1 leaves an empty line.
  EXPECT_EQ(one("{}"),
            "<｜DSML｜tool_calls>\n<｜DSML｜invoke "
            "name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  EXPECT_EQ(
      render_tool_calls({call("1", "f", "{}")}, ModelVersion::kV41),
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  // Floats: V4 in its own form, V4.1 like Python.
  const std::string floats = "{\"a\": 1e16, \"b\": 1E-7, \"c\": -0.0, \"d\": 0.1, \"e\": 1.5e-5}";
  EXPECT_EQ(one(floats),
            "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
            "<｜DSML｜parameter name=\"a\" string=\"false\">1e+16</｜DSML｜parameter>\n"
            "<｜DSML｜parameter name=\"b\" string=\"false\">1e-7</｜DSML｜parameter>\n"
            "<｜DSML｜parameter name=\"c\" string=\"false\">-0.0</｜DSML｜parameter>\n"
            "<｜DSML｜parameter name=\"d\" string=\"false\">0.1</｜DSML｜parameter>\n"
            "<｜DSML｜parameter name=\"e\" string=\"false\">0.000015</｜DSML｜parameter>\n"
            "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  const std::string v41 = render_tool_calls({call("1", "f", floats)}, ModelVersion::kV41);
  EXPECT_NE(v41.find(">1e-07<"), std::string::npos) << v41;
  EXPECT_NE(v41.find(">1.5e-05<"), std::string::npos) << v41;
  // The Python reference encoder's V4 form.
  const std::string ref = render_tool_calls({call("1", "f", floats), call("2", "g", "{}")},
                                            ModelVersion::kV4,
                                            /*python_reference=*/true);
  EXPECT_NE(ref.find(">1e-07<"), std::string::npos) << ref;
  EXPECT_NE(ref.find("name=\"g\">\n\n</"), std::string::npos) << ref;
}

// V4 writes the floats of tool schemas and response formats in its own form too.
TEST(RecipeEncoder, V4FloatsInToolSchemasAndResponseFormat) {
  Conversation c = conv({user("q")}, ThinkingMode::kChat);
  c.tools = {ToolSpec{"f", "{\"name\": \"f\", \"parameters\": {\"minimum\": 1e-07}}"}};
  c.response_format_json = "{\"enum\": [1e-07, 1e+16, 2.5]}";
  EXPECT_NE(render(c, ModelVersion::kV40731).find("[1e-07, 1e+16, 2.5]"), std::string::npos);
  const std::string v4 = render(c, ModelVersion::kV40731, RenderOptions{});
  EXPECT_NE(v4.find("{\"minimum\": 1e-7}"), std::string::npos) << v4;
  EXPECT_NE(v4.find("[1e-7, 1e+16, 2.5]"), std::string::npos) << v4;
  const std::string v41 = render(c, ModelVersion::kV41);
  EXPECT_NE(v41.find("{\"minimum\": 1e-07}"), std::string::npos) << v41;
  EXPECT_NE(v41.find("[1e-07, 1e+16, 2.5]"), std::string::npos) << v41;
}

// ---- tool results ----

TEST(RecipeEncoder, ToolResultsReorderedByCallOrder) {
  Conversation c =
      conv({user("q"),
            asst("", "r", {call("id1", "f", "{}"), call("id2", "g", "{}"), call("id3", "h", "{}")}),
            tool("R3", "id3"),
            user("note"),
            tool("R1", "id1"),
            tool("R2", "id2")});
  c.tools = {weather_tool()};
  const std::string out = render(c, ModelVersion::kV40731);
  // Tool results sorted (id1, id2, id3) into the tool_result slots; the text block stays put.
  EXPECT_NE(out.find(E + U +
                     "<tool_result>R1</tool_result>\n\nnote\n\n<tool_result>R2</tool_result>"
                     "\n\n<tool_result>R3</tool_result>" +
                     A + "<think>"),
            std::string::npos)
      << out;
  // Unknown ids sort as position 0 (stable).
  c.messages = {user("q"),
                asst("", "r", {call("id1", "f", "{}"), call("id2", "g", "{}")}),
                tool("R2", "id2"),
                tool("RX", "zzz"),
                tool("R1", "id1")};
  const std::string out2 = render(c, ModelVersion::kV4);
  EXPECT_NE(out2.find(U +
                      "<tool_result>RX</tool_result>\n\n<tool_result>R1</tool_result>\n\n"
                      "<tool_result>R2</tool_result>" +
                      A),
            std::string::npos)
      << out2;
}

TEST(RecipeEncoder, ToolResultListContentAndUnsupportedBlocks) {
  Message t = tool("", "c");
  t.blocks = {ContentBlock{ContentBlock::Type::kText, "part1", "", ""},
              ContentBlock{ContentBlock::Type::kUnsupported, "", "", "image_url"},
              ContentBlock{ContentBlock::Type::kText, "part2", "", ""}};
  Message u = user("");
  u.blocks = {ContentBlock{ContentBlock::Type::kText, "look", "", ""},
              ContentBlock{ContentBlock::Type::kUnsupported, "", "", "image_url"}};
  Conversation c =
      conv({user("q"), asst("", std::nullopt, {call("c", "f", "{}")}), t, u}, ThinkingMode::kChat);
  EXPECT_EQ(render(c, ModelVersion::kV4),
            B + U + "q" + A +
                "</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n"
                "</｜DSML｜invoke>\n</｜DSML｜tool_calls>" +
                E + U +
                "<tool_result>part1\n\n[Unsupported image_url]\n\npart2</tool_result>\n\nlook\n\n"
                "[Unsupported image_url]" +
                A + "</think>");
}

TEST(RecipeEncoder, ConsecutiveUserMessagesMerge) {
  Conversation c = conv({user("a"), user("b")}, ThinkingMode::kChat);
  EXPECT_EQ(render(c, ModelVersion::kV4), B + U + "a\n\nb" + A + "</think>");
  EXPECT_EQ(render(c, ModelVersion::kV41), B + U + "a\n\nb" + A + "</think>");
}

// ---- roles ----

TEST(RecipeEncoder, DeveloperAndLatestReminder) {
  Conversation c =
      conv({sys(S), msg(Role::kDeveloper, "dev says"), user("q")}, ThinkingMode::kChat);
  EXPECT_EQ(render(c, ModelVersion::kV4), B + S + U + "dev says" + U + "q" + A + "</think>");
  // A latest_reminder after the user: the user transition comes first.
  c.messages = {user("q"), msg(Role::kLatestReminder, "date: today")};
  EXPECT_EQ(render(c, ModelVersion::kV4),
            B + U + "q" + A + "</think><｜latest_reminder｜>date: today");
  // developer directly before the assistant gets the transition.
  c.messages = {msg(Role::kDeveloper, "d")};
  c.thinking = ThinkingMode::kThinking;
  EXPECT_EQ(render(c, ModelVersion::kV4), B + U + "d" + A + "<think>");
  Conversation bad = conv({msg(Role::kDeveloper, "")});
  EXPECT_FALSE(render_prompt(bad, ModelVersion::kV4, {}).ok());
}

TEST(RecipeEncoder, DropRuleRemovesHistoryReasoningAndDevelopers) {
  Conversation c = conv({sys(S),
                         msg(Role::kDeveloper, "old dev"),
                         user("u1"),
                         asst("a1", "r1"),
                         msg(Role::kLatestReminder, "rem"),
                         user("u2"),
                         asst("a2", "r2"),
                         asst("a3", "r3")});
  // a3 follows another assistant message: it gets its own header (deepseek-recipe).
  EXPECT_EQ(render(c, ModelVersion::kV4),
            B + S + U + "u1" + A + "</think>a1" + E + "<｜latest_reminder｜>rem" + U + "u2" + A +
                "<think>r2</think>a2" + E + A + "<think>r3</think>a3" + E);
  // drop_thinking=false keeps everything.
  RenderOptions keep = reference_options();
  keep.drop_thinking = false;
  EXPECT_EQ(render(c, ModelVersion::kV4, keep),
            B + S + U + "old dev" + U + "u1" + A + "<think>r1</think>a1" + E +
                "<｜latest_reminder｜>rem" + U + "u2" + A + "<think>r2</think>a2" + E + A +
                "<think>r3</think>a3" + E);
  // Tools force drop_thinking off.
  c.tools = {weather_tool()};
  const std::string with_tools = render(c, ModelVersion::kV4);
  EXPECT_NE(with_tools.find(U + "old dev"), std::string::npos);
  EXPECT_NE(with_tools.find("<think>r1</think>a1"), std::string::npos);
}

TEST(RecipeEncoder, ToolLoopWithoutDeclaredToolsDropsReasoning) {
  Conversation c = conv({user("u1"),
                         asst("a1", "r1"),
                         user("u2"),
                         asst("", "r2", {call("x", "f", "{\"k\": \"v\"}")}),
                         tool("res", "x")});
  // No tools declared: drop applies. The merged tool-result message is the last user message,
  // so the tool-calling turn before it loses its reasoning (reference behaviour).
  const std::string out = render(c, ModelVersion::kV4);
  EXPECT_EQ(out,
            B + U + "u1" + A + "</think>a1" + E + U + "u2" + A + "</think>\n\n" +
                render_tool_calls(c.messages[3].tool_calls, ModelVersion::kV4) + E + U +
                "<tool_result>res</tool_result>" + A + "<think>");
}

// ---- effort ----

TEST(RecipeEncoder, EffortV4Preview) {
  Conversation c = conv({sys(S), user("q")});
  c.effort = ReasoningEffort::kMax;
  EXPECT_EQ(render(c, ModelVersion::kV4), B + kAbsMax + S + U + "q" + A + "<think>");
  for (auto e : {ReasoningEffort::kUnset, ReasoningEffort::kLow, ReasoningEffort::kHigh}) {
    c.effort = e;
    EXPECT_EQ(render(c, ModelVersion::kV4), B + S + U + "q" + A + "<think>");
  }
  c.effort = ReasoningEffort::kMax;
  c.thinking = ThinkingMode::kChat;
  EXPECT_EQ(render(c, ModelVersion::kV4), B + S + U + "q" + A + "</think>");
}

TEST(RecipeEncoder, EffortV40731Ladder) {
  Conversation c = fixture_conv(2);
  const std::string body = gold(2).substr(B.size());
  c.effort = ReasoningEffort::kHigh;
  EXPECT_EQ(render(c, ModelVersion::kV40731), B + kAbsMax + body);
  c.effort = ReasoningEffort::kMax;
  EXPECT_EQ(render(c, ModelVersion::kV40731), B + kBeyondMax + body);
  c.effort = ReasoningEffort::kLow;
  EXPECT_EQ(render(c, ModelVersion::kV40731), B + body);
  c.effort = ReasoningEffort::kUnset;
  EXPECT_EQ(render(c, ModelVersion::kV40731), B + body);
  // Effort goes before the first message whatever its role.
  Conversation u = conv({user("q")});
  u.effort = ReasoningEffort::kMax;
  EXPECT_EQ(render(u, ModelVersion::kV40731), B + kBeyondMax + U + "q" + A + "<think>");
}

TEST(RecipeEncoder, EffortV41Numeric) {
  Conversation c = conv({sys(S), user("q")});
  // Current official mapping (deepseek-recipe 0.2.0 / vLLM 0.33): low 50, high 75 (default),
  // max 100.
  const std::pair<ReasoningEffort, int> cases[] = {{ReasoningEffort::kUnset, 75},
                                                   {ReasoningEffort::kLow, 50},
                                                   {ReasoningEffort::kHigh, 75},
                                                   {ReasoningEffort::kMax, 100}};
  for (auto [e, n] : cases) {
    c.effort = e;
    EXPECT_EQ(render(c, ModelVersion::kV41), B + SYS + v41_effort(n) + S + U + "q" + A + "<think>");
  }
  c.effort_budget = 33;
  EXPECT_EQ(render(c, ModelVersion::kV41), B + SYS + v41_effort(33) + S + U + "q" + A + "<think>");
  c.effort_budget = 101;
  EXPECT_FALSE(render_prompt(c, ModelVersion::kV41, {}).ok());
  c.effort_budget = 0;
  // Chat mode: no effort; <｜System｜> only because the first message is a system message.
  c.thinking = ThinkingMode::kChat;
  EXPECT_EQ(render(c, ModelVersion::kV41), B + SYS + S + U + "q" + A + "</think>");
  Conversation u = conv({user("q")}, ThinkingMode::kChat);
  EXPECT_EQ(render(u, ModelVersion::kV41), B + U + "q" + A + "</think>");
  u.thinking = ThinkingMode::kThinking;
  EXPECT_EQ(render(u, ModelVersion::kV41), B + SYS + v41_effort(75) + U + "q" + A + "<think>");
}

// ---- V4.1 specifics ----

TEST(RecipeEncoder, V41GoldEquivalents) {
  // test_output_2 under V4.1: <｜System｜> + default effort (75), and (add_generation_prompt) a new
  // assistant turn after the final assistant message.
  EXPECT_EQ(render(fixture_conv(2), ModelVersion::kV41),
            B + SYS + v41_effort(75) + gold(2).substr(B.size()) + A + "<think>");
  // test_output_1 under V4.1: spaced DSML.
  const std::string out = render(fixture_conv(1), ModelVersion::kV41);
  EXPECT_NE(out.find("</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
                     "<｜DSML｜ parameter name=\"location\" string=\"true\">Beijing</｜DSML｜ "
                     "parameter>\n"),
            std::string::npos);
}

TEST(RecipeEncoder, V41MidConversationSystem) {
  Conversation c = conv({sys(S), user("u1"), asst("a1", "r1"), sys("new rule"), asst("a2", "r2")});
  // The mid system message counts as the last "user": it opens the assistant turn, and the
  // reasoning before it is dropped.
  EXPECT_EQ(render(c, ModelVersion::kV41),
            B + SYS + v41_effort(75) + S + U + "u1" + A + "</think>a1" + E + SYS + "new rule" + A +
                "<think>r2</think>a2" + E + A + "<think>");
  // V4: the mid system message is merged into the leading one.
  EXPECT_EQ(render(c, ModelVersion::kV4),
            B + S + "\n\nnew rule" + U + "u1" + A + "<think>r1</think>a1" + E + A +
                "<think>r2</think>a2" + E);
}

TEST(RecipeEncoder, V41AddGenerationPromptFalse) {
  Conversation c = conv({user("q")});
  RenderOptions o;
  o.add_generation_prompt = false;
  EXPECT_EQ(render(c, ModelVersion::kV41, o), B + SYS + v41_effort(75) + U + "q");
  EXPECT_EQ(render(c, ModelVersion::kV4, o), B + U + "q");
}

// ---- prefix completion ----

TEST(RecipeEncoder, PrefixCompletion) {
  for (ModelVersion v : {ModelVersion::kV4, ModelVersion::kV40731, ModelVersion::kV41}) {
    const std::string head = v == ModelVersion::kV41 ? B + SYS + v41_effort(75) : B;
    Message p = asst("Sure,", "r");
    p.prefix = true;
    Conversation c = conv({user("hi"), p});
    EXPECT_EQ(render(c, v), head + U + "hi" + A + "<think>r</think>Sure,");
    // Reasoning-only prefix keeps the reasoning open.
    c.messages[1] = asst("", "partial reasoning");
    c.messages[1].prefix = true;
    EXPECT_EQ(render(c, v), head + U + "hi" + A + "<think>partial reasoning");
    EXPECT_EQ(parser_options_for(c, v).start, ParseStart::kReasoning);
    // Chat mode.
    c = conv({user("hi"), p}, ThinkingMode::kChat);
    EXPECT_EQ(render(c, v), B + U + "hi" + A + "</think>Sure,");
    EXPECT_EQ(parser_options_for(c, v).start, ParseStart::kContent);
    // continue_final_message option without prefix flag.
    RenderOptions o;
    o.continue_final_message = true;
    c = conv({user("hi"), asst("Sure,")}, ThinkingMode::kChat);
    EXPECT_EQ(render(c, v, o), B + U + "hi" + A + "</think>Sure,");
  }
  // prefix on a non-final message is rejected.
  Message p = asst("x");
  p.prefix = true;
  EXPECT_FALSE(render_prompt(conv({user("a"), p, user("b")}), ModelVersion::kV4, {}).ok());
  RenderOptions o;
  o.continue_final_message = true;
  EXPECT_FALSE(render_prompt(conv({user("a")}), ModelVersion::kV41, o).ok());
}

// deepseek-recipe: an assistant message that no transition opened gets its own header.
TEST(RecipeEncoder, AssistantHeaderWhenNoTurnWasOpened) {
  for (ModelVersion v : kAllV4) {
    // Greeting right after the system prompt (drop rule: before the last user -> </think>).
    EXPECT_EQ(render(conv({sys(S), asst("Hello", "g"), user("q")}), v),
              B + S + A + "</think>Hello" + E + U + "q" + A + "<think>");
    EXPECT_EQ(render(conv({asst("first", "r0"), user("q")}), v),
              B + A + "</think>first" + E + U + "q" + A + "<think>");
    // After a latest_reminder that followed an assistant message.
    EXPECT_EQ(render(conv({user("q"),
                           asst("a1", "r1"),
                           msg(Role::kLatestReminder, "rem"),
                           asst("a2", "r2"),
                           user("q2")}),
                     v),
              B + U + "q" + A + "</think>a1" + E + "<｜latest_reminder｜>rem" + A + "</think>a2" +
                  E + U + "q2" + A + "<think>");
    // Prefix continuation right after the system prompt.
    Message p = asst("pre", "r");
    p.prefix = true;
    EXPECT_EQ(render(conv({sys(S), p}), v), B + S + A + "<think>r</think>pre");
    // A latest_reminder between the user transition and the assistant keeps the turn open.
    EXPECT_EQ(render(conv({user("q"), msg(Role::kLatestReminder, "rem"), asst("a", "r")}), v),
              B + U + "q" + A + "<think><｜latest_reminder｜>rem" + "r</think>a" + E);
  }
}

TEST(RecipeEncoder, FinalAssistantWithoutPrefix) {
  Conversation c = conv({user("hi"), asst("yo", "r")});
  EXPECT_EQ(render(c, ModelVersion::kV4), B + U + "hi" + A + "<think>r</think>yo" + E);
  // V4.1 opens a new assistant turn after a final assistant message.
  EXPECT_EQ(render(c, ModelVersion::kV41),
            B + SYS + v41_effort(75) + U + "hi" + A + "<think>r</think>yo" + E + A + "<think>");
}

// deepseek-recipe closes a final assistant message (not a prefix) and opens a new turn, V4 too;
// with dropped thinking its reasoning goes as history reasoning does. The Python reference V4
// encoder leaves it as the last turn.
TEST(RecipeEncoder, FinalAssistantClosedAndNewTurn) {
  const RenderOptions dr;
  Conversation c = conv({user("hi"), asst("yo", "r")});
  EXPECT_EQ(render(c, ModelVersion::kV40731, dr),
            B + U + "hi" + A + "</think>yo" + E + A + "<think>");
  EXPECT_EQ(render(c, ModelVersion::kV41, dr),
            B + SYS + v41_effort(75) + U + "hi" + A + "</think>yo" + E + A + "<think>");
  EXPECT_EQ(parser_options_for(c, ModelVersion::kV4, dr).start, ParseStart::kReasoningStart);
  c.thinking = ThinkingMode::kChat;
  EXPECT_EQ(render(c, ModelVersion::kV4, dr), B + U + "hi" + A + "</think>yo" + E + A + "</think>");
  // Two assistant messages in a row: each its own turn, no reasoning.
  c = conv({user("hi"), asst("a1", "r1"), asst("a2", "r2")});
  EXPECT_EQ(render(c, ModelVersion::kV4, dr),
            B + U + "hi" + A + "</think>a1" + E + A + "</think>a2" + E + A + "<think>");
  // Tools keep every reasoning.
  c.tools = {weather_tool()};
  const std::string out = render(c, ModelVersion::kV4, dr);
  EXPECT_TRUE(ends_with(
      out,
      U + "hi" + A + "<think>r1</think>a1" + E + A + "<think>r2</think>a2" + E + A + "<think>"))
      << out;
  // A prefix is continued, not closed; no generation prompt: nothing after the EOS.
  Message p = asst("pre", "r");
  p.prefix = true;
  c = conv({user("hi"), p});
  EXPECT_EQ(render(c, ModelVersion::kV4, dr), B + U + "hi" + A + "<think>r</think>pre");
  c = conv({user("hi"), asst("yo", "r")});
  RenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(render(c, ModelVersion::kV4, no_prompt), B + U + "hi" + A + "<think>r</think>yo" + E);
}

// A Responses developer item: a V4.1 system turn, V4 user text (deepseek-recipe).
TEST(RecipeEncoder, ResponsesDeveloperItem) {
  Message d = user("DEV");
  d.developer = true;
  Conversation c = conv({d, user("hi")}, ThinkingMode::kChat);
  EXPECT_EQ(render(c, ModelVersion::kV40731), B + U + "DEV\n\nhi" + A + "</think>");
  EXPECT_EQ(render(c, ModelVersion::kV41), B + SYS + "DEV" + U + "hi" + A + "</think>");
  c.messages = {user("hi"), d};
  EXPECT_EQ(render(c, ModelVersion::kV41), B + U + "hi" + SYS + "DEV" + A + "</think>");
}

// deepseek-recipe: a latest_reminder followed by a user message opens no assistant turn.
TEST(RecipeEncoder, ReminderBeforeUserOpensNoTurn) {
  Conversation c =
      conv({user("u"), msg(Role::kLatestReminder, "REM"), user("u2")}, ThinkingMode::kChat);
  for (ModelVersion v : {ModelVersion::kV40731, ModelVersion::kV41}) {
    EXPECT_EQ(render(c, v, RenderOptions{}),
              B + U + "u<｜latest_reminder｜>REM" + U + "u2" + A + "</think>");
    EXPECT_EQ(render(c, v),
              B + U + "u" + A + "</think><｜latest_reminder｜>REM" + U + "u2" + A + "</think>");
  }
}

TEST(RecipeEncoder, NoBosAndEmpty) {
  RenderOptions o;
  o.add_bos = false;
  EXPECT_EQ(render(conv({user("q")}, ThinkingMode::kChat), ModelVersion::kV4, o),
            U + "q" + A + "</think>");
  EXPECT_EQ(render(conv({}), ModelVersion::kV4), B);
}

TEST(RecipeEncoder, ParserOptionsFor) {
  Conversation c = conv({user("q")});
  EXPECT_EQ(parser_options_for(c, ModelVersion::kV4).start, ParseStart::kReasoningStart);
  EXPECT_FALSE(parser_options_for(c, ModelVersion::kV4).parse_tool_calls);
  c.thinking = ThinkingMode::kChat;
  EXPECT_EQ(parser_options_for(c, ModelVersion::kV4).start, ParseStart::kContentStart);
  c.tools = {weather_tool()};
  c.tool_choice = ToolChoice::kAuto;
  c.json_output = true;
  const OutputParserOptions o = parser_options_for(c, ModelVersion::kV41);
  EXPECT_TRUE(o.parse_tool_calls);
  EXPECT_TRUE(o.json_output);
  Message p = asst("");
  p.prefix = true;
  c.messages.push_back(p);
  EXPECT_EQ(parser_options_for(c, ModelVersion::kV4).start, ParseStart::kContentStart);
}

}  // namespace
}  // namespace dsinfer::recipe
