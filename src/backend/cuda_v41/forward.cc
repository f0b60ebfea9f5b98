// The V4.1 forward on the GPU, step by step in V41CpuModel's order (backend/cpu_v41/model.cc).
// The host plans what depends on the state's page tables (ring slots, compressed-entry rows,
// compressor ring rows, window key lists) and makes the state's metadata changes in the CPU's
// order; the device does the arithmetic. Where the GPU sums in another order than the CPU (tree
// sums in the mHC mixes, the Engram gate and every linear; the attention softmax), docs/gpu.md
// lists it.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "backend/cuda_v41/backend.h"
#include "backend/forward_as_batch.h"
#include "base/check.h"
#include "device/device_error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/paged.h"
#include "kernels/cuda/v41.h"

namespace dsinfer::gpu_v41 {

using model_v41::V41LayerPlan;

// One sequence's rows in a pass.
struct Seg {
  state::SequenceState* st = nullptr;
  int64_t first = 0;  // position of the segment's first row
  int64_t n = 0;      // rows
  int64_t row0 = 0;   // the segment's first row in the pass
};

// The rows one forward carries through the layers: every item's rows, token-major, item after
// item (cut at the YOCO boundary by early exit, which runs a single item).
struct CudaV41Backend::Pass {
  std::vector<Seg> segs;
  int64_t n = 0;                 // rows
  float* X = nullptr;            // [n, hc, hidden] streams
  float* Xalt = nullptr;         // the post step's output, swapped with X
  float* pi = nullptr;           // [n, hc] carried mix
  const int64_t* pos = nullptr;  // [n] positions (device)
  bool exit_active = false;
  int64_t window_floor = 0;
  bool placeholder = false;
  int64_t cut = 0;                     // rows cut at the boundary so far
  cpu_v41::EngramStore::Pending rows;  // host placements: the store's gather
  // Device placement: per table, the row ids on the device ([n * hash_cols], token-major).
  std::vector<const int64_t*> device_rows;
  std::vector<int64_t> device_row_count;
};

// Values passed between layers within one forward (V41CpuModel::Shared).
struct CudaV41Backend::Shared {
  int32_t* topk = nullptr;  // [rows, topk_k] entry ids of the last index source, -1 = none
  int64_t topk_k = 0;
  int64_t topk_rows = 0;
  uint8_t* keep = nullptr;  // [rows, keep_keys] candidate pool of the candidate source
  int64_t keep_keys = 0;
  bool have_candidates = false;
  std::vector<const float*> features;  // DSpark target features [rows, hidden]
  std::vector<int64_t> feature_cut;    // Pass::cut when the feature was taken
};

namespace {

// Row positions of a pass.
std::vector<int64_t> row_positions(const std::vector<Seg>& segs, int64_t n) {
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (const Seg& g : segs) {
    for (int64_t t = 0; t < g.n; ++t) pos[static_cast<size_t>(g.row0 + t)] = g.first + t;
  }
  return pos;
}

}  // namespace

Status CudaV41Backend::forward(state::SequenceState& st,
                               std::span<const int32_t> tokens,
                               const backend::ForwardOptions& options,
                               backend::ForwardOutputs* out) {
  return backend::forward_as_batch(*this, st, tokens, options, out);
}

Status CudaV41Backend::forward_batch(std::span<backend::ForwardItem> items) {
  std::vector<cpu_v41::PrefillExit> exits(items.size());
  std::vector<cpu_v41::ForwardResult> results(items.size());
  std::vector<Item> ready;
  std::vector<size_t> index;
  bool any_exit = false;
  for (size_t i = 0; i < items.size(); ++i) {
    backend::ForwardItem& fi = items[i];
    fi.status = Status();
    if (fi.state == nullptr) {
      fi.status = invalid_argument("forward: no sequence state");
      continue;
    }
    if (fi.options.run_mtp) {
      fi.status = invalid_argument("V4.1 has DSpark draft blocks, not an MTP head");
      continue;
    }
    const int64_t first = fi.state->num_tokens(), n = static_cast<int64_t>(fi.tokens.size());
    // Early exit on the chunks of a prefill (prefill_end: the tokens known when it was planned).
    exits[i] = cpu_v41::PrefillExit{fi.options.prefill_end, keep_rows_};
    const bool use_exit =
        keep_rows_ > 0 && fi.options.prefill_end > 0 && first + n <= fi.options.prefill_end;
    Item it;
    it.st = fi.state;
    it.tokens = fi.tokens;
    it.exit = use_exit ? &exits[i] : nullptr;
    it.last_only = !fi.options.want_logits || fi.options.last_logits_only;
    it.result = &results[i];
    if (Status s = prepare(it); !s.ok()) {
      fi.status = s;
      continue;
    }
    any_exit = any_exit || (use_exit && c_->yoco_boundary < c_->num_hidden_layers);
    ready.push_back(it);
    index.push_back(i);
  }
  const char* env = std::getenv("DSINFER_V41_BATCH");
  const bool alone = any_exit || (env != nullptr && env[0] == '0');
  if (alone) {
    for (Item& it : ready) DSI_RETURN_IF_ERROR(run_pass(std::span<Item>(&it, 1)));
  } else if (!ready.empty()) {
    DSI_RETURN_IF_ERROR(run_pass(ready));
  }
  for (size_t j = 0; j < ready.size(); ++j) {
    backend::ForwardItem& fi = items[index[j]];
    const cpu_v41::ForwardResult& r = results[index[j]];
    if (fi.out == nullptr)
      continue;
    fi.out->mtp_logits.clear();
    fi.out->mtp_count = 0;
    fi.out->sampled = false;
    if (!fi.options.want_logits) {
      fi.out->logits.clear();
      continue;
    }
    if (!ready[j].last_only && (r.first_row != 0 || r.placeholder)) {
      fi.status = invalid_argument(
          "logits of every prompt row are not available with prefill early exit "
          "(--prefill-keep-rows): the consumer half runs on the last rows only");
      continue;
    }
    fi.out->logits = std::move(results[index[j]].logits);
  }
  return Status();
}

Status CudaV41Backend::forward_v41(state::SequenceState& st,
                                   std::span<const int32_t> tokens,
                                   const cpu_v41::PrefillExit* exit,
                                   cpu_v41::ForwardResult* result,
                                   bool last_logits_only) {
  Item it;
  it.st = &st;
  it.tokens = tokens;
  it.exit = exit;
  it.last_only = last_logits_only;
  it.result = result;
  DSI_RETURN_IF_ERROR(prepare(it));
  return run_pass(std::span<Item>(&it, 1));
}

Status CudaV41Backend::prepare(const Item& it) {
  const model_v41::V41Config& c = *c_;
  state::SequenceState& st = *it.st;
  const int64_t n0 = static_cast<int64_t>(it.tokens.size());
  if (n0 == 0)
    return invalid_argument("forward: no tokens");
  DSI_RETURN_IF_ERROR(cpu_v41::check_v41_tokens(c, it.tokens).with_context("forward"));
  if (st.layers().size() != static_cast<size_t>(c.num_hidden_layers) ||
      st.max_rollback() + c.sliding_window != st.layers()[0].ring_capacity) {
    return invalid_argument("forward: the sequence state was not made for this V4.1 model");
  }
  if (st.arena() == nullptr || st.arena()->has_host_storage()) {
    return invalid_argument(
        "forward: the CUDA V4.1 backend needs a state arena without host storage (its pages live "
        "on the device)");
  }
  DSI_RETURN_IF_ERROR(cpu_->v41().hash_params().validate(c));
  if (it.exit != nullptr && c.yoco_boundary < c.num_hidden_layers) {
    const cpu_v41::PrefillExit* exit = it.exit;
    const int64_t min_keep = st.layers()[0].ring_capacity;
    if (exit->keep_rows < min_keep) {
      return invalid_argument("prefill early exit: keep_rows " + std::to_string(exit->keep_rows) +
                              " is below window + max backtracking = " + std::to_string(min_keep));
    }
    if (st.num_tokens() + n0 > exit->prompt_length) {
      return invalid_argument("prefill early exit: the chunk ends at " +
                              std::to_string(st.num_tokens() + n0) + ", past the prompt length " +
                              std::to_string(exit->prompt_length));
    }
    for (int l : c.engram_layer_ids) {
      if (l >= c.yoco_boundary) {
        return invalid_argument("prefill early exit: Engram layer " + std::to_string(l) +
                                " is a consumer; bounded replay needs every Engram layer among "
                                "the producers");
      }
    }
  }
  if (!st.reserve(n0)) {
    return Status(StatusCode::kResourceExhausted,
                  "forward: no state memory for " + std::to_string(n0) + " more tokens");
  }
  return Status();
}

Status CudaV41Backend::run_pass(std::span<Item> items) {
  const model_v41::V41Config& c = *c_;
  Pass ps;
  for (const Item& it : items) {
    Seg g;
    g.st = it.st;
    g.first = it.st->num_tokens();
    g.n = static_cast<int64_t>(it.tokens.size());
    g.row0 = ps.n;
    ps.n += g.n;
    ps.segs.push_back(g);
  }
  DSI_CHECK(!ps.segs.empty(), "an empty V4.1 pass");
  const cpu_v41::PrefillExit* exit = items[0].exit;
  if (exit != nullptr && c.yoco_boundary < c.num_hidden_layers) {
    DSI_CHECK(items.size() == 1, "prefill early exit in a pass of %zu sequences", items.size());
    ps.exit_active = true;
    ps.window_floor = std::max<int64_t>(0, exit->prompt_length - exit->keep_rows);
    ps.placeholder = ps.segs[0].first + ps.segs[0].n <= ps.window_floor;
  }
  // Every item's arena is the engine's one arena (or the test's); one pool mirrors it.
  for (const Item& it : items) {
    DSI_CHECK(it.st->arena() == items[0].st->arena(), "sequences of one pass in two arenas");
  }
  DSI_RETURN_IF_ERROR(ensure_pool(*items[0].st->arena()));
  Status s = [&]() -> Status {
    const int64_t hc = c.hc_mult, D = c.hidden_size, n = ps.n;
    DSI_ASSIGN_OR_RETURN(int64_t * dpos, upload(row_positions(ps.segs, n)));
    ps.pos = dpos;
    std::vector<int32_t> toks;
    for (const Item& it : items) toks.insert(toks.end(), it.tokens.begin(), it.tokens.end());
    DSI_ASSIGN_OR_RETURN(int32_t * dtok, upload(toks));
    DSI_ASSIGN_OR_RETURN(const Streams streams, embed_streams(dtok, n));
    ps.X = streams.X;
    ps.Xalt = streams.Xalt;
    ps.pi = streams.pi;
    // Engram row addresses of every table, hashed before layer 0 (each sequence's n-grams from
    // its own history). Host placements: the rows are gathered on the store's helper thread
    // while the first layers' kernels run. Device placement: the row ids are uploaded and each
    // Engram layer gathers its rows from the device table.
    std::vector<std::vector<int64_t>> by_table(c.engram_layer_ids.size());
    if (!c.engram_layer_ids.empty()) {
      const cpu_v41::EngramHashParams& hash = cpu_->v41().hash_params();
      std::vector<std::vector<int64_t>> rows;
      for (size_t i = 0; i < items.size(); ++i) {
        const Seg& g = ps.segs[i];
        const int64_t back = std::min<int64_t>(g.first, c.engram_max_ngram_size - 1);
        std::vector<int32_t> ctx;
        for (int64_t p = g.first - back; p < g.first; ++p) ctx.push_back(g.st->token(p));
        ctx.insert(ctx.end(), items[i].tokens.begin(), items[i].tokens.end());
        for (int64_t t = 0; t < g.n; ++t) {
          cpu_v41::engram_row_ids(c, hash, ctx, back + t, &rows);
          for (size_t li = 0; li < by_table.size(); ++li)
            by_table[li].insert(by_table[li].end(), rows[li].begin(), rows[li].end());
        }
      }
    }
    if (engram_on_device_) {
      for (size_t li = 0; li < by_table.size(); ++li) {
        const int64_t rows = weights_->engram_tables[li].rows;
        for (int64_t r : by_table[li]) {
          if (r < 0 || r >= rows) {
            return Status(StatusCode::kInternal,
                          "Engram row " + std::to_string(r) + " outside the table of layer " +
                              std::to_string(c.engram_layer_ids[li]) + " (" + std::to_string(rows) +
                              " rows)");
          }
        }
        DSI_ASSIGN_OR_RETURN(int64_t * drows, upload(by_table[li]));
        ps.device_rows.push_back(drows);
        ps.device_row_count.push_back(static_cast<int64_t>(by_table[li].size()));
      }
    } else {
      ps.rows = cpu_->v41().engram_store().gather_async(std::move(by_table));
    }
    Shared sh;
    bool dspark = dspark_;
    for (const Item& it : items) {
      dspark =
          dspark && it.st->mtp_layers().size() == static_cast<size_t>(c.num_nextn_predict_layers);
    }
    if (dspark) {
      sh.features.assign(c.dspark_target_layer_ids.size(), nullptr);
      sh.feature_cut.assign(c.dspark_target_layer_ids.size(), 0);
    }
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const size_t mark = temps_.size();
      DSI_RETURN_IF_ERROR(layer(l, ps, sh));
      // The layer's scratch goes back to the cache (reused by later work on the same stream).
      temps_.erase(temps_.begin() + static_cast<std::ptrdiff_t>(mark), temps_.end());
      if (staging_.size() > 2) {
        // A long prefill filled several staging chunks: wait for their copies, keep one.
        DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "V4.1 staging"));
        recycle_staging();
      }
    }
    if (!sh.features.empty() && !(ps.exit_active && ps.placeholder))
      DSI_RETURN_IF_ERROR(dspark_context(ps, sh));
    // The head on every row of the items that want them, on the last row of the others.
    std::vector<int64_t> x_refs, pi_refs, head_rows;
    for (size_t i = 0; i < items.size(); ++i) {
      const Seg& g = ps.segs[i];
      for (int64_t t = items[i].last_only ? g.n - 1 : 0; t < g.n; ++t) {
        x_refs.push_back(cuda::kv_ref_local((g.row0 + t) * hc * D));
        pi_refs.push_back(cuda::kv_ref_local((g.row0 + t) * hc));
        head_rows.push_back(g.row0 + t);
      }
    }
    const int64_t rows = static_cast<int64_t>(head_rows.size());
    DSI_ASSIGN_OR_RETURN(float* xs, tmp<float>(rows * hc * D));
    DSI_ASSIGN_OR_RETURN(float* pis, tmp<float>(rows * hc));
    DSI_ASSIGN_OR_RETURN(int64_t * dxr, upload(x_refs));
    DSI_ASSIGN_OR_RETURN(int64_t * dpr, upload(pi_refs));
    DSI_RETURN_IF_ERROR(gather(ps.X, dxr, rows, hc * D, xs));
    DSI_RETURN_IF_ERROR(gather(ps.pi, dpr, rows, hc, pis));
    DSI_ASSIGN_OR_RETURN(float* h, tmp<float>(rows * D));
    DSI_RETURN_IF_ERROR(collapse(xs, pis, rows, h));
    DSI_RETURN_IF_ERROR(rms(h, rows, D, weights_->norm));
    DSI_ASSIGN_OR_RETURN(float* logits, tmp<float>(rows * c.vocab_size));
    DSI_RETURN_IF_ERROR(linear(weights_->head, h, rows, logits));
    std::vector<float> all(static_cast<size_t>(rows * c.vocab_size));
    DSI_RETURN_IF_ERROR(device::check_cuda(
        cudaMemcpyAsync(
            all.data(), logits, all.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_.get()),
        "copying the V4.1 logits"));
    DSI_RETURN_IF_ERROR(device::sync_stream(stream_.get(), "the V4.1 forward"));
    int64_t k = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const Seg& g = ps.segs[i];
      const int64_t t0 = items[i].last_only ? g.n - 1 : 0;
      const int64_t m = g.n - t0;
      cpu_v41::ForwardResult* r = items[i].result;
      r->logits.assign(all.begin() + k * c.vocab_size, all.begin() + (k + m) * c.vocab_size);
      k += m;
      // Rows cut by the early exit come before the segment's first row.
      r->first_row = ps.cut + t0;
      r->placeholder = ps.exit_active && ps.placeholder;
    }
    return Status();
  }();
  if (!s.ok()) {
    (void)cudaStreamSynchronize(stream_.get());
    end_pass();
    return s;
  }
  end_pass();
  for (const Item& it : items) it.st->advance(static_cast<int64_t>(it.tokens.size()), it.tokens);
  return Status();
}

