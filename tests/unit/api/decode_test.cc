// Request decoding for the three protocols: request JSON -> GenerationRequest.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "api/chat.h"
#include "api/messages.h"
#include "api/options.h"
#include "api/responses.h"
#include "api_test_util.h"

namespace dsinfer::api {
namespace {

using recipe::ContentBlock;
using recipe::GenerationRequest;
using recipe::ReasoningEffort;
using recipe::Role;
using recipe::ThinkingMode;
using recipe::ToolChoice;

GenerationRequest chat_ok(const std::string& body, const DecodeOptions& opts = {}) {
  ApiResult<GenerationRequest> r = decode_chat_request(body, opts);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : GenerationRequest{};
}
GenerationRequest messages_ok(const std::string& body, const DecodeOptions& opts = {}) {
  ApiResult<GenerationRequest> r = decode_messages_request(body, opts);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : GenerationRequest{};
}
GenerationRequest responses_ok(const std::string& body, const DecodeOptions& opts = {}) {
  ApiResult<GenerationRequest> r = decode_responses_request(body, opts);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : GenerationRequest{};
}

// ---------------------------------------------------------------- Chat Completions

TEST(ChatDecode, MinimalRequestGetsDefaults) {
  GenerationRequest r = chat_ok(R"({"model":"deepseek-flash","messages":[
      {"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]})");
  EXPECT_EQ(r.model, "deepseek-flash");
  ASSERT_EQ(r.conversation.messages.size(), 2u);
  EXPECT_EQ(r.conversation.messages[0].role, Role::kSystem);
  EXPECT_EQ(r.conversation.messages[0].content, "Be brief.");
  EXPECT_EQ(r.conversation.messages[1].role, Role::kUser);
  EXPECT_EQ(r.conversation.messages[1].content, "Hi");
  EXPECT_EQ(r.conversation.thinking, ThinkingMode::kThinking);
  EXPECT_EQ(r.conversation.effort, ReasoningEffort::kHigh);
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kNone);
  EXPECT_FALSE(r.sampling.max_tokens.has_value());
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.n, 1);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
}

TEST(ChatDecode, ThinkingDisabledUsesTemperatureAndFixesTopP) {
  GenerationRequest r = chat_ok(R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "thinking":{"type":"disabled"},"temperature":0.3,"top_p":0.5})");
  EXPECT_EQ(r.conversation.thinking, ThinkingMode::kChat);
  EXPECT_EQ(r.conversation.effort, ReasoningEffort::kUnset);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.3f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
}

TEST(ChatDecode, ThinkingClampsTopPAndIgnoresTemperature) {
  GenerationRequest r = chat_ok(R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "thinking":{"type":"enabled"},"temperature":0.3,"top_p":0.5})");
  EXPECT_EQ(r.conversation.thinking, ThinkingMode::kThinking);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.95f);
  r = chat_ok(R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_p":0.97})");
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.97f);
  DecodeOptions raw;
  raw.apply_thinking_sampling_rules = false;
  r = chat_ok(R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "temperature":0.3,"top_p":0.5})",
              raw);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.3f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
}

TEST(ChatDecode, EffortAliases) {
  struct Case {
    const char* effort;
    ThinkingMode mode;
    ReasoningEffort effort_out;
  };
  const Case cases[] = {
      {"none", ThinkingMode::kChat, ReasoningEffort::kUnset},
      {"minimal", ThinkingMode::kThinking, ReasoningEffort::kLow},
      {"low", ThinkingMode::kThinking, ReasoningEffort::kLow},
      {"medium", ThinkingMode::kThinking, ReasoningEffort::kHigh},
      {"high", ThinkingMode::kThinking, ReasoningEffort::kHigh},
      {"xhigh", ThinkingMode::kThinking, ReasoningEffort::kHigh},
      {"max", ThinkingMode::kThinking, ReasoningEffort::kMax},
      {"ultra", ThinkingMode::kThinking, ReasoningEffort::kMax},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.effort);
    GenerationRequest r = chat_ok(std::string(R"({"model":"m","messages":[{"role":"user",
        "content":"x"}],"reasoning_effort":")") +
                                  c.effort + "\"}");
    EXPECT_EQ(r.conversation.thinking, c.mode);
    EXPECT_EQ(r.conversation.effort, c.effort_out);
  }
  // thinking.type disabled wins over an effort.
  GenerationRequest r = chat_ok(R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "thinking":{"type":"disabled"},"reasoning_effort":"max"})");
  EXPECT_EQ(r.conversation.thinking, ThinkingMode::kChat);
}

