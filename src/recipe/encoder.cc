#include "recipe/encoder.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <utility>

#include "base/strings.h"
#include "recipe/pyjson.h"
#include "recipe/tokens.h"

namespace dsinfer::recipe {
namespace {

using nlohmann::ordered_json;

// V4 preview "max" == V4-0731 "high".
constexpr std::string_view kEffortAbsoluteMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

// V4-0731 "max".
constexpr std::string_view kEffortBeyondMax =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
    "exhaustively decompose the problem into its most fundamental components, trace every causal "
    "chain to its root, and resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple "
    "angles and are certain that no assumption remains unchecked and no error remains "
    "undiscovered.\n\n";

constexpr std::string_view kResponseFormatIntro =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// V4 json_object (no schema), as deepseek-recipe renders it.
constexpr std::string_view kJsonObjectV4 =
    "\n\nYou are a helpful assistant designed to output JSON.\n## Response Format:\n\nReply "
    "with JSON object ONLY.";

// DSML tag names per dialect.
struct DsmlNames {
  std::string_view block;  // "tool_calls" / " calls"
  std::string_view invoke;
  std::string_view parameter;
};

DsmlNames dsml_names(ModelVersion v) {
  if (v == ModelVersion::kV41)
    return {" calls", " invoke", " parameter"};
  return {"tool_calls", "invoke", "parameter"};
}

// Internal message after tool merging.
struct Msg {
  Role role = Role::kUser;
  std::string content;
  std::vector<ContentBlock> blocks;  // user
  std::string reasoning;             // assistant
  const std::vector<ToolCall>* tool_calls = nullptr;
  bool tools = false;
  bool response_format = false;
  bool wo_eos = false;
};

std::string cat(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (auto p : parts) s.append(p);
  return s;
}

// Text of a tool message (list content: text parts joined by "\n\n", others unsupported).
std::string tool_message_text(const Message& m) {
  if (m.blocks.empty())
    return m.content;
  std::string out;
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    if (i > 0)
      out.append("\n\n");
    const ContentBlock& b = m.blocks[i];
    if (b.type == ContentBlock::Type::kUnsupported) {
      out.append(cat({"[Unsupported ", b.unsupported_type, "]"}));
    } else {
      out.append(b.text);
    }
  }
  return out;
}

// merge_tool_messages: tool messages become tool_result blocks; consecutive user/tool messages
// collapse into one user message.
std::vector<Msg> merge_messages(const std::vector<Message>& in) {
  std::vector<Msg> out;
  for (const Message& m : in) {
    if (m.role == Role::kTool || m.role == Role::kUser) {
      std::vector<ContentBlock> blocks;
      if (m.role == Role::kTool) {
        ContentBlock b;
        b.type = ContentBlock::Type::kToolResult;
        b.text = tool_message_text(m);
        b.tool_use_id = m.tool_call_id;
        blocks.push_back(std::move(b));
      } else if (!m.blocks.empty()) {
        blocks = m.blocks;
      } else {
        ContentBlock b;
        b.text = m.content;
        blocks.push_back(std::move(b));
      }
      if (!out.empty() && out.back().role == Role::kUser) {
        for (auto& b : blocks) out.back().blocks.push_back(std::move(b));
      } else {
        Msg u;
        u.role = Role::kUser;
        u.blocks = std::move(blocks);
        out.push_back(std::move(u));
      }
      continue;
    }
    Msg x;
    x.role = m.role;
    x.content = m.content;
    if (m.role == Role::kAssistant) {
      x.reasoning = m.reasoning_content.value_or("");
      x.tool_calls = &m.tool_calls;
      x.wo_eos = m.prefix;
    }
    out.push_back(std::move(x));
  }
  return out;
}

// sort_tool_results_by_call_order: tool_result blocks follow the order of the calls in the last
// preceding assistant message with tool calls (unknown id sorts as position 0; stable).
void sort_tool_results(std::vector<Msg>* msgs) {
  std::map<std::string, size_t> order;
  for (Msg& m : *msgs) {
    if (m.role == Role::kAssistant && m.tool_calls != nullptr && !m.tool_calls->empty()) {
      order.clear();
      for (size_t i = 0; i < m.tool_calls->size(); ++i) {
        const std::string& id = (*m.tool_calls)[i].id;
        if (!id.empty())
          order[id] = i;
      }
    } else if (m.role == Role::kUser) {
      std::vector<ContentBlock> results;
      for (const auto& b : m.blocks) {
        if (b.type == ContentBlock::Type::kToolResult)
          results.push_back(b);
      }
      if (results.size() < 2 || order.empty())
        continue;
      auto key = [&](const ContentBlock& b) {
        auto it = order.find(b.tool_use_id);
        return it == order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(
          results.begin(), results.end(), [&](const ContentBlock& a, const ContentBlock& b) {
            return key(a) < key(b);
          });
      size_t k = 0;
      for (auto& b : m.blocks) {
        if (b.type == ContentBlock::Type::kToolResult)
          b = results[k++];
      }
    }
  }
}

// Index of the last user/developer message (V4.1: also a system message after index 0).
int last_user_index(const std::vector<Msg>& msgs, ModelVersion v) {
  for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i) {
    const Role r = msgs[static_cast<size_t>(i)].role;
    if (r == Role::kUser || r == Role::kDeveloper)
      return i;
    if (v == ModelVersion::kV41 && r == Role::kSystem && i > 0)
      return i;
  }
  return -1;
}

// _drop_thinking_messages: before the last user message, assistant reasoning is removed and
// developer messages are dropped.
std::vector<Msg> drop_thinking(std::vector<Msg> msgs, ModelVersion v) {
  const int last_user = last_user_index(msgs, v);
  std::vector<Msg> out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    Msg& m = msgs[i];
    if (static_cast<int>(i) >= last_user) {
      out.push_back(std::move(m));
    } else if (m.role == Role::kAssistant) {
      m.reasoning.clear();
      out.push_back(std::move(m));
    } else if (m.role != Role::kDeveloper) {
      out.push_back(std::move(m));
    }
  }
  return out;
}

