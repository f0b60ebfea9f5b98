// The server's engine loop over a DeepSeek V4.1 engine (CPU): concurrent requests from other
// threads each get the completion the V4.1 forward gives alone (token count and finish), and an
// image placeholder id is rejected with the engine's clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/cpu_v41/backend.h"
#include "engine/engine.h"
#include "server/engine_loop.h"
#include "server/metrics.h"

namespace dsinfer::server {
namespace {

const std::string kTiny = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/v41-tiny/official";

class Sink : public RequestSink {
 public:
  void on_accepted(int64_t n) override {
    std::lock_guard<std::mutex> l(mu);
    prompt_tokens = n;
  }
  void on_rejected(const Status& s) override {
    std::lock_guard<std::mutex> l(mu);
    rejected = true;
    rejection = s;
    cv.notify_all();
  }
  void on_events(std::vector<recipe::OutputEvent>) override {}
  void on_finished(const Completion& c) override {
    std::lock_guard<std::mutex> l(mu);
    finished = true;
    completion = c;
    cv.notify_all();
  }
  bool wait() {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(60), [&] { return finished || rejected; });
  }
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false, rejected = false;
  Status rejection;
  int64_t prompt_tokens = 0;
  Completion completion;
};

// Greedy tokens of the forward alone, up to and including EOS.
int64_t alone_count(const cpu_v41::V41CpuModel& m, std::vector<int32_t> ids, int64_t max_tokens) {
  cpu_v41::V41SequenceState st = cpu_v41::make_v41_state(m.config());
  for (int64_t k = 0; k < max_tokens; ++k) {
    std::vector<float> logits;
    EXPECT_TRUE(m.forward(st, ids, &logits).ok());
    const float* row = logits.data() + logits.size() - static_cast<size_t>(m.config().vocab_size);
    const int32_t t =
        static_cast<int32_t>(std::max_element(row, row + m.config().vocab_size) - row);
    if (t == m.config().eos_token_id)
      return k + 1;
    ids = {t};
  }
  return max_tokens;
}

TEST(V41EngineLoop, ConcurrentRequestsAndARejectedPlaceholder) {
  auto tok = tokenizer::Tokenizer::load(std::string(DSI_SOURCE_DIR) +
                                        "/tests/fixtures/tokenizer/tiny/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  engine::EngineConfig cfg;
  cfg.model_dir = kTiny;
  cfg.state_budget_bytes = int64_t{32} << 20;
  cfg.scheduler.prefill_chunk = 8;
  auto e = engine::Engine::create(cfg);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  auto alone_model = cpu_v41::V41Backend::open(kTiny, {});
  ASSERT_TRUE(alone_model.ok());
  Metrics metrics;
  EngineLoop loop(std::move(e).value(), **tok, &metrics, 16);
  loop.start();
  std::vector<std::shared_ptr<Sink>> sinks;
  std::vector<int64_t> want;
  for (int i = 0; i < 6; ++i) {
    Job j;
    for (int k = 0; k < 5 + 4 * i; ++k) j.spec.prompt.push_back(3 + (k * 13 + i) % 90);
    j.spec.max_tokens = 6;
    j.spec.sampling.temperature = 0.0f;
    j.parser.start = recipe::ParseStart::kContentStart;
    want.push_back(alone_count((*alone_model)->v41(), j.spec.prompt, 6));
    auto sink = std::make_shared<Sink>();
    ASSERT_TRUE(loop.try_admit());
    loop.submit(std::move(j), sink);
    sinks.push_back(sink);
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    ASSERT_TRUE(sinks[i]->wait()) << i;
    ASSERT_FALSE(sinks[i]->rejected) << sinks[i]->rejection.to_string();
    EXPECT_EQ(sinks[i]->completion.cause, EndCause::kNone) << sinks[i]->completion.error;
    EXPECT_EQ(sinks[i]->prompt_tokens, static_cast<int64_t>(5 + 4 * i));
    EXPECT_EQ(sinks[i]->completion.usage.completion_tokens, want[i]) << i;
  }
  Job bad;
  bad.spec.prompt = {0, 5, 100};  // a V4.1 multimodal placeholder id
  bad.spec.max_tokens = 2;
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE(loop.try_admit());
  loop.submit(std::move(bad), sink);
  ASSERT_TRUE(sink->wait());
  EXPECT_TRUE(sink->rejected);
  EXPECT_NE(sink->rejection.message().find("multimodal placeholder"), std::string::npos)
      << sink->rejection.to_string();
  loop.stop();
}

}  // namespace
}  // namespace dsinfer::server