TEST(ChatDecode, DefaultMaxTokens) {
  EXPECT_EQ(default_max_tokens(ThinkingMode::kChat, ReasoningEffort::kUnset), 8192);
  EXPECT_EQ(default_max_tokens(ThinkingMode::kThinking, ReasoningEffort::kHigh), 65536);
  EXPECT_EQ(default_max_tokens(ThinkingMode::kThinking, ReasoningEffort::kLow), 65536);
  EXPECT_EQ(default_max_tokens(ThinkingMode::kThinking, ReasoningEffort::kMax), 131072);
  GenerationRequest r = chat_ok(R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "reasoning_effort":"max"})");
  ApiResult<int64_t> mt = resolve_max_tokens(r, 1000, 1 << 20);
  ASSERT_TRUE(mt.ok());
  EXPECT_EQ(mt.value(), 131072);
  mt = resolve_max_tokens(r, (1 << 20) - 10, 1 << 20);
  ASSERT_TRUE(mt.ok());
  EXPECT_EQ(mt.value(), 10);
  r.sampling.max_tokens = 100;
  mt = resolve_max_tokens(r, (1 << 20) - 10, 1 << 20);
  ASSERT_FALSE(mt.ok());
  EXPECT_EQ(mt.error().param, "max_tokens");
}

// deepseek-recipe's tool line: name, description, parameters (in that order; `strict` dropped).
TEST(ChatDecode, ToolsRenderNameDescriptionParameters) {
  GenerationRequest r = chat_ok(R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "thinking":{"type":"disabled"},
      "tools":[{"type":"function","function":{"name":"get_weather",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},
        "description":"Weather for a city — °C"}}]})");
  ASSERT_EQ(r.conversation.tools.size(), 1u);
  EXPECT_EQ(r.conversation.tools[0].name, "get_weather");
  EXPECT_EQ(r.conversation.tools[0].function_json,
            "{\"name\": \"get_weather\", \"description\": \"Weather for a city — °C\", "
            "\"parameters\": {\"type\": \"object\", \"properties\": "
            "{\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}");
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kAuto);
}

TEST(ChatDecode, ToolChoiceVariants) {
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"a"}},
      {"type":"function","function":{"name":"b"}}])";
  auto body = [&](const std::string& extra) {
    return R"({"model":"m","messages":[{"role":"user","content":"x"}],)" + tools + "," + extra +
           "}";
  };
  GenerationRequest r = chat_ok(body(R"("tool_choice":"none")"));
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kNone);
  r = chat_ok(body(R"("tool_choice":"required","thinking":{"type":"disabled"})"));
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kRequired);
  r = chat_ok(body(
      R"("tool_choice":{"type":"function","function":{"name":"b"}},"reasoning_effort":"none")"));
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(r.conversation.tool_choice_name, "b");
}

TEST(ChatDecode, ToolHistoryAndReasoning) {
  GenerationRequest r = chat_ok(R"({"model":"m","tools":[{"type":"function","function":{
      "name":"get_weather","parameters":{"type":"object"}}}],
      "messages":[
        {"role":"user","content":"Weather in Paris?"},
        {"role":"assistant","content":"","reasoning_content":"Call the tool.","tool_calls":[
          {"id":"call_00_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
          {"id":"call_01_b","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Nice\"}"}}]},
        {"role":"tool","tool_call_id":"call_00_a","content":"Sunny"},
        {"role":"tool","tool_call_id":"call_01_b","content":[{"type":"text","text":"Rain"}]}]})");
  const auto& m = r.conversation.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[1].role, Role::kAssistant);
  ASSERT_TRUE(m[1].reasoning_content.has_value());
  EXPECT_EQ(*m[1].reasoning_content, "Call the tool.");
  ASSERT_EQ(m[1].tool_calls.size(), 2u);
  EXPECT_EQ(m[1].tool_calls[0].id, "call_00_a");
  EXPECT_EQ(m[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(m[1].tool_calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(m[2].role, Role::kTool);
  EXPECT_EQ(m[2].tool_call_id, "call_00_a");
  EXPECT_EQ(m[2].content, "Sunny");
  EXPECT_EQ(m[3].tool_call_id, "call_01_b");
  ASSERT_EQ(m[3].blocks.size(), 1u);
  EXPECT_EQ(m[3].blocks[0].text, "Rain");
}

// deepseek-recipe's default (FillEmpty) accepts a missing reasoning_content and renders it
// empty; require_reasoning_passback gives the official API's 400.
TEST(ChatDecode, ReasoningPassbackCanBeRequired) {
  const std::string body = R"({"model":"m","tools":[{"type":"function","function":{"name":"f"}}],
      "messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},
                  {"role":"user","content":"c"}]})";
  auto ok = decode_chat_request(body, {});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->conversation.messages[1].reasoning_content, "");
  DecodeOptions opts;
  opts.require_reasoning_passback = true;
  EXPECT_FALSE(decode_chat_request(body, opts).ok());
}

TEST(ChatDecode, SamplingFieldsStopSeedLogprobsStream) {
  GenerationRequest r = chat_ok(R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "max_tokens":50,"max_completion_tokens":70,"stop":["END","","\n\n"],"seed":-1,
      "logprobs":true,"top_logprobs":5,"stream":true,"stream_options":{"include_usage":true},
      "frequency_penalty":0.5,"presence_penalty":0,"user_id":"user-1_a","n":1})");
  EXPECT_EQ(r.sampling.max_tokens, 70);
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"END", "\n\n"}));
  ASSERT_TRUE(r.sampling.seed.has_value());
  EXPECT_EQ(*r.sampling.seed, ~uint64_t{0});
  EXPECT_TRUE(r.sampling.logprobs);
  EXPECT_EQ(r.sampling.top_logprobs, 5);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.user, "user-1_a");
  r = chat_ok(R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":"###"})");
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"###"}));
  EXPECT_EQ(r.best_of, 0);
  r = chat_ok(R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":2,"best_of":5})");
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 5);
  // best_of == n streams (nothing to choose).
  r = chat_ok(
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":2,"best_of":2,"stream":true})");
  EXPECT_EQ(r.best_of, 2);
}

