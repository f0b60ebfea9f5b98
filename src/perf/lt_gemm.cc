// cuBLASLt dense GEMM (see lt_gemm.h).
#include "perf/lt_gemm.h"

#include <cublasLt.h>

#include <string>
#include <utility>
#include <vector>

#include "device/device_error.h"
#include "perf/device_memory.h"

namespace dsinfer::perf {
namespace {

// "<what>: CUBLAS_STATUS_NOT_SUPPORTED: <description>"; kResourceExhausted for allocation
// failures, kUnimplemented for unsupported configurations, kInternal otherwise. An execution
// failure may be a dead device: the sticky error, if any, is latched and returned instead.
Status lt_status(cublasStatus_t st, const std::string& what) {
  if (st == CUBLAS_STATUS_SUCCESS)
    return Status();
  if (st == CUBLAS_STATUS_EXECUTION_FAILED) {
    const Status dev = device::poll_device();
    if (!dev.ok())
      return dev.with_context(what);
  }
  StatusCode code = StatusCode::kInternal;
  if (st == CUBLAS_STATUS_ALLOC_FAILED)
    code = StatusCode::kResourceExhausted;
  else if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_ARCH_MISMATCH)
    code = StatusCode::kUnimplemented;
  return Status(code, what + ": " + cublasLtGetStatusName(st) + ": " + cublasLtGetStatusString(st));
}

#define DSI_LT_RETURN_IF_ERROR(expr, what) DSI_RETURN_IF_ERROR(lt_status((expr), (what)))

cudaDataType_t input_type(GemmInput t) {
  return t == GemmInput::kFp8E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
}

cudaDataType_t output_type(GemmOutput t) {
  return t == GemmOutput::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
}

constexpr int kMaxAlgos = 32;

}  // namespace

const char* gemm_input_name(GemmInput t) {
  return t == GemmInput::kFp8E4M3 ? "fp8_e4m3" : "bf16";
}

const char* gemm_output_name(GemmOutput t) {
  return t == GemmOutput::kBf16 ? "bf16" : "f32";
}

int64_t gemm_input_bytes(GemmInput t) {
  return t == GemmInput::kFp8E4M3 ? 1 : 2;
}

int64_t gemm_output_bytes(GemmOutput t) {
  return t == GemmOutput::kBf16 ? 2 : 4;
}

std::string describe(const GemmSpec& s) {
  return std::string(gemm_input_name(s.input)) + " " + std::to_string(s.m) + "x" +
         std::to_string(s.n) + "x" + std::to_string(s.k) + " -> " + gemm_output_name(s.output);
}

Status check_gemm_spec(const GemmSpec& s) {
  const std::string what = "GEMM " + describe(s);
  constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
  if (s.m < 1 || s.n < 1 || s.k < 1 || s.m > kMaxDim || s.n > kMaxDim || s.k > kMaxDim)
    return invalid_argument(what + ": m, n, k must be in [1, 2^31)");
  if (s.input != GemmInput::kFp8E4M3 && s.input != GemmInput::kBf16)
    return invalid_argument(what + ": unknown input type");
  if (s.output != GemmOutput::kBf16 && s.output != GemmOutput::kF32)
    return invalid_argument(what + ": unknown output type");
  if (s.input == GemmInput::kFp8E4M3 && (s.m % 16 != 0 || s.n % 16 != 0 || s.k % 16 != 0))
    return invalid_argument(what + ": FP8 needs m, n, k multiples of 16");
  if (s.workspace_bytes < 0)
    return invalid_argument(what + ": negative workspace size");
  if (s.max_algos < 1 || s.max_algos > kMaxAlgos)
    return invalid_argument(what + ": max_algos must be in [1, " + std::to_string(kMaxAlgos) + "]");
  return Status();
}

struct LtGemm::Impl {
  GemmSpec spec;
  std::string what;  // "cuBLASLt GEMM fp8_e4m3 MxNxK -> bf16"
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr;
  cublasLtMatrixLayout_t lb = nullptr;
  cublasLtMatrixLayout_t ld = nullptr;  // C and D (beta = 0, C is never read)
  DeviceMemory workspace;
  std::vector<cublasLtMatmulAlgo_t> algos;
  int selected = 0;

  ~Impl() {
    // Destroying descriptors and the handle only frees host state (and, for the handle, waits for
    // nothing); their statuses carry no information worth a failure here.
    if (ld != nullptr)
      (void)cublasLtMatrixLayoutDestroy(ld);
    if (lb != nullptr)
      (void)cublasLtMatrixLayoutDestroy(lb);
    if (la != nullptr)
      (void)cublasLtMatrixLayoutDestroy(la);
    if (op != nullptr)
      (void)cublasLtMatmulDescDestroy(op);
    if (handle != nullptr)
      (void)cublasLtDestroy(handle);
  }
};

LtGemm::LtGemm() = default;
LtGemm::LtGemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LtGemm::LtGemm(LtGemm&&) noexcept = default;
LtGemm& LtGemm::operator=(LtGemm&&) noexcept = default;
LtGemm::~LtGemm() = default;