// encode_arguments_to_dsml's view of the arguments: a JSON object, or {"arguments": raw} (also
// for a JSON string holding an object: deepseek-recipe does not decode twice).
ordered_json arguments_object(const std::string& raw) {
  // nlohmann's lexer stops at a NUL byte (Python's json.loads rejects it): never JSON.
  auto parse = [](const std::string& text) {
    return text.find('\0') != std::string::npos
               ? ordered_json(ordered_json::value_t::discarded)
               : ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  };
  ordered_json v = parse(raw);
  if (!v.is_discarded() && v.is_object())
    return v;
  ordered_json w = ordered_json::object();
  w["arguments"] = raw;
  return w;
}

// deepseek-recipe's V4 encoding differs from the Python reference encoder in two details (floats
// in the V4 form, no empty line in an invoke without parameters); RenderOptions::
// python_reference renders the latter.
bool v4_recipe_form(ModelVersion v, bool python_reference) {
  return v != ModelVersion::kV41 && !python_reference;
}

FloatStyle float_style(ModelVersion v, bool python_reference) {
  return v4_recipe_form(v, python_reference) ? FloatStyle::kV4 : FloatStyle::kPython;
}

// JSON text written with py_json_dumps (a tool line, a response format) in the version's float
// style: V4 re-dumps it (text that does not parse is kept as is).
std::string json_for(const std::string& text, ModelVersion v, bool python_reference) {
  if (float_style(v, python_reference) == FloatStyle::kPython)
    return text;
  const ordered_json j = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? text : py_json_dumps(j, FloatStyle::kV4);
}

