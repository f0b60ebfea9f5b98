// The HTTP front end: Boost.Beast request parsing over Boost.Asio C++20 coroutines, one strand
// per connection on a small pool of I/O threads (thousands of idle or streaming connections cost
// a socket and a coroutine frame each, not a thread). Routes:
//   POST /v1/chat/completions, /v1/responses, /v1/messages (+ /anthropic/v1/messages)
//   GET  /v1/models, /v1/models/{id}, /health, /metrics
// Generation runs on the EngineLoop; see docs/server.md for the lifecycle (admission and 429,
// disconnect -> abort, timeouts, graceful shutdown).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace dsinfer::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;                  // 0: any free port (see Server::port())
  std::vector<std::string> model_names;  // served names; the first is the canonical one
  std::string api_key;                   // empty: no authentication
  int io_threads = 2;
  int64_t max_body_bytes = int64_t{8} << 20;
  double idle_timeout_s = 60;    // reading a request (headers and body) on an open connection
  double send_timeout_s = 60;    // one write to a client that does not read: then it is closed
  double shutdown_grace_s = 60;  // in-flight requests may finish within this after SIGTERM
  double shutdown_hard_s = 1;    // after the grace: aborted requests' last writes, then close
  int prepare_threads = 2;       // decode + render + tokenize, off the I/O threads
  int retry_after_s = 1;         // Retry-After of 429 and 503 answers
  int64_t max_model_len = 0;     // reported by /v1/models
};

class Server {
 public:
  // `loop` and `metrics` must outlive the server; `ctx.tokenizer` too.
  Server(ServerOptions options, ServingContext ctx, EngineLoop* loop, Metrics* metrics);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens. Errors name the address.
  Status listen();
  // The bound port (after listen()).
  uint16_t port() const;
  // Serves until shut down, then returns after the drain: SIGTERM/SIGINT (when
  // `handle_signals`) or shutdown() stop accepting, in-flight requests get `shutdown_grace_s` to
  // finish, then the rest are aborted. A second signal aborts at once.
  void run(bool handle_signals);
  // Starts the graceful shutdown (any thread).
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsinfer::server
