// HTTP front end (Boost.Beast parser, Boost.Asio coroutines). Threads: `io_threads` run one
// io_context; each connection is a coroutine on its own strand; the engine runs on the
// EngineLoop thread. A generation exchange is two coroutines joined with `||`: respond() waits
// on the request's Channel and writes, watch_peer() reads the socket so a client that goes away
// (EOF/reset) is noticed even while nothing is being written; whichever ends first cancels the
// other, and a vanished client aborts its request in the engine (its state is freed at once).
#include "server/server.h"

#include <signal.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/strings.h"
#include "kvstore/entry_file.h"
#include "server/choice_results.h"
#include "server/http_framing.h"
#include "server/log.h"

namespace dsinfer::server {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;
using namespace net::experimental::awaitable_operators;

namespace {

constexpr auto kTuple = net::as_tuple(net::use_awaitable);
constexpr size_t kPipelineLimit = 1 << 20;  // bytes read ahead while a response is in progress
// Lingering close after an error answer (413, 431, 400 on framing): the write side is shut down
// first and up to this much of what the client is still sending is read and dropped, so the
// client reads the answer instead of a reset (a close with unread input sends an RST).
constexpr size_t kLingerBytes = size_t{16} << 20;
constexpr double kLingerSeconds = 2;

std::chrono::steady_clock::duration secs(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

double elapsed_s(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  }
  return diff == 0 && !b.empty();
}

std::string_view sv(boost::core::string_view s) {
  return std::string_view(s.data(), s.size());
}

// Routes (also the metrics endpoint labels: never raw request input).
enum class Route {
  kChat,
  kResponses,
  kMessages,
  kModels,
  kModel,
  kHealth,
  kMetrics,
  kUnknown,
};

struct RouteMatch {
  Route route = Route::kUnknown;
  std::string label = "other";
  bool anthropic = false;  // error bodies in the Anthropic shape
  std::string model_id;    // kModel
};

RouteMatch match_route(std::string_view target) {
  const size_t q = target.find('?');
  std::string_view path = target.substr(0, q);
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  RouteMatch m;
  m.label = "other";
  if (path == "/v1/chat/completions") {
    m.route = Route::kChat;
  } else if (path == "/v1/responses") {
    m.route = Route::kResponses;
  } else if (path == "/v1/messages" || path == "/anthropic/v1/messages") {
    m.route = Route::kMessages;
    m.anthropic = true;
  } else if (path == "/v1/models" || path == "/anthropic/v1/models") {
    m.route = Route::kModels;
    m.anthropic = path.front() == '/' && path.substr(0, 10) == "/anthropic";
  } else if (path.substr(0, 11) == "/v1/models/") {
    m.route = Route::kModel;
    m.model_id = std::string(path.substr(11));
  } else if (path == "/health") {
    m.route = Route::kHealth;
  } else if (path == "/metrics") {
    m.route = Route::kMetrics;
  } else if (path.substr(0, 11) == "/anthropic/") {
    m.anthropic = true;
  }
  switch (m.route) {
    case Route::kChat:
      m.label = "/v1/chat/completions";
      break;
    case Route::kResponses:
      m.label = "/v1/responses";
      break;
    case Route::kMessages:
      m.label = std::string(path);
      break;
    case Route::kModels:
    case Route::kModel:
      m.label = "/v1/models";
      break;
    case Route::kHealth:
      m.label = "/health";
      break;
    case Route::kMetrics:
      m.label = "/metrics";
      break;
    case Route::kUnknown:
      break;
  }
  return m;
}

api::ApiError make_error(int status, std::string type, std::string message) {
  api::ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  return e;
}

std::string error_body(bool anthropic, const api::ApiError& e) {
  return anthropic ? api::render_anthropic_error(e) : api::render_openai_error(e);
}

using Headers = std::vector<std::pair<std::string, std::string>>;

// Status line and headers. content_length < 0: chunked (HTTP/1.1) or until close (HTTP/1.0).
std::string http_head(int status,
                      unsigned version,
                      bool keep_alive,
                      std::string_view content_type,
                      int64_t content_length,
                      const Headers& extra) {
  std::string h = version >= 11 ? "HTTP/1.1 " : "HTTP/1.0 ";
  h += std::to_string(status);
  h += ' ';
  h += sv(http::obsolete_reason(static_cast<http::status>(status)));
  h += "\r\nServer: dsinfer\r\nContent-Type: ";
  h += content_type;
  h += "\r\n";
  if (content_length >= 0) {
    h += "Content-Length: " + std::to_string(content_length) + "\r\n";
  } else if (version >= 11) {
    h += "Transfer-Encoding: chunked\r\n";
  }
  if (version >= 11 && !keep_alive) {
    h += "Connection: close\r\n";
  } else if (version < 11 && keep_alive) {
    h += "Connection: keep-alive\r\n";
  }
  for (const auto& [k, v] : extra) h += k + ": " + v + "\r\n";
  h += "\r\n";
  return h;
}

Headers sse_headers() {
  return {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
}

void append_chunk(std::string* out, std::string_view data, bool chunked) {
  if (data.empty())
    return;
  if (!chunked) {
    *out += data;
    return;
  }
  char len[32];
  std::snprintf(len, sizeof(len), "%zx\r\n", data.size());
  *out += len;
  *out += data;
  *out += "\r\n";
}

// One connection. Touched only on its strand.
struct Conn {
  explicit Conn(tcp::socket s) : sock(std::move(s)) {}
  tcp::socket sock;
  boost::beast::flat_buffer buf;
  bool busy = false;    // between reading a request and finishing its response
  bool head = false;    // the request being answered is a HEAD: status and headers only
  bool broken = false;  // a write failed or timed out: the stream cannot carry another response

  void close() {
    error_code ec;
    sock.shutdown(tcp::socket::shutdown_both, ec);
    sock.close(ec);
  }
};

// A request's results, handed from the engine loop thread to the connection's strand: the loop
// records them in a ChoiceResults and posts one wake-up (coalesced) that cancels the waiter's
// timer. n > 1 (Chat `n`): one engine request per choice, each reporting through its ChoiceSink.
class Channel final : public std::enable_shared_from_this<Channel> {
 public:
  using Snapshot = ChoiceResults::Snapshot;
  Channel(const net::any_io_executor& ex, size_t choices) : timer_(ex), results_(choices) {}

  void on_accepted(size_t i, int64_t prompt_tokens) {
    results_.on_accepted(i, prompt_tokens);
    notify();
  }
  void on_rejected(size_t, const Status& status) {
    results_.on_rejected(status);
    notify();
  }
  void on_events(size_t i, std::vector<recipe::OutputEvent> events) {
    results_.on_events(i, std::move(events));
    notify();
  }
  void on_finished(size_t i, const Completion& completion) {
    results_.on_finished(i, completion);
    notify();
  }
  // Everything new since the last take() (strand only).
  Snapshot take() { return results_.take(); }
  bool pending() { return results_.pending(); }
  // Waits for the next notify (or cancellation). Strand only.
  net::awaitable<void> wait() {
    timer_.expires_at(net::steady_timer::time_point::max());
    co_await timer_.async_wait(kTuple);
  }

 private:
  void notify() {
    if (notify_pending_.exchange(true))
      return;
    net::post(timer_.get_executor(), [self = shared_from_this()] {
      self->notify_pending_ = false;
      self->timer_.cancel();
    });
  }

  net::steady_timer timer_;
  std::atomic<bool> notify_pending_{false};
  ChoiceResults results_;
};

// One choice's RequestSink: forwards to the request's Channel with the choice's index.
class ChoiceSink final : public RequestSink {
 public:
  ChoiceSink(std::shared_ptr<Channel> chan, size_t index) : chan_(std::move(chan)), i_(index) {}
  void on_accepted(int64_t prompt_tokens) override { chan_->on_accepted(i_, prompt_tokens); }
  void on_rejected(const Status& status) override { chan_->on_rejected(i_, status); }
  void on_events(std::vector<recipe::OutputEvent> events) override {
    chan_->on_events(i_, std::move(events));
  }
  void on_finished(const Completion& completion) override { chan_->on_finished(i_, completion); }

 private:
  std::shared_ptr<Channel> chan_;
  size_t i_;
};

// The choices' completions as one: usage summed over the choices (the prompt counted once), the
// first end cause and error, choice 0's finish reason, the earliest first token.
Completion merge_completions(const std::vector<std::optional<Completion>>& cs) {
  Completion m = *cs[0];
  for (size_t i = 1; i < cs.size(); ++i) {
    const Completion& c = *cs[i];
    m.usage.completion_tokens += c.usage.completion_tokens;
    m.usage.reasoning_tokens += c.usage.reasoning_tokens;
    if (m.cause == EndCause::kNone && c.cause != EndCause::kNone) {
      m.cause = c.cause;
      m.error = c.error;
    }
    if (c.ttft_s >= 0 && (m.ttft_s < 0 || c.ttft_s < m.ttft_s))
      m.ttft_s = c.ttft_s;
    m.duration_s = std::max(m.duration_s, c.duration_s);
  }
  return m;
}

// What happened to one generation exchange.
struct Outcome {
  int status = 0;
  bool peer_gone = false;     // EOF/reset seen by watch_peer
  bool write_failed = false;  // a write to the client failed
  bool headers_sent = false;
  bool keep_alive = true;
  bool rejected = false;  // the engine refused (a choice of) the request
  std::optional<Completion> completion;
};

net::awaitable<bool> is_cancelled() {
  auto cs = co_await net::this_coro::cancellation_state;
  co_return cs.cancelled() != net::cancellation_type::none;
}

// A request-derived token (a field path) made safe for a log line: printable ASCII, <= 80 bytes.
std::string log_safe(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, 80)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return out;
}

void log_exception(std::exception_ptr e, const char* where) {
  if (!e)
    return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    DSI_LOG_ERROR("%s: unexpected exception: %s", where, x.what());
  } catch (...) {
    DSI_LOG_ERROR("%s: unexpected exception", where);
  }
}

}  // namespace

