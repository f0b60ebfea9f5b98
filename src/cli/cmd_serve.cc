// `dsinfer serve`: the online server. OpenAI Chat Completions and Responses, Anthropic Messages
// (SSE streaming and not), /v1/models, /health and Prometheus /metrics over HTTP, in front of
// the engine (src/server). See docs/server.md.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/file.h"
#include "base/strings.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "grammar/tool_calls.h"
#include "kvstore/store.h"
#include "sampling/sampler.h"
#include "server/engine_loop.h"
#include "server/generation.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::cli {

namespace {

struct ServeArgs {
  EngineFlags engine;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> served_model_names;
  std::string api_key;
  int64_t max_queue = 256;
  int64_t max_prompt_tokens = 0;
  std::string max_body = "8MiB";
  double request_timeout_s = 600;
  double shutdown_grace_s = 60;
  double idle_timeout_s = 60;
  double send_timeout_s = 60;
  int io_threads = 2;
  int max_logprobs = 20;
  int max_n = 16;
  std::string log_level = "info";
  std::string debug_scripted_output;
  double debug_step_delay_ms = 0;
  // Prefix cache and KV store (docs/kv-store.md).
  bool prefix_cache = false;
  std::string kv_host_bytes = "2GiB";
  std::string kv_device_bytes = "auto";
  std::string kv_store;
  std::string kv_store_bytes = "64GiB";
  std::string kv_retention = "chat";
  int64_t kv_block = 64;
  int64_t kv_interval = 512;
};

// The model's identity for the prefix cache's salt: its config, tokenizer and the names, sizes
// and modification times of its weight files (a changed checkpoint never hits old entries).
std::string model_cache_salt(const std::string& model_dir) {
  kvstore::Hasher h;
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"}) {
    auto text = read_text_file(model_dir + "/" + f, uint64_t{1} << 30);
    h.str(f).str(text.ok() ? *text : std::string());
  }
  std::vector<std::string> weights;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(model_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0)
      weights.push_back(name);
  }
  std::sort(weights.begin(), weights.end());
  for (const std::string& w : weights) {
    const std::filesystem::path p = std::filesystem::path(model_dir) / w;
    h.str(w).u64(static_cast<uint64_t>(std::filesystem::file_size(p, ec)));
    h.i64(static_cast<int64_t>(std::filesystem::last_write_time(p, ec).time_since_epoch().count()));
  }
  return h.finish().hex();
}

