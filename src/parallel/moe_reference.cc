#include "parallel/moe_reference.h"

#include <algorithm>

#include "base/check.h"

namespace dsinfer::parallel {

namespace {

// What one source sends one destination: per pair its row, gate and expert id, in send order.
struct Block {
  std::vector<float> rows;  // [count, hidden]
  std::vector<float> gates;
  std::vector<int32_t> experts;
};

}  // namespace

std::vector<std::vector<float>> moe_expert_parallel_reference(const ExpertPartition& part,
                                                              std::span<const RankMoeInput> inputs,
                                                              int64_t k,
                                                              int64_t hidden,
                                                              const ExpertFn& expert_fn) {
  const int ranks = part.ranks();
  DSI_CHECK(static_cast<int64_t>(inputs.size()) == ranks,
            "%zu inputs for %d ranks",
            inputs.size(),
            ranks);
  DSI_CHECK(k >= 1 && hidden >= 1,
            "k %lld, hidden %lld",
            static_cast<long long>(k),
            static_cast<long long>(hidden));

  // 1. Source side: plan and pack one block per destination.
  std::vector<DispatchPlan> plans(static_cast<size_t>(ranks));
  std::vector<std::vector<Block>> sent(static_cast<size_t>(ranks));  // [source][destination]
  for (int s = 0; s < ranks; ++s) {
    const RankMoeInput& in = inputs[s];
    DSI_CHECK(in.x.size() % static_cast<size_t>(hidden) == 0, "rank %d: x is not [n, hidden]", s);
    const int64_t n = static_cast<int64_t>(in.x.size()) / hidden;
    DSI_CHECK(static_cast<int64_t>(in.expert_ids.size()) == n * k &&
                  static_cast<int64_t>(in.gates.size()) == n * k &&
                  (in.shared.empty() || static_cast<int64_t>(in.shared.size()) == n * hidden),
              "rank %d: %lld tokens, %zu ids, %zu gates, %zu shared",
              s,
              static_cast<long long>(n),
              in.expert_ids.size(),
              in.gates.size(),
              in.shared.size());
    DispatchPlan& plan = plans[s];
    plan = plan_dispatch(part, in.expert_ids.data(), n, k);
    plan.check(part, in.expert_ids.data());
    sent[s].resize(static_cast<size_t>(ranks));
    for (int d = 0; d < ranks; ++d) {
      Block& b = sent[s][d];
      for (int64_t j = plan.send_offsets[d]; j < plan.send_offsets[d + 1]; ++j) {
        const int32_t p = plan.send_pair[j];
        const float* row = in.x.data() + (p / k) * hidden;
        b.rows.insert(b.rows.end(), row, row + hidden);
        b.gates.push_back(in.gates[p]);
        b.experts.push_back(plan.send_expert[j]);
      }
    }
  }

  // 2. Destination side: receive (concatenate by source), group, run the local experts, put
  // the outputs back in arrival order and return each source its block.
  std::vector<std::vector<std::vector<float>>> back(static_cast<size_t>(ranks));  // [dst][src]
  for (int d = 0; d < ranks; ++d) {
    std::vector<std::vector<int32_t>> received_experts(static_cast<size_t>(ranks));
    std::vector<float> rows;
    std::vector<float> gates;
    for (int s = 0; s < ranks; ++s) {
      const Block& b = sent[s][d];
      received_experts[s] = b.experts;
      rows.insert(rows.end(), b.rows.begin(), b.rows.end());
      gates.insert(gates.end(), b.gates.begin(), b.gates.end());
    }
    const ReceivePlan rp = plan_receive(part, d, received_experts);
    rp.check(part, received_experts);
    const int64_t total = rp.num_received();
    std::vector<float> y_grouped(static_cast<size_t>(total * hidden), 0.0f);
    std::vector<float> xs;
    std::vector<float> gs;
    for (int64_t l = 0; l < rp.num_local; ++l) {
      const int64_t g0 = rp.expert_begin[l];
      const int64_t m = rp.expert_begin[l + 1] - g0;
      if (m == 0)
        continue;
      xs.resize(static_cast<size_t>(m * hidden));
      gs.resize(static_cast<size_t>(m));
      for (int64_t r = 0; r < m; ++r) {
        const int64_t a = rp.order[g0 + r];
        std::copy(rows.data() + a * hidden, rows.data() + (a + 1) * hidden, xs.data() + r * hidden);
        gs[r] = gates[a];
      }
      expert_fn(rp.first_expert + l, xs.data(), m, gs.data(), y_grouped.data() + g0 * hidden);
    }
    back[d].resize(static_cast<size_t>(ranks));
    for (int s = 0; s < ranks; ++s) {
      std::vector<float>& ret = back[d][s];
      ret.resize(static_cast<size_t>(rp.recv_counts[s] * hidden));
      for (int64_t i = 0; i < rp.recv_counts[s]; ++i) {
        const int64_t g = rp.grouped_position[rp.recv_offsets[s] + i];
        std::copy(y_grouped.data() + g * hidden,
                  y_grouped.data() + (g + 1) * hidden,
                  ret.data() + i * hidden);
      }
    }
  }

  // 3. Source side: the returned blocks by destination ascending are the send order; combine.
  std::vector<std::vector<float>> outputs(static_cast<size_t>(ranks));
  for (int s = 0; s < ranks; ++s) {
    const DispatchPlan& plan = plans[s];
    std::vector<float> returned(static_cast<size_t>(plan.num_sent() * hidden));
    for (int d = 0; d < ranks; ++d) {
      const std::vector<float>& blk = back[d][s];
      DSI_CHECK(static_cast<int64_t>(blk.size()) == plan.send_counts[d] * hidden,
                "rank %d got %zu values back from rank %d, sent %lld pairs",
                s,
                blk.size(),
                d,
                static_cast<long long>(plan.send_counts[d]));
      std::copy(blk.begin(), blk.end(), returned.begin() + plan.send_offsets[d] * hidden);
    }
    outputs[s].resize(static_cast<size_t>(plan.n * hidden));
    combine(plan,
            returned.data(),
            inputs[s].shared.empty() ? nullptr : inputs[s].shared.data(),
            hidden,
            outputs[s].data());
  }
  return outputs;
}

}  // namespace dsinfer::parallel
