// Asynchronous scheduling (EngineConfig::async_scheduling): a step of plain decodes sampled in
// the backend returns before its picks are known (ForwardOutputs::deferred), the engine plans and
// launches the next step with each request's token taken "on the device"
// (ForwardOptions::device_token) and reads the picks one step later. The backend here is the CPU
// reference behind that protocol: it samples on the host, holds each deferred pick back until its
// next call (the output poisoned meanwhile), substitutes device tokens from its own picks and
// counts every breach of the protocol. Every output must equal the synchronous engine's: stops,
// preemption, mixed steps, settings that cannot be deferred (penalties, masks, top_logprobs),
// shared-prompt choices, speculation and aborts.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "kvstore/store.h"
#include "model/checkpoint.h"
#include "spec/config.h"
#include "spec/drafter.h"
#include "spec/measure.h"
#include "unit/engine/engine_test_util.h"

namespace dsinfer::engine {
namespace {

std::shared_ptr<const model::Checkpoint> fixture() {
  return test_support::tiny_fixture();
}

constexpr int32_t kPoison = -777;

class DeferringModel final : public test_support::CpuBackedModel {
 public:
  using CpuBackedModel::CpuBackedModel;

  Status forward_batch(std::span<backend::ForwardItem> items) override {
    // The picks the previous call left on the device: what device tokens may take.
    std::map<const state::SequenceState*, int32_t> on_device;
    on_device.swap(picks_);
    std::vector<Held> held;
    held.swap(held_);
    bool defer = !items.empty();
    bool any_pick = false;
    for (backend::ForwardItem& it : items) {
      if (it.out) {
        it.out->sampled = false;
        it.out->deferred = false;
      }
      std::vector<int32_t> tokens(it.tokens.begin(), it.tokens.end());
      if (it.options.device_token) {
        auto d = on_device.find(it.state);
        if (d == on_device.end() || tokens.empty()) {
          ADD_FAILURE() << "a device token of sequence " << it.state->id()
                        << " without a deferred pick";
          ++protocol_errors;
          it.status = invalid_argument("a device token without a deferred pick");
          defer = false;
          continue;
        }
        tokens[0] = d->second;
        ++device_tokens;
      }
      it.status = cpu_.forward(*it.state, tokens, it.options, it.out);
      const backend::SampleRequest* q = it.options.sample;
      // As CudaModel: every item allows it and samples, or wants nothing back (a prompt chunk
      // before the prompt's end); at least one pick.
      const bool picks = q && it.out;
      const bool nothing = !q && !(it.out && it.options.want_logits);
      defer = defer && it.status.ok() && it.options.may_defer && (picks || nothing);
      any_pick = any_pick || picks;
      if (!it.status.ok() || !q || !it.out)
        continue;
      EXPECT_TRUE(it.options.sample_rows.empty());
      it.out->sample = sampling::sample(
          it.out->logits, *q->config, *q->penalties, q->step, scratch_, q->allowed);
      it.out->sampled = true;
      it.out->logits.clear();
      if (it.options.may_defer && (!q->allowed.empty() || sampling::uses_penalties(*q->config))) {
        ADD_FAILURE() << "may_defer with a mask or penalties";
        ++protocol_errors;
      }  // the engine must not defer what the next step needs on the host
    }
    if (defer && any_pick) {
      // Held back until the next call: the outputs poisoned meanwhile.
      bool prompt_chunk = false;
      for (backend::ForwardItem& it : items) {
        prompt_chunk = prompt_chunk || !it.options.sample || it.tokens.size() > 1;
        if (!it.options.sample)
          continue;
        if (it.tokens.size() > 1)
          ++deferred_first_tokens;  // (a prompt's last chunk: decodes are one token)
        held_.push_back({it.out, it.out->sample});
        picks_[it.state] = it.out->sample.token;
        it.out->deferred = true;
        it.out->sampled = false;
        it.out->sample.token = kPoison;
      }
      ++deferred_calls;
      deferred_with_prompt_chunks += prompt_chunk ? 1 : 0;
    }
    deliver(held);
    return Status();
  }
  Status complete_deferred_samples() override {
    std::vector<Held> held;
    held.swap(held_);
    completions += held.empty() ? 0 : 1;
    deliver(held);
    return Status();
  }
  bool can_sample() const override { return true; }
  bool can_defer_samples() const override { return true; }
  bool can_draft() const override { return cpu_.can_draft(); }
  Status mtp_draft_batch(std::span<backend::DraftItem> items) override {
    return cpu_.mtp_draft_batch(items);
  }
  const char* name() const override { return "cpu+deferred-sampling"; }