TEST(ChatDecode, PrefixCompletion) {
  GenerationRequest r = chat_ok(R"({"model":"m","messages":[{"role":"user","content":"Write"},
      {"role":"assistant","content":"```python\n","prefix":true,"reasoning_content":"ok"}],
      "stop":["```"]})");
  ASSERT_EQ(r.conversation.messages.size(), 2u);
  EXPECT_TRUE(r.conversation.messages[1].prefix);
  EXPECT_EQ(r.conversation.messages[1].content, "```python\n");
  EXPECT_EQ(r.conversation.messages[1].reasoning_content, "ok");
}

TEST(ChatDecode, ContentPartsAndJsonMode) {
  GenerationRequest r = chat_ok(R"({"model":"m","response_format":{"type":"json_object"},
      "messages":[{"role":"system","content":[{"type":"text","text":"Answer in json."}]},
      {"role":"user","content":[{"type":"text","text":"Look:"},
        {"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]})");
  EXPECT_TRUE(r.conversation.json_output);
  const auto& m = r.conversation.messages;
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, Role::kSystem);
  EXPECT_EQ(m[0].content, "Answer in json.");
  ASSERT_EQ(m[1].blocks.size(), 2u);
  EXPECT_EQ(m[1].blocks[0].type, ContentBlock::Type::kText);
  EXPECT_EQ(m[1].blocks[1].type, ContentBlock::Type::kUnsupported);
  EXPECT_EQ(m[1].blocks[1].unsupported_type, "image_url");
}

TEST(ChatDecode, ServedModels) {
  DecodeOptions opts;
  opts.served_models = {"deepseek-flash"};
  EXPECT_TRUE(decode_chat_request(
                  R"({"model":"deepseek-flash","messages":[{"role":"user","content":"x"}]})", opts)
                  .ok());
  ApiResult<GenerationRequest> r =
      decode_chat_request(R"({"model":"gpt-4o","messages":[{"role":"user","content":"x"}]})", opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().param, "model");
  EXPECT_EQ(r.error().code, "model_not_found");
  EXPECT_EQ(r.error().http_status, 404);
  EXPECT_EQ(anthropic_error_type(r.error()), "not_found_error");
}

// ---------------------------------------------------------------- Anthropic Messages

TEST(MessagesDecode, BasicFields) {
  GenerationRequest r = messages_ok(R"({"model":"deepseek-flash","max_tokens":1024,
      "system":"You are terse.","messages":[{"role":"user","content":"Hi"}],
      "stop_sequences":["\n\nHuman:"],"temperature":0.2,"top_k":5,"stream":true,
      "metadata":{"user_id":"u-42"},"thinking":{"type":"disabled"}})");
  EXPECT_EQ(r.sampling.max_tokens, 1024);
  ASSERT_EQ(r.conversation.messages.size(), 2u);
  EXPECT_EQ(r.conversation.messages[0].role, Role::kSystem);
  EXPECT_EQ(r.conversation.messages[0].content, "You are terse.");
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"\n\nHuman:"}));
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.2f);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.user, "u-42");
  EXPECT_EQ(r.conversation.thinking, ThinkingMode::kChat);
}

TEST(MessagesDecode, ThinkingAndEffort) {
  GenerationRequest r = messages_ok(R"({"model":"m","max_tokens":10,
      "messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(r.conversation.thinking, ThinkingMode::kThinking);
  EXPECT_EQ(r.conversation.effort, ReasoningEffort::kHigh);
  r = messages_ok(R"({"model":"m","max_tokens":10,"messages":[{"role":"user","content":"x"}],
      "thinking":{"type":"enabled","budget_tokens":2048},"output_config":{"effort":"max"}})");
  EXPECT_EQ(r.conversation.thinking, ThinkingMode::kThinking);
  EXPECT_EQ(r.conversation.effort, ReasoningEffort::kMax);
  r = messages_ok(R"({"model":"m","max_tokens":10,"messages":[{"role":"user","content":"x"}],
      "thinking":{"type":"adaptive"},"output_config":{"effort":"low"}})");
  EXPECT_EQ(r.conversation.effort, ReasoningEffort::kLow);
}