Status CudaV41Backend::layer(int l, Pass& ps, Shared& sh) {
  const model_v41::V41Config& c = *c_;
  const DLayer& w = weights_->layers[static_cast<size_t>(l)];
  const int64_t hc = c.hc_mult, D = c.hidden_size;
  if (c.layers[static_cast<size_t>(l)].engram)
    DSI_RETURN_IF_ERROR(engram(l, ps));
  if (const int ti = dspark_target_index_[static_cast<size_t>(l)];
      ti >= 0 && !sh.features.empty()) {
    // DSpark target feature: the mean of the streams entering the attention site.
    DSI_ASSIGN_OR_RETURN(float* f, tmp<float>(ps.n * D, true));
    DSI_RETURN_IF_ERROR(collapse(ps.X, nullptr, ps.n, f, true));
    sh.features[static_cast<size_t>(ti)] = f;
    sh.feature_cut[static_cast<size_t>(ti)] = ps.cut;
  }
  for (int site = 0; site < 2; ++site) {
    int64_t n = ps.n;
    DSI_ASSIGN_OR_RETURN(Site st,
                         site_in(site == 0 ? w.hc_attn : w.hc_ffn,
                                 site == 0 ? w.attn_norm : w.ffn_norm,
                                 ps.X,
                                 ps.pi,
                                 n));
    bool compressed_already = false;
    if (site == 0 && ps.exit_active && l == c.yoco_boundary) {
      // The global KV from every row's attention-norm output, then the consumer half continues
      // on the kept suffix only (one sequence; the cut is a pointer offset: rows are
      // token-major).
      DSI_RETURN_IF_ERROR(compress(l, ps, st.u));
      compressed_already = true;
      Seg& g = ps.segs[0];
      const int64_t keep_from =
          ps.placeholder ? n - 1 : std::max<int64_t>(0, ps.window_floor - g.first);
      ps.X += keep_from * hc * D;
      ps.pi += keep_from * hc;
      ps.pos += keep_from;
      st.pre += keep_from * hc;
      st.post += keep_from * hc;
      st.comb += keep_from * hc * hc;
      st.u += keep_from * D;
      st.F += keep_from * D;
      g.first += keep_from;
      g.n -= keep_from;
      ps.n -= keep_from;
      ps.cut += keep_from;
      n = ps.n;
    }
    if (site == 0) {
      DSI_RETURN_IF_ERROR(attention(l, ps, st.u, st.F, sh, compressed_already));
    } else {
      DSI_RETURN_IF_ERROR(moe(w.moe, st.u, n, c.num_experts_per_tok, st.F));
    }
    ps.pi = st.pre;
    DSI_RETURN_IF_ERROR(site_out(st, ps.X, n, ps.Xalt));
    std::swap(ps.X, ps.Xalt);
  }
  return Status();
}