std::string render_user_blocks(const std::vector<ContentBlock>& blocks) {
  std::string out;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i > 0)
      out.append("\n\n");
    const ContentBlock& b = blocks[i];
    switch (b.type) {
      case ContentBlock::Type::kText:
        out.append(b.text);
        break;
      case ContentBlock::Type::kToolResult:
        out.append(cat({"<tool_result>", b.text, "</tool_result>"}));
        break;
      case ContentBlock::Type::kUnsupported:
        out.append(cat({"[Unsupported ", b.unsupported_type, "]"}));
        break;
    }
  }
  return out;
}

}  // namespace

namespace {

// The tools block into `b`: the template's DSML, `<think>` and `</think>` are control tokens
// (deepseek-recipe places them as special tokens); the tool schemas are text.
void build_tools_block(const std::vector<ToolSpec>& tools,
                       ModelVersion v,
                       bool python_reference,
                       PromptBuilder* b) {
  const DsmlNames n = dsml_names(v);
  auto tag = [&](std::string_view open, std::string_view name, std::string_view rest) {
    b->text(open);
    b->special(tok::kDsml);
    b->text(name);
    b->text(rest);
  };
  b->text("## Tools\n\n");
  b->text(
      "You have access to a set of tools to help answer the user's question. You can invoke "
      "tools by writing a \"");
  tag("<", n.block, ">");
  b->text("\" block like the following:\n\n");
  tag("<", n.block, ">\n");
  tag("<", n.invoke, " name=\"$TOOL_NAME\">\n");
  tag("<", n.parameter, " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE");
  tag("</", n.parameter, ">\n");
  b->text("...\n");
  tag("</", n.invoke, ">\n");
  tag("<", n.invoke, " name=\"$TOOL_NAME2\">\n");
  b->text("...\n");
  tag("</", n.invoke, ">\n");
  tag("</", n.block, ">\n\n");
  b->text(
      "String parameters should be specified as is and set `string=\"true\"`. For all other "
      "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
      "`string=\"false\"`.\n\n");
  b->text("If thinking_mode is enabled (triggered by ");
  b->special(tok::kThinkStart);
  b->text("), you MUST output your complete reasoning inside ");
  b->special(tok::kThinkStart);
  b->text("...");
  b->special(tok::kThinkEnd);
  b->text(" BEFORE any tool calls or final response.\n\n");
  b->text("Otherwise, output directly after ");
  b->special(tok::kThinkEnd);
  b->text(" with tool calls or final response.\n\n");
  b->text("### Available Tool Schemas\n\n");
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i > 0)
      b->text("\n");
    b->text(json_for(tools[i].function_json, v, python_reference));
  }
  b->text(
      "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
      "tool calls.\n");
}

// An assistant's DSML tool-call block into `b`: the DSML tokens are control tokens; names,
// keys and values are text.
void build_tool_calls(const std::vector<ToolCall>& calls,
                      ModelVersion v,
                      bool python_reference,
                      PromptBuilder* b) {
  const DsmlNames n = dsml_names(v);
  auto tag = [&](std::string_view open, std::string_view name) {
    b->text(open);
    b->special(tok::kDsml);
    b->text(name);
  };
  tag("<", n.block);
  b->text(">\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i > 0)
      b->text("\n");
    tag("<", n.invoke);
    b->text(" name=\"");
    b->text(calls[i].name);
    b->text("\">\n");
    const ordered_json args = arguments_object(calls[i].arguments);
    bool first = true;
    for (const auto& [key, value] : args.items()) {
      if (!first)
        b->text("\n");
      first = false;
      const bool is_str = value.is_string();
      tag("<", n.parameter);
      b->text(" name=\"");
      b->text(key);
      b->text(is_str ? "\" string=\"true\">" : "\" string=\"false\">");
      if (is_str) {
        b->text(value.get_ref<const std::string&>());
      } else {
        b->text(py_json_dumps(value, float_style(v, python_reference)));
      }
      tag("</", n.parameter);
      b->text(">");
    }
    // deepseek-recipe's V4 closes an invoke without parameters right after its opening line; V4.1
    // (and the V4 Python reference) leaves an empty line.
    if (!args.empty() || !v4_recipe_form(v, python_reference))
      b->text("\n");
    tag("</", n.invoke);
    b->text(">");
  }
  b->text("\n");
  tag("</", n.block);
  b->text(">");
}

}  // namespace

