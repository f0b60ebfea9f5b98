// Row-wise ops of the forward pass on the GPU: embedding gather, RMSNorm, RoPE, the FP8/FP4
// quantisation simulations and the Hadamard rotation. Device pointers in, Status out; every
// launcher validates its params, enqueues on `stream` and returns the launch status. Empty
// shapes launch nothing. CPU references: kernels/cpu/ops.h, numeric/quant.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/status.h"
#include "tensor/matrix_ref.h"

namespace dsinfer::cuda {

// out[t, j, :] = table row tokens[t] dequantised to fp32, for j < copies (the hc residual streams
// start as identical copies of the embedding). The table stays in its checkpoint format (any
// MatrixRef format). Token ids outside [0, table.rows) produce NaN rows (the engine validates ids
// before the forward; the kernel never reads outside the table).
struct EmbedParams {
  MatrixRef table;                  // device pointers, [vocab, dim]
  const int32_t* tokens = nullptr;  // [n]
  int64_t n = 0;
  int64_t copies = 1;
  float* out = nullptr;  // [n, copies, table.cols]
};
Status launch_embed(const EmbedParams& p, cudaStream_t stream);

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * (weight ? weight : 1) over `rows` rows of `dim`, as
// cpu::rms_norm (sum of squares in double). In place allowed (out == x).
// Optionally followed by the (forward) RoPE of each row's last 2 * rope_half dims, as launch_rope
// computes it, row r taking the position of token r / rope_rows_per_token (one pass: rows of up
// to 1024 dims, a multiple of 128, sit in one warp's registers).
struct RmsNormParams {
  const float* x = nullptr;  // [rows, dim]
  int64_t rows = 0;
  int64_t dim = 0;
  const float* weight = nullptr;  // [dim] or null
  float eps = 1e-6f;
  float* out = nullptr;                     // [rows, dim]
  const int64_t* rope_positions = nullptr;  // [rows / rope_rows_per_token] (with rope_half > 0)
  const float* rope_inv_freq = nullptr;     // [rope_half]
  int64_t rope_half = 0;
  int64_t rope_rows_per_token = 1;
  // Rows written as BF16 bits (RNE of the fp32 result) here instead of to `out` (which may then
  // be null); only where rms_norm_writes_bf16 (the one-warp-per-row kernel).
  uint16_t* out_bf16 = nullptr;
  // > 0: each output row rounded as the state stores a K=V record (deepseek numerics), after the
  // RoPE: dims [0, dim - 2 * rope_half) through UE8M0-scaled FP8 E4M3 in blocks of this many
  // values, the RoPE dims to BF16 -- the bits of launch_quant_sim's kFp8 pass over the former and
  // kBf16 pass over the latter. Only where rms_norm_stores_records.
  int64_t store_fp8_block = 0;
  // Optional: the fp32 output rows also quantised as a linear's FP8 activations (fp8_gemm.h
  // Fp8Acts, 1x128 UE8M0 blocks, launch_quantize_fp8's bits): codes [rows, fp8_acts_ld(dim)],
  // scales [rows, fp8_acts_ld(dim) / 128]. Written by the norm kernel itself (a norm feeding an
  // FP8 linear without a quantisation launch between them) for rows of 128 or 256 dims, and for
  // up to 512 rows of 256-1,024 dims (the split kernel); elsewhere by a launch_quantize_fp8 after
  // it. Needs `out`, not `out_bf16`.
  uint8_t* act_codes = nullptr;
  float* act_scales = nullptr;
};
Status launch_rms_norm(const RmsNormParams& p, cudaStream_t stream);
bool rms_norm_writes_bf16(int64_t dim, int64_t rope_half);
bool rms_norm_stores_records(int64_t dim, int64_t rope_half, int64_t fp8_block);

// Interleaved (GPT-J) RoPE on the last 2*half dims of each row, as cpu::rope_apply: row (t, h)
// at x + (t * heads + h) * ld is rotated by positions[t] (inverse: by -positions[t]).
struct RopeParams {
  float* x = nullptr;
  int64_t tokens = 0;
  int64_t heads = 1;                   // rows per token
  int64_t dim = 0;                     // row width; the rotated slice is [dim - 2*half, dim)
  int64_t ld = 0;                      // row stride in floats; 0 = dim
  const int64_t* positions = nullptr;  // [tokens]
  const float* inv_freq = nullptr;     // [half] (main or compress table)
  int64_t half = 0;
  bool inverse = false;
};
Status launch_rope(const RopeParams& p, cudaStream_t stream);

// In-place quantisation simulations of numeric/quant.h on the first `len` values of each row:
// kFp8: fp8_block_simulate(row, len, block) (1 x block E4M3, UE8M0 scales; KV nope dims use 64,
// activations 128); kFp4: fp4_block_simulate(row, len, block) (E2M1, block 32). With hadamard,
// the row's first `len` values (len a power of two) are rotated by numeric::hadamard_transform
// first (the indexer's queries and keys). kBf16: numeric::bf16_simulate (each value rounded to
// BF16, RNE; `block` is ignored). Bit-identical to the CPU functions.
enum class QuantSim { kNone, kFp8, kFp4, kBf16 };
struct QuantSimParams {
  float* x = nullptr;
  int64_t rows = 0;
  int64_t ld = 0;   // row stride; 0 = len
  int64_t len = 0;  // <= 4096 when hadamard
  int64_t block = 128;
  QuantSim kind = QuantSim::kFp8;
  bool hadamard = false;
};
Status launch_quant_sim(const QuantSimParams& p, cudaStream_t stream);

}  // namespace dsinfer::cuda
