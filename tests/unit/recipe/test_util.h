// Test helpers: build a recipe::Conversation from an OpenAI-Chat-like JSON document (the
// fixture format), read fixture files.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "recipe/pyjson.h"
#include "recipe/types.h"

namespace dsinfer::recipe::testing {

inline std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string fixture_path(const std::string& name) {
  return std::string(DSI_SOURCE_DIR) + "/tests/fixtures/recipe/" + name;
}

inline Role role_from(const std::string& r) {
  if (r == "system")
    return Role::kSystem;
  if (r == "assistant")
    return Role::kAssistant;
  if (r == "tool")
    return Role::kTool;
  if (r == "developer")
    return Role::kDeveloper;
  if (r == "latest_reminder")
    return Role::kLatestReminder;
  return Role::kUser;
}

// {"thinking_mode": "thinking"|"chat", "effort": "low"|"high"|"max", "effort_budget": n,
//  "tools": [{"type": "function", "function": {...}}], "response_format": {...},
//  "messages": [{"role", "content": str | [{"type": "text", "text"} | {"type": X}],
//                "reasoning_content", "tool_calls": [{"id", "function": {"name", "arguments"}}],
//                "tool_call_id", "prefix"}]}
inline Conversation conversation_from_json(const nlohmann::ordered_json& j) {
  Conversation c;
  c.thinking = j.value("thinking_mode", std::string("thinking")) == "chat"
                   ? ThinkingMode::kChat
                   : ThinkingMode::kThinking;
  const std::string effort =
      j.contains("effort") && j["effort"].is_string() ? j["effort"].get<std::string>() : "";
  if (effort == "low")
    c.effort = ReasoningEffort::kLow;
  if (effort == "high")
    c.effort = ReasoningEffort::kHigh;
  if (effort == "max")
    c.effort = ReasoningEffort::kMax;
  c.effort_budget = j.value("effort_budget", 0);
  if (j.contains("tools")) {
    for (const auto& t : j["tools"]) {
      ToolSpec s;
      s.name = t["function"]["name"].get<std::string>();
      s.function_json = py_json_dumps(t["function"]);
      c.tools.push_back(s);
    }
    c.tool_choice = ToolChoice::kAuto;
    const std::string tc = j.contains("tool_choice") && j["tool_choice"].is_string()
                               ? j["tool_choice"].get<std::string>()
                               : "auto";
    if (tc == "required")
      c.tool_choice = ToolChoice::kRequired;
    if (tc == "none")
      c.tool_choice = ToolChoice::kNone;
  }
  c.json_output = j.value("json_output", false);
  if (j.contains("response_format"))
    c.response_format_json = py_json_dumps(j["response_format"]);
  for (const auto& m : j["messages"]) {
    Message msg;
    msg.role = role_from(m["role"].get<std::string>());
    if (m.contains("content") && m["content"].is_string()) {
      msg.content = m["content"].get<std::string>();
    } else if (m.contains("content") && m["content"].is_array()) {
      for (const auto& part : m["content"]) {
        ContentBlock b;
        const std::string type = part["type"].get<std::string>();
        if (type == "text") {
          b.text = part["text"].get<std::string>();
        } else if (type == "tool_result") {
          b.type = ContentBlock::Type::kToolResult;
          b.text = part["content"].get<std::string>();
          b.tool_use_id = part.value("tool_use_id", std::string());
        } else {
          b.type = ContentBlock::Type::kUnsupported;
          b.unsupported_type = type;
        }
        msg.blocks.push_back(b);
      }
    }
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string()) {
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    }
    if (m.contains("tool_calls")) {
      for (const auto& tc : m["tool_calls"]) {
        ToolCall call;
        call.id = tc.value("id", std::string());
        call.name = tc["function"]["name"].get<std::string>();
        call.arguments = tc["function"]["arguments"].get<std::string>();
        msg.tool_calls.push_back(call);
      }
    }
    msg.tool_call_id = m.value("tool_call_id", std::string());
    msg.prefix = m.value("prefix", false);
    c.messages.push_back(msg);
  }
  return c;
}

}  // namespace dsinfer::recipe::testing
