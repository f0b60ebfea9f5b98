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
#include "frontend/prepare.h"
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
  std::string batch;
  std::string model_version = "v4";
  std::string tokenizer;
};

Result<std::unique_ptr<tokenizer::Tokenizer>> load_tokenizer(const std::string& flag_path) {
  std::string path = flag_path;
  if (path.empty()) {
    if (const char* env = std::getenv("DSINFER_V4_TOKENIZER"); env && *env)
      path = env;
  }
  if (path.empty())
    return std::unique_ptr<tokenizer::Tokenizer>();
  return tokenizer::Tokenizer::load(path);
}

// One request through decode -> render -> encode: {"prompt", "special_ranges" (byte offsets),
// "token_ids" (with a tokenizer)} or {"error": {"status", "message"}}.
json render_one(const std::string& protocol,
                const std::string& body,
                recipe::ModelVersion version,
                const tokenizer::Tokenizer* tok) {
  api::DecodeOptions opts;
  api::ApiResult<recipe::GenerationRequest> req = [&]() {
    if (protocol == "responses")
      return api::decode_responses_request(body, opts);
    if (protocol == "messages")
      return api::decode_messages_request(body, opts);
    return api::decode_chat_request(body, opts);
  }();
  if (!req.ok()) {
    return {{"error", {{"status", req.error().http_status}, {"message", req.error().message}}}};
  }
  auto prompt = recipe::render_conversation(req.value().conversation, version);
  if (!prompt.ok())
    return {{"error", {{"status", 400}, {"message", prompt.status().message()}}}};
  json ranges = json::array();
  for (const recipe::SpecialRange& r : prompt->special_ranges) ranges.push_back({r.begin, r.end});
  json out = {{"prompt", prompt->text}, {"special_ranges", std::move(ranges)}};
  if (tok != nullptr) {
    // Request text stays text; only the control tokens the encoder placed become their ids.
    auto ids = frontend::encode_prompt(*tok, *prompt);
    if (!ids.ok())
      return {{"error", {{"status", 400}, {"message", ids.status().message()}}}};
    out["token_ids"] = *ids;
  }
  return out;
}

bool valid_protocol(const std::string& p) {
  return p == "chat" || p == "responses" || p == "messages";
}

// --batch: one JSON object per line, {"protocol", "model_version", "request": {...}}; prints one
// render_one result per line, in order (a bad line gets {"error": ...}).
int run_render_batch(const RenderArgs& a, const tokenizer::Tokenizer* tok) {
  auto text = read_file(a.batch, "--batch");
  if (!text.ok())
    return fail(text.status());
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty())
      continue;
    json out;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    auto version = parse_model_version(j.is_object() ? j.value("model_version", a.model_version)
                                                     : a.model_version);
    const std::string protocol = j.is_object() ? j.value("protocol", a.protocol) : "";
    if (!j.is_object() || !j.contains("request") || !valid_protocol(protocol)) {
      out = {{"error", {{"status", 0}, {"message", "bad batch line"}}}};
    } else if (!version.ok()) {
      out = {{"error", {{"status", 0}, {"message", version.status().message()}}}};
    } else {
      const json& r = j["request"];
      out = render_one(protocol, r.is_string() ? r.get<std::string>() : r.dump(), *version, tok);
    }
    std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  }
  return 0;
}