  int64_t deferred_calls = 0;
  int64_t device_tokens = 0;
  int64_t completions = 0;  // complete_deferred_samples calls that wrote picks
  // Deferred calls with a prompt chunk in them, and first tokens deferred (sampled after a
  // prompt's last chunk of more than one token).
  int64_t deferred_with_prompt_chunks = 0;
  int64_t deferred_first_tokens = 0;
  int64_t protocol_errors = 0;

 private:
  struct Held {
    backend::ForwardOutputs* out;
    sampling::SampleResult pick;
  };
  void deliver(const std::vector<Held>& held) {
    for (const Held& h : held) {
      if (!h.out->deferred || h.out->sample.token != kPoison) {
        ADD_FAILURE() << "a deferred output rewritten before its delivery";
        ++protocol_errors;
      }  // rewritten (or read and reused) before its delivery
      h.out->sample = h.pick;
      h.out->sampled = true;
      h.out->deferred = false;
    }
  }

  std::map<const state::SequenceState*, int32_t> picks_;
  std::vector<Held> held_;
  sampling::SamplerScratch scratch_;
};

struct AsyncRun {
  std::vector<std::vector<int32_t>> outputs;
  std::vector<std::vector<float>> logprobs;
  std::vector<FinishReason> reasons;
  std::vector<std::vector<int32_t>> streamed;  // the callbacks' tokens
  std::vector<int> finished_events;
  int64_t async_steps = 0;
  int64_t deferred_calls = 0;
  int64_t device_tokens = 0;
  int64_t protocol_errors = 0;
  int64_t preemptions = 0;
  int64_t deferred_with_prompt_chunks = 0;
  int64_t deferred_first_tokens = 0;
};

struct AsyncSetup {
  bool async = false;
  int64_t budget_bytes = int64_t{64} << 20;
  SchedulerConfig scheduler;
  std::string speculative = "off";
  // Requests aborted from outside once the engine has run this many steps (id index -> step).
  std::map<size_t, int64_t> abort_at;
  // Requests submitted once the engine has run this many steps (the others at once).
  std::map<size_t, int64_t> submit_at;
  int64_t max_model_len = 0;  // EngineConfig::max_model_len (0: the model's)
};

AsyncRun run(const AsyncSetup& setup, std::vector<RequestSpec> specs) {
  EngineConfig cfg;
  cfg.state_budget_bytes = setup.budget_bytes;
  cfg.page_bytes = state::min_page_bytes(fixture()->config());
  cfg.scheduler = setup.scheduler;
  cfg.async_scheduling = setup.async;
  cfg.max_model_len = setup.max_model_len;
  auto sp = spec::parse_config(setup.speculative);
  EXPECT_TRUE(sp.ok());
  cfg.speculative = *sp;
  auto probe = std::make_unique<DeferringModel>(*fixture());
  DeferringModel* model = probe.get();
  auto e = Engine::create(cfg, fixture(), std::move(probe));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  AsyncRun r;
  const size_t n = specs.size();
  r.streamed.resize(n);
  r.finished_events.assign(n, 0);
  std::vector<RequestId> ids(n, 0);
  auto submit = [&](size_t i) {
    auto id = (*e)->submit(std::move(specs[i]), [&r, i](const TokenEvent& ev) {
      r.streamed[i].push_back(ev.token);
      r.finished_events[i] += ev.finished ? 1 : 0;
    });
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    ids[i] = *id;
  };
  for (size_t i = 0; i < n; ++i) {
    if (setup.submit_at.count(i) == 0)
      submit(i);
  }
  int64_t steps = 0;
  auto later = [&] {
    for (const auto& [i, at] : setup.submit_at) {
      if (at > steps)
        return true;
    }
    return false;
  };
  while ((*e)->step() || later()) {
    (*e)->check_integrity();
    ++steps;
    for (const auto& [i, at] : setup.abort_at) {
      if (at == steps)
        (*e)->abort(ids[i], "test");
    }
    for (const auto& [i, at] : setup.submit_at) {
      if (at == steps)
        submit(i);
    }
    (*e)->check_integrity();
  }
  (*e)->check_integrity();
  for (RequestId id : ids) {
    const Request* q = (*e)->request(id);
    EXPECT_TRUE(q->done());
    r.outputs.push_back(q->output);
    r.logprobs.push_back(q->output_logprobs);
    r.reasons.push_back(q->finish_reason);
  }
  r.async_steps = (*e)->stats().async_steps;
  r.preemptions = (*e)->stats().preemptions;
  r.deferred_calls = model->deferred_calls;
  r.device_tokens = model->device_tokens;
  r.protocol_errors = model->protocol_errors;
  r.deferred_with_prompt_chunks = model->deferred_with_prompt_chunks;
  r.deferred_first_tokens = model->deferred_first_tokens;
  return r;
}

// 16 requests of plain settings (greedy and seeded, with logprobs and stop ids), and three of
// every five with something the next step needs on the host (penalties, a mask, top_logprobs).
std::vector<RequestSpec> mix(uint32_t seed, bool stops) {
  std::mt19937 g(seed);
  std::vector<RequestSpec> v;
  for (int i = 0; i < 16; ++i) {
    RequestSpec s;
    const int len = 1 + static_cast<int>(g() % 30);
    for (int j = 0; j < len; ++j) s.prompt.push_back(static_cast<int32_t>(2 + g() % 500));
    s.max_tokens = 6 + static_cast<int64_t>(g() % 18);
    s.ignore_eos = true;
    s.sampling.seed = 100 + static_cast<uint64_t>(i);
    s.sampling.temperature = i % 2 == 0 ? 0.0f : 0.9f;
    s.sampling.top_p = 0.95f;
    s.sampling.logprobs = i % 3 == 0;
    if (stops)  // frequent ids of this fixture's outputs end some requests early
      s.stop_token_ids = {static_cast<int32_t>(2 + g() % 500), 17, 101, 250, 333, 404};
    // (Short: while one of them runs, no step is deferred.)
    if (i % 5 >= 1 && i % 5 <= 3)
      s.max_tokens = 2 + static_cast<int64_t>(g() % 3);
    if (i % 5 == 1)
      s.sampling.presence_penalty = 0.7f;
    if (i % 5 == 2)
      s.token_mask = std::make_unique<test_support::PositionalMask>();
    if (i % 5 == 3)
      s.sampling.top_logprobs = 2;
    v.push_back(std::move(s));
  }
  return v;
}

void expect_equal(const AsyncRun& a, const AsyncRun& sync) {
  EXPECT_EQ(a.outputs, sync.outputs);
  EXPECT_EQ(a.logprobs, sync.logprobs);
  EXPECT_EQ(a.reasons, sync.reasons);
  EXPECT_EQ(a.streamed, a.outputs);  // every token streamed once, in order
  for (size_t i = 0; i < a.finished_events.size(); ++i) EXPECT_EQ(a.finished_events[i], 1) << i;
  EXPECT_EQ(a.protocol_errors, 0);
}

TEST(AsyncScheduling, OutputsEqualSynchronousSteps) {
  for (bool stops : {false, true}) {
    SCOPED_TRACE(stops ? "with stop ids" : "to max_tokens");
    const AsyncRun sync = run({}, mix(5, stops));
    AsyncSetup a;
    a.async = true;
    const AsyncRun async = run(a, mix(5, stops));
    expect_equal(async, sync);
    EXPECT_EQ(sync.async_steps, 0);
    EXPECT_GT(async.async_steps, 0);
    EXPECT_EQ(async.deferred_calls, async.async_steps);
    EXPECT_GT(async.device_tokens, 0);
    if (stops) {
      const auto stopped =
          std::count(sync.reasons.begin(), sync.reasons.end(), FinishReason::kStop);
      EXPECT_GT(stopped, 0);
    }
  }
}

TEST(AsyncScheduling, OutputsEqualSynchronousStepsUnderPreemption) {
  const auto& mc = fixture()->config();
  const int64_t page = state::min_page_bytes(mc);
  const int64_t fixed = state::SequenceState::pages_for(mc, page, 1, 0);
  AsyncSetup tight;
  tight.async = true;
  tight.budget_bytes = (2 * fixed + 8) * page;
  tight.scheduler.max_tokens_per_step = 64;
  tight.scheduler.prefill_chunk = 4;
  const AsyncRun sync = run({}, mix(9, true));
  const AsyncRun async = run(tight, mix(9, true));
  EXPECT_GT(async.preemptions, 0);
  EXPECT_GT(async.async_steps, 0);
  expect_equal(async, sync);
}

// Requests arriving while others decode: their prompt chunks run beside the decodes, and such
// steps are launched ahead too (the chunks before a prompt's end want nothing back; a prompt's
// last chunk samples its first token on the device), with small prefill chunks and a tight
// budget (preemption) as well.
TEST(AsyncScheduling, PromptChunksBesideDecodesAreLaunchedAhead) {
  const auto& mc = fixture()->config();
  const int64_t page = state::min_page_bytes(mc);
  const int64_t fixed = state::SequenceState::pages_for(mc, page, 1, 0);
  for (bool tight : {false, true}) {
    SCOPED_TRACE(tight ? "tight memory" : "roomy");
    auto specs = [] {
      std::vector<RequestSpec> v = mix(17, true);
      for (size_t i = 0; i < v.size(); ++i) {
        v[i].prompt.resize(8 + 3 * i, static_cast<int32_t>(40 + i));  // several chunks each
        v[i].max_tokens += 6;
      }
      return v;
    };
    AsyncSetup s;
    s.scheduler.prefill_chunk = 5;
    s.scheduler.max_tokens_per_step = 24;
    // Tight: every request at once, admitted as memory frees; roomy: arriving over the run.
    if (tight)
      s.budget_bytes = (2 * fixed + 8) * page;
    for (size_t i = 4; i < 16 && !tight; ++i) s.submit_at[i] = static_cast<int64_t>(2 * i);
    const AsyncRun sync = run(s, specs());
    s.async = true;
    const AsyncRun async = run(s, specs());
    expect_equal(async, sync);
    EXPECT_GT(async.deferred_with_prompt_chunks, 0);
    EXPECT_GT(async.deferred_first_tokens, 0);
    if (tight) {
      EXPECT_GT(async.preemptions, 0);
    }
  }
}

// The prefix cache beside launched-ahead steps: a conversation whose every turn's prompt is the
// previous turn's prompt and output plus new tokens, some turns ended by a stop id (a request
// that a pick ends has run one more step: the unit stored at its end holds that position too).
// Every turn equals the uncached synchronous engine's, and the later turns start from stored
// units.
TEST(AsyncScheduling, PrefixCacheConversationEqualsTheUncachedEngine) {
  auto engine = [](bool async, bool cache) {
    EngineConfig cfg;
    cfg.state_budget_bytes = int64_t{64} << 20;
    cfg.page_bytes = state::min_page_bytes(fixture()->config());
    cfg.scheduler.prefill_chunk = 32;
    cfg.async_scheduling = async;
    if (cache) {
      kvstore::KvStoreOptions o;
      o.host_bytes = int64_t{64} << 20;
      auto store = kvstore::KvStore::open(o);
      EXPECT_TRUE(store.ok()) << store.status().to_string();
      cfg.prefix_cache.store = std::shared_ptr<kvstore::KvStore>(std::move(store).value());
      cfg.prefix_cache.block = 16;
      cfg.prefix_cache.min_tokens = 4;
      cfg.prefix_cache.interval = 0;
    }
    auto e = Engine::create(cfg, fixture(), std::make_unique<DeferringModel>(*fixture()));
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return std::move(e).value();
  };
  auto turn = [](Engine& e, const std::vector<int32_t>& prompt, int32_t stop) {
    RequestSpec s;
    s.prompt = prompt;
    s.max_tokens = 10;
    s.sampling.temperature = 0.0f;
    s.sampling.logprobs = true;
    s.ignore_eos = true;
    if (stop >= 0)
      s.stop_token_ids = {stop};
    auto id = e.submit(std::move(s));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    while (e.step()) e.check_integrity();
    e.wait_stored_captures();
    const Request* r = e.request(*id);
    test_support::Turn t{r->output, r->output_logprobs, r->cached_tokens};
    e.release(*id);
    return t;
  };
  auto plain = engine(false, false);
  auto cached = engine(true, true);
  std::mt19937 g(77);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back(static_cast<int32_t>(2 + g() % 500));
  int64_t cached_tokens = 0;
  for (int t = 0; t < 6; ++t) {
    SCOPED_TRACE("turn " + std::to_string(t));
    // Odd turns stop at their fifth token's id (at its first occurrence).
    int32_t stop = -1;
    if (t % 2 == 1)
      stop = turn(*plain, prompt, -1).output[4];
    const test_support::Turn want = turn(*plain, prompt, stop);
    const test_support::Turn got = turn(*cached, prompt, stop);
    EXPECT_EQ(got.output, want.output);
    EXPECT_EQ(got.logprobs, want.logprobs);
    if (t > 0) {
      EXPECT_GT(got.cached, 0);
    }
    cached_tokens += got.cached;
    prompt.insert(prompt.end(), want.output.begin(), want.output.end());
    for (int i = 0; i < 5; ++i) prompt.push_back(static_cast<int32_t>(2 + g() % 500));
  }
  EXPECT_GT(cached->stats().async_steps, 0);
  EXPECT_GT(cached_tokens, 0);
}

// Random workloads (20 here; 300 passed when it was written), each run waiting and launched ahead:
// prompts of 1..40 tokens, 1..12 tokens to generate, stop ids, greedy and seeded sampling, some
// requests with settings that cannot be deferred, arrivals during the run, prefill chunks of 1..16
// tokens, a context limit, tight memory (preemption) and speculation (fixed, auto) in some of them.
TEST(AsyncScheduling, RandomWorkloadsEqualSynchronousSteps) {
  const auto& mc = fixture()->config();
  const int64_t page = state::min_page_bytes(mc);
  const int64_t fixed = state::SequenceState::pages_for(mc, page, 1, 0);
  int64_t deferred = 0, preempted = 0;
  for (uint32_t seed = 0; seed < 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 g(1000 + seed);
    const int n = 2 + static_cast<int>(g() % 10);
    // A context limit in a third of the workloads: every request fits it at submit, some exactly.
    const int64_t max_len = g() % 3 == 0 ? 30 + static_cast<int64_t>(g() % 20) : 0;
    auto specs = [&, seed] { return test_support::random_requests(seed, n, max_len, true); };
    AsyncSetup s;
    s.scheduler.prefill_chunk = 1 + static_cast<int64_t>(g() % 16);
    s.scheduler.max_tokens_per_step = s.scheduler.prefill_chunk + static_cast<int64_t>(g() % 24);
    s.scheduler.max_running = 1 + static_cast<int64_t>(g() % 8);
    s.max_model_len = max_len;
    // Speculation in some: its steps wait for the picks in flight (the outputs are the same
    // whatever depth auto picks: every draw is keyed by position).
    static const char* const kModes[] = {"off", "off", "fixed:2", "auto"};
    s.speculative = kModes[g() % 4];
    if (g() % 3 == 0)
      s.budget_bytes = (2 * fixed + 4 + static_cast<int64_t>(g() % 8)) * page;
    for (int i = 0; i < n; ++i) {
      if (g() % 2 == 0)
        s.submit_at[static_cast<size_t>(i)] = 1 + static_cast<int64_t>(g() % 12);
    }
    const AsyncRun sync = run(s, specs());
    s.async = true;
    const AsyncRun async = run(s, specs());
    expect_equal(async, sync);
    deferred += async.async_steps;
    preempted += async.preemptions;
  }
  EXPECT_GT(deferred, 0);
  EXPECT_GT(preempted, 0);
}

// Only plain decodes are launched ahead: requests that all use penalties never are.
TEST(AsyncScheduling, StepsThatNeedTheirTokensOnTheHostAreNotDeferred) {
  auto specs = [] {
    std::vector<RequestSpec> v = mix(3, false);
    for (RequestSpec& s : v) s.sampling.frequency_penalty = 0.3f;
    return v;
  };
  AsyncSetup a;
  a.async = true;
  const AsyncRun sync = run({}, specs());
  const AsyncRun async = run(a, specs());
  EXPECT_EQ(async.async_steps, 0);
  expect_equal(async, sync);
}

// A speculating engine: steps in which a request drafts take the picks in flight first, and the
// outputs stay those of the synchronous engine (fixed depth and auto).
TEST(AsyncScheduling, SpeculationWaitsForThePicksInFlight) {
  for (const char* mode : {"fixed:2", "auto"}) {
    SCOPED_TRACE(mode);
    AsyncSetup s;
    s.speculative = mode;
    const AsyncRun sync = run(s, mix(13, true));
    s.async = true;
    const AsyncRun async = run(s, mix(13, true));
    expect_equal(async, sync);
  }
}

// Aborted while a pick is in flight: the request ends aborted with the tokens it had, its pick
// is dropped, and the other requests' outputs are those of the synchronous engine.
TEST(AsyncScheduling, AbortsWhileAPickIsInFlight) {
  AsyncSetup a;
  a.async = true;
  for (size_t i = 0; i < 16; i += 3) a.abort_at[i] = 4 + static_cast<int64_t>(i % 4);
  const AsyncRun sync = run({}, mix(21, false));
  const AsyncRun async = run(a, mix(21, false));
  EXPECT_EQ(async.protocol_errors, 0);
  EXPECT_GT(async.async_steps, 0);
  for (size_t i = 0; i < 16; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(async.streamed[i], async.outputs[i]);
    if (a.abort_at.count(i) && async.reasons[i] == FinishReason::kAbort) {
      // A prefix of what it would have generated.
      ASSERT_LE(async.outputs[i].size(), sync.outputs[i].size());
      EXPECT_TRUE(
          std::equal(async.outputs[i].begin(), async.outputs[i].end(), sync.outputs[i].begin()));
      EXPECT_EQ(async.finished_events[i], 0);
    } else {
      EXPECT_EQ(async.outputs[i], sync.outputs[i]);
      EXPECT_EQ(async.finished_events[i], 1);
    }
  }
}

// Auto's start-up measurement times off as the engine runs it: with launch_ahead, plain decode
// steps launched ahead in a row (the first without, the others with device tokens), their picks
// completed at the end; every throwaway sequence rolled back and released.
TEST(AsyncScheduling, StartUpMeasurementTimesOffLaunchedAhead) {
  const auto& mc = fixture()->config();
  for (bool ahead : {false, true}) {
    SCOPED_TRACE(ahead ? "launched ahead" : "waiting");
    DeferringModel model(*fixture());
    auto arena = state::PageArena::growable(state::default_page_bytes(mc));
    spec::MtpDrafter drafter(&model, 2);
    auto t = spec::measure_step_times(model, drafter, *arena, 2, 2, true, 1, 2.0, {}, ahead);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE(t->valid());
    for (double off : t->off_s) EXPECT_GT(off, 0);
    EXPECT_EQ(model.protocol_errors, 0);
    EXPECT_EQ(arena->used_bytes(), 0);
    if (ahead) {
      // Batch sizes 1 and 2, each two untimed runs and one timed of three steps (max_k + 1),
      // the second and third with a device token per sequence.
      EXPECT_EQ(model.deferred_calls, 2 * 3 * 3);
      EXPECT_EQ(model.device_tokens, 3 * 2 * (1 + 2));
      EXPECT_EQ(model.completions, 2 * 3);
    } else {
      EXPECT_EQ(model.deferred_calls, 0);
    }
  }
}

}  // namespace
}  // namespace dsinfer::engine
