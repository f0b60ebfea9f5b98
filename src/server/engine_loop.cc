#include "server/engine_loop.h"

#include <algorithm>
#include <utility>

#include "server/generation.h"
#include "server/log.h"

namespace dsinfer::server {

const char* end_cause_name(EndCause c) {
  switch (c) {
    case EndCause::kNone:
      return "none";
    case EndCause::kDisconnect:
      return "disconnect";
    case EndCause::kTimeout:
      return "timeout";
    case EndCause::kShutdown:
      return "shutdown";
    case EndCause::kError:
      return "error";
  }
  return "none";
}

namespace {

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

recipe::FinishReason backend_reason(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kNone:
    case engine::FinishReason::kStop:
      return recipe::FinishReason::kStop;
    case engine::FinishReason::kLength:
      return recipe::FinishReason::kLength;
    case engine::FinishReason::kAbort:
      return recipe::FinishReason::kAborted;
    case engine::FinishReason::kError:
      return recipe::FinishReason::kError;
  }
  return recipe::FinishReason::kStop;
}

}  // namespace

struct EngineLoop::Active {
  Active(const tokenizer::Tokenizer& tok, Job& job)
      : pipeline(tok, job.parser, std::move(job.script)) {}
  uint64_t ticket = 0;
  engine::RequestId engine_id = 0;
  std::shared_ptr<RequestSink> sink;
  OutputPipeline pipeline;
  int64_t prompt_tokens = 0;
  int64_t tokens_seen = 0;  // tokens delivered by the engine callback
  Clock::time_point admitted;
  Clock::time_point deadline = Clock::time_point::max();
  Clock::time_point last_token;
  double ttft_s = -1;
  EndCause cause = EndCause::kNone;
};

EngineLoop::EngineLoop(std::unique_ptr<engine::Engine> engine,
                       const tokenizer::Tokenizer& tokenizer,
                       Metrics* metrics,
                       int64_t capacity,
                       double step_delay_s)
    : engine_(std::move(engine)),
      tok_(tokenizer),
      metrics_(metrics),
      capacity_(std::max<int64_t>(1, capacity)),
      step_delay_s_(step_delay_s),
      model_config_(engine_->model_config()) {}

EngineLoop::~EngineLoop() {
  stop();
}

void EngineLoop::start() {
  std::lock_guard<std::mutex> l(mu_);
  if (thread_.joinable() || stopped_)
    return;
  publish();
  thread_ = std::thread([this] { run(); });
}

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable())
    thread_.join();
  std::vector<Command> orphans;
  {
    std::lock_guard<std::mutex> l(mu_);
    stopped_ = true;
    orphans.swap(inbox_);  // only when the loop never started
  }
  for (Command& c : orphans) {
    if (c.kind == Command::Kind::kSubmit) {
      --in_flight_;
      c.sink->on_rejected(Status(StatusCode::kFailedPrecondition, "the server is shutting down"));
    }
  }
}

bool EngineLoop::try_admit() {
  int64_t cur = in_flight_.load();
  while (cur < capacity_) {
    if (in_flight_.compare_exchange_weak(cur, cur + 1))
      return true;
  }
  return false;
}

void EngineLoop::cancel_admission() {
  --in_flight_;
}

uint64_t EngineLoop::submit(Job job, std::shared_ptr<RequestSink> sink) {
  const uint64_t ticket = next_ticket_.fetch_add(1);
  Command c;
  c.kind = Command::Kind::kSubmit;
  c.ticket = ticket;
  c.job = std::move(job);
  c.sink = std::move(sink);
  c.admitted = Clock::now();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!stop_ && !stopped_) {
      inbox_.push_back(std::move(c));
      cv_.notify_one();
      return ticket;
    }
  }
  --in_flight_;
  c.sink->on_rejected(Status(StatusCode::kFailedPrecondition, "the server is shutting down"));
  return ticket;
}

void EngineLoop::abort(uint64_t ticket, EndCause cause) {
  Command c;
  c.kind = Command::Kind::kAbort;
  c.ticket = ticket;
  c.cause = cause;
  std::lock_guard<std::mutex> l(mu_);
  inbox_.push_back(std::move(c));
  cv_.notify_one();
}

void EngineLoop::abort_all(EndCause cause) {
  Command c;
  c.kind = Command::Kind::kAbortAll;
  c.cause = cause;
  std::lock_guard<std::mutex> l(mu_);
  inbox_.push_back(std::move(c));
  cv_.notify_one();
}