std::string render_tools_block(const std::vector<ToolSpec>& tools, ModelVersion v) {
  PromptBuilder b;
  build_tools_block(tools, v, /*python_reference=*/false, &b);
  return std::move(b).take().text;
}

std::string render_tool_calls(const std::vector<ToolCall>& calls,
                              ModelVersion v,
                              bool python_reference) {
  PromptBuilder b;
  build_tool_calls(calls, v, python_reference, &b);
  return std::move(b).take().text;
}

Result<std::string> reasoning_effort_prefix(const Conversation& conv, ModelVersion v) {
  if (v == ModelVersion::kV41) {
    if (conv.effort_budget < 0 || conv.effort_budget > 100) {
      return invalid_argument(
          str_format("reasoning effort budget %d outside 1..100", conv.effort_budget));
    }
    if (conv.thinking != ThinkingMode::kThinking)
      return std::string();
    int budget = conv.effort_budget;
    if (budget == 0) {
      // Current official mapping (deepseek-recipe 0.2.0, vLLM 0.33): low=50, high=xhigh=75,
      // max=100, default high. (The first vLLM port used low=25, high=50, xhigh=75.)
      switch (conv.effort) {
        case ReasoningEffort::kLow:
          budget = 50;
          break;
        case ReasoningEffort::kMax:
          budget = 100;
          break;
        case ReasoningEffort::kUnset:
        case ReasoningEffort::kHigh:
          budget = 75;
          break;
      }
    }
    return str_format(
        "Reasoning Effort: %d (range 1-100, the higher the value, the more thorough the "
        "reasoning)\n\n",
        budget);
  }
  if (conv.thinking != ThinkingMode::kThinking)
    return std::string();
  if (v == ModelVersion::kV4) {
    return std::string(conv.effort == ReasoningEffort::kMax ? kEffortAbsoluteMax : "");
  }
  // V4-0731: default "low" adds nothing.
  switch (conv.effort) {
    case ReasoningEffort::kHigh:
      return std::string(kEffortAbsoluteMax);
    case ReasoningEffort::kMax:
      return std::string(kEffortBeyondMax);
    case ReasoningEffort::kUnset:
    case ReasoningEffort::kLow:
      break;
  }
  return std::string();
}

