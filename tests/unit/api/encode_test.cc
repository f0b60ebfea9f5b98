// Events -> responses: streaming (SSE) and non-streaming bodies for the three protocols,
// checked structurally and against golden SSE transcripts (tests/fixtures/api/*.sse; set
// DSI_UPDATE_GOLDEN=1 to rewrite them).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "api/chat.h"
#include "api/messages.h"
#include "api/responses.h"
#include "api_test_util.h"

namespace dsinfer::api {
namespace {

using recipe::FinishReason;
using recipe::GenerationRequest;
using recipe::OutputEvent;
using namespace testing;  // NOLINT

ResponseMeta test_meta() {
  ResponseMeta m;
  m.id = "";
  m.created = 1753000000;
  m.model = "deepseek-flash";
  m.seed = 42;
  return m;
}

GenerationRequest tools_request() {
  GenerationRequest r;
  r.model = "deepseek-flash";
  r.conversation.tools = {{"get_weather", "{\"name\": \"get_weather\", \"parameters\": {}}"},
                          {"get_time", "{\"name\": \"get_time\"}"}};
  r.conversation.tool_choice = recipe::ToolChoice::kAuto;
  r.conversation.effort = recipe::ReasoningEffort::kHigh;
  r.sampling.max_tokens = 1000;
  return r;
}

template <typename Enc>
std::string run_stream(Enc& enc,
                       const std::vector<OutputEvent>& events,
                       const recipe::Usage& usage) {
  std::string out;
  if constexpr (std::is_same_v<Enc, MessagesStreamEncoder>) {
    out += enc.start(usage);
  } else {
    out += enc.start();
  }
  for (const OutputEvent& e : events) out += enc.add(e);
  out += enc.finish(usage);
  return out;
}

void check_golden(const std::string& name, const std::string& actual) {
  const std::string path = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/api/" + name;
  if (std::getenv("DSI_UPDATE_GOLDEN")) {
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << "missing golden " << path << " (run with DSI_UPDATE_GOLDEN=1)";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(actual, ss.str()) << "golden mismatch: " << name;
}

// ---------------------------------------------------------------- Chat Completions

TEST(ChatEncode, StreamChunksReasoningContentToolCallsUsage) {
  GenerationRequest req = tools_request();
  req.stream = true;
  ChatStreamEncoder enc(req, test_meta());
  std::string sse = run_stream(enc, thinking_tools_events(), sample_usage());
  std::vector<SseFrame> frames = parse_sse(sse);
  ASSERT_GE(frames.size(), 3u);
  EXPECT_EQ(frames.back().data, "[DONE]");
  frames.pop_back();
  const std::string id = frames[0].json["id"];
  for (const SseFrame& f : frames) {
    EXPECT_TRUE(f.event.empty());
    EXPECT_EQ(f.json["object"], "chat.completion.chunk");
    EXPECT_EQ(f.json["id"], id);
    EXPECT_EQ(f.json["model"], "deepseek-flash");
    EXPECT_EQ(f.json["created"], 1753000000);
    ASSERT_EQ(f.json["choices"].size(), 1u);
  }
  // First chunk: role + empty content.
  EXPECT_EQ(frames[0].json["choices"][0]["delta"], Json({{"role", "assistant"}, {"content", ""}}));
  // Reconstruct.
  std::string reasoning, content;
  std::map<int, Json> calls;
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    const Json& ch = frames[i].json["choices"][0];
    EXPECT_TRUE(ch["finish_reason"].is_null());
    EXPECT_FALSE(frames[i].json.contains("usage"));  // include_usage off
    const Json& d = ch["delta"];
    if (d.contains("reasoning_content") && d["reasoning_content"].is_string()) {
      EXPECT_TRUE(d["content"].is_null());
      EXPECT_TRUE(content.empty()) << "reasoning after content";
      reasoning += d["reasoning_content"].get<std::string>();
    }
    if (i > 0 && d.contains("content") && d["content"].is_string()) {
      EXPECT_TRUE(d["reasoning_content"].is_null());
      content += d["content"].get<std::string>();
    }
    if (d.contains("tool_calls")) {
      for (const Json& tc : d["tool_calls"]) {
        int idx = tc["index"];
        if (tc.contains("id")) {
          EXPECT_EQ(calls.count(idx), 0u);
          calls[idx] = tc;
        } else {
          calls[idx]["function"]["arguments"] =
              calls[idx]["function"]["arguments"].get<std::string>() +
              tc["function"]["arguments"].get<std::string>();
        }
      }
    }
  }
  EXPECT_EQ(reasoning, "Need the weather.");
  EXPECT_EQ(content, "Let me check.");
  ASSERT_EQ(calls.size(), 2u);
  const std::regex id_re("call_0[01]_[A-Za-z0-9]{24}");
  EXPECT_TRUE(std::regex_match(calls[0]["id"].get<std::string>(), id_re)) << calls[0]["id"];
  EXPECT_EQ(calls[0]["id"].get<std::string>().substr(0, 8), "call_00_");
  EXPECT_EQ(calls[1]["id"].get<std::string>().substr(0, 8), "call_01_");
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\": \"Paris\"}");
  EXPECT_EQ(calls[1]["function"]["arguments"], "{}");
  // Last chunk: finish_reason + usage (DeepSeek: usage on the last content chunk).
  const Json& last = frames.back().json;
  EXPECT_EQ(last["choices"][0]["finish_reason"], "tool_calls");
  const Json& u = last["usage"];
  EXPECT_EQ(u["prompt_tokens"], 100);
  EXPECT_EQ(u["completion_tokens"], 30);
  EXPECT_EQ(u["total_tokens"], 130);
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"], 64);
  EXPECT_EQ(u["prompt_cache_hit_tokens"], 64);
  EXPECT_EQ(u["prompt_cache_miss_tokens"], 36);
  EXPECT_EQ(u["completion_tokens_details"]["reasoning_tokens"], 5);

