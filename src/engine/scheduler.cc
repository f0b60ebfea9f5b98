// Scheduler: decode-first continuous batching with chunked prefill and preemption by recompute.
#include "engine/scheduler.h"

#include <algorithm>

#include "base/check.h"

namespace dsinfer::engine {

const char* request_state_name(RequestState s) {
  switch (s) {
    case RequestState::kWaiting:
      return "waiting";
    case RequestState::kPrefilling:
      return "prefilling";
    case RequestState::kDecoding:
      return "decoding";
    case RequestState::kFinished:
      return "finished";
    case RequestState::kAborted:
      return "aborted";
  }
  return "?";
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

Scheduler::Scheduler(const SchedulerConfig& config, MemoryHooks* memory)
    : config_(config), memory_(memory) {
  DSI_CHECK(config.max_tokens_per_step > 0 && config.max_running > 0 && config.prefill_chunk > 0,
            "bad scheduler config");
  running_.reserve(static_cast<size_t>(config.max_running));
}

void Scheduler::add(Request* r) {
  r->state = RequestState::kWaiting;
  waiting_.push_back(r);
}

bool Scheduler::add_running(Request* r) {
  if (static_cast<int64_t>(running_.size()) >= config_.max_running)
    return false;
  running_.push_back(r);
  return true;
}

void Scheduler::remove(Request* r) {
  auto w = std::find(waiting_.begin(), waiting_.end(), r);
  if (w != waiting_.end())
    waiting_.erase(w);
  auto it = std::find(running_.begin(), running_.end(), r);
  if (it != running_.end()) {
    running_.erase(it);
    memory_->release(*r);
  }
}

void Scheduler::preempt(Request* r, StepPlan& plan) {
  auto it = std::find(running_.begin(), running_.end(), r);
  DSI_CHECK(it != running_.end(), "preempting a request that is not running");
  running_.erase(it);
  memory_->release(*r);
  r->num_computed = 0;
  r->state = RequestState::kWaiting;
  ++r->num_preemptions;
  waiting_.push_front(r);
  plan.preempted.push_back(r);
}

void Scheduler::plan(StepPlan& plan) {
  plan.clear();
  int64_t budget = config_.max_tokens_per_step;
  auto scheduled = [&plan](const Request* r) {
    for (const auto& c : plan.chunks) {
      if (c.request == r)
        return true;
    }
    return false;
  };
  // Reserve room for n tokens of r, preempting the newest unscheduled running requests when the
  // arena is full. False when r itself had to go.
  auto reserve = [&](Request* r, int64_t n) {
    while (!memory_->reserve(*r, n)) {
      Request* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
        if (*it != r && !scheduled(*it)) {
          victim = *it;
          break;
        }
      }
      if (victim == nullptr) {
        preempt(r, plan);
        return false;
      }
      preempt(victim, plan);
    }
    return true;
  };
  auto schedule = [&](Request* r, int64_t n) {
    ScheduledChunk c;
    c.request = r;
    c.first_pos = r->num_computed;
    c.num_tokens = n;
    c.samples = r->num_computed + n == r->num_tokens();
    plan.chunks.push_back(c);
    plan.num_tokens += n;
    budget -= n;
  };

  // 1. Decodes: one token for every running request that has caught up with its prompt.
  //    (Iterate a snapshot: preemption removes requests from running_.)
  snapshot_.assign(running_.begin(), running_.end());
  for (Request* r : snapshot_) {
    if (budget == 0)
      break;
    // (Asynchronous scheduling: a request whose last token is still being sampled has nothing
    // left to feed.)
    if (r->state != RequestState::kDecoding || r->num_computed >= r->num_tokens())
      continue;
    if (reserve(r, 1))
      schedule(r, 1);
  }
  // 2. Prefill chunks of running requests, oldest first.
  snapshot_.assign(running_.begin(), running_.end());
  for (Request* r : snapshot_) {
    if (budget == 0)
      break;
    if (r->state != RequestState::kPrefilling || scheduled(r))
      continue;
    const int64_t n = prefill_len(*r, budget);
    if (n < 1)
      continue;  // (its prompt computed, its first token still being sampled: its last one)
    if (reserve(r, n))
      schedule(r, n);
  }
  // 3. Admit waiting requests in arrival order while there is budget and memory. A request that
  //    does not fit stops admission (no overtaking), so nothing starves.
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < config_.max_running) {
    Request* r = waiting_.front();
    if (std::find(plan.preempted.begin(), plan.preempted.end(), r) != plan.preempted.end())
      break;
    // admit() may start the request from a cached prefix (num_computed > 0).
    r->num_computed = 0;
    if (!memory_->admit(*r))
      break;
    const int64_t n = prefill_len(*r, budget);
    if (!memory_->reserve(*r, n)) {
      memory_->release(*r);
      r->num_computed = 0;
      break;
    }
    waiting_.pop_front();
    running_.push_back(r);
    r->state = RequestState::kPrefilling;
    schedule(r, n);
  }
}

int64_t Scheduler::prefill_len(const Request& r, int64_t budget) const {
  int64_t n = std::min({r.num_tokens() - r.num_computed, config_.prefill_chunk, budget});
  // A prefill pauses where the engine stores a prefix-cache unit.
  if (r.snapshot_at > r.num_computed)
    n = std::min(n, r.snapshot_at - r.num_computed);
  return n;
}

void Scheduler::check_integrity() const {
  for (const Request* r : waiting_) {
    DSI_CHECK(r->state == RequestState::kWaiting,
              "request %lld in the waiting queue is %s",
              static_cast<long long>(r->id),
              request_state_name(r->state));
    DSI_CHECK(r->num_computed == 0,
              "waiting request %lld has computed tokens",
              static_cast<long long>(r->id));
    DSI_CHECK(!r->awaiting_pick && r->pending_tokens == 0,
              "waiting request %lld still awaits a pick between steps",
              static_cast<long long>(r->id));
    DSI_CHECK(std::find(running_.begin(), running_.end(), r) == running_.end(),
              "request %lld both waiting and running",
              static_cast<long long>(r->id));
  }
  DSI_CHECK(static_cast<int64_t>(running_.size()) <= config_.max_running, "too many running");
  for (const Request* r : running_) {
    DSI_CHECK(r->state == RequestState::kPrefilling || r->state == RequestState::kDecoding,
              "request %lld in the running set is %s",
              static_cast<long long>(r->id),
              request_state_name(r->state));
    DSI_CHECK(r->num_computed <= r->num_tokens(),
              "request %lld computed past its tokens",
              static_cast<long long>(r->id));
    DSI_CHECK(r->pending_tokens == 0 || (r->awaiting_pick && r->pending_tokens == 1),
              "request %lld has %d pending tokens without a pick in flight",
              static_cast<long long>(r->id),
              r->pending_tokens);
    if (r->state == RequestState::kDecoding) {
      // (A request awaiting its last pick has fed every token it will have.)
      const int64_t fed = r->awaiting_pick && r->pending_tokens == 0 ? 0 : 1;
      DSI_CHECK(r->num_computed == r->num_tokens() - fed,
                "decoding request %lld has %lld of %lld tokens computed",
                static_cast<long long>(r->id),
                static_cast<long long>(r->num_computed),
                static_cast<long long>(r->num_tokens()));
    }
  }
}

}  // namespace dsinfer::engine