Status CudaV41Backend::engram(int l, Pass& ps) {
  const model_v41::V41Config& c = *c_;
  const DLayer& w = weights_->layers[static_cast<size_t>(l)];
  const int li = c.layers[static_cast<size_t>(l)].engram_index;
  const int64_t hc = c.hc_mult, D = c.hidden_size;
  const int64_t width = c.engram_hash_cols() * c.engram_head_dim;
  float* e = nullptr;
  if (engram_on_device_) {
    // The rows from the device table (the same values as the store's, bit for bit).
    const DEngramTable& t = weights_->engram_tables[static_cast<size_t>(li)];
    const int64_t count = ps.device_row_count[static_cast<size_t>(li)];
    DSI_CHECK(count * t.dim == ps.n * width,
              "Engram layer %d: %lld row ids for %lld tokens",
              l,
              static_cast<long long>(count),
              static_cast<long long>(ps.n));
    DSI_ASSIGN_OR_RETURN(e, tmp<float>(ps.n * width));
    cuda::V41EngramGatherParams gp;
    gp.data = t.data;
    gp.scale = t.scale;
    gp.fp8 = t.fp8;
    gp.dtype = t.data_dtype;
    gp.table_rows = t.rows;
    gp.dim = t.dim;
    gp.rows = ps.device_rows[static_cast<size_t>(li)];
    gp.n = count;
    gp.out = e;
    DSI_RETURN_IF_ERROR(cuda::launch_v41_engram_gather(gp, stream_.get()));
  } else {
    const std::vector<float>& gathered = ps.rows.wait(li);
    DSI_CHECK(static_cast<int64_t>(gathered.size()) == ps.n * width,
              "Engram layer %d: %zu gathered values for %lld tokens",
              l,
              gathered.size(),
              static_cast<long long>(ps.n));
    DSI_ASSIGN_OR_RETURN(e, upload(gathered));
  }
  DSI_ASSIGN_OR_RETURN(float* kv, tmp<float>(ps.n * (hc + 1) * D));
  DSI_RETURN_IF_ERROR(linear(w.eng.wkv, e, ps.n, kv));
  cuda::V41EngramGateParams gp;
  gp.x = ps.X;
  gp.kv = kv;
  gp.qk = w.eng.qk;
  gp.n = ps.n;
  gp.hc = hc;
  gp.hidden = D;
  gp.eps = static_cast<float>(c.rms_norm_eps);
  return cuda::launch_v41_engram_gate(gp, stream_.get());
}

