// DeviceWeights::upload: one pass collects (source, bytes, destination field), one cudaMalloc,
// then the copies; the per-expert MatrixRef arrays are built afterwards from the device
// addresses and copied in a second, small allocation.
#include "backend/cuda/device_weights.h"

#include <cuda_runtime_api.h>

#include <functional>

#include "base/check.h"
#include "base/strings.h"
#include "device/device_error.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/moe_gemv.h"

namespace dsinfer::gpu {
namespace {

int64_t align256(int64_t v) {
  return (v + 255) / 256 * 256;
}

class Uploader {
 public:
  void bytes(const void* src, int64_t n, std::function<void(const void*)> set) {
    if (src == nullptr || n <= 0) {
      set(nullptr);
      return;
    }
    const int64_t off = align256(total_);
    total_ = off + n;
    jobs_.push_back(Job{src, n, off, std::move(set)});
  }
  void vec(const std::vector<float>& v, const float** dst) {
    bytes(v.data(), static_cast<int64_t>(v.size() * sizeof(float)), [dst](const void* p) {
      *dst = static_cast<const float*>(p);
    });
  }
  void matrix(const MatrixRef& h, MatrixRef* d) {
    *d = h;
    bytes(h.data, h.data_bytes(), [d](const void* p) { d->data = p; });
    bytes(h.scale, h.scale_bytes(), [d](const void* p) { d->scale = p; });
  }
  void hc(const std::vector<float>& fn,
          const std::vector<float>& base,
          const std::vector<float>& scale,
          DHyperConn* d) {
    vec(fn, &d->fn);
    vec(base, &d->base);
    vec(scale, &d->scale);
  }
  int64_t total() const { return total_; }
  Status run(void** mem) {
    if (total_ == 0) {
      *mem = nullptr;
      return Status();
    }
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaMalloc(mem, static_cast<size_t>(total_)),
                                           "cudaMalloc for the model weights"));
    auto* base = static_cast<uint8_t*>(*mem);
    for (Job& j : jobs_) {
      DSI_RETURN_IF_ERROR(device::check_cuda(
          cudaMemcpy(base + j.off, j.src, static_cast<size_t>(j.n), cudaMemcpyHostToDevice),
          "copying the model weights to the device"));
      j.set(base + j.off);
    }
    return Status();
  }

 private:
  struct Job {
    const void* src;
    int64_t n;
    int64_t off;
    std::function<void(const void*)> set;
  };
  std::vector<Job> jobs_;
  int64_t total_ = 0;
};

void add_compressor(Uploader& u, const model::CompressorWeights& h, DCompressor* d) {
  u.matrix(h.wkv, &d->wkv);
  u.matrix(h.wgate, &d->wgate);
  u.vec(h.ape, &d->ape);
  u.vec(h.norm, &d->norm);
}

// Expert MatrixRef arrays, filled once the device addresses are known.
struct ExpertArrays {
  std::vector<MatrixRef> w1, w3, w2, s1, s3, s2;
};

// Routed experts [first, first + count) of every MoE layer are uploaded (count < 0: all).
struct ExpertShard {
  int64_t first = 0;
  int64_t count = -1;
};