struct Server::Impl {
  Impl(ServerOptions o, ServingContext c, EngineLoop* l, Metrics* m)
      : ioc(std::max(1, o.io_threads)),
        control(net::make_strand(ioc)),
        acceptor(control),
        opts(std::move(o)),
        ctx(std::move(c)),
        loop(l),
        metrics(m),
        prepare_pool(static_cast<size_t>(std::max(1, opts.prepare_threads))) {
    std::random_device rd;
    seed_base = (uint64_t{rd()} << 32) ^ rd() ^
                static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    started_at = static_cast<int64_t>(std::time(nullptr));
  }

  // Declared first: destroyed last, after everything that lives on it.
  net::io_context ioc;
  net::strand<net::io_context::executor_type> control;  // acceptor, signals, drain
  tcp::acceptor acceptor;
  std::optional<net::signal_set> signals;
  ServerOptions opts;
  ServingContext ctx;
  EngineLoop* loop;
  Metrics* metrics;
  uint64_t seed_base = 0;
  std::atomic<uint64_t> seed_counter{0};
  int64_t started_at = 0;
  uint16_t bound_port = 0;

  std::atomic<bool> draining{false};
  bool drained = false;  // control strand
  std::atomic<int64_t> busy{0};
  std::mutex conns_mu;
  std::set<std::shared_ptr<Conn>> conns;
  // Request preparation (JSON decoding, prompt rendering, tokenization: CPU-bound, up to the body
  // limit) runs here, never on the I/O threads, so one large body cannot stall other
  // connections. Declared last: joined first, while everything its tasks use still exists.
  net::thread_pool prepare_pool;

