#include "grammar/tool_calls.h"

#include <nlohmann/json.hpp>

namespace dsinfer::grammar {

namespace {
using Json = nlohmann::ordered_json;

Json const_string(std::string value) {
  return Json{{"type", "const_string"}, {"value", std::move(value)}};
}
}  // namespace

Result<Spec> dsml_tool_calls_spec(const DsmlToolCalls& calls) {
  if (calls.tools.empty())
    return invalid_argument("tool-call grammar: no tools");
  const std::string d = kDsmlMarker;
  const std::string block = calls.v41 ? " calls" : "tool_calls";
  const std::string invoke = calls.v41 ? " invoke" : "invoke";
  Json tags = Json::array();
  for (const DsmlTool& t : calls.tools) {
    if (t.name.empty() || t.name.find_first_of("\"<>\n") != std::string::npos ||
        t.name.find(d.substr(0, 3)) != std::string::npos) {
      return invalid_argument(
          "tool-call grammar: a tool name cannot be written in a DSML invoke (empty, or with `\"`, "
          "`<`, `>`, a newline or `｜`)");
    }
    Json schema = Json{{"type", "object"}};
    if (t.schema) {
      if (json_nesting(*t.schema) > kMaxSchemaDepth) {
        return invalid_argument("tool '" + t.name + "': parameters nest deeper than " +
                                std::to_string(kMaxSchemaDepth) + " levels");
      }
      schema = Json::parse(bounded_schema(*t.schema), nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded() || !(schema.is_object() || schema.is_boolean()))
        return invalid_argument("tool '" + t.name + "': parameters must be a JSON schema object");
    }
    Json content = {
        {"type", "json_schema"},
        {"json_schema", std::move(schema)},
        {"style", calls.v41 ? "deepseek_v4_1_xml" : "deepseek_xml"},
        // Strings (raw values and JSON strings) never spell the marker's first character.
        {"excludes", Json::array({d.substr(0, 3)})},
        // Runs of whitespace around JSON values stay short (no loop on blanks).
        {"max_whitespace_cnt", 2},
    };
    tags.push_back(Json{{"type", "tag"},
                        {"begin", "<" + d + invoke + " name=\"" + t.name + "\">\n"},
                        {"content", std::move(content)},
                        {"end", "</" + d + invoke + ">\n"}});
  }
  Json elements = Json::array();
  if (!calls.opened_by_prompt)
    elements.push_back(const_string(d + block + ">\n"));
  elements.push_back(Json{{"type", "tags_with_separator"},
                          {"tags", std::move(tags)},
                          {"separator", ""},
                          {"at_least_one", true},
                          {"stop_after_first", calls.single_call}});
  elements.push_back(const_string("</" + d + block + ">"));
  Json tag = {{"type", "structural_tag"},
              {"format", Json{{"type", "sequence"}, {"elements", std::move(elements)}}}};
  std::string text;
  try {
    text = tag.dump();
  } catch (const Json::exception&) {
    return invalid_argument("tool-call grammar: a tool name is not valid UTF-8");
  }
  return Spec{Kind::kStructuralTag, std::move(text)};
}

}  // namespace dsinfer::grammar
