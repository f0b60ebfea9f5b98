// Protocol-neutral conversation, sampling and output-event types: the contract between the
// API codecs (src/api: JSON <-> these types), the prompt encoder and output parser
// (src/recipe) and, later, the engine. No JSON library types appear here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsinfer::recipe {

// Which prompt dialect to render (spec recipe §1.5, §1.13).
enum class ModelVersion {
  kV4,      // V4 preview (Apr 2026): only effort "max" adds a prefix
  kV40731,  // V4 0731/GA: effort ladder low/high/max
  kV41,     // V4.1: <｜System｜>, spaced DSML tags, numeric effort budget
};

enum class ThinkingMode { kChat, kThinking };

// API effort after alias mapping (minimal->low, medium/xhigh->high, ultra->max); "none" turns
// thinking off and is not represented here.
enum class ReasoningEffort { kUnset, kLow, kHigh, kMax };

enum class Role { kSystem, kUser, kAssistant, kTool, kDeveloper, kLatestReminder };

struct ToolCall {
  std::string id;  // "call_00_..." (assigned by the server when the model made it)
  std::string name;
  std::string arguments;  // JSON text exactly as given / generated
};

// One part of a user/tool message.
struct ContentBlock {
  enum class Type { kText, kToolResult, kUnsupported };
  Type type = Type::kText;
  std::string text;              // kText: the text; kToolResult: the result text
  std::string tool_use_id;       // kToolResult
  std::string unsupported_type;  // kUnsupported: e.g. "image_url" -> "[Unsupported image_url]"
  // kToolResult: the result carried image parts (Messages' tool_result content), rendered as
  // "[Unsupported image]" text for V4 and refused for V4.1 (frontend/prepare.cc).
  bool has_image = false;
};

struct Message {
  Role role = Role::kUser;
  std::string content;                           // plain text content (system/assistant/reminder)
  std::vector<ContentBlock> blocks;              // user/tool content parts (empty: use `content`)
  std::optional<std::string> reasoning_content;  // assistant
  std::vector<ToolCall> tool_calls;              // assistant
  std::string tool_call_id;                      // tool
  bool prefix = false;  // assistant prefix completion: rendered without EOS
  // A Responses `developer` item (role kUser): V4.1 renders it as a system turn, V4 as user text
  // (deepseek-recipe).
  bool developer = false;
};

// A function tool; `function_json` is the tool's `function` object (name, description,
// parameters[, strict]) serialised exactly as Python json.dumps(ensure_ascii=False) would,
// keys in request order: it is pasted into the prompt's tool-schema lines.
struct ToolSpec {
  std::string name;
  std::string function_json;
  bool strict = false;  // declared `strict: true` (not rendered; the API layer validates with it)
};

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct Conversation {
  std::vector<Message> messages;
  std::vector<ToolSpec> tools;
  // kNone: no tools block is rendered (the tools are not offered); kNamed: only the named tool
  // is listed (deepseek-recipe).
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;                     // kNamed
  std::optional<std::string> response_format_json;  // rendered into the system block
  bool json_output = false;                         // response_format json_object
  ThinkingMode thinking = ThinkingMode::kThinking;
  ReasoningEffort effort = ReasoningEffort::kUnset;
  int effort_budget = 0;  // V4.1 numeric effort (1..100), 0 = default
};

struct SamplingParams {
  std::optional<int64_t> max_tokens;  // unset: protocol/mode default
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0 = off
  float min_p = 0.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // stop strings (content only)
  std::vector<int32_t> stop_token_ids;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool ignore_eos = false;
};

// Structured output: a grammar the answer content must follow (the reasoning block and the
// prompt format's wrapper tokens are not constrained). Set from response_format (Chat),
// text.format (Responses) or vLLM's structured_outputs / guided_* extensions.
struct OutputConstraint {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kGrammar };
  Kind kind = Kind::kNone;
  std::string text;   // the schema (JSON text), regex or EBNF grammar
  std::string param;  // the request field it came from, for error messages
};

// A decoded API request: what to render and how to sample.
struct GenerationRequest {
  std::string model;
  Conversation conversation;
  SamplingParams sampling;
  bool stream = false;
  bool include_usage = false;  // Chat stream_options.include_usage
  int32_t n = 1;
  // Chat `best_of` (vLLM's extension): best_of >= n choices are generated (seeds as for n) and
  // the n with the highest cumulative logprob are returned; 0 = n. Not with streaming.
  int32_t best_of = 0;
  std::string user;  // user / user_id / metadata.user_id
  OutputConstraint constraint;
  // false (Chat/Responses `parallel_tool_calls: false`, Messages `tool_choice.
  // disable_parallel_tool_use: true`): at most one tool call per turn; the output ends after it.
  bool parallel_tool_calls = true;
};

enum class FinishReason { kStop, kLength, kToolCalls, kStopSequence, kAborted, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "tool_calls", ...

// Typed events emitted by the streaming output parser (recipe) and consumed by the API
// encoders. Tool-call arguments stream as JSON text deltas.
// The log-probability of one generated token (the model's raw distribution, before penalties
// and temperature), with its most likely alternatives. `bytes` are the token's raw bytes (a
// token may hold part of a UTF-8 character).
struct TokenAlternative {
  std::string bytes;
  float logprob = 0.0f;
};
struct TokenLogprob {
  std::string bytes;
  float logprob = 0.0f;
  std::vector<TokenAlternative> top;  // descending
};

struct OutputEvent {
  enum class Type {
    kReasoningDelta,
    kContentDelta,
    kToolCallStart,           // tool_index, tool_name (id assigned by the API layer)
    kToolCallArgumentsDelta,  // tool_index, text
    kToolCallEnd,             // tool_index
    kFinish,                  // finish, stop_sequence
  };
  Type type = Type::kContentDelta;
  std::string text;
  int32_t tool_index = -1;
  std::string tool_name;
  FinishReason finish = FinishReason::kStop;
  std::string stop_sequence;  // kFinish with kStopSequence: the matched string
  // With logprobs requested: the answer-content tokens generated since the previous event that
  // carried some (on a kContentDelta, or on kFinish for the last ones).
  std::vector<TokenLogprob> logprobs;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt_cache_hit_tokens
  int64_t reasoning_tokens = 0;
};

}  // namespace dsinfer::recipe
