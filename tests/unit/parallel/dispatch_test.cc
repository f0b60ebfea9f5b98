// Expert parallelism, host side: the partition (sizes, ownership, bad input), dispatch and
// receive plans on random routings against independent sorts (every pair delivered exactly once
// to its expert's owner, orders as specified, dropped ids, n = 0, k up to 8, one rank = the
// single-GPU grouping), the checkers catching corrupted plans, and the EP reference against a
// direct single-rank MoE with a synthetic row-wise expert, bit for bit.
#include "parallel/dispatch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "parallel/moe_reference.h"

namespace dsinfer::parallel {
namespace {

ExpertPartition partition(int64_t n_experts, int ranks) {
  auto p = ExpertPartition::make(n_experts, ranks);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return std::move(p).value();
}

// ---------------------------------------------------------------------------------------------
// Partition

TEST(ExpertPartitionTest, ShardsAreContiguousBalancedAndOwned) {
  for (int64_t n_exp = 1; n_exp <= 384; ++n_exp) {
    for (int ranks = 1; ranks <= std::min<int64_t>(8, n_exp); ++ranks) {
      const ExpertPartition p = partition(n_exp, ranks);
      ASSERT_EQ(p.n_experts(), n_exp);
      ASSERT_EQ(p.ranks(), ranks);
      int64_t lo = n_exp, hi = 0;
      ASSERT_EQ(p.first(0), 0);
      for (int r = 0; r < ranks; ++r) {
        ASSERT_GE(p.count(r), 1);
        ASSERT_EQ(p.first(r + 1), p.first(r) + p.count(r)) << n_exp << " experts, rank " << r;
        lo = std::min(lo, p.count(r));
        hi = std::max(hi, p.count(r));
        // The bigger shards come first.
        if (r > 0) {
          ASSERT_LE(p.count(r), p.count(r - 1));
        }
      }
      ASSERT_EQ(p.first(ranks), n_exp);
      ASSERT_LE(hi - lo, 1) << n_exp << " experts over " << ranks;
      int prev = 0;
      for (int64_t e = 0; e < n_exp; ++e) {
        const int o = p.owner(e);
        ASSERT_TRUE(o >= prev && o < ranks);
        ASSERT_GE(e, p.first(o));
        ASSERT_LT(e, p.first(o) + p.count(o));
        ASSERT_EQ(p.local(e), e - p.first(o));
        prev = o;
      }
    }
  }
}

TEST(ExpertPartitionTest, KnownShapes) {
  const ExpertPartition flash = partition(256, 8);  // V4-Flash: 32 experts per GPU
  for (int r = 0; r < 8; ++r) EXPECT_EQ(flash.count(r), 32);
  const ExpertPartition pro = partition(384, 8);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(pro.count(r), 48);
  const ExpertPartition uneven = partition(10, 4);
  EXPECT_EQ(uneven.count(0), 3);
  EXPECT_EQ(uneven.count(1), 3);
  EXPECT_EQ(uneven.count(2), 2);
  EXPECT_EQ(uneven.count(3), 2);
  EXPECT_EQ(uneven.owner(5), 1);
  EXPECT_EQ(uneven.owner(6), 2);
  EXPECT_EQ(uneven.local(9), 1);
  const ExpertPartition thirds = partition(256, 3);
  EXPECT_EQ(thirds.count(0), 86);
  EXPECT_EQ(thirds.count(1), 85);
  EXPECT_EQ(thirds.first(2), 171);
  const ExpertPartition one = partition(7, 1);
  EXPECT_EQ(one.count(0), 7);
  for (int64_t e = 0; e < 7; ++e) EXPECT_EQ(one.local(e), e);
  const ExpertPartition each = partition(5, 5);
  for (int64_t e = 0; e < 5; ++e) EXPECT_EQ(each.owner(e), e);
}

TEST(ExpertPartitionTest, BadInputIsAnError) {
  struct Case {
    int64_t n_experts;
    int ranks;
    const char* message;
  };
  const Case cases[] = {
      {0, 1, "n_experts"},
      {-3, 1, "n_experts"},
      {int64_t{1} << 31, 1, "n_experts"},
      {8, 0, "ranks must be >= 1"},
      {8, -2, "ranks must be >= 1"},
      {4, 5, "every rank must own at least one expert"},
      {1, 2, "every rank must own at least one expert"},
  };
  for (const Case& c : cases) {
    auto p = ExpertPartition::make(c.n_experts, c.ranks);
    ASSERT_FALSE(p.ok()) << c.n_experts << " experts, " << c.ranks << " ranks";
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(c.message), std::string::npos) << p.status().message();
  }
  EXPECT_TRUE(ExpertPartition::make(int64_t{1} << 30, 8).ok());
}

TEST(ExpertPartitionDeathTest, OutOfRangeQueriesAbort) {
  const ExpertPartition p = partition(10, 4);
  EXPECT_DEATH((void)p.owner(10), "outside");
  EXPECT_DEATH((void)p.owner(-1), "outside");
  EXPECT_DEATH((void)p.count(4), "outside");
}

// ---------------------------------------------------------------------------------------------
// Dispatch and receive on random routings

// Ids in [0, n_exp), with a fraction of invalid ones (negative or >= n_exp), duplicates allowed
// (hash routing tables may repeat an expert within a token).
std::vector<int32_t> random_ids(
    std::mt19937& rng, int64_t n, int64_t k, int64_t n_exp, double invalid) {
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n_exp - 1));
  std::bernoulli_distribution bad(invalid);
  std::uniform_int_distribution<int> which(0, 2);
  for (auto& id : ids) {
    if (bad(rng)) {
      const int w = which(rng);
      id = w == 0 ? -1 : w == 1 ? static_cast<int32_t>(n_exp) : 1 << 30;
    } else {
      id = pick(rng);
    }
  }
  return ids;
}