  // The non-stream body aggregates the same events.
  Json body = parse(enc.response_json(sample_usage()));
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["id"], id);
  const Json& msg = body["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"], "Let me check.");
  EXPECT_EQ(msg["reasoning_content"], "Need the weather.");
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  EXPECT_EQ(msg["tool_calls"][0]["id"], calls[0]["id"]);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\"}");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(body["usage"], u);
  check_golden("chat_stream_thinking_tools.sse", sse);
  check_golden("chat_response_thinking_tools.json", enc.response_json(sample_usage()));
}

TEST(ChatEncode, IncludeUsageNullsEarlierChunks) {
  GenerationRequest req = tools_request();
  req.stream = true;
  req.include_usage = true;
  ChatStreamEncoder enc(req, test_meta());
  std::string sse = run_stream(enc, {content("Hi"), finish(FinishReason::kLength)}, sample_usage());
  std::vector<SseFrame> frames = parse_sse(sse);
  ASSERT_EQ(frames.size(), 4u);  // role, "Hi", final, [DONE]
  EXPECT_TRUE(frames[0].json["usage"].is_null());
  EXPECT_TRUE(frames[1].json["usage"].is_null());
  EXPECT_EQ(frames[2].json["usage"]["total_tokens"], 130);
  EXPECT_EQ(frames[2].json["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(frames[3].data, "[DONE]");
  check_golden("chat_stream_include_usage_length.sse", sse);
  check_golden("chat_response_include_usage_length.json", enc.response_json(sample_usage()));
}

TEST(ChatEncode, NonStreamPlainAndFinishReasons) {
  GenerationRequest req;
  req.model = "custom-model";
  ResponseMeta meta;
  meta.seed = 7;
  Json body =
      parse(build_chat_response(req, meta, {content("Hello"), content(" world")}, recipe::Usage{}));
  EXPECT_EQ(body["model"], "custom-model");  // echoes the requested name
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello world");
  EXPECT_TRUE(body["choices"][0]["message"]["reasoning_content"].is_null());
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(std::string(chat_finish_reason(FinishReason::kStopSequence)), "stop");
  EXPECT_EQ(std::string(chat_finish_reason(FinishReason::kAborted)), "aborted");
  // A tool call with a plain stop reports tool_calls.
  body = parse(build_chat_response(
      req, meta, {tool_start(0, "f"), tool_args(0, "{}"), finish(FinishReason::kStop)}, {}));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "");
}

// A content event carrying the logprobs of its tokens.
OutputEvent content_lp(std::string t, std::vector<recipe::TokenLogprob> lps) {
  OutputEvent e = content(std::move(t));
  e.logprobs = std::move(lps);
  return e;
}

recipe::TokenLogprob lp(std::string bytes, float logprob) {
  recipe::TokenLogprob t;
  t.bytes = std::move(bytes);
  t.logprob = logprob;
  t.top = {{t.bytes, logprob}, {"x", -3.0f}};
  return t;
}

TEST(ChatEncode, LogprobsNonStreamAndStream) {
  GenerationRequest req;
  req.model = "m";
  req.sampling.logprobs = true;
  req.sampling.top_logprobs = 2;
  OutputEvent fin = finish(FinishReason::kStop);
  fin.logprobs = {lp("!", -0.25f)};  // held-back tokens ride on the finish event
  // "\xC3" is half of "é": token shows U+FFFD, bytes stay exact.
  const std::vector<OutputEvent> events = {
      content_lp("Hi", {lp("H", -0.5f), lp("i", -1.0f)}),
      reasoning("r"),
      content_lp(" \xC3\xA9", {lp(" \xC3", -2.0f), lp("\xA9", -0.1f)}),
      fin};
  Json body = parse(build_chat_response(req, ResponseMeta{}, events, recipe::Usage{}));
  const Json& c = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c[0]["token"], "H");
  EXPECT_EQ(c[0]["logprob"], -0.5);
  EXPECT_EQ(c[0]["bytes"], Json::array({72}));
  EXPECT_EQ(c[2]["token"], " \xEF\xBF\xBD");
  EXPECT_EQ(c[2]["bytes"], Json::array({32, 0xC3}));
  EXPECT_EQ(c[4]["token"], "!");
  ASSERT_EQ(c[1]["top_logprobs"].size(), 2u);
  EXPECT_EQ(c[1]["top_logprobs"][1]["token"], "x");
  EXPECT_EQ(c[1]["top_logprobs"][1]["logprob"], -3.0);
  EXPECT_TRUE(body["choices"][0]["logprobs"]["refusal"].is_null());

  ChatStreamEncoder enc(req, ResponseMeta{});
  std::vector<SseFrame> frames = parse_sse(run_stream(enc, events, recipe::Usage{}));
  std::vector<std::string> streamed;
  for (const SseFrame& f : frames) {
    if (!f.json.is_object())
      continue;
    const Json& ch = f.json["choices"][0];
    if (ch["logprobs"].is_null())
      continue;
    for (const Json& t : ch["logprobs"]["content"]) streamed.push_back(t["token"]);
  }
  EXPECT_EQ(streamed, (std::vector<std::string>{"H", "i", " \xEF\xBF\xBD", "\xEF\xBF\xBD", "!"}));

  // Not asked: null everywhere, even when events carry some.
  req.sampling.logprobs = false;
  body = parse(build_chat_response(req, ResponseMeta{}, events, recipe::Usage{}));
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
}