Status CudaV41Backend::compress(int l, const Pass& ps, const float* x) {
  const model_v41::V41Config& c = *c_;
  const DAttention& a = weights_->layers[static_cast<size_t>(l)].attn;
  const int64_t hd = c.head_dim, ratio = c.compress_ratios[static_cast<size_t>(l)];
  const int64_t n = ps.n;
  cudaStream_t s = stream_.get();
  float* lat = nullptr;
  std::vector<int64_t> gpos;  // group start positions, segment after segment
  std::vector<int64_t> seg_groups(ps.segs.size(), 0);
  if (ratio == 1) {
    DSI_ASSIGN_OR_RETURN(lat, tmp<float>(n * hd));
    DSI_RETURN_IF_ERROR(linear(a.comp_wkv, x, n, lat));
    for (size_t i = 0; i < ps.segs.size(); ++i) {
      const Seg& g = ps.segs[i];
      for (int64_t t = 0; t < g.n; ++t) gpos.push_back(g.first + t);
      seg_groups[i] = g.n;
    }
  } else {
    // The chunk's compressor rows [kv | score] as the ring stores them.
    DSI_ASSIGN_OR_RETURN(float* loc, tmp<float>(n * 2 * hd));
    DSI_RETURN_IF_ERROR(linear(a.comp_wkv, x, n, loc, 2 * hd));
    DSI_RETURN_IF_ERROR(linear(a.comp_wgate, x, n, loc + hd, 2 * hd));
    std::vector<int64_t> members;
    std::vector<int64_t> dest(static_cast<size_t>(n), cuda::kKvRefNone);
    for (size_t i = 0; i < ps.segs.size(); ++i) {
      const Seg& g = ps.segs[i];
      state::CompressorRows& ring = g.st->layers()[static_cast<size_t>(l)].comp_rows;
      for (int64_t pos = g.first; pos < g.first + g.n; ++pos) {
        if ((pos + 1) % ratio != 0)
          continue;
        const int64_t g0 = pos + 1 - ratio;
        for (int64_t r = 0; r < ratio; ++r) {
          const int64_t q = g0 + r;
          members.push_back(q >= g.first ? cuda::kv_ref_local((g.row0 + q - g.first) * 2 * hd)
                                         : ring.rows().pool_offset(ring.ring_row(q)));
        }
        gpos.push_back(g0);
        ++seg_groups[i];
      }
      // Ring append in position order (metadata for every row; only the last capacity rows are
      // written, the earlier ones would be overwritten within this chunk).
      const int64_t t0 = std::max<int64_t>(0, g.n - ring.capacity());
      for (int64_t t = 0; t < g.n; ++t) {
        const int64_t row = ring.push_row();
        if (t >= t0)
          dest[static_cast<size_t>(g.row0 + t)] = ring.rows().pool_offset(row);
      }
    }
    const int64_t G = static_cast<int64_t>(gpos.size());
    if (G > 0) {
      DSI_ASSIGN_OR_RETURN(lat, tmp<float>(G * hd));
      DSI_ASSIGN_OR_RETURN(int64_t * dm, upload(members));
      cuda::V41PoolParams pp;
      pp.entries = G;
      pp.ratio = ratio;
      pp.d = hd;
      pp.pool = pool_;
      pp.local = loc;
      pp.member_refs = dm;
      pp.out = lat;
      DSI_RETURN_IF_ERROR(cuda::launch_v41_pool(pp, s));
    }
    // After the pooling read the ring rows (same stream).
    DSI_RETURN_IF_ERROR(scatter(loc, n, 2 * hd, 2 * hd, dest));
  }
  const int64_t G = static_cast<int64_t>(gpos.size());
  if (G == 0)
    return Status();
  DSI_RETURN_IF_ERROR(rms(lat, G, hd, a.comp_norm));
  DSI_ASSIGN_OR_RETURN(int64_t * dgpos, upload(gpos));
  if (!a.idx_wk.empty()) {
    const int64_t id = c.index_head_dim;
    DSI_ASSIGN_OR_RETURN(float* k, tmp<float>(G * id));
    DSI_RETURN_IF_ERROR(linear(a.idx_wk, lat, G, k));
    DSI_RETURN_IF_ERROR(rms(k, G, id, a.idx_k_norm));
    DSI_RETURN_IF_ERROR(rope(k, G, 1, id, dgpos, weights_->inv_compress, false));
    DSI_RETURN_IF_ERROR(quant(k, G, id, cuda::V41Quant::kFp4Index));
    std::vector<int64_t> dest;
    for (size_t i = 0; i < ps.segs.size(); ++i) {
      state::LayerState& owner = ps.segs[i].st->layers()[static_cast<size_t>(l)];
      for (int64_t g = 0; g < seg_groups[i]; ++g) {
        owner.check_index_key(owner.num_entries + g);
        dest.push_back(owner.index_keys.pool_offset(owner.num_entries + g));
      }
    }
    DSI_RETURN_IF_ERROR(scatter(k, G, id, id, dest));
  }
  DSI_RETURN_IF_ERROR(rope(lat, G, 1, hd, dgpos, weights_->inv_compress, false));
  DSI_RETURN_IF_ERROR(
      quant(lat,
            G,
            hd,
            c.use_fp4_sparse_kv ? cuda::V41Quant::kFp4Compressed : cuda::V41Quant::kFp8Window,
            deepseek()));
  std::vector<int64_t> dest;
  for (size_t i = 0; i < ps.segs.size(); ++i) {
    state::LayerState& owner = ps.segs[i].st->layers()[static_cast<size_t>(l)];
    for (int64_t g = 0; g < seg_groups[i]; ++g) {
      const int64_t e = owner.num_entries;
      owner.add_entry(e);
      dest.push_back(owner.entries.pool_offset(e));
    }
  }
  return scatter(lat, G, hd, hd, dest);
}