void add_layer(Uploader& u,
               const model::LayerWeights& h,
               const ExpertShard& shard,
               DLayer* d,
               ExpertArrays* ex) {
  u.vec(h.attn_norm, &d->attn_norm);
  u.vec(h.ffn_norm, &d->ffn_norm);
  u.hc(h.hc_attn.fn, h.hc_attn.base, h.hc_attn.scale, &d->hc_attn);
  u.hc(h.hc_ffn.fn, h.hc_ffn.base, h.hc_ffn.scale, &d->hc_ffn);
  const auto& a = h.attn;
  DAttention& da = d->attn;
  u.matrix(a.wq_a, &da.wq_a);
  u.matrix(a.wq_b, &da.wq_b);
  u.matrix(a.wkv, &da.wkv);
  u.matrix(a.wo_a, &da.wo_a);
  u.matrix(a.wo_b, &da.wo_b);
  u.vec(a.q_norm, &da.q_norm);
  u.vec(a.kv_norm, &da.kv_norm);
  u.vec(a.attn_sink, &da.sinks);
  add_compressor(u, a.compressor, &da.comp);
  u.matrix(a.indexer_wq_b, &da.indexer_wq_b);
  u.matrix(a.indexer_weights_proj, &da.indexer_weights_proj);
  add_compressor(u, a.indexer_compressor, &da.index_comp);
  const auto& m = h.ffn;
  u.matrix(m.gate, &d->moe.gate);
  u.vec(m.bias, &d->moe.bias);
  u.bytes(m.tid2eid.data(),
          static_cast<int64_t>(m.tid2eid.size() * sizeof(int32_t)),
          [d](const void* p) { d->moe.tid2eid = static_cast<const int32_t*>(p); });
  const size_t all = m.experts.size();
  const size_t first = static_cast<size_t>(shard.first);
  const size_t ne = shard.count < 0 ? all : static_cast<size_t>(shard.count);
  DSI_CHECK(first + ne <= all, "expert shard [%zu, %zu) of %zu experts", first, first + ne, all);
  ex->w1.resize(ne);
  ex->w3.resize(ne);
  ex->w2.resize(ne);
  for (size_t e = 0; e < ne; ++e) {
    u.matrix(m.experts[first + e].w1, &ex->w1[e]);
    u.matrix(m.experts[first + e].w3, &ex->w3[e]);
    u.matrix(m.experts[first + e].w2, &ex->w2[e]);
  }
  d->moe.first_expert = shard.first;
  d->moe.num_local_experts = static_cast<int64_t>(ne);
  ex->s1.resize(1);
  ex->s3.resize(1);
  ex->s2.resize(1);
  u.matrix(m.shared.w1, &ex->s1[0]);
  u.matrix(m.shared.w3, &ex->s3[0]);
  u.matrix(m.shared.w2, &ex->s2[0]);
  d->moe.inter = all > 0 ? m.experts[0].w1.rows : 0;
  d->moe.shared_inter = m.shared.w1.rows;
}

}  // namespace