TEST(ResponsesEncode, LogprobsOnOutputText) {
  GenerationRequest req;
  req.model = "m";
  req.sampling.logprobs = true;
  req.sampling.top_logprobs = 2;
  const std::vector<OutputEvent> events = {reasoning("r"),
                                           content_lp("Hi", {lp("H", -0.5f), lp("i", -1.0f)}),
                                           content_lp("!", {lp("!", -0.25f)}),
                                           finish(FinishReason::kStop)};
  Json body = parse(build_responses_response(req, ResponseMeta{}, events, recipe::Usage{}));
  ASSERT_EQ(body["output"].size(), 2u);
  const Json& part = body["output"][1]["content"][0];
  EXPECT_EQ(part["type"], "output_text");
  ASSERT_EQ(part["logprobs"].size(), 3u);
  EXPECT_EQ(part["logprobs"][2]["token"], "!");
  EXPECT_EQ(part["logprobs"][2]["top_logprobs"].size(), 2u);
  EXPECT_EQ(body["top_logprobs"], 2);

  ResponsesStreamEncoder enc(req, ResponseMeta{});
  size_t deltas = 0;
  for (const SseFrame& f : parse_sse(run_stream(enc, events, recipe::Usage{}))) {
    if (f.event == "response.output_text.delta") {
      deltas += f.json["logprobs"].size();
    } else if (f.event == "response.output_text.done") {
      EXPECT_EQ(f.json["logprobs"].size(), 3u);
    }
  }
  EXPECT_EQ(deltas, 3u);
}

