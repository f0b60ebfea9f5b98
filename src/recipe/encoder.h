// Prompt encoder for DeepSeek V4 (preview), V4-0731 and V4.1 (spec recipe §1): renders a
// Conversation into the prompt string the model was trained on, byte-exact with DeepSeek's
// reference encoders (encoding_dsv4.py / deepseek_v41_encoding.py). Token ids come later from
// the tokenizer; special tokens appear here as their strings (tokens.h).
//
// Conversation-level fields map onto the reference encoder's message attributes:
//   - V4 / V4-0731 have no mid-conversation system turn: as deepseek-recipe does, every system
//     message is merged into one leading system message (non-empty contents joined by "\n\n").
//     V4.1 renders later system messages in place as `<｜System｜>…` turns.
//   - tools and the response format attach to the leading system message (messages[0] when it
//     is a system message). Without one, an empty system message is inserted at index 0, so the
//     prompt starts `<BOS>\n\n## Tools…` (vLLM / deepseek-recipe). A V4.1 system message that
//     is not first does not receive them.
//   - the tools block lists the offered tools: none with tool_choice kNone, only the named tool
//     with kNamed (deepseek-recipe). Offered tools => drop_thinking is forced off (reasoning
//     history kept on every turn).
//   - ToolSpec::function_json and response_format_json are pasted verbatim: the API layer
//     serialises them with py_json_dumps (pyjson.h).
//   - response format: response_format_json set (json_schema: the schema object) renders
//     "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to
//     reply:\n{json}". json_output without response_format_json (json_object) renders what
//     deepseek-recipe renders: V4.1 the same block with {"type": "json_object"}, V4 the fixed
//     text "\n\nYou are a helpful assistant designed to output JSON.\n## Response
//     Format:\n\nReply with JSON object ONLY."
//   - an assistant message that no generation-prompt transition opened (first message, after a
//     system message or another assistant message, after a latest_reminder that followed an
//     assistant) gets its own `<｜Assistant｜>` + `<think>`/`</think>` header (deepseek-recipe);
//     the reference encoder would glue it to the previous text.
//   - tool_choice kRequired / kNamed (with tools): after the generation prompt the tool block is
//     opened, "\n\n<｜DSML｜tool_calls>\n" (V4.1 " calls"), as deepseek-recipe does; the
//     parser then starts inside it. The name of kNamed is not enforced by the prompt.
//   - an assistant message with prefix=true must be the final message; it is rendered without
//     EOS (prefix completion) and means continue_final_message: no generation prompt (V4.1), and
//     in thinking mode a reasoning-only prefix (empty content, no tool calls) renders as the bare
//     reasoning without `</think>`, so generation continues the reasoning. The reference V4
//     encoder has no continue_final_message; we follow V4.1 / deepseek-recipe for every version.
//   - tool-call arguments that are not a JSON object (a JSON string is not decoded again) render
//     as {"arguments": raw}, as deepseek-recipe does (also for empty arguments). An invoke
//     without parameters closes on its next line (V4) or after an empty line (V4.1).
//   - V4 / V4-0731 write floats in tool schemas, the response format and tool-call arguments in
//     the V4 form (pyjson.h FloatStyle::kV4: 1e-7, 0.00001); V4.1 like Python (1e-07, 1e-05).
// Not modelled: internal quick-instruction tasks, context prefixes, images.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "recipe/output_parser.h"
#include "recipe/types.h"

namespace dsinfer::recipe {

struct RenderOptions {
  bool add_bos = true;        // reference add_default_bos_token
  bool drop_thinking = true;  // reference default; forced off when the conversation has tools
  // false: nothing follows the final message (no `<｜Assistant｜>` transition).
  bool add_generation_prompt = true;
  // Continue the final assistant message (also implied by its prefix=true).
  bool continue_final_message = false;
  // Render as DeepSeek's Python reference encoders (encoding_dsv4.py, deepseek_v41_encoding.py)
  // do where deepseek-recipe differs from them: V4 floats in Python's repr (1e-07, not 1e-7), an
  // empty line in a V4 tool-call invoke without parameters, and a final assistant message (not a
  // prefix) left as the last turn instead of closed and followed by a generation prompt with
  // its reasoning dropped. Off: deepseek-recipe (the default).
  bool python_reference = false;
};

// A rendered prompt: its text and the byte ranges of `text` that hold the control tokens the
// encoder placed itself (ascending, disjoint; `text.substr(begin, end - begin)` is one token's
// spelling). Everything between the ranges is plain text: a special-token spelling there (in a
// user message, a tool schema, a tool result, reasoning, ...) must be tokenized as ordinary text,
// never as the control token (frontend::encode_prompt). This is deepseek-recipe's
// RenderedPrompt::special_ranges (it places the same tokens: BOS, EOS, the role tokens, `<think>`
// / `</think>`, `<｜latest_reminder｜>`, and `｜DSML｜` in the tools template and in tool calls).
struct SpecialRange {
  size_t begin = 0;
  size_t end = 0;
};
struct RenderedPrompt {
  std::string text;
  std::vector<SpecialRange> special_ranges;
};

// Appends text and control tokens, recording the control tokens' ranges.
class PromptBuilder {
 public:
  void text(std::string_view s) { r_.text.append(s); }
  void special(std::string_view s) {
    r_.special_ranges.push_back({r_.text.size(), r_.text.size() + s.size()});
    r_.text.append(s);
  }
  RenderedPrompt take() && { return std::move(r_); }

 private:
  RenderedPrompt r_;
};

// The full prompt with its control-token ranges; see render_prompt for the errors.
Result<RenderedPrompt> render_conversation(const Conversation& conv,
                                           ModelVersion v,
                                           const RenderOptions& opts = {});

// The full prompt text (render_conversation(...).text), starting with BOS (when add_bos).
// InvalidArgument for a developer message with empty content, prefix on a message that is not the
// final assistant message, continue_final_message without a final assistant message, or a V4.1
// effort_budget outside 0..100.
Result<std::string> render_prompt(const Conversation& conv,
                                  ModelVersion v,
                                  const RenderOptions& opts = {});

// The "## Tools …" block (without the "\n\n" that joins it to the system content), ending in
// "\n". Tool schema lines are the tools' function_json joined by "\n".
std::string render_tools_block(const std::vector<ToolSpec>& tools, ModelVersion v);

// `<｜DSML｜tool_calls>\n<｜DSML｜invoke …>…</｜DSML｜tool_calls>` for an assistant's calls (V4.1:
// spaced tag names), without the leading "\n\n" (python_reference: see RenderOptions).
std::string render_tool_calls(const std::vector<ToolCall>& calls,
                              ModelVersion v,
                              bool python_reference = false);

// The reasoning-effort text placed at index 0 in thinking mode ("" when none).
Result<std::string> reasoning_effort_prefix(const Conversation& conv, ModelVersion v);

// Parser options matching how render_prompt(conv, v, opts) ends: start stage (reasoning after
// `<think>`, content after `</think>`, continuing a prefix, or inside a prefilled tool block),
// parse_tool_calls (tools given and tool_choice != kNone),
// json_output. Stop sequences are the caller's (SamplingParams::stop).
OutputParserOptions parser_options_for(const Conversation& conv,
                                       ModelVersion v,
                                       const RenderOptions& opts = {});

}  // namespace dsinfer::recipe
