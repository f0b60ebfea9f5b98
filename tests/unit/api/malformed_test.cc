// Malformed requests: every one is a 400 in the protocol's own error shape, and the message names
// the offending field.
#include <gtest/gtest.h>

#include "api/chat.h"
#include "api/error.h"
#include "api/messages.h"
#include "api/responses.h"
#include "api_test_util.h"

namespace dsinfer::api {
namespace {

using testing::Json;

enum class Proto { kChat, kMessages, kResponses };

struct BadCase {
  Proto proto;
  const char* name;
  std::string body;
  std::string field;  // must appear in the message ("" for body-level errors)
};

std::string chat(const std::string& extra) {
  return R"({"model":"m","messages":[{"role":"user","content":"x"}])" +
         (extra.empty() ? std::string() : "," + extra) + "}";
}
std::string msgs(const std::string& extra) {
  return R"({"model":"m","max_tokens":16,"messages":[{"role":"user","content":"x"}])" +
         (extra.empty() ? std::string() : "," + extra) + "}";
}
std::string resp(const std::string& extra) {
  return R"({"model":"m","input":"x")" + (extra.empty() ? std::string() : "," + extra) + "}";
}

std::string many_stops(int n) {
  std::string out = "[";
  for (int i = 0; i < n; ++i) out += (i ? ",\"s" : "\"s") + std::to_string(i) + "\"";
  return out + "]";
}

std::vector<BadCase> cases() {
  const std::string deep(200, '[');
  return {
      // ---- Chat Completions
      {Proto::kChat, "bad_json", "{\"model\":", ""},
      {Proto::kChat, "not_object", "[1,2]", ""},
      {Proto::kChat, "too_deep", "{\"x\":" + deep, ""},
      {Proto::kChat, "missing_model", R"({"messages":[{"role":"user","content":"x"}]})", "model"},
      {Proto::kChat, "model_type", R"({"model":5,"messages":[]})", "model"},
      {Proto::kChat, "missing_messages", R"({"model":"m"})", "messages"},
      {Proto::kChat, "empty_messages", R"({"model":"m","messages":[]})", "messages"},
      {Proto::kChat, "messages_type", R"({"model":"m","messages":{}})", "messages"},
      {Proto::kChat, "message_not_object", R"({"model":"m","messages":["hi"]})", "messages[0]"},
      {Proto::kChat,
       "unknown_role",
       R"({"model":"m","messages":[{"role":"bot","content":"x"}]})",
       "messages[0].role"},
      {Proto::kChat,
       "missing_role",
       R"({"model":"m","messages":[{"content":"x"}]})",
       "messages[0].role"},
      {Proto::kChat,
       "missing_content",
       R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user"}]})",
       "messages[1].content"},
      {Proto::kChat,
       "content_type",
       R"({"model":"m","messages":[{"role":"user","content":7}]})",
       "messages[0].content"},
      {Proto::kChat,
       "part_type",
       R"({"model":"m","messages":[{"role":"user","content":[{"type":"audio_blob"}]}]})",
       "messages[0].content[0].type"},
      {Proto::kChat,
       "part_text_missing",
       R"({"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]})",
       "messages[0].content[0].text"},
      {Proto::kChat, "temperature_range", chat(R"("temperature":2.5)"), "temperature"},
      {Proto::kChat, "temperature_type", chat(R"("temperature":"hot")"), "temperature"},
      {Proto::kChat, "top_p_zero", chat(R"("top_p":0)"), "top_p"},
      {Proto::kChat, "top_p_range", chat(R"("top_p":1.5)"), "top_p"},
      {Proto::kChat, "max_tokens_zero", chat(R"("max_tokens":0)"), "max_tokens"},
      {Proto::kChat, "max_tokens_big", chat(R"("max_tokens":393217)"), "max_tokens"},
      {Proto::kChat, "max_tokens_float", chat(R"("max_tokens":1.5)"), "max_tokens"},
      {Proto::kChat,
       "max_completion_tokens",
       chat(R"("max_completion_tokens":-3)"),
       "max_completion_tokens"},
      {Proto::kChat,
       "top_logprobs_range",
       chat(R"("logprobs":true,"top_logprobs":21)"),
       "top_logprobs"},
      {Proto::kChat, "top_logprobs_no_logprobs", chat(R"("top_logprobs":2)"), "top_logprobs"},
      {Proto::kChat,
       "stop_too_many",
       chat(
           R"("stop":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"])"),
       "stop"},
      {Proto::kChat, "stop_item_type", chat(R"("stop":["a",3])"), "stop[1]"},
      {Proto::kChat, "n_over_limit", chat(R"("n":17)"), "must be at most 16"},
      {Proto::kChat, "n_zero", chat(R"("n":0)"), "must be at least 1"},
      {Proto::kChat, "best_of_below_n", chat(R"("n":3,"best_of":2)"), "must be at least n (3)"},
      {Proto::kChat, "best_of_over_limit", chat(R"("best_of":17)"), "must be at most 16"},
      {Proto::kChat, "best_of_type", chat(R"("best_of":"all")"), "best_of"},
      {Proto::kChat,
       "best_of_streaming",
       chat(R"("best_of":2,"stream":true)"),
       "not supported with stream"},
      {Proto::kChat,
       "stream_options_without_stream",
       chat(R"("stream_options":{"include_usage":true})"),
       "stream_options"},
      {Proto::kChat, "stream_type", chat(R"("stream":"yes")"), "stream"},
      {Proto::kChat, "thinking_type", chat(R"("thinking":{"type":"sometimes"})"), "thinking.type"},
      {Proto::kChat, "effort_value", chat(R"("reasoning_effort":"extreme")"), "reasoning_effort"},
      {Proto::kChat, "tool_type", chat(R"("tools":[{"type":"retrieval"}])"), "tools[0].type"},
      {Proto::kChat,
       "tool_name_pattern",
       chat(R"("tools":[{"type":"function","function":{"name":"bad name"}}])"),
       "tools[0].function.name"},
      {Proto::kChat,
       "tool_name_long",
       chat(R"("tools":[{"type":"function","function":{"name":")" + std::string(129, 'a') +
            "\"}}]"),
       "tools[0].function.name"},
      {Proto::kChat,
       "tool_name_duplicate",
       chat(
           R"("tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}])"),
       "tools[1].function.name"},
      {Proto::kChat,
       "tool_parameters_type",
       chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":[]}}])"),
       "tools[0].function.parameters"},
      {Proto::kChat,
       "tool_choice_required_thinking",
       chat(R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required")"),
       "tool_choice"},
      {Proto::kChat,
       "tool_choice_named_thinking",
       chat(
           R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}})"),
       "tool_choice"},
      {Proto::kChat,
       "tool_choice_unknown_name",
       chat(
           R"("thinking":{"type":"disabled"},"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}})"),
       "tool_choice.function.name"},
      {Proto::kChat, "tool_choice_value", chat(R"("tool_choice":"sometimes")"), "tool_choice"},
      {Proto::kChat,
       "parallel_tool_calls_type",
       chat(R"("parallel_tool_calls":"false")"),
       "parallel_tool_calls"},
      {Proto::kChat,
       "tool_choice_required_no_tools",
       chat(R"("thinking":{"type":"disabled"},"tool_choice":"required")"),
       "tool_choice"},
      {Proto::kChat,
       "response_format_type",
       chat(R"("response_format":{"type":"xml"})"),
       "response_format.type"},
      {Proto::kChat,
       "response_format_json_schema_missing",
       chat(R"("response_format":{"type":"json_schema"})"),
       "response_format.json_schema"},
      {Proto::kChat,
       "json_object_without_json_word",
       chat(R"("response_format":{"type":"json_object"})"),
       ""},
      {Proto::kChat,
       "prefix_with_tools",
       R"({"model":"m","tools":[{"type":"function","function":{"name":"f"}}],
          "messages":[{"role":"user","content":"x"},{"role":"assistant","content":"a","prefix":true}]})",
       ""},
      {Proto::kChat,
       "tool_without_call",
       R"({"model":"m","messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"a","content":"r"}]})",
       "messages[1].role"},
      {Proto::kChat,
       "tool_call_id_unknown",
       R"({"model":"m","thinking":{"type":"disabled"},"messages":[{"role":"user","content":"x"},
         {"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},
         {"role":"tool","tool_call_id":"b","content":"r"}]})",
       "messages[2].tool_call_id"},
      {Proto::kChat,
       "tool_call_missing_function",
       R"({"model":"m","messages":[{"role":"user","content":"x"},
         {"role":"assistant","tool_calls":[{"id":"a","type":"function"}]}]})",
       "messages[1].tool_calls[0].function"},
      {Proto::kChat,
       "prefix_not_last",
       R"({"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"a","prefix":true},
         {"role":"user","content":"y"}]})",
       "messages[1].prefix"},
      {Proto::kChat,
       "developer_role",
       R"({"model":"m","messages":[{"role":"developer","content":"x"}]})",
       "messages[0].role"},
      {Proto::kChat, "user_id_charset", chat(R"("user_id":"a b")"), "user_id"},
      {Proto::kChat, "seed_type", chat(R"("seed":"1")"), "seed"},
      {Proto::kChat, "penalty_range", chat(R"("presence_penalty":3)"), "presence_penalty"},

      // ---- Anthropic Messages
      {Proto::kMessages, "bad_json", "{", ""},
      {Proto::kMessages,
       "missing_model",
       R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}]})",
       "model"},
      {Proto::kMessages,
       "missing_max_tokens",
       R"({"model":"m","messages":[{"role":"user","content":"x"}]})",
       "max_tokens"},
      {Proto::kMessages,
       "max_tokens_type",
       R"({"model":"m","max_tokens":"5","messages":[{"role":"user","content":"x"}]})",
       "max_tokens"},
      {Proto::kMessages, "missing_messages", R"({"model":"m","max_tokens":5})", "messages"},
      {Proto::kMessages,
       "role_system",
       R"({"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]})",
       "messages.0.role"},
      {Proto::kMessages,
       "content_missing",
       R"({"model":"m","max_tokens":5,"messages":[{"role":"user"}]})",
       "messages.0.content"},
      {Proto::kMessages,
       "block_type_unknown",
       R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"video"}]}]})",
       "messages.0.content.0.type"},
      {Proto::kMessages,
       "block_document",
       R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]})",
       "messages.0.content.0.type"},
      {Proto::kMessages,
       "redacted_thinking",
       R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"},
         {"role":"assistant","content":[{"type":"redacted_thinking","data":"x"}]}]})",
       "messages.1.content.0.type"},
      {Proto::kMessages,
       "tool_use_input_type",
       R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"},
         {"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":"{}"}]}]})",
       "messages.1.content.0.input"},
      {Proto::kMessages,
       "tool_result_unknown_id",
       R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"nope","content":"r"}]}]})",
       "messages.0.content.0.tool_use_id"},
      {Proto::kMessages,
       "text_block_missing_text",
       R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text"}]}]})",
       "messages.0.content.0.text"},
      {Proto::kMessages, "system_type", msgs(R"("system":5)"), "system"},
      {Proto::kMessages,
       "disable_parallel_tool_use_type",
       msgs(
           R"("tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"auto","disable_parallel_tool_use":1})"),
       "tool_choice.disable_parallel_tool_use"},
      {Proto::kMessages,
       "system_block_type",
       msgs(R"("system":[{"type":"image"}])"),
       "system.0.type"},
      {Proto::kMessages, "temperature_range", msgs(R"("temperature":-0.1)"), "temperature"},
      {Proto::kMessages, "thinking_type", msgs(R"("thinking":{"type":"on"})"), "thinking.type"},
      {Proto::kMessages,
       "effort_value",
       msgs(R"("output_config":{"effort":"huge"})"),
       "output_config.effort"},
      {Proto::kMessages,
       "tool_missing_schema",
       msgs(R"("tools":[{"name":"f"}])"),
       "tools.0.input_schema"},
      {Proto::kMessages,
       "server_tool",
       msgs(R"("tools":[{"type":"web_search_20250305","name":"web_search"}])"),
       "tools.0.type"},
      {Proto::kMessages,
       "tool_choice_named_thinking",
       msgs(R"("tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"tool","name":"f"})"),
       "tool_choice"},
      {Proto::kMessages,
       "tool_choice_type",
       msgs(R"("tool_choice":{"type":"sometimes"})"),
       "tool_choice.type"},
      {Proto::kMessages,
       "stop_sequences_type",
       msgs(R"("stop_sequences":"END")"),
       "stop_sequences"},
      {Proto::kMessages,
       "metadata_user_id_type",
       msgs(R"("metadata":{"user_id":1})"),
       "metadata.user_id"},
      // Issue 18: Anthropic's ranges and bounds.
      {Proto::kMessages, "temperature_above_1", msgs(R"("temperature":1.5)"), "temperature"},
      {Proto::kMessages, "top_k_negative", msgs(R"("top_k":-1)"), "top_k"},
      {Proto::kMessages,
       "too_many_stop_sequences",
       msgs(R"("stop_sequences":)" + many_stops(65)),
       "stop_sequences"},
      {Proto::kMessages,
       "image_without_source",
       R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image"}]}]})",
       "messages.0.content.0.source"},
      {Proto::kMessages,
       "tool_result_image_without_source",
       R"({"model":"m","max_tokens":5,"messages":[
         {"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},
         {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image"}]}]}]})",
       "messages.1.content.0.content.0.source"},

      // ---- Responses
      {Proto::kResponses, "bad_json", "not json", ""},
      // Issue 18: a stateless server refuses what needs stored responses; strict items/metadata.
      {Proto::kResponses,
       "previous_response_id",
       resp(R"("previous_response_id":"resp_1")"),
       "previous_response_id"},
      {Proto::kResponses, "store_true", resp(R"("store":true)"), "store"},
      {Proto::kResponses, "store_type", resp(R"("store":"yes")"), "store"},
      {Proto::kResponses,
       "parallel_tool_calls_type",
       resp(R"("parallel_tool_calls":0)"),
       "parallel_tool_calls"},
      {Proto::kResponses, "metadata_type", resp(R"("metadata":[1])"), "metadata"},
      {Proto::kResponses, "metadata_value_type", resp(R"("metadata":{"k":1})"), "metadata.k"},
      {Proto::kResponses,
       "unknown_item_type",
       R"({"model":"m","input":[{"type":"teleport","x":1}]})",
       "input[0].type"},
      {Proto::kResponses,
       "item_reference",
       R"({"model":"m","input":[{"type":"item_reference","id":"msg_1"}]})",
       "input[0].type"},
      {Proto::kChat, "metadata_type", chat(R"("metadata":"x")"), "metadata"},
      {Proto::kResponses, "no_input_or_instructions", R"({"model":"m"})", "input"},
      {Proto::kResponses, "input_type", R"({"model":"m","input":5})", "input"},
      {Proto::kResponses,
       "item_missing_type",
       R"({"model":"m","input":[{"content":"x"}]})",
       "input[0].type"},
      {Proto::kResponses,
       "item_role",
       R"({"model":"m","input":[{"role":"tool","content":"x"}]})",
       "input[0].role"},
      {Proto::kResponses,
       "part_type",
       R"({"model":"m","input":[{"role":"user","content":[{"type":"input_audio"}]}]})",
       "input[0].content[0].type"},
      {Proto::kResponses,
       "input_file",
       R"({"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]})",
       "input[0].content[0].type"},
      {Proto::kResponses,
       "image_in_system",
       R"({"model":"m","input":[{"role":"system","content":[{"type":"input_image","image_url":"u"}]}]})",
       "input[0].content[0].type"},
      {Proto::kResponses,
       "call_without_output",
       R"({"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]})",
       "input[0].call_id"},
      {Proto::kResponses,
       "output_without_call",
       R"({"model":"m","input":[{"type":"function_call_output","call_id":"c","output":"r"}]})",
       "input[0].call_id"},
      {Proto::kResponses,
       "duplicate_call_id",
       R"({"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
         {"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]})",
       "input[1].call_id"},
      {Proto::kResponses,
       "empty_call_id",
       R"({"model":"m","input":[{"type":"function_call","call_id":"","name":"f","arguments":"{}"}]})",
       "input[0].call_id"},
      {Proto::kResponses,
       "reasoning_part_type",
       R"({"model":"m","input":[{"type":"reasoning","content":[{"type":"summary_text","text":"x"}]}]})",
       "input[0].content[0].type"},
      {Proto::kResponses,
       "effort_value",
       resp(R"("reasoning":{"effort":"lots"})"),
       "reasoning.effort"},
      {Proto::kResponses,
       "max_output_tokens",
       resp(R"("max_output_tokens":0)"),
       "max_output_tokens"},
      {Proto::kResponses, "top_logprobs", resp(R"("top_logprobs":25)"), "top_logprobs"},
      {Proto::kResponses, "top_p", resp(R"("top_p":-1)"), "top_p"},
      {Proto::kResponses,
       "tool_name",
       resp(R"("tools":[{"type":"function","name":"a.b"}])"),
       "tools[0].name"},
      {Proto::kResponses,
       "custom_tool",
       resp(R"("tools":[{"type":"custom","name":"x"}])"),
       "tools[0].type"},
      {Proto::kResponses,
       "tool_choice_required_thinking",
       resp(R"("tools":[{"type":"function","name":"f"}],"tool_choice":"required")"),
       "tool_choice"},
      {Proto::kResponses,
       "tool_choice_hosted",
       resp(R"("tool_choice":{"type":"file_search"})"),
       "tool_choice.type"},
      {Proto::kResponses,
       "text_format_type",
       resp(R"("text":{"format":{"type":"yaml"}})"),
       "text.format.type"},
      {Proto::kResponses,
       "json_schema_missing_schema",
       resp(R"("text":{"format":{"type":"json_schema","name":"x"}})"),
       "text.format.schema"},
      {Proto::kResponses, "instructions_type", resp(R"("instructions":["a"])"), "instructions"},
  };
}

