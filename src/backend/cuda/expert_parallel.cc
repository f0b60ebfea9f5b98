// Expert parallelism in the CUDA forward (issue 8; docs/parallel.md): the routed experts of this
// rank's shard run on the (token, slot) pairs every rank sends here. Per MoE layer: the routing
// ids come to the host, parallel::plan_dispatch orders the pairs by destination rank, the
// counts and expert ids are exchanged, parallel::plan_receive groups the arrivals by local
// expert; activations and gates go out through comm::Comm::all_to_all_v, the grouped expert GEMM
// runs, the outputs return in arrival order and are combined at the source in ascending expert
// order — the single-GPU order, so the result is bit-identical for any number of ranks.
// Host round trips per layer: no CUDA graphs on this path (eager launches).
#include <cuda_runtime_api.h>

#include <vector>

#include "backend/cuda/cuda_model.h"
#include "device/device_error.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/paged.h"
#include "parallel/dispatch.h"

namespace dsinfer::gpu {
namespace {

template <typename T>
Status to_device(const std::vector<T>& v, T* dst, cudaStream_t s) {
  if (v.empty())
    return Status();
  return device::check_cuda(
      cudaMemcpyAsync(dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s),
      "expert-parallel plan upload");
}

std::vector<int64_t> scaled(const std::vector<int64_t>& v, int64_t by) {
  std::vector<int64_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i] * by;
  return out;
}

}  // namespace