int run_render(const RenderArgs& a) {
  if (!valid_protocol(a.protocol))
    return fail(invalid_argument("--protocol must be chat, responses or messages"));
  auto tok = load_tokenizer(a.tokenizer);
  if (!tok.ok())
    return fail(tok.status());
  if (!a.batch.empty())
    return run_render_batch(a, tok->get());
  if (a.request.empty())
    return fail(invalid_argument("--request or --batch is required"));
  auto version = parse_model_version(a.model_version);
  if (!version.ok())
    return fail(version.status());
  auto body = read_file(a.request, "--request");
  if (!body.ok())
    return fail(body.status());
  json out = render_one(a.protocol, *body, *version, tok->get());
  if (out.contains("error")) {
    const json& e = out["error"];
    return fail(invalid_argument("request rejected (HTTP " + e["status"].dump() +
                                 "): " + e["message"].get<std::string>()));
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

struct ParseArgs {
  std::string thinking = "on";
  std::string text_file;
  std::string batch;
  std::vector<std::string> stop;
  bool tools = true;
};

json event_json(const recipe::OutputEvent& ev) {
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
  return j;
}

// A text fed as `pieces` ({text, control}); `split` >= 0 cuts the concatenated bytes there into
// two feeds (a control piece is never cut). Returns the coalesced events.
std::vector<recipe::OutputEvent> parse_pieces(const recipe::OutputParserOptions& opts,
                                              const std::vector<std::pair<std::string, bool>>& pcs,
                                              size_t split) {
  using Kind = recipe::OutputParser::Kind;
  recipe::OutputParser parser(opts);
  std::vector<recipe::OutputEvent> events;
  auto add = [&](std::vector<recipe::OutputEvent> e) {
    events.insert(events.end(), e.begin(), e.end());
  };
  size_t at = 0;
  for (const auto& [text, control] : pcs) {
    const Kind kind = control ? Kind::kControl : (pcs.size() > 1 ? Kind::kText : Kind::kAny);
    if (!control && split > at && split < at + text.size()) {
      add(parser.feed(std::string_view(text).substr(0, split - at), kind));
      add(parser.feed(std::string_view(text).substr(split - at), kind));
    } else {
      add(parser.feed(text, kind));
    }
    at += text.size();
  }
  add(parser.finish(recipe::FinishReason::kStop));
  return recipe::coalesce_events(events);
}

Result<recipe::ParseStart> parse_start(const std::string& s) {
  if (s == "reasoning_start")
    return recipe::ParseStart::kReasoningStart;
  if (s == "reasoning")
    return recipe::ParseStart::kReasoning;
  if (s == "content_start")
    return recipe::ParseStart::kContentStart;
  if (s == "content")
    return recipe::ParseStart::kContent;
  if (s == "tool_calls")
    return recipe::ParseStart::kToolCalls;
  return invalid_argument("unknown parse start `" + s + "`");
}

// --batch: one JSON object per line, {"text" | "pieces": [[text, is_control], ...], "start",
// "tools", "json", "stop", "splits"}; prints {"events": [...]} per line, plus with "splits":
// true "split_mismatch": the first byte offset whose two-feed split gives other events, or -1.
int run_parse_batch(const ParseArgs& a) {
  auto text = read_file(a.batch, "--batch");
  if (!text.ok())
    return fail(text.status());
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty())
      continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    json out;
    auto start = parse_start(j.is_object() ? j.value("start", "reasoning_start") : "");
    if (!j.is_object() || !start.ok()) {
      out = {{"error", "bad batch line"}};
      std::printf("%s\n", out.dump().c_str());
      continue;
    }
    recipe::OutputParserOptions opts;
    opts.start = *start;
    opts.parse_tool_calls = j.value("tools", true);
    opts.json_output = j.value("json", false);
    opts.stop_sequences = j.value("stop", std::vector<std::string>{});
    opts.eos_spelling_is_text = true;  // text of unknown origin (deepseek-recipe's text chunks)
    std::vector<std::pair<std::string, bool>> pieces;
    if (j.contains("pieces")) {
      for (const json& p : j["pieces"]) pieces.emplace_back(p[0], p[1].get<bool>());
    } else {
      pieces.emplace_back(j.value("text", ""), false);
    }
    const auto whole = parse_pieces(opts, pieces, std::string::npos);
    json evs = json::array();
    for (const auto& ev : whole) evs.push_back(event_json(ev));
    out["events"] = std::move(evs);
    if (j.value("splits", false)) {
      size_t total = 0;
      for (const auto& p : pieces) total += p.first.size();
      int64_t mismatch = -1;
      for (size_t k = 1; k < total && mismatch < 0; ++k) {
        const auto split = parse_pieces(opts, pieces, k);
        json e = json::array();
        for (const auto& ev : split) e.push_back(event_json(ev));
        if (e != out["events"])
          mismatch = static_cast<int64_t>(k);
      }
      out["split_mismatch"] = mismatch;
    }
    std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  }
  return 0;
}

int run_parse(const ParseArgs& a) {
  if (!a.batch.empty())
    return run_parse_batch(a);
  if (a.thinking != "on" && a.thinking != "off") {
    return fail(invalid_argument("--thinking must be `on` or `off`"));
  }
  if (a.text_file.empty())
    return fail(invalid_argument("--text-file or --batch is required"));
  auto text = read_file(a.text_file, "--text-file");
  if (!text.ok())
    return fail(text.status());
  recipe::OutputParserOptions opts;
  opts.start =
      a.thinking == "on" ? recipe::ParseStart::kReasoningStart : recipe::ParseStart::kContentStart;
  opts.parse_tool_calls = a.tools;
  opts.stop_sequences = a.stop;
  opts.eos_spelling_is_text = true;  // text of unknown origin (deepseek-recipe's text chunks)
  for (const auto& ev : parse_pieces(opts, {{*text, false}}, std::string::npos)) {
    std::printf("%s\n", event_json(ev).dump().c_str());
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
  render->add_option("--request", ra->request, "Request body (JSON file)");
  render->add_option(
      "--batch", ra->batch, "JSON lines {protocol, model_version, request}: one result line each");
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
  parse->add_option("--text-file", pa->text_file, "The generated text");
  parse->add_option("--batch",
                    pa->batch,
                    "JSON lines {text | pieces, start, tools, json, stop, splits}: events each");
  parse->add_option("--stop", pa->stop, "Stop sequence (repeatable)");
  parse->callback([pa, &exit_code] { exit_code = run_parse(*pa); });
}

}  // namespace dsinfer::cli