Status CudaV41Backend::indexer(
    int l, const Pass& ps, const float* x, const float* q_res, Shared& sh) {
  const model_v41::V41Config& c = *c_;
  const V41LayerPlan& plan = c.layers[static_cast<size_t>(l)];
  const DAttention& a = weights_->layers[static_cast<size_t>(l)].attn;
  const int64_t IH = c.index_n_heads, ID = c.index_head_dim, ratio = plan.compress_ratio;
  const int64_t n = ps.n;
  cudaStream_t s = stream_.get();
  sh.topk = nullptr;
  sh.topk_k = 0;
  sh.topk_rows = n;
  // Per row: its sequence's key count (the key owner's entries) and visible keys; the key
  // owners' page tables side by side.
  int64_t G = 0;  // the widest key set of the pass
  std::vector<int64_t> visible(static_cast<size_t>(n)), page_begin(static_cast<size_t>(n));
  std::vector<int32_t> pages;
  int64_t rows_per_page = 0;
  for (const Seg& g : ps.segs) {
    const state::LayerState& keys = g.st->layers()[static_cast<size_t>(plan.index_key_owner)];
    const int64_t Gs = keys.num_entries;
    G = std::max(G, Gs);
    rows_per_page = keys.index_keys.rows_per_page();
    for (int64_t t = 0; t < g.n; ++t) {
      visible[static_cast<size_t>(g.row0 + t)] = std::min(Gs, (g.first + t + 1) / ratio);
      page_begin[static_cast<size_t>(g.row0 + t)] = static_cast<int64_t>(pages.size());
    }
    pages.insert(pages.end(), keys.index_keys.pages().begin(), keys.index_keys.pages().end());
  }
  if (G == 0)
    return Status();
  int64_t max_visible = 0;
  for (int64_t v : visible) max_visible = std::max(max_visible, v);
  DSI_ASSIGN_OR_RETURN(float* q, tmp<float>(n * IH * ID));
  DSI_ASSIGN_OR_RETURN(float* hw, tmp<float>(n * IH));
  DSI_RETURN_IF_ERROR(linear(a.idx_wq_b, q_res, n, q));
  DSI_RETURN_IF_ERROR(linear(a.idx_weights_proj, x, n, hw));
  DSI_RETURN_IF_ERROR(rope(q, n, IH, ID, ps.pos, weights_->inv_compress, false));
  DSI_RETURN_IF_ERROR(quant(q, n * IH, ID, cuda::V41Quant::kFp4Index));
  DSI_ASSIGN_OR_RETURN(int64_t * dvis, upload(visible));
  DSI_ASSIGN_OR_RETURN(int64_t * dpb, upload(page_begin));
  DSI_ASSIGN_OR_RETURN(int32_t * dpages, upload(pages));
  DSI_ASSIGN_OR_RETURN(float* scores, tmp<float>(n * G));
  cuda::IndexerScoreParams ip;
  ip.q = q;
  ip.head_w = hw;
  // reference numerics: the transformers port's 128^-1/2 and 32^-1/2 (one factor here: the CPU
  // scales the ReLU'd dot and the head weight apart, so the last bits differ); deepseek: none.
  ip.w_scale = deepseek() ? 1.0f
                          : (1.0f / std::sqrt(static_cast<float>(ID))) *
                                (1.0f / std::sqrt(static_cast<float>(IH)));
  ip.nq = n;
  ip.heads = IH;
  ip.dim = ID;
  ip.pool = pool_;
  ip.page_floats = page_floats_;
  ip.rows_per_page = rows_per_page;
  ip.pages = dpages;
  ip.page_begin = dpb;
  ip.visible = dvis;
  ip.max_visible = max_visible;
  ip.scores = scores;
  ip.ld = G;
  ip.tensor_cores = true;
  ip.bf16_exact = true;  // FP4-simulated queries and keys are exact BF16 values
  DSI_RETURN_IF_ERROR(cuda::launch_indexer_scores(ip, s));
  // Keys at or past a row's visible count are never read below (the block scores, the pool and
  // the top-k stop at it), so one width G serves sequences of fewer keys.
  if (plan.candidate_source) {
    const int64_t bs = c.candidate_block_size, nb = (G + bs - 1) / bs;
    const int64_t kb = std::min<int64_t>(c.candidate_topk_blocks, nb);
    DSI_ASSIGN_OR_RETURN(float* blk, tmp<float>(n * nb));
    cuda::V41BlockScoreParams bp;
    bp.scores = scores;
    bp.ld = G;
    bp.visible = dvis;
    bp.nq = n;
    bp.n_keys = G;
    bp.block_size = bs;
    bp.cap_bf16 = deepseek();
    bp.out = blk;
    DSI_RETURN_IF_ERROR(cuda::launch_v41_block_scores(bp, s));
    DSI_ASSIGN_OR_RETURN(int64_t * dnb, upload(std::vector<int64_t>(static_cast<size_t>(n), nb)));
    DSI_ASSIGN_OR_RETURN(int32_t * bidx, tmp<int32_t>(n * kb));
    DSI_RETURN_IF_ERROR(top_k(blk, nb, dnb, n, kb, bidx));
    DSI_ASSIGN_OR_RETURN(sh.keep, tmp<uint8_t>(n * G, true));
    cuda::V41PoolMaskParams mp;
    mp.blocks = bidx;
    mp.block_scores = blk;
    mp.nq = n;
    mp.k = kb;
    mp.n_blocks = nb;
    mp.n_keys = G;
    mp.block_size = bs;
    mp.keep = sh.keep;
    DSI_RETURN_IF_ERROR(cuda::launch_v41_pool_mask(mp, s));
    sh.keep_keys = G;
    sh.have_candidates = true;
  } else if (plan.uses_candidates && sh.have_candidates) {
    DSI_CHECK(sh.keep_keys == G,
              "layer %d scores %lld keys, its candidate pool covers %lld",
              l,
              static_cast<long long>(G),
              static_cast<long long>(sh.keep_keys));
    cuda::V41ApplyMaskParams am;
    am.scores = scores;
    am.ld = G;
    am.keep = sh.keep;
    am.nq = n;
    am.n_keys = G;
    DSI_RETURN_IF_ERROR(cuda::launch_v41_apply_mask(am, s));
  }
  const int64_t k = std::min<int64_t>(c.index_topk, G);
  DSI_ASSIGN_OR_RETURN(sh.topk, tmp<int32_t>(n * k, true));
  DSI_RETURN_IF_ERROR(top_k(scores, G, dvis, n, k, sh.topk));
  cuda::V41DropEmptyParams dp;
  dp.idx = sh.topk;
  dp.nq = n;
  dp.k = k;
  dp.scores = scores;
  dp.ld = G;
  DSI_RETURN_IF_ERROR(cuda::launch_v41_drop_empty(dp, s));
  sh.topk_k = k;
  return Status();
}

