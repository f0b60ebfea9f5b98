// V41Weights: every tensor of a DeepSeek V4.1 text checkpoint bound to its role, in its checkpoint
// format (spec deepseek-v41.md §8.3). Matrices are MatrixRef views into the mmap'ed files; small
// vectors (norms, biases, sinks, mHC parameters, Engram q/k weights) are owned fp32 copies.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/matrix_ref.h"

namespace dsinfer::model_v41 {

struct HcSite {
  std::vector<float> fn;     // [(2+hc)*hc, hc*hidden], flat-stream norm weight folded in
  std::vector<float> base;   // [(2+hc)*hc]
  std::vector<float> scale;  // [3]
};

struct CompressorWeights {  // KV owners only
  MatrixRef wkv;            // [head_dim, hidden]
  MatrixRef wgate;          // [head_dim, hidden]; ratio 2 only
  std::vector<float> norm;  // [head_dim]
};

struct IndexerWeights {    // index sources only
  MatrixRef wq_b;          // [index_heads*index_head_dim, q_lora_rank]
  MatrixRef weights_proj;  // [index_heads, hidden]
  // Index-key owners only.
  MatrixRef wk;               // [index_head_dim, head_dim]
  std::vector<float> k_norm;  // [index_head_dim]
};

struct AttentionWeights {
  MatrixRef wq_a;                // [q_lora_rank, hidden]
  std::vector<float> q_norm;     // [q_lora_rank]
  MatrixRef wq_b;                // [heads*head_dim, q_lora_rank]
  MatrixRef wkv;                 // [head_dim, hidden]
  std::vector<float> kv_norm;    // [head_dim]
  MatrixRef wo_a;                // [o_groups*o_lora_rank, heads*head_dim/o_groups]
  MatrixRef wo_b;                // [hidden, o_groups*o_lora_rank]
  std::vector<float> attn_sink;  // [heads]
  CompressorWeights compressor;
  IndexerWeights indexer;
};

struct ExpertWeights {
  MatrixRef w1;  // gate [inter, hidden]
  MatrixRef w3;  // up   [inter, hidden]
  MatrixRef w2;  // down [hidden, inter]
};

struct MoeWeights {
  MatrixRef gate;              // router [n_experts, hidden]
  std::vector<float> bias;     // [n_experts], text tokens
  std::vector<float> bias_vl;  // [n_experts], image-class tokens
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
};

// One Engram table: rows x head_dim e4m3 values with one E8M0 scale per 32 (or plain floats in a
// transformers checkpoint saved unquantised, then `scale` is null).
struct EngramTable {
  const void* data = nullptr;
  const void* scale = nullptr;
  int64_t rows = 0;
  int64_t dim = 0;
  bool fp8 = false;
  int data_dtype = 0;  // DType of `data` (as int to keep this header light)
  // Row r dequantised into out[0, dim).
  void row(int64_t r, float* out) const;
};

struct EngramWeights {
  EngramTable table;
  MatrixRef wkv;                // [hidden*(hc+1), hash_cols*engram_head_dim]
  std::vector<float> q_weight;  // [hc, hidden]
  std::vector<float> k_weight;  // [hc, hidden]
};

struct LayerWeights {
  std::vector<float> attn_norm;
  std::vector<float> ffn_norm;
  HcSite hc_attn;
  HcSite hc_ffn;
  AttentionWeights attn;
  MoeWeights ffn;
  bool has_engram = false;
  EngramWeights engram;
};

struct DsparkBlockWeights {
  LayerWeights layer;  // window-only attention, DSpark MoE
};

struct DsparkWeights {
  std::vector<DsparkBlockWeights> blocks;
  MatrixRef main_proj;            // [hidden, 3*hidden]
  std::vector<float> main_norm;   // [hidden]
  std::vector<float> norm;        // [hidden]
  MatrixRef markov_embed;         // [vocab, markov_rank]
  MatrixRef markov_head;          // [vocab, markov_rank]
  std::vector<float> confidence;  // [hidden + markov_rank]
};

struct V41Weights {
  MatrixRef embed;  // [vocab, hidden]
  MatrixRef head;   // [vocab, hidden]
  std::vector<float> norm;
  std::vector<LayerWeights> layers;
  bool has_dspark = false;
  DsparkWeights dspark;
};

}  // namespace dsinfer::model_v41
