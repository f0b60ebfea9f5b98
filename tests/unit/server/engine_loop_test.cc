// EngineLoop over a real Engine on the fixture model: concurrent requests each get their own
// output, aborts free sequence state at once, deadlines, bounded admission, engine-side
// rejection and shutdown.
#include "server/engine_loop.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "server/metrics.h"
#include "server_test_util.h"

namespace dsinfer::server {
namespace {

using testing::RecordingSink;
using testing::script_ids;
using testing::tok;

std::vector<int32_t> prompt_ids(const std::string& text) {
  return tok().encode(text, /*allow_special=*/false).value();
}

// ~2000 tokens of varied text (a run of one letter would be a handful of merged tokens).
std::string long_text() {
  std::string s;
  for (int i = 0; i < 800; ++i) s += "w" + std::to_string(i) + " ";
  return s;
}

Job content_job(const std::string& prompt, int64_t max_tokens, std::vector<int32_t> script = {}) {
  Job j;
  j.spec.prompt = prompt_ids(prompt);
  j.spec.max_tokens = max_tokens;
  j.spec.sampling.temperature = 0.0f;
  j.parser.start = recipe::ParseStart::kContentStart;
  j.script = std::move(script);
  return j;
}

struct LoopFixture {
  explicit LoopFixture(int64_t capacity = 1000, double step_delay_s = 0, int64_t max_running = 64)
      : loop(testing::make_engine(max_running), tok(), &metrics, capacity, step_delay_s) {
    loop.start();
  }
  std::shared_ptr<RecordingSink> submit(Job job) {
    auto sink = std::make_shared<RecordingSink>();
    EXPECT_TRUE(loop.try_admit());
    last_ticket = loop.submit(std::move(job), sink);
    return sink;
  }
  Metrics metrics;
  EngineLoop loop;
  uint64_t last_ticket = 0;
};

TEST(EngineLoop, ConcurrentRequestsEachGetTheirOwnOutput) {
  LoopFixture f;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 48; ++i) {
    const std::string text = "reply number " + std::to_string(i) + " é";
    sinks.push_back(f.submit(content_job("prompt " + std::to_string(i), 200, script_ids(text))));
  }
  for (int i = 0; i < 48; ++i) {
    ASSERT_TRUE(sinks[i]->wait_finished()) << i;
    EXPECT_TRUE(sinks[i]->accepted);
    EXPECT_EQ(sinks[i]->message().content, "reply number " + std::to_string(i) + " é");
    EXPECT_EQ(sinks[i]->completion.cause, EndCause::kNone);
    EXPECT_EQ(sinks[i]->completion.finish, recipe::FinishReason::kStop);
    EXPECT_EQ(sinks[i]->completion.usage.prompt_tokens, sinks[i]->prompt_tokens);
    EXPECT_EQ(sinks[i]->completion.usage.completion_tokens,
              static_cast<int64_t>(script_ids("reply number " + std::to_string(i) + " é").size()));
    EXPECT_GE(sinks[i]->completion.ttft_s, 0.0);
  }
  EXPECT_TRUE(testing::eventually([&] { return f.loop.in_flight() == 0; }));
  EXPECT_TRUE(testing::eventually([&] { return f.metrics.gauges().in_flight == 0; }));
  EXPECT_EQ(f.metrics.gauges().state_used_bytes, 0);
  EXPECT_EQ(f.metrics.gauges().running, 0);
}

TEST(EngineLoop, PrefixCacheReportsCachedTokensAndMetrics) {
  kvstore::KvStoreOptions o;
  o.host_bytes = int64_t{64} << 20;
  auto store = kvstore::KvStore::open(o);
  ASSERT_TRUE(store.ok());
  Metrics metrics;
  EngineLoop loop(testing::make_engine(64, std::move(store).value()), tok(), &metrics, 100);
  loop.start();
  auto run = [&] {
    Job j = content_job("You are a helpful assistant. " + long_text().substr(0, 300), 4);
    j.spec.ignore_eos = true;
    auto sink = std::make_shared<RecordingSink>();
    EXPECT_TRUE(loop.try_admit());
    loop.submit(std::move(j), sink);
    EXPECT_TRUE(sink->wait_finished());
    return sink;
  };
  auto first = run();
  EXPECT_EQ(first->completion.usage.cached_prompt_tokens, 0);
  auto second = run();
  EXPECT_EQ(second->completion.usage.cached_prompt_tokens,
            second->completion.usage.prompt_tokens - 1);
  EXPECT_EQ(second->message().content, first->message().content);
  EXPECT_TRUE(testing::eventually([&] {
    return metrics.render().find("dsinfer_prefix_cache_hits_total{tier=\"host\"} 1\n") !=
           std::string::npos;
  })) << metrics.render();
  const std::string m = metrics.render();
  EXPECT_NE(m.find("dsinfer_prefix_cache_hit_rate{tier=\"host\"} 0.5"), std::string::npos) << m;
  EXPECT_NE(m.find("dsinfer_kv_store_bytes{tier=\"host\",class=\"chat\"} "), std::string::npos);
  EXPECT_NE(m.find("dsinfer_kv_store_expirations_total 0\n"), std::string::npos);
  // The CPU backend captures synchronously: no background captures, none pending.
  EXPECT_NE(m.find("dsinfer_prefix_cache_async_captures_total 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("dsinfer_prefix_cache_captures_pending 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("dsinfer_prefix_cache_store_failures_total 0\n"), std::string::npos) << m;
  EXPECT_GT(metrics.gauges().cache_units_stored, 0);
  EXPECT_EQ(metrics.gauges().cache_captures_pending, 0);
  loop.stop();
}

TEST(EngineLoop, ModelOutputRunsToLength) {
  LoopFixture f;
  Job j = content_job("Hello there", 12);
  j.spec.ignore_eos = true;
  auto sink = f.submit(std::move(j));
  ASSERT_TRUE(sink->wait_finished());
  EXPECT_EQ(sink->completion.usage.completion_tokens, 12);
  EXPECT_EQ(sink->completion.finish, recipe::FinishReason::kLength);
  const std::string metrics = f.metrics.render();
  EXPECT_NE(metrics.find("dsinfer_generation_tokens_total 12\n"), std::string::npos) << metrics;
  // The engine's step phases were timed; the device's timing is the CUDA backend's alone.
  EXPECT_TRUE(testing::eventually([&] { return f.metrics.gauges().step_phase_s[3] > 0; }));
  EXPECT_NE(metrics.find("dsinfer_engine_step_phase_seconds_total{phase=\"forward\"} "),
            std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("dsinfer_gpu_decode_busy_seconds_total"), std::string::npos) << metrics;
}

TEST(EngineLoop, AbortFreesStateAtOnce) {
  LoopFixture f(1000, /*step_delay_s=*/0.01);
  auto sink = f.submit(content_job("long", 3000, script_ids(long_text())));
  const uint64_t ticket = f.last_ticket;
  ASSERT_TRUE(sink->wait_events(3));
  EXPECT_TRUE(testing::eventually([&] { return f.metrics.gauges().state_used_bytes > 0; }));
  f.loop.abort(ticket, EndCause::kDisconnect);
  ASSERT_TRUE(sink->wait_finished());
  EXPECT_EQ(sink->completion.cause, EndCause::kDisconnect);
  EXPECT_EQ(sink->completion.finish, recipe::FinishReason::kAborted);
  EXPECT_LT(sink->completion.usage.completion_tokens, 1000);
  EXPECT_TRUE(testing::eventually([&] {
    auto g = f.metrics.gauges();
    return g.state_used_bytes == 0 && g.running == 0 && g.in_flight == 0;
  }));
  EXPECT_EQ(f.metrics.aborts("disconnect"), 1);
  f.loop.abort(ticket, EndCause::kDisconnect);  // unknown ticket now: a no-op
}

TEST(EngineLoop, DeadlineAbortsWithTimeout) {
  LoopFixture f(1000, /*step_delay_s=*/0.01);
  Job j = content_job("slow", 3000, script_ids(long_text()));
  j.timeout_s = 0.1;
  auto sink = f.submit(std::move(j));
  ASSERT_TRUE(sink->wait_finished());
  EXPECT_EQ(sink->completion.cause, EndCause::kTimeout);
  EXPECT_EQ(f.metrics.aborts("timeout"), 1);
  EXPECT_TRUE(testing::eventually([&] { return f.metrics.gauges().state_used_bytes == 0; }));
}

TEST(EngineLoop, AdmissionIsBounded) {
  Metrics m;
  EngineLoop loop(testing::make_engine(), tok(), &m, /*capacity=*/2);
  EXPECT_TRUE(loop.try_admit());
  EXPECT_TRUE(loop.try_admit());
  EXPECT_FALSE(loop.try_admit());
  loop.cancel_admission();
  EXPECT_TRUE(loop.try_admit());
  EXPECT_EQ(loop.in_flight(), 2);
  loop.cancel_admission();
  loop.cancel_admission();
}

TEST(EngineLoop, EngineRejectionReturnsTheSlot) {
  LoopFixture f(1);
  Job j = content_job("x", 100000);  // beyond the context
  auto sink = f.submit(std::move(j));
  ASSERT_TRUE(sink->wait_finished());
  EXPECT_TRUE(sink->rejected);
  EXPECT_FALSE(sink->accepted);
  EXPECT_EQ(sink->rejection.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(sink->rejection.message().find("context"), std::string::npos)
      << sink->rejection.message();
  EXPECT_TRUE(testing::eventually([&] { return f.loop.in_flight() == 0; }));
  EXPECT_TRUE(f.loop.try_admit());
  f.loop.cancel_admission();
}

TEST(EngineLoop, AbortAllAndStopEndEveryRequest) {
  LoopFixture f(1000, /*step_delay_s=*/0.005, /*max_running=*/2);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 5; ++i) {
    sinks.push_back(f.submit(content_job("p" + std::to_string(i), 3000, script_ids(long_text()))));
  }
  ASSERT_TRUE(sinks[0]->wait_events(2));
  f.loop.abort_all(EndCause::kShutdown);
  for (auto& s : sinks) {
    ASSERT_TRUE(s->wait_finished());
    EXPECT_EQ(s->completion.cause, EndCause::kShutdown);
  }
  // Requests submitted after stop() are rejected at once.
  f.loop.stop();
  auto late = std::make_shared<RecordingSink>();
  ASSERT_TRUE(f.loop.try_admit());
  f.loop.submit(content_job("late", 4), late);
  EXPECT_TRUE(late->rejected);
  EXPECT_EQ(f.loop.in_flight(), 0);
}

TEST(EngineLoop, StopAbortsWhatIsLeft) {
  auto metrics = std::make_unique<Metrics>();
  auto loop = std::make_unique<EngineLoop>(testing::make_engine(), tok(), metrics.get(), 10, 0.005);
  loop->start();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(loop->try_admit());
  loop->submit(content_job("p", 3000, script_ids(long_text())), sink);
  ASSERT_TRUE(sink->wait_events(1));
  loop->stop();
  ASSERT_TRUE(sink->finished);
  EXPECT_EQ(sink->completion.cause, EndCause::kShutdown);
}

}  // namespace
}  // namespace dsinfer::server