TEST(Malformed, EveryCaseIs400NamingTheField) {
  std::vector<BadCase> all = cases();
  EXPECT_GE(all.size(), 40u);
  for (const BadCase& c : all) {
    SCOPED_TRACE(c.name);
    std::optional<ApiError> err;
    if (c.proto == Proto::kChat) {
      auto r = decode_chat_request(c.body, {});
      if (!r.ok())
        err = r.error();
    } else if (c.proto == Proto::kMessages) {
      auto r = decode_messages_request(c.body, {});
      if (!r.ok())
        err = r.error();
    } else {
      auto r = decode_responses_request(c.body, {});
      if (!r.ok())
        err = r.error();
    }
    ASSERT_TRUE(err.has_value()) << c.body;
    EXPECT_EQ(err->http_status, 400);
    EXPECT_EQ(err->type, "invalid_request_error");
    EXPECT_FALSE(err->message.empty());
    if (!c.field.empty()) {
      EXPECT_NE(err->message.find(c.field), std::string::npos)
          << "message '" << err->message << "' does not name " << c.field;
    }
    if (c.proto == Proto::kMessages) {
      Json body = testing::parse(render_anthropic_error(*err));
      EXPECT_EQ(body["type"], "error");
      EXPECT_EQ(body["error"]["type"], "invalid_request_error");
      EXPECT_EQ(body["error"]["message"], err->message);
      EXPECT_EQ(body.size(), 2u);
    } else {
      Json body = testing::parse(render_openai_error(*err));
      ASSERT_TRUE(body.contains("error"));
      const Json& e = body["error"];
      EXPECT_EQ(e["type"], "invalid_request_error");
      EXPECT_EQ(e["message"], err->message);
      EXPECT_TRUE(e.contains("param"));
      EXPECT_TRUE(e.contains("code"));
      if (err->param.empty()) {
        EXPECT_TRUE(e["param"].is_null());
      } else {
        EXPECT_EQ(e["param"], err->param);
      }
    }
  }
}

