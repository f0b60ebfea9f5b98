// Helpers for the server unit tests: the fixture model (written once per test process), an
// engine over it, a RequestSink that records what the engine loop delivers, and a tiny
// blocking HTTP client over POSIX sockets.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "recipe/output_parser.h"
#include "server/engine_loop.h"
#include "test_model.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::server::testing {

// Removes the model directory when the test process exits.
struct TempDir {
  std::string path;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// The model directory (created on first use under $TMPDIR, removed at exit).
inline const std::string& model_dir() {
  static const TempDir dir{[] {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/dsinfer-server-test-XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    const char* d = mkdtemp(buf.data());
    if (d == nullptr)
      std::abort();
    Status s = write_server_test_model(d);
    if (!s.ok()) {
      std::fprintf(stderr, "test model: %s\n", s.to_string().c_str());
      std::abort();
    }
    return std::string(d);
  }()};
  return dir.path;
}

inline const tokenizer::Tokenizer& tok() {
  static std::unique_ptr<tokenizer::Tokenizer> t = [] {
    auto r = tokenizer::Tokenizer::load(model_dir() + "/tokenizer.json");
    if (!r.ok())
      std::abort();
    return std::move(r).value();
  }();
  return *t;
}

inline int32_t eos_id() {
  return *tok().token_to_id("<｜end▁of▁sentence｜>");
}

inline std::unique_ptr<engine::Engine> make_engine(
    int64_t max_running = 64, std::shared_ptr<kvstore::KvStore> kv_store = nullptr) {
  engine::EngineConfig ec;
  ec.model_dir = model_dir();
  ec.state_budget_bytes = int64_t{256} << 20;
  ec.scheduler.max_running = max_running;
  ec.prefix_cache.store = std::move(kv_store);
  auto e = engine::Engine::create(ec);
  if (!e.ok()) {
    std::fprintf(stderr, "engine: %s\n", e.status().to_string().c_str());
    std::abort();
  }
  return std::move(e).value();
}

// Text -> ids with special tokens (the script of a scripted request), EOS appended.
inline std::vector<int32_t> script_ids(const std::string& text) {
  auto ids = tok().encode(text, /*allow_special=*/true);
  std::vector<int32_t> out = std::move(ids).value();
  out.push_back(eos_id());
  return out;
}

// Records everything the loop delivers; wait_finished() blocks until on_finished/on_rejected.
class RecordingSink : public RequestSink {
 public:
  void on_accepted(int64_t prompt_tokens) override {
    std::lock_guard<std::mutex> l(mu);
    accepted = true;
    this->prompt_tokens = prompt_tokens;
    cv.notify_all();
  }
  void on_rejected(const Status& s) override {
    std::lock_guard<std::mutex> l(mu);
    rejected = true;
    rejection = s;
    cv.notify_all();
  }
  void on_events(std::vector<recipe::OutputEvent> evs) override {
    std::lock_guard<std::mutex> l(mu);
    for (auto& e : evs) events.push_back(std::move(e));
    cv.notify_all();
  }
  void on_finished(const Completion& c) override {
    std::lock_guard<std::mutex> l(mu);
    finished = true;
    completion = c;
    cv.notify_all();
  }
  bool wait_finished(double timeout_s = 30) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(
        l, std::chrono::duration<double>(timeout_s), [&] { return finished || rejected; });
  }
  bool wait_events(size_t n, double timeout_s = 30) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::duration<double>(timeout_s), [&] {
      return events.size() >= n || finished || rejected;
    });
  }
  recipe::ParsedMessage message() {
    std::lock_guard<std::mutex> l(mu);
    return recipe::aggregate_events(events);
  }

  std::mutex mu;
  std::condition_variable cv;
  bool accepted = false;
  bool rejected = false;
  bool finished = false;
  int64_t prompt_tokens = 0;
  Status rejection;
  std::vector<recipe::OutputEvent> events;
  Completion completion;
};

// Polls `pred` until true or the timeout.
inline bool eventually(const std::function<bool()>& pred, double timeout_s = 10) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (pred())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// A connected loopback socket (-1 on failure).
inline int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0)
      return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until EOF (or until `until` appears when non-empty).
inline std::string read_response(int fd, const std::string& until = "") {
  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0)
      break;
    out.append(buf, static_cast<size_t>(n));
    if (!until.empty() && out.find(until) != std::string::npos)
      break;
  }
  return out;
}

inline std::string http_request(const std::string& method,
                                const std::string& path,
                                const std::string& body,
                                const std::string& extra_headers = "") {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty() || method == "POST") {
    r +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  r += extra_headers;
  r += "\r\n";
  r += body;
  return r;
}

// One request on a fresh connection; the whole response (the server closes it).
inline std::string roundtrip(uint16_t port,
                             const std::string& method,
                             const std::string& path,
                             const std::string& body = "",
                             const std::string& extra_headers = "") {
  int fd = connect_to(port);
  if (fd < 0)
    return "";
  send_all(fd, http_request(method, path, body, extra_headers));
  std::string out = read_response(fd);
  ::close(fd);
  return out;
}

inline int status_of(const std::string& response) {
  if (response.size() < 12)
    return 0;
  return std::atoi(response.substr(9, 3).c_str());
}

inline std::string body_of(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

}  // namespace dsinfer::server::testing