Result<std::unique_ptr<DeviceWeights>> DeviceWeights::upload(const model::ModelConfig& c,
                                                             const model::ModelWeights& w,
                                                             int64_t expert_first,
                                                             int64_t expert_count) {
  const ExpertShard shard{expert_first, expert_count};
  std::unique_ptr<DeviceWeights> d(new DeviceWeights());
  Uploader u;
  u.matrix(w.embed, &d->embed);
  u.matrix(w.head, &d->head);
  u.vec(w.norm, &d->norm);
  u.hc(w.hc_head.fn, w.hc_head.base, w.hc_head.scale, &d->hc_head);
  // Sized up front: the uploader keeps pointers into these vectors.
  d->layers.resize(w.layers.size());
  d->mtp.resize(w.mtp.size());
  std::vector<ExpertArrays> experts(w.layers.size() + w.mtp.size());
  for (size_t l = 0; l < w.layers.size(); ++l)
    add_layer(u, w.layers[l], shard, &d->layers[l], &experts[l]);
  for (size_t i = 0; i < w.mtp.size(); ++i) {
    const model::MtpWeights& h = w.mtp[i];
    DMtp& dm = d->mtp[i];
    u.matrix(h.e_proj, &dm.e_proj);
    u.matrix(h.h_proj, &dm.h_proj);
    u.vec(h.enorm, &dm.enorm);
    u.vec(h.hnorm, &dm.hnorm);
    u.vec(h.norm, &dm.norm);
    u.hc(h.hc_head.fn, h.hc_head.base, h.hc_head.scale, &dm.hc_head);
    add_layer(u, h.layer, shard, &dm.layer, &experts[w.layers.size() + i]);
  }
  const std::vector<float> inv_main = model::rope_inv_freq(c.rope_main, c.qk_rope_head_dim);
  const std::vector<float> inv_comp = model::rope_inv_freq(c.rope_compress, c.qk_rope_head_dim);
  u.vec(inv_main, &d->inv_freq_main);
  u.vec(inv_comp, &d->inv_freq_compress);
  d->bytes_ = u.total();
  DSI_RETURN_IF_ERROR(u.run(&d->mem_));

  // The expert MatrixRef arrays (device addresses are known now).
  std::vector<MatrixRef> refs;
  std::vector<size_t> starts;
  for (const ExpertArrays& ex : experts) {
    for (const auto* v : {&ex.w1, &ex.w3, &ex.w2, &ex.s1, &ex.s3, &ex.s2}) {
      starts.push_back(refs.size());
      refs.insert(refs.end(), v->begin(), v->end());
    }
  }
  if (!refs.empty()) {
    const size_t nbytes = refs.size() * sizeof(MatrixRef);
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaMalloc(&d->refs_mem_, nbytes), "cudaMalloc for expert tables"));
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaMemcpy(d->refs_mem_, refs.data(), nbytes, cudaMemcpyHostToDevice),
                           "copying expert tables"));
    d->bytes_ += static_cast<int64_t>(nbytes);
  }
  const auto* base = static_cast<const MatrixRef*>(d->refs_mem_);
  size_t k = 0;
  // Whether a set of experts can take the tensor-core path (one format, each readable by it).
  auto fast = [](const std::vector<MatrixRef>& w1,
                 const std::vector<MatrixRef>& w3,
                 const std::vector<MatrixRef>& w2,
                 WeightFormat* format) {
    if (w1.empty())
      return false;
    *format = w1[0].format;
    for (const auto* v : {&w1, &w3, &w2}) {
      for (const MatrixRef& m : *v) {
        if (m.format != *format || !cuda::fp8_gemm_supports(m))
          return false;
      }
    }
    return true;
  };
  size_t arrays = 0;
  auto bind = [&](DMoe& m) {
    const ExpertArrays& ex = experts[arrays++];
    m.routed_fast = fast(ex.w1, ex.w3, ex.w2, &m.routed_format);
    m.shared_fast = fast(ex.s1, ex.s3, ex.s2, &m.shared_format);
    m.w1 = base + starts[k++];
    m.w3 = base + starts[k++];
    m.w2 = base + starts[k++];
    m.shared_w1 = base + starts[k++];
    m.shared_w3 = base + starts[k++];
    m.shared_w2 = base + starts[k++];
  };
  for (DLayer& l : d->layers) bind(l.moe);
  for (DMtp& m : d->mtp) bind(m.layer.moe);
  return d;
}