TEST(MessagesDecode, SystemBlocksAndTools) {
  GenerationRequest r = messages_ok(R"({"model":"claude-sonnet-4-5","max_tokens":100,
      "system":[{"type":"text","text":"A"},{"type":"text","text":"B","cache_control":{"type":"ephemeral"}}],
      "tools":[{"name":"get_weather","description":"Get weather","input_schema":{"type":"object",
        "properties":{"city":{"type":"string"}}},"cache_control":{"type":"ephemeral"}}],
      "messages":[{"role":"user","content":[{"type":"text","text":"Paris?"}]}]})");
  EXPECT_EQ(r.model, "claude-sonnet-4-5");
  EXPECT_EQ(r.conversation.messages[0].content, "A\n\nB");
  ASSERT_EQ(r.conversation.tools.size(), 1u);
  EXPECT_EQ(r.conversation.tools[0].function_json,
            "{\"name\": \"get_weather\", \"description\": \"Get weather\", \"parameters\": "
            "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}");
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kAuto);
}

TEST(MessagesDecode, ToolUseToolResultThinkingHistory) {
  GenerationRequest r = messages_ok(R"({"model":"m","max_tokens":100,
      "tools":[{"name":"get_weather","input_schema":{"type":"object"}}],
      "messages":[
        {"role":"user","content":"Weather?"},
        {"role":"assistant","content":[
          {"type":"thinking","thinking":"Use the tool.","signature":"sig"},
          {"type":"text","text":"Checking."},
          {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris","days":2}},
          {"type":"tool_use","id":"toolu_2","name":"get_weather","input":{}}]},
        {"role":"user","content":[
          {"type":"tool_result","tool_use_id":"toolu_1","content":"Sunny"},
          {"type":"tool_result","tool_use_id":"toolu_2","is_error":true,
           "content":[{"type":"text","text":"a"},{"type":"text","text":"b"},{"type":"image","source":{}}]},
          {"type":"text","text":"Thanks"}]}]})");
  const auto& m = r.conversation.messages;
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1].reasoning_content, "Use the tool.");
  EXPECT_EQ(m[1].content, "Checking.");
  ASSERT_EQ(m[1].tool_calls.size(), 2u);
  EXPECT_EQ(m[1].tool_calls[0].id, "toolu_1");
  EXPECT_EQ(m[1].tool_calls[0].arguments, "{\"city\": \"Paris\", \"days\": 2}");
  EXPECT_EQ(m[1].tool_calls[1].arguments, "{}");
  EXPECT_FALSE(m[1].prefix);
  ASSERT_EQ(m[2].blocks.size(), 3u);
  EXPECT_EQ(m[2].blocks[0].type, ContentBlock::Type::kToolResult);
  EXPECT_EQ(m[2].blocks[0].tool_use_id, "toolu_1");
  EXPECT_EQ(m[2].blocks[0].text, "Sunny");
  EXPECT_EQ(m[2].blocks[1].text, "a\n\nb\n\n[Unsupported image]");
  EXPECT_EQ(m[2].blocks[2].type, ContentBlock::Type::kText);
  EXPECT_EQ(m[2].blocks[2].text, "Thanks");
}

// deepseek-recipe: a final assistant message is a complete turn, not a prefill.
TEST(MessagesDecode, FinalAssistantIsNotAPrefill) {
  GenerationRequest r = messages_ok(R"({"model":"m","max_tokens":10,"messages":[
      {"role":"user","content":"JSON please"},{"role":"assistant","content":"{"}]})");
  ASSERT_EQ(r.conversation.messages.size(), 2u);
  EXPECT_FALSE(r.conversation.messages[1].prefix);
  EXPECT_EQ(r.conversation.messages[1].content, "{");
}

TEST(MessagesDecode, ToolChoiceMapping) {
  const std::string base = R"({"model":"m","max_tokens":10,"thinking":{"type":"disabled"},
      "tools":[{"name":"a","input_schema":{}},{"name":"b","input_schema":{}}],
      "messages":[{"role":"user","content":"x"}],)";
  // `any` renders as `auto` (deepseek-recipe).
  GenerationRequest r = messages_ok(base + R"("tool_choice":{"type":"any"}})");
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kAuto);
  r = messages_ok(base + R"("tool_choice":{"type":"tool","name":"b"}})");
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(r.conversation.tool_choice_name, "b");
  r = messages_ok(base + R"("tool_choice":{"type":"none"}})");
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kNone);
  r = messages_ok(base + R"("tool_choice":{"type":"auto","disable_parallel_tool_use":true}})");
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kAuto);
  // Thinking mode: `any` is accepted too; a named tool is not.
  std::string thinking = base;
  thinking.replace(thinking.find("disabled"), 8, "enabled");
  r = messages_ok(thinking + R"("tool_choice":{"type":"any"}})");
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kAuto);
  EXPECT_FALSE(
      decode_messages_request(thinking + R"("tool_choice":{"type":"tool","name":"b"}})", {}).ok());
}