struct Routing {
  std::vector<int32_t> ids;  // [n, k]
  int64_t n = 0;
};

// Dispatches every rank's routing, delivers the blocks, plans every receive and checks the
// whole exchange against independent sorts.
void check_exchange(const ExpertPartition& part, const std::vector<Routing>& routing, int64_t k) {
  const int ranks = part.ranks();
  std::vector<DispatchPlan> plans;
  for (int s = 0; s < ranks; ++s) {
    const Routing& r = routing[s];
    plans.push_back(plan_dispatch(part, r.ids.data(), r.n, k));
    const DispatchPlan& plan = plans.back();
    plan.check(part, r.ids.data());
    // Expected send order: kept pairs sorted by (owner, expert, p).
    std::vector<std::tuple<int, int32_t, int32_t>> want;
    int64_t dropped = 0;
    for (int64_t p = 0; p < r.n * k; ++p) {
      const int32_t e = r.ids[p];
      if (part.valid(e)) {
        want.emplace_back(part.owner(e), e, static_cast<int32_t>(p));
      } else {
        ++dropped;
        ASSERT_EQ(plan.pair_position[p], -1);
      }
    }
    std::sort(want.begin(), want.end());
    ASSERT_EQ(plan.num_sent(), static_cast<int64_t>(want.size()));
    ASSERT_EQ(plan.num_dropped(), dropped);
    for (size_t j = 0; j < want.size(); ++j) {
      ASSERT_EQ(plan.send_pair[j], std::get<2>(want[j]));
      ASSERT_EQ(plan.send_expert[j], std::get<1>(want[j]));
      const int d = std::get<0>(want[j]);
      ASSERT_TRUE(plan.send_offsets[d] <= static_cast<int64_t>(j) &&
                  static_cast<int64_t>(j) < plan.send_offsets[d + 1]);
    }
    // Combine order: per token, its kept slots by (expert, slot).
    for (int64_t t = 0; t < r.n; ++t) {
      std::vector<std::pair<int32_t, int64_t>> slots;
      for (int64_t i = 0; i < k; ++i) {
        if (part.valid(r.ids[t * k + i]))
          slots.emplace_back(r.ids[t * k + i], t * k + i);
      }
      std::sort(slots.begin(), slots.end());
      ASSERT_EQ(plan.combine_begin[t + 1] - plan.combine_begin[t],
                static_cast<int64_t>(slots.size()));
      for (size_t c = 0; c < slots.size(); ++c) {
        const int32_t j = plan.combine_position[plan.combine_begin[t] + static_cast<int64_t>(c)];
        ASSERT_EQ(plan.send_pair[j], slots[c].second);
      }
    }
  }

  // Delivery: each destination receives one block per source; every kept (source, pair) must
  // arrive exactly once, at the owner of its expert.
  std::set<std::pair<int, int32_t>> delivered;
  for (int d = 0; d < ranks; ++d) {
    std::vector<std::vector<int32_t>> received(static_cast<size_t>(ranks));
    std::vector<std::pair<int, int32_t>> arrival;  // (source, pair) per arrival index
    for (int s = 0; s < ranks; ++s) {
      const DispatchPlan& plan = plans[s];
      for (int64_t j = plan.send_offsets[d]; j < plan.send_offsets[d + 1]; ++j) {
        received[s].push_back(plan.send_expert[j]);
        arrival.emplace_back(s, plan.send_pair[j]);
      }
    }
    const ReceivePlan rp = plan_receive(part, d, received);
    rp.check(part, received);
    ASSERT_EQ(rp.num_local, part.count(d));
    ASSERT_EQ(rp.num_received(), static_cast<int64_t>(arrival.size()));
    // Expected grouped order: stable sort of arrival indices by local expert.
    std::vector<int32_t> want(arrival.size());
    for (size_t a = 0; a < want.size(); ++a) want[a] = static_cast<int32_t>(a);
    std::vector<int32_t> flat;
    for (const auto& blk : received) flat.insert(flat.end(), blk.begin(), blk.end());
    std::stable_sort(
        want.begin(), want.end(), [&](int32_t a, int32_t b) { return flat[a] < flat[b]; });
    ASSERT_EQ(rp.order, want);
    for (int64_t l = 0; l < rp.num_local; ++l) {
      for (int64_t g = rp.expert_begin[l]; g < rp.expert_begin[l + 1]; ++g) {
        const auto [s, p] = arrival[rp.order[g]];
        ASSERT_EQ(routing[s].ids[p], part.first(d) + l);
        ASSERT_TRUE(delivered.emplace(s, p).second) << "pair delivered twice";
      }
    }
  }
  int64_t kept = 0;
  for (int s = 0; s < ranks; ++s) {
    for (int64_t p = 0; p < routing[s].n * k; ++p) {
      if (part.valid(routing[s].ids[p])) {
        ++kept;
        ASSERT_TRUE(delivered.count({s, static_cast<int32_t>(p)})) << "pair never delivered";
      }
    }
  }
  ASSERT_EQ(static_cast<int64_t>(delivered.size()), kept);
}