namespace {

// V4 has no mid-conversation system turn: like deepseek-recipe, all system messages are merged
// (non-empty contents joined by "\n\n") into one leading system message. V4.1 turns Responses
// developer items into system messages. Returns `in` unchanged when nothing changes.
const std::vector<Message>& normalized_messages(const std::vector<Message>& in,
                                                ModelVersion v,
                                                std::vector<Message>* storage) {
  if (v == ModelVersion::kV41) {
    // Responses developer items are system turns (deepseek-recipe).
    if (std::none_of(in.begin(), in.end(), [](const Message& m) { return m.developer; }))
      return in;
    *storage = in;
    for (Message& m : *storage) {
      if (!m.developer)
        continue;
      m.role = Role::kSystem;
      if (!m.blocks.empty()) {
        m.content = render_user_blocks(m.blocks);
        m.blocks.clear();
      }
    }
    return *storage;
  }
  std::string sys;
  bool any = false;
  for (const Message& m : in) {
    if (m.role != Role::kSystem)
      continue;
    any = true;
    if (m.content.empty())
      continue;
    if (!sys.empty())
      sys.append("\n\n");
    sys.append(m.content);
  }
  if (!any)
    return in;
  storage->clear();
  if (!sys.empty()) {
    Message m;
    m.role = Role::kSystem;
    m.content = std::move(sys);
    storage->push_back(std::move(m));
  }
  for (const Message& m : in) {
    if (m.role != Role::kSystem)
      storage->push_back(m);
  }
  return *storage;
}

// The tools the prompt lists: none for tool_choice kNone, only the named one for kNamed
// (deepseek-recipe), else all.
std::vector<ToolSpec> offered_tools(const Conversation& conv) {
  if (conv.tool_choice == ToolChoice::kNone)
    return {};
  if (conv.tool_choice != ToolChoice::kNamed)
    return conv.tools;
  std::vector<ToolSpec> out;
  for (const ToolSpec& t : conv.tools) {
    if (t.name == conv.tool_choice_name)
      out.push_back(t);
  }
  return out;
}

// Whether a final assistant message `last` is closed and followed by a generation prompt
// (deepseek-recipe, V4 and V4.1) rather than left as the last turn (the Python reference V4
// encoder). The caller checks that there is a generation prompt and no continuation.
template <typename M>
bool closes_final_assistant(const M* last, const RenderOptions& opts) {
  return last != nullptr && last->role == Role::kAssistant && !opts.python_reference;
}

bool wants_continue_final(const std::vector<Message>& in, const RenderOptions& opts) {
  return opts.continue_final_message ||
         (!in.empty() && in.back().role == Role::kAssistant && in.back().prefix);
}

// Whether the prompt ends with a generation prompt (`<｜Assistant｜><think>` / `</think>`).
bool ends_with_generation_prompt(const Conversation& conv,
                                 ModelVersion v,
                                 const RenderOptions& opts) {
  if (!opts.add_generation_prompt || wants_continue_final(conv.messages, opts))
    return false;
  std::vector<Message> storage;
  const auto& msgs = normalized_messages(conv.messages, v, &storage);
  const bool extra_system =
      !offered_tools(conv).empty() || conv.response_format_json.has_value() || conv.json_output;
  Role last;
  if (!msgs.empty()) {
    last = msgs.back().role == Role::kTool ? Role::kUser : msgs.back().role;
  } else if (extra_system) {
    last = Role::kSystem;
  } else {
    return false;
  }
  if (last == Role::kUser || last == Role::kDeveloper)
    return true;
  if (last == Role::kAssistant && closes_final_assistant(&msgs.back(), opts))
    return true;
  return v == ModelVersion::kV41 && (last == Role::kSystem || last == Role::kAssistant);
}

bool prefills_tool_block(const Conversation& conv, ModelVersion v, const RenderOptions& opts) {
  return !offered_tools(conv).empty() &&
         (conv.tool_choice == ToolChoice::kRequired || conv.tool_choice == ToolChoice::kNamed) &&
         ends_with_generation_prompt(conv, v, opts);
}

}  // namespace