Status CudaV41Backend::attention(
    int l, Pass& ps, const float* x, float* out, Shared& sh, bool compressed_already) {
  const model_v41::V41Config& c = *c_;
  const V41LayerPlan& plan = c.layers[static_cast<size_t>(l)];
  const DAttention& a = weights_->layers[static_cast<size_t>(l)].attn;
  const int64_t hd = c.head_dim, W = c.sliding_window;
  const int64_t n = ps.n;
  cudaStream_t s = stream_.get();
  const float* inv = plan.compress_ratio == 0 ? weights_->inv_main : weights_->inv_compress;
  DSI_ASSIGN_OR_RETURN(const Qkv qkv, attn_qkv(a, x, n, ps.pos, inv));
  if (plan.compress_ratio > 0) {
    if (plan.kv_owner == l && !compressed_already)
      DSI_RETURN_IF_ERROR(compress(l, ps, x));
    if (plan.topk_source == l)
      DSI_RETURN_IF_ERROR(indexer(l, ps, x, qkv.q_res, sh));
  }
  const bool selected = plan.compress_ratio > 0 && sh.topk != nullptr && sh.topk_k > 0;
  if (selected) {
    DSI_CHECK(sh.topk_rows == n,
              "layer %d: a top-k list of %lld rows for %lld rows",
              l,
              static_cast<long long>(sh.topk_rows),
              static_cast<long long>(n));
  }
  // Per query: W window slots (the ring / the chunk's own rows, empty slots none), then the
  // selected compressed entries (filled on the device from the top-k list through the KV
  // owner's page table of the query's sequence).
  const int64_t S = W + (selected ? sh.topk_k : 0);
  const bool narrowed = ps.exit_active && !plan.producer;
  const int64_t floor = narrowed ? ps.window_floor : 0;
  std::vector<int64_t> win(static_cast<size_t>(n * W), cuda::kKvRefNone);
  std::vector<int64_t> begin(static_cast<size_t>(n + 1)), sel_begin(static_cast<size_t>(n));
  std::vector<int64_t> page_begin(static_cast<size_t>(n));
  std::vector<int32_t> pages;
  // Ring writes: only each sequence's last ring-capacity rows (an early-exit placeholder row
  // writes nothing).
  std::vector<int64_t> ring_dest(static_cast<size_t>(n), cuda::kKvRefNone);
  int64_t entry_rows_per_page = 0;
  for (const Seg& g : ps.segs) {
    state::LayerState& ring = g.st->layers()[static_cast<size_t>(l)];
    const state::LayerState& comp =
        g.st->layers()[static_cast<size_t>(plan.compress_ratio > 0 ? plan.kv_owner : l)];
    for (int64_t t = 0; t < g.n; ++t) {
      const int64_t r = g.row0 + t, p = g.first + t;
      int64_t j = 0;
      for (int64_t k = std::max<int64_t>({0, p - W + 1, floor}); k <= p; ++k, ++j) {
        win[static_cast<size_t>(r * W + j)] = k >= g.first
                                                  ? cuda::kv_ref_local((g.row0 + k - g.first) * hd)
                                                  : ring.ring.pool_offset(k % ring.ring_capacity);
      }
      begin[static_cast<size_t>(r)] = r * S;
      sel_begin[static_cast<size_t>(r)] = r * S + W;
      page_begin[static_cast<size_t>(r)] = static_cast<int64_t>(pages.size());
      if (t >= g.n - ring.ring_capacity && !(narrowed && ps.placeholder))
        ring_dest[static_cast<size_t>(r)] = ring.ring.pool_offset(p % ring.ring_capacity);
    }
    if (selected) {
      pages.insert(pages.end(), comp.entries.pages().begin(), comp.entries.pages().end());
      entry_rows_per_page = comp.entries.rows_per_page();
    }
  }
  begin[static_cast<size_t>(n)] = n * S;
  DSI_ASSIGN_OR_RETURN(int64_t * dwin, upload(win));
  DSI_ASSIGN_OR_RETURN(int64_t * dbegin, upload(begin));
  DSI_ASSIGN_OR_RETURN(int64_t * refs, tmp<int64_t>(n * S));
  DSI_RETURN_IF_ERROR(copy_rows(refs, S * 8, dwin, W * 8, W * 8, n, "V4.1 window key lists"));
  if (selected) {
    DSI_ASSIGN_OR_RETURN(int64_t * dsel, upload(sel_begin));
    DSI_ASSIGN_OR_RETURN(int32_t * dpages, upload(pages));
    DSI_ASSIGN_OR_RETURN(int64_t * dpb, upload(page_begin));
    cuda::RefsFromIndicesParams rp;
    rp.indices = sh.topk;
    rp.nq = n;
    rp.k = sh.topk_k;
    rp.pages = dpages;
    rp.page_begin = dpb;
    rp.rows_per_page = entry_rows_per_page;
    rp.page_floats = page_floats_;
    rp.width = hd;
    rp.out_begin = dsel;
    rp.out = refs;
    DSI_RETURN_IF_ERROR(cuda::launch_refs_from_indices(rp, s));
  }
  DSI_ASSIGN_OR_RETURN(const float* o, attend(a, qkv, n, dbegin, refs, ps.pos, inv));
  // After the attention read the ring (same stream).
  DSI_RETURN_IF_ERROR(scatter(qkv.kv, n, hd, hd, ring_dest));
  return attn_out(a, o, n, out);
}

