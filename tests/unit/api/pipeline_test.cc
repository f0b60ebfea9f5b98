// End to end through the recipe layer, per protocol: request JSON -> prompt (render_prompt), and
// model text -> OutputParser events -> response JSON / SSE.
#include <gtest/gtest.h>

#include "api/chat.h"
#include "api/messages.h"
#include "api/responses.h"
#include "api_test_util.h"
#include "recipe/encoder.h"
#include "recipe/output_parser.h"
#include "recipe/tokens.h"

namespace dsinfer::api {
namespace {

using recipe::GenerationRequest;
using recipe::ModelVersion;
using recipe::OutputEvent;
using testing::Json;
using testing::parse;
using testing::parse_sse;

constexpr ModelVersion kV = ModelVersion::kV40731;

bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}
bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string prompt_of(const GenerationRequest& req) {
  Result<std::string> p = recipe::render_prompt(req.conversation, kV);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? p.value() : std::string();
}

// The model's raw text for: reasoning, answer, one get_weather(city=Paris) call.
std::string model_text_with_tool_call() {
  recipe::ToolCall call;
  call.name = "get_weather";
  call.arguments = "{\"city\": \"Paris\"}";
  return "I should call the tool.</think>Checking the weather.\n\n" +
         recipe::render_tool_calls({call}, kV) + std::string(recipe::tok::kEos);
}

std::vector<OutputEvent> parse_output(const GenerationRequest& req, const std::string& text) {
  recipe::OutputParserOptions po = recipe::parser_options_for(req.conversation, kV);
  po.stop_sequences = req.sampling.stop;
  recipe::OutputParser parser(po);
  // Feed in small pieces, as a stream would arrive.
  std::vector<OutputEvent> events;
  for (size_t i = 0; i < text.size(); i += 7) {
    for (OutputEvent& e : parser.feed(std::string_view(text).substr(i, 7))) {
      events.push_back(std::move(e));
    }
  }
  for (OutputEvent& e : parser.finish(recipe::FinishReason::kStop)) events.push_back(std::move(e));
  return events;
}

recipe::Usage usage() {
  recipe::Usage u;
  u.prompt_tokens = 50;
  u.completion_tokens = 40;
  u.reasoning_tokens = 6;
  return u;
}

TEST(Pipeline, ChatWithToolsAndThinking) {
  ApiResult<GenerationRequest> r = decode_chat_request(R"({"model":"deepseek-flash",
      "messages":[{"role":"system","content":"You are helpful."},
                  {"role":"user","content":"Weather in Paris?"}],
      "tools":[{"type":"function","function":{"name":"get_weather","description":"Weather",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
      "stream":true})",
                                                       {});
  ASSERT_TRUE(r.ok()) << r.error().message;
  const GenerationRequest& req = r.value();
  std::string prompt = prompt_of(req);
  EXPECT_TRUE(contains(prompt, "You are helpful.\n\n## Tools")) << prompt;
  EXPECT_TRUE(contains(prompt, req.conversation.tools[0].function_json));
  EXPECT_TRUE(contains(prompt, "Weather in Paris?"));
  EXPECT_TRUE(ends_with(prompt, std::string(recipe::tok::kAssistant) + "<think>")) << prompt;

  std::vector<OutputEvent> events = parse_output(req, model_text_with_tool_call());
  ChatStreamEncoder enc(req, ResponseMeta{});
  std::string sse = enc.start();
  for (const OutputEvent& e : events) sse += enc.add(e);
  sse += enc.finish(usage());
  auto frames = parse_sse(sse);
  EXPECT_EQ(frames.back().data, "[DONE]");
  EXPECT_EQ(frames[frames.size() - 2].json["choices"][0]["finish_reason"], "tool_calls");
  Json body = parse(build_chat_response(req, ResponseMeta{}, events, usage()));
  const Json& msg = body["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "I should call the tool.");
  EXPECT_EQ(msg["content"], "Checking the weather.");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            Json({{"city", "Paris"}}));

  // Round trip: the response message goes back as history with the tool result.
  Json next = Json::parse(R"({"model":"deepseek-flash","messages":[
      {"role":"user","content":"Weather in Paris?"}],
      "tools":[{"type":"function","function":{"name":"get_weather"}}]})");
  next["messages"].push_back(msg);
  next["messages"].push_back(
      {{"role", "tool"}, {"tool_call_id", msg["tool_calls"][0]["id"]}, {"content", "Sunny, 21°C"}});
  ApiResult<GenerationRequest> r2 = decode_chat_request(next.dump(), {});
  ASSERT_TRUE(r2.ok()) << r2.error().message;
  std::string prompt2 = prompt_of(r2.value());
  EXPECT_TRUE(contains(prompt2, "I should call the tool.</think>Checking the weather.")) << prompt2;
  EXPECT_TRUE(contains(prompt2, "<tool_result>Sunny, 21°C</tool_result>")) << prompt2;
}