Result<RenderedPrompt> render_conversation(const Conversation& conv,
                                           ModelVersion v,
                                           const RenderOptions& opts) {
  const auto& given = conv.messages;
  for (size_t i = 0; i < given.size(); ++i) {
    const Message& m = given[i];
    if (m.role == Role::kDeveloper && m.content.empty()) {
      return invalid_argument(str_format("message %zu: developer message has empty content", i));
    }
    if (m.prefix && (m.role != Role::kAssistant || i + 1 != given.size())) {
      return invalid_argument(
          str_format("message %zu: prefix is only allowed on the final assistant message", i));
    }
  }
  const bool continue_final = wants_continue_final(given, opts);
  if (continue_final && (given.empty() || given.back().role != Role::kAssistant)) {
    return invalid_argument("continue_final_message requires a final assistant message");
  }
  DSI_ASSIGN_OR_RETURN(const std::string effort, reasoning_effort_prefix(conv, v));
  const bool v41 = v == ModelVersion::kV41;

  std::vector<Message> storage;
  const std::vector<Message>& in = normalized_messages(given, v, &storage);

  // Tools and the response format go on the leading system message (inserted when missing).
  const std::vector<ToolSpec> tools = offered_tools(conv);
  const bool has_tools = !tools.empty();
  std::string response_format;
  if (conv.response_format_json.has_value()) {
    response_format = cat({"\n\n",
                           kResponseFormatIntro,
                           json_for(*conv.response_format_json, v, opts.python_reference)});
  } else if (conv.json_output) {
    // json_object without a schema, as deepseek-recipe renders it.
    response_format = v41 ? cat({"\n\n", kResponseFormatIntro, "{\"type\": \"json_object\"}"})
                          : std::string(kJsonObjectV4);
  }
  std::vector<Msg> msgs = merge_messages(in);
  if (has_tools || !response_format.empty()) {
    if (msgs.empty() || msgs.front().role != Role::kSystem) {
      Msg sys;
      sys.role = Role::kSystem;
      msgs.insert(msgs.begin(), std::move(sys));
    }
    msgs.front().tools = has_tools;
    msgs.front().response_format = !response_format.empty();
  }
  if (continue_final)
    msgs.back().wo_eos = true;
  sort_tool_results(&msgs);

  const bool thinking = conv.thinking == ThinkingMode::kThinking;
  const bool drop = opts.drop_thinking && !has_tools;
  if (thinking && drop)
    msgs = drop_thinking(std::move(msgs), v);
  const bool add_generation_prompt = opts.add_generation_prompt && !continue_final;
  int last_user = last_user_index(msgs, v);
  // A complete final assistant message is history: the generation prompt opens a new turn after
  // it, so with dropped thinking its reasoning goes too (deepseek-recipe).
  const bool closes_final =
      add_generation_prompt && closes_final_assistant(msgs.empty() ? nullptr : &msgs.back(), opts);
  if (closes_final && thinking && drop) {
    for (Msg& m : msgs) {
      if (m.role == Role::kAssistant)
        m.reasoning.clear();
    }
    last_user = static_cast<int>(msgs.size()) - 1;
  }

  PromptBuilder p;
  if (opts.add_bos)
    p.special(tok::kBos);
  // The think token that follows `<｜Assistant｜>` when opening the turn of message `idx` (or
  // the turn after message `idx - 1`).
  auto think_token = [&](int idx) {
    return thinking && (!drop || idx > last_user) ? tok::kThinkStart : tok::kThinkEnd;
  };
  bool turn_open = false;  // the last transition opened an assistant turn not yet rendered
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Msg& m = msgs[i];
    const bool is_last = i + 1 == msgs.size();
    const int idx = static_cast<int>(i);
    if (i == 0) {
      if (v41 && (!effort.empty() || m.role == Role::kSystem))
        p.special(tok::kSystem);
      p.text(effort);
    }
    switch (m.role) {
      case Role::kSystem:
      case Role::kDeveloper: {
        if (m.role == Role::kDeveloper) {
          p.special(tok::kUser);
        } else if (v41 && i > 0) {
          p.special(tok::kSystem);
        }
        p.text(m.content);
        if (m.tools) {
          p.text("\n\n");
          build_tools_block(tools, v, opts.python_reference, &p);
        }
        if (m.response_format)
          p.text(response_format);
        break;
      }
      case Role::kUser:
        p.special(tok::kUser);
        p.text(render_user_blocks(m.blocks));
        break;
      case Role::kLatestReminder:
        p.special(tok::kLatestReminder);
        p.text(m.content);
        break;
      case Role::kAssistant: {
        // An assistant message that no transition opened (first message, after a system message,
        // another assistant message, ...) gets its own `<｜Assistant｜>` header, as
        // deepseek-recipe renders it.
        if (!turn_open) {
          p.special(tok::kAssistant);
          p.special(think_token(idx));
        }
        const bool has_calls = m.tool_calls != nullptr && !m.tool_calls->empty();
        if (thinking && (!drop || idx > last_user)) {
          p.text(m.reasoning);
          // Continuing a reasoning-only final message: keep the reasoning open (V4.1
          // continue_final_message; deepseek-recipe does the same for V4).
          const bool reasoning_only =
              is_last && continue_final && !m.reasoning.empty() && m.content.empty() && !has_calls;
          if (!reasoning_only)
            p.special(tok::kThinkEnd);
        }
        p.text(m.content);
        if (has_calls) {
          p.text("\n\n");
          build_tool_calls(*m.tool_calls, v, opts.python_reference, &p);
        }
        if (!m.wo_eos)
          p.special(tok::kEos);
        break;
      }
      case Role::kTool:  // merged into user messages above
        break;
    }
    if (m.role != Role::kLatestReminder)
      turn_open = false;

    // Transition (generation prompt) after the message.
    if (is_last && !add_generation_prompt)
      continue;
    if (!is_last && msgs[i + 1].role != Role::kAssistant &&
        msgs[i + 1].role != Role::kLatestReminder) {
      continue;
    }
    // A latest_reminder that a non-assistant message follows does not open the assistant turn
    // (deepseek-recipe; the Python reference encoders open it).
    if (!is_last && msgs[i + 1].role == Role::kLatestReminder && !opts.python_reference) {
      size_t j = i + 1;
      while (j < msgs.size() && msgs[j].role == Role::kLatestReminder) ++j;
      if (j < msgs.size() && msgs[j].role != Role::kAssistant)
        continue;
    }
    bool opens_assistant =
        m.role == Role::kUser || m.role == Role::kDeveloper || (is_last && closes_final);
    if (v41) {
      opens_assistant = opens_assistant || (m.role == Role::kSystem && i > 0) ||
                        (is_last && (m.role == Role::kSystem || m.role == Role::kAssistant));
    }
    if (opens_assistant) {
      p.special(tok::kAssistant);
      p.special(think_token(idx + 1));
      turn_open = true;
    }
  }
  // tool_choice required / named: open the tool block (deepseek-recipe); the parser starts
  // inside it (parser_options_for).
  if (prefills_tool_block(conv, v, opts)) {
    const DsmlNames n = dsml_names(v);
    p.text("\n\n<");
    p.special(tok::kDsml);
    p.text(n.block);
    p.text(">\n");
  }
  return std::move(p).take();
}

