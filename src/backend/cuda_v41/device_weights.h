// V41DeviceWeights: the V4.1 checkpoint on the GPU, every matrix in its checkpoint format (FP8
// 32x32 blocks, MXFP4 experts, BF16; never expanded) and the small vectors as fp32. The Engram
// tables stay in host memory (cpu_v41::EngramStore; only the rows a forward reads are copied)
// unless upload_engram_tables puts them on the device too (the `device` placement). Of the DSpark
// blocks only what the target forward needs to write their context KV (main_proj, main_norm, each
// block's wkv and kv_norm) and, for drafting on the device, the blocks, the final norm and the
// Markov head.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/device_weights.h"
#include "base/status.h"
#include "model_v41/config.h"
#include "model_v41/weights.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::gpu_v41 {

// An mHC site's fn / base / scale, as V4's.
using DHc = gpu::DHyperConn;

struct DAttention {
  MatrixRef wq_a, wq_b, wkv, wo_a, wo_b;
  const float* q_norm = nullptr;
  const float* kv_norm = nullptr;
  const float* sink = nullptr;
  MatrixRef comp_wkv, comp_wgate;  // KV owners (wgate: ratio > 1)
  const float* comp_norm = nullptr;
  MatrixRef idx_wq_b, idx_weights_proj;  // index sources
  MatrixRef idx_wk;                      // index-key owners
  const float* idx_k_norm = nullptr;
};

struct DMoe {
  MatrixRef gate;
  const float* bias = nullptr;
  int64_t n_experts = 0;
  int64_t inter = 0;
  int64_t shared_inter = 0;
  // Device arrays of MatrixRef: routed [n_experts], shared [1].
  const MatrixRef* w1 = nullptr;
  const MatrixRef* w3 = nullptr;
  const MatrixRef* w2 = nullptr;
  const MatrixRef* s1 = nullptr;
  const MatrixRef* s3 = nullptr;
  const MatrixRef* s2 = nullptr;
};

struct DEngram {
  MatrixRef wkv;
  const float* qk = nullptr;  // [hc, hidden]: q_weight * k_weight (the CPU's product)
};

// An Engram table in device memory, in its checkpoint format (model_v41::EngramTable's).
struct DEngramTable {
  const void* data = nullptr;
  const uint8_t* scale = nullptr;  // fp8: one E8M0 byte per 32 values
  int64_t rows = 0;
  int64_t dim = 0;
  bool fp8 = false;
  int data_dtype = 0;
};

struct DLayer {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  DHc hc_attn, hc_ffn;
  DAttention attn;
  DMoe moe;
  bool engram = false;
  DEngram eng;
};

struct DDsparkContext {
  MatrixRef main_proj;
  const float* main_norm = nullptr;
  std::vector<MatrixRef> wkv;         // per block
  std::vector<const float*> kv_norm;  // per block
};

// The DSpark draft blocks themselves (drafting on the device, dspark_draft.cc).
struct DDspark {
  std::vector<DLayer> blocks;
  const float* norm = nullptr;
  MatrixRef markov_embed;  // [vocab, markov_rank]
  MatrixRef markov_head;   // [vocab, markov_rank]
};

class V41DeviceWeights {
 public:
  static Result<std::unique_ptr<V41DeviceWeights>> upload(const model_v41::V41Config& c,
                                                          const model_v41::V41Weights& w,
                                                          bool dspark);
  ~V41DeviceWeights();
  V41DeviceWeights(const V41DeviceWeights&) = delete;
  V41DeviceWeights& operator=(const V41DeviceWeights&) = delete;

  MatrixRef embed, head;
  const float* norm = nullptr;
  std::vector<DLayer> layers;
  bool has_dspark = false;
  DDsparkContext dspark;
  DDspark draft;  // empty blocks without DSpark
  const float* inv_main = nullptr;
  const float* inv_compress = nullptr;
  // The Engram tables (one per engram_layer_ids entry, in that order) copied to the device as
  // the checkpoint stores them; errors name the layer and the bytes asked for.
  Status upload_engram_tables(const model_v41::V41Config& c, const model_v41::V41Weights& w);
  std::vector<DEngramTable> engram_tables;  // empty unless uploaded
  int64_t engram_table_bytes() const { return engram_bytes_; }
  int64_t bytes() const { return bytes_; }

 private:
  V41DeviceWeights() = default;
  Result<const void*> copy(const void* src, int64_t n);
  Status matrix(const MatrixRef& h, MatrixRef* d);
  Status vec(const std::vector<float>& v, const float** d);
  Status layer(const model_v41::V41Config& c, const model_v41::LayerWeights& h, DLayer* d);
  std::vector<void*> allocs_;
  int64_t bytes_ = 0;
  int64_t engram_bytes_ = 0;
};

}  // namespace dsinfer::gpu_v41
