// Internal helpers shared by the three protocol codecs.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "api/detail/json_reader.h"
#include "api/options.h"
#include "recipe/types.h"

namespace dsinfer::api::detail {

// ---- decoding ----

// Reads the required `model` and checks it against DecodeOptions::served_models.
// `accept_claude`: the Messages API also takes any "claude*" name.
// A request value quoted in an error message: at most 128 bytes (cut on a UTF-8 boundary), with
// "..." when cut.
std::string quote(std::string_view value);

// OpenAI's `metadata`: an object of at most 16 string values, keys of at most 64 and values of
// at most 512 characters. Checked and otherwise ignored.
Err read_metadata(const Reader& r, const Json& root);

Err read_model(const Reader& r,
               const Json& root,
               const DecodeOptions& opts,
               bool accept_claude,
               std::string* out);

// ^[a-zA-Z0-9_-]{1,128}$ and unique within `seen`.
Err check_tool_name(const Reader& r,
                    const Path& p,
                    const std::string& name,
                    std::set<std::string>* seen);

// The body of a public decode_*_request: runs decode(body, opts, &request).
template <typename Decode>
ApiResult<recipe::GenerationRequest> decode_request(Decode decode,
                                                    std::string_view body,
                                                    const DecodeOptions& opts) {
  recipe::GenerationRequest req;
  if (Err e = decode(body, opts, &req))
    return std::move(*e);
  return req;
}

// OpenAI top_logprobs: absent or null, or an integer in [0, max] (DecodeOptions).
Err read_top_logprobs(const Reader& r,
                      const Json& root,
                      const DecodeOptions& opts,
                      std::optional<int64_t>* out);

// ---- tools ----

// Calls read(tool, tool_path, &seen) -> Err for each element of root["tools"] (absent or null:
// no tools) once it is checked to be an object; `seen` collects names for check_tool_name.
template <typename Read>
Err for_each_tool(const Reader& r, const Json& root, Read&& read) {
  const Json* tools = nullptr;
  DSI_API_TRY(r.opt_array(root, Path(), "tools", &tools));
  if (!tools)
    return std::nullopt;
  std::set<std::string> seen;
  return for_each_object(
      r, *tools, Path().key("tools"), [&](const Json& t, const Path& tp, size_t) {
        return read(t, tp, &seen);
      });
}

// A function definition: Chat's tools[i].function, a Responses function tool or an Anthropic
// tool.
struct FunctionFields {
  std::string name;
  std::optional<std::string> description;
  const Json* parameters = nullptr;  // "parameters" (Anthropic: "input_schema")
  std::optional<bool> strict;        // OpenAI only
};

// Reads `name` (check_tool_name against `seen`) and `description` of fn at fp. The parameter
// schema and `strict` differ between the protocols and are left to the caller.
Err read_function_fields(const Reader& r,
                         const Json& fn,
                         const Path& fp,
                         std::set<std::string>* seen,
                         FunctionFields* out);

// ToolSpec::function_json: {"name", "description" ("" if none), "parameters" ({} if none)}.
std::string function_json(const FunctionFields& f);

// An OpenAI function definition (Chat's tools[i].function, a Responses function tool) at fp:
// name, description, parameters and strict; a strict tool's parameters normalised
// (normalize_strict_schema) unless root's tool_choice is "none" (which drops the tools before
// they are checked, as deepseek-recipe does). Appended to conv->tools.
Err read_openai_function(const Reader& r,
                         const Json& root,
                         const Json& fn,
                         const Path& fp,
                         std::set<std::string>* seen,
                         recipe::Conversation* conv);

// A `strict: true` tool's parameters as deepseek-recipe normalises them: canonical key order per
// schema type, unsupported keywords (default, title, minItems, minLength, ...) dropped, missing
// parameters an empty object schema. Errors (400, `p`): a schema without type / anyOf / $ref, a
// `format` other than email, hostname, ipv4, ipv6, uuid, an object whose `required` does not
// list all its properties.
Err normalize_strict_schema(const Reader& r, const Json* in, const Path& p, Json* out);

// ---- tool_choice ----

// The default tool_choice: auto with tools, none without.
void default_tool_choice(recipe::Conversation* conv);

// tool_choice "required" (Anthropic "any") needs a tool; else the error at p is no_tools_message.
Err require_tool_choice(const Reader& r,
                        const Path& p,
                        std::string_view no_tools_message,
                        recipe::Conversation* conv);

// A named tool_choice. `name` must be one of conv->tools; otherwise the error at name_path reads
// "no <tool_kind> named '<name>'<where>.".
Err name_tool_choice(const Reader& r,
                     const Path& name_path,
                     const std::string& name,
                     std::string_view tool_kind,
                     std::string_view where,
                     recipe::Conversation* conv);

// OpenAI tool_choice (Chat and Responses): absent or null keeps the default; a string is a mode
// "none" | "auto" | "required" ('required' without tools: required_without_tools); otherwise it
// must be an object with a string "type". That object and its type are left in *object / *type
// for the protocol's own named form; *object is nullptr when there is nothing left to read.
Err read_openai_tool_choice(const Reader& r,
                            const Json& root,
                            std::string_view required_without_tools,
                            recipe::Conversation* conv,
                            const Json** object,
                            std::string* type);

// An effort string at path p (with aliases).
Err read_effort(const Reader& r, const Path& p, const Json& v, EffortSetting* out);

// Thinking toggle and effort as collected from a request.
struct ThinkingControls {
  std::optional<bool> enabled;  // explicit toggle (thinking.type)
  std::optional<EffortSetting> effort;
  Path effort_path;
};
// Sets conversation.thinking / effort: thinking is on unless the toggle says disabled or the
// effort is "none"; the default effort applies when thinking is on and none was given.
void apply_thinking(const ThinkingControls& c,
                    const DecodeOptions& opts,
                    recipe::Conversation* conv);

// deepseek-recipe's cross-field rules, checked on the decoded conversation:
//   - a response format (any type, `text` included) with an offered strict tool: "response_format
//     should not be used with tools";
//   - a final prefix assistant message with tools declared or tool calls / results in the
//     history: "Function call should not be used with prefix";
//   - json_object without the word "json" (any case) in the text of a message (system, user,
//     assistant content, tool result, reminder; not reasoning or tool-call arguments):
//     `json_word_message`.
// `response_format_path`: where the protocol puts the response format (for the message).
Err check_conversation_rules(const Reader& r,
                             const recipe::Conversation& conv,
                             bool has_response_format,
                             const Path& response_format_path,
                             const std::string& json_word_message);

// tool_choice required/named is rejected in thinking mode (spec §3.1).
Err check_tool_choice_mode(const Reader& r,
                           const Path& tool_choice_path,
                           const recipe::Conversation& conv);

// temperature (0..2) and top_p ((0,1]) at root; then DeepSeek's thinking-mode rules.
Err read_temperature_top_p(const Reader& r,
                           const Json& root,
                           const DecodeOptions& opts,
                           recipe::GenerationRequest* req);

// A max_tokens-like value: integer in [1, opts.max_output_tokens].
Err read_max_tokens(const Reader& r,
                    const Json& root,
                    std::string_view key,
                    const DecodeOptions& opts,
                    std::optional<int64_t>* out);

// stop: a string or an array of strings (at most max_count; 0 = unlimited). Empty strings are
// dropped.
Err read_stop(const Reader& r,
              const Json& root,
              std::string_view key,
              size_t max_count,
              std::vector<std::string>* out);

// Checks that JSON text parses (tool-call arguments); empty/whitespace-only text passes.
bool is_json_text(const std::string& text);

// Python json.dumps(ensure_ascii=False) text (recipe::py_json_dumps).
std::string py_dumps(const Json& v);

// ---- encoding ----

// Compact JSON; invalid UTF-8 is replaced, never thrown on.
std::string dump(const Json& v);
// "data: <json>\n\n"
std::string sse_data(const Json& v);
// "event: <name>\ndata: <json>\n\n"
std::string sse_event(const std::string& name, const Json& v);

// OpenAI's logprob object (Chat `logprobs.content[]`, Responses `logprobs[]`): {token, logprob,
// bytes, top_logprobs: [{token, logprob, bytes}]}. `token` is the bytes as UTF-8 (an invalid
// partial character becomes U+FFFD), `bytes` the raw bytes; -inf is reported as -9999.0 as
// OpenAI does.
Json openai_logprob(const recipe::TokenLogprob& t);

// Deterministic pseudo-random ids (splitmix64).
class IdGen {
 public:
  explicit IdGen(uint64_t seed) : state_(seed) {}
  uint64_t next();
  std::string alnum(int n);
  std::string hex(int n);
  std::string uuid();

 private:
  std::string draw(int n, std::string_view alphabet);  // n characters of `alphabet`

  uint64_t state_;
};

uint64_t mix_seed(uint64_t seed, uint64_t salt);
// "call_00_" + 24 alphanumerics (Chat / Responses), index in 2 digits.
std::string openai_tool_call_id(uint64_t seed, int index);
// "toolu_" + 24 alphanumerics (Messages).
std::string anthropic_tool_use_id(uint64_t seed, int index);

// The body of a public build_*_response: the non-streaming response of `Encoder` (a protocol's
// stream encoder) after all of `events`.
template <typename Encoder>
std::string build_response(const recipe::GenerationRequest& request,
                           const ResponseMeta& meta,
                           const std::vector<recipe::OutputEvent>& events,
                           const recipe::Usage& usage) {
  Encoder enc(request, meta);
  for (const recipe::OutputEvent& e : events) (void)enc.add(e);
  return enc.response_json(usage);
}

// The effective finish reason: tool calls turn a plain stop into tool_calls (spec §2.3).
recipe::FinishReason effective_finish(recipe::FinishReason f, bool has_tool_calls);

}  // namespace dsinfer::api::detail