TEST(DispatchTest, RandomRoutingsAreDeliveredExactlyOnceInOrder) {
  std::mt19937 rng(1234);
  const int64_t expert_counts[] = {1, 2, 3, 4, 7, 16, 33, 256, 384};
  const int64_t token_counts[] = {0, 1, 5, 33, 200};
  int cases = 0;
  for (int64_t n_exp : expert_counts) {
    for (int ranks = 1; ranks <= std::min<int64_t>(8, n_exp); ++ranks) {
      const ExpertPartition part = partition(n_exp, ranks);
      for (int64_t k = 1; k <= 8; k += (k < 2 ? 1 : 3)) {  // 1, 2, 5, 8
        for (double invalid : {0.0, 0.05}) {
          std::vector<Routing> routing(static_cast<size_t>(ranks));
          for (int s = 0; s < ranks; ++s) {
            routing[s].n = token_counts[(s + cases) % 5];
            routing[s].ids = random_ids(rng, routing[s].n, k, n_exp, invalid);
          }
          SCOPED_TRACE(testing::Message() << n_exp << " experts, " << ranks << " ranks, k " << k
                                          << ", invalid " << invalid);
          check_exchange(part, routing, k);
          if (testing::Test::HasFatalFailure())
            return;
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 200);
}

TEST(DispatchTest, NoTokensAnywhere) {
  const ExpertPartition part = partition(16, 4);
  const DispatchPlan plan = plan_dispatch(part, nullptr, 0, 6);
  plan.check(part, nullptr);
  EXPECT_EQ(plan.num_sent(), 0);
  EXPECT_EQ(plan.send_offsets, std::vector<int64_t>(5, 0));
  EXPECT_EQ(plan.combine_begin, std::vector<int64_t>{0});
  const std::vector<std::vector<int32_t>> nothing(4);
  const ReceivePlan rp = plan_receive(part, 2, nothing);
  rp.check(part, nothing);
  EXPECT_EQ(rp.num_received(), 0);
  EXPECT_EQ(rp.expert_begin, std::vector<int64_t>(static_cast<size_t>(part.count(2) + 1), 0));
}

TEST(DispatchTest, AllIdsInvalidDropsEverything) {
  const ExpertPartition part = partition(8, 3);
  const std::vector<int32_t> ids = {-1, 8, 100, -7, 8, 9};
  const DispatchPlan plan = plan_dispatch(part, ids.data(), 3, 2);
  plan.check(part, ids.data());
  EXPECT_EQ(plan.num_sent(), 0);
  EXPECT_EQ(plan.num_dropped(), 6);
  EXPECT_EQ(plan.pair_position, std::vector<int32_t>(6, -1));
  EXPECT_EQ(plan.combine_begin, std::vector<int64_t>(4, 0));
}

// One rank: the send order is the single-GPU grouping (launch_moe_group: stable sort of the
// pairs by expert) and the receive side is the identity on it.
TEST(DispatchTest, OneRankIsTheSingleGpuGrouping) {
  std::mt19937 rng(7);
  for (int64_t n_exp : {1, 7, 256}) {
    const ExpertPartition part = partition(n_exp, 1);
    for (int64_t k : {1, 3, 8}) {
      const int64_t n = 57;
      const std::vector<int32_t> ids = random_ids(rng, n, k, n_exp, 0.03);
      const DispatchPlan plan = plan_dispatch(part, ids.data(), n, k);
      plan.check(part, ids.data());
      // The single-GPU grouping, written as launch_moe_group's contract.
      std::vector<int64_t> expert_begin(static_cast<size_t>(n_exp + 1), 0);
      for (int32_t e : ids) {
        if (e >= 0 && e < n_exp)
          ++expert_begin[e + 1];
      }
      for (int64_t e = 0; e < n_exp; ++e) expert_begin[e + 1] += expert_begin[e];
      std::vector<int32_t> pair_src;
      for (int64_t e = 0; e < n_exp; ++e) {
        for (int64_t p = 0; p < n * k; ++p) {
          if (ids[p] == e)
            pair_src.push_back(static_cast<int32_t>(p));
        }
      }
      EXPECT_EQ(plan.send_pair, pair_src);
      ASSERT_EQ(plan.send_counts.size(), 1u);
      EXPECT_EQ(plan.send_counts[0], expert_begin[n_exp]);
      const std::vector<std::vector<int32_t>> received = {plan.send_expert};
      const ReceivePlan rp = plan_receive(part, 0, received);
      rp.check(part, received);
      EXPECT_EQ(rp.expert_begin, expert_begin);
      for (size_t g = 0; g < rp.order.size(); ++g) {
        EXPECT_EQ(rp.order[g], static_cast<int32_t>(g));
        EXPECT_EQ(rp.grouped_position[g], static_cast<int32_t>(g));
      }
    }
  }
}

TEST(DispatchTest, SmallExampleByHand) {
  // 5 experts over 2 ranks: rank 0 owns {0, 1, 2}, rank 1 owns {3, 4}. k = 2.
  const ExpertPartition part = partition(5, 2);
  const std::vector<int32_t> ids = {4,
                                    1,  // token 0
                                    0,
                                    4,  // token 1
                                    -1,
                                    2,  // token 2 (slot 0 dropped)
                                    3,
                                    3};  // token 3 (same expert twice)
  const DispatchPlan plan = plan_dispatch(part, ids.data(), 4, 2);
  plan.check(part, ids.data());
  EXPECT_EQ(plan.send_counts, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(plan.send_offsets, (std::vector<int64_t>{0, 3, 7}));
  EXPECT_EQ(plan.send_pair, (std::vector<int32_t>{2, 1, 5, 6, 7, 0, 3}));
  EXPECT_EQ(plan.send_expert, (std::vector<int32_t>{0, 1, 2, 3, 3, 4, 4}));
  EXPECT_EQ(plan.pair_position, (std::vector<int32_t>{5, 1, 0, 6, -1, 2, 3, 4}));
  EXPECT_EQ(plan.combine_begin, (std::vector<int64_t>{0, 2, 4, 5, 7}));
  EXPECT_EQ(plan.combine_position, (std::vector<int32_t>{1, 5, 0, 6, 2, 3, 4}));
  // Rank 1 receives from itself (above) and from a rank 0 that sent {4, 3, 4}.
  const std::vector<std::vector<int32_t>> received = {{3, 4, 4}, {3, 3, 4, 4}};
  const ReceivePlan rp = plan_receive(part, 1, received);
  rp.check(part, received);
  EXPECT_EQ(rp.recv_offsets, (std::vector<int64_t>{0, 3, 7}));
  EXPECT_EQ(rp.expert_begin, (std::vector<int64_t>{0, 3, 7}));
  EXPECT_EQ(rp.order, (std::vector<int32_t>{0, 3, 4, 1, 2, 5, 6}));
  EXPECT_EQ(rp.grouped_position, (std::vector<int32_t>{0, 3, 4, 1, 2, 5, 6}));
}

// ---------------------------------------------------------------------------------------------
// The checkers catch corrupted plans.

TEST(DispatchDeathTest, CheckersCatchCorruption) {
  const ExpertPartition part = partition(5, 2);
  const std::vector<int32_t> ids = {4, 1, 0, 4, -1, 2, 3, 3};
  const DispatchPlan good = plan_dispatch(part, ids.data(), 4, 2);
  {
    DispatchPlan bad = good;  // two pairs swapped within a block
    std::swap(bad.send_pair[0], bad.send_pair[1]);
    EXPECT_DEATH(bad.check(part, ids.data()), "");
  }
  {
    DispatchPlan bad = good;  // a pair in the wrong destination's block
    bad.send_counts = {4, 3};
    bad.send_offsets = {0, 4, 7};
    EXPECT_DEATH(bad.check(part, ids.data()), "sent to rank");
  }
  {
    DispatchPlan bad = good;  // a dropped pair with a position
    bad.pair_position[4] = 0;
    EXPECT_DEATH(bad.check(part, ids.data()), "invalid expert");
  }
  {
    DispatchPlan bad = good;  // combine order reversed for token 0
    std::swap(bad.combine_position[0], bad.combine_position[1]);
    EXPECT_DEATH(bad.check(part, ids.data()), "combine order");
  }
  std::vector<int32_t> changed = ids;  // the plan no longer matches the routing
  changed[0] = 3;
  EXPECT_DEATH(good.check(part, changed.data()), "");

  const std::vector<std::vector<int32_t>> received = {{3, 4, 4}, {3, 3, 4, 4}};
  const ReceivePlan rp = plan_receive(part, 1, received);
  {
    ReceivePlan bad = rp;  // arrival order broken within an expert
    std::swap(bad.order[0], bad.order[1]);
    std::swap(bad.grouped_position[0], bad.grouped_position[3]);
    EXPECT_DEATH(bad.check(part, received), "");
  }
  {
    ReceivePlan bad = rp;  // the inverse is not the inverse
    std::swap(bad.grouped_position[5], bad.grouped_position[6]);
    EXPECT_DEATH(bad.check(part, received), "grouped_position");
  }
  // A pair for an expert the rank does not own.
  EXPECT_DEATH((void)plan_receive(part, 1, {{3, 2}, {}}), "does not own");
}

// ---------------------------------------------------------------------------------------------
// The EP reference against a direct single-rank MoE, with a synthetic row-wise expert.

// Row-independent, nonlinear in x, gate and expert id; wide magnitudes so that a different
// accumulation order would change bits.
void synthetic_expert(
    int64_t e, const float* x, int64_t m, const float* g, int64_t hidden, float* out) {
  for (int64_t r = 0; r < m; ++r) {
    float acc = 0.0f;
    for (int64_t h = 0; h < hidden; ++h) acc += x[r * hidden + h] * static_cast<float>(h % 5 - 2);
    for (int64_t h = 0; h < hidden; ++h) {
      const float v = std::sin(x[r * hidden + h] * static_cast<float>(e + 1) * 0.731f + acc);
      out[r * hidden + h] += v * g[r] * std::exp2(static_cast<float>((e * 7 + h) % 17) - 8.0f);
    }
  }
}

// CpuModel::moe's loop structure: out = shared, then for each expert ascending its rows (token
// ascending, slot ascending) through the expert, added to the tokens.
std::vector<float> direct_moe(const std::vector<float>& x,
                              const std::vector<int32_t>& ids,
                              const std::vector<float>& gates,
                              const std::vector<float>& shared,
                              int64_t n,
                              int64_t k,
                              int64_t hidden,
                              int64_t n_exp) {
  std::vector<float> out = shared;
  for (int64_t e = 0; e < n_exp; ++e) {
    std::vector<int64_t> rows;
    std::vector<float> xs, gs;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < k; ++i) {
        if (ids[t * k + i] == e) {
          rows.push_back(t);
          gs.push_back(gates[t * k + i]);
          xs.insert(xs.end(), x.begin() + t * hidden, x.begin() + (t + 1) * hidden);
        }
      }
    }
    if (rows.empty())
      continue;
    const int64_t m = static_cast<int64_t>(rows.size());
    std::vector<float> ys(static_cast<size_t>(m * hidden), 0.0f);
    synthetic_expert(e, xs.data(), m, gs.data(), hidden, ys.data());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t h = 0; h < hidden; ++h) out[rows[r] * hidden + h] += ys[r * hidden + h];
    }
  }
  return out;
}