TEST(Malformed, OpenAIParamIsThePath) {
  auto r = decode_chat_request(
      R"({"model":"m","messages":[{"role":"user","content":"x"},{"role":"wizard","content":"y"}]})",
      {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().param, "messages[1].role");
  EXPECT_EQ(r.error().message,
            "Invalid value for 'messages[1].role': 'wizard' is not one of 'system', 'user', "
            "'assistant', 'tool', 'latest_reminder'.");
  auto m = decode_messages_request(R"({"model":"m","max_tokens":"x","messages":[]})", {});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().message, "max_tokens: Input should be an integer, got a string");
}

TEST(Malformed, InternalErrorShapes) {
  ApiError e = internal_error("boom");
  Json o = testing::parse(render_openai_error(e));
  EXPECT_EQ(o["error"]["type"], "internal_error");
  EXPECT_EQ(o["error"]["code"], "internal_error");
  EXPECT_TRUE(o["error"]["param"].is_null());
  Json a = testing::parse(render_anthropic_error(e));
  EXPECT_EQ(a["error"]["type"], "api_error");
}

TEST(Malformed, InvalidUtf8AndOddNumbersDoNotCrash) {
  EXPECT_FALSE(decode_chat_request("{\"model\":\"\xff\",\"messages\":[]}", {}).ok());
  EXPECT_FALSE(decode_chat_request(chat(R"("temperature":1e999)"), {}).ok());
  EXPECT_FALSE(decode_chat_request(chat(R"("max_tokens":18446744073709551615)"), {}).ok());
  EXPECT_FALSE(decode_chat_request(chat(R"("seed":1e300)"), {}).ok());
  EXPECT_FALSE(decode_responses_request("", {}).ok());
  EXPECT_FALSE(decode_messages_request(std::string("{\"model\":\"m\"\0}", 14), {}).ok());
}

}  // namespace
}  // namespace dsinfer::api
