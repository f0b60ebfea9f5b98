// The checkpoint on the GPU: every tensor of model::ModelWeights copied once into one device
// allocation, matrices in their checkpoint formats (FP8 128x128 blocks, MXFP4, bf16 — never
// expanded), small vectors as fp32. The structs mirror model/weights.h with device pointers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "kernels/cuda/moe_sm90.h"
#include "kernels/cuda/moe_w4a8_sm90.h"
#include "model/config.h"
#include "model/weights.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::gpu {

struct DHyperConn {
  const float* fn = nullptr;
  const float* base = nullptr;
  const float* scale = nullptr;
};

struct DCompressor {
  MatrixRef wkv;
  MatrixRef wgate;
  const float* ape = nullptr;
  const float* norm = nullptr;
};

struct DAttention {
  MatrixRef wq_a, wq_b, wkv, wo_a, wo_b;
  MatrixRef wo_a_bf16;  // add_wo_a_bf16_copies: BF16 wo_a, or empty
  const float* q_norm = nullptr;
  const float* kv_norm = nullptr;
  const float* sinks = nullptr;
  DCompressor comp;
  MatrixRef indexer_wq_b, indexer_weights_proj;
  DCompressor index_comp;
};

struct DMoe {
  MatrixRef gate;
  const float* bias = nullptr;       // null: no bias
  const int32_t* tid2eid = nullptr;  // hash layers
  // Device arrays of MatrixRef: this rank's routed experts [num_local_experts] (global ids
  // first_expert ...; all of them without expert parallelism), shared expert [1].
  int64_t first_expert = 0;
  int64_t num_local_experts = 0;
  const MatrixRef* w1 = nullptr;
  const MatrixRef* w3 = nullptr;
  const MatrixRef* w2 = nullptr;
  const MatrixRef* shared_w1 = nullptr;
  const MatrixRef* shared_w3 = nullptr;
  const MatrixRef* shared_w2 = nullptr;
  int64_t inter = 0;
  int64_t shared_inter = 0;
  // Whether the routed / shared experts can run on the FP8 tensor-core kernels (fp8_gemm.h), and
  // their format there.
  bool routed_fast = false;
  bool shared_fast = false;
  WeightFormat routed_format = WeightFormat::kMxfp4;
  WeightFormat shared_format = WeightFormat::kFp8Block128;
  // The routed experts re-encoded for the grouped wgmma path (moe_sm90.h; add_moe_fp8_copies),
  // or n_experts == 0 when this layer has none.
  cuda::MoeFp8Weights routed_fp8;
  cuda::MoeFp8Weights shared_fp8;  // the shared expert, likewise
  // And/or the MXFP4 routed experts as they are, with their block exponents, for the grouped W4A8
  // wgmma GEMMs (moe_w4a8_sm90.h; add_moe_w4a8), n_experts == 0 when unused.
  cuda::MoeMxfp4Weights routed_w4;
  // Whether decode-sized batches may run these experts on the grouped GEMVs (moe_gemv.h; set by
  // enable_expert_gemv after the scale check).
  bool routed_gemv = false;
  bool shared_gemv = false;
};

struct DLayer {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  DHyperConn hc_attn, hc_ffn;
  DAttention attn;
  DMoe moe;
};

struct DMtp {
  MatrixRef e_proj, h_proj;
  const float* enorm = nullptr;
  const float* hnorm = nullptr;
  const float* norm = nullptr;
  DHyperConn hc_head;
  DLayer layer;
};

class DeviceWeights {
 public:
  // Copies every tensor (synchronously); of the routed experts only [expert_first,
  // expert_first + expert_count) (expert_count < 0: all). Fails with kResourceExhausted when the
  // device is full.
  static Result<std::unique_ptr<DeviceWeights>> upload(const model::ModelConfig& config,
                                                       const model::ModelWeights& weights,
                                                       int64_t expert_first = 0,
                                                       int64_t expert_count = -1);
  ~DeviceWeights();
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  MatrixRef embed, head;
  const float* norm = nullptr;
  DHyperConn hc_head;
  std::vector<DLayer> layers;
  std::vector<DMtp> mtp;
  const float* inv_freq_main = nullptr;
  const float* inv_freq_compress = nullptr;
  int64_t bytes() const { return bytes_; }

  // Builds every layer's routed-expert copy for the grouped wgmma path (moe_sm90.h: E4M3 with
  // per-row 128-block scales, twice the bytes of MXFP4; not with routed false) and the shared
  // expert's, while the device keeps reserve_bytes free. A layer whose experts E4M3 cannot hold
  // exactly, or that does not fit, keeps none. Returns how many layers got a routed copy (0 in
  // builds without CUTLASS).
  Result<int64_t> add_moe_fp8_copies(int64_t reserve_bytes, bool routed = true);
  // Gives the MXFP4 routed experts of every layer (with an FP8 copy from add_moe_fp8_copies or
  // not) the block exponents of the grouped W4A8 GEMMs (DMoe::routed_w4; 1/64 of the experts'
  // bytes) where E4M3 holds their values exactly under them. Returns how many layers qualified
  // (0 in builds without CUTLASS or off sm_90).
  Result<int64_t> add_moe_w4a8();
  // Gives every FP8 wo_a a BF16 copy (DAttention::wo_a_bf16, exact) for the wgmma BF16x2 path of
  // prefill-sized batches; builds without CUTLASS make none. Returns the copies made.
  Result<int64_t> add_wo_a_bf16_copies();
  // Marks the expert sets the grouped GEMVs can run exactly (moe_gemv.h: FP8 always, MXFP4 when
  // launch_expert_gemv_check finds no NaN scale code and aligned codes and scales).
  // Returns how many routed sets qualified.
  Result<int64_t> enable_expert_gemv();

 private:
  DeviceWeights() = default;
  // f(DMoe&) -> Status over every layer's MoE, then the MTP layers'; stops at the first error.
  template <class F>
  Status for_each_moe(F&& f) {
    for (DLayer& l : layers) DSI_RETURN_IF_ERROR(f(l.moe));
    for (DMtp& t : mtp) DSI_RETURN_IF_ERROR(f(t.layer.moe));
    return Status();
  }
  void* mem_ = nullptr;
  void* refs_mem_ = nullptr;
  std::vector<void*> fp8_mem_;  // add_moe_fp8_copies, add_moe_w4a8
  int64_t bytes_ = 0;
};

}  // namespace dsinfer::gpu
