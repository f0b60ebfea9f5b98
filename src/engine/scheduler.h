// Scheduler: continuous batching as a pure planning step. Every step it emits a StepPlan of
// (request, first position, token count) entries under a per-step token budget: decodes first
// (one token each), then chunked prefill in arrival order, admitting waiting requests while the
// state arena has room. When memory runs out it preempts the newest running request (its state
// is freed and recomputed later). It runs nothing itself; the engine executes the plan and calls
// commit(). No per-token heap allocation: plan storage is reused across steps.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/request.h"

namespace dsinfer::engine {

struct SchedulerConfig {
  int64_t max_tokens_per_step = 256;  // token budget of one step (prefill chunks + decodes)
  int64_t max_running = 64;           // sequences holding state at once
  int64_t prefill_chunk = 128;        // longest prefill piece of one request in one step
};

struct ScheduledChunk {
  Request* request = nullptr;
  int64_t first_pos = 0;  // == request->num_computed at planning time
  int64_t num_tokens = 0;
  bool samples = false;  // the chunk reaches the end of the known tokens: sample after it
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<Request*> preempted;
  int64_t num_tokens = 0;
  void clear() {
    chunks.clear();
    preempted.clear();
    num_tokens = 0;
  }
};

// Memory hooks the scheduler asks before scheduling; implemented by the engine's state manager.
class MemoryHooks {
 public:
  virtual ~MemoryHooks() = default;
  // Allocates the request's state if it has none; false when there is no room. May start the
  // request from a cached prefix: it then sets r.num_computed (> 0) to the restored length.
  virtual bool admit(Request& r) = 0;
  // Reserves room for n more tokens of an admitted request; false when there is no room.
  virtual bool reserve(Request& r, int64_t n) = 0;
  // Frees the request's state (finish, abort, preemption).
  virtual void release(Request& r) = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, MemoryHooks* memory);

  void add(Request* r);  // new request, in arrival order
  // A request whose state the engine filled in already (a fork of another request's prompt
  // state, see Engine): joins the running set as it is. False when the running set is full.
  bool add_running(Request* r);
  void remove(Request* r);  // finished / aborted: drop from queues, release memory
  // Plans the next step into `plan` (cleared first).
  void plan(StepPlan& plan);
  bool idle() const { return waiting_.empty() && running_.empty(); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  // Aborts (DSI_CHECK) if queue membership and request states disagree.
  void check_integrity() const;

 private:
  void preempt(Request* r, StepPlan& plan);
  int64_t prefill_len(const Request& r, int64_t budget) const;
  SchedulerConfig config_;
  MemoryHooks* memory_;
  std::deque<Request*> waiting_;    // arrival order; preempted requests go back to the front
  std::vector<Request*> running_;   // admission order (state allocated)
  std::vector<Request*> snapshot_;  // reused iteration copy of running_
};

}  // namespace dsinfer::engine