void EngineLoop::run() {
  std::vector<Command> cmds;
  for (;;) {
    bool stopping = false;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (active_.empty()) {
        // Prefix-cache captures still copying in the background are polled every millisecond
        // (their units reach the store before the next turn of a conversation looks them up).
        auto woken = [&] { return !inbox_.empty() || stop_; };
        if (engine_->pending_captures() > 0)
          cv_.wait_for(l, std::chrono::milliseconds(1), woken);
        else
          cv_.wait(l, woken);
      }
      cmds.swap(inbox_);
      stopping = stop_;
    }
    for (Command& c : cmds) handle(c);
    cmds.clear();
    if (stopping) {
      while (!active_.empty()) abort_active(*active_.begin()->second, EndCause::kShutdown);
      publish();
      std::lock_guard<std::mutex> l(mu_);
      stopped_ = true;
      // Submits that raced with stop() are rejected by stop() after the join.
      return;
    }
    // Deadlines.
    const Clock::time_point now = Clock::now();
    std::vector<uint64_t> expired;
    for (const auto& [ticket, a] : active_) {
      if (now >= a->deadline)
        expired.push_back(ticket);
    }
    for (uint64_t t : expired) {
      auto it = active_.find(t);
      if (it != active_.end())
        abort_active(*it->second, EndCause::kTimeout);
    }
    if (!active_.empty()) {
      engine_->step();
      deliver();
      publish();
      if (Status h = engine_->health(); !h.ok()) {
        bool first = false;
        {
          std::lock_guard<std::mutex> l(mu_);
          first = fatal_.ok();
          fatal_ = h;
        }
        if (first) {
          DSI_LOG_ERROR("device failure, every request failed: %s", h.message().c_str());
          if (on_fatal_)
            on_fatal_(h);
        }
      }
      if (step_delay_s_ > 0)
        std::this_thread::sleep_for(std::chrono::duration<double>(step_delay_s_));
    } else {
      if (engine_->pending_captures() > 0)
        engine_->step();  // no request to run: only polls the captures
      publish();
    }
  }
}

void EngineLoop::handle(Command& c) {
  switch (c.kind) {
    case Command::Kind::kSubmit: {
      if (Status h = engine_->health(); !h.ok()) {
        --in_flight_;
        c.sink->on_rejected(h);
        return;
      }
      engine::RequestSpec spec = std::move(c.job.spec);
      if (!c.job.script.empty()) {
        // Scripted output (test-only): the script decides where the output ends, not the ids
        // the random model happens to sample.
        spec.ignore_eos = true;
        spec.stop_token_ids.clear();
      }
      auto a = std::make_unique<Active>(tok_, c.job);
      Active* raw = a.get();
      a->ticket = c.ticket;
      a->sink = std::move(c.sink);
      a->admitted = c.admitted;
      if (c.job.timeout_s > 0) {
        a->deadline = c.admitted + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(c.job.timeout_s));
      }
      a->prompt_tokens = static_cast<int64_t>(spec.prompt.size());
      if (c.job.share_prompt_ticket != 0) {
        auto first = active_.find(c.job.share_prompt_ticket);
        const engine::Request* fr =
            first != active_.end() ? engine_->request(first->second->engine_id) : nullptr;
        if (fr != nullptr && !fr->done() && fr->output.empty() && fr->spec.prompt == spec.prompt)
          spec.share_prompt_of = first->second->engine_id;
      }
      a->pipeline.set_report_logprobs(spec.sampling.logprobs && c.job.report_logprobs);
      spec.stop_checker = std::make_unique<PipelineStopChecker>(&raw->pipeline);
      if (c.job.grammar) {
        auto m = grammar::Matcher::create(c.job.grammar);
        if (!m.ok()) {
          --in_flight_;
          a->sink->on_rejected(m.status());
          return;
        }
        spec.token_mask = std::make_unique<GrammarTokenMask>(std::move(m).value(), &raw->pipeline);
      }
      if (c.job.tool_grammar) {
        auto m = grammar::Matcher::create(c.job.tool_grammar);
        if (!m.ok()) {
          --in_flight_;
          a->sink->on_rejected(m.status());
          return;
        }
        spec.token_mask = std::make_unique<ToolCallTokenMask>(
            std::move(m).value(),
            c.job.dsml_token,
            c.job.parser.start == recipe::ParseStart::kToolCalls,
            std::move(spec.token_mask));
      }
      auto id = engine_->submit(std::move(spec),
                                [this, raw](const engine::TokenEvent& ev) { on_token(*raw, ev); });
      if (!id.ok()) {
        --in_flight_;
        a->sink->on_rejected(id.status());
        return;
      }
      a->engine_id = *id;
      metrics_->add_prompt_tokens(a->prompt_tokens);
      a->sink->on_accepted(a->prompt_tokens);
      active_.emplace(c.ticket, std::move(a));
      return;
    }
    case Command::Kind::kAbort: {
      auto it = active_.find(c.ticket);
      if (it != active_.end())
        abort_active(*it->second, c.cause);
      return;
    }
    case Command::Kind::kAbortAll:
      while (!active_.empty()) abort_active(*active_.begin()->second, c.cause);
      return;
  }
}

void EngineLoop::on_token(Active& a, const engine::TokenEvent& ev) {
  // The stop checker has fed this token already unless the engine stopped on it first (EOS or a
  // stop id), in which case the checker was not consulted.
  if (a.pipeline.tokens() == a.tokens_seen)
    a.pipeline.feed(ev.token);
  a.pipeline.logprobs(ev.logprob, ev.top_logprobs);
  ++a.tokens_seen;
  const Clock::time_point now = Clock::now();
  if (a.tokens_seen == 1) {
    a.ttft_s = seconds(now - a.admitted);
    metrics_->observe_ttft(a.ttft_s);
    metrics_->on_token(-1);
  } else {
    metrics_->on_token(seconds(now - a.last_token));
  }
  a.last_token = now;
}