Result<std::string> render_prompt(const Conversation& conv,
                                  ModelVersion v,
                                  const RenderOptions& opts) {
  DSI_ASSIGN_OR_RETURN(RenderedPrompt r, render_conversation(conv, v, opts));
  return std::move(r.text);
}

OutputParserOptions parser_options_for(const Conversation& conv,
                                       ModelVersion v,
                                       const RenderOptions& opts) {
  OutputParserOptions o;
  o.parse_tool_calls = !conv.tools.empty() && conv.tool_choice != ToolChoice::kNone;
  o.json_output = conv.json_output;
  const bool thinking = conv.thinking == ThinkingMode::kThinking;
  const auto& in = conv.messages;
  if (prefills_tool_block(conv, v, opts)) {
    o.start = ParseStart::kToolCalls;
    return o;
  }
  if (wants_continue_final(in, opts) && !in.empty() && in.back().role == Role::kAssistant) {
    const Message& m = in.back();
    const bool reasoning_only = thinking && !m.reasoning_content.value_or("").empty() &&
                                m.content.empty() && m.tool_calls.empty();
    if (reasoning_only) {
      o.start = ParseStart::kReasoning;
    } else if (m.content.empty() && m.tool_calls.empty()) {
      o.start = ParseStart::kContentStart;
    } else {
      o.start = ParseStart::kContent;
    }
    return o;
  }
  o.start = thinking ? ParseStart::kReasoningStart : ParseStart::kContentStart;
  return o;
}

}  // namespace dsinfer::recipe