TEST(MoeReferenceTest, SyntheticExpertsBitIdenticalAcrossRankCounts) {
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t hidden = 24;
  for (int64_t n_exp : {4, 16, 256, 384}) {
    for (int64_t k : {1, 2, 6, 8}) {
      // Tokens of four "sequences"; ranks own whole sequences (DP attention).
      const std::vector<int64_t> seq = {13, 0, 29, 5};
      int64_t n = 0;
      for (int64_t s : seq) n += s;
      std::vector<float> x(static_cast<size_t>(n * hidden)), shared(x.size());
      for (auto& v : x) v = normal(rng);
      for (auto& v : shared) v = normal(rng) * 4.0f;
      const std::vector<int32_t> ids = random_ids(rng, n, k, n_exp, 0.02);
      std::vector<float> gates(ids.size());
      for (auto& g : gates) g = std::fabs(normal(rng));
      const std::vector<float> want = direct_moe(x, ids, gates, shared, n, k, hidden, n_exp);

      for (int ranks = 1; ranks <= 8; ++ranks) {
        if (ranks > n_exp)
          break;
        const ExpertPartition part = partition(n_exp, ranks);
        // Sequence s goes to rank s % ranks; ranks beyond the sequences hold no tokens.
        std::vector<std::vector<int64_t>> owned(static_cast<size_t>(ranks));
        {
          int64_t t0 = 0;
          for (size_t s = 0; s < seq.size(); ++s) {
            for (int64_t t = t0; t < t0 + seq[s]; ++t) owned[s % ranks].push_back(t);
            t0 += seq[s];
          }
        }
        std::vector<std::vector<float>> rx(ranks), rg(ranks), rs(ranks);
        std::vector<std::vector<int32_t>> ri(ranks);
        std::vector<RankMoeInput> inputs(static_cast<size_t>(ranks));
        for (int r = 0; r < ranks; ++r) {
          for (int64_t t : owned[r]) {
            rx[r].insert(rx[r].end(), x.begin() + t * hidden, x.begin() + (t + 1) * hidden);
            rs[r].insert(
                rs[r].end(), shared.begin() + t * hidden, shared.begin() + (t + 1) * hidden);
            ri[r].insert(ri[r].end(), ids.begin() + t * k, ids.begin() + (t + 1) * k);
            rg[r].insert(rg[r].end(), gates.begin() + t * k, gates.begin() + (t + 1) * k);
          }
          inputs[r] = {rx[r], ri[r], rg[r], rs[r]};
        }
        const auto got = moe_expert_parallel_reference(
            part,
            inputs,
            k,
            hidden,
            [&](int64_t e, const float* xr, int64_t m, const float* g, float* o) {
              synthetic_expert(e, xr, m, g, hidden, o);
            });
        ASSERT_EQ(got.size(), static_cast<size_t>(ranks));
        int64_t mismatches = 0;
        for (int r = 0; r < ranks; ++r) {
          ASSERT_EQ(got[r].size(), owned[r].size() * hidden);
          for (size_t i = 0; i < owned[r].size(); ++i) {
            for (int64_t h = 0; h < hidden; ++h) {
              const float a = got[r][i * hidden + h];
              const float b = want[owned[r][i] * hidden + h];
              mismatches += std::memcmp(&a, &b, sizeof(float)) != 0 ? 1 : 0;
            }
          }
        }
        EXPECT_EQ(mismatches, 0) << n_exp << " experts, k " << k << ", " << ranks << " ranks";
      }
    }
  }
}

