// Numerics modes shared by every backend.
#pragma once

namespace dsinfer::model {

enum class Numerics {
  kReference,  // weights dequantised, fp32 activations, no activation/KV quantisation (= HF fp32)
  kDeepSeek,   // + DeepSeek's quantisation points (spec §3.12): 1x128 UE8M0 FP8 activations
               //   before FP8/FP4 GEMMs, FP8 (1x64) nope dims of KV, Hadamard + FP4 indexer q/k
};

inline const char* numerics_name(Numerics n) {
  return n == Numerics::kReference ? "reference" : "deepseek";
}

}  // namespace dsinfer::model