Result<LtGemm> LtGemm::create(const GemmSpec& spec) {
  DSI_RETURN_IF_ERROR(check_gemm_spec(spec));
  auto impl = std::make_unique<Impl>();
  impl->spec = spec;
  impl->what = "cuBLASLt GEMM " + describe(spec);
  const std::string& what = impl->what;

  if (spec.input == GemmInput::kFp8E4M3) {
    int dev = 0, major = 0, minor = 0;
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaGetDevice(&dev), "cudaGetDevice"));
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                           "cudaDeviceGetAttribute"));
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev),
                           "cudaDeviceGetAttribute"));
    if (major * 10 + minor < 89) {
      return unimplemented(
          what + ": FP8 tensor cores need compute capability 8.9 or newer (device " +
          std::to_string(dev) + " is sm_" + std::to_string(major) + std::to_string(minor) + ")");
    }
  }

  DSI_LT_RETURN_IF_ERROR(cublasLtCreate(&impl->handle), what + ": cublasLtCreate");
  DSI_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&impl->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                         what + ": cublasLtMatmulDescCreate");
  // TN: op(A) = A^T with A stored k x m column-major (= [m, k] row-major), op(B) = B stored k x n
  // column-major (= [n, k] row-major); D is m x n column-major (= [n, m] row-major).
  const cublasOperation_t trans_a = CUBLAS_OP_T;
  const cublasOperation_t trans_b = CUBLAS_OP_N;
  DSI_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
                             impl->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)),
                         what + ": set TRANSA");
  DSI_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
                             impl->op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)),
                         what + ": set TRANSB");
  if (spec.input == GemmInput::kFp8E4M3) {
    const int8_t fast = spec.fp8_fast_accum ? 1 : 0;
    DSI_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
                               impl->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)),
                           what + ": set FAST_ACCUM");
  }
  const cudaDataType_t in = input_type(spec.input);
  const cudaDataType_t out = output_type(spec.output);
  const auto m = static_cast<uint64_t>(spec.m);
  const auto n = static_cast<uint64_t>(spec.n);
  const auto k = static_cast<uint64_t>(spec.k);
  DSI_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&impl->la, in, k, m, spec.k),
                         what + ": cublasLtMatrixLayoutCreate(A)");
  DSI_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&impl->lb, in, k, n, spec.k),
                         what + ": cublasLtMatrixLayoutCreate(B)");
  DSI_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&impl->ld, out, m, n, spec.m),
                         what + ": cublasLtMatrixLayoutCreate(D)");

  if (spec.workspace_bytes > 0) {
    DSI_ASSIGN_OR_RETURN(impl->workspace,
                         DeviceMemory::allocate(static_cast<size_t>(spec.workspace_bytes),
                                                "the cuBLASLt workspace"));
  }

  cublasLtMatmulPreference_t pref = nullptr;
  DSI_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref),
                         what + ": cublasLtMatmulPreferenceCreate");
  const auto ws = static_cast<uint64_t>(spec.workspace_bytes);
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(spec.max_algos));
  int returned = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(impl->handle,
                                        impl->op,
                                        impl->la,
                                        impl->lb,
                                        impl->ld,
                                        impl->ld,
                                        pref,
                                        spec.max_algos,
                                        results.data(),
                                        &returned);
  }
  (void)cublasLtMatmulPreferenceDestroy(pref);
  DSI_LT_RETURN_IF_ERROR(st, what + ": cublasLtMatmulAlgoGetHeuristic");
  for (int i = 0; i < returned; ++i) {
    if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
      impl->algos.push_back(results[static_cast<size_t>(i)].algo);
  }
  if (impl->algos.empty()) {
    return unimplemented(what + ": cublasLtMatmulAlgoGetHeuristic found no algorithm (workspace " +
                         std::to_string(spec.workspace_bytes) + " bytes)");
  }
  return LtGemm(std::move(impl));
}

const GemmSpec& LtGemm::spec() const {
  DSI_CHECK(impl_ != nullptr, "LtGemm used after move or default construction");
  return impl_->spec;
}

int LtGemm::num_algos() const {
  return impl_ == nullptr ? 0 : static_cast<int>(impl_->algos.size());
}

int LtGemm::selected_algo() const {
  return impl_ == nullptr ? 0 : impl_->selected;
}

Status LtGemm::select_algo(int i) {
  if (impl_ == nullptr)
    return failed_precondition("LtGemm: not created");
  if (i < 0 || i >= num_algos()) {
    return invalid_argument(impl_->what + ": algorithm " + std::to_string(i) + " of " +
                            std::to_string(num_algos()));
  }
  impl_->selected = i;
  return Status();
}

Status LtGemm::run(const void* a, const void* b, void* d, cudaStream_t stream) {
  if (impl_ == nullptr)
    return failed_precondition("LtGemm: not created");
  Impl& g = *impl_;
  if (a == nullptr || b == nullptr || d == nullptr)
    return invalid_argument(g.what + ": null device pointer");
  const float alpha = 1.0f;
  const float beta = 0.0f;
  DSI_LT_RETURN_IF_ERROR(cublasLtMatmul(g.handle,
                                        g.op,
                                        &alpha,
                                        a,
                                        g.la,
                                        b,
                                        g.lb,
                                        &beta,
                                        d,
                                        g.ld,
                                        d,
                                        g.ld,
                                        &g.algos[static_cast<size_t>(g.selected)],
                                        g.workspace.get(),
                                        g.workspace.size(),
                                        stream),
                         g.what + ": cublasLtMatmul");
  return device::check_launch(g.what.c_str());
}

}  // namespace dsinfer::perf
