// One HTTP request's results as the engine loop reports them, gathered per choice (Chat `n` > 1
// runs one engine request per choice) and handed to the connection in snapshots. Thread-safe:
// the loop thread reports, the connection's strand takes.
//
// Ordering invariant: nothing of a request (no event, no finish) is handed out before every
// choice is accepted, so a streaming response's status line always precedes its first chunk
// even when choice 0 is already generating while choice 3 is still being admitted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "base/status.h"
#include "recipe/types.h"
#include "server/engine_loop.h"

namespace dsinfer::server {

class ChoiceResults {
 public:
  explicit ChoiceResults(size_t choices) : choices_(choices) {}

  void on_accepted(size_t i, int64_t prompt_tokens);
  void on_rejected(const Status& status);  // the first rejection of any choice is kept
  void on_events(size_t i, std::vector<recipe::OutputEvent> events);
  void on_finished(size_t i, const Completion& completion);

  struct Snapshot {
    bool accepted = false;  // every choice (events and finishes are only handed out then)
    int64_t prompt_tokens = 0;
    std::optional<Status> rejected;                        // any choice
    std::vector<std::vector<recipe::OutputEvent>> events;  // per choice, new since the last take
    std::vector<std::optional<Completion>> finished;       // per choice
    bool all_finished = false;
  };
  // Everything new since the last take().
  Snapshot take();
  // Whether take() would return something new.
  bool pending();

  size_t choices() const { return choices_.size(); }

 private:
  struct Choice {
    bool accepted = false;
    std::vector<recipe::OutputEvent> events;
    std::optional<Completion> finished;
    bool finish_seen = false;  // take() has returned `finished`
  };
  bool all_accepted() const;  // under mu_

  std::mutex mu_;
  std::vector<Choice> choices_;
  bool accept_seen_ = false;
  bool reject_seen_ = false;
  int64_t prompt_tokens_ = 0;
  std::optional<Status> rejected_;
};

}  // namespace dsinfer::server