Status CudaV41Backend::moe(const DMoe& w, const float* x, int64_t n, int64_t k, float* out) {
  const model_v41::V41Config& c = *c_;
  const int64_t D = c.hidden_size, E = w.n_experts;
  cudaStream_t s = stream_.get();
  DSI_ASSIGN_OR_RETURN(float* logits, tmp<float>(n * E));
  DSI_RETURN_IF_ERROR(linear(w.gate, x, n, logits));
  if (!deepseek() && c.gate_temp != 1.0) {
    DSI_RETURN_IF_ERROR(axpy(logits, nullptr, n * E, static_cast<float>(c.gate_temp)));
  }
  DSI_ASSIGN_OR_RETURN(int32_t * ids, tmp<int32_t>(n * k));
  DSI_ASSIGN_OR_RETURN(float* gates, tmp<float>(n * k));
  cuda::MoeRouteParams rp;
  rp.logits = logits;
  rp.n = n;
  rp.n_experts = E;
  rp.k = k;
  rp.scoring = cuda::RouterScoring::kSqrtSoftplus;
  rp.bias = w.bias;
  rp.norm_topk_prob = true;
  rp.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  rp.expert_ids = ids;
  rp.weights = gates;
  DSI_RETURN_IF_ERROR(cuda::launch_moe_route(rp, s));
  DSI_ASSIGN_OR_RETURN(int64_t * ebegin, tmp<int64_t>(E + 1));
  DSI_ASSIGN_OR_RETURN(int32_t * psrc, tmp<int32_t>(n * k));
  DSI_ASSIGN_OR_RETURN(int32_t * ppos, tmp<int32_t>(n * k));
  cuda::MoeGroupParams gp;
  gp.expert_ids = ids;
  gp.n = n;
  gp.k = k;
  gp.n_experts = E;
  gp.expert_begin = ebegin;
  gp.pair_src = psrc;
  gp.pair_pos = ppos;
  DSI_RETURN_IF_ERROR(cuda::launch_moe_group(gp, s));
  const float limit = static_cast<float>(c.swiglu_limit);
  DSI_ASSIGN_OR_RETURN(float* h, tmp<float>(n * k * std::max(w.inter, w.shared_inter)));
  DSI_ASSIGN_OR_RETURN(float* yr, tmp<float>(n * k * D));
  cuda::ExpertFfnParams ep;
  ep.w1 = w.w1;
  ep.w3 = w.w3;
  ep.w2 = w.w2;
  ep.n_experts = E;
  ep.hidden = D;
  ep.inter = w.inter;
  ep.expert_begin = ebegin;
  ep.pair_src = psrc;
  ep.k = k;
  ep.gates = gates;
  ep.x = x;
  ep.num_pairs = n * k;
  ep.swiglu_limit = limit;
  ep.h = h;
  ep.y = yr;
  DSI_RETURN_IF_ERROR(cuda::launch_expert_ffn(ep, s));
  // The routed outputs in ascending expert order, then the shared expert (the CPU's order).
  cuda::MoeCombineParams cp;
  cp.n = n;
  cp.k = k;
  cp.hidden = D;
  cp.y = yr;
  cp.pair_pos = ppos;
  cp.expert_ids = ids;
  cp.out = out;
  DSI_RETURN_IF_ERROR(cuda::launch_moe_combine(cp, s));
  DSI_ASSIGN_OR_RETURN(float* ys, tmp<float>(n * D));
  cuda::ExpertFfnParams sp;
  sp.w1 = w.s1;
  sp.w3 = w.s3;
  sp.w2 = w.s2;
  sp.n_experts = 1;
  sp.hidden = D;
  sp.inter = w.shared_inter;
  sp.k = 1;
  sp.x = x;
  sp.num_pairs = n;
  sp.swiglu_limit = limit;
  sp.h = h;
  sp.y = ys;
  DSI_RETURN_IF_ERROR(cuda::launch_expert_ffn(sp, s));
  return axpy(out, ys, n * D);
}