TEST(ChatEncode, DeterministicIdsPerSeed) {
  GenerationRequest req = tools_request();
  ResponseMeta a = test_meta();
  ResponseMeta b = test_meta();
  b.seed = 43;
  std::string x = build_chat_response(req, a, thinking_tools_events(), {});
  EXPECT_EQ(x, build_chat_response(req, a, thinking_tools_events(), {}));
  EXPECT_NE(x, build_chat_response(req, b, thinking_tools_events(), {}));
}

TEST(ChatEncode, ErrorFrameAndEventsAfterFinishIgnored) {
  GenerationRequest req;
  ChatStreamEncoder enc(req, test_meta());
  std::string s = enc.add(content("a"));
  s += enc.error(internal_error("backend died"));
  EXPECT_EQ(enc.add(content("b")), "");
  EXPECT_EQ(enc.finish({}), "");
  std::vector<SseFrame> frames = parse_sse(s);
  ASSERT_EQ(frames.size(), 4u);
  EXPECT_EQ(frames[2].json["error"]["message"], "backend died");
  EXPECT_EQ(frames[3].data, "[DONE]");
}

// ---------------------------------------------------------------- Anthropic Messages

TEST(MessagesEncode, StreamEventSequence) {
  GenerationRequest req = tools_request();
  MessagesStreamEncoder enc(req, test_meta());
  std::string sse = run_stream(enc, thinking_tools_events(), sample_usage());
  std::vector<SseFrame> frames = parse_sse(sse);
  std::vector<std::string> names;
  for (const SseFrame& f : frames) {
    EXPECT_EQ(f.json["type"], f.event);
    names.push_back(f.event);
  }
  const std::vector<std::string> expected = {"message_start",
                                             "content_block_start",
                                             "content_block_delta",
                                             "content_block_delta",
                                             "content_block_stop",
                                             "content_block_start",
                                             "content_block_delta",
                                             "content_block_stop",
                                             "content_block_start",
                                             "content_block_delta",
                                             "content_block_delta",
                                             "content_block_stop",
                                             "content_block_start",
                                             "content_block_delta",
                                             "content_block_stop",
                                             "message_delta",
                                             "message_stop"};
  EXPECT_EQ(names, expected);
  const Json& start = frames[0].json["message"];
  EXPECT_TRUE(std::regex_match(start["id"].get<std::string>(), std::regex("msg_[A-Za-z0-9]{24}")));
  EXPECT_EQ(start["type"], "message");
  EXPECT_EQ(start["role"], "assistant");
  EXPECT_EQ(start["content"], Json::array());
  EXPECT_TRUE(start["stop_reason"].is_null());
  EXPECT_EQ(start["usage"]["input_tokens"], 36);
  EXPECT_EQ(start["usage"]["cache_read_input_tokens"], 64);
  EXPECT_EQ(start["usage"]["output_tokens"], 0);
  EXPECT_EQ(frames[1].json["index"], 0);
  EXPECT_EQ(frames[1].json["content_block"],
            Json({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}));
  EXPECT_EQ(frames[2].json["delta"], Json({{"type", "thinking_delta"}, {"thinking", "Need the "}}));
  EXPECT_EQ(frames[5].json["content_block"], Json({{"type", "text"}, {"text", ""}}));
  EXPECT_EQ(frames[6].json["delta"]["type"], "text_delta");
  const Json& tool = frames[8].json["content_block"];
  EXPECT_EQ(frames[8].json["index"], 2);
  EXPECT_EQ(tool["type"], "tool_use");
  EXPECT_TRUE(std::regex_match(tool["id"].get<std::string>(), std::regex("toolu_[A-Za-z0-9]{24}")));
  EXPECT_EQ(tool["name"], "get_weather");
  EXPECT_EQ(tool["input"], Json::object());
  EXPECT_EQ(frames[9].json["delta"],
            Json({{"type", "input_json_delta"}, {"partial_json", "{\"city\": "}}));
  EXPECT_EQ(frames[12].json["index"], 3);
  const Json& md = frames[15].json;
  EXPECT_EQ(md["delta"]["stop_reason"], "tool_use");
  EXPECT_TRUE(md["delta"]["stop_sequence"].is_null());
  EXPECT_EQ(md["usage"]["output_tokens"], 30);

  Json body = parse(enc.response_json(sample_usage()));
  EXPECT_EQ(body["id"], start["id"]);
  ASSERT_EQ(body["content"].size(), 4u);
  EXPECT_EQ(body["content"][0],
            Json({{"type", "thinking"}, {"thinking", "Need the weather."}, {"signature", ""}}));
  EXPECT_EQ(body["content"][1], Json({{"type", "text"}, {"text", "Let me check."}}));
  EXPECT_EQ(body["content"][2]["id"], tool["id"]);
  EXPECT_EQ(body["content"][2]["input"], Json({{"city", "Paris"}}));
  EXPECT_EQ(body["content"][3]["input"], Json::object());
  EXPECT_EQ(body["stop_reason"], "tool_use");
  EXPECT_EQ(body["usage"]["output_tokens"], 30);
  check_golden("messages_stream_thinking_tools.sse", sse);
  check_golden("messages_response_thinking_tools.json", enc.response_json(sample_usage()));
}