// The bit-identity above is not vacuous: adding the same routed outputs in descending expert
// order changes bits.
TEST(MoeReferenceTest, AccumulationOrderMatters) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t hidden = 24, n = 40, k = 6, n_exp = 16;
  std::vector<float> x(static_cast<size_t>(n * hidden)), shared(x.size());
  for (auto& v : x) v = normal(rng);
  for (auto& v : shared) v = normal(rng) * 4.0f;
  const std::vector<int32_t> ids = random_ids(rng, n, k, n_exp, 0.0);
  std::vector<float> gates(ids.size(), 0.5f);
  const std::vector<float> want = direct_moe(x, ids, gates, shared, n, k, hidden, n_exp);
  std::vector<float> reversed = shared;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<std::pair<int32_t, int64_t>> slots;
    for (int64_t i = 0; i < k; ++i) slots.emplace_back(ids[t * k + i], i);
    std::sort(slots.rbegin(), slots.rend());
    for (const auto& [e, i] : slots) {
      std::vector<float> y(static_cast<size_t>(hidden), 0.0f);
      synthetic_expert(e, x.data() + t * hidden, 1, &gates[t * k + i], hidden, y.data());
      for (int64_t h = 0; h < hidden; ++h) reversed[t * hidden + h] += y[h];
    }
  }
  int64_t differ = 0;
  for (size_t i = 0; i < want.size(); ++i) differ += want[i] != reversed[i] ? 1 : 0;
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace dsinfer::parallel
