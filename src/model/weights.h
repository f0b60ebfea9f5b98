// ModelWeights: every tensor of a DeepSeek V4 checkpoint bound to its role, in its checkpoint
// format. Matrices are MatrixRef views into the mmap'ed files (never expanded); small vectors
// (norms, biases, sinks, mHC parameters, ape) are upcast to owned fp32 copies.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/matrix_ref.h"

namespace dsinfer::model {

struct HyperConnWeights {
  std::vector<float> fn;     // [(2+hc)*hc, hc*hidden]
  std::vector<float> base;   // [(2+hc)*hc]
  std::vector<float> scale;  // [3]
};

struct HyperHeadWeights {
  std::vector<float> fn;     // [hc, hc*hidden]
  std::vector<float> base;   // [hc]
  std::vector<float> scale;  // [1]
};

struct CompressorWeights {
  MatrixRef wkv;            // [(1+overlap)*d, hidden]
  MatrixRef wgate;          // [(1+overlap)*d, hidden]
  std::vector<float> ape;   // [ratio, (1+overlap)*d], added to the gate logits
  std::vector<float> norm;  // [d]
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
  CompressorWeights compressor;  // CSA / HCA only
  // CSA only: the Lightning indexer.
  MatrixRef indexer_wq_b;                // [index_n_heads*index_head_dim, q_lora_rank]
  MatrixRef indexer_weights_proj;        // [index_n_heads, hidden]
  CompressorWeights indexer_compressor;  // d = index_head_dim, overlap
};

struct ExpertWeights {
  MatrixRef w1;  // gate [inter, hidden]
  MatrixRef w3;  // up   [inter, hidden]
  MatrixRef w2;  // down [hidden, inter]
};

struct MoeWeights {
  MatrixRef gate;                // router [n_routed_experts, hidden]
  std::vector<float> bias;       // [n_routed_experts], score layers only (selection only)
  std::vector<int32_t> tid2eid;  // [vocab, top_k], hash layers only
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;  // n_shared_experts == 1
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  std::vector<float> ffn_norm;   // [hidden]
  HyperConnWeights hc_attn;
  HyperConnWeights hc_ffn;
  AttentionWeights attn;
  MoeWeights ffn;
};

struct MtpWeights {
  MatrixRef e_proj;          // [hidden, hidden]
  MatrixRef h_proj;          // [hidden, hidden]
  std::vector<float> enorm;  // [hidden]
  std::vector<float> hnorm;  // [hidden]
  std::vector<float> norm;   // [hidden]
  HyperHeadWeights hc_head;
  LayerWeights layer;
};

struct ModelWeights {
  MatrixRef embed;          // [vocab, hidden]
  MatrixRef head;           // [vocab, hidden]
  std::vector<float> norm;  // [hidden]
  HyperHeadWeights hc_head;
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;  // empty when the checkpoint carries no MTP weights
};

}  // namespace dsinfer::model