Result<int64_t> DeviceWeights::add_moe_fp8_copies(int64_t reserve_bytes, bool routed) {
#if DSINFER_HAVE_CUTLASS
  int* inexact = nullptr;
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaMalloc(reinterpret_cast<void**>(&inexact), sizeof(int)),
                         "cudaMalloc (re-encode counter)"));
  int64_t done = 0;
  // One expert set (device MatrixRef arrays) -> its E4M3 copy in *out, when it fits and is exact.
  auto copy_set = [&](const MatrixRef* w1,
                      const MatrixRef* w3,
                      const MatrixRef* w2,
                      WeightFormat format,
                      int64_t n_experts,
                      int64_t inter,
                      cuda::MoeFp8Weights* out) -> Status {
    MatrixRef first;
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpy(&first, w1, sizeof(MatrixRef), cudaMemcpyDeviceToHost), "expert table"));
    const int64_t hidden = first.cols;
    if (!cuda::moe_sm90_supports(hidden, inter))
      return Status();
    // One scale per 128 x 128 block where E4M3 holds every value under it (the cheaper GEMM main
    // loop), else one per row and K block; neither: these experts keep the W4A8/W8A8 kernels.
    for (const int scale_rows : {128, 1}) {
      const int64_t bytes = cuda::moe_fp8_weights_bytes(n_experts, hidden, inter, scale_rows);
      size_t free_b = 0;
      size_t total_b = 0;
      DSI_RETURN_IF_ERROR(device::check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"));
      if (static_cast<int64_t>(free_b) < bytes + reserve_bytes)
        return Status();  // does not fit
      void* mem = nullptr;
      DSI_RETURN_IF_ERROR(device::check_cuda(cudaMalloc(&mem, static_cast<size_t>(bytes)),
                                             "cudaMalloc (FP8 expert copy)"));
      const cuda::MoeFp8Weights w =
          cuda::moe_fp8_weights_carve(mem, n_experts, hidden, inter, scale_rows);
      DSI_RETURN_IF_ERROR(
          device::check_cuda(cudaMemset(inexact, 0, sizeof(int)), "re-encode counter"));
      DSI_RETURN_IF_ERROR(cuda::launch_moe_fp8_reencode(w1, w3, w2, format, w, inexact, nullptr));
      int bad = 0;
      DSI_RETURN_IF_ERROR(device::check_cuda(
          cudaMemcpy(&bad, inexact, sizeof(int), cudaMemcpyDeviceToHost), "re-encode counter"));
      if (bad > 0) {
        DSI_RETURN_IF_ERROR(device::check_cuda(cudaFree(mem), "cudaFree (FP8 expert copy)"));
        continue;
      }
      fp8_mem_.push_back(mem);
      bytes_ += bytes;
      *out = w;
      return Status();
    }
    return Status();
  };
  auto convert = [&](DMoe& m) -> Status {
    if (routed && m.routed_fast && m.num_local_experts > 0 && m.routed_fp8.n_experts == 0) {
      DSI_RETURN_IF_ERROR(
          copy_set(m.w1, m.w3, m.w2, m.routed_format, m.num_local_experts, m.inter, &m.routed_fp8));
      done += m.routed_fp8.n_experts > 0;
    }
    if (m.shared_fast && m.shared_inter > 0 && m.shared_fp8.n_experts == 0) {
      DSI_RETURN_IF_ERROR(copy_set(m.shared_w1,
                                   m.shared_w3,
                                   m.shared_w2,
                                   m.shared_format,
                                   1,
                                   m.shared_inter,
                                   &m.shared_fp8));
    }
    return Status();
  };
  const Status st = for_each_moe(convert);
  const cudaError_t err = cudaFree(inexact);
  DSI_CHECK(device::release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
  DSI_RETURN_IF_ERROR(st);
  return done;
#else
  (void)reserve_bytes;
  (void)routed;
  return int64_t{0};
#endif
}

Result<int64_t> DeviceWeights::add_moe_w4a8() {
#if DSINFER_HAVE_CUTLASS
  if (!cuda::moe_w4a8_available())
    return int64_t{0};
  int* inexact = nullptr;
  DSI_RETURN_IF_ERROR(
      device::check_cuda(cudaMalloc(reinterpret_cast<void**>(&inexact), sizeof(int)),
                         "cudaMalloc (W4A8 exponent counter)"));
  int64_t done = 0;
  auto prepare = [&](DMoe& m) -> Status {
    if (!m.routed_fast || m.num_local_experts == 0 || m.routed_format != WeightFormat::kMxfp4 ||
        m.routed_w4.n_experts > 0)
      return Status();
    MatrixRef first;
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpy(&first, m.w1, sizeof(MatrixRef), cudaMemcpyDeviceToHost), "expert table"));
    const int64_t hidden = first.cols;
    if (!cuda::moe_w4a8_supports(hidden, m.inter))
      return Status();
    const int64_t bytes = cuda::moe_mxfp4_exponent_bytes(m.num_local_experts, hidden, m.inter);
    void* mem = nullptr;
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaMalloc(&mem, static_cast<size_t>(bytes)),
                                           "cudaMalloc (W4A8 block exponents)"));
    const cuda::MoeMxfp4Weights w =
        cuda::moe_mxfp4_weights_carve(mem, m.w1, m.w3, m.w2, m.num_local_experts, hidden, m.inter);
    DSI_RETURN_IF_ERROR(
        device::check_cuda(cudaMemset(inexact, 0, sizeof(int)), "W4A8 exponent counter"));
    DSI_RETURN_IF_ERROR(cuda::launch_moe_mxfp4_scales(w, inexact, nullptr));
    int bad = 0;
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpy(&bad, inexact, sizeof(int), cudaMemcpyDeviceToHost), "W4A8 exponent counter"));
    if (bad > 0)  // E4M3 cannot hold these experts under one scale per row block
      return device::check_cuda(cudaFree(mem), "cudaFree (W4A8 block exponents)");
    fp8_mem_.push_back(mem);
    bytes_ += bytes;
    m.routed_w4 = w;
    ++done;
    return Status();
  };
  const Status st = for_each_moe(prepare);
  const cudaError_t err = cudaFree(inexact);
  DSI_CHECK(device::release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
  DSI_RETURN_IF_ERROR(st);
  return done;
#else
  return int64_t{0};
#endif
}

