#include "parallel/dispatch.h"

#include <algorithm>
#include <limits>
#include <string>

#include "base/check.h"

namespace dsinfer::parallel {

namespace {
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
}  // namespace

// ---------------------------------------------------------------------------------------------
// ExpertPartition

ExpertPartition::ExpertPartition(int64_t n_experts, int ranks)
    : n_experts_(n_experts), ranks_(ranks), base_(n_experts / ranks), rem_(n_experts % ranks) {}

Result<ExpertPartition> ExpertPartition::make(int64_t n_experts, int ranks) {
  if (n_experts < 1 || n_experts > kMaxInt32) {
    return invalid_argument("expert partition: n_experts must be in [1, 2^31-1], got " +
                            std::to_string(n_experts));
  }
  if (ranks < 1) {
    return invalid_argument("expert partition: ranks must be >= 1, got " + std::to_string(ranks));
  }
  if (ranks > n_experts) {
    return invalid_argument("expert partition: " + std::to_string(ranks) + " ranks for " +
                            std::to_string(n_experts) +
                            " experts; every rank must own at least one expert");
  }
  return ExpertPartition(n_experts, ranks);
}

int ExpertPartition::owner(int64_t e) const {
  DSI_CHECK(valid(e),
            "expert %lld outside [0, %lld)",
            static_cast<long long>(e),
            static_cast<long long>(n_experts_));
  const int64_t big = rem_ * (base_ + 1);  // experts owned by the ranks with one more
  if (e < big)
    return static_cast<int>(e / (base_ + 1));
  return static_cast<int>(rem_ + (e - big) / base_);
}

int64_t ExpertPartition::first(int rank) const {
  DSI_CHECK(rank >= 0 && rank <= ranks_, "rank %d outside [0, %d]", rank, ranks_);
  return rank * base_ + std::min<int64_t>(rank, rem_);
}

int64_t ExpertPartition::count(int rank) const {
  DSI_CHECK(rank >= 0 && rank < ranks_, "rank %d outside [0, %d)", rank, ranks_);
  return base_ + (rank < rem_ ? 1 : 0);
}

// ---------------------------------------------------------------------------------------------
// Dispatch (source side)

DispatchPlan plan_dispatch(const ExpertPartition& part,
                           const int32_t* expert_ids,
                           int64_t n,
                           int64_t k) {
  DSI_CHECK(
      n >= 0 && k >= 1, "n %lld, k %lld", static_cast<long long>(n), static_cast<long long>(k));
  DSI_CHECK(n * k <= kMaxInt32, "n * k = %lld pairs exceed int32", static_cast<long long>(n * k));
  DSI_CHECK(n == 0 || expert_ids != nullptr, "expert_ids is null");
  const int64_t pairs = n * k;
  const int64_t n_exp = part.n_experts();
  DispatchPlan plan;
  plan.ranks = part.ranks();
  plan.n = n;
  plan.k = k;

  // Stable counting sort of the kept pairs by expert: ascending (expert, p).
  std::vector<int64_t> begin(static_cast<size_t>(n_exp + 1), 0);
  for (int64_t p = 0; p < pairs; ++p) {
    if (part.valid(expert_ids[p]))
      ++begin[static_cast<size_t>(expert_ids[p]) + 1];
  }
  for (int64_t e = 0; e < n_exp; ++e) begin[e + 1] += begin[e];
  const int64_t kept = begin[static_cast<size_t>(n_exp)];
  plan.send_pair.resize(static_cast<size_t>(kept));
  plan.send_expert.resize(static_cast<size_t>(kept));
  plan.pair_position.assign(static_cast<size_t>(pairs), -1);
  std::vector<int64_t> next(begin.begin(), begin.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = expert_ids[p];
    if (!part.valid(e))
      continue;
    const int64_t j = next[static_cast<size_t>(e)]++;
    plan.send_pair[j] = static_cast<int32_t>(p);
    plan.send_expert[j] = e;
    plan.pair_position[p] = static_cast<int32_t>(j);
  }

  // Contiguous ascending shards: destination d's block is its experts' ranges, back to back.
  plan.send_counts.resize(static_cast<size_t>(plan.ranks));
  plan.send_offsets.resize(static_cast<size_t>(plan.ranks) + 1);
  for (int d = 0; d <= plan.ranks; ++d) plan.send_offsets[d] = begin[part.first(d)];
  for (int d = 0; d < plan.ranks; ++d)
    plan.send_counts[d] = plan.send_offsets[d + 1] - plan.send_offsets[d];

  // Combine order: a stable counting sort of the send positions by token. The send order is
  // ascending (expert, p), so each token's positions come out in ascending (expert, slot).
  plan.combine_begin.assign(static_cast<size_t>(n + 1), 0);
  for (int64_t j = 0; j < kept; ++j) ++plan.combine_begin[plan.send_pair[j] / k + 1];
  for (int64_t t = 0; t < n; ++t) plan.combine_begin[t + 1] += plan.combine_begin[t];
  plan.combine_position.resize(static_cast<size_t>(kept));
  std::vector<int64_t> fill(plan.combine_begin.begin(), plan.combine_begin.end() - 1);
  for (int64_t j = 0; j < kept; ++j) {
    plan.combine_position[fill[plan.send_pair[j] / k]++] = static_cast<int32_t>(j);
  }
  return plan;
}

void DispatchPlan::check(const ExpertPartition& part, const int32_t* expert_ids) const {
  DSI_CHECK(ranks == part.ranks(), "plan for %d ranks, partition has %d", ranks, part.ranks());
  DSI_CHECK(
      n >= 0 && k >= 1, "n %lld, k %lld", static_cast<long long>(n), static_cast<long long>(k));
  const int64_t pairs = n * k;
  DSI_CHECK(n == 0 || expert_ids != nullptr, "expert_ids is null");
  DSI_CHECK(send_counts.size() == static_cast<size_t>(ranks) &&
                send_offsets.size() == static_cast<size_t>(ranks) + 1,
            "send_counts %zu / send_offsets %zu for %d ranks",
            send_counts.size(),
            send_offsets.size(),
            ranks);
  DSI_CHECK(
      send_offsets[0] == 0, "send_offsets[0] = %lld", static_cast<long long>(send_offsets[0]));
  for (int d = 0; d < ranks; ++d) {
    DSI_CHECK(send_counts[d] >= 0 && send_offsets[d + 1] == send_offsets[d] + send_counts[d],
              "send_offsets is not the prefix sum of send_counts at rank %d",
              d);
  }
  int64_t valid_pairs = 0;
  for (int64_t p = 0; p < pairs; ++p) valid_pairs += part.valid(expert_ids[p]) ? 1 : 0;
  const int64_t sent = num_sent();
  DSI_CHECK(sent == valid_pairs,
            "%lld pairs sent, %lld have a valid expert id",
            static_cast<long long>(sent),
            static_cast<long long>(valid_pairs));
  DSI_CHECK(send_pair.size() == static_cast<size_t>(sent) &&
                send_expert.size() == static_cast<size_t>(sent) &&
                pair_position.size() == static_cast<size_t>(pairs),
            "send_pair %zu, send_expert %zu, pair_position %zu",
            send_pair.size(),
            send_expert.size(),
            pair_position.size());

  // Send order: each position holds a kept pair with its own expert, in its owner's block, in
  // ascending (expert, p) within the block, and pair_position points back at it.
  for (int d = 0; d < ranks; ++d) {
    for (int64_t j = send_offsets[d]; j < send_offsets[d + 1]; ++j) {
      const int32_t p = send_pair[j];
      DSI_CHECK(p >= 0 && p < pairs,
                "send_pair[%lld] = %d outside [0, %lld)",
                static_cast<long long>(j),
                p,
                static_cast<long long>(pairs));
      DSI_CHECK(send_expert[j] == expert_ids[p],
                "send_expert[%lld] = %d, pair %d routes to %d",
                static_cast<long long>(j),
                send_expert[j],
                p,
                expert_ids[p]);
      DSI_CHECK(part.valid(send_expert[j]) && part.owner(send_expert[j]) == d,
                "pair %d (expert %d) sent to rank %d",
                p,
                send_expert[j],
                d);
      DSI_CHECK(pair_position[p] == j,
                "pair_position[%d] = %d, sent at %lld",
                p,
                pair_position[p],
                static_cast<long long>(j));
      if (j > send_offsets[d]) {
        const bool ascending = send_expert[j - 1] < send_expert[j] ||
                               (send_expert[j - 1] == send_expert[j] && send_pair[j - 1] < p);
        DSI_CHECK(ascending,
                  "send order not ascending (expert, pair) at %lld",
                  static_cast<long long>(j));
      }
    }
  }
  // Every pair: dropped exactly when its id is invalid, otherwise sent exactly once (the
  // positions above are distinct because pair_position is a function of p).
  for (int64_t p = 0; p < pairs; ++p) {
    if (!part.valid(expert_ids[p])) {
      DSI_CHECK(pair_position[p] == -1,
                "pair %lld with invalid expert %d has position %d",
                static_cast<long long>(p),
                expert_ids[p],
                pair_position[p]);
    } else {
      DSI_CHECK(
          pair_position[p] >= 0 && pair_position[p] < sent && send_pair[pair_position[p]] == p,
          "pair %lld not at its position %d",
          static_cast<long long>(p),
          pair_position[p]);
    }
  }

  // Combine order: per token exactly its kept pairs, ascending (expert, slot).
  DSI_CHECK(combine_begin.size() == static_cast<size_t>(n + 1) &&
                combine_position.size() == static_cast<size_t>(sent),
            "combine_begin %zu, combine_position %zu",
            combine_begin.size(),
            combine_position.size());
  DSI_CHECK(combine_begin[0] == 0 && combine_begin[n] == sent,
            "combine_begin ends %lld, %lld",
            static_cast<long long>(combine_begin[0]),
            static_cast<long long>(combine_begin[n]));
  for (int64_t t = 0; t < n; ++t) {
    int64_t kept = 0;
    for (int64_t i = 0; i < k; ++i) kept += part.valid(expert_ids[t * k + i]) ? 1 : 0;
    DSI_CHECK(combine_begin[t + 1] - combine_begin[t] == kept,
              "token %lld: %lld combine entries, %lld kept pairs",
              static_cast<long long>(t),
              static_cast<long long>(combine_begin[t + 1] - combine_begin[t]),
              static_cast<long long>(kept));
    for (int64_t c = combine_begin[t]; c < combine_begin[t + 1]; ++c) {
      const int32_t j = combine_position[c];
      DSI_CHECK(j >= 0 && j < sent && send_pair[j] / k == t,
                "token %lld: combine entry %d is not one of its pairs",
                static_cast<long long>(t),
                j);
      if (c > combine_begin[t]) {
        const int32_t i = combine_position[c - 1];
        const bool ascending = send_expert[i] < send_expert[j] ||
                               (send_expert[i] == send_expert[j] && send_pair[i] < send_pair[j]);
        DSI_CHECK(ascending,
                  "token %lld: combine order not ascending (expert, slot)",
                  static_cast<long long>(t));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Receive (destination side)

ReceivePlan plan_receive(const ExpertPartition& part,
                         int rank,
                         const std::vector<std::vector<int32_t>>& received_experts) {
  DSI_CHECK(rank >= 0 && rank < part.ranks(), "rank %d outside [0, %d)", rank, part.ranks());
  DSI_CHECK(received_experts.size() == static_cast<size_t>(part.ranks()),
            "%zu received blocks for %d ranks",
            received_experts.size(),
            part.ranks());
  ReceivePlan plan;
  plan.rank = rank;
  plan.ranks = part.ranks();
  plan.first_expert = part.first(rank);
  plan.num_local = part.count(rank);
  plan.recv_counts.resize(static_cast<size_t>(plan.ranks));
  plan.recv_offsets.assign(static_cast<size_t>(plan.ranks) + 1, 0);
  for (int s = 0; s < plan.ranks; ++s) {
    plan.recv_counts[s] = static_cast<int64_t>(received_experts[s].size());
    plan.recv_offsets[s + 1] = plan.recv_offsets[s] + plan.recv_counts[s];
  }
  const int64_t total = plan.num_received();
  DSI_CHECK(total <= kMaxInt32, "%lld received pairs exceed int32", static_cast<long long>(total));

  // Stable counting sort of the arrival indices by local expert.
  plan.expert_begin.assign(static_cast<size_t>(plan.num_local + 1), 0);
  for (int s = 0; s < plan.ranks; ++s) {
    for (const int32_t e : received_experts[s]) {
      DSI_CHECK(part.valid(e) && part.owner(e) == rank,
                "rank %d received expert %d from rank %d, which it does not own",
                rank,
                e,
                s);
      ++plan.expert_begin[e - plan.first_expert + 1];
    }
  }
  for (int64_t l = 0; l < plan.num_local; ++l) plan.expert_begin[l + 1] += plan.expert_begin[l];
  plan.order.resize(static_cast<size_t>(total));
  plan.grouped_position.resize(static_cast<size_t>(total));
  std::vector<int64_t> next(plan.expert_begin.begin(), plan.expert_begin.end() - 1);
  int64_t a = 0;
  for (int s = 0; s < plan.ranks; ++s) {
    for (const int32_t e : received_experts[s]) {
      const int64_t g = next[static_cast<size_t>(e - plan.first_expert)]++;
      plan.order[g] = static_cast<int32_t>(a);
      plan.grouped_position[a] = static_cast<int32_t>(g);
      ++a;
    }
  }
  return plan;
}

void ReceivePlan::check(const ExpertPartition& part,
                        const std::vector<std::vector<int32_t>>& received_experts) const {
  DSI_CHECK(ranks == part.ranks() && rank >= 0 && rank < ranks,
            "rank %d of %d (partition %d)",
            rank,
            ranks,
            part.ranks());
  DSI_CHECK(first_expert == part.first(rank) && num_local == part.count(rank),
            "rank %d: experts [%lld, +%lld), partition says [%lld, +%lld)",
            rank,
            static_cast<long long>(first_expert),
            static_cast<long long>(num_local),
            static_cast<long long>(part.first(rank)),
            static_cast<long long>(part.count(rank)));
  DSI_CHECK(received_experts.size() == static_cast<size_t>(ranks) &&
                recv_counts.size() == static_cast<size_t>(ranks) &&
                recv_offsets.size() == static_cast<size_t>(ranks) + 1,
            "%zu received blocks, recv_counts %zu, recv_offsets %zu for %d ranks",
            received_experts.size(),
            recv_counts.size(),
            recv_offsets.size(),
            ranks);
  DSI_CHECK(
      recv_offsets[0] == 0, "recv_offsets[0] = %lld", static_cast<long long>(recv_offsets[0]));
  // Arrival index -> (source, expert id), flattened.
  std::vector<int32_t> arrival_expert;
  for (int s = 0; s < ranks; ++s) {
    DSI_CHECK(recv_counts[s] == static_cast<int64_t>(received_experts[s].size()) &&
                  recv_offsets[s + 1] == recv_offsets[s] + recv_counts[s],
              "source %d: recv_counts/offsets do not match its %zu pairs",
              s,
              received_experts[s].size());
    for (const int32_t e : received_experts[s]) {
      DSI_CHECK(part.valid(e) && part.owner(e) == rank,
                "rank %d holds expert %d from rank %d",
                rank,
                e,
                s);
      arrival_expert.push_back(e);
    }
  }
  const int64_t total = num_received();
  DSI_CHECK(static_cast<int64_t>(arrival_expert.size()) == total &&
                order.size() == static_cast<size_t>(total) &&
                grouped_position.size() == static_cast<size_t>(total),
            "received %zu, order %zu, grouped_position %zu, expected %lld",
            arrival_expert.size(),
            order.size(),
            grouped_position.size(),
            static_cast<long long>(total));
  DSI_CHECK(expert_begin.size() == static_cast<size_t>(num_local + 1) && expert_begin[0] == 0 &&
                expert_begin[num_local] == total,
            "expert_begin: %zu entries",
            expert_begin.size());
  // order is a permutation (grouped_position is its inverse), each local expert's range holds
  // exactly its pairs with ascending arrival index (= source rank, then arrival order).
  for (int64_t l = 0; l < num_local; ++l) {
    DSI_CHECK(expert_begin[l] <= expert_begin[l + 1],
              "expert_begin descends at %lld",
              static_cast<long long>(l));
    for (int64_t g = expert_begin[l]; g < expert_begin[l + 1]; ++g) {
      const int32_t a = order[g];
      DSI_CHECK(a >= 0 && a < total,
                "order[%lld] = %d outside [0, %lld)",
                static_cast<long long>(g),
                a,
                static_cast<long long>(total));
      DSI_CHECK(grouped_position[a] == g,
                "grouped_position[%d] = %d, expected %lld",
                a,
                grouped_position[a],
                static_cast<long long>(g));
      DSI_CHECK(arrival_expert[a] - first_expert == l,
                "pair %d (expert %d) in local expert %lld's range",
                a,
                arrival_expert[a],
                static_cast<long long>(l));
      DSI_CHECK(g == expert_begin[l] || order[g - 1] < a,
                "local expert %lld: arrival order not ascending at %lld",
                static_cast<long long>(l),
                static_cast<long long>(g));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Combine (source side)

void combine(const DispatchPlan& plan,
             const float* returned,
             const float* shared,
             int64_t hidden,
             float* out) {
  DSI_CHECK(hidden >= 0, "hidden %lld", static_cast<long long>(hidden));
  DSI_CHECK(plan.combine_begin.size() == static_cast<size_t>(plan.n + 1), "plan without combine");
  for (int64_t t = 0; t < plan.n; ++t) {
    float* o = out + t * hidden;
    if (shared != nullptr) {
      std::copy(shared + t * hidden, shared + (t + 1) * hidden, o);
    } else {
      std::fill(o, o + hidden, 0.0f);
    }
    for (int64_t c = plan.combine_begin[t]; c < plan.combine_begin[t + 1]; ++c) {
      const float* y = returned + static_cast<int64_t>(plan.combine_position[c]) * hidden;
      for (int64_t h = 0; h < hidden; ++h) o[h] += y[h];
    }
  }
}

}  // namespace dsinfer::parallel
