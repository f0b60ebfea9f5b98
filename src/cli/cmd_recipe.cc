// `dsinfer recipe render` (API request -> exact prompt string and token ids) and
// `dsinfer recipe parse` (model output text -> parsed events as JSON lines): the recipe layer
// exposed for inspection and external checks. Keep flags and output formats stable.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "api/chat.h"
#include "api/messages.h"
#include "api/responses.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "recipe/encoder.h"
#include "recipe/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {

namespace {
using json = nlohmann::ordered_json;

Result<std::string> read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return not_found(std::string(flag) + ": cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const char* event_type_name(recipe::OutputEvent::Type t) {
  switch (t) {
    case recipe::OutputEvent::Type::kReasoningDelta:
      return "reasoning_delta";
    case recipe::OutputEvent::Type::kContentDelta:
      return "content_delta";
    case recipe::OutputEvent::Type::kToolCallStart:
      return "tool_call_start";
    case recipe::OutputEvent::Type::kToolCallArgumentsDelta:
      return "tool_call_arguments_delta";
    case recipe::OutputEvent::Type::kToolCallEnd:
      return "tool_call_end";
    case recipe::OutputEvent::Type::kFinish:
      return "finish";
  }
  return "?";
}

struct RenderArgs {
  std::string protocol = "chat";
  std::string request;
  std::string model_version = "v4";
  std::string tokenizer;
};

int run_render(const RenderArgs& a) {
  auto version = parse_model_version(a.model_version);
  if (!version.ok())
    return fail(version.status());
  auto body = read_file(a.request, "--request");
  if (!body.ok())
    return fail(body.status());
  api::DecodeOptions opts;
  api::ApiResult<recipe::GenerationRequest> req = [&]() {
    if (a.protocol == "responses")
      return api::decode_responses_request(*body, opts);
    if (a.protocol == "messages")
      return api::decode_messages_request(*body, opts);
    return api::decode_chat_request(*body, opts);
  }();
  if (a.protocol != "chat" && a.protocol != "responses" && a.protocol != "messages") {
    return fail(invalid_argument("--protocol must be chat, responses or messages"));
  }
  if (!req.ok()) {
    return fail(invalid_argument("request rejected (HTTP " +
                                 std::to_string(req.error().http_status) +
                                 "): " + req.error().message));
  }
  auto prompt = recipe::render_prompt(req.value().conversation, *version);
  if (!prompt.ok())
    return fail(prompt.status());
  json out = {{"prompt", *prompt}};
  std::string tok_path = a.tokenizer;
  if (tok_path.empty()) {
    if (const char* env = std::getenv("DSINFER_V4_TOKENIZER"); env && *env)
      tok_path = env;
  }
  if (!tok_path.empty()) {
    auto tok = tokenizer::Tokenizer::load(tok_path);
    if (!tok.ok())
      return fail(tok.status());
    auto ids = (*tok)->encode(*prompt, /*allow_special=*/true);
    if (!ids.ok())
      return fail(ids.status());
    out["token_ids"] = *ids;
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

struct ParseArgs {
  std::string thinking = "on";
  std::string text_file;
  std::vector<std::string> stop;
  bool tools = true;
};

int run_parse(const ParseArgs& a) {
  if (a.thinking != "on" && a.thinking != "off") {
    return fail(invalid_argument("--thinking must be `on` or `off`"));
  }
  auto text = read_file(a.text_file, "--text-file");
  if (!text.ok())
    return fail(text.status());
  recipe::OutputParserOptions opts;
  opts.start =
      a.thinking == "on" ? recipe::ParseStart::kReasoningStart : recipe::ParseStart::kContentStart;
  opts.parse_tool_calls = a.tools;
  opts.stop_sequences = a.stop;
  recipe::OutputParser parser(opts);
  std::vector<recipe::OutputEvent> events = parser.feed(*text);
  const auto tail = parser.finish(recipe::FinishReason::kStop);
  events.insert(events.end(), tail.begin(), tail.end());
  for (const auto& ev : recipe::coalesce_events(events)) {
    json j = {{"type", event_type_name(ev.type)}};
    switch (ev.type) {
      case recipe::OutputEvent::Type::kReasoningDelta:
      case recipe::OutputEvent::Type::kContentDelta:
        j["text"] = ev.text;
        break;
      case recipe::OutputEvent::Type::kToolCallStart:
        j["index"] = ev.tool_index;
        j["name"] = ev.tool_name;
        break;
      case recipe::OutputEvent::Type::kToolCallArgumentsDelta:
        j["index"] = ev.tool_index;
        j["text"] = ev.text;
        break;
      case recipe::OutputEvent::Type::kToolCallEnd:
        j["index"] = ev.tool_index;
        break;
      case recipe::OutputEvent::Type::kFinish:
        j["reason"] = recipe::finish_reason_name(ev.finish);
        if (!ev.stop_sequence.empty())
          j["stop_sequence"] = ev.stop_sequence;
        break;
    }
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}
}  // namespace

void add_recipe_command(CLI::App& app, int& exit_code) {
  CLI::App* recipe = app.add_subcommand("recipe", "DeepSeek prompt rendering and output parsing");
  recipe->require_subcommand(1);

  auto ra = std::make_shared<RenderArgs>();
  CLI::App* render = recipe->add_subcommand(
      "render", "Print the exact prompt (and token ids) an API request renders to");
  render->add_option("--protocol", ra->protocol, "chat | responses | messages");
  render->add_option("--request", ra->request, "Request body (JSON file)")->required();
  render->add_option("--model-version", ra->model_version, "v4 | v4-0731 | v4.1");
  render->add_option(
      "--tokenizer", ra->tokenizer, "tokenizer.json for the ids (default: $DSINFER_V4_TOKENIZER)");
  render->callback([ra, &exit_code] { exit_code = run_render(*ra); });

  auto pa = std::make_shared<ParseArgs>();
  CLI::App* parse = recipe->add_subcommand(
      "parse", "Parse generated text into reasoning / content / tool-call events (JSON lines)");
  parse->add_option("--thinking",
                    pa->thinking,
                    "on: the prompt ended with <think> (output starts in reasoning); off");
  parse->add_option("--text-file", pa->text_file, "The generated text")->required();
  parse->add_option("--stop", pa->stop, "Stop sequence (repeatable)");
  parse->callback([pa, &exit_code] { exit_code = run_parse(*pa); });
}

}  // namespace dsinfer::cli