Result<int64_t> DeviceWeights::enable_expert_gemv() {
  int* bad = nullptr;
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaMalloc(reinterpret_cast<void**>(&bad), sizeof(int)),
                                         "cudaMalloc (expert GEMV check)"));
  int64_t done = 0;
  // One expert set: whether the GEMVs read it exactly.
  auto check = [&](const MatrixRef* w1,
                   const MatrixRef* w3,
                   const MatrixRef* w2,
                   WeightFormat format,
                   int64_t n_experts,
                   int64_t inter,
                   bool* ok) -> Status {
    *ok = false;
    if (n_experts == 0 || inter == 0)
      return Status();
    MatrixRef first;
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpy(&first, w1, sizeof(MatrixRef), cudaMemcpyDeviceToHost), "expert table"));
    DSI_ASSIGN_OR_RETURN(
        *ok, cuda::expert_gemv_takes(w1, w3, w2, format, n_experts, first.cols, inter, bad));
    return Status();
  };
  auto mark = [&](DMoe& m) -> Status {
    if (m.routed_fast) {
      DSI_RETURN_IF_ERROR(
          check(m.w1, m.w3, m.w2, m.routed_format, m.num_local_experts, m.inter, &m.routed_gemv));
      done += m.routed_gemv;
    }
    if (m.shared_fast) {
      DSI_RETURN_IF_ERROR(check(m.shared_w1,
                                m.shared_w3,
                                m.shared_w2,
                                m.shared_format,
                                1,
                                m.shared_inter,
                                &m.shared_gemv));
    }
    return Status();
  };
  const Status st = for_each_moe(mark);
  const cudaError_t err = cudaFree(bad);
  DSI_CHECK(device::release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
  DSI_RETURN_IF_ERROR(st);
  return done;
}

Result<int64_t> DeviceWeights::add_wo_a_bf16_copies() {
#if DSINFER_HAVE_CUTLASS
  int64_t done = 0;
  auto convert = [&](DAttention& a) -> Status {
    const MatrixRef& w = a.wo_a;
    if (w.empty() || w.format != WeightFormat::kFp8Block128 || !a.wo_a_bf16.empty())
      return Status();
    void* mem = nullptr;
    const size_t bytes = static_cast<size_t>(w.rows * w.cols * 2);
    DSI_RETURN_IF_ERROR(device::check_cuda(cudaMalloc(&mem, bytes), "cudaMalloc (BF16 wo_a)"));
    fp8_mem_.push_back(mem);
    bytes_ += static_cast<int64_t>(bytes);
    DSI_RETURN_IF_ERROR(cuda::fp8_block_to_bf16(w, static_cast<uint16_t*>(mem), nullptr));
    a.wo_a_bf16 = w;
    a.wo_a_bf16.format = WeightFormat::kFloat;
    a.wo_a_bf16.dtype = DType::kBF16;
    a.wo_a_bf16.data = mem;
    a.wo_a_bf16.scale = nullptr;
    ++done;
    return Status();
  };
  for (DLayer& l : layers) DSI_RETURN_IF_ERROR(convert(l.attn));
  for (DMtp& t : mtp) DSI_RETURN_IF_ERROR(convert(t.layer.attn));
  DSI_RETURN_IF_ERROR(device::check_cuda(cudaDeviceSynchronize(), "BF16 wo_a copies"));
  return done;
#else
  return int64_t{0};
#endif
}

DeviceWeights::~DeviceWeights() {
  for (void* p : fp8_mem_) {
    const cudaError_t err = cudaFree(p);
    DSI_CHECK(device::release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
  }
  for (void* p : {mem_, refs_mem_}) {
    if (p == nullptr)
      continue;
    const cudaError_t err = cudaFree(p);
    DSI_CHECK(device::release_ok(err), "cudaFree: %s", cudaGetErrorString(err));
  }
}

}  // namespace dsinfer::gpu