Status CudaV41Backend::dspark_context(const Pass& ps, const Shared& sh) {
  const model_v41::V41Config& c = *c_;
  const int64_t D = c.hidden_size, hd = c.head_dim;
  const int64_t nt = static_cast<int64_t>(c.dspark_target_layer_ids.size());
  // Rows each block ring keeps (each sequence's last ring-capacity rows).
  std::vector<int64_t> rows, positions;
  for (const Seg& g : ps.segs) {
    const int64_t ring = g.st->mtp_layers().empty() ? 0 : g.st->mtp_layers()[0].ring_capacity;
    for (int64_t t = std::max<int64_t>(0, g.n - ring); t < g.n; ++t) {
      rows.push_back(g.row0 + t);
      positions.push_back(g.first + t);
    }
  }
  const int64_t m = static_cast<int64_t>(rows.size());
  if (m == 0)
    return Status();
  DSI_ASSIGN_OR_RETURN(float* f, tmp<float>(m * nt * D));
  DSI_ASSIGN_OR_RETURN(float* one, tmp<float>(m * D));
  for (int64_t i = 0; i < nt; ++i) {
    const float* src = sh.features[static_cast<size_t>(i)];
    DSI_CHECK(src != nullptr, "DSpark features of target %lld missing", static_cast<long long>(i));
    // A feature taken before the early-exit cut holds the cut rows first.
    const int64_t shift = ps.cut - sh.feature_cut[static_cast<size_t>(i)];
    std::vector<int64_t> refs;
    for (int64_t r : rows) refs.push_back(cuda::kv_ref_local((r + shift) * D));
    DSI_ASSIGN_OR_RETURN(int64_t * drefs, upload(refs));
    DSI_RETURN_IF_ERROR(gather(src, drefs, m, D, one));
    DSI_RETURN_IF_ERROR(copy_rows(f + i * D, nt * D * 4, one, D * 4, D * 4, m, "DSpark features"));
  }
  const DDsparkContext& w = weights_->dspark;
  DSI_ASSIGN_OR_RETURN(float* main_x, tmp<float>(m * D));
  DSI_RETURN_IF_ERROR(linear(w.main_proj, f, m, main_x));
  DSI_RETURN_IF_ERROR(rms(main_x, m, D, w.main_norm));
  DSI_ASSIGN_OR_RETURN(int64_t * dpos, upload(positions));
  for (size_t b = 0; b < w.wkv.size(); ++b) {
    DSI_ASSIGN_OR_RETURN(float* kv, tmp<float>(m * hd));
    DSI_RETURN_IF_ERROR(linear(w.wkv[b], main_x, m, kv));
    DSI_RETURN_IF_ERROR(rms(kv, m, hd, w.kv_norm[b]));
    DSI_RETURN_IF_ERROR(rope(kv, m, 1, hd, dpos, weights_->inv_main, false));
    DSI_RETURN_IF_ERROR(quant(kv, m, hd, cuda::V41Quant::kFp8Window));
    std::vector<int64_t> dest;
    for (const Seg& g : ps.segs) {
      if (b >= g.st->mtp_layers().size())
        return Status(StatusCode::kInternal, "DSpark block ring missing");
      state::LayerState& ls = g.st->mtp_layers()[b];
      for (int64_t t = std::max<int64_t>(0, g.n - ls.ring_capacity); t < g.n; ++t)
        dest.push_back(ls.ring.pool_offset((g.first + t) % ls.ring_capacity));
    }
    DSI_RETURN_IF_ERROR(scatter(kv, m, hd, hd, dest));
  }
  return Status();
}

}  // namespace dsinfer::gpu_v41
