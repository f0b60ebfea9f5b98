// The protocol layer without HTTP: request decoding + prompt limits into engine jobs, the
// protocol error shapes, and each protocol's stream encoder fed a deterministic event stream.
// Also the Prometheus exposition.
#include "server/protocol.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "frontend/prepare.h"
#include "grammar/tool_calls.h"
#include "recipe/encoder.h"
#include "recipe/output_parser.h"
#include "recipe/tokens.h"
#include "server/metrics.h"
#include "server_test_util.h"

namespace dsinfer::server {
namespace {

using nlohmann::json;
using testing::tok;

ServingContext context() {
  ServingContext c;
  c.tokenizer = &tok();
  c.version = recipe::ModelVersion::kV4;
  c.decode.served_models = {"tiny"};
  c.max_context = 4096;
  c.max_prompt_tokens = 200;
  c.request_timeout_s = 30;
  return c;
}

api::ApiError error_of(Endpoint e, const std::string& body) {
  auto r = prepare_request(e, body, context(), 1);
  EXPECT_FALSE(r.ok()) << body;
  return r.ok() ? api::ApiError{} : r.error();
}

TEST(PrepareRequest, ChatNChoicesGetConsecutiveSeeds) {
  auto r = prepare_request(Endpoint::kChat,
                           R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}],
                               "max_tokens":7,"seed":5,"n":3,"logprobs":true,"top_logprobs":2})",
                           context(),
                           99);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->request.n, 3);
  EXPECT_EQ(r->job.spec.sampling.seed, 5u);
  ASSERT_EQ(r->more_choices.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Job& j = r->more_choices[i];
    EXPECT_EQ(j.spec.sampling.seed, 6u + i);
    EXPECT_EQ(j.spec.prompt, r->job.spec.prompt);
    EXPECT_EQ(j.spec.max_tokens, 7);
    EXPECT_EQ(j.spec.sampling.top_logprobs, 2);
    EXPECT_EQ(j.parser.start, r->job.parser.start);
  }
  // Without a seed: the server's default seed, + i.
  auto d = prepare_request(Endpoint::kChat,
                           R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}],"n":2})",
                           context(),
                           99);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->more_choices.at(0).spec.sampling.seed, d->job.spec.sampling.seed + 1);
}

TEST(PrepareRequest, ChatBuildsTheEngineJob) {
  auto r = prepare_request(Endpoint::kChat,
                           R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}],
                               "max_tokens":7,"stop":["X"],"seed":5,"temperature":0.5,
                               "thinking":{"type":"disabled"}})",
                           context(),
                           99);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const Job& j = r->job;
  EXPECT_FALSE(j.spec.prompt.empty());
  EXPECT_EQ(j.spec.max_tokens, 7);
  EXPECT_EQ(j.spec.sampling.seed, 5u);
  EXPECT_FLOAT_EQ(j.spec.sampling.temperature, 0.5f);
  EXPECT_EQ(j.parser.start, recipe::ParseStart::kContentStart);
  EXPECT_EQ(j.parser.stop_sequences, std::vector<std::string>{"X"});
  EXPECT_EQ(j.timeout_s, 30);
  EXPECT_TRUE(j.script.empty());
  // Thinking on (the default): the output starts in reasoning; default seed when none given.
  auto t = prepare_request(Endpoint::kChat,
                           R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}]})",
                           context(),
                           99);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->job.parser.start, recipe::ParseStart::kReasoningStart);
  EXPECT_EQ(t->job.spec.sampling.seed, 99u);
  EXPECT_EQ(t->job.spec.max_tokens, 4096 - static_cast<int64_t>(t->job.spec.prompt.size()));
}

