// The HTTP server in-process on a loopback port for the server tests (http_test.cc,
// http_hardening_test.cc): a scripted fixture model behind a real Server and EngineLoop.
#pragma once

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/engine_loop.h"
#include "server/generation.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "server/server.h"
#include "server_test_util.h"

namespace dsinfer::server::testing {

inline std::string long_text(int words) {
  std::string s;
  for (int i = 0; i < words; ++i) s += "w" + std::to_string(i) + " ";
  return s;
}

struct Config {
  int64_t max_running = 8;
  int64_t capacity = 64;
  double step_delay_s = 0;
  double grace_s = 10;
  std::string api_key;
  int64_t max_body = 1 << 20;
  double send_timeout_s = 10;
  double hard_s = 5;
  int64_t max_prompt_tokens = 4000;
};

class TestServer {
 public:
  explicit TestServer(Config c = {}) {
    LogLevel level;
    if (const char* l = std::getenv("DSINFER_TEST_LOG"); l && parse_log_level(l, &level))
      set_log_level(level);
    loop_ = std::make_unique<EngineLoop>(
        make_engine(c.max_running), tok(), &metrics, c.capacity, c.step_delay_s);
    nlohmann::json rules = {{"rules",
                             {{{"match", "[[hello]]"}, {"output", "Hello, world!"}},
                              {{"match", "[[long]]"}, {"output", long_text(900)}},
                              {{"match", "[[medium]]"}, {"output", long_text(60)}}}}};
    scripted_ = std::move(ScriptedOutputs::from_json(rules.dump(), tok(), eos_id())).value();
    ServingContext ctx;
    ctx.tokenizer = &tok();
    ctx.decode.served_models = {"tiny"};
    ctx.max_context = 4096;
    ctx.max_prompt_tokens = c.max_prompt_tokens;
    ctx.max_prompt_bytes = prompt_byte_limit(tok(), c.max_prompt_tokens);
    ctx.scripted = scripted_.get();
    ServerOptions so;
    so.port = 0;
    so.model_names = {"tiny"};
    so.api_key = c.api_key;
    so.max_body_bytes = c.max_body;
    so.shutdown_grace_s = c.grace_s;
    so.shutdown_hard_s = c.hard_s;
    so.send_timeout_s = c.send_timeout_s;
    so.idle_timeout_s = 5;
    server_ = std::make_unique<Server>(so, ctx, loop_.get(), &metrics);
    Status s = server_->listen();
    EXPECT_TRUE(s.ok()) << s.to_string();
    port = server_->port();
    loop_->start();
    thread_ = std::thread([this] { server_->run(/*handle_signals=*/false); });
  }
  ~TestServer() { stop(); }
  // Graceful shutdown; returns once run() has returned.
  void stop() {
    if (!thread_.joinable())
      return;
    server_->shutdown();
    thread_.join();
    loop_->stop();
  }
  void begin_shutdown() { server_->shutdown(); }
  bool wait_stopped(double timeout_s) {
    const bool ok = eventually([&] { return stopped_; }, 0) || join_for(timeout_s);
    return ok;
  }

  Metrics metrics;
  uint16_t port = 0;

 private:
  bool join_for(double timeout_s) {
    // std::thread has no timed join: poll a flag set by a watcher.
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread w([this, done] {
      thread_.join();
      *done = true;
    });
    const bool ok = eventually([&] { return done->load(); }, timeout_s);
    if (ok) {
      w.join();
      stopped_ = true;
      loop_->stop();
    } else {
      w.detach();
    }
    return ok;
  }
  std::unique_ptr<EngineLoop> loop_;
  std::unique_ptr<ScriptedOutputs> scripted_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  bool stopped_ = false;
};

inline std::string chat_body(const std::string& user, bool stream, int max_tokens = 3000) {
  nlohmann::json b = {{"model", "tiny"},
                      {"messages", {{{"role", "user"}, {"content", user}}}},
                      {"thinking", {{"type", "disabled"}}},
                      {"max_tokens", max_tokens},
                      {"stream", stream}};
  return b.dump();
}

// The body of a chunked response (concatenated chunks).
inline std::string dechunk(const std::string& response) {
  std::string body = body_of(response), out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos)
      break;
    const size_t n = std::stoul(body.substr(pos, eol - pos), nullptr, 16);
    if (n == 0)
      break;
    out += body.substr(eol + 2, n);
    pos = eol + 2 + n + 2;
  }
  return out;
}

}  // namespace dsinfer::server::testing