  uint64_t next_seed() {
    uint64_t z = seed_base + 0x9e3779b97f4a7c15ULL * (seed_counter.fetch_add(1) + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  Status listen();
  void run(bool handle_signals);
  void arm_signals();
  void begin_shutdown();
  void close_connections(bool idle_only);
  net::awaitable<void> accept_loop();
  net::awaitable<void> drain();
  net::awaitable<void> session(std::shared_ptr<Conn> c);
  // Writes all of `data` within --send-timeout; false (and the connection marked broken) on
  // failure or timeout.
  net::awaitable<bool> write(Conn& c, std::string data);
  net::awaitable<void> linger_close(Conn& c);
  net::awaitable<void> send(Conn& c,
                            unsigned version,
                            bool keep_alive,
                            int status,
                            std::string_view content_type,
                            std::string body,
                            const Headers& extra = {});
  net::awaitable<void> send_error(Conn& c,
                                  unsigned version,
                                  bool keep_alive,
                                  bool anthropic,
                                  const api::ApiError& e,
                                  const Headers& extra = {});
  net::awaitable<bool> dispatch(Conn& c, http::request<http::string_body>& req, bool keep_alive);
  net::awaitable<bool> generate(Conn& c,
                                Endpoint endpoint,
                                const RouteMatch& route,
                                http::request<http::string_body>& req,
                                bool keep_alive);
  net::awaitable<void> respond(Conn& c,
                               Channel& chan,
                               ProtocolEncoder& enc,
                               bool stream,
                               unsigned version,
                               bool anthropic,
                               Outcome* o);
  net::awaitable<void> watch_peer(Conn& c, Outcome* o);
  bool authorized(const http::request<http::string_body>& req) const;
  std::string models_json() const;
};

// ---------------------------------------------------------------------------------------------
// Listening, signals, shutdown.

Status Server::Impl::listen() {
  error_code ec;
  auto addr = net::ip::make_address(opts.host, ec);
  if (ec)
    return invalid_argument("--host: `" + opts.host + "` is not an IP address");
  tcp::endpoint ep(addr, opts.port);
  acceptor.open(ep.protocol(), ec);
  if (!ec)
    acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec)
    acceptor.bind(ep, ec);
  if (!ec)
    acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return io_error(str_format("cannot listen on %s:%u: %s",
                               opts.host.c_str(),
                               static_cast<unsigned>(opts.port),
                               ec.message().c_str()));
  }
  bound_port = acceptor.local_endpoint(ec).port();
  return Status();
}

void Server::Impl::run(bool handle_signals) {
  ::signal(SIGPIPE, SIG_IGN);
  if (handle_signals) {
    signals.emplace(control, SIGINT, SIGTERM);
    arm_signals();
  }
  net::co_spawn(control, accept_loop(), [](std::exception_ptr e) { log_exception(e, "accept"); });
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, opts.io_threads); ++i) {
    threads.emplace_back([this] { ioc.run(); });
  }
  ioc.run();
  for (auto& t : threads) t.join();
  if (handle_signals) {
    // Shut down: a further SIGTERM/SIGINT while the process finishes exiting is ignored rather
    // than killing it (the exit status stays 0).
    signals.reset();
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGTERM, SIG_IGN);
  }
}