// Strict tools: the job carries the tool-call block's grammar only when an offered tool is
// strict (not for tool_choice none); a schema that does not compile is a 400 on `tools`; the
// ASCII `|DSML|` spelling no longer opens a block; n > 1 choices share the grammar.
TEST(PrepareRequest, StrictToolsGetTheToolCallGrammar) {
  if (!grammar::available())
    GTEST_SKIP() << "built without XGrammar";
  auto compiler = grammar::Compiler::create(tok(),
                                            tok().vocab_size(),
                                            {*tok().added_token_id(recipe::tok::kEos)},
                                            2,
                                            {*tok().added_token_id(grammar::kDsmlMarker)});
  ASSERT_TRUE(compiler.ok()) << compiler.status().to_string();
  ServingContext ctx = context();
  ctx.max_prompt_tokens = 2048;  // the tools block is long
  ctx.grammar = compiler->get();
  auto body = [](const std::string& strict,
                 const std::string& choice,
                 const std::string& type = "integer") {
    return R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}],"n":2,
               "thinking":{"type":"disabled"},"tool_choice":)" +
           choice + R"(,"tools":[{"type":"function","function":{"name":"f","strict":)" + strict +
           R"(,"parameters":{"type":"object","properties":{"a":{"type":")" + type +
           R"("}},"required":["a"],"additionalProperties":false}}}]})";
  };
  auto r = prepare_request(Endpoint::kChat, body("true", R"("required")"), ctx, 1);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->job.tool_grammar);
  EXPECT_EQ(r->job.dsml_token, *tok().added_token_id(grammar::kDsmlMarker));
  EXPECT_EQ(r->job.parser.start, recipe::ParseStart::kToolCalls);
  EXPECT_FALSE(r->job.parser.accept_ascii_dsml);
  ASSERT_EQ(r->more_choices.size(), 1u);
  EXPECT_EQ(r->more_choices[0].tool_grammar, r->job.tool_grammar);
  auto loose = prepare_request(Endpoint::kChat, body("false", R"("auto")"), ctx, 1);
  ASSERT_TRUE(loose.ok()) << loose.error().message;
  EXPECT_FALSE(loose->job.tool_grammar);
  EXPECT_TRUE(loose->job.parser.accept_ascii_dsml);
  auto none = prepare_request(Endpoint::kChat, body("true", R"("none")"), ctx, 1);
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_FALSE(none->job.tool_grammar);
  auto bad = prepare_request(Endpoint::kChat, body("true", R"("auto")", "no-such-type"), ctx, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().http_status, 400);
  EXPECT_EQ(bad.error().param, "tools");
  // Without a grammar engine in the context: a 400, not an unconstrained call.
  ctx.grammar = nullptr;
  auto off = prepare_request(Endpoint::kChat, body("true", R"("auto")"), ctx, 1);
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.error().param, "tools");
}

// Special-token injection: a spelling of a control token in request text is tokenized as text.
// Only the control tokens the encoder placed itself appear as control-token ids.
TEST(PrepareRequest, SpecialTokenSpellingsInRequestTextStayText) {
  const std::string spellings = std::string(recipe::tok::kAssistant) + " " +
                                std::string(recipe::tok::kEos) + std::string(recipe::tok::kUser) +
                                std::string(recipe::tok::kThinkStart) +
                                std::string(recipe::tok::kThinkEnd) +
                                std::string(recipe::tok::kDsml) + std::string(recipe::tok::kBos);
  json body = {{"model", "tiny"},
               {"messages", {{{"role", "user"}, {"content", "Hi " + spellings}}}},
               {"thinking", {{"type", "disabled"}}}};
  auto r = prepare_request(Endpoint::kChat, body.dump(), context(), 1);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::vector<int32_t>& ids = r->job.spec.prompt;
  auto count = [&](std::string_view spelling) {
    const int32_t id = *tok().added_token_id(spelling);
    return std::count(ids.begin(), ids.end(), id);
  };
  // <BOS><User>Hi ...<Assistant></think>: one of each placed token, none from the user text.
  EXPECT_EQ(count(recipe::tok::kBos), 1);
  EXPECT_EQ(count(recipe::tok::kUser), 1);
  EXPECT_EQ(count(recipe::tok::kAssistant), 1);
  EXPECT_EQ(count(recipe::tok::kThinkEnd), 1);
  EXPECT_EQ(count(recipe::tok::kEos), 0);
  EXPECT_EQ(count(recipe::tok::kThinkStart), 0);
  EXPECT_EQ(count(recipe::tok::kDsml), 0);
  // The user text decodes back to itself.
  auto text = tok().decode(ids);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("Hi " + spellings), std::string::npos);
}

