// The experts' SwiGLU on the device, shared by every expert kernel (moe.cu, fp8_gemm.cu,
// moe_gemv.cu, moe_gemv_mxfp4.cu, moe_sm90.cu): the gate clamped from above and the up value to
// [-limit, limit] when limit > 0, silu(gate) * up times the routing weight, in the CPU reference's
// order of correctly rounded operations (bit for bit).
#pragma once

namespace dsinfer::cuda {

__device__ __forceinline__ float swiglu_gated(float gv, float v, float limit, float weight) {
  if (limit > 0.0f) {
    gv = fminf(gv, limit);
    v = v < -limit ? -limit : (limit < v ? limit : v);
  }
  const float silu = __fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv)));
  return __fmul_rn(__fmul_rn(silu, v), weight);
}

}  // namespace dsinfer::cuda
