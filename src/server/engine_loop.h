// EngineLoop: the thread-safe asynchronous layer over engine::Engine (which is single-threaded).
//
// One loop thread owns the Engine. Other threads talk to it only through an inbox (a mutex-
// guarded command list: submit, abort, abort-all, stop) and get results through a RequestSink per
// request, called on the loop thread. Each iteration the loop drains the inbox, aborts requests
// past their deadline, runs one engine step, then hands every request its new OutputEvents
// (tokens -> OutputPipeline, see generation.h) and finalizes the finished ones (release: their
// sequence state is freed at once). When there is nothing to run it sleeps on a condition variable.
//
// Admission is bounded: try_admit() reserves one of `capacity` slots (running + queued requests);
// the slot is returned when the request is rejected or finalized. A full loop is the caller's
// 429.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "recipe/output_parser.h"
#include "recipe/types.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace dsinfer::server {

using Clock = std::chrono::steady_clock;

// Why a request ended before its output did.
enum class EndCause { kNone, kDisconnect, kTimeout, kShutdown, kError };
const char* end_cause_name(EndCause c);  // "none", "disconnect", "timeout", "shutdown", "error"

struct Job {
  engine::RequestSpec spec;  // prompt, sampling, max_tokens, stop ids; the loop sets stop_checker
  recipe::OutputParserOptions parser;
  std::vector<int32_t> script;  // test-only scripted ids (ScriptedOutputs); empty: the model's
  double timeout_s = 0;         // from admission; 0 = none
  // Structured outputs: the grammar the answer content follows (the loop gives the request a
  // matcher over it); nullptr: unconstrained.
  std::shared_ptr<const grammar::Compiled> grammar;
  // Strict tool calls: the DSML tool-call block's grammar (grammar/tool_calls.h), switched on by
  // the DSML token that opens the block (`dsml_token`), or from the start when the prompt opened
  // it (parser.start kToolCalls); nullptr: tool calls are unconstrained.
  std::shared_ptr<const grammar::Compiled> tool_grammar;
  int32_t dsml_token = -1;
  // n > 1: the ticket of a job with the same prompt submitted earlier (choice 0) whose prompt
  // state this one shares while that one is still active (engine::RequestSpec::share_prompt_of).
  uint64_t share_prompt_ticket = 0;
  // false: the engine computes the tokens' logprobs (best_of's ranking) but the response does
  // not report them (the request did not ask).
  bool report_logprobs = true;
};

struct Completion {
  recipe::Usage usage;
  recipe::FinishReason finish = recipe::FinishReason::kStop;  // as the output parser reports it
  EndCause cause = EndCause::kNone;
  std::string error;      // engine error detail (cause kError)
  double ttft_s = -1;     // admission -> first token; < 0 when none
  double duration_s = 0;  // admission -> finalized
  // Sum of the generated tokens' logprobs (0 unless the request's sampling computes them).
  double cumulative_logprob = 0;
};

// Receives one request's results, on the loop thread (implementations must not block): first
// on_accepted or on_rejected; after on_accepted, on_events zero or more times, then on_finished
// exactly once (also after an abort).
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void on_accepted(int64_t prompt_tokens) = 0;
  virtual void on_rejected(const Status& status) = 0;
  virtual void on_events(std::vector<recipe::OutputEvent> events) = 0;
  virtual void on_finished(const Completion& completion) = 0;
};

class EngineLoop {
 public:
  // `tokenizer` and `metrics` must outlive the loop. `step_delay_s` (test-only) sleeps after
  // every engine step so lifecycle tests can catch requests mid-flight.
  EngineLoop(std::unique_ptr<engine::Engine> engine,
             const tokenizer::Tokenizer& tokenizer,
             Metrics* metrics,
             int64_t capacity,
             double step_delay_s = 0);
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  void start();
  // Aborts whatever is left (EndCause::kShutdown), then joins the loop thread. Idempotent.
  void stop();

  // Reserves an admission slot; false when `capacity` requests are in flight.
  bool try_admit();
  // Returns a slot reserved with try_admit() that will not be submitted.
  void cancel_admission();
  // Queues an admitted request; returns its ticket (for abort()). After stop(), the sink is
  // rejected at once.
  uint64_t submit(Job job, std::shared_ptr<RequestSink> sink);
  // Ends a request early (no-op when it has already finished).
  void abort(uint64_t ticket, EndCause cause);
  void abort_all(EndCause cause);

  int64_t in_flight() const { return in_flight_.load(); }
  int64_t capacity() const { return capacity_; }
  // Immutable after construction; safe from any thread.
  const model::ModelConfig& model_config() const { return model_config_; }
  // Called once, from the loop thread, when the backend's device fails (every request has been
  // failed with the device error; later submits are rejected with it). The server uses it to
  // shut down. Set before start().
  void set_on_fatal(std::function<void(const Status&)> f) { on_fatal_ = std::move(f); }
  // The device failure, OK while healthy.
  Status fatal() const {
    std::lock_guard<std::mutex> l(mu_);
    return fatal_;
  }

 private:
  struct Active;
  struct Command {
    enum class Kind { kSubmit, kAbort, kAbortAll } kind = Kind::kSubmit;
    uint64_t ticket = 0;
    EndCause cause = EndCause::kNone;
    Job job;
    std::shared_ptr<RequestSink> sink;
    Clock::time_point admitted;
  };

  void run();
  void handle(Command& c);
  void on_token(Active& a, const engine::TokenEvent& ev);
  void abort_active(Active& a, EndCause cause);
  void deliver();
  void finalize(uint64_t ticket);
  void publish();

  std::unique_ptr<engine::Engine> engine_;
  const tokenizer::Tokenizer& tok_;
  Metrics* metrics_;
  const int64_t capacity_;
  const double step_delay_s_;
  const model::ModelConfig model_config_;

  std::atomic<int64_t> in_flight_{0};
  std::atomic<uint64_t> next_ticket_{1};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status fatal_;  // guarded by mu_
  std::function<void(const Status&)> on_fatal_;
  std::vector<Command> inbox_;  // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  bool stopped_ = false;        // guarded by mu_: the loop no longer reads the inbox

  // Loop thread only.
  std::map<uint64_t, std::unique_ptr<Active>> active_;
  std::thread thread_;
};

}  // namespace dsinfer::server
