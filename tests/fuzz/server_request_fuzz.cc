// libFuzzer target: the server's request path on arbitrary HTTP request bodies (src/server).
//
// Input: byte 0 picks the endpoint (Chat Completions, Responses, Messages) and a variant; the
// rest is the request body. prepare_request decodes it, renders and tokenizes the prompt (tiny
// fixture tokenizer) and applies the prompt/output/sampling limits. Checks:
//   * a rejected body yields a 4xx error that renders as valid JSON in the protocol's shape;
//   * an accepted body yields a job within the limits (non-empty prompt <= max_prompt_tokens,
//     1 <= max_tokens, prompt + max_tokens <= context, valid sampling);
//   * the body's own bytes, tokenized with special tokens allowed and fed as "generated" ids
//     through OutputPipeline (decoder -> parser), stream through the protocol's encoder: every
//     SSE data line is JSON (or [DONE]) and the response object is JSON, also when the request
//     ends with a timeout/shutdown/engine error.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "sampling/sampler.h"
#include "server/generation.h"
#include "server/protocol.h"
#include "tokenizer/tokenizer.h"

namespace {

using dsinfer::server::Endpoint;
namespace server = dsinfer::server;
namespace recipe = dsinfer::recipe;

[[noreturn]] void die(const char* what, std::string_view detail) {
  std::fprintf(stderr,
               "server_request_fuzz: %s: %.*s\n",
               what,
               static_cast<int>(std::min<size_t>(detail.size(), 2000)),
               detail.data());
  std::abort();
}

const dsinfer::tokenizer::Tokenizer& tokenizer() {
  static std::unique_ptr<dsinfer::tokenizer::Tokenizer> tok = [] {
    auto r = dsinfer::tokenizer::Tokenizer::load(std::string(DSI_SOURCE_DIR) +
                                                 "/tests/fixtures/tokenizer/tiny/tokenizer.json");
    if (!r.ok())
      die("cannot load the fixture tokenizer", r.status().to_string());
    return std::move(r).value();
  }();
  return *tok;
}

int32_t eos_id() {
  static const int32_t id = *tokenizer().token_to_id("<｜end▁of▁sentence｜>");
  return id;
}

const server::ScriptedOutputs& scripted() {
  static std::unique_ptr<server::ScriptedOutputs> s = [] {
    auto r = server::ScriptedOutputs::from_json(
        R"({"rules":[{"match":"[[echo]]","output":"<think>{last_user}</think>{last_user}"}]})",
        tokenizer(),
        eos_id());
    if (!r.ok())
      die("scripted rules", r.status().to_string());
    return std::move(r).value();
  }();
  return *s;
}

bool is_json(std::string_view s) {
  return !nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false).is_discarded();
}

void check_sse(std::string_view sse) {
  size_t pos = 0;
  while (pos < sse.size()) {
    size_t end = sse.find('\n', pos);
    if (end == std::string_view::npos)
      end = sse.size();
    std::string_view line = sse.substr(pos, end - pos);
    if (line.substr(0, 6) == "data: ") {
      std::string_view data = line.substr(6);
      if (data != "[DONE]" && !is_json(data))
        die("SSE data line is not JSON", line);
    }
    pos = end + 1;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  const uint8_t selector = data[0];
  const Endpoint endpoint = static_cast<Endpoint>(selector % 3);
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);

  server::ServingContext ctx;
  ctx.tokenizer = &tokenizer();
  ctx.version = static_cast<recipe::ModelVersion>((selector / 3) % 3);
  ctx.decode.served_models = {"m"};
  ctx.max_context = 1024;
  ctx.max_prompt_tokens = (selector & 0x40) ? 64 : 1000;
  ctx.request_timeout_s = 5;
  ctx.scripted = &scripted();

  auto prepared = server::prepare_request(endpoint, body, ctx, 7);
  if (!prepared.ok()) {
    const auto& e = prepared.error();
    if (e.http_status < 400 || e.http_status > 499)
      die("rejection is not a 4xx", e.message);
    if (!is_json(server::render_error(endpoint, e)))
      die("error body is not JSON", server::render_error(endpoint, e));
    return 0;
  }
  const server::Job& job = prepared->job;
  const int64_t prompt = static_cast<int64_t>(job.spec.prompt.size());
  if (prompt < 1 || prompt > ctx.max_prompt_tokens)
    die("prompt length outside the limits", body);
  if (job.spec.max_tokens < 1 || prompt + job.spec.max_tokens > ctx.max_context)
    die("max_tokens outside the context", body);
  if (!dsinfer::sampling::validate(job.spec.sampling).ok())
    die("invalid sampling accepted", body);
  for (int32_t t : job.spec.prompt) {
    if (!tokenizer().has_token(t))
      die("prompt id without a token", body);
  }

  // The body itself as model output.
  auto ids = tokenizer().encode(body, /*allow_special=*/true);
  if (!ids.ok())
    return 0;
  std::vector<int32_t> gen = std::move(ids).value();
  if (gen.size() > 512)
    gen.resize(512);
  if (selector & 0x80)
    gen.push_back(eos_id());
  server::OutputPipeline pipeline(tokenizer(), job.parser, job.script);
  dsinfer::api::ResponseMeta meta;
  meta.created = 1;
  meta.seed = selector;
  server::ProtocolEncoder enc(endpoint, prepared->request, meta);
  recipe::Usage usage;
  usage.prompt_tokens = prompt;
  std::string sse = enc.start(usage);
  int64_t n = 0;
  for (int32_t t : gen) {
    ++n;
    const bool done = pipeline.feed(t);
    sse += enc.add(pipeline.take_events());
    if (done || n >= job.spec.max_tokens)
      break;
  }
  pipeline.finish((selector & 0x20) ? recipe::FinishReason::kLength : recipe::FinishReason::kStop);
  sse += enc.add(pipeline.take_events());
  usage.completion_tokens = n;
  usage.reasoning_tokens = pipeline.reasoning_tokens();
  if (pipeline.reasoning_tokens() > n)
    die("more reasoning tokens than tokens", body);
  server::Completion c;
  c.cause = static_cast<server::EndCause>((selector >> 3) % 5);
  if (auto err = server::completion_error(c)) {
    sse += enc.error(*err);
  } else {
    sse += enc.finish(usage);
  }
  check_sse(sse);
  const std::string obj = enc.response_json(usage);
  if (!is_json(obj))
    die("response object is not JSON", obj);
  return 0;
}
