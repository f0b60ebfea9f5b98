#include "server/choice_results.h"

#include <utility>

namespace dsinfer::server {

void ChoiceResults::on_accepted(size_t i, int64_t prompt_tokens) {
  std::lock_guard<std::mutex> l(mu_);
  choices_.at(i).accepted = true;
  prompt_tokens_ = prompt_tokens;
}

void ChoiceResults::on_rejected(const Status& status) {
  std::lock_guard<std::mutex> l(mu_);
  if (!rejected_)
    rejected_ = status;
}

void ChoiceResults::on_events(size_t i, std::vector<recipe::OutputEvent> events) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& e : events) choices_.at(i).events.push_back(std::move(e));
}

void ChoiceResults::on_finished(size_t i, const Completion& completion) {
  std::lock_guard<std::mutex> l(mu_);
  choices_.at(i).finished = completion;
}

bool ChoiceResults::all_accepted() const {
  for (const Choice& c : choices_)
    if (!c.accepted)
      return false;
  return true;
}

ChoiceResults::Snapshot ChoiceResults::take() {
  Snapshot s;
  std::lock_guard<std::mutex> l(mu_);
  s.accepted = all_accepted();
  s.prompt_tokens = prompt_tokens_;
  s.rejected = rejected_;
  reject_seen_ = rejected_.has_value();
  s.events.resize(choices_.size());
  s.finished.resize(choices_.size());
  if (!s.accepted)
    return s;  // held back until every choice is admitted (see the header)
  accept_seen_ = true;
  s.all_finished = true;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    s.events[i].swap(c.events);
    s.finished[i] = c.finished;
    s.all_finished = s.all_finished && c.finished.has_value();
    c.finish_seen = c.finished.has_value();
  }
  return s;
}

bool ChoiceResults::pending() {
  std::lock_guard<std::mutex> l(mu_);
  if (rejected_ && !reject_seen_)
    return true;
  if (!all_accepted())
    return false;
  if (!accept_seen_)
    return true;
  for (const Choice& c : choices_)
    if (!c.events.empty() || (c.finished && !c.finish_seen))
      return true;
  return false;
}

}  // namespace dsinfer::server