TEST(Pipeline, ChatNonThinkingStopSequence) {
  ApiResult<GenerationRequest> r = decode_chat_request(R"({"model":"m",
      "messages":[{"role":"user","content":"Count"}],"thinking":{"type":"disabled"},
      "stop":["4"]})",
                                                       {});
  ASSERT_TRUE(r.ok());
  std::string prompt = prompt_of(r.value());
  EXPECT_TRUE(ends_with(prompt, std::string(recipe::tok::kAssistant) + "</think>")) << prompt;
  std::vector<OutputEvent> events = parse_output(r.value(), "1 2 3 4 5");
  Json body = parse(build_chat_response(r.value(), ResponseMeta{}, events, usage()));
  EXPECT_EQ(body["choices"][0]["message"]["content"], "1 2 3 ");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  Json anth = parse(build_messages_response(r.value(), ResponseMeta{}, events, usage()));
  EXPECT_EQ(anth["stop_reason"], "stop_sequence");
  EXPECT_EQ(anth["stop_sequence"], "4");
}

TEST(Pipeline, MessagesWithToolResultsAndFinalAssistant) {
  ApiResult<GenerationRequest> r = decode_messages_request(R"({"model":"claude-sonnet-4-5",
      "max_tokens":512,"system":"Sys.",
      "tools":[{"name":"get_weather","input_schema":{"type":"object"}}],
      "messages":[
        {"role":"user","content":"Weather?"},
        {"role":"assistant","content":[{"type":"thinking","thinking":"Call.","signature":""},
          {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"Sunny"}]}],
      "stream":true})",
                                                           {});
  ASSERT_TRUE(r.ok()) << r.error().message;
  std::string prompt = prompt_of(r.value());
  EXPECT_TRUE(contains(prompt, "Sys.\n\n## Tools")) << prompt;
  EXPECT_TRUE(contains(prompt, "Call.</think>")) << prompt;
  EXPECT_TRUE(contains(prompt, "name=\"get_weather\"")) << prompt;
  EXPECT_TRUE(contains(prompt, "<tool_result>Sunny</tool_result>")) << prompt;
  EXPECT_TRUE(ends_with(prompt, "<think>")) << prompt;

  std::vector<OutputEvent> events = parse_output(r.value(), "Done.</think>It is sunny.");
  MessagesStreamEncoder enc(r.value(), ResponseMeta{});
  std::string sse = enc.start(usage());
  for (const OutputEvent& e : events) sse += enc.add(e);
  sse += enc.finish(usage());
  auto frames = parse_sse(sse);
  EXPECT_EQ(frames.back().event, "message_stop");
  Json body = parse(enc.response_json(usage()));
  EXPECT_EQ(body["model"], "claude-sonnet-4-5");
  ASSERT_EQ(body["content"].size(), 2u);
  EXPECT_EQ(body["content"][0]["thinking"], "Done.");
  EXPECT_EQ(body["content"][1]["text"], "It is sunny.");
  EXPECT_EQ(body["stop_reason"], "end_turn");

  // A final assistant message is a complete turn (deepseek-recipe), not a prefill: EOS, then a
  // new generation prompt.
  ApiResult<GenerationRequest> p = decode_messages_request(R"({"model":"m","max_tokens":9,
      "thinking":{"type":"disabled"},
      "messages":[{"role":"user","content":"JSON"},{"role":"assistant","content":"{\"a\":"}]})",
                                                           {});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(
      ends_with(prompt_of(p.value()), "{\"a\":<｜end▁of▁sentence｜><｜Assistant｜></think>"))
      << prompt_of(p.value());
}

TEST(Pipeline, ResponsesWithFunctionCallHistory) {
  ApiResult<GenerationRequest> r = decode_responses_request(R"({"model":"deepseek-flash",
      "instructions":"Be exact.",
      "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],
      "input":[{"role":"user","content":"Weather?"},
        {"type":"reasoning","content":[{"type":"reasoning_text","text":"Call."}]},
        {"type":"function_call","call_id":"call_00_x","name":"get_weather","arguments":"{\"city\": \"Paris\"}"},
        {"type":"function_call_output","call_id":"call_00_x","output":"Sunny"}],
      "stream":true})",
                                                            {});
  ASSERT_TRUE(r.ok()) << r.error().message;
  std::string prompt = prompt_of(r.value());
  EXPECT_TRUE(contains(prompt, "Be exact.\n\n## Tools")) << prompt;
  EXPECT_TRUE(contains(prompt, "Call.</think>")) << prompt;
  EXPECT_TRUE(contains(prompt, "<tool_result>Sunny</tool_result>")) << prompt;

  std::vector<OutputEvent> events = parse_output(r.value(), model_text_with_tool_call());
  ResponsesStreamEncoder enc(r.value(), ResponseMeta{});
  std::string sse = enc.start();
  for (const OutputEvent& e : events) sse += enc.add(e);
  sse += enc.finish(usage());
  auto frames = parse_sse(sse);
  EXPECT_EQ(frames.back().event, "response.completed");
  const Json& resp = frames.back().json["response"];
  ASSERT_EQ(resp["output"].size(), 3u);
  EXPECT_EQ(resp["output"][0]["type"], "reasoning");
  EXPECT_EQ(resp["output"][1]["type"], "message");
  EXPECT_EQ(resp["output"][1]["content"][0]["text"], "Checking the weather.");
  EXPECT_EQ(resp["output"][2]["type"], "function_call");
  EXPECT_EQ(resp["output"][2]["name"], "get_weather");
  EXPECT_EQ(parse(resp["output"][2]["arguments"].get<std::string>()), Json({{"city", "Paris"}}));
}

}  // namespace
}  // namespace dsinfer::api