TEST(MessagesDecode, ClaudeNamesAcceptedWhenServingOtherModels) {
  DecodeOptions opts;
  opts.served_models = {"deepseek-flash"};
  const char* tail = R"(","max_tokens":5,"messages":[{"role":"user","content":"x"}]})";
  EXPECT_TRUE(decode_messages_request(std::string(R"({"model":"claude-opus-4)") + tail, opts).ok());
  EXPECT_FALSE(decode_messages_request(std::string(R"({"model":"gpt-4)") + tail, opts).ok());
}

// ---------------------------------------------------------------- Responses

TEST(ResponsesDecode, StringInputAndInstructions) {
  GenerationRequest r = responses_ok(R"({"model":"m","instructions":"Be nice.","input":"Hi",
      "max_output_tokens":256,"temperature":0.5,"user":"u1","stream":true})");
  const auto& m = r.conversation.messages;
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, Role::kSystem);
  EXPECT_EQ(m[0].content, "Be nice.");
  EXPECT_EQ(m[1].role, Role::kUser);
  EXPECT_EQ(m[1].content, "Hi");
  EXPECT_EQ(r.sampling.max_tokens, 256);
  EXPECT_EQ(r.user, "u1");
  EXPECT_TRUE(r.stream);
  // Instructions alone are enough.
  responses_ok(R"({"model":"m","instructions":"Say hi."})");
}

TEST(ResponsesDecode, ItemsMergeIntoAssistantMessages) {
  GenerationRequest r = responses_ok(R"({"model":"m",
      "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}},
               {"type":"web_search"}],
      "input":[
        {"role":"developer","content":"Use tools."},
        {"type":"message","role":"user","content":[{"type":"input_text","text":"Weather?"}]},
        {"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"Call it."}]},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking."}]},
        {"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
        {"type":"function_call","call_id":"c2","name":"get_weather","arguments":"{}"},
        {"type":"function_call_output","call_id":"c1","output":"Sunny"},
        {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"Rain"}]},
        {"type":"web_search_call","id":"ws_1"},
        {"type":"reasoning","content":[{"type":"reasoning_text","text":"Done."}]},
        {"type":"message","role":"assistant","content":"Sunny in Paris."},
        {"role":"user","content":"Thanks"}]})");
  const auto& m = r.conversation.messages;
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(m[0].role, Role::kUser);  // developer -> user
  EXPECT_EQ(m[0].content, "Use tools.");
  EXPECT_EQ(m[1].role, Role::kUser);
  ASSERT_EQ(m[1].blocks.size(), 1u);
  EXPECT_EQ(m[2].role, Role::kAssistant);
  EXPECT_EQ(m[2].reasoning_content, "Call it.");
  EXPECT_EQ(m[2].content, "Checking.");
  ASSERT_EQ(m[2].tool_calls.size(), 2u);
  EXPECT_EQ(m[2].tool_calls[0].id, "c1");
  EXPECT_EQ(m[2].tool_calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(m[3].role, Role::kTool);
  EXPECT_EQ(m[3].tool_call_id, "c1");
  EXPECT_EQ(m[3].content, "Sunny");
  EXPECT_EQ(m[4].tool_call_id, "c2");
  ASSERT_EQ(m[4].blocks.size(), 1u);
  EXPECT_EQ(m[4].blocks[0].text, "Rain");
  EXPECT_EQ(m[5].role, Role::kAssistant);
  EXPECT_EQ(m[5].reasoning_content, "Done.");
  EXPECT_EQ(m[5].content, "Sunny in Paris.");
  EXPECT_EQ(m[6].content, "Thanks");
  ASSERT_EQ(r.conversation.tools.size(), 1u);  // web_search ignored
  EXPECT_EQ(r.conversation.tools[0].function_json,
            "{\"name\": \"get_weather\", \"description\": \"\", \"parameters\": {\"type\": "
            "\"object\"}}");
}

TEST(ResponsesDecode, ToolSpecOrderAndStrict) {
  GenerationRequest r = responses_ok(R"({"model":"m","input":"x",
      "tools":[{"type":"function","strict":true,"parameters":{"type":"object"},"description":"D","name":"f"}]})");
  ASSERT_EQ(r.conversation.tools.size(), 1u);
  // The strict schema is normalised (deepseek-recipe).
  EXPECT_EQ(r.conversation.tools[0].function_json,
            "{\"name\": \"f\", \"description\": \"D\", \"parameters\": {\"type\": \"object\", "
            "\"properties\": {}, \"additionalProperties\": false, \"required\": []}}");
}

TEST(ResponsesDecode, ReasoningEffortAndTextFormat) {
  GenerationRequest r = responses_ok(R"({"model":"m","input":"x","reasoning":{"effort":"none"}})");
  EXPECT_EQ(r.conversation.thinking, ThinkingMode::kChat);
  r = responses_ok(R"({"model":"m","input":"x","reasoning":{"effort":"xhigh","summary":"auto"}})");
  EXPECT_EQ(r.conversation.thinking, ThinkingMode::kThinking);
  EXPECT_EQ(r.conversation.effort, ReasoningEffort::kHigh);
  r = responses_ok(R"({"model":"m","input":"x","text":{"format":{"type":"json_schema",
      "name":"out","schema":{"type":"object"}},"verbosity":"low"}})");
  EXPECT_TRUE(r.conversation.json_output);
  // The schema is rendered, not the format object (deepseek-recipe).
  EXPECT_EQ(r.conversation.response_format_json, "{\"type\": \"object\"}");
  r = responses_ok(R"({"model":"m","input":"x json","text":{"format":{"type":"json_object"}},
      "top_logprobs":3,"tool_choice":"auto","parallel_tool_calls":false})");
  EXPECT_TRUE(r.conversation.json_output);
  EXPECT_FALSE(r.conversation.response_format_json.has_value());
  EXPECT_EQ(r.sampling.top_logprobs, 3);
}

