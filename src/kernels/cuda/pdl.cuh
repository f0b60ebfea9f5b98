// Programmatic dependent launch (PDL, sm_90): a kernel launched by launch_pdl may be scheduled
// while the kernel before it in the stream is still running, so that its launch and block start-up
// overlap that kernel's tail instead of following it (a decode step is ~175 small dependent
// kernels, each gap paid once per kernel).
//
// The contract that keeps it correct: every kernel launched by launch_pdl calls pdl_begin() as the
// first statement of its body (or pdl_begin_after(prologue), below, whose prologue touches only
// constant data), before it reads anything an earlier kernel wrote or writes anything an earlier
// kernel reads. pdl_begin waits until every prerequisite grid has completed and its
// memory is visible (griddepcontrol.wait), then lets the next kernel be scheduled
// (griddepcontrol.launch_dependents). Because every block waits before it can finish, a kernel
// launched this way never completes before its predecessor, so ordering stays transitive along
// the stream. tools/check_pdl.py checks the contract over the sources (run by test.sh).
//
// DSINFER_PDL=0 in the environment launches the same kernels without the attribute (plain stream
// order; pdl_begin is then a no-op wait): an A/B switch and a way out.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace dsinfer::cuda {

__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// pdl_begin() after a prologue that reads only data no kernel of the step writes (weights, their
// scales, constant tables): those loads are issued while the previous kernel still runs, so a
// GEMV's first round trip to memory overlaps that kernel's tail instead of following it. The
// prologue must not read activations, the state or anything else a kernel writes, and must not
// write memory. Without PDL (DSINFER_PDL=0) it simply runs first.
template <class F>
__device__ __forceinline__ void pdl_begin_after(F&& prologue) {
  prologue();
  pdl_begin();
}

inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("DSINFER_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic-serialization attribute
// (where enabled) and, with cluster.x > 0, thread-block clusters of that shape (grid a multiple of
// cluster in every dimension). Errors are left for the caller's launched() check
// (cudaGetLastError).
template <typename... Params, typename... Args>
void launch_pdl_cluster(void (*kernel)(Params...),
                        dim3 grid,
                        dim3 block,
                        size_t smem,
                        cudaStream_t stream,
                        dim3 cluster,
                        Args&&... args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster.x > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(std::forward<Args>(args))...);
}

// launch_pdl_cluster without clusters.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...),
                dim3 grid,
                dim3 block,
                size_t smem,
                cudaStream_t stream,
                Args&&... args) {
  launch_pdl_cluster(kernel, grid, block, smem, stream, dim3(0, 0, 0), std::forward<Args>(args)...);
}

}  // namespace dsinfer::cuda