TEST(PrepareRequest, EncodePromptInsertsOnlyPlacedControlTokens) {
  recipe::PromptBuilder b;
  b.special(recipe::tok::kBos);
  b.text(std::string("a") + std::string(recipe::tok::kUser) + "b");
  b.special(recipe::tok::kAssistant);
  auto ids = frontend::encode_prompt(tok(), std::move(b).take());
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  const int32_t user = *tok().added_token_id(recipe::tok::kUser);
  EXPECT_EQ(ids->front(), *tok().added_token_id(recipe::tok::kBos));
  EXPECT_EQ(ids->back(), *tok().added_token_id(recipe::tok::kAssistant));
  EXPECT_EQ(std::count(ids->begin(), ids->end(), user), 0);
  // A control token the vocabulary lacks is an error, never text.
  recipe::PromptBuilder c;
  c.special("<｜no_such_token｜>");
  EXPECT_FALSE(frontend::encode_prompt(tok(), std::move(c).take()).ok());
}

TEST(PrepareRequest, MessagesAndResponses) {
  auto m = prepare_request(Endpoint::kMessages,
                           R"({"model":"claude-x","max_tokens":5,
                               "messages":[{"role":"user","content":"Hi"}]})",
                           context(),
                           1);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->job.spec.max_tokens, 5);
  auto r = prepare_request(
      Endpoint::kResponses, R"({"model":"tiny","input":"Hi","max_output_tokens":6})", context(), 1);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->job.spec.max_tokens, 6);
}

TEST(PrepareRequest, BadInputIsAProtocolError) {
  EXPECT_EQ(error_of(Endpoint::kChat, "{not json").http_status, 400);
  api::ApiError wrong_type = error_of(Endpoint::kChat, R"({"model":"tiny","messages":"hello"})");
  EXPECT_EQ(wrong_type.param, "messages");
  api::ApiError unknown =
      error_of(Endpoint::kChat, R"({"model":"gpt-9","messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(unknown.code, "model_not_found");
  EXPECT_NE(unknown.message.find("gpt-9"), std::string::npos);
  api::ApiError temp =
      error_of(Endpoint::kChat,
               R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"temperature":7})");
  EXPECT_EQ(temp.param, "temperature");
  api::ApiError n = error_of(
      Endpoint::kChat, R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"n":17})");
  EXPECT_EQ(n.param, "n");
  EXPECT_EQ(n.http_status, 400);
  api::ApiError top_p = error_of(
      Endpoint::kMessages,
      R"({"model":"tiny","max_tokens":4,"top_p":1.5,"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(top_p.http_status, 400);
  EXPECT_EQ(error_of(Endpoint::kMessages, R"({"model":"tiny","messages":[]})").http_status, 400);
}

