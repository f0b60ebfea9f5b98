// CudaModel::mtp_draft_batch: V4's MTP block run recurrently on the device for speculative
// decoding (backend::DraftItem). Step 0 runs the block at each sequence's last position with the
// sampled token and the main model's final streams of that position (kept in the pool); step s
// feeds the block's own output streams of step s - 1 back with the previous draft. Each step is
// one eager pass for every sequence still drafting; the drafts are the greedy picks of the
// block's head, chosen on the device (DeviceSampler) with their probabilities.
#include "backend/mtp_draft.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "base/check.h"
#include "device/device_error.h"

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

  sampling::SamplingConfig greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = true;  // the draft's probability under the block's softmax
  const sampling::PenaltyState no_penalties;
  std::vector<backend::SampleRequest> sreq(active.size());
  for (backend::SampleRequest& q : sreq) {
    q.config = &greedy;
    q.penalties = &no_penalties;
  }
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
    DSI_RETURN_IF_ERROR(upload_pack(pack, dev));
    DSI_ASSIGN_OR_RETURN(bool moved, ws_->consolidate());
    if (moved)
      clear_graphs();
    return Status();
  };
  // One step's launch (graph-replayed when fixed): its logits stay in the workspace.
  auto run_step = [&](int32_t step,
                      const std::vector<int64_t>& key_head,
                      const PassPlan& plan,
                      int32_t src_id,
                      int32_t bcast_id,
                      uint8_t* dev,
                      const HostPack& pack,
                      float** logits) -> Status {
    ws_->reset();
    float* in = static_cast<float*>(draft_streams_[step % 2]);
    float* out = static_cast<float*>(draft_streams_[(step + 1) % 2]);
    auto launch = [&] { return launch_mtp(plan, src_id, bcast_id, in, dev, pack, out, logits); };
    if (!fixed)
      return launch();
    // Keyed apart from the forwards' graphs (a negative marker first), then the step's buffers,
    // the plan's layout and shape.
    std::vector<int64_t> key = key_head;
    key.push_back(step);
    const std::vector<int64_t> layout = pack.layout_key();
    key.insert(key.end(), layout.begin(), layout.end());
    key.push_back(plan.rows);
    key.push_back(reinterpret_cast<int64_t>(pool_));
    key.push_back(reinterpret_cast<int64_t>(in));
    for (const LayerPass& lp : plan.layers) key.push_back(lp.visible_room);
    return run_fixed_shape(key, launch, logits, nullptr, /*profile_eager=*/false);
  };

  // Every sequence drafting the same number of steps (fixed:K, auto's one depth per step): all
  // steps planned into one upload, each step's picks copied on the device into the next step's
  // tokens, one synchronisation for the call.
  bool same_steps = max_steps >= 2;
  for (size_t i : active) same_steps = same_steps && items[i].num_steps == max_steps;
  if (same_steps) {
    for (size_t k = 0; k < active.size(); ++k) row_of[active[k]] = static_cast<int64_t>(k);
    while (draft_samplers_.size() < static_cast<size_t>(max_steps))
      draft_samplers_.push_back(std::make_unique<DeviceSampler>());
    HostPack pack;
    std::vector<PassPlan> plans(static_cast<size_t>(max_steps));
    std::vector<int32_t> src_ids(plans.size()), bcast_ids(plans.size());
    for (int32_t step = 0; step < max_steps; ++step) {
      const size_t s = static_cast<size_t>(step);
      plan_step(step, active, true, pack, &plans[s], &src_ids[s], &bcast_ids[s]);
    }
    uint8_t* dev = nullptr;
    DSI_RETURN_IF_ERROR(upload(pack, &dev));
    std::vector<DeviceSampler::Row> srows;
    for (int64_t k = 0; k < n; ++k) srows.push_back({&sreq[static_cast<size_t>(k)], k});
    for (int32_t step = 0; step < max_steps; ++step) {
      const size_t s = static_cast<size_t>(step);
      float* logits = nullptr;
      DSI_RETURN_IF_ERROR(
          run_step(step, {-8, max_steps}, plans[s], src_ids[s], bcast_ids[s], dev, pack, &logits));
      DeviceSampler& sampler = *draft_samplers_[s];
      DSI_RETURN_IF_ERROR(sampler.launch(logits, c.vocab_size, srows, stream_.get()));
      if (step + 1 < max_steps) {
        int32_t* next = pack.resolve<int32_t>(dev, plans[s + 1].tokens);
        DSI_RETURN_IF_ERROR(
            device::check_cuda(cudaMemcpyAsync(next,
                                               sampler.device_tokens(),
                                               static_cast<size_t>(n) * sizeof(int32_t),
                                               cudaMemcpyDeviceToDevice,
                                               stream_.get()),
                               "chaining the drafts"));
      }
    }
    DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "MTP draft"));
    for (int32_t step = 0; step < max_steps; ++step) {
      const DeviceSampler& sampler = *draft_samplers_[static_cast<size_t>(step)];
      for (size_t k = 0; k < active.size(); ++k) {
        const sampling::SampleResult r = sampler.result(k);
        items[active[k]].tokens[step] = r.token;
        items[active[k]].probs[step] = std::exp(r.logprob);
      }
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
      float* logits = nullptr;
      DSI_RETURN_IF_ERROR(run_step(step, {-7}, plan, src_id, bcast_id, dev, pack, &logits));
      std::vector<DeviceSampler::Row> srows;
      for (size_t k = 0; k < now.size(); ++k) srows.push_back({&sreq[k], static_cast<int64_t>(k)});
      DSI_RETURN_IF_ERROR(sampler_.launch(logits, c.vocab_size, srows, stream_.get()));
      DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "MTP draft"));
      for (size_t k = 0; k < now.size(); ++k) {
        backend::DraftItem& it = items[now[k]];
        const sampling::SampleResult r = sampler_.result(k);
        it.tokens[step] = r.token;
        it.probs[step] = std::exp(r.logprob);
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
