// libFuzzer: the grammar module's request-facing text handling (no grammar engine needed):
// grammar::bounded_schema on arbitrary text (JSON in gives JSON out; an email format without a
// pattern comes back as a pattern) and grammar::dsml_tool_calls_spec on an arbitrary tool name
// and schema (an accepted one is a JSON structural tag holding that name and schema).
// Input: byte 0 picks V4/V4.1 and prompt-opened; then `name \n schema`.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "grammar/grammar.h"
#include "grammar/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const uint8_t flags = data[0];
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  using nlohmann::json;

  const std::string bounded = dsinfer::grammar::bounded_schema(rest);
  const json in = json::parse(rest, nullptr, /*allow_exceptions=*/false);
  if (!in.is_discarded()) {
    const json out = json::parse(bounded, nullptr, /*allow_exceptions=*/false);
    if (out.is_discarded())
      __builtin_trap();
    if (in.is_object() && in.contains("format") && in["format"] == "email" &&
        !in.contains("pattern") && (!out.contains("pattern") || out.contains("format"))) {
      __builtin_trap();
    }
  } else if (bounded != rest) {
    __builtin_trap();  // not JSON: passed through
  }

  const size_t nl = rest.find('\n');
  dsinfer::grammar::DsmlToolCalls calls;
  calls.v41 = flags & 1;
  calls.opened_by_prompt = flags & 2;
  dsinfer::grammar::DsmlTool tool;
  tool.name = rest.substr(0, nl);
  if (nl != std::string::npos && !(flags & 4))
    tool.schema = rest.substr(nl + 1);
  calls.tools.push_back(tool);
  auto spec = dsinfer::grammar::dsml_tool_calls_spec(calls);
  if (!spec.ok())
    return 0;
  if (spec->kind != dsinfer::grammar::Kind::kStructuralTag)
    __builtin_trap();
  const json tag = json::parse(spec->text, nullptr, /*allow_exceptions=*/false);
  if (tag.is_discarded() || tag["type"] != "structural_tag")
    __builtin_trap();
  // The invoke tag names the tool.
  bool named = false;
  for (const json& e : tag["format"]["elements"]) {
    if (e["type"] == "tags_with_separator")
      named = e["tags"][0]["begin"].get<std::string>().find("name=\"" + tool.name + "\"") !=
              std::string::npos;
  }
  if (!named)
    __builtin_trap();
  return 0;
}