void Server::Impl::arm_signals() {
  if (drained)
    return;
  signals->async_wait([this](const error_code& ec, int sig) {
    if (ec)
      return;
    arm_signals();  // first: begin_shutdown() may run the drain inline, which cancels the wait
    if (!draining.load()) {
      DSI_LOG_INFO("received %s: shutting down gracefully", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      begin_shutdown();
    } else {
      DSI_LOG_WARN("received a second signal: aborting the requests in flight");
      loop->abort_all(EndCause::kShutdown);
    }
  });
}

void Server::Impl::begin_shutdown() {
  if (draining.exchange(true))
    return;
  error_code ec;
  acceptor.close(ec);
  DSI_LOG_INFO("stopped accepting connections; %lld request(s) in flight, grace period %.0f s",
               static_cast<long long>(loop->in_flight()),
               opts.shutdown_grace_s);
  close_connections(/*idle_only=*/true);
  net::co_spawn(control, drain(), [](std::exception_ptr e) { log_exception(e, "drain"); });
}

void Server::Impl::close_connections(bool idle_only) {
  std::lock_guard<std::mutex> l(conns_mu);
  for (const auto& c : conns) {
    net::post(c->sock.get_executor(), [c, idle_only] {
      if (!idle_only || !c->busy)
        c->close();
    });
  }
}

net::awaitable<void> Server::Impl::drain() {
  net::steady_timer t(control);
  const Clock::time_point t0 = Clock::now();
  bool aborted = false;
  bool forced = false;
  bool hard = false;
  while (busy.load() > 0) {
    const double dt = elapsed_s(t0);
    if (!aborted && dt >= opts.shutdown_grace_s) {
      DSI_LOG_WARN("grace period over: aborting %lld request(s)",
                   static_cast<long long>(loop->in_flight()));
      loop->abort_all(EndCause::kShutdown);
      aborted = true;
    }
    if (!forced && dt >= opts.shutdown_grace_s + opts.shutdown_hard_s) {
      // Aborted requests had their time to send the error event; what is left is blocked on
      // clients that do not read. Closing the sockets ends those writes at once.
      close_connections(/*idle_only=*/false);
      forced = true;
    }
    if (dt >= opts.shutdown_grace_s + opts.shutdown_hard_s + 1) {
      hard = true;
      break;
    }
    t.expires_after(std::chrono::milliseconds(20));
    co_await t.async_wait(kTuple);
  }
  drained = true;
  if (signals) {
    error_code ec;
    signals->cancel(ec);
  }
  close_connections(/*idle_only=*/false);
  if (hard) {
    DSI_LOG_ERROR("connections still open %.0f s after the grace period: stopping",
                  opts.shutdown_hard_s);
    ioc.stop();
  } else {
    DSI_LOG_INFO("drained in %.2f s", elapsed_s(t0));
  }
}

net::awaitable<void> Server::Impl::accept_loop() {
  for (;;) {
    auto [ec, sock] =
        co_await acceptor.async_accept(net::any_io_executor(net::make_strand(ioc)), kTuple);
    if (ec) {
      if (!acceptor.is_open() || draining.load()) {
        DSI_LOG_DEBUG("accept loop: done (%s)", ec.message().c_str());
        co_return;
      }
      DSI_LOG_WARN("accept failed: %s", ec.message().c_str());
      // Out of file descriptors and the like: back off instead of spinning.
      net::steady_timer t(control);
      t.expires_after(std::chrono::milliseconds(50));
      co_await t.async_wait(kTuple);
      continue;
    }
    error_code ignored;
    sock.set_option(tcp::no_delay(true), ignored);
    auto c = std::make_shared<Conn>(std::move(sock));
    auto ex = c->sock.get_executor();
    net::co_spawn(
        ex, session(std::move(c)), [](std::exception_ptr e) { log_exception(e, "connection"); });
  }
}

// ---------------------------------------------------------------------------------------------
// Connections.

net::awaitable<bool> Server::Impl::write(Conn& c, std::string data) {
  if (c.broken)
    co_return false;
  // Bounded by --send-timeout: a client that stops reading fills the socket buffers and would
  // otherwise hold the connection (and its buffered output) forever.
  net::steady_timer timer(co_await net::this_coro::executor);
  timer.expires_after(secs(opts.send_timeout_s));
  auto r =
      co_await (net::async_write(c.sock, net::buffer(data), kTuple) || timer.async_wait(kTuple));
  if (r.index() == 1) {
    metrics->count_send_timeout();
    DSI_LOG_INFO("closing a connection whose client did not read for %.0f s", opts.send_timeout_s);
    c.broken = true;
    c.close();
    co_return false;
  }
  if (std::get<0>(std::get<0>(r))) {
    c.broken = true;
    co_return false;
  }
  co_return true;
}

net::awaitable<void> Server::Impl::send(Conn& c,
                                        unsigned version,
                                        bool keep_alive,
                                        int status,
                                        std::string_view content_type,
                                        std::string body,
                                        const Headers& extra) {
  std::string msg = http_head(
      status, version, keep_alive, content_type, static_cast<int64_t>(body.size()), extra);
  if (!c.head)
    msg += body;  // HEAD: the same headers (Content-Length included), never a body
  co_await write(c, std::move(msg));
}

net::awaitable<void> Server::Impl::linger_close(Conn& c) {
  error_code ec;
  c.sock.shutdown(tcp::socket::shutdown_send, ec);
  if (ec)
    co_return;
  c.buf.consume(c.buf.size());
  net::steady_timer timer(co_await net::this_coro::executor);
  timer.expires_after(secs(kLingerSeconds));
  std::vector<char> scratch(16 * 1024);
  size_t drained = 0;
  while (drained < kLingerBytes) {
    auto r =
        co_await (c.sock.async_read_some(net::buffer(scratch), kTuple) || timer.async_wait(kTuple));
    if (r.index() == 1)
      break;
    auto [rec, n] = std::get<0>(r);
    if (rec)
      break;  // EOF: the client read the answer and closed
    drained += n;
  }
}

net::awaitable<void> Server::Impl::send_error(Conn& c,
                                              unsigned version,
                                              bool keep_alive,
                                              bool anthropic,
                                              const api::ApiError& e,
                                              const Headers& extra) {
  co_await send(
      c, version, keep_alive, e.http_status, "application/json", error_body(anthropic, e), extra);
}

net::awaitable<void> Server::Impl::session(std::shared_ptr<Conn> c) {
  co_await net::this_coro::throw_if_cancelled(false);
  {
    std::lock_guard<std::mutex> l(conns_mu);
    conns.insert(c);
  }
  const auto ex = co_await net::this_coro::executor;
  bool linger = false;  // closing after an error answer while the client may still be sending
  // An error answer that ends the connection (framing the stream cannot recover from).
  auto refuse = [&](unsigned version,
                    const RouteMatch& route,
                    int status,
                    std::string message) -> net::awaitable<void> {
    co_await send_error(*c,
                        version,
                        false,
                        route.anthropic,
                        make_error(status, "invalid_request_error", std::move(message)));
    metrics->count_request(route.label, status);
    linger = true;
  };
  try {
    for (;;) {
      if (draining.load())
        break;
      net::steady_timer timer(ex);
      timer.expires_after(secs(opts.idle_timeout_s));
      // The raw header block first: its size (431) and obs-folding (400) are checked on the
      // bytes, before the parser sees them.
      size_t head_end = std::string_view::npos;
      bool closed = false;
      for (;;) {
        std::string_view data(static_cast<const char*>(c->buf.data().data()), c->buf.size());
        size_t skip = 0;  // empty lines before the request line (RFC 9112 section 2.2)
        while (skip < data.size() && (data[skip] == '\r' || data[skip] == '\n')) ++skip;
        if (skip > 0) {
          c->buf.consume(skip);
          continue;
        }
        head_end = header_block_end(data.substr(0, std::min(data.size(), kHeaderLimit + 4)));
        if (head_end != std::string_view::npos || data.size() > kHeaderLimit)
          break;
        auto r = co_await (c->sock.async_read_some(c->buf.prepare(16 * 1024), kTuple) ||
                           timer.async_wait(kTuple));
        if (r.index() == 1) {
          closed = true;  // idle keep-alive connection (or a stalled header)
          break;
        }
        auto [ec, n] = std::get<0>(r);
        c->buf.commit(n);
        if (ec) {
          closed = true;
          break;
        }
      }
      if (closed)
        break;
      const std::string_view raw(static_cast<const char*>(c->buf.data().data()), c->buf.size());
      const size_t line_end = raw.find('\n');
      const std::string_view line = raw.substr(0, line_end);
      const size_t sp1 = line.find(' ');
      const RouteMatch raw_route = match_route(
          sp1 == std::string_view::npos ? std::string_view()
                                        : line.substr(sp1 + 1, line.find(' ', sp1 + 1) - sp1 - 1));
      // A HEAD request gets no body in any answer, refusals included.
      c->head = line.substr(0, 5) == "HEAD ";
      if (Refusal refusal = check_header_block(raw, head_end); refusal.status != 0) {
        co_await refuse(11, raw_route, refusal.status, std::move(refusal.message));
        break;
      }

      http::request_parser<http::string_body> parser;
      parser.header_limit(static_cast<uint32_t>(kHeaderLimit + 8));
      parser.body_limit(static_cast<uint64_t>(opts.max_body_bytes));
      auto r = co_await (http::async_read_header(c->sock, c->buf, parser, kTuple) ||
                         timer.async_wait(kTuple));
      if (r.index() == 1)
        break;
      error_code ec = std::get<0>(std::get<0>(r));
      const unsigned version = parser.get().version() ? parser.get().version() : 11;
      const RouteMatch route = match_route(sv(parser.get().target()));
      const std::string too_large =
          str_format("The request body is larger than this server's limit of %lld bytes.",
                     static_cast<long long>(opts.max_body_bytes));
      if (ec == http::error::body_limit) {
        co_await refuse(version, route, 413, too_large);
        break;
      }
      if (ec) {
        if (ec != http::error::end_of_stream && ec != net::error::eof &&
            ec != net::error::operation_aborted && ec != net::error::connection_reset &&
            ec != net::error::bad_descriptor) {
          // Malformed HTTP: answer and hang up (the stream cannot be resynchronised).
          co_await refuse(11, raw_route, 400, "Malformed HTTP request: " + ec.message());
        }
        break;
      }
      if (Refusal refusal = check_request_header(parser.get()); refusal.status != 0) {
        co_await refuse(version, route, refusal.status, std::move(refusal.message));
        break;
      }
      c->busy = true;
      ++busy;
      bool keep_alive = false;
      bool ok = true;
      if (!parser.is_done()) {
        auto expect = parser.get()[http::field::expect];
        if (sv(expect) == "100-continue" && version >= 11)
          ok = co_await write(*c, std::string("HTTP/1.1 100 Continue\r\n\r\n"));
        if (ok) {
          timer.expires_after(secs(opts.idle_timeout_s));
          auto rb = co_await (http::async_read(c->sock, c->buf, parser, kTuple) ||
                              timer.async_wait(kTuple));
          if (rb.index() == 1) {
            co_await refuse(version, route, 408, "Timed out reading the request body.");
            ok = false;
          } else if (error_code bec = std::get<0>(std::get<0>(rb))) {
            if (bec == http::error::body_limit) {
              co_await refuse(version, route, 413, too_large);
            } else if (bec != http::error::end_of_stream && bec != net::error::eof &&
                       bec != net::error::connection_reset &&
                       bec != net::error::operation_aborted) {
              co_await refuse(version, route, 400, "Malformed HTTP request body: " + bec.message());
            }
            ok = false;
          }
        }
      }
      if (ok) {
        http::request<http::string_body> req = parser.release();
        keep_alive = co_await dispatch(*c, req, req.keep_alive() && !draining.load());
      }
      c->busy = false;
      --busy;
      c->head = false;
      if (!keep_alive || c->broken)
        break;
    }
  } catch (const std::exception& x) {
    DSI_LOG_ERROR("connection: unexpected exception: %s", x.what());
  } catch (...) {
    DSI_LOG_ERROR("connection: unexpected exception");
  }
  if (c->busy) {  // left by an exception mid-exchange
    c->busy = false;
    --busy;
  }
  if (linger && !c->broken) {
    try {
      co_await linger_close(*c);
    } catch (...) {
    }
  }
  c->close();
  std::lock_guard<std::mutex> l(conns_mu);
  conns.erase(c);
}

bool Server::Impl::authorized(const http::request<http::string_body>& req) const {
  if (opts.api_key.empty())
    return true;
  // `Authorization: Bearer KEY`; the scheme is case-insensitive (RFC 9110 section 11.1).
  const std::string_view auth = trim_ows(sv(req[http::field::authorization]));
  const size_t sp = auth.find(' ');
  if (sp != std::string_view::npos && iequals(auth.substr(0, sp), "bearer") &&
      constant_time_equal(trim_ows(auth.substr(sp + 1)), opts.api_key)) {
    return true;
  }
  std::string_view key = sv(req["x-api-key"]);
  return !key.empty() && constant_time_equal(key, opts.api_key);
}

std::string Server::Impl::models_json() const {
  nlohmann::ordered_json data = nlohmann::ordered_json::array();
  char created[32];
  const std::time_t t = static_cast<std::time_t>(started_at);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(created, sizeof(created), "%Y-%m-%dT%H:%M:%SZ", &tm);
  for (const std::string& name : opts.model_names) {
    nlohmann::ordered_json m;
    m["id"] = name;
    m["object"] = "model";
    m["created"] = started_at;
    m["owned_by"] = "dsinfer";
    m["max_model_len"] = opts.max_model_len;
    m["type"] = "model";  // Anthropic's Models API fields
    m["display_name"] = name;
    m["created_at"] = created;
    data.push_back(std::move(m));
  }
  nlohmann::ordered_json j;
  j["object"] = "list";
  j["data"] = std::move(data);
  j["has_more"] = false;
  j["first_id"] = opts.model_names.empty() ? nlohmann::ordered_json(nullptr)
                                           : nlohmann::ordered_json(opts.model_names.front());
  j["last_id"] = opts.model_names.empty() ? nlohmann::ordered_json(nullptr)
                                          : nlohmann::ordered_json(opts.model_names.back());
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

net::awaitable<bool> Server::Impl::dispatch(Conn& c,
                                            http::request<http::string_body>& req,
                                            bool keep_alive) {
  const unsigned version = req.version();
  const RouteMatch route = match_route(sv(req.target()));
  const http::verb method = req.method();
  const Clock::time_point t0 = Clock::now();

  auto finish = [&](int status) {
    metrics->count_request(route.label, status);
    DSI_LOG_DEBUG("%s %s %d %.1f ms",
                  std::string(sv(req.method_string())).c_str(),
                  route.label.c_str(),
                  status,
                  elapsed_s(t0) * 1e3);
  };

  if (route.route == Route::kUnknown) {
    api::ApiError e = make_error(404, "not_found_error", "Unknown path.");
    e.code = "not_found";
    co_await send_error(c, version, keep_alive, route.anthropic, e);
    finish(404);
    co_return keep_alive;
  }
  const bool is_post = route.route == Route::kChat || route.route == Route::kResponses ||
                       route.route == Route::kMessages;
  // GET routes answer HEAD too (same status and headers, no body); a HEAD on a POST route gets a
  // 405 without a body (send() never writes a body for HEAD).
  const bool method_ok = is_post ? method == http::verb::post
                                 : (method == http::verb::get || method == http::verb::head);
  if (!method_ok) {
    const std::string allow = is_post ? std::string("POST") : std::string("GET, HEAD");
    api::ApiError e =
        make_error(405, "invalid_request_error", "Method not allowed; use " + allow + ".");
    Headers extra{{"Allow", allow}};
    co_await send_error(c, version, keep_alive, route.anthropic, e, extra);
    finish(405);
    co_return keep_alive;
  }
  if (route.route == Route::kHealth) {
    const bool d = draining.load();
    std::string body =
        d ? std::string(R"({"status":"draining"})") : std::string(R"({"status":"ok"})");
    co_await send(c, version, keep_alive, d ? 503 : 200, "application/json", std::move(body));
    finish(d ? 503 : 200);
    co_return keep_alive;
  }
  if (!authorized(req)) {
    api::ApiError e = make_error(
        401,
        route.anthropic ? "authentication_error" : "invalid_request_error",
        "Missing or invalid API key (send `Authorization: Bearer KEY` or `x-api-key: KEY`).");
    e.code = "invalid_api_key";
    co_await send_error(c, version, keep_alive, route.anthropic, e);
    finish(401);
    co_return keep_alive;
  }
  switch (route.route) {
    case Route::kMetrics:
      co_await send(c,
                    version,
                    keep_alive,
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    metrics->render());
      finish(200);
      co_return keep_alive;
    case Route::kModels:
      co_await send(c, version, keep_alive, 200, "application/json", models_json());
      finish(200);
      co_return keep_alive;
    case Route::kModel: {
      bool known = false;
      for (const auto& n : opts.model_names) known = known || n == route.model_id;
      if (!known) {
        api::ApiError e =
            make_error(404,
                       "invalid_request_error",
                       "The model '" + route.model_id.substr(0, 128) + "' does not exist.");
        e.code = "model_not_found";
        co_await send_error(c, version, keep_alive, false, e);
        finish(404);
        co_return keep_alive;
      }
      nlohmann::ordered_json m;
      m["id"] = route.model_id;
      m["object"] = "model";
      m["created"] = started_at;
      m["owned_by"] = "dsinfer";
      m["max_model_len"] = opts.max_model_len;
      co_await send(c, version, keep_alive, 200, "application/json", m.dump());
      finish(200);
      co_return keep_alive;
    }
    case Route::kChat:
      co_return co_await generate(c, Endpoint::kChat, route, req, keep_alive);
    case Route::kResponses:
      co_return co_await generate(c, Endpoint::kResponses, route, req, keep_alive);
    case Route::kMessages:
      co_return co_await generate(c, Endpoint::kMessages, route, req, keep_alive);
    default:
      break;
  }
  co_return keep_alive;
}

// ---------------------------------------------------------------------------------------------
// Generation exchanges.

net::awaitable<bool> Server::Impl::generate(Conn& c,
                                            Endpoint endpoint,
                                            const RouteMatch& route,
                                            http::request<http::string_body>& req,
                                            bool keep_alive) {
  const unsigned version = req.version();
  const bool anthropic = route.anthropic;
  const Clock::time_point t0 = Clock::now();
  const size_t body_bytes = req.body().size();
  const Headers retry_after{{std::string("Retry-After"), std::to_string(opts.retry_after_s)}};

  if (draining.load()) {
    co_await send_error(c,
                        version,
                        false,
                        anthropic,
                        make_error(503, "service_unavailable", "The server is shutting down."),
                        retry_after);
    metrics->count_request(route.label, 503);
    co_return false;
  }
  // Strict media types: a JSON body, not content-encoded (415 in the protocol's shape).
  const std::string_view encoding = trim_ows(sv(req[http::field::content_encoding]));
  const bool has_encoding = req.count(http::field::content_encoding) > 0;
  if ((has_encoding && !iequals(encoding, "identity")) ||
      !is_json_content_type(sv(req[http::field::content_type]))) {
    api::ApiError e = make_error(
        415,
        "invalid_request_error",
        has_encoding && !iequals(encoding, "identity")
            ? std::string("Content-Encoding is not supported; send the JSON body uncompressed.")
            : std::string("The request body must be JSON (Content-Type: application/json)."));
    co_await send_error(c, version, keep_alive, anthropic, e);
    metrics->count_request(route.label, 415);
    co_return keep_alive;
  }
  const uint64_t seed = next_seed();
  // The body and the result live in this frame, which outlives the preparation (the pool is
  // joined before the io_context and its coroutine frames are destroyed). The lambda captures
  // only trivially destructible values: GCC may destroy temporaries of a co_await expression
  // twice (GCC PR 99576), which a captured shared_ptr would not survive.
  std::string body = std::move(req.body());
  std::optional<api::ApiResult<PreparedRequest>> result;
  co_await net::co_spawn(
      prepare_pool,
      [this, endpoint, seed, b = &body, out = &result]() -> net::awaitable<void> {
        out->emplace(prepare_request(endpoint, *b, ctx, seed));
        const bool large = b->size() >= (size_t{1} << 20);
        b->clear();
        b->shrink_to_fit();
#if defined(__GLIBC__)
        // A large body leaves a large, now free heap (JSON tree, rendered text, token ids):
        // give it back to the system instead of keeping the high-water mark.
        if (large)
          malloc_trim(0);
#else
        (void)large;
#endif
        co_return;
      },
      net::use_awaitable);
  api::ApiResult<PreparedRequest> prepared = std::move(*result);
  result.reset();
  if (!prepared.ok()) {
    const api::ApiError& e = prepared.error();
    co_await send_error(c, version, keep_alive, anthropic, e);
    metrics->count_request(route.label, e.http_status);
    DSI_LOG_INFO("%s %d body_bytes=%zu rejected (param=%s)",
                 route.label.c_str(),
                 e.http_status,
                 body_bytes,
                 e.param.empty() ? "-" : log_safe(e.param).c_str());
    co_return keep_alive;
  }
  PreparedRequest& p = prepared.value();
  // Prefix cache: the retention class of what this request stores and the tenant that scopes
  // its entries (docs/kv-store.md).
  std::string cache_error;
  {
    const std::string_view cls = trim_ows(sv(req["x-dsinfer-retention"]));
    std::optional<kvstore::RetentionClass> retention;
    if (!cls.empty()) {
      auto parsed = kvstore::parse_retention_class(cls);
      if (parsed.ok())
        retention = *parsed;
      else
        cache_error = "X-DSInfer-Retention: " + parsed.status().message();
    }
    const std::string tenant(trim_ows(sv(req["x-dsinfer-cache-tenant"])));
    p.job.spec.cache_retention = retention;
    p.job.spec.cache_tenant = tenant;
    for (Job& j : p.more_choices) {
      j.spec.cache_retention = retention;
      j.spec.cache_tenant = tenant;
    }
  }
  if (!cache_error.empty()) {
    api::ApiError e = make_error(400, "invalid_request_error", cache_error);
    co_await send_error(c, version, keep_alive, anthropic, e);
    metrics->count_request(route.label, 400);
    co_return keep_alive;
  }
  // One admission slot per choice (n > 1 runs n engine requests).
  const size_t choices = 1 + p.more_choices.size();
  size_t admitted = 0;
  while (admitted < choices && loop->try_admit()) ++admitted;
  if (admitted < choices) {
    for (size_t i = 0; i < admitted; ++i) loop->cancel_admission();
    api::ApiError e =
        make_error(429,
                   anthropic ? "rate_limit_error" : "rate_limit_exceeded",
                   str_format("The server is at capacity (%lld requests running or queued); "
                              "retry later.",
                              static_cast<long long>(loop->capacity())));
    co_await send_error(c, version, keep_alive, anthropic, e, retry_after);
    metrics->count_request(route.label, 429);
    DSI_LOG_INFO("%s 429 queue full (%lld in flight)",
                 route.label.c_str(),
                 static_cast<long long>(loop->in_flight()));
    co_return keep_alive;
  }
  const bool stream = p.request.stream;
  const int64_t prompt_tokens = static_cast<int64_t>(p.job.spec.prompt.size());
  const bool scripted = !p.job.script.empty();
  api::ResponseMeta meta;
  meta.created = static_cast<int64_t>(std::time(nullptr));
  meta.seed = seed;
  ProtocolEncoder enc(endpoint, p.request, meta);
  auto chan = std::make_shared<Channel>(co_await net::this_coro::executor, choices);
  std::vector<uint64_t> tickets;
  tickets.push_back(loop->submit(std::move(p.job), std::make_shared<ChoiceSink>(chan, 0)));
  for (size_t i = 1; i < choices; ++i) {
    Job& j = p.more_choices[i - 1];
    j.share_prompt_ticket = tickets[0];  // fork choice 0's prompt state
    tickets.push_back(loop->submit(std::move(j), std::make_shared<ChoiceSink>(chan, i)));
  }
  const uint64_t ticket = tickets[0];

  Outcome o;
  o.keep_alive = keep_alive;
  co_await (respond(c, *chan, enc, stream, version, anthropic, &o) || watch_peer(c, &o));
  const bool gone = !o.completion;  // the client vanished (EOF/reset/write error) mid-exchange
  if (o.rejected && tickets.size() > 1) {
    // One choice was refused: the others are not wanted either.
    for (uint64_t t : tickets) loop->abort(t, EndCause::kError);
  }
  if (gone) {
    // Stop generating now: the loop aborts the request and frees its state.
    for (uint64_t t : tickets) loop->abort(t, EndCause::kDisconnect);
    // 499: the client closed the request before its response was complete (nginx's convention),
    // for metrics and logs (the client may have seen a 200 status line already).
    o.status = 499;
  }
  if (gone || o.peer_gone)
    o.keep_alive = false;
  metrics->count_request(route.label, o.status);
  const Completion* done = o.completion ? &*o.completion : nullptr;
  DSI_LOG_INFO(
      "%s %d ticket=%llu stream=%d body_bytes=%zu prompt_tokens=%lld completion_tokens=%lld "
      "reasoning_tokens=%lld finish=%s end=%s ttft_ms=%.1f total_ms=%.1f%s",
      route.label.c_str(),
      o.status,
      static_cast<unsigned long long>(ticket),
      stream ? 1 : 0,
      body_bytes,
      static_cast<long long>(prompt_tokens),
      static_cast<long long>(done ? done->usage.completion_tokens : 0),
      static_cast<long long>(done ? done->usage.reasoning_tokens : 0),
      done ? recipe::finish_reason_name(done->finish) : "-",
      gone ? "disconnect" : end_cause_name(done->cause),
      done && done->ttft_s >= 0 ? done->ttft_s * 1e3 : -1.0,
      elapsed_s(t0) * 1e3,
      scripted ? " scripted=1" : "");
  co_return o.keep_alive && !draining.load();
}

net::awaitable<void> Server::Impl::respond(Conn& c,
                                           Channel& chan,
                                           ProtocolEncoder& enc,
                                           bool stream,
                                           unsigned version,
                                           bool anthropic,
                                           Outcome* o) {
  co_await net::this_coro::throw_if_cancelled(false);
  const bool chunked = version >= 11;
  if (stream && !chunked)
    o->keep_alive = false;   // HTTP/1.0: the body ends when the connection does
  std::vector<bool> closed;  // n > 1, streaming: choices whose finish chunk went out
  for (;;) {
    Channel::Snapshot s = chan.take();
    if (s.rejected) {
      api::ApiError e = rejection_error(*s.rejected);
      co_await send_error(c, version, o->keep_alive, anthropic, e);
      o->status = e.http_status;
      o->rejected = true;
      o->completion = Completion{};
      o->completion->cause = EndCause::kNone;
      co_return;
    }
    closed.resize(s.finished.size(), false);
    std::optional<Completion> finished;
    if (s.all_finished)
      finished = merge_completions(s.finished);
    std::string out;
    if (stream) {
      if (s.accepted && !o->headers_sent) {
        out = http_head(
            200, version, o->keep_alive, "text/event-stream; charset=utf-8", -1, sse_headers());
        recipe::Usage prompt_usage;
        prompt_usage.prompt_tokens = s.prompt_tokens;
        append_chunk(&out, enc.start(prompt_usage), chunked);
        o->headers_sent = true;
        o->status = 200;
      }
      std::string frames;
      for (size_t i = 0; i < s.events.size(); ++i) {
        frames += enc.add(s.events[i], i);
        // n > 1: each choice's finish chunk as soon as it is done (unless it failed: then the
        // error event ends the whole stream below).
        if (enc.choices() > 1 && s.finished[i] && !closed[i] && !completion_error(*s.finished[i])) {
          frames += enc.finish_choice(i);
          closed[i] = true;
        }
      }
      if (finished) {
        if (auto err = completion_error(*finished)) {
          frames += enc.error(*err);
        } else {
          frames += enc.finish(finished->usage);
        }
      }
      // ChoiceResults hands nothing out before every choice is accepted: no chunk can precede
      // the status line.
      DSI_CHECK(frames.empty() || o->headers_sent, "stream data before the response head");
      append_chunk(&out, frames, chunked);
      if (finished && chunked)
        out += "0\r\n\r\n";
    } else {
      for (size_t i = 0; i < s.events.size(); ++i) (void)enc.add(s.events[i], i);
      if (finished) {
        if (auto err = completion_error(*finished)) {
          o->status = err->http_status;
          std::string body = error_body(anthropic, *err);
          out = http_head(err->http_status,
                          version,
                          o->keep_alive,
                          "application/json",
                          static_cast<int64_t>(body.size()),
                          {});
          out += body;
        } else {
          enc.keep_best(s.finished);
          std::string body = enc.response_json(finished->usage);
          o->status = 200;
          out = http_head(200,
                          version,
                          o->keep_alive,
                          "application/json",
                          static_cast<int64_t>(body.size()),
                          {});
          out += body;
        }
      }
    }
    if (!out.empty()) {
      if (co_await is_cancelled())
        co_return;
      if (!co_await write(c, std::move(out))) {
        DSI_LOG_DEBUG("write failed");
        o->write_failed = true;
        co_return;
      }
    }
    if (finished) {
      o->completion = *finished;
      co_return;
    }
    // pending(): results that arrived while we were writing (their wake-up may have run then).
    if (!chan.pending()) {
      if (co_await is_cancelled())
        co_return;
      co_await chan.wait();
    }
    if (co_await is_cancelled())
      co_return;
  }
}

net::awaitable<void> Server::Impl::watch_peer(Conn& c, Outcome* o) {
  co_await net::this_coro::throw_if_cancelled(false);
  for (;;) {
    if (c.buf.size() >= kPipelineLimit) {
      // A client pipelining that much: stop reading (and watching) until the response is done.
      net::steady_timer park(co_await net::this_coro::executor);
      park.expires_at(net::steady_timer::time_point::max());
      co_await park.async_wait(kTuple);
      co_return;
    }
    if (co_await is_cancelled())
      co_return;
    auto [ec, n] = co_await c.sock.async_read_some(c.buf.prepare(64 * 1024), kTuple);
    if (n > 0)
      c.buf.commit(n);
    if (!ec)
      continue;  // pipelined bytes: kept for the next request
    if (ec == net::error::operation_aborted && co_await is_cancelled())
      co_return;  // the response finished first
    DSI_LOG_DEBUG("peer gone: %s", ec.message().c_str());
    o->peer_gone = true;
    co_return;
  }
}

// ---------------------------------------------------------------------------------------------

Server::Server(ServerOptions options, ServingContext ctx, EngineLoop* loop, Metrics* metrics)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(ctx), loop, metrics)) {}

Server::~Server() = default;

Status Server::listen() {
  return impl_->listen();
}

uint16_t Server::port() const {
  return impl_->bound_port;
}

void Server::run(bool handle_signals) {
  impl_->run(handle_signals);
}

void Server::shutdown() {
  Impl* impl = impl_.get();
  net::post(impl->control, [impl] { impl->begin_shutdown(); });
}

}  // namespace dsinfer::server