TEST(PrepareRequest, PromptAndOutputLimits) {
  std::string long_text;
  for (int i = 0; i < 300; ++i) long_text += "word" + std::to_string(i) + " ";
  api::ApiError e = error_of(
      Endpoint::kChat,
      json({{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", long_text}}}}}).dump());
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.param, "messages");
  EXPECT_NE(e.message.find("at most 200 prompt tokens"), std::string::npos) << e.message;
  api::ApiError r =
      error_of(Endpoint::kResponses, json({{"model", "tiny"}, {"input", long_text}}).dump());
  EXPECT_EQ(r.param, "input");
  api::ApiError big =
      error_of(Endpoint::kChat,
               R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":5000})");
  EXPECT_EQ(big.http_status, 400);
  EXPECT_EQ(big.param, "max_tokens");
}

TEST(PrepareRequest, ScriptedRulesApply) {
  auto s = ScriptedOutputs::from_json(
      R"({"rules":[{"match":"[[s]]","output":"hi"}]})", tok(), testing::eos_id());
  ASSERT_TRUE(s.ok());
  ServingContext c = context();
  c.scripted = s->get();
  auto r = prepare_request(
      Endpoint::kChat, R"({"model":"tiny","messages":[{"role":"user","content":"[[s]]"}]})", c, 1);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->job.script.empty());
}

TEST(ServerErrors, ShapesAndMappings) {
  api::ApiError e = api::invalid_request("messages", "bad");
  json o = json::parse(render_error(Endpoint::kChat, e));
  EXPECT_EQ(o["error"]["param"], "messages");
  EXPECT_EQ(o["error"]["type"], "invalid_request_error");
  json a = json::parse(render_error(Endpoint::kMessages, e));
  EXPECT_EQ(a["type"], "error");
  EXPECT_EQ(a["error"]["type"], "invalid_request_error");

  EXPECT_EQ(rejection_error(invalid_argument("top_p must be in (0, 1], got 2")).param, "top_p");
  EXPECT_EQ(rejection_error(invalid_argument("prompt (5 tokens) exceeds")).param, "");
  EXPECT_EQ(rejection_error(failed_precondition("shutting down")).http_status, 503);
  Completion c;
  EXPECT_FALSE(completion_error(c).has_value());
  c.cause = EndCause::kDisconnect;
  EXPECT_FALSE(completion_error(c).has_value());
  c.cause = EndCause::kTimeout;
  EXPECT_EQ(completion_error(c)->http_status, 504);
  c.cause = EndCause::kShutdown;
  EXPECT_EQ(completion_error(c)->http_status, 503);
  c.cause = EndCause::kError;
  c.error = "boom";
  EXPECT_EQ(completion_error(c)->http_status, 500);
  EXPECT_NE(completion_error(c)->message.find("boom"), std::string::npos);
}

// Events for: reasoning, content, one tool call, via the real parser.
std::vector<recipe::OutputEvent> sample_events() {
  recipe::ToolCall call;
  call.name = "get_weather";
  call.arguments = R"({"city": "Paris"})";
  const std::string text = "Think.</think>Answer.\n\n" +
                           recipe::render_tool_calls({call}, recipe::ModelVersion::kV4) +
                           std::string(recipe::tok::kEos);
  recipe::OutputParserOptions o;
  o.start = recipe::ParseStart::kReasoningStart;
  recipe::OutputParser p(o);
  std::vector<recipe::OutputEvent> evs = p.feed(text);
  for (auto& e : p.finish(recipe::FinishReason::kStop)) evs.push_back(std::move(e));
  return evs;
}

recipe::GenerationRequest decoded(Endpoint e, const std::string& body) {
  ServingContext c = context();
  c.max_prompt_tokens = 4000;
  auto r = prepare_request(e, body, c, 1);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r->request : recipe::GenerationRequest{};
}

TEST(ProtocolEncoder, EachProtocolStreamsAndBuildsTheResponse) {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])";
  struct Case {
    Endpoint endpoint;
    std::string body;
    std::string last_frame;
  } cases[] = {
      {Endpoint::kChat,
       R"({"model":"tiny","stream":true,"messages":[{"role":"user","content":"w"}],)" + tools + "}",
       "data: [DONE]\n\n"},
      {Endpoint::kMessages,
       R"({"model":"tiny","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"w"}],
          "tools":[{"name":"get_weather","input_schema":{"type":"object"}}]})",
       "event: message_stop\n"},
      {Endpoint::kResponses,
       R"({"model":"tiny","stream":true,"input":"w",
          "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]})",
       "event: response.completed\n"},
  };
  recipe::Usage u;
  u.prompt_tokens = 10;
  u.completion_tokens = 20;
  u.reasoning_tokens = 3;
  for (const Case& c : cases) {
    recipe::GenerationRequest req = decoded(c.endpoint, c.body);
    ProtocolEncoder enc(c.endpoint, req, api::ResponseMeta{});
    recipe::Usage prompt_usage;
    prompt_usage.prompt_tokens = 10;
    std::string sse = enc.start(prompt_usage);
    sse += enc.add(sample_events());
    sse += enc.finish(u);
    EXPECT_NE(sse.rfind(c.last_frame), std::string::npos) << endpoint_label(c.endpoint) << sse;
    EXPECT_NE(sse.find("get_weather"), std::string::npos);
    json body = json::parse(enc.response_json(u));
    EXPECT_NE(body.dump().find("Paris"), std::string::npos) << body.dump();
    EXPECT_NE(body.dump().find("Answer."), std::string::npos);
    ProtocolEncoder failing(c.endpoint, req, api::ResponseMeta{});
    (void)failing.start(prompt_usage);
    std::string err = failing.error(api::internal_error("boom"));
    EXPECT_NE(err.find("boom"), std::string::npos) << err;
  }
}

