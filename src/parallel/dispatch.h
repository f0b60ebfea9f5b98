// Expert parallelism, host side (issue 8; docs/parallel.md): routed experts sharded across N
// ranks in contiguous shards, each (token, slot) pair sent to the rank owning its expert, the
// expert outputs sent back and combined at the source in the CPU reference's order (shared
// expert, then routed outputs in ascending expert id), so N ranks equal one bit for bit.
//
// Pairs: p = t * k + i is slot i of token t (expert_ids / gates are [n, k], as the router emits
// them). Every plan has a check() that DSI_CHECK-aborts on a violated invariant.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace dsinfer::parallel {

// Experts [0, n_experts) in `ranks` contiguous shards whose sizes differ by at most one: the
// first n_experts % ranks ranks own one expert more. Ownership is monotone (a higher rank owns
// higher expert ids), which makes "grouped by destination, then by expert" one global order.
class ExpertPartition {
 public:
  // ranks in [1, n_experts], n_experts in [1, INT32_MAX]; otherwise an invalid-argument Status.
  static Result<ExpertPartition> make(int64_t n_experts, int ranks);

  int64_t n_experts() const { return n_experts_; }
  int ranks() const { return ranks_; }
  bool valid(int64_t e) const { return e >= 0 && e < n_experts_; }
  // The rank owning expert e (e must be valid).
  int owner(int64_t e) const;
  // Global id of the rank's first expert; first(ranks) == n_experts.
  int64_t first(int rank) const;
  // Number of experts the rank owns (>= 1).
  int64_t count(int rank) const;
  // Index of expert e within its owner's shard: e - first(owner(e)).
  int64_t local(int64_t e) const { return e - first(owner(e)); }

 private:
  ExpertPartition(int64_t n_experts, int ranks);

  int64_t n_experts_ = 0;
  int ranks_ = 0;
  int64_t base_ = 0;  // n_experts / ranks
  int64_t rem_ = 0;   // n_experts % ranks: ranks [0, rem_) own base_ + 1
};

// The source rank's side: where each pair goes, in which order, and how to combine the answers.
//
// Send order: grouped by destination rank ascending, within a destination by (expert ascending,
// p ascending). As shards are contiguous and ascending, this is one global sort of the kept
// pairs by (expert, p); block d = [send_offsets[d], send_offsets[d + 1]) goes to rank d.
// Pairs whose id is outside [0, n_experts) are dropped (as launch_moe_group drops them).
struct DispatchPlan {
  int ranks = 0;
  int64_t n = 0;                       // tokens
  int64_t k = 0;                       // slots per token
  std::vector<int64_t> send_counts;    // [ranks] pairs sent to each destination
  std::vector<int64_t> send_offsets;   // [ranks + 1] exclusive prefix sum of send_counts
  std::vector<int32_t> send_pair;      // [num_sent()] pair index p, in send order
  std::vector<int32_t> send_expert;    // [num_sent()] its global expert id
  std::vector<int32_t> pair_position;  // [n * k] where pair p sits in the send order; -1: dropped
  // Combine order: token t's kept pairs are combine_position[combine_begin[t] ..
  // combine_begin[t + 1]), send positions in ascending (expert id, slot) order; the order the
  // CPU reference adds routed outputs in (CpuModel::moe).
  std::vector<int64_t> combine_begin;     // [n + 1]
  std::vector<int32_t> combine_position;  // [num_sent()]

  int64_t num_sent() const { return send_offsets.empty() ? 0 : send_offsets.back(); }
  int64_t num_dropped() const { return n * k - num_sent(); }
  // Aborts unless this is the plan for `expert_ids` [n, k] under `part`: every kept pair appears
  // exactly once, in its owner's block, in (expert, p) order; dropped pairs are exactly the
  // invalid ids; combine lists are per token, complete and in ascending (expert, slot) order.
  void check(const ExpertPartition& part, const int32_t* expert_ids) const;
};

// expert_ids: [n, k] (may be null when n == 0); n * k must fit in int32.
DispatchPlan plan_dispatch(const ExpertPartition& part,
                           const int32_t* expert_ids,
                           int64_t n,
                           int64_t k);

// The destination rank's side. The received pairs are the concatenation, by source rank
// ascending, of each source's block for this rank (in that source's send order); an "arrival
// index" a indexes that concatenation. Grouped order: by local expert ascending, then source
// rank ascending, then arrival order, i.e. a stable sort of the arrival indices by local expert.
// This is the layout launch_expert_ffn (kernels/cuda/moe.h) takes with k = 1: expert_begin
// over the local experts and pair_src = order.
struct ReceivePlan {
  int rank = 0;
  int ranks = 0;
  int64_t first_expert = 0;               // global id of local expert 0
  int64_t num_local = 0;                  // experts this rank owns
  std::vector<int64_t> recv_counts;       // [ranks] pairs received from each source
  std::vector<int64_t> recv_offsets;      // [ranks + 1] arrival index of each source's first pair
  std::vector<int64_t> expert_begin;      // [num_local + 1] local expert l's grouped range
  std::vector<int32_t> order;             // [num_received()] grouped position -> arrival index
  std::vector<int32_t> grouped_position;  // [num_received()] arrival index -> grouped position
                                          // (the inverse: outputs back to arrival order)

  int64_t num_received() const { return recv_offsets.empty() ? 0 : recv_offsets.back(); }
  // Aborts unless this is the plan for `received_experts` on this rank: order is a permutation
  // with grouped_position its inverse, every pair lies in its local expert's range, and within
  // a range arrival indices ascend (source rank, then arrival order).
  void check(const ExpertPartition& part,
             const std::vector<std::vector<int32_t>>& received_experts) const;
};

// received_experts[s]: the global expert ids of the pairs source rank s sent here, in its send
// order (its DispatchPlan::send_expert block for this rank); one entry per rank. An id this rank
// does not own is a bug in the sender or the transport and aborts.
ReceivePlan plan_receive(const ExpertPartition& part,
                         int rank,
                         const std::vector<std::vector<int32_t>>& received_experts);

// Source side, after the return trip: returned [num_sent, hidden] holds the routed outputs in
// send order; out[t] = shared[t] (0 when shared is null), then += each of t's returned rows in
// combine order. Exactly CpuModel::moe's float additions.
void combine(const DispatchPlan& plan,
             const float* returned,
             const float* shared,
             int64_t hidden,
             float* out);

}  // namespace dsinfer::parallel