// parallel_tool_calls (Chat, Responses) and Messages' tool_choice.disable_parallel_tool_use: at
// most one tool call per turn when parallel calls are off; a value that is not a boolean is a 400
// naming the field. The Responses object echoes the value.
TEST(Decode, ParallelToolCalls) {
  const std::string tools_chat =
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
      "function":{"name":"f","parameters":{}}}])";
  EXPECT_TRUE(chat_ok(tools_chat + "}").parallel_tool_calls);
  EXPECT_TRUE(chat_ok(tools_chat + R"(,"parallel_tool_calls":true})").parallel_tool_calls);
  EXPECT_FALSE(chat_ok(tools_chat + R"(,"parallel_tool_calls":false})").parallel_tool_calls);
  for (const char* bad : {R"("no")", "0", "1", "[]", "{}"}) {
    auto r = decode_chat_request(tools_chat + R"(,"parallel_tool_calls":)" + bad + "}", {});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().http_status, 400);
    EXPECT_EQ(r.error().param, "parallel_tool_calls") << bad;
  }

  const std::string resp = R"({"model":"m","input":"x","tools":[{"type":"function","name":"f",
      "parameters":{}}])";
  EXPECT_TRUE(responses_ok(resp + "}").parallel_tool_calls);
  GenerationRequest r = responses_ok(resp + R"(,"parallel_tool_calls":false})");
  EXPECT_FALSE(r.parallel_tool_calls);
  auto bad = decode_responses_request(resp + R"(,"parallel_tool_calls":"false"})", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().param, "parallel_tool_calls");
  EXPECT_EQ(bad.error().http_status, 400);
  recipe::OutputEvent fin;
  fin.type = recipe::OutputEvent::Type::kFinish;
  for (bool parallel : {true, false}) {
    r.parallel_tool_calls = parallel;
    const std::string body = build_responses_response(r, ResponseMeta{}, {fin}, recipe::Usage{});
    auto j = nlohmann::json::parse(body);
    EXPECT_EQ(j["parallel_tool_calls"], parallel) << body;
  }

  const std::string msgs = R"({"model":"m","max_tokens":5,"messages":[{"role":"user",
      "content":"x"}],"tools":[{"name":"f","input_schema":{}}],)";
  EXPECT_TRUE(messages_ok(msgs + R"("tool_choice":{"type":"auto"}})").parallel_tool_calls);
  EXPECT_TRUE(messages_ok(msgs + R"("tool_choice":{"type":"auto",
      "disable_parallel_tool_use":false}})")
                  .parallel_tool_calls);
  EXPECT_FALSE(messages_ok(msgs + R"("tool_choice":{"type":"any",
      "disable_parallel_tool_use":true}})")
                   .parallel_tool_calls);
  auto mbad = decode_messages_request(
      msgs + R"("tool_choice":{"type":"auto","disable_parallel_tool_use":"yes"}})", {});
  ASSERT_FALSE(mbad.ok());
  EXPECT_EQ(mbad.error().http_status, 400);
  EXPECT_NE(mbad.error().param.find("disable_parallel_tool_use"), std::string::npos)
      << mbad.error().param;
}

TEST(Decode, TopLogprobsBoundIsConfigurable) {
  const std::string chat =
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,)";
  auto r = decode_chat_request(chat + R"("top_logprobs":21})", {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().param, "top_logprobs");
  EXPECT_EQ(r.error().http_status, 400);
  EXPECT_NE(r.error().message.find("20"), std::string::npos);
  EXPECT_FALSE(decode_chat_request(chat + R"("top_logprobs":-1})", {}).ok());
  DecodeOptions opts;
  opts.max_top_logprobs = 50;
  EXPECT_EQ(chat_ok(chat + R"("top_logprobs":50})", opts).sampling.top_logprobs, 50);
  EXPECT_FALSE(decode_chat_request(chat + R"("top_logprobs":51})", opts).ok());
  auto resp = decode_responses_request(R"({"model":"m","input":"x","top_logprobs":21})", {});
  ASSERT_FALSE(resp.ok());
  EXPECT_EQ(resp.error().param, "top_logprobs");
}

TEST(ResponsesDecode, IncludeOutputTextLogprobs) {
  GenerationRequest r =
      responses_ok(R"({"model":"m","input":"x","include":["message.output_text.logprobs"]})");
  EXPECT_TRUE(r.sampling.logprobs);
  EXPECT_EQ(r.sampling.top_logprobs, 0);
  r = responses_ok(R"({"model":"m","input":"x","include":["reasoning.encrypted_content"]})");
  EXPECT_FALSE(r.sampling.logprobs);
  auto bad = decode_responses_request(R"({"model":"m","input":"x","include":["nope"]})", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().param, "include[0]");
  EXPECT_FALSE(decode_responses_request(R"({"model":"m","input":"x","include":[1]})", {}).ok());
}