TEST(MessagesEncode, StopReasonMapping) {
  GenerationRequest req;
  req.model = "claude-sonnet-4-5";
  struct Case {
    OutputEvent fin;
    const char* reason;
    Json seq;
  };
  const Case cases[] = {
      {finish(FinishReason::kStop), "end_turn", nullptr},
      {finish(FinishReason::kLength), "max_tokens", nullptr},
      {finish(FinishReason::kStopSequence, "\n\nHuman:"), "stop_sequence", "\n\nHuman:"},
      {finish(FinishReason::kToolCalls), "tool_use", nullptr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reason);
    Json body = parse(build_messages_response(req, test_meta(), {content("x"), c.fin}, {}));
    EXPECT_EQ(body["stop_reason"], c.reason);
    EXPECT_EQ(body["stop_sequence"], c.seq);
    EXPECT_EQ(body["model"], "deepseek-flash");  // meta.model wins over the request's
    MessagesStreamEncoder enc(req, test_meta());
    const std::string run_stream_text = run_stream(enc, {content("x"), c.fin}, {});
    std::vector<SseFrame> frames = parse_sse(run_stream_text);
    ASSERT_GE(frames.size(), 2u);
    const Json& md = frames[frames.size() - 2].json;
    EXPECT_EQ(md["delta"]["stop_reason"], c.reason);
    EXPECT_EQ(md["delta"]["stop_sequence"], c.seq);
    EXPECT_EQ(frames.back().event, "message_stop");
    if (c.fin.finish == FinishReason::kStopSequence) {
      check_golden("messages_stream_stop_sequence.sse", run_stream_text);
      check_golden("messages_response_stop_sequence.json", enc.response_json({}));
    }
  }
}

TEST(MessagesEncode, ErrorAndPingEvents) {
  GenerationRequest req;
  MessagesStreamEncoder enc(req, test_meta());
  std::string sse = enc.ping();
  sse += enc.error(internal_error("x"));
  std::vector<SseFrame> f = parse_sse(sse);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].event, "ping");
  EXPECT_EQ(f[1].event, "error");
  EXPECT_EQ(f[1].json["error"]["type"], "api_error");
}

// ---------------------------------------------------------------- Responses

