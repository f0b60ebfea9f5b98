// Server metrics in the Prometheus text exposition format (version 0.0.4), hand-written:
// counters, gauges and fixed-bucket histograms behind one mutex. Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/model.h"
#include "kvstore/store.h"

namespace dsinfer::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // `name`_bucket{le=…}, `name`_sum, `name`_count lines (HELP/TYPE written by the caller).
  void render(const std::string& name, std::string* out) const;
  int64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); +Inf last
  double sum_ = 0;
  int64_t count_ = 0;
};

// Engine-side gauges, published by the engine loop after every iteration.
struct EngineGauges {
  int64_t queue_depth = 0;  // admitted requests not yet running (inbox + engine waiting)
  int64_t running = 0;      // requests holding sequence state
  int64_t in_flight = 0;    // admitted and not finished (queue_depth + running + finishing)
  int64_t state_used_bytes = 0;
  int64_t state_total_bytes = 0;
  int64_t state_fixed_bytes = 0;     // one sequence's state at one token
  double state_bytes_per_token = 0;  // per further token of context
  int64_t state_max_context = 0;     // tokens of context one sequence can hold
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t async_steps = 0;
  // Prefix cache (when the engine has one).
  bool prefix_cache = false;
  int64_t cache_lookups = 0;
  int64_t cached_prompt_tokens = 0;    // restored from the cache
  int64_t computed_prompt_tokens = 0;  // prefilled (recomputation included)
  int64_t cache_restore_failures = 0;
  int64_t cache_units_stored = 0;
  int64_t cache_store_failures = 0;    // captures that failed (their units are not stored)
  int64_t cache_async_captures = 0;    // captures whose page copy ran in the background
  int64_t cache_captures_pending = 0;  // background captures not finished yet
  kvstore::StoreStats kv;
  // The device tier above the store (engine/device_tier.h; zeros when off).
  int64_t device_hits = 0;
  int64_t device_entries = 0;
  int64_t device_bytes = 0;
  int64_t device_evictions = 0;
  int64_t device_puts = 0;      // units put into the device tier
  int64_t device_rejected = 0;  // puts that did not fit (larger than the budget, no free pages)
  // Speculative decoding (empty when off): drafts verified and accepted per draft position
  // (index 0 = the first draft), decode request-steps by the number of drafts verified (index k),
  // and the request-steps that verified drafts with the tokens they emitted.
  std::vector<int64_t> spec_verified;
  std::vector<int64_t> spec_accepted;
  std::vector<int64_t> spec_verify_len;
  int64_t spec_steps = 0;
  int64_t spec_resumed = 0;
  int64_t spec_tokens = 0;
  // Where the step loop's time goes (seconds, summed over steps): the engine's phases
  // (EngineStats::phases: schedule, draft, prepare, forward, finish) and, where the backend
  // measures them (CUDA: device_timing), the device's busy and idle time in decode-shaped calls
  // and the backend's host time in them by phase (before, launch, wait, after;
  // backend::Model::DeviceTiming). Idle over busy + idle is the share of a decode step the GPU
  // waits for the host.
  std::array<double, 5> step_phase_s{};
  bool device_timing = false;
  double device_busy_s = 0;
  double device_idle_s = 0;
  std::array<double, backend::Model::DeviceTiming::kHostPhases> backend_host_s{};
};

class Metrics {
 public:
  Metrics();

  // One finished HTTP exchange. `endpoint` is a route label (see server.cc), never raw input.
  void count_request(std::string_view endpoint, int status);
  void add_prompt_tokens(int64_t n);
  // One generated token; `itl_s` >= 0 is the gap since the request's previous token.
  void on_token(double itl_s);
  void observe_ttft(double s);
  void observe_request_duration(double s);
  void count_abort(std::string_view reason);  // disconnect | timeout | shutdown | error
  void count_send_timeout();                  // a client that did not read: connection closed
  void set_gauges(const EngineGauges& g);
  void set_max_concurrency(int64_t running, int64_t queue);

  std::string render() const;

  // For tests.
  int64_t requests(std::string_view endpoint, int status) const;
  int64_t aborts(std::string_view reason) const;
  int64_t send_timeouts() const;
  EngineGauges gauges() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, int64_t> aborts_;
  int64_t send_timeouts_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  Histogram ttft_;
  Histogram itl_;
  Histogram duration_;
  EngineGauges gauges_;
  int64_t max_running_ = 0;
  int64_t max_queue_ = 0;
};

}  // namespace dsinfer::server