void EngineLoop::abort_active(Active& a, EndCause cause) {
  a.cause = cause;
  engine_->abort(a.engine_id, end_cause_name(cause));
  finalize(a.ticket);
}

void EngineLoop::deliver() {
  std::vector<uint64_t> done;
  for (auto& [ticket, a] : active_) {
    if (a->pipeline.has_events())
      a->sink->on_events(a->pipeline.take_events());
    const engine::Request* r = engine_->request(a->engine_id);
    if (r == nullptr || r->done())
      done.push_back(ticket);
  }
  for (uint64_t t : done) finalize(t);
}

void EngineLoop::finalize(uint64_t ticket) {
  auto it = active_.find(ticket);
  if (it == active_.end())
    return;
  Active& a = *it->second;
  const engine::Request* r = engine_->request(a.engine_id);
  Completion c;
  c.usage.prompt_tokens = a.prompt_tokens;
  recipe::FinishReason backend = recipe::FinishReason::kAborted;
  if (r != nullptr) {
    backend = backend_reason(r->finish_reason);
    c.usage.completion_tokens = static_cast<int64_t>(r->output.size());
    for (float lp : r->output_logprobs) c.cumulative_logprob += lp;
    c.usage.cached_prompt_tokens = std::min(r->cached_tokens, a.prompt_tokens);
    if (r->finish_reason == engine::FinishReason::kError) {
      c.error = r->error;
      if (a.cause == EndCause::kNone)
        a.cause = EndCause::kError;
    }
  }
  if (a.cause != EndCause::kNone && a.cause != EndCause::kError)
    backend = recipe::FinishReason::kAborted;
  a.pipeline.finish(backend);
  c.usage.reasoning_tokens = std::min(a.pipeline.reasoning_tokens(), c.usage.completion_tokens);
  c.finish = a.pipeline.finish_reason();
  c.cause = a.cause;
  c.ttft_s = a.ttft_s;
  c.duration_s = seconds(Clock::now() - a.admitted);
  // Release first: the sequence state is back in the arena before anyone hears of the end.
  engine_->release(a.engine_id);
  if (a.pipeline.has_events())
    a.sink->on_events(a.pipeline.take_events());
  metrics_->observe_request_duration(c.duration_s);
  if (c.cause != EndCause::kNone)
    metrics_->count_abort(end_cause_name(c.cause));
  --in_flight_;
  a.sink->on_finished(c);
  active_.erase(it);
}

void EngineLoop::publish() {
  const engine::EngineStats st = engine_->stats();
  EngineGauges g;
  g.queue_depth = st.waiting;
  g.running = st.running;
  g.in_flight = in_flight_.load();
  g.state_used_bytes = st.state_bytes_used;
  g.state_total_bytes = st.state_bytes_total;
  g.state_fixed_bytes = st.state_bytes_fixed;
  g.state_bytes_per_token = st.state_bytes_per_token;
  g.state_max_context = st.state_max_context;
  g.steps = st.steps;
  g.preemptions = st.preemptions;
  g.async_steps = st.async_steps;
  if (const kvstore::KvStore* kv = engine_->kv_store()) {
    g.prefix_cache = true;
    g.cache_lookups = st.cache_lookups;
    g.cached_prompt_tokens = st.cached_prompt_tokens;
    g.computed_prompt_tokens = st.prompt_tokens;
    g.cache_restore_failures = st.cache_restore_failures;
    g.cache_units_stored = st.cache_units_stored;
    g.cache_store_failures = st.cache_store_failures;
    g.cache_async_captures = st.cache_async_captures;
    g.cache_captures_pending = st.cache_captures_pending;
    g.kv = kv->stats();
    g.device_hits = st.device_tier.hits;
    g.device_entries = st.device_tier.entries;
    g.device_bytes = st.device_tier.bytes;
    g.device_evictions = st.device_tier.evictions;
    g.device_puts = st.device_tier.puts;
    g.device_rejected = st.device_tier.rejected;
  }
  g.step_phase_s = st.phases.seconds();
  const backend::Model::DeviceTiming d = engine_->model().decode_timing();
  g.device_timing = d.busy_ms > 0 || d.idle_ms > 0;
  g.device_busy_s = d.busy_ms * 1e-3;
  g.device_idle_s = d.idle_ms * 1e-3;
  const auto host_ms = d.host_phase_ms();
  for (size_t p = 0; p < g.backend_host_s.size(); ++p) g.backend_host_s[p] = host_ms[p] * 1e-3;
  if (st.speculative.mode != spec::Mode::kOff) {
    g.spec_verified = st.spec.verified;
    g.spec_accepted = st.spec.accepted;
    g.spec_verify_len = st.spec.verify_len;
    g.spec_steps = st.spec.spec_steps;
    g.spec_resumed = st.spec.resumed;
    g.spec_tokens = st.spec.spec_tokens;
  }
  metrics_->set_gauges(g);
}

}  // namespace dsinfer::server