TEST(ResponsesEncode, StreamEventSequence) {
  GenerationRequest req = tools_request();
  ResponsesStreamEncoder enc(req, test_meta());
  std::string sse = run_stream(enc, thinking_tools_events(), sample_usage());
  EXPECT_EQ(sse.find("[DONE]"), std::string::npos);
  std::vector<SseFrame> frames = parse_sse(sse);
  std::vector<std::string> names;
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ(frames[i].json["type"], frames[i].event);
    EXPECT_EQ(frames[i].json["sequence_number"], i);
    names.push_back(frames[i].event);
  }
  const std::vector<std::string> expected = {"response.created",
                                             "response.in_progress",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.output_text.delta",
                                             "response.output_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.done",
                                             "response.output_item.done",
                                             "response.completed"};
  EXPECT_EQ(names, expected);
  const Json& created = frames[0].json["response"];
  EXPECT_EQ(created["status"], "in_progress");
  EXPECT_EQ(created["object"], "response");
  EXPECT_TRUE(created["usage"].is_null());
  EXPECT_EQ(created["output"], Json::array());
  EXPECT_EQ(created["store"], false);
  EXPECT_EQ(frames[2].json["item"]["type"], "reasoning");
  EXPECT_EQ(frames[2].json["output_index"], 0);
  const std::string rs_id = frames[2].json["item"]["id"];
  EXPECT_EQ(rs_id.substr(0, 3), "rs_");
  EXPECT_EQ(frames[4].json["item_id"], rs_id);
  EXPECT_EQ(frames[6].json["text"], "Need the weather.");
  EXPECT_EQ(frames[8].json["item"]["content"][0]["text"], "Need the weather.");
  EXPECT_EQ(frames[9].json["item"]["type"], "message");
  EXPECT_EQ(frames[10].json["part"]["type"], "output_text");
  EXPECT_EQ(frames[11].json["delta"], "Let me check.");
  EXPECT_EQ(frames[15].json["item"]["type"], "function_call");
  EXPECT_EQ(frames[15].json["item"]["name"], "get_weather");
  EXPECT_EQ(frames[15].json["item"]["status"], "in_progress");
  EXPECT_EQ(frames[18].json["arguments"], "{\"city\": \"Paris\"}");
  EXPECT_EQ(frames[19].json["item"]["status"], "completed");
  const Json& done = frames.back().json["response"];
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["id"], created["id"]);
  ASSERT_EQ(done["output"].size(), 4u);
  EXPECT_EQ(done["output"][2]["call_id"].get<std::string>().substr(0, 8), "call_00_");
  EXPECT_EQ(done["output"][3]["call_id"].get<std::string>().substr(0, 8), "call_01_");
  EXPECT_EQ(done["usage"]["input_tokens"], 100);
  EXPECT_EQ(done["usage"]["input_tokens_details"]["cached_tokens"], 64);
  EXPECT_EQ(done["usage"]["output_tokens"], 30);
  EXPECT_EQ(done["usage"]["output_tokens_details"]["reasoning_tokens"], 5);
  EXPECT_EQ(done["usage"]["total_tokens"], 130);
  EXPECT_EQ(done["tools"].size(), 2u);
  EXPECT_EQ(done["tool_choice"], "auto");
  EXPECT_EQ(done["max_output_tokens"], 1000);
  EXPECT_EQ(done["reasoning"]["effort"], "high");
  // Non-stream body == the completed response.
  EXPECT_EQ(parse(enc.response_json(sample_usage())), done);
  EXPECT_EQ(
      parse(build_responses_response(req, test_meta(), thinking_tools_events(), sample_usage())),
      done);
  check_golden("responses_stream_thinking_tools.sse", sse);
  check_golden("responses_response_thinking_tools.json", enc.response_json(sample_usage()));
}

TEST(ResponsesEncode, LengthIsIncomplete) {
  GenerationRequest req;
  req.model = "m";
  req.conversation.tool_choice = recipe::ToolChoice::kNone;  // as decoded without tools
  ResponsesStreamEncoder enc(req, test_meta());
  std::string sse =
      run_stream(enc, {content("partial"), finish(FinishReason::kLength)}, sample_usage());
  std::vector<SseFrame> frames = parse_sse(sse);
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames.back().event, "response.incomplete");
  const Json& r = frames.back().json["response"];
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  check_golden("responses_stream_incomplete.sse", sse);
}

TEST(ResponsesEncode, FailedAndErrorEvent) {
  GenerationRequest req;
  Json body = parse(
      build_responses_response(req, test_meta(), {content("a"), finish(FinishReason::kError)}, {}));
  EXPECT_EQ(body["status"], "failed");
  EXPECT_EQ(body["error"]["code"], "server_error");
  ResponsesStreamEncoder enc(req, test_meta());
  std::string sse = enc.start();
  sse += enc.error(internal_error("x"));
  std::vector<SseFrame> f = parse_sse(sse);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[2].event, "error");
  EXPECT_EQ(f[2].json["sequence_number"], 2);
  EXPECT_EQ(f[2].json["message"], "x");
}

TEST(AllEncoders, EmptyOutputAndNoFinishEvent) {
  GenerationRequest req;
  ChatStreamEncoder c(req, test_meta());
  MessagesStreamEncoder m(req, test_meta());
  ResponsesStreamEncoder r(req, test_meta());
  EXPECT_EQ(parse_sse(c.finish({})).back().data, "[DONE]");
  EXPECT_EQ(parse_sse(m.finish({})).back().event, "message_stop");
  EXPECT_EQ(parse_sse(r.finish({})).back().event, "response.completed");
  // Orphan argument deltas / ends are ignored.
  Json body = parse(
      build_chat_response(req, test_meta(), {tool_args(3, "x"), tool_end(3), content("ok")}, {}));
  EXPECT_EQ(body["choices"][0]["message"]["content"], "ok");
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
}

}  // namespace
}  // namespace dsinfer::api
