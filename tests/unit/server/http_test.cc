// The HTTP server in-process on a loopback port: routing, auth, size limits, streaming and
// non-streaming exchanges, 429 on a full queue, disconnects freeing state, keep-alive and
// pipelining, and the graceful shutdown (drain, then abort after the grace period).
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "http_test_server.h"
#include "server/engine_loop.h"
#include "server/generation.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "server/server.h"
#include "server_test_util.h"

namespace dsinfer::server {
namespace {

using nlohmann::json;
using namespace testing;  // NOLINT

// Content of a Chat Completions SSE body.
std::string chat_stream_content(const std::string& sse) {
  std::string content;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const std::string data = sse.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]")
      break;
    json j = json::parse(data);
    if (j.contains("choices") && j["choices"][0]["delta"].contains("content") &&
        j["choices"][0]["delta"]["content"].is_string()) {
      content += j["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  return content;
}

TEST(ServerHttp, RoutingHealthModelsMetrics) {
  TestServer s;
  EXPECT_EQ(body_of(roundtrip(s.port, "GET", "/health")), R"({"status":"ok"})");
  json models = json::parse(body_of(roundtrip(s.port, "GET", "/v1/models")));
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(status_of(roundtrip(s.port, "GET", "/v1/models/tiny")), 200);
  EXPECT_EQ(status_of(roundtrip(s.port, "GET", "/v1/models/other")), 404);
  std::string nf = roundtrip(s.port, "GET", "/nope");
  EXPECT_EQ(status_of(nf), 404);
  EXPECT_TRUE(json::parse(body_of(nf)).contains("error"));
  std::string anf = roundtrip(s.port, "GET", "/anthropic/v1/nope");
  EXPECT_EQ(json::parse(body_of(anf))["type"], "error");
  std::string m405 = roundtrip(s.port, "GET", "/v1/chat/completions");
  EXPECT_EQ(status_of(m405), 405);
  EXPECT_NE(m405.find("Allow: POST"), std::string::npos);
  std::string metrics = body_of(roundtrip(s.port, "GET", "/metrics"));
  EXPECT_NE(metrics.find("dsinfer_requests_total{endpoint=\"/health\",status=\"200\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("dsinfer_state_memory_used_bytes 0"), std::string::npos);
}

TEST(ServerHttp, ChatStreamingAndNot) {
  TestServer s;
  std::string r = roundtrip(s.port, "POST", "/v1/chat/completions", chat_body("[[hello]]", false));
  ASSERT_EQ(status_of(r), 200) << r;
  json body = json::parse(body_of(r));
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello, world!");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_GT(body["usage"]["completion_tokens"].get<int>(), 0);

  std::string st = roundtrip(s.port, "POST", "/v1/chat/completions", chat_body("[[hello]]", true));
  ASSERT_EQ(status_of(st), 200) << st;
  EXPECT_NE(st.find("Content-Type: text/event-stream"), std::string::npos);
  EXPECT_NE(st.find("Transfer-Encoding: chunked"), std::string::npos);
  const std::string sse = dechunk(st);
  EXPECT_EQ(chat_stream_content(sse), "Hello, world!");
  EXPECT_EQ(sse.substr(sse.size() - 14), "data: [DONE]\n\n");

  // Anthropic alias and Responses.
  json mb = {{"model", "claude-sonnet"},
             {"max_tokens", 50},
             {"messages", {{{"role", "user"}, {"content", "[[hello]]"}}}},
             {"thinking", {{"type", "disabled"}}}};
  std::string a = roundtrip(s.port, "POST", "/anthropic/v1/messages", mb.dump());
  ASSERT_EQ(status_of(a), 200) << a;
  EXPECT_EQ(json::parse(body_of(a))["content"][0]["text"], "Hello, world!");
  json rb = {{"model", "tiny"}, {"input", "[[hello]]"}, {"reasoning", {{"effort", "none"}}}};
  std::string rr = roundtrip(s.port, "POST", "/v1/responses", rb.dump());
  ASSERT_EQ(status_of(rr), 200) << rr;
  EXPECT_EQ(json::parse(body_of(rr))["status"], "completed");
}

TEST(ServerHttp, BadRequestsGetProtocolErrors) {
  TestServer s;
  std::string r = roundtrip(s.port, "POST", "/v1/chat/completions", "{oops");
  EXPECT_EQ(status_of(r), 400);
  EXPECT_EQ(json::parse(body_of(r))["error"]["type"], "invalid_request_error");
  std::string a = roundtrip(s.port, "POST", "/v1/messages", R"({"model":"tiny"})");
  EXPECT_EQ(status_of(a), 400);
  EXPECT_EQ(json::parse(body_of(a))["type"], "error");
  // Malformed HTTP.
  int fd = connect_to(s.port);
  send_all(fd, "GARBAGE\r\n\r\n");
  EXPECT_EQ(status_of(read_response(fd)), 400);
  ::close(fd);
  // Expect: 100-continue.
  fd = connect_to(s.port);
  const std::string body = chat_body("[[hello]]", false);
  send_all(fd,
           "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
           "Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n");
  std::string cont = read_response(fd, "\r\n\r\n");
  EXPECT_EQ(cont.rfind("HTTP/1.1 100 Continue", 0), 0u) << cont;
  send_all(fd, body);
  std::string rest = read_response(fd);
  EXPECT_EQ(status_of(rest), 200) << rest;
  ::close(fd);
}

TEST(ServerHttp, BodySizeLimit) {
  Config c;
  c.max_body = 2048;
  TestServer s(c);
  // Declared too large: refused before the body is read.
  int fd = connect_to(s.port);
  send_all(fd,
           "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Content-Length: 100000000\r\n\r\n");
  std::string r = read_response(fd);
  ::close(fd);
  EXPECT_EQ(status_of(r), 413) << r;
  EXPECT_EQ(json::parse(body_of(r))["error"]["type"], "request_too_large");
  // Chunked body that grows past the limit.
  fd = connect_to(s.port);
  std::string big(4096, 'x');
  send_all(fd,
           "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           "1000\r\n" +
               big + "\r\n0\r\n\r\n");
  r = read_response(fd);
  ::close(fd);
  EXPECT_EQ(status_of(r), 413) << r;
  EXPECT_EQ(s.metrics.requests("/v1/chat/completions", 413), 1);
}

TEST(ServerHttp, ApiKey) {
  Config c;
  c.api_key = "sekret";
  TestServer s(c);
  EXPECT_EQ(status_of(roundtrip(s.port, "GET", "/health")), 200);
  std::string r = roundtrip(s.port, "GET", "/v1/models");
  EXPECT_EQ(status_of(r), 401);
  EXPECT_EQ(json::parse(body_of(r))["error"]["code"], "invalid_api_key");
  std::string a = roundtrip(s.port, "POST", "/v1/messages", "{}", "x-api-key: wrong\r\n");
  EXPECT_EQ(status_of(a), 401);
  EXPECT_EQ(json::parse(body_of(a))["error"]["type"], "authentication_error");
  EXPECT_EQ(
      status_of(roundtrip(s.port, "GET", "/v1/models", "", "Authorization: Bearer sekret\r\n")),
      200);
  EXPECT_EQ(status_of(roundtrip(s.port, "GET", "/metrics", "", "x-api-key: sekret\r\n")), 200);
  EXPECT_EQ(status_of(roundtrip(s.port, "GET", "/metrics", "", "Authorization: Bearer sekre\r\n")),
            401);
}

TEST(ServerHttp, FullQueueAnswers429WithRetryAfter) {
  Config c;
  c.max_running = 1;
  c.capacity = 1;
  c.step_delay_s = 0.005;
  TestServer s(c);
  int fd = connect_to(s.port);
  send_all(fd, http_request("POST", "/v1/chat/completions", chat_body("[[long]]", true)));
  std::string first = read_response(fd, "data: ");
  ASSERT_EQ(status_of(first), 200);
  std::string r = roundtrip(s.port, "POST", "/v1/chat/completions", chat_body("[[hello]]", false));
  EXPECT_EQ(status_of(r), 429) << r;
  EXPECT_NE(r.find("Retry-After: 1"), std::string::npos);
  std::string m =
      roundtrip(s.port,
                "POST",
                "/v1/messages",
                R"({"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(status_of(m), 429);
  EXPECT_EQ(json::parse(body_of(m))["error"]["type"], "rate_limit_error");
  ::close(fd);  // disconnect: the slot comes back
  EXPECT_TRUE(eventually(
      [&] { return s.metrics.aborts("disconnect") == 1 && s.metrics.gauges().in_flight == 0; }));
  EXPECT_EQ(
      status_of(roundtrip(s.port, "POST", "/v1/chat/completions", chat_body("[[hello]]", false))),
      200);
}

TEST(ServerHttp, DisconnectMidStreamFreesState) {
  Config c;
  c.step_delay_s = 0.005;
  TestServer s(c);
  int fd = connect_to(s.port);
  send_all(fd, http_request("POST", "/v1/chat/completions", chat_body("[[long]]", true)));
  std::string part = read_response(fd, "reasoning_content");
  ASSERT_EQ(status_of(part), 200);
  EXPECT_TRUE(eventually([&] { return s.metrics.gauges().state_used_bytes > 0; }));
  ::close(fd);
  EXPECT_TRUE(eventually([&] {
    auto g = s.metrics.gauges();
    return g.state_used_bytes == 0 && g.running == 0 && g.in_flight == 0;
  }));
  EXPECT_EQ(s.metrics.aborts("disconnect"), 1);
  EXPECT_TRUE(eventually([&] { return s.metrics.requests("/v1/chat/completions", 499) == 1; }));
}

TEST(ServerHttp, DisconnectWhileQueuedIsNoticedWithoutWrites) {
  Config c;
  c.max_running = 1;
  c.step_delay_s = 0.005;
  TestServer s(c);
  int running = connect_to(s.port);
  send_all(running, http_request("POST", "/v1/chat/completions", chat_body("[[long]]", true)));
  ASSERT_EQ(status_of(read_response(running, "data: ")), 200);
  int queued = connect_to(s.port);
  send_all(queued, http_request("POST", "/v1/chat/completions", chat_body("[[long]]", false)));
  EXPECT_TRUE(eventually([&] { return s.metrics.gauges().in_flight == 2; }));
  ::close(queued);
  EXPECT_TRUE(eventually(
      [&] { return s.metrics.aborts("disconnect") == 1 && s.metrics.gauges().in_flight == 1; }));
  ::close(running);
  EXPECT_TRUE(eventually([&] { return s.metrics.gauges().in_flight == 0; }));
}

TEST(ServerHttp, KeepAliveAndPipelining) {
  TestServer s;
  int fd = connect_to(s.port);
  const std::string body = chat_body("[[hello]]", true);
  std::string two =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body +
      "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  send_all(fd, two);
  std::string all = read_response(fd);
  ::close(fd);
  EXPECT_NE(all.find("data: [DONE]"), std::string::npos) << all;
  EXPECT_NE(all.find(R"({"status":"ok"})"), std::string::npos) << all;
}

TEST(ServerHttp, GracefulShutdownLetsInFlightRequestsFinish) {
  Config c;
  c.step_delay_s = 0.004;
  TestServer s(c);
  int fd = connect_to(s.port);
  send_all(fd, http_request("POST", "/v1/chat/completions", chat_body("[[medium]]", true)));
  ASSERT_EQ(status_of(read_response(fd, "data: ")), 200);
  s.begin_shutdown();
  EXPECT_TRUE(eventually([&] { return connect_to(s.port) < 0; }));  // no longer accepting
  std::string rest = read_response(fd);
  ::close(fd);
  EXPECT_NE(rest.find("\"finish_reason\":\"stop\""), std::string::npos) << rest;
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos);
  EXPECT_TRUE(s.wait_stopped(10));
  EXPECT_EQ(s.metrics.aborts("shutdown"), 0);
}

TEST(ServerHttp, ShutdownAbortsWhatOutlivesTheGracePeriod) {
  Config c;
  c.step_delay_s = 0.005;
  c.grace_s = 0.2;
  TestServer s(c);
  int fd = connect_to(s.port);
  send_all(fd, http_request("POST", "/v1/chat/completions", chat_body("[[long]]", true)));
  ASSERT_EQ(status_of(read_response(fd, "data: ")), 200);
  s.begin_shutdown();
  std::string rest = read_response(fd);
  ::close(fd);
  EXPECT_NE(rest.find("shutting down"), std::string::npos) << rest.substr(0, 400);
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos);
  EXPECT_TRUE(s.wait_stopped(10));
  EXPECT_EQ(s.metrics.aborts("shutdown"), 1);
}

}  // namespace
}  // namespace dsinfer::server
