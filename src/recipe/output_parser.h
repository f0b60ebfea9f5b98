// Streaming parser for DeepSeek V4 / V4.1 model output (spec recipe §2): splits generated text
// into reasoning, answer content and DSML tool calls, and emits OutputEvents (types.h).
//
// Feed decoded text in chunks of any size (a chunk may end inside a marker or inside a UTF-8
// character); the merged events are the same for every chunking. Only bytes that could still
// begin a marker are held back, plus an incomplete trailing UTF-8 sequence, so every text delta
// is valid UTF-8 when the input is.
//
// Recognised markup (both V4 `<｜DSML｜tool_calls>`/`invoke`/`parameter` and V4.1
// `<｜DSML｜ calls>`/` invoke`/` parameter`, plus V3.2 `function_calls` and the ASCII `|DSML|`
// variant):
//   reasoning: `\n*</think>` ends it; a DSML token (and the newlines before it) ends it and opens
//     the tool block; `<think>` is reasoning text (as in deepseek-recipe); leading newlines are
//     dropped at kReasoningStart.
//   content: leading newlines are dropped (kContentStart, and after `</think>`); a DSML token
//     (and the newlines before it; also a bare or closing one) opens the tool block; stray
//     `</think>` is dropped; `<think>` before any content switches to reasoning, later it is
//     dropped; stop sequences end output (the stop string is not emitted; the one that ends
//     first wins). Stop sequences never match in reasoning or tool markup.
//   json_output: content is the first top-level `{…}` / `[…]` (brackets counted outside JSON
//     strings; "\n```" also ends it); text before and after it is dropped; stop sequences match
//     inside it only; tool calls may follow.
//   everywhere: `<｜end▁of▁sentence｜>` ends output; `<｜begin▁of▁sentence｜>` is dropped.
//   After the tool block closes, everything is dropped.
// No content delta contains `｜DSML｜`, `<think>`, `</think>`, BOS or EOS; reasoning may contain
// `<think>` (the model writing it literally), none of the others. (Text on
// both sides of a dropped stray marker goes into separate deltas; their concatenation may spell a
// marker only if the model wrote one around the dropped token, e.g. "<thi</think>nk>".)
//
// Tool calls: ToolCallStart (name) when `invoke name="…"` closes, then the arguments stream as
// JSON text shaped like the official decode_dsml_to_arguments: `{"key": "escaped", "k2": raw}`
// (`, ` and `": ` separators; keys and string="true" values escaped like Python json.dumps with
// ensure_ascii=False). A string="false" value is buffered until its closing tag and emitted
// verbatim when it is valid JSON, as a JSON string when it is not, and as `null` when empty.
// Malformed markup is skipped, never emitted as content.
//
// With max_tool_calls = n, the output ends (done(), finish reason kToolCalls) when the n-th call
// ends (its `</invoke>`, or the next invoke opening); nothing after it is parsed.
//
// Truncation / malformed-block policy: a call whose name has not closed is dropped (no events).
// A started call that is cut off (finish(), EOS, a new invoke, or the block ending inside it) is
// completed: the parser closes the open key / string / value (`null` for a missing value) and the
// object, then emits ToolCallEnd, so every call's arguments are a complete JSON object.
//
// Finish reason (finish()): kStopSequence if a stop sequence matched; else the backend reason
// when it is kAborted/kError, or kLength, and the output did not end by itself (EOS text, tool
// block closed); else kToolCalls if any call started; else kStop. So a reply truncated before its
// tool block closed reports kLength (the calls it started are still completed and delivered).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "recipe/types.h"

namespace dsinfer::recipe {

// Where the output starts, i.e. how the prompt ended.
enum class ParseStart {
  kReasoningStart,  // prompt ended with `<think>`: reasoning, leading newlines dropped
  kReasoning,       // continuing a reasoning prefix (V4.1 continue_final_message)
  kContentStart,    // prompt ended with `</think>`: content, leading newlines dropped
  kContent,         // continuing a content prefix: newlines kept
  kToolCalls,       // the prompt already opened the DSML tool block
};

struct OutputParserOptions {
  ParseStart start = ParseStart::kContentStart;
  // false: DSML markup is still recognised and swallowed, but emits no tool events.
  bool parse_tool_calls = true;
  // json_object mode: content is only the first top-level JSON object/array; text before it
  // (prose, ``` fences) and after it is dropped.
  bool json_output = false;
  bool accept_ascii_dsml = true;            // also treat `|DSML|` as the DSML token
  std::vector<std::string> stop_sequences;  // matched in content only; empty ones ignored
  // Kind::kAny text: an EOS spelling ends the output (false) or stays text (true: as
  // deepseek-recipe treats text chunks; `dsinfer recipe parse`). A kControl EOS always ends it.
  bool eos_spelling_is_text = false;
  // At most this many tool calls (0: no limit). The output ends, as when the tool block closes,
  // right after the call that reaches it (`parallel_tool_calls: false` sets 1).
  int32_t max_tool_calls = 0;
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);
  ~OutputParser();
  OutputParser(const OutputParser&) = delete;
  OutputParser& operator=(const OutputParser&) = delete;

  // What a fed piece of text is. kAny: decoded text whose token boundaries are unknown (markers
  // are recognised wherever they are spelled). kText: ordinary tokens' text: a special-token
  // spelling in it (the model writing `</think>` as plain characters) is never a marker and stays
  // text. kControl: the text of exactly one added (control) token: it can match a marker.
  enum class Kind { kAny, kText, kControl };
  std::vector<OutputEvent> feed(std::string_view text, Kind kind = Kind::kAny);
  // Flushes held-back text, completes an open tool call and emits the kFinish event. Later
  // feed()/finish() calls return nothing.
  std::vector<OutputEvent> finish(FinishReason backend_reason);

  // True once the output ended by itself (EOS text, stop sequence, tool block closed): the
  // caller may stop generating; further text is ignored.
  bool done() const;
  // True while the parser is in reasoning (for reasoning-token accounting).
  bool in_reasoning() const;
  int32_t tool_calls_started() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text
};

struct ParsedMessage {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  FinishReason finish = FinishReason::kStop;
  std::string stop_sequence;  // with kStopSequence
};

// Non-streaming: feeds `text` whole, then finish(backend_reason), and aggregates the events.
ParsedMessage parse_completion(std::string_view text,
                               const OutputParserOptions& options,
                               FinishReason backend_reason = FinishReason::kStop);

// Aggregates a complete event sequence (as parse_completion does).
ParsedMessage aggregate_events(const std::vector<OutputEvent>& events);

// Merges adjacent text deltas of the same kind (and tool index): the canonical form used to
// compare event streams produced under different chunkings.
std::vector<OutputEvent> coalesce_events(const std::vector<OutputEvent>& events);

}  // namespace dsinfer::recipe