TEST(ServerMetrics, PrometheusExposition) {
  Metrics m;
  m.count_request("/v1/chat/completions", 200);
  m.count_request("/v1/chat/completions", 200);
  m.count_request("/v1/messages", 429);
  m.add_prompt_tokens(12);
  m.on_token(-1);
  m.on_token(0.004);
  m.observe_ttft(0.02);
  m.count_abort("disconnect");
  EngineGauges g;
  g.running = 3;
  g.queue_depth = 2;
  g.state_used_bytes = 4096;
  g.state_total_bytes = 1 << 20;
  g.state_fixed_bytes = 65536;
  g.state_bytes_per_token = 672.0;
  g.state_max_context = 1463;
  m.set_gauges(g);
  const std::string text = m.render();
  for (const char* line : {
           "dsinfer_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2\n",
           "dsinfer_requests_total{endpoint=\"/v1/messages\",status=\"429\"} 1\n",
           "dsinfer_prompt_tokens_total 12\n",
           "dsinfer_generation_tokens_total 2\n",
           "dsinfer_inter_token_latency_seconds_bucket{le=\"0.005\"} 1\n",
           "dsinfer_inter_token_latency_seconds_count 1\n",
           "dsinfer_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n",
           "dsinfer_requests_aborted_total{reason=\"disconnect\"} 1\n",
           "dsinfer_running_requests 3\n",
           "dsinfer_queue_depth 2\n",
           "dsinfer_state_memory_used_bytes 4096\n",
           "dsinfer_state_memory_bytes{kind=\"total\"} 1048576\n",
           "dsinfer_state_sequence_fixed_bytes 65536\n",
           "dsinfer_state_bytes_per_token 672\n",
           "dsinfer_state_max_context_tokens 1463\n",
           "# TYPE dsinfer_time_to_first_token_seconds histogram\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
  // Every sample line is `name{labels} value`.
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    ASSERT_NE(end, std::string::npos);
    std::string l = text.substr(pos, end - pos);
    if (l[0] != '#') {
      EXPECT_EQ(l.rfind("dsinfer_", 0), 0u) << l;
      EXPECT_NE(l.find(' '), std::string::npos) << l;
    }
    pos = end + 1;
  }
  EXPECT_EQ(text.find("dsinfer_spec_"), std::string::npos) << "no speculative metrics when off";
}

TEST(ServerMetrics, PrefixCacheCaptures) {
  Metrics m;
  EngineGauges g;
  g.prefix_cache = true;
  g.cache_lookups = 9;
  g.cache_units_stored = 7;
  g.cache_store_failures = 2;
  g.cache_async_captures = 5;
  g.cache_captures_pending = 3;
  g.device_puts = 6;
  g.device_rejected = 1;
  m.set_gauges(g);
  const std::string text = m.render();
  for (const char* line : {
           "# TYPE dsinfer_prefix_cache_store_failures_total counter\n",
           "dsinfer_prefix_cache_store_failures_total 2\n",
           "# TYPE dsinfer_prefix_cache_async_captures_total counter\n",
           "dsinfer_prefix_cache_async_captures_total 5\n",
           "# TYPE dsinfer_prefix_cache_captures_pending gauge\n",
           "dsinfer_prefix_cache_captures_pending 3\n",
           "# TYPE dsinfer_prefix_cache_device_puts_total counter\n",
           "dsinfer_prefix_cache_device_puts_total 6\n",
           "# TYPE dsinfer_prefix_cache_device_rejected_total counter\n",
           "dsinfer_prefix_cache_device_rejected_total 1\n",
           "dsinfer_prefix_cache_units_stored_total 7\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
  for (const char* name : {"dsinfer_prefix_cache_store_failures_total",
                           "dsinfer_prefix_cache_async_captures_total",
                           "dsinfer_prefix_cache_captures_pending",
                           "dsinfer_prefix_cache_device_puts_total",
                           "dsinfer_prefix_cache_device_rejected_total"}) {
    EXPECT_NE(text.find(std::string("# HELP ") + name + " "), std::string::npos) << name;
  }
  // Without a prefix cache none of them is rendered.
  Metrics off;
  off.set_gauges(EngineGauges{});
  EXPECT_EQ(off.render().find("dsinfer_prefix_cache_"), std::string::npos);
}

// Where the step loop's time goes: the engine's phases always; the device's busy and idle time
// and the backend's host phases only where the backend measures them (CUDA).
TEST(ServerMetrics, StepTime) {
  Metrics m;
  EngineGauges g;
  g.step_phase_s = {0.5, 0.25, 0.125, 8.0, 1.5};
  m.set_gauges(g);
  std::string text = m.render();
  for (const char* line : {
           "# TYPE dsinfer_engine_step_phase_seconds_total counter\n",
           "dsinfer_engine_step_phase_seconds_total{phase=\"schedule\"} 0.5\n",
           "dsinfer_engine_step_phase_seconds_total{phase=\"draft\"} 0.25\n",
           "dsinfer_engine_step_phase_seconds_total{phase=\"prepare\"} 0.125\n",
           "dsinfer_engine_step_phase_seconds_total{phase=\"forward\"} 8\n",
           "dsinfer_engine_step_phase_seconds_total{phase=\"finish\"} 1.5\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
  EXPECT_EQ(text.find("dsinfer_gpu_decode_"), std::string::npos);
  EXPECT_EQ(text.find("dsinfer_backend_host_seconds_total"), std::string::npos);
  g.device_timing = true;
  g.device_busy_s = 7.5;
  g.device_idle_s = 0.25;
  g.backend_host_s = {0.125, 0.0625, 7.0, 0.03125};
  m.set_gauges(g);
  text = m.render();
  for (const char* line : {
           "# TYPE dsinfer_gpu_decode_busy_seconds_total counter\n",
           "dsinfer_gpu_decode_busy_seconds_total 7.5\n",
           "dsinfer_gpu_decode_idle_seconds_total 0.25\n",
           "dsinfer_backend_host_seconds_total{phase=\"before\"} 0.125\n",
           "dsinfer_backend_host_seconds_total{phase=\"launch\"} 0.0625\n",
           "dsinfer_backend_host_seconds_total{phase=\"wait\"} 7\n",
           "dsinfer_backend_host_seconds_total{phase=\"after\"} 0.03125\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
}

TEST(ServerMetrics, SpeculativeDecoding) {
  Metrics m;
  EngineGauges g;
  g.spec_verified = {10, 8};
  g.spec_accepted = {8, 2};
  g.spec_verify_len = {1, 2, 8};
  g.spec_steps = 10;
  g.spec_tokens = 20;
  g.spec_resumed = 3;
  m.set_gauges(g);
  const std::string text = m.render();
  for (const char* line : {
           "dsinfer_spec_drafts_verified_total{position=\"1\"} 10\n",
           "dsinfer_spec_drafts_accepted_total{position=\"2\"} 2\n",
           "dsinfer_spec_acceptance_rate{position=\"1\"} 0.8\n",
           "dsinfer_spec_acceptance_rate{position=\"2\"} 0.25\n",
           "dsinfer_spec_verify_length_total{drafts=\"0\"} 1\n",
           "dsinfer_spec_verify_length_total{drafts=\"2\"} 8\n",
           "dsinfer_spec_verify_steps_total 10\n",
           "dsinfer_spec_emitted_tokens_total 20\n",
           "dsinfer_spec_resumed_total 3\n",
           "# TYPE dsinfer_spec_drafts_verified_total counter\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace dsinfer::server
