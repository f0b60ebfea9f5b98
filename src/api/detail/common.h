// Internal helpers shared by the three protocol codecs.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "api/detail/json_reader.h"
#include "api/options.h"
#include "recipe/types.h"

namespace dsinfer::api::detail {

// ---- decoding ----

// Reads the required `model` and checks it against DecodeOptions::served_models.
// `accept_claude`: the Messages API also takes any "claude*" name.
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

// Deterministic pseudo-random ids (splitmix64).
class IdGen {
 public:
  explicit IdGen(uint64_t seed) : state_(seed) {}
  uint64_t next();
  std::string alnum(int n);
  std::string hex(int n);
  std::string uuid();

 private:
  uint64_t state_;
};

uint64_t mix_seed(uint64_t seed, uint64_t salt);
// "call_00_" + 24 alphanumerics (Chat / Responses), index in 2 digits.
std::string openai_tool_call_id(uint64_t seed, int index);
// "toolu_" + 24 alphanumerics (Messages).
std::string anthropic_tool_use_id(uint64_t seed, int index);

// The effective finish reason: tool calls turn a plain stop into tool_calls (spec §2.3).
recipe::FinishReason effective_finish(recipe::FinishReason f, bool has_tool_calls);

}  // namespace dsinfer::api::detail