// deepseek-recipe's cross-field rules.
TEST(ChatDecode, RecipeCrossFieldRules) {
  const std::string strict_tool =
      R"("tools":[{"type":"function","function":{"name":"f","strict":true,"parameters":{
      "type":"object","properties":{"a":{"type":"string"}},"required":["a"],
      "additionalProperties":false}}}])";
  const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
  auto chat = [](const std::string& body) { return decode_chat_request(body, {}); };
  // A response format (even text) with an offered strict tool.
  EXPECT_FALSE(
      chat(R"({"model":"m",)" + msgs + "," + strict_tool + R"(,"response_format":{"type":"text"}})")
          .ok());
  EXPECT_TRUE(chat(R"({"model":"m",)" + msgs + "," + strict_tool +
                   R"(,"response_format":{"type":"text"},"tool_choice":"none"})")
                  .ok());
  EXPECT_TRUE(chat(R"({"model":"m",)" + msgs + "," + strict_tool + "}").ok());
  // json_object needs "json" in message text, any case; reasoning does not count.
  EXPECT_TRUE(chat(R"({"model":"m","messages":[{"role":"system","content":"Reply in JSON"},
      {"role":"user","content":"x"}],"response_format":{"type":"json_object"}})")
                  .ok());
  EXPECT_FALSE(chat(R"({"model":"m","messages":[{"role":"user","content":"x"},
      {"role":"assistant","content":"a","reasoning_content":"json"},{"role":"user","content":"y"}],
      "response_format":{"type":"json_object"}})")
                   .ok());
  // json_schema renders its schema.
  auto r = chat(R"({"model":"m",)" + msgs +
                R"(,"response_format":{"type":"json_schema","json_schema":{"name":"o",
                "schema":{"type":"object"}}}})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().conversation.response_format_json, "{\"type\": \"object\"}");
  // A prefix with tool calls in the history.
  EXPECT_FALSE(chat(R"({"model":"m","messages":[{"role":"user","content":"x"},
      {"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function",
      "function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"},
      {"role":"assistant","content":"p","prefix":true}]})")
                   .ok());
  // Explicitly enabled thinking ignores effort "none".
  r = chat(R"({"model":"m",)" + msgs +
           R"(,"thinking":{"type":"enabled"},"reasoning_effort":"none"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().conversation.thinking, ThinkingMode::kThinking);
}

// strict tools: deepseek-recipe's normalised schema (key order, unsupported keywords dropped) and
// its schema errors; tool_choice none skips them (the tools are not offered).
TEST(ChatDecode, StrictToolSchemaNormalised) {
  auto tools = [](const std::string& params, const std::string& extra = "") {
    return R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",
        "function":{"name":"f","strict":true)" +
           (params.empty() ? std::string() : ",\"parameters\":" + params) + "}}]" + extra + "}";
  };
  GenerationRequest r = chat_ok(tools(R"({"required":["a","n"],"additionalProperties":false,
      "properties":{"a":{"description":"D","default":"x","minItems":1,"type":"array",
      "items":{"type":"string","format":"email","title":"t","description":"E"}},
      "n":{"default":3,"minimum":1,"type":"integer"}},"type":"object"})"));
  ASSERT_EQ(r.conversation.tools.size(), 1u);
  EXPECT_TRUE(r.conversation.tools[0].strict);
  EXPECT_EQ(r.conversation.tools[0].function_json,
            "{\"name\": \"f\", \"description\": \"\", \"parameters\": {\"type\": \"object\", "
            "\"properties\": {\"a\": {\"type\": \"array\", \"items\": {\"type\": \"string\", "
            "\"description\": \"E\", \"format\": \"email\"}, \"description\": \"D\"}, \"n\": "
            "{\"type\": \"integer\", \"minimum\": 1, \"default\": 3}}, \"additionalProperties\": "
            "false, \"required\": [\"a\", \"n\"]}}");
  r = chat_ok(tools(""));
  EXPECT_EQ(r.conversation.tools[0].function_json,
            "{\"name\": \"f\", \"description\": \"\", \"parameters\": {\"type\": \"object\", "
            "\"properties\": {}, \"additionalProperties\": false, \"required\": []}}");
  const std::string date_time =
      R"({"type":"object","properties":{"d":{"type":"string","format":"date-time"}},
      "required":["d"],"additionalProperties":false})";
  EXPECT_FALSE(decode_chat_request(tools(date_time), {}).ok());
  EXPECT_TRUE(decode_chat_request(tools(date_time, R"(,"tool_choice":"none")"), {}).ok());
  EXPECT_FALSE(decode_chat_request(tools(R"({"type":"object","properties":{"a":{"enum":[1]}},
      "required":["a"],"additionalProperties":false})"),
                                   {})
                   .ok());
  EXPECT_FALSE(decode_chat_request(tools(R"({"type":"object","properties":{"a":{"type":"string"}},
      "required":[],"additionalProperties":false})"),
                                   {})
                   .ok());
}

