// CudaModel::mtp_draft_batch: V4's MTP block run recurrently on the device for speculative
// decoding (backend::DraftItem). Step 0 runs the block at each sequence's last position with the
// sampled token and the main model's final streams of that position (kept in the pool), with the
// catch-up positions before it in the same pass (the verification skipped its MTP pass); step s
// feeds the block's own output streams of step s - 1 back with the previous draft. Each step is
// one pass for every sequence still drafting (all steps of a call one CUDA graph when every
// sequence drafts as many); the drafts are the greedy picks of the block's head, chosen on the
// device (cuda::launch_greedy_pick) with their probabilities.
#include "backend/mtp_draft.h"

#include <algorithm>
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
  host_begin();
  const Status s = mtp_draft_impl(items);
  host_end(call_decode_);
  return s;
}

Status CudaModel::mtp_draft_impl(std::span<backend::DraftItem> items) {
  DSI_RETURN_IF_ERROR(health());
  DSI_RETURN_IF_ERROR(complete_deferred_drafts());   // (a call with no verification after it)
  DSI_RETURN_IF_ERROR(complete_deferred_samples());  // (its window is accounted before these)
  for (backend::DraftItem& it : items) it.deferred = false;
  const auto& c = config_;
  const int64_t width = c.hc_mult * c.hidden_size;
  std::vector<size_t> active;    // items that draft
  std::vector<size_t> catch_up;  // items that only catch up (num_steps 0)
  int32_t max_steps = 0;
  int64_t slot = 1;  // the first pass's rows per sequence: the most catch-up rows + 1
  const state::PageArena* arena = nullptr;
  for (size_t i = 0; i < items.size(); ++i) {
    backend::DraftItem& it = items[i];
    it.status = backend::check_mtp_draft(
        c, !weights_->mtp.empty(), *it.state, it.next_token, it.num_steps, it.catch_up);
    if (it.status.ok() && options_.comm != nullptr) {
      it.status = unimplemented("MTP drafting under expert parallelism is not supported yet");
    }
    if (!it.status.ok())
      continue;
    if (!arena)
      arena = it.state->arena();
    DSI_CHECK(it.state->arena() == arena, "one draft batch spans two state arenas");
    if (it.num_steps == 0) {
      if (!it.catch_up.empty())
        catch_up.push_back(i);
      continue;
    }
    active.push_back(i);
    max_steps = std::max(max_steps, it.num_steps);
    slot = std::max(slot, static_cast<int64_t>(it.catch_up.size()) + 1);
  }
  if (active.empty() && catch_up.empty())
    return Status();
  host_phases_.checked = std::chrono::steady_clock::now();  // (before's parts, host_end)
  DSI_RETURN_IF_ERROR(ensure_pool(*arena));
  if (!catch_up.empty())
    DSI_RETURN_IF_ERROR(mtp_catch_up_only(items, catch_up, *arena));
  if (active.empty())
    return Status();
  const int64_t n = static_cast<int64_t>(active.size());
  // Each step a fixed-shape pass (one row per sequence, padded to a power of two) replayed from
  // a graph, as the decode steps are; the rows beyond the sequences read row 0 and write nothing.
  const bool fixed = options_.cuda_graphs && n <= options_.max_graph_batch;
  call_decode_ = fixed;  // (timed as decode-shaped work, as account_decode_gap does)
  // The first pass's slot by the steps drafted rather than by this call's catch-up rows
  // (CudaModelOptions::draft_slot_by_steps): one graph per (batch, steps) in the steady state.
  if (fixed && options_.draft_slot_by_steps) {
    const int64_t bound = std::min<int64_t>(max_steps, items[active[0]].state->max_rollback()) + 1;
    slot = std::max(slot, bound);
  }
  // The kernels of decode steps (chosen by the row count alone), whether or not graphs are on, so
  // that eager and replayed drafts are the same.
  decode_step_ = n <= options_.max_graph_batch;
  const int64_t n_rows = fixed ? pow2_at_least(n) : n;
  // The first pass: each sequence's catch-up positions and its last one, in a slot of `slot` rows
  // (fixed shape: right-aligned, the rows before padding; otherwise packed).
  const size_t stream_bytes = static_cast<size_t>(n_rows * slot * width) * sizeof(float);
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
  // The picks back on the host (fetch; deferred_ writes them into the items). The launches write
  // at offsets of max_steps and n_rows: both are in the graph keys.
  // Each synchronisation ends a timed launch (CudaModelStats::decode_idle_ms: the gaps around a
  // drafting call count as a decode step's host time, its work as busy).
  auto fetch = [&]() -> Status {
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpyAsync(
            draft_results_.get(), draft_picks_, pick_bytes, cudaMemcpyDeviceToHost, stream_.get()),
        "copying the drafts"));
    host_mark(2);
    mark_launch_end();
    DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "MTP draft"));
    host_mark(3);
    account_decode_gap(fixed);
    return Status();
  };
  std::vector<int64_t> row_of(items.size(), -1);  // item -> its row in the previous step
  // One step's pass over the sequences `now` into pack: step 0 starts from the main model's final
  // streams of each sequence's catch-up positions and last position with their next tokens (the
  // catch-up tokens, then the pending token), step s from the streams of step s - 1 (row
  // row_of[item] of `in`) with the previous draft (token: chained steps leave 0, overwritten on
  // the device by the previous step's pick before this step runs). Step 0 with catch-up rows
  // (slot > 1) gathers each sequence's last row for the head (*head_id); row_of[item] gets the
  // item's row in this step's output.
  auto plan_step = [&](int32_t step,
                       const std::vector<size_t>& now,
                       bool chained,
                       HostPack& pack,
                       PassPlan* plan,
                       int32_t* src_id,
                       int32_t* bcast_id,
                       int32_t* head_id) {
    const int64_t L = step == 0 ? slot : 1;
    const int64_t seqs = static_cast<int64_t>(now.size());
    const int64_t seq_pad = fixed ? pow2_at_least(seqs) : seqs;
    std::vector<SeqSpan> spans;
    std::vector<int32_t> tokens;
    std::vector<int64_t> src;
    std::vector<int64_t> head;
    std::vector<int64_t> out_row(now.size());
    int64_t next_row = 0;
    for (size_t k = 0; k < now.size(); ++k) {
      backend::DraftItem& it = items[now[k]];
      state::SequenceState& st = *it.state;
      const int64_t pos0 = st.num_tokens() - 1;
      const int64_t lag = step == 0 ? static_cast<int64_t>(it.catch_up.size()) : 0;
      SeqSpan sp;
      sp.st = &st;
      sp.first = pos0 + step - lag;
      sp.n = lag + 1;
      sp.begin = fixed ? static_cast<int64_t>(k) * L + (L - sp.n) : next_row;
      sp.mtp = true;
      spans.push_back(sp);
      next_row = sp.begin + sp.n;
      tokens.resize(static_cast<size_t>(next_row), 0);
      src.resize(static_cast<size_t>(next_row), local_ref(0));
      for (int64_t t = 0; t < sp.n; ++t) {
        const size_t r = static_cast<size_t>(sp.begin + t);
        if (step == 0) {
          tokens[r] = t < lag ? it.catch_up[static_cast<size_t>(t)] : it.next_token;
          const int64_t fr = st.final_streams_row(sp.first + t);
          DSI_CHECK(fr >= 0,
                    "final streams of position %lld are gone",
                    static_cast<long long>(sp.first + t));
          src[r] = st.final_streams_rows().pool_offset(fr);
        } else {
          tokens[r] = chained ? 0 : it.tokens[step - 1];
          src[r] = local_ref(row_of[now[k]] * width);
        }
      }
      out_row[k] = next_row - 1;
      head.push_back(local_ref((next_row - 1) * width));
    }
    const int64_t plan_rows = fixed ? seq_pad * L : next_row;
    tokens.resize(static_cast<size_t>(plan_rows), 0);
    src.resize(static_cast<size_t>(plan_rows), local_ref(0));
    PlanContext ctx;
    ctx.config = &c;
    ctx.page_floats = arena->page_floats();
    ctx.fixed_shape = fixed;
    ctx.kv_width = kv_width();
    ctx.slot_rows = L;
    plan_pass(ctx, spans, tokens, plan_rows, pack, plan);
    *src_id = pack.add(src);
    std::vector<int64_t> bcast;
    for (int64_t r = 0; r < plan_rows; ++r) {
      for (int64_t j = 0; j < c.hc_mult; ++j) bcast.push_back(local_ref(r * c.hidden_size));
    }
    *bcast_id = pack.add(bcast);
    *head_id = -1;
    if (L > 1 || plan_rows != seq_pad) {
      head.resize(static_cast<size_t>(seq_pad), local_ref(0));
      *head_id = pack.add(head);
    }
    for (size_t k = 0; k < now.size(); ++k) row_of[now[k]] = out_row[k];
  };
  // The plan on the device, and the workspace in one piece before anything is launched (a move
  // drops the captured graphs).
  auto upload = [&](HostPack& pack, uint8_t** dev) -> Status {
    pack.layout(fixed);
    if (!host_phases_.has_parts) {  // the first upload ends the planning part of `before`
      host_phases_.planned = std::chrono::steady_clock::now();
      host_phases_.has_parts = true;
    }
    mark_launch_start();
    DSI_RETURN_IF_ERROR(upload_pack(pack, dev));
    host_mark(1);
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
                         int32_t head_id,
                         uint8_t* dev,
                         const HostPack& pack,
                         int64_t rows,
                         int32_t* next) -> Status {
    ws_->reset();
    float* in = static_cast<float*>(draft_streams_[step % 2]);
    float* out = static_cast<float*>(draft_streams_[(step + 1) % 2]);
    float* logits = nullptr;
    DSI_RETURN_IF_ERROR(
        launch_mtp(plan, src_id, bcast_id, in, dev, pack, out, &logits, head_id, rows));
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
          append_geometry_key(plan, &key);
        }
        return key;
      };

  // Every sequence drafting the same number of steps (fixed:K, auto's one depth per step): all
  // steps planned into one upload and launched as one graph, each step's picks written on the
  // device into the next step's tokens, one copy back and one synchronisation for the call (or
  // none, the drafts left on the device). One step too: only there can its drafts be deferred
  // (depth 1, the best depth of the bundled model at batch 16, was the step-at-a-time path).
  bool same_steps = max_steps >= 1;
  for (size_t i : active) same_steps = same_steps && items[i].num_steps == max_steps;
  if (same_steps) {
    HostPack pack;
    std::vector<PassPlan> plans(static_cast<size_t>(max_steps));
    std::vector<int32_t> src_ids(plans.size()), bcast_ids(plans.size()), head_ids(plans.size());
    for (int32_t step = 0; step < max_steps; ++step) {
      const size_t s = static_cast<size_t>(step);
      plan_step(step, active, true, pack, &plans[s], &src_ids[s], &bcast_ids[s], &head_ids[s]);
    }
    uint8_t* dev = nullptr;
    DSI_RETURN_IF_ERROR(upload(pack, &dev));
    auto chain = [&]() -> Status {
      for (int32_t step = 0; step < max_steps; ++step) {
        const size_t s = static_cast<size_t>(step);
        int32_t* next =
            step + 1 < max_steps ? pack.resolve<int32_t>(dev, plans[s + 1].tokens) : nullptr;
        DSI_RETURN_IF_ERROR(launch_step(
            step, plans[s], src_ids[s], bcast_ids[s], head_ids[s], dev, pack, n_rows, next));
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
    // Every drafting sequence verifies its drafts without reading them first: they stay on the
    // device for the verification (CudaModelOptions::defer_drafts), their copy back queued
    // behind the launches and written into the items when the verification completes.
    bool defer = options_.defer_drafts && fixed;
    for (size_t i : active) defer = defer && items[i].may_defer;
    if (defer) {
      DSI_RETURN_IF_ERROR(device::check_cuda(cudaMemcpyAsync(draft_results_.get(),
                                                             draft_picks_,
                                                             pick_bytes,
                                                             cudaMemcpyDeviceToHost,
                                                             stream_.get()),
                                             "copying the drafts"));
    } else {
      DSI_RETURN_IF_ERROR(fetch());
    }
    deferred_.reset(n_rows, pick_rows);
    for (size_t k = 0; k < active.size(); ++k) {
      backend::DraftItem& it = items[active[k]];
      deferred_.add({it.state, it.tokens, it.probs, it.num_steps, static_cast<int64_t>(k)});
      it.deferred = defer;
    }
    deferred_.seal();
    if (defer)
      launch_open_ = true;
    else
      deferred_.deliver(draft_results_.get());
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
      int32_t src_id = -1, bcast_id = -1, head_id = -1;
      plan_step(step, now, false, pack, &plan, &src_id, &bcast_id, &head_id);
      const int64_t rows = fixed ? pow2_at_least(static_cast<int64_t>(now.size()))
                                 : static_cast<int64_t>(now.size());
      uint8_t* dev = nullptr;
      DSI_RETURN_IF_ERROR(upload(pack, &dev));
      auto one = [&] {
        return launch_step(step, plan, src_id, bcast_id, head_id, dev, pack, rows, nullptr);
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
      deferred_.reset(n_rows, pick_rows);
      for (size_t k = 0; k < now.size(); ++k) {
        backend::DraftItem& it = items[now[k]];
        deferred_.add({it.state,
                       it.tokens + step,
                       it.probs + step,
                       1,
                       step * n_rows + static_cast<int64_t>(k)});
      }
      deferred_.deliver(draft_results_.get());
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

Status CudaModel::mtp_catch_up_only(std::span<backend::DraftItem> items,
                                    const std::vector<size_t>& which,
                                    const state::PageArena& arena) {
  // A rare call (a step whose sequences draft nothing after verifications that skipped their
  // MTP pass: auto's depth-0 steps, a sequence at its context limit): eager, every catch-up row
  // packed, streams from the pool.
  const auto& c = config_;
  std::vector<SeqSpan> spans;
  std::vector<int32_t> tokens;
  std::vector<int64_t> src;
  for (size_t i : which) {
    backend::DraftItem& it = items[i];
    state::SequenceState& st = *it.state;
    SeqSpan sp;
    sp.st = &st;
    sp.first = st.mtp_num_tokens();
    sp.n = static_cast<int64_t>(it.catch_up.size());
    sp.begin = static_cast<int64_t>(tokens.size());
    sp.mtp = true;
    spans.push_back(sp);
    for (int64_t t = 0; t < sp.n; ++t) {
      tokens.push_back(it.catch_up[static_cast<size_t>(t)]);
      const int64_t fr = st.final_streams_row(sp.first + t);
      DSI_CHECK(
          fr >= 0, "final streams of position %lld are gone", static_cast<long long>(sp.first + t));
      src.push_back(st.final_streams_rows().pool_offset(fr));
    }
  }
  const int64_t rows = static_cast<int64_t>(tokens.size());
  HostPack pack;
  PassPlan plan;
  PlanContext ctx;
  ctx.config = &c;
  ctx.page_floats = arena.page_floats();
  ctx.kv_width = kv_width();
  plan_pass(ctx, spans, tokens, rows, pack, &plan);
  const int32_t src_id = pack.add(src);
  std::vector<int64_t> bcast;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < c.hc_mult; ++j) bcast.push_back(local_ref(r * c.hidden_size));
  }
  const int32_t bcast_id = pack.add(bcast);
  pack.layout(false);
  decode_step_ = true;
  uint8_t* dev = nullptr;
  DSI_RETURN_IF_ERROR(upload_pack(pack, &dev));
  DSI_ASSIGN_OR_RETURN(bool moved, ws_->consolidate());
  if (moved)
    clear_graphs();
  ws_->reset();
  DSI_RETURN_IF_ERROR(launch_mtp(plan, src_id, bcast_id, nullptr, dev, pack, nullptr, nullptr));
  // The plan's staging memory is reused by the drafting pass that may follow.
  DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "MTP catch-up"));
  for (size_t i : which) {
    state::SequenceState& st = *items[i].state;
    st.set_mtp_num_tokens(st.num_tokens() - 1);
  }
  return Status();
}

}  // namespace dsinfer::gpu
