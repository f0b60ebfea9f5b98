// fp8_gemm_sm90_gemm.h's split-K kernel (CUTLASS's stream-K scheduler in its split-K mode).
#include "kernels/cuda/fp8_gemm_sm90_gemm.cuh"

namespace dsinfer::cuda::fp8_sm90_detail {

using SplitDense = dense::Dense<cutlass::gemm::StreamKScheduler>;

Status run_split(const Problem& p, cudaStream_t stream) {
  return dense::run<SplitDense>(p, stream);
}

size_t split_workspace_bytes(int m, int n, int k, int splits) {
  Problem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.lda = k;
  p.ldd = n;
  p.sfa_ld = (m + 3) / 4 * 4;
  p.splits = splits;
  return SplitDense::Gemm::get_workspace_size(dense::make_args<SplitDense>(p));
}

}  // namespace dsinfer::cuda::fp8_sm90_detail