TEST(ResponsesDecode, NamedToolChoiceWithoutThinking) {
  GenerationRequest r = responses_ok(R"({"model":"m","input":"x","reasoning":{"effort":"none"},
      "tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"}})");
  EXPECT_EQ(r.conversation.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(r.conversation.tool_choice_name, "f");
}

}  // namespace
}  // namespace dsinfer::api

namespace dsinfer::api {
namespace {

// The fuzz seed corpora are valid requests (so the fuzzers start from accepted inputs).
TEST(FuzzCorpus, SeedsDecode) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(DSI_SOURCE_DIR) / "tests/fuzz/corpus";
  int seen = 0;
  for (const char* dir : {"api_chat_fuzz", "api_messages_fuzz", "api_responses_fuzz"}) {
    if (!fs::exists(root / dir))
      continue;
    for (const fs::directory_entry& f : fs::directory_iterator(root / dir)) {
      std::ifstream in(f.path(), std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string body = ss.str();
      SCOPED_TRACE(f.path().string());
      std::optional<ApiError> err;
      if (std::string(dir) == "api_chat_fuzz") {
        auto r = decode_chat_request(body, {});
        if (!r.ok())
          err = r.error();
      } else if (std::string(dir) == "api_messages_fuzz") {
        auto r = decode_messages_request(body, {});
        if (!r.ok())
          err = r.error();
      } else {
        auto r = decode_responses_request(body, {});
        if (!r.ok())
          err = r.error();
      }
      EXPECT_FALSE(err.has_value()) << err->message;
      ++seen;
    }
  }
  EXPECT_GE(seen, 9);
}

// Structured outputs: response_format / text.format / vLLM's extensions become one constraint.
TEST(ChatDecode, StructuredOutputConstraints) {
  using Kind = recipe::OutputConstraint::Kind;
  const std::string msgs = R"("messages":[{"role":"user","content":"json please"}])";
  GenerationRequest r =
      chat_ok(R"({"model":"m",)" + msgs + R"(,"response_format":{"type":"json_object"}})");
  EXPECT_EQ(r.constraint.kind, Kind::kJsonObject);
  EXPECT_EQ(r.constraint.param, "response_format");
  r = chat_ok(R"({"model":"m",)" + msgs +
              R"(,"response_format":{"type":"json_schema","json_schema":{"name":"a",
              "schema":{"type":"object"},"strict":true}}})");
  EXPECT_EQ(r.constraint.kind, Kind::kJsonSchema);
  EXPECT_EQ(r.constraint.text, R"({"type": "object"})");
  r = chat_ok(R"({"model":"m",)" + msgs + R"(,"guided_regex":"[0-9]+"})");
  EXPECT_EQ(r.constraint.kind, Kind::kRegex);
  EXPECT_EQ(r.constraint.text, "[0-9]+");
  EXPECT_EQ(r.constraint.param, "guided_regex");
  r = chat_ok(R"({"model":"m",)" + msgs + R"(,"structured_outputs":{"grammar":"root ::= \"a\""}})");
  EXPECT_EQ(r.constraint.kind, Kind::kGrammar);
  EXPECT_EQ(r.constraint.text, R"(root ::= "a")");
  EXPECT_EQ(r.constraint.param, "structured_outputs.grammar");
  r = chat_ok(R"({"model":"m",)" + msgs + R"(,"guided_json":{"type":"integer"}})");
  EXPECT_EQ(r.constraint.kind, Kind::kJsonSchema);
  EXPECT_EQ(r.constraint.text, R"({"type":"integer"})");
  r = chat_ok(R"({"model":"m",)" + msgs + R"(,"guided_json":"{\"type\":\"integer\"}"})");
  EXPECT_EQ(r.constraint.text, R"({"type":"integer"})");
  r = chat_ok(R"({"model":"m",)" + msgs + "}");
  EXPECT_EQ(r.constraint.kind, Kind::kNone);
  // One constraint per request; wrong types.
  for (const std::string extra : {R"("guided_regex":"a","guided_json":{}})",
                                  R"("guided_regex":5})",
                                  R"("structured_outputs":{"regex":"a","grammar":"b"}})",
                                  R"("response_format":{"type":"json_object"},"guided_regex":"a"})",
                                  R"("structured_outputs":"x"})"}) {
    auto e = decode_chat_request(R"({"model":"m",)" + msgs + "," + extra, DecodeOptions{});
    ASSERT_FALSE(e.ok()) << extra;
    EXPECT_EQ(e.error().http_status, 400) << extra;
  }
}

TEST(ResponsesDecode, TextFormatConstraint) {
  GenerationRequest r = responses_ok(R"({"model":"m","input":"json","text":{"format":{
      "type":"json_schema","name":"x","schema":{"type":"object"}}}})");
  EXPECT_EQ(r.constraint.kind, recipe::OutputConstraint::Kind::kJsonSchema);
  EXPECT_EQ(r.constraint.param, "text.format");
  r = responses_ok(R"({"model":"m","input":"json","text":{"format":{"type":"json_object"}}})");
  EXPECT_EQ(r.constraint.kind, recipe::OutputConstraint::Kind::kJsonObject);
}

}  // namespace
}  // namespace dsinfer::api