std::string basename_of(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

int run_serve(const ServeArgs& a) {
  server::LogLevel level;
  if (!server::parse_log_level(a.log_level.c_str(), &level)) {
    return fail(invalid_argument("--log-level must be debug, info, warn, error or off"));
  }
  server::set_log_level(level);
  if (a.port < 0 || a.port > 65535)
    return fail(invalid_argument("--port must be in [0, 65535]"));
  if (a.max_queue < 0)
    return fail(invalid_argument("--max-queue must be >= 0"));
  if (a.io_threads < 1 || a.io_threads > 256)
    return fail(invalid_argument("--io-threads must be in [1, 256]"));
  if (a.request_timeout_s < 0 || a.shutdown_grace_s < 0 || a.idle_timeout_s <= 0 ||
      a.send_timeout_s <= 0) {
    return fail(
        invalid_argument("--request-timeout and --shutdown-grace must be >= 0, --idle-timeout and "
                         "--send-timeout > 0 (seconds)"));
  }
  for (const std::string& name : a.served_model_names) {
    if (name.empty())
      return fail(invalid_argument("--served-model-name must not be empty"));
  }
  if (a.max_logprobs < 0 || a.max_logprobs > sampling::kHardMaxTopLogprobs) {
    return fail(invalid_argument(
        str_format("--max-logprobs must be in [0, %d]", sampling::kHardMaxTopLogprobs)));
  }
  if (a.max_n < 1 || a.max_n > 128)
    return fail(invalid_argument("--max-n must be in [1, 128]"));
  auto setup = resolve_engine_flags(a.engine);
  if (!setup.ok())
    return fail(setup.status());
  setup->config.max_top_logprobs = a.max_logprobs;
  if (setup->config.expert_parallel > 0) {
    return fail(unimplemented(
        "serve --ep: routing HTTP requests to expert-parallel ranks is not built yet; "
        "`dsinfer generate --ep N` runs offline batches over N GPUs (docs/parallel.md)"));
  }
  auto max_body = parse_bytes("--max-body-bytes", a.max_body);
  if (!max_body.ok())
    return fail(max_body.status());
  const std::string model_dir = setup->config.model_dir;
  if (a.prefix_cache || !a.kv_store.empty()) {
    kvstore::KvStoreOptions ko;
    auto host = parse_bytes("--kv-host-bytes", a.kv_host_bytes);
    if (!host.ok())
      return fail(host.status());
    ko.host_bytes = *host;
    ko.dir = a.kv_store;
    auto ssd = parse_bytes("--kv-store-bytes", a.kv_store_bytes);
    if (!ssd.ok())
      return fail(ssd.status());
    ko.ssd_bytes = *ssd;
    auto cls = kvstore::parse_retention_class(a.kv_retention);
    if (!cls.ok())
      return fail(cls.status().with_context("--kv-retention"));
    if (a.kv_block < 1 || a.kv_interval < 0)
      return fail(invalid_argument("--kv-block must be >= 1 and --kv-interval >= 0"));
    auto store = kvstore::KvStore::open(ko);
    if (!store.ok())
      return fail(store.status());
    engine::PrefixCacheConfig& pc = setup->config.prefix_cache;
    if (a.kv_device_bytes == "auto") {
      pc.device_bytes = setup->config.state_budget_bytes / 4;
    } else if (a.kv_device_bytes == "0") {
      pc.device_bytes = 0;
    } else {
      auto dev = parse_bytes("--kv-device-bytes", a.kv_device_bytes);
      if (!dev.ok())
        return fail(dev.status());
      pc.device_bytes = *dev;
    }
    pc.store = std::shared_ptr<kvstore::KvStore>(std::move(store).value());
    pc.block = a.kv_block;
    pc.interval = a.kv_interval;
    pc.default_retention = *cls;
    pc.salt = model_cache_salt(model_dir);
    const kvstore::StoreStats st = pc.store->stats();
    DSI_LOG_INFO(
        "prefix cache on: device %s, host RAM %s, SSD %s (%lld entries found), default "
        "retention %s",
        human_bytes(static_cast<uint64_t>(pc.device_bytes)).c_str(),
        a.kv_host_bytes.c_str(),
        a.kv_store.empty() ? "off" : (a.kv_store + " " + a.kv_store_bytes).c_str(),
        static_cast<long long>(st.entries),
        a.kv_retention.c_str());
  }

  auto tok = tokenizer::Tokenizer::load(model_dir + "/tokenizer.json");
  if (!tok.ok()) {
    return fail(tok.status().with_context("the server needs the model's tokenizer.json"));
  }
  auto eng = engine::Engine::create(setup->config);
  if (!eng.ok())
    return fail(eng.status());
  const model::ModelConfig& mc = (*eng)->model_config();
  const int64_t max_context = a.engine.max_model_len > 0
                                  ? std::min(a.engine.max_model_len, mc.max_position_embeddings)
                                  : mc.max_position_embeddings;
  int64_t max_prompt = max_context - 1;
  if (a.max_prompt_tokens > 0)
    max_prompt = std::min(a.max_prompt_tokens, max_prompt);

  std::unique_ptr<server::ScriptedOutputs> scripted;
  if (!a.debug_scripted_output.empty()) {
    auto s = server::ScriptedOutputs::load(
        a.debug_scripted_output, **tok, static_cast<int32_t>(mc.eos_token_id));
    if (!s.ok())
      return fail(s.status());
    scripted = std::move(s).value();
    DSI_LOG_WARN(
        "TEST MODE: --debug-scripted-output %s (%zu rules) replaces the model's tokens "
        "for matching requests",
        a.debug_scripted_output.c_str(),
        scripted->size());
  }
  if (a.debug_step_delay_ms > 0) {
    DSI_LOG_WARN("TEST MODE: --debug-step-delay-ms %.1f slows every engine step",
                 a.debug_step_delay_ms);
  }

  server::ServerOptions so;
  so.host = a.host;
  so.port = static_cast<uint16_t>(a.port);
  so.model_names = a.served_model_names;
  if (so.model_names.empty())
    so.model_names.push_back(basename_of(model_dir));
  so.api_key = a.api_key;
  if (so.api_key.empty()) {
    if (const char* env = std::getenv("DSINFER_API_KEY"))
      so.api_key = env;
  }
  so.io_threads = a.io_threads;
  so.max_body_bytes = *max_body;
  so.idle_timeout_s = a.idle_timeout_s;
  so.send_timeout_s = a.send_timeout_s;
  so.prepare_threads = a.io_threads;
  so.shutdown_grace_s = a.shutdown_grace_s;
  so.max_model_len = max_context;

  server::ServingContext ctx;
  ctx.tokenizer = tok->get();
  ctx.version = setup->version;
  ctx.decode.served_models = so.model_names;
  ctx.decode.max_top_logprobs = a.max_logprobs;
  ctx.decode.max_choices = a.max_n;
  ctx.max_context = max_context;
  ctx.max_prompt_tokens = max_prompt;
  ctx.max_prompt_bytes = server::prompt_byte_limit(**tok, max_prompt);
  ctx.request_timeout_s = a.request_timeout_s;
  ctx.scripted = scripted.get();
  // Structured outputs: grammars compile against the model's vocabulary (EOS ends a complete
  // answer). Without XGrammar in the build, requests asking for them get a 400.
  std::unique_ptr<grammar::Compiler> grammars;
  if (grammar::available()) {
    // The DSML token is a marker token: strict tools' grammars write it (grammar/tool_calls.h).
    std::vector<int32_t> markers;
    if (auto dsml = (*tok)->added_token_id(grammar::kDsmlMarker);
        dsml && *dsml < static_cast<int32_t>(mc.vocab_size)) {
      markers.push_back(*dsml);
    }
    auto g = grammar::Compiler::create(**tok,
                                       static_cast<int32_t>(mc.vocab_size),
                                       {static_cast<int32_t>(mc.eos_token_id)},
                                       2,
                                       std::move(markers));
    if (!g.ok())
      return fail(g.status().with_context("structured outputs"));
    grammars = std::move(g).value();
    ctx.grammar = grammars.get();
  } else {
    DSI_LOG_WARN("built without XGrammar: structured outputs are off (requests get a 400)");
  }

  server::Metrics metrics;
  metrics.set_max_concurrency(a.engine.max_num_seqs, a.max_queue);
  server::EngineLoop loop(std::move(eng).value(),
                          **tok,
                          &metrics,
                          a.engine.max_num_seqs + a.max_queue,
                          a.debug_step_delay_ms / 1e3);
  // A device failure fails every request; then the server drains and exits non-zero.
  loop.set_on_fatal([](const Status&) { std::raise(SIGTERM); });
  server::Server srv(so, ctx, &loop, &metrics);
  Status s = srv.listen();
  if (!s.ok())
    return fail(s);
  loop.start();
  DSI_LOG_INFO(
      "serving %s as '%s' on http://%s:%u (context %lld tokens, %lld running + %lld "
      "queued requests, state memory %s, %d I/O threads%s)",
      model_dir.c_str(),
      so.model_names.front().c_str(),
      so.host.c_str(),
      static_cast<unsigned>(srv.port()),
      static_cast<long long>(max_context),
      static_cast<long long>(a.engine.max_num_seqs),
      static_cast<long long>(a.max_queue),
      a.engine.state_memory.c_str(),
      a.io_threads,
      so.api_key.empty() ? "" : ", API key required");
  srv.run(/*handle_signals=*/true);
  loop.stop();
  if (Status f = loop.fatal(); !f.ok())
    return fail(f);
  DSI_LOG_INFO("server stopped");
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve the model over HTTP: OpenAI Chat Completions/Responses, Anthropic Messages");
  add_engine_flags(cmd, &a->engine);
  cmd->add_option("--host", a->host, "Address to bind (default 127.0.0.1: loopback only)");
  cmd->add_option("--port", a->port, "TCP port (default 8000; 0 = any free port)");
  cmd->add_option("--served-model-name",
                  a->served_model_names,
                  "Model name(s) the API answers to (repeatable; default: the model "
                  "directory's name)");
  cmd->add_option("--api-key",
                  a->api_key,
                  "Require this key (Authorization: Bearer KEY or x-api-key: KEY); default "
                  "$DSINFER_API_KEY, else no authentication");
  cmd->add_option("--max-queue",
                  a->max_queue,
                  "Requests that may wait for a running slot; beyond that 429 (default 256)");
  cmd->add_option("--max-prompt-tokens",
                  a->max_prompt_tokens,
                  "Longest prompt accepted, in tokens (default: the context limit - 1)");
  cmd->add_option(
      "--max-body-bytes", a->max_body, "Largest request body (default 8MiB); larger ones get 413");
  cmd->add_option("--request-timeout",
                  a->request_timeout_s,
                  "Seconds a request may take from admission to its last token (default 600; "
                  "0 = none)");
  cmd->add_option("--shutdown-grace",
                  a->shutdown_grace_s,
                  "Seconds in-flight requests get to finish after SIGTERM (default 60)");
  cmd->add_option("--idle-timeout",
                  a->idle_timeout_s,
                  "Seconds to wait for a request on an open connection (default 60)");
  cmd->add_option("--send-timeout",
                  a->send_timeout_s,
                  "Seconds one write may wait for a client that does not read; then the "
                  "connection is closed (default 60)");
  cmd->add_option("--io-threads",
                  a->io_threads,
                  "HTTP I/O threads, and as many request-preparation threads (default 2)");
  cmd->add_option("--max-logprobs",
                  a->max_logprobs,
                  "Largest top_logprobs a request may ask for (default 20, as OpenAI; at most "
                  "1024)");
  cmd->add_option("--max-n",
                  a->max_n,
                  "Largest Chat Completions `n` (choices per request; default 16, at most 128)");
  cmd->add_flag("--prefix-cache",
                a->prefix_cache,
                "Reuse stored prompt state across requests (host RAM tier; see --kv-store)");
  cmd->add_option(
      "--kv-host-bytes", a->kv_host_bytes, "Host RAM budget of the prefix cache (default 2GiB)");
  cmd->add_option("--kv-device-bytes",
                  a->kv_device_bytes,
                  "State memory the prefix cache's device tier may keep stored prompts in "
                  "(default auto: a quarter of --state-memory; 0 = none); they give way to "
                  "running requests");
  cmd->add_option("--kv-store",
                  a->kv_store,
                  "Directory of the SSD tier of the prefix cache (implies --prefix-cache); "
                  "entries survive restarts");
  cmd->add_option(
      "--kv-store-bytes", a->kv_store_bytes, "Disk budget of --kv-store (default 64GiB)");
  cmd->add_option("--kv-retention",
                  a->kv_retention,
                  "Default retention class of stored prefixes: chat (7 days) or agent (3 days); "
                  "a request may name its own with the X-DSInfer-Retention header");
  cmd->add_option("--kv-block", a->kv_block, "Tokens per prefix-cache hash block (default 64)");
  cmd->add_option("--kv-interval",
                  a->kv_interval,
                  "Also store a prefix every N prompt tokens (default 512; 0 = only at the end "
                  "of prompts and replies)");
  cmd->add_option("--log-level", a->log_level, "debug | info | warn | error | off");
  cmd->add_option("--debug-scripted-output",
                  a->debug_scripted_output,
                  "TEST ONLY: JSON rules that replace the model's output for matching requests "
                  "(see docs/server.md)");
  cmd->add_option(
      "--debug-step-delay-ms", a->debug_step_delay_ms, "TEST ONLY: sleep after every engine step");
  cmd->callback([a, &exit_code] { exit_code = run_serve(*a); });
}

}  // namespace dsinfer::cli
