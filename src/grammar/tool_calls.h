// Strict tool calls: the recipe's DSML tool-call block as a grammar whose argument regions follow
// each tool's JSON schema (XGrammar's DeepSeek parameter style), compiled as Kind::kStructuralTag
// over a Compiler that has the DSML token as a marker token (grammar.h).
//
// The grammar starts at the block: either right at the DSML token the model writes to open it
// (the mask switches on once that token is sampled; reasoning and content before it stay free),
// or, when the prompt already opened it (tool_choice required / named), at the first invoke. It
// covers every invoke (a declared tool's name, then its parameters; one only with single_call) and
// the block's closing tag;
// after that only EOS may follow. Tools that are not strict get free parameters (any names, any
// JSON values), still in the DSML parameter syntax the parser reads.
//
//   V4:   <｜DSML｜tool_calls>\n<｜DSML｜invoke name="N">\n<｜DSML｜parameter name="K"
//         string="true|false">V</｜DSML｜parameter>\n…</｜DSML｜invoke>\n</｜DSML｜tool_calls>
//   V4.1: the same with ` calls`, ` invoke`, ` parameter` after the DSML token.
//
// String values (raw or in JSON) never contain the DSML token's first character `｜`: there the
// marker token alone may write it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"

namespace dsinfer::grammar {

struct DsmlTool {
  std::string name;
  // The arguments' JSON schema (an object schema, as JSON text); nullopt: free parameters.
  std::optional<std::string> schema;
};

struct DsmlToolCalls {
  bool v41 = false;               // V4.1 spellings (` calls`, ` invoke`, ` parameter`)
  bool opened_by_prompt = false;  // the prompt ends inside the block (after its opening tag)
  bool single_call = false;       // one invoke only (parallel_tool_calls: false)
  std::vector<DsmlTool> tools;    // at least one
};

// The DSML token's text (the marker token a Compiler for these grammars needs).
inline constexpr const char* kDsmlMarker = "｜DSML｜";

// The structural tag (Kind::kStructuralTag spec). kInvalidArgument for no tools, a tool name that
// cannot appear in the block (empty, or with `"`, `<`, `>`, a newline or `｜`), or a schema that
// is not a JSON object or boolean.
Result<Spec> dsml_tool_calls_spec(const DsmlToolCalls& calls);

}  // namespace dsinfer::grammar
