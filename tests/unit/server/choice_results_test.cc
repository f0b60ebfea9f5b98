// ChoiceResults: per-choice results of one request, and the ordering invariant that keeps a
// streaming response's head before its first chunk (n > 1: choice 0 may generate before choice 3
// is admitted; CI once saw a chunk-size line where the status line should have been).
#include "server/choice_results.h"

#include <gtest/gtest.h>

#include <thread>

namespace dsinfer::server {
namespace {

recipe::OutputEvent content(const char* text) {
  recipe::OutputEvent e;
  e.type = recipe::OutputEvent::Type::kContentDelta;
  e.text = text;
  return e;
}

TEST(ChoiceResults, NothingIsHandedOutBeforeEveryChoiceIsAccepted) {
  ChoiceResults r(3);
  EXPECT_FALSE(r.pending());
  r.on_accepted(0, 11);
  r.on_events(0, {content("a")});
  r.on_finished(0, Completion{});
  EXPECT_FALSE(r.pending());  // choices 1 and 2 are not admitted yet
  ChoiceResults::Snapshot s = r.take();
  EXPECT_FALSE(s.accepted);
  ASSERT_EQ(s.events.size(), 3u);
  for (const auto& ev : s.events) EXPECT_TRUE(ev.empty());
  for (const auto& f : s.finished) EXPECT_FALSE(f.has_value());
  EXPECT_FALSE(s.all_finished);

  r.on_accepted(1, 11);
  r.on_events(1, {content("b")});
  EXPECT_FALSE(r.pending());
  r.on_accepted(2, 11);
  EXPECT_TRUE(r.pending());
  s = r.take();
  EXPECT_TRUE(s.accepted);
  EXPECT_EQ(s.prompt_tokens, 11);
  ASSERT_EQ(s.events[0].size(), 1u);  // what was held back comes out, in order
  EXPECT_EQ(s.events[0][0].text, "a");
  ASSERT_EQ(s.events[1].size(), 1u);
  EXPECT_EQ(s.events[1][0].text, "b");
  EXPECT_TRUE(s.events[2].empty());
  EXPECT_TRUE(s.finished[0].has_value());
  EXPECT_FALSE(s.all_finished);
  EXPECT_FALSE(r.pending());

  r.on_finished(1, Completion{});
  r.on_finished(2, Completion{});
  EXPECT_TRUE(r.pending());
  s = r.take();
  EXPECT_TRUE(s.all_finished);
  EXPECT_FALSE(r.pending());
}

TEST(ChoiceResults, ARejectionIsHandedOutAtOnce) {
  ChoiceResults r(2);
  r.on_accepted(0, 5);
  r.on_events(0, {content("a")});
  r.on_rejected(invalid_argument("choice 1 refused"));
  r.on_rejected(invalid_argument("second"));  // the first one is kept
  EXPECT_TRUE(r.pending());
  ChoiceResults::Snapshot s = r.take();
  ASSERT_TRUE(s.rejected.has_value());
  EXPECT_NE(s.rejected->message().find("choice 1"), std::string::npos);
  EXPECT_FALSE(s.accepted);
  EXPECT_FALSE(r.pending());
}

TEST(ChoiceResults, ConcurrentReportsLoseNothing) {
  constexpr int kChoices = 4, kEvents = 2000;
  ChoiceResults r(kChoices);
  std::vector<std::thread> threads;
  for (int i = 0; i < kChoices; ++i) {
    threads.emplace_back([&r, i] {
      r.on_accepted(i, 1);
      for (int k = 0; k < kEvents; ++k) r.on_events(i, {content("x")});
      r.on_finished(i, Completion{});
    });
  }
  std::vector<size_t> got(kChoices, 0);
  bool done = false;
  while (!done) {
    ChoiceResults::Snapshot s = r.take();
    if (!s.accepted) {
      for (const auto& ev : s.events) EXPECT_TRUE(ev.empty());
    }
    for (int i = 0; i < kChoices; ++i) got[i] += s.events[i].size();
    done = s.all_finished;
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kChoices; ++i) EXPECT_EQ(got[i], static_cast<size_t>(kEvents)) << i;
}

}  // namespace
}  // namespace dsinfer::server