Status CudaModel::launch_routed_ep(const DMoe& w,
                                   int64_t n,
                                   const float* u,
                                   const int32_t* ids,
                                   const float* gates,
                                   const float* shared,
                                   float* f) {
  const auto& c = config_;
  const cudaStream_t s = stream_.get();
  comm::Comm& cm = *options_.comm;
  const parallel::ExpertPartition& part = *partition_;
  const int ranks = cm.size();
  const int64_t k = c.num_experts_per_tok;
  const int64_t hidden = c.hidden_size;

  // 1. Plan the dispatch on the host from this rank's routing.
  std::vector<int32_t> ids_h(static_cast<size_t>(n * k));
  if (!ids_h.empty()) {
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpyAsync(ids_h.data(), ids, ids_h.size() * 4, cudaMemcpyDeviceToHost, s),
        "routing ids to the host"));
  }
  DSI_RETURN_IF_ERROR(device::sync_stream(s, "expert-parallel routing"));
  const parallel::DispatchPlan dp = parallel::plan_dispatch(part, ids_h.data(), n, k);
  DSI_DCHECK((dp.check(part, ids_h.data()), true), "dispatch plan");
  const int64_t ns = dp.num_sent();

  // 2. Counts, then the expert id of every pair, to the ranks that own them.
  std::vector<int64_t> recv_counts(static_cast<size_t>(ranks), 0);
  DSI_RETURN_IF_ERROR(cm.all_to_all_counts(dp.send_counts.data(), recv_counts.data(), s));
  std::vector<int64_t> recv_offsets(static_cast<size_t>(ranks) + 1, 0);
  for (int r = 0; r < ranks; ++r) recv_offsets[r + 1] = recv_offsets[r] + recv_counts[r];
  const int64_t nr = recv_offsets.back();
  int32_t* send_exp = nullptr;
  int32_t* recv_exp = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&send_exp, ns));
  DSI_RETURN_IF_ERROR(ws_->get(&recv_exp, nr));
  DSI_RETURN_IF_ERROR(to_device(dp.send_expert, send_exp, s));
  DSI_RETURN_IF_ERROR(cm.all_to_all_v(send_exp,
                                      dp.send_counts.data(),
                                      dp.send_offsets.data(),
                                      recv_exp,
                                      recv_counts.data(),
                                      recv_offsets.data(),
                                      4,
                                      s));
  std::vector<int32_t> recv_exp_h(static_cast<size_t>(nr));
  if (nr > 0) {
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpyAsync(
            recv_exp_h.data(), recv_exp, static_cast<size_t>(nr) * 4, cudaMemcpyDeviceToHost, s),
        "received expert ids to the host"));
  }
  DSI_RETURN_IF_ERROR(device::sync_stream(s, "expert-parallel id exchange"));
  std::vector<std::vector<int32_t>> received(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    received[r].assign(recv_exp_h.begin() + recv_offsets[r],
                       recv_exp_h.begin() + recv_offsets[r + 1]);
  }
  const parallel::ReceivePlan rp = parallel::plan_receive(part, cm.rank(), received);
  DSI_DCHECK((rp.check(part, received), true), "receive plan");

  // 3. Index arrays to the device: gather references for the outgoing rows and gates, the
  //    grouping of arrivals, the way back to arrival order, and each pair's send position.
  std::vector<int64_t> row_refs(static_cast<size_t>(ns)), gate_refs(static_cast<size_t>(ns));
  for (int64_t i = 0; i < ns; ++i) {
    row_refs[i] = local_ref(static_cast<int64_t>(dp.send_pair[i]) / k * hidden);
    gate_refs[i] = local_ref(dp.send_pair[i]);
  }
  std::vector<int64_t> back_refs(static_cast<size_t>(nr));
  for (int64_t a = 0; a < nr; ++a) back_refs[a] = local_ref(rp.grouped_position[a] * hidden);
  int64_t* d_row_refs = nullptr;
  int64_t* d_gate_refs = nullptr;
  int64_t* d_back_refs = nullptr;
  int64_t* d_expert_begin = nullptr;
  int32_t* d_order = nullptr;
  int32_t* d_pair_pos = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&d_row_refs, ns));
  DSI_RETURN_IF_ERROR(ws_->get(&d_gate_refs, ns));
  DSI_RETURN_IF_ERROR(ws_->get(&d_back_refs, nr));
  DSI_RETURN_IF_ERROR(ws_->get(&d_expert_begin, rp.num_local + 1));
  DSI_RETURN_IF_ERROR(ws_->get(&d_order, nr));
  DSI_RETURN_IF_ERROR(ws_->get(&d_pair_pos, n * k));
  DSI_RETURN_IF_ERROR(to_device(row_refs, d_row_refs, s));
  DSI_RETURN_IF_ERROR(to_device(gate_refs, d_gate_refs, s));
  DSI_RETURN_IF_ERROR(to_device(back_refs, d_back_refs, s));
  DSI_RETURN_IF_ERROR(to_device(rp.expert_begin, d_expert_begin, s));
  DSI_RETURN_IF_ERROR(to_device(rp.order, d_order, s));
  DSI_RETURN_IF_ERROR(to_device(dp.pair_position, d_pair_pos, s));

  // 4. Rows and gates out, in send order.
  float* send_x = nullptr;
  float* send_g = nullptr;
  float* recv_x = nullptr;
  float* recv_g = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&send_x, ns * hidden));
  DSI_RETURN_IF_ERROR(ws_->get(&send_g, ns));
  DSI_RETURN_IF_ERROR(ws_->get(&recv_x, nr * hidden));
  DSI_RETURN_IF_ERROR(ws_->get(&recv_g, nr));
  cuda::GatherRowsParams gx;
  gx.local = u;
  gx.src_refs = d_row_refs;
  gx.n = ns;
  gx.width = hidden;
  gx.dst = send_x;
  DSI_RETURN_IF_ERROR(cuda::launch_gather_rows(gx, s));
  cuda::GatherRowsParams gg;
  gg.local = gates;
  gg.src_refs = d_gate_refs;
  gg.n = ns;
  gg.width = 1;
  gg.dst = send_g;
  DSI_RETURN_IF_ERROR(cuda::launch_gather_rows(gg, s));
  const std::vector<int64_t> sc_x = scaled(dp.send_counts, hidden);
  const std::vector<int64_t> so_x = scaled(dp.send_offsets, hidden);
  const std::vector<int64_t> rc_x = scaled(recv_counts, hidden);
  const std::vector<int64_t> ro_x = scaled(recv_offsets, hidden);
  DSI_RETURN_IF_ERROR(
      cm.all_to_all_v(send_x, sc_x.data(), so_x.data(), recv_x, rc_x.data(), ro_x.data(), 4, s));
  DSI_RETURN_IF_ERROR(cm.all_to_all_v(send_g,
                                      dp.send_counts.data(),
                                      dp.send_offsets.data(),
                                      recv_g,
                                      recv_counts.data(),
                                      recv_offsets.data(),
                                      4,
                                      s));

  // 5. This rank's experts over the arrivals, grouped by local expert.
  float* h = nullptr;
  float* y = nullptr;
  float* y_arrival = nullptr;
  float* returned = nullptr;
  DSI_RETURN_IF_ERROR(ws_->get(&h, nr * w.inter));
  DSI_RETURN_IF_ERROR(ws_->get(&y, nr * hidden));
  DSI_RETURN_IF_ERROR(ws_->get(&y_arrival, nr * hidden));
  DSI_RETURN_IF_ERROR(ws_->get(&returned, ns * hidden));
  cuda::ExpertFfnParams ep;
  ep.w1 = w.w1;
  ep.w3 = w.w3;
  ep.w2 = w.w2;
  ep.n_experts = rp.num_local;
  ep.hidden = hidden;
  ep.inter = w.inter;
  ep.expert_begin = d_expert_begin;
  ep.pair_src = d_order;  // grouped position -> arrival index (x row, gate)
  ep.k = 1;
  ep.gates = recv_g;
  ep.x = recv_x;
  ep.num_pairs = nr;
  ep.swiglu_limit = static_cast<float>(c.swiglu_limit);
  ep.quantize_activations = q8();
  ep.h = h;
  ep.y = y;
  DSI_RETURN_IF_ERROR(cuda::launch_expert_ffn(ep, s));
  cuda::GatherRowsParams gb;
  gb.local = y;
  gb.src_refs = d_back_refs;
  gb.n = nr;
  gb.width = hidden;
  gb.dst = y_arrival;
  DSI_RETURN_IF_ERROR(cuda::launch_gather_rows(gb, s));

  // 6. Outputs back to their sources (the reverse exchange), combined in expert order.
  DSI_RETURN_IF_ERROR(cm.all_to_all_v(
      y_arrival, rc_x.data(), ro_x.data(), returned, sc_x.data(), so_x.data(), 4, s));
  cuda::MoeCombineParams cp;
  cp.n = n;
  cp.k = k;
  cp.hidden = hidden;
  cp.y = returned;
  cp.pair_pos = d_pair_pos;
  cp.expert_ids = ids;
  cp.shared = shared;
  cp.out = f;
  return cuda::launch_moe_combine(cp, s);
}

}  // namespace dsinfer::gpu
