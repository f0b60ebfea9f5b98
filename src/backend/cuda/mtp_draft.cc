// CudaModel::mtp_draft_batch: V4's MTP block run recurrently on the device for speculative
// decoding (backend::DraftItem). Step 0 runs the block at each sequence's last position with the
// sampled token and the main model's final streams of that position (kept in the pool); step s
// feeds the block's own output streams of step s - 1 back with the previous draft. Each step is
// one pass for every sequence still drafting (all steps of a call one CUDA graph when every
// sequence drafts as many); the drafts are the greedy picks of the block's head, chosen on the
// device (cuda::launch_greedy_pick) with their probabilities.
#include "backend/mtp_draft.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "base/check.h"
#include "device/device_error.h"
#include "kernels/cuda/sampling.h"

namespace dsinfer::gpu {

bool CudaModel::can_draft() const {
  return !weights_->mtp.empty() && options_.comm == nullptr;
}

Status CudaModel::mtp_draft_batch(std::span<backend::DraftItem> items) {
  DSI_RETURN_IF_ERROR(health());
  const auto& c = config_;
  const int64_t width = c.hc_mult * c.hidden_size;
  std::vector<size_t> active;
  int32_t max_steps = 0;
  const state::PageArena* arena = nullptr;
  for (size_t i = 0; i < items.size(); ++i) {
    backend::DraftItem& it = items[i];
    it.status =
        backend::check_mtp_draft(c, !weights_->mtp.empty(), *it.state, it.next_token, it.num_steps);
    if (it.status.ok() && options_.comm != nullptr) {
      it.status = unimplemented("MTP drafting under expert parallelism is not supported yet");
    }
    if (!it.status.ok())
      continue;
    if (!arena)
      arena = it.state->arena();
    DSI_CHECK(it.state->arena() == arena, "one draft batch spans two state arenas");
    active.push_back(i);
    max_steps = std::max(max_steps, it.num_steps);
  }
  if (active.empty())
    return Status();
  DSI_RETURN_IF_ERROR(ensure_pool(*arena));
  const int64_t n = static_cast<int64_t>(active.size());
  // Each step a fixed-shape pass (one row per sequence, padded to a power of two) replayed from
  // a graph, as the decode steps are; the rows beyond the sequences read row 0 and write nothing.
  const bool fixed = options_.cuda_graphs && n <= options_.max_graph_batch;
  // The kernels of decode steps (chosen by the row count alone), whether or not graphs are on, so
  // that eager and replayed drafts are the same.
  decode_step_ = n <= options_.max_graph_batch;
  const int64_t n_rows = fixed ? pow2_at_least(n) : n;
  const size_t stream_bytes = static_cast<size_t>(n_rows * width) * sizeof(float);
  DSI_RETURN_IF_ERROR(ensure_device_buffer(
      &draft_streams_[0], &draft_cap_[0], static_cast<int64_t>(stream_bytes), "cudaMalloc (MTP)"));
  DSI_RETURN_IF_ERROR(ensure_device_buffer(
      &draft_streams_[1], &draft_cap_[1], static_cast<int64_t>(stream_bytes), "cudaMalloc (MTP)"));

  // Every step's greedy picks on the device ([steps][n_rows] tokens, then as many logprobs: the
  // log-softmax of the block's head at the pick), copied back in one piece.
  const int64_t pick_rows = static_cast<int64_t>(max_steps) * n_rows;
  const size_t pick_bytes = static_cast<size_t>(pick_rows) * (sizeof(int32_t) + sizeof(float));
  DSI_RETURN_IF_ERROR(ensure_device_buffer(&draft_picks_,
                                           &draft_picks_cap_,
                                           static_cast<int64_t>(pick_bytes),
                                           "cudaMalloc (MTP picks)"));
  if (draft_results_.size() < pick_bytes) {
    DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "MTP picks"));
    DSI_ASSIGN_OR_RETURN(draft_results_, device::PinnedBuffer::allocate(2 * pick_bytes));
  }
  int32_t* pick_tokens = static_cast<int32_t*>(draft_picks_);
  float* pick_logprobs = reinterpret_cast<float*>(pick_tokens + pick_rows);
  // Step `step`'s picks of its `rows` rows, also written to `next` (the next step's tokens) when
  // chained. Every row of the plan, the padding rows included: a graph replays its launches for
  // any number of sequences its power of two holds.
  auto pick = [&](const float* logits, int64_t rows, int32_t step, int32_t* next) {
    cuda::GreedyPickParams gp;
    gp.logits = logits;
    gp.n = rows;
    gp.vocab = c.vocab_size;
    gp.tokens = pick_tokens + step * n_rows;
    gp.logprobs = pick_logprobs + step * n_rows;
    gp.next = next;
    return cuda::launch_greedy_pick(gp, stream_.get());
  };
  // The picks back on the host (fetch), and row k of step `step`'s into the item (take). The
  // launches write at offsets of max_steps and n_rows: both are in the graph keys.
  // Each synchronisation ends a timed launch (CudaModelStats::decode_idle_ms: the gaps around a
  // drafting call count as a decode step's host time, its work as busy).
  auto fetch = [&]() -> Status {
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpyAsync(
            draft_results_.get(), draft_picks_, pick_bytes, cudaMemcpyDeviceToHost, stream_.get()),
        "copying the drafts"));
    mark_launch_end();
    DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "MTP draft"));
    account_decode_gap(fixed);
    return Status();
  };
  auto take = [&](int32_t step, int64_t k, backend::DraftItem& it) {
    const auto* tok = draft_results_.as<int32_t>();
    const auto* lp = reinterpret_cast<const float*>(tok + pick_rows);
    it.tokens[step] = tok[step * n_rows + k];
    it.probs[step] = std::exp(lp[step * n_rows + k]);
  };
  std::vector<int64_t> row_of(items.size(), -1);  // item -> its row in the previous step
  // One step's pass over the sequences `now` into pack: step 0 starts from the main model's final
  // streams of each sequence's last position with its pending token, step s from the streams of
  // step s - 1 (row row_of[item] of `in`) with the previous draft (token: chained steps leave 0,
  // overwritten on the device by the previous step's pick before this step runs).
  auto plan_step = [&](int32_t step,
                       const std::vector<size_t>& now,
                       bool chained,
                       HostPack& pack,
                       PassPlan* plan,
                       int32_t* src_id,
                       int32_t* bcast_id) {
    std::vector<SeqSpan> spans;
    std::vector<int32_t> tokens;
    std::vector<int64_t> src;
    for (size_t k = 0; k < now.size(); ++k) {
      backend::DraftItem& it = items[now[k]];
      state::SequenceState& st = *it.state;
      const int64_t pos0 = st.num_tokens() - 1;
      SeqSpan sp;
      sp.st = &st;
      sp.first = pos0 + step;
      sp.n = 1;
      sp.begin = static_cast<int64_t>(k);
      sp.mtp = true;
      spans.push_back(sp);
      tokens.push_back(step == 0 ? it.next_token : chained ? 0 : it.tokens[step - 1]);
      if (step == 0) {
        const int64_t r = st.final_streams_row(pos0);
        DSI_CHECK(r >= 0, "final streams of position %lld are gone", static_cast<long long>(pos0));
        src.push_back(st.final_streams_rows().pool_offset(r));
      } else {
        src.push_back(local_ref(row_of[now[k]] * width));
      }
    }
    const int64_t rows = static_cast<int64_t>(now.size());
    const int64_t plan_rows = fixed ? pow2_at_least(rows) : rows;
    tokens.resize(static_cast<size_t>(plan_rows), 0);
    src.resize(static_cast<size_t>(plan_rows), local_ref(0));
    PlanContext ctx;
    ctx.config = &c;
    ctx.page_floats = arena->page_floats();
    ctx.fixed_shape = fixed;
    plan_pass(ctx, spans, tokens, plan_rows, pack, plan);
    *src_id = pack.add(src);
    std::vector<int64_t> bcast;
    for (int64_t r = 0; r < plan_rows; ++r) {
      for (int64_t j = 0; j < c.hc_mult; ++j) bcast.push_back(local_ref(r * c.hidden_size));
    }
    *bcast_id = pack.add(bcast);
  };
  // The plan on the device, and the workspace in one piece before anything is launched (a move
  // drops the captured graphs).
  auto upload = [&](HostPack& pack, uint8_t** dev) -> Status {
    pack.layout(fixed);
    mark_launch_start();
    DSI_RETURN_IF_ERROR(upload_pack(pack, dev));
    DSI_ASSIGN_OR_RETURN(bool moved, ws_->consolidate());
    if (moved)
      clear_graphs();
    return Status();
  };
  // Step `step`'s pass and its picks (the head's logits stay in the workspace until the next
  // step's reset, after the picks in stream order).
  auto launch_step = [&](int32_t step,
                         const PassPlan& plan,
                         int32_t src_id,
                         int32_t bcast_id,
                         uint8_t* dev,
                         const HostPack& pack,
                         int64_t rows,
                         int32_t* next) -> Status {
    ws_->reset();
    float* in = static_cast<float*>(draft_streams_[step % 2]);
    float* out = static_cast<float*>(draft_streams_[(step + 1) % 2]);
    float* logits = nullptr;
    DSI_RETURN_IF_ERROR(launch_mtp(plan, src_id, bcast_id, in, dev, pack, out, &logits));
    return pick(logits, rows, step, next);
  };
  // A fixed-shape launch's graph key: apart from the forwards' (a negative marker first), then
  // the buffers it points into, the plan's layout and shape.
  auto key_of =
      [&](std::vector<int64_t> key, const HostPack& pack, std::span<const PassPlan> plans) {
        const std::vector<int64_t> layout = pack.layout_key();
        key.insert(key.end(), layout.begin(), layout.end());
        key.push_back(reinterpret_cast<int64_t>(pool_));
        key.push_back(reinterpret_cast<int64_t>(draft_streams_[0]));
        key.push_back(reinterpret_cast<int64_t>(draft_streams_[1]));
        key.push_back(reinterpret_cast<int64_t>(draft_picks_));
        for (const PassPlan& plan : plans) {
          key.push_back(plan.rows);
          for (const LayerPass& lp : plan.layers) key.push_back(lp.visible_room);
        }
        return key;
      };

  // Every sequence drafting the same number of steps (fixed:K, auto's one depth per step): all
  // steps planned into one upload and launched as one graph, each step's picks written on the
  // device into the next step's tokens, one copy back and one synchronisation for the call.
  bool same_steps = max_steps >= 2;
  for (size_t i : active) same_steps = same_steps && items[i].num_steps == max_steps;
  if (same_steps) {
    for (size_t k = 0; k < active.size(); ++k) row_of[active[k]] = static_cast<int64_t>(k);
    HostPack pack;
    std::vector<PassPlan> plans(static_cast<size_t>(max_steps));
    std::vector<int32_t> src_ids(plans.size()), bcast_ids(plans.size());
    for (int32_t step = 0; step < max_steps; ++step) {
      const size_t s = static_cast<size_t>(step);
      plan_step(step, active, true, pack, &plans[s], &src_ids[s], &bcast_ids[s]);
    }
    uint8_t* dev = nullptr;
    DSI_RETURN_IF_ERROR(upload(pack, &dev));
    auto chain = [&]() -> Status {
      for (int32_t step = 0; step < max_steps; ++step) {
        const size_t s = static_cast<size_t>(step);
        int32_t* next =
            step + 1 < max_steps ? pack.resolve<int32_t>(dev, plans[s + 1].tokens) : nullptr;
        DSI_RETURN_IF_ERROR(
            launch_step(step, plans[s], src_ids[s], bcast_ids[s], dev, pack, n_rows, next));
      }
      return Status();
    };
    if (fixed) {
      DSI_RETURN_IF_ERROR(run_fixed_shape(key_of({-9, max_steps, n_rows}, pack, plans),
                                          chain,
                                          nullptr,
                                          nullptr,
                                          /*profile_eager=*/false));
    } else {
      DSI_RETURN_IF_ERROR(chain());
    }
    DSI_RETURN_IF_ERROR(fetch());
    for (int32_t step = 0; step < max_steps; ++step) {
      for (size_t k = 0; k < active.size(); ++k)
        take(step, static_cast<int64_t>(k), items[active[k]]);
    }
  } else {
    // Steps of different lengths: one step at a time, its picks read back before the next.
    for (int32_t step = 0; step < max_steps; ++step) {
      std::vector<size_t> now;
      for (size_t i : active) {
        if (items[i].num_steps > step)
          now.push_back(i);
      }
      HostPack pack;
      PassPlan plan;
      int32_t src_id = -1, bcast_id = -1;
      plan_step(step, now, false, pack, &plan, &src_id, &bcast_id);
      uint8_t* dev = nullptr;
      DSI_RETURN_IF_ERROR(upload(pack, &dev));
      auto one = [&] {
        return launch_step(step, plan, src_id, bcast_id, dev, pack, plan.rows, nullptr);
      };
      if (fixed) {
        DSI_RETURN_IF_ERROR(run_fixed_shape(key_of({-7, step, max_steps, n_rows}, pack, {&plan, 1}),
                                            one,
                                            nullptr,
                                            nullptr,
                                            /*profile_eager=*/false));
      } else {
        DSI_RETURN_IF_ERROR(one());
      }
      DSI_RETURN_IF_ERROR(fetch());
      for (size_t k = 0; k < now.size(); ++k) {
        take(step, static_cast<int64_t>(k), items[now[k]]);
        row_of[now[k]] = static_cast<int64_t>(k);
      }
    }
  }
  // The block has consumed next_token; what the later steps wrote lies beyond it (the
  // verification overwrites it).
  for (size_t i : active) {
    state::SequenceState& st = *items[i].state;
    st.set_mtp_num_tokens(st.num_tokens());
  }
  ++stats_.forwards;
  return Status();
}

}  // namespace dsinfer::gpu
