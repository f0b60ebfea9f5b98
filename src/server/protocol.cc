#include "server/protocol.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "base/check.h"
#include "base/strings.h"
#include "frontend/prepare.h"
#include "grammar/tool_calls.h"
#include "sampling/sampler.h"

namespace dsinfer::server {

const char* endpoint_label(Endpoint e) {
  switch (e) {
    case Endpoint::kChat:
      return "/v1/chat/completions";
    case Endpoint::kResponses:
      return "/v1/responses";
    case Endpoint::kMessages:
      return "/v1/messages";
  }
  return "/v1/chat/completions";
}

namespace {

const char* prompt_param(Endpoint e) {
  return e == Endpoint::kResponses ? "input" : "messages";
}

const char* max_tokens_param(Endpoint e) {
  return e == Endpoint::kResponses ? "max_output_tokens" : "max_tokens";
}

// The leading field name of an engine/sampler validation message ("top_p must be ...").
std::string leading_field(const std::string& message) {
  size_t n = 0;
  while (n < message.size() && ((message[n] >= 'a' && message[n] <= 'z') || message[n] == '_')) {
    ++n;
  }
  if (n == 0 || n >= message.size() || message[n] != ' ')
    return "";
  std::string field = message.substr(0, n);
  return field == "prompt" ? "" : field;
}

// Compiles a request's structured-output constraint (cached by the compiler). Every failure is a
// 400 naming the field: a schema / regex / grammar that does not compile, or a server without a
// grammar engine.
api::ApiResult<std::shared_ptr<const grammar::Compiled>> compile_constraint(
    const recipe::OutputConstraint& c, const ServingContext& ctx) {
  using Kind = recipe::OutputConstraint::Kind;
  if (ctx.grammar == nullptr) {
    return api::invalid_request(c.param,
                                "structured outputs are not available on this server (built "
                                "without XGrammar).");
  }
  grammar::Spec spec;
  spec.text = c.text;
  switch (c.kind) {
    case Kind::kNone:
    case Kind::kJsonObject:
      spec.kind = grammar::Kind::kJsonObject;
      break;
    case Kind::kJsonSchema:
      spec.kind = grammar::Kind::kJsonSchema;
      break;
    case Kind::kRegex:
      spec.kind = grammar::Kind::kRegex;
      break;
    case Kind::kGrammar:
      spec.kind = grammar::Kind::kEbnf;
      break;
  }
  auto g = ctx.grammar->compile(spec);
  if (!g.ok())
    return api::invalid_request(c.param, g.status().message());
  return std::move(g).value();
}

// Strict tools: when an offered tool is declared `strict`, the tool-call block's grammar (every
// offered tool's name; strict ones' arguments follow their schemas, the others' are free).
// nullptr when no offered tool is strict. A schema that does not compile is a 400 on `tools`.
api::ApiResult<std::shared_ptr<const grammar::Compiled>> compile_strict_tools(
    const recipe::GenerationRequest& req,
    const recipe::OutputParserOptions& parser,
    const ServingContext& ctx) {
  const recipe::Conversation& conv = req.conversation;
  if (!parser.parse_tool_calls || conv.tool_choice == recipe::ToolChoice::kNone)
    return std::shared_ptr<const grammar::Compiled>();
  grammar::DsmlToolCalls calls;
  calls.v41 = ctx.version == recipe::ModelVersion::kV41;
  calls.opened_by_prompt = parser.start == recipe::ParseStart::kToolCalls;
  calls.single_call = parser.max_tool_calls == 1;
  bool strict = false;
  for (const recipe::ToolSpec& t : conv.tools) {
    if (conv.tool_choice == recipe::ToolChoice::kNamed && t.name != conv.tool_choice_name)
      continue;
    grammar::DsmlTool d;
    d.name = t.name;
    if (t.strict) {
      strict = true;
      auto fn = nlohmann::json::parse(t.function_json, nullptr, /*allow_exceptions=*/false);
      auto params = fn.is_object() ? fn.find("parameters") : fn.end();
      if (params != fn.end() && !params->is_null())
        d.schema = params->dump();
    }
    calls.tools.push_back(std::move(d));
  }
  if (!strict)
    return std::shared_ptr<const grammar::Compiled>();
  if (ctx.grammar == nullptr || !ctx.tokenizer->added_token_id(grammar::kDsmlMarker)) {
    return api::invalid_request("tools",
                                "strict tools are not available on this server (built without "
                                "XGrammar, or a tokenizer without the DSML token).");
  }
  auto spec = grammar::dsml_tool_calls_spec(calls);
  if (!spec.ok())
    return api::invalid_request("tools", spec.status().message());
  auto g = ctx.grammar->compile(*spec);
  if (!g.ok()) {
    return api::invalid_request(
        "tools", "a strict tool's parameters schema does not compile: " + g.status().message());
  }
  return std::move(g).value();
}
}  // namespace

size_t prompt_byte_limit(const tokenizer::Tokenizer& tok, int64_t max_prompt_tokens) {
  if (max_prompt_tokens <= 0)
    return 0;
  return static_cast<size_t>(max_prompt_tokens) * frontend::max_token_bytes(tok) * 4;
}

api::ApiResult<PreparedRequest> prepare_request(Endpoint endpoint,
                                                std::string_view body,
                                                const ServingContext& ctx,
                                                uint64_t default_seed) {
  api::ApiResult<recipe::GenerationRequest> decoded = [&] {
    switch (endpoint) {
      case Endpoint::kChat:
        return api::decode_chat_request(body, ctx.decode);
      case Endpoint::kResponses:
        return api::decode_responses_request(body, ctx.decode);
      case Endpoint::kMessages:
        return api::decode_messages_request(body, ctx.decode);
    }
    return api::decode_chat_request(body, ctx.decode);
  }();
  if (!decoded.ok())
    return decoded.error();
  PreparedRequest p;
  p.request = std::move(decoded).value();
  const recipe::GenerationRequest& req = p.request;

  auto prompt = frontend::prepare_conversation(
      req, *ctx.tokenizer, ctx.version, ctx.max_prompt_bytes > 0 ? ctx.max_prompt_bytes : SIZE_MAX);
  if (!prompt.ok()) {
    if (ctx.max_prompt_bytes > 0 && prompt.status().message().rfind("prompt is too long", 0) == 0) {
      api::ApiError e = api::invalid_request(
          prompt_param(endpoint),
          str_format("The prompt is far longer than this server accepts (at most %lld prompt "
                     "tokens; %s). Shorten the %s.",
                     static_cast<long long>(ctx.max_prompt_tokens),
                     prompt.status().message().c_str(),
                     prompt_param(endpoint)));
      e.code = "context_length_exceeded";
      return e;
    }
    return api::invalid_request(prompt_param(endpoint), prompt.status().message());
  }
  const int64_t prompt_tokens = static_cast<int64_t>(prompt->tokens.size());
  if (prompt_tokens > ctx.max_prompt_tokens) {
    api::ApiError e = api::invalid_request(
        prompt_param(endpoint),
        str_format("The prompt is %lld tokens long; this server accepts at most %lld prompt "
                   "tokens. Shorten the %s.",
                   static_cast<long long>(prompt_tokens),
                   static_cast<long long>(ctx.max_prompt_tokens),
                   prompt_param(endpoint)));
    e.code = "context_length_exceeded";
    return e;
  }
  api::ApiResult<int64_t> max_tokens = api::resolve_max_tokens(req, prompt_tokens, ctx.max_context);
  if (!max_tokens.ok()) {
    api::ApiError e = max_tokens.error();
    if (e.param.empty())
      e.param = max_tokens_param(endpoint);
    return e;
  }

  engine::RequestSpec& spec = p.job.spec;
  spec.prompt = std::move(prompt->tokens);
  spec.sampling = frontend::to_sampling(req.sampling, default_seed);
  spec.max_tokens = max_tokens.value();
  spec.stop_token_ids = req.sampling.stop_token_ids;
  spec.ignore_eos = req.sampling.ignore_eos;
  Status valid = sampling::validate(spec.sampling, ctx.decode.max_top_logprobs);
  if (!valid.ok())
    return api::invalid_request(leading_field(valid.message()), valid.message());
  p.job.parser = prompt->parser;
  p.job.timeout_s = ctx.request_timeout_s;
  if (req.constraint.kind != recipe::OutputConstraint::Kind::kNone) {
    auto g = compile_constraint(req.constraint, ctx);
    if (!g.ok())
      return g.error();
    p.job.grammar = std::move(g).value();
  }
  {
    auto g = compile_strict_tools(req, p.job.parser, ctx);
    if (!g.ok())
      return g.error();
    p.job.tool_grammar = std::move(g).value();
    if (p.job.tool_grammar) {
      p.job.dsml_token = ctx.tokenizer->added_token_id(grammar::kDsmlMarker).value_or(-1);
      // Only the DSML token opens a constrained block: an ASCII `|DSML|` spelling stays text.
      p.job.parser.accept_ascii_dsml = false;
    }
  }
  if (ctx.scripted != nullptr) {
    if (auto script = ctx.scripted->select(req))
      p.job.script = std::move(*script);
  }
  // best_of > n: every choice computes its tokens' logprobs (for the ranking), reporting them
  // only when the request asked.
  const int32_t choices = std::max(req.n, req.best_of);
  if (choices > req.n) {
    p.job.report_logprobs = spec.sampling.logprobs;
    spec.sampling.logprobs = true;
  }
  // n > 1 (Chat): choice i samples with seed + i and shares choice 0's prompt state.
  for (int32_t i = 1; i < choices; ++i) {
    Job j;
    j.spec.prompt = spec.prompt;
    j.spec.sampling = spec.sampling;
    j.spec.sampling.seed = spec.sampling.seed + static_cast<uint64_t>(i);
    j.spec.max_tokens = spec.max_tokens;
    j.spec.stop_token_ids = spec.stop_token_ids;
    j.spec.ignore_eos = spec.ignore_eos;
    j.parser = p.job.parser;
    j.grammar = p.job.grammar;
    j.tool_grammar = p.job.tool_grammar;
    j.dsml_token = p.job.dsml_token;
    j.script = p.job.script;
    j.timeout_s = p.job.timeout_s;
    j.report_logprobs = p.job.report_logprobs;
    p.more_choices.push_back(std::move(j));
  }
  return p;
}

std::string render_error(Endpoint endpoint, const api::ApiError& e) {
  return endpoint == Endpoint::kMessages ? api::render_anthropic_error(e)
                                         : api::render_openai_error(e);
}

api::ApiError rejection_error(const Status& s) {
  if (s.code() == StatusCode::kFailedPrecondition) {
    api::ApiError e;
    e.http_status = 503;
    e.type = "service_unavailable";
    e.message = s.message();
    return e;
  }
  if (s.code() == StatusCode::kInvalidArgument)
    return api::invalid_request(leading_field(s.message()), s.message());
  return api::internal_error(s.message());
}

std::optional<api::ApiError> completion_error(const Completion& c) {
  api::ApiError e;
  switch (c.cause) {
    case EndCause::kNone:
    case EndCause::kDisconnect:
      return std::nullopt;
    case EndCause::kTimeout:
      e.http_status = 504;
      e.type = "timeout_error";
      e.message = "The request did not finish within the server's per-request timeout.";
      return e;
    case EndCause::kShutdown:
      e.http_status = 503;
      e.type = "service_unavailable";
      e.message = "The server is shutting down; the request was stopped.";
      return e;
    case EndCause::kError:
      return api::internal_error("Generation failed: " +
                                 (c.error.empty() ? std::string("engine error") : c.error));
  }
  return std::nullopt;
}

ProtocolEncoder::ProtocolEncoder(Endpoint endpoint,
                                 const recipe::GenerationRequest& request,
                                 const api::ResponseMeta& meta)
    : n_(request.n), best_of_(request.best_of) {
  switch (endpoint) {
    case Endpoint::kChat: {
      // Every choice shares the response id, created and model (n > 1).
      auto first = std::make_unique<api::ChatStreamEncoder>(request, meta, 0);
      const api::ResponseMeta shared = first->meta();
      chats_.push_back(std::move(first));
      for (int32_t i = 1; i < std::max(request.n, request.best_of); ++i)
        chats_.push_back(std::make_unique<api::ChatStreamEncoder>(request, shared, i));
      break;
    }
    case Endpoint::kResponses:
      responses_ = std::make_unique<api::ResponsesStreamEncoder>(request, meta);
      break;
    case Endpoint::kMessages:
      messages_ = std::make_unique<api::MessagesStreamEncoder>(request, meta);
      break;
  }
}

ProtocolEncoder::~ProtocolEncoder() = default;

std::string ProtocolEncoder::start(const recipe::Usage& prompt_usage) {
  if (!chats_.empty()) {
    std::string out;
    for (auto& c : chats_) out += c->start();
    return out;
  }
  if (responses_)
    return responses_->start();
  return messages_->start(prompt_usage);
}

std::string ProtocolEncoder::add(const std::vector<recipe::OutputEvent>& events, size_t choice) {
  std::string out;
  for (const recipe::OutputEvent& e : events) {
    if (!chats_.empty()) {
      out += chats_[std::min(choice, chats_.size() - 1)]->add(e);
    } else if (responses_) {
      out += responses_->add(e);
    } else {
      out += messages_->add(e);
    }
  }
  return out;
}

std::string ProtocolEncoder::finish_choice(size_t choice) {
  if (chats_.size() <= 1 || choice >= chats_.size())
    return "";
  return chats_[choice]->finish_choice();
}

std::string ProtocolEncoder::finish(const recipe::Usage& usage) {
  if (chats_.size() == 1)
    return chats_[0]->finish(usage);
  if (!chats_.empty()) {
    std::string out;
    for (auto& c : chats_) out += c->finish_choice();  // no-op for those already closed
    return out + api::chat_choices_done(*chats_[0], usage);
  }
  if (responses_)
    return responses_->finish(usage);
  return messages_->finish(usage);
}

std::string ProtocolEncoder::error(const api::ApiError& e) {
  if (!chats_.empty())
    return chats_[0]->error(e);
  if (responses_)
    return responses_->error(e);
  return messages_->error(e);
}

void ProtocolEncoder::keep_best(const std::vector<std::optional<Completion>>& finished) {
  if (best_of_ <= n_ || chats_.empty())
    return;
  DSI_CHECK(finished.size() == chats_.size(),
            "%zu results for %zu choices",
            finished.size(),
            chats_.size());
  std::vector<size_t> order(chats_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Highest cumulative logprob first; ties keep the lower choice (its seed is the lower one).
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return finished[a]->cumulative_logprob > finished[b]->cumulative_logprob;
  });
  order.resize(static_cast<size_t>(n_));
  selected_ = std::move(order);
}

std::string ProtocolEncoder::response_json(const recipe::Usage& usage) const {
  if (!selected_.empty()) {  // best_of: the chosen ones, numbered from 0 in ranking order
    std::vector<const api::ChatStreamEncoder*> chosen;
    for (size_t i : selected_) chosen.push_back(chats_[i].get());
    return api::build_chat_choices_response(chosen, usage, /*renumber=*/true);
  }
  if (chats_.size() == 1)
    return chats_[0]->response_json(usage);
  if (!chats_.empty()) {
    std::vector<const api::ChatStreamEncoder*> all;
    for (const auto& c : chats_) all.push_back(c.get());
    return api::build_chat_choices_response(all, usage);
  }
  if (responses_)
    return responses_->response_json(usage);
  return messages_->response_json(usage);
}

}  // namespace dsinfer::server
