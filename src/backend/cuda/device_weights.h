// The checkpoint on the GPU: every tensor of model::ModelWeights copied once into one device
// allocation, matrices in their checkpoint formats (FP8 128x128 blocks, MXFP4, bf16 — never
// expanded), small vectors as fp32. The structs mirror model/weights.h with device pointers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
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

 private:
  DeviceWeights() = default;
  void* mem_ = nullptr;
  void* refs_mem_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace dsinfer::gpu
