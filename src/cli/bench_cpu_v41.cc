// `dsinfer bench` on a DeepSeek V4.1 checkpoint, `--device cpu` or `--device cuda`: the state
// sizes (the spec's record layout at this checkpoint's config and at the real V4.1-Flash config,
// and what the engine's pages hold), prefill and decode speed of the V4.1 CPU or CUDA backend
// through the engine's backend seam, with --prefill-keep-rows the prefill early exit's time
// and layer-row saving in the same run, and with --engram-compare (CUDA) each decode batch timed
// with the Engram rows gathered on the host and then from tables on the device.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "backend/cpu_v41/backend.h"
#if DSINFER_HAVE_CUDA_BACKEND
#include "backend/cuda_v41/backend.h"
#endif
#include "base/strings.h"
#include "cli/bench_cpu.h"
#include "cli/common.h"
#include "model_v41/state_layout.h"
#include "model_v41/synthetic.h"

namespace dsinfer::cli {
namespace {

using json = nlohmann::ordered_json;

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::vector<int32_t> tokens_for(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  // Ids 3.. (BOS, EOS and pad are legal too, but keep the stream ordinary text).
  for (auto& x : t) x = static_cast<int32_t>(3 + g() % static_cast<uint32_t>(vocab - 3));
  return t;
}

json layout_json(const model_v41::StateLayout& s) {
  return {{"kv_bytes_per_token_raw", s.bytes_per_token_raw},
          {"kv_bytes_per_token", s.bytes_per_token},
          {"kv_block_stride_bytes", s.block_stride},
          {"state_bytes_per_sequence", s.state_bytes},
          {"window_rings", s.n_rings},
          {"ring_slots", s.ring_slots},
          {"compressor_rings", s.n_compressor_rings},
          {"compressor_ring_slots", s.compressor_ring_slots}};
}

// Seconds of one prefill of `toks` (best of the timed runs after a warm-up).
Result<double> time_prefill(backend::Model& m,
                            state::PageArena* arena,
                            std::span<const int32_t> toks,
                            int64_t repeats) {
  backend::ForwardOptions last;
  last.last_logits_only = true;
  last.prefill_end = static_cast<int64_t>(toks.size());
  backend::ForwardOutputs fo;
  double best = 1e30;
  for (int64_t r = 0; r <= repeats; ++r) {
    state::SequenceState st(*m.state_shape(), arena, 1000 + r);
    const double t0 = now_s();
    DSI_RETURN_IF_ERROR(m.forward(st, toks, last, &fo));
    if (r > 0)
      best = std::min(best, now_s() - t0);
  }
  return best;
}

// The V4.1 backend of `a`'s device (the CPU reference, or the CUDA backend on a.cuda_device).
Result<std::unique_ptr<backend::Model>> open_v41(const CpuBenchArgs& a,
                                                 const std::string& model_dir,
                                                 const cpu_v41::V41BackendOptions& o) {
  if (a.cuda_device >= 0) {
#if DSINFER_HAVE_CUDA_BACKEND
    gpu_v41::CudaV41Options co;
    co.device = a.cuda_device;
    co.engram_both = a.engram_compare;
    DSI_ASSIGN_OR_RETURN(auto m, gpu_v41::CudaV41Backend::open(model_dir, o, co));
    return std::unique_ptr<backend::Model>(std::move(m));
#else
    return unimplemented("--device cuda: this build has no CUDA backend");
#endif
  }
  DSI_ASSIGN_OR_RETURN(auto m, cpu_v41::V41Backend::open(model_dir, o));
  return std::unique_ptr<backend::Model>(std::move(m));
}

const model_v41::V41Config& v41_config(const backend::Model& m) {
#if DSINFER_HAVE_CUDA_BACKEND
  if (const auto* g = dynamic_cast<const gpu_v41::CudaV41Backend*>(&m))
    return g->cpu().checkpoint().config();
#endif
  return dynamic_cast<const cpu_v41::V41Backend&>(m).checkpoint().config();
}

}  // namespace

int run_cpu_bench_v41(const CpuBenchArgs& a, const std::string& model_dir) {
  auto numerics = parse_numerics(a.numerics);
  if (!numerics.ok())
    return fail(numerics.status());
  const bool gpu = a.cuda_device >= 0;
  auto placement = parse_engram_placement_flag(a.engram_placement,
                                               gpu ? engine::Device::kCuda : engine::Device::kCpu);
  if (!placement.ok())
    return fail(placement.status());
  if (a.engram_compare && !gpu)
    return fail(invalid_argument("--engram-compare needs --device cuda"));
  cpu_v41::V41BackendOptions o;
  o.numerics = *numerics;
  o.engram.placement = *placement;
  auto opened = open_v41(a, model_dir, o);
  if (!opened.ok())
    return fail(opened.status());
  backend::Model& m = **opened;
  std::unique_ptr<backend::Model> exit_model;
  if (a.prefill_keep_rows > 0) {
    o.prefill_keep_rows = a.prefill_keep_rows;
    auto e = open_v41(a, model_dir, o);
    if (!e.ok())
      return fail(e.status());
    exit_model = std::move(e).value();
  }
  const model_v41::V41Config& c = v41_config(m);
  if (a.engram_compare && c.engram_layer_ids.empty())
    return fail(invalid_argument("--engram-compare: this checkpoint has no Engram layers"));
  const char* tag = gpu ? "[bench cuda v4.1]" : "[bench cpu v4.1]";
  const int64_t longest = std::max(*std::max_element(a.prefill.begin(), a.prefill.end()),
                                   a.context + a.decode_steps + 1);
  if (c.max_position_embeddings < longest) {
    return fail(invalid_argument(str_format("the model's context (%lld) is below %lld tokens",
                                            static_cast<long long>(c.max_position_embeddings),
                                            static_cast<long long>(longest))));
  }
  const state::StateShape& shape = *m.state_shape();
  const int64_t page = state::default_page_bytes(shape);
  auto arena = state::PageArena::growable(page, m.state_storage());

  json out;
  out["device"] = gpu ? "cuda:" + std::to_string(a.cuda_device) : std::string("cpu");
  out["hardware_threads"] = std::thread::hardware_concurrency();
  out["model"] = {{"dir", model_dir},
                  {"model", "DeepSeek V4.1"},
                  {"layers", c.num_hidden_layers},
                  {"yoco_boundary", c.yoco_boundary},
                  {"hidden", c.hidden_size},
                  {"vocab", c.vocab_size},
                  {"numerics", model::numerics_name(*numerics)}};
  // State: the spec's records (FP8 rings, FP4 paged KV) here and at the real config; the CPU
  // engine keeps dequantised fp32 rows in pages, so its own figures are larger.
  json st;
  st["spec_layout"] = layout_json(model_v41::compute_state_layout(c));
  auto real = model_v41::parse_v41_config(model_v41::v41_flash_config_json().dump(), "V4.1-Flash");
  if (!real.ok())
    return fail(real.status());
  st["spec_layout_v41_flash"] = layout_json(model_v41::compute_state_layout(*real));
  const int64_t n_big = 1 << 20;
  const int64_t fixed = state::SequenceState::pages_for(shape, page, 0) * page;
  const int64_t grown = state::SequenceState::pages_for(shape, page, n_big) * page;
  st[gpu ? "cuda_engine" : "cpu_engine"] = {
      {"page_bytes", page},
      {"fixed_bytes_per_sequence", fixed},
      {"bytes_per_token", static_cast<double>(grown - fixed) / static_cast<double>(n_big)},
      {"note",
       "fp32 dequantised rows in the engine's pages (neither V4.1 backend keeps FP8/FP4 "
       "records yet)"}};
  out["state"] = st;
  std::fprintf(stderr,
               "%s KV %.0f B/token (%.0f raw), state %lld B/sequence; at the real "
               "V4.1-Flash config: KV %.0f B/token, state %lld B/sequence\n",
               tag,
               st["spec_layout"]["kv_bytes_per_token"].get<double>(),
               st["spec_layout"]["kv_bytes_per_token_raw"].get<double>(),
               static_cast<long long>(st["spec_layout"]["state_bytes_per_sequence"].get<int64_t>()),
               st["spec_layout_v41_flash"]["kv_bytes_per_token"].get<double>(),
               static_cast<long long>(
                   st["spec_layout_v41_flash"]["state_bytes_per_sequence"].get<int64_t>()));

  json run;
  run["kernels"] = gpu ? "cuda" : "reference";
  run["backend"] = m.name();
  run["engram_placement"] = cpu_v41::engram_placement_name(*placement);
  json prefill = json::array();
  for (int64_t len : a.prefill) {
    const auto toks = tokens_for(len, c.vocab_size, static_cast<uint32_t>(len));
    auto t = time_prefill(m, arena.get(), toks, a.repeats);
    if (!t.ok())
      return fail(t.status());
    json row = {{"tokens", len}, {"seconds", *t}, {"tokens_per_s", static_cast<double>(len) / *t}};
    std::fprintf(stderr,
                 "%s prefill %lld tokens: %.3f s, %.1f tok/s\n",
                 tag,
                 static_cast<long long>(len),
                 *t,
                 static_cast<double>(len) / *t);
    if (exit_model) {
      auto te = time_prefill(*exit_model, arena.get(), toks, a.repeats);
      if (!te.ok())
        return fail(te.status());
      // Layer-rows: producers on every row, consumers on the kept rows (the boundary's global
      // KV projection on every row is not counted).
      const int64_t L = c.num_hidden_layers, P = c.yoco_boundary;
      const int64_t kept = std::min(len, a.prefill_keep_rows);
      const double rows_exact = static_cast<double>(L * len);
      const double rows_exit = static_cast<double>(P * len + (L - P) * kept);
      row["early_exit"] = {{"keep_rows", a.prefill_keep_rows},
                           {"seconds", *te},
                           {"time_ratio", *te / *t},
                           {"layer_rows_ratio", rows_exit / rows_exact}};
      std::fprintf(stderr,
                   "%s prefill %lld tokens with early exit K=%lld: %.3f s (time "
                   "ratio %.3f, layer-rows ratio %.3f)\n",
                   tag,
                   static_cast<long long>(len),
                   static_cast<long long>(a.prefill_keep_rows),
                   *te,
                   *te / *t,
                   rows_exit / rows_exact);
    }
    prefill.push_back(row);
  }
  run["prefill"] = prefill;

  json decode = json::array();
  backend::ForwardOptions last;
  last.last_logits_only = true;
  const auto ctx = tokens_for(a.context, c.vocab_size, 17);
  // One timed decode run of `batch` sequences forked from one prefilled context: seconds per
  // step, and the logits of the untimed first step (equal inputs in every run).
  struct DecodeRun {
    double step_s = 0;
    std::vector<float> first_logits;
  };
  auto run_decode = [&](int64_t batch) -> Result<DecodeRun> {
    backend::ForwardOutputs fo;
    std::vector<std::unique_ptr<state::SequenceState>> seqs;
    seqs.push_back(std::make_unique<state::SequenceState>(shape, arena.get(), 0));
    DSI_RETURN_IF_ERROR(m.forward(*seqs[0], ctx, last, &fo));
    for (int64_t i = 1; i < batch; ++i) {
      seqs.push_back(std::make_unique<state::SequenceState>(shape, arena.get(), i));
      std::vector<std::pair<int32_t, int32_t>> pairs;
      DSI_RETURN_IF_ERROR(seqs.back()->fork_from(*seqs[0], &pairs));
      DSI_RETURN_IF_ERROR(m.copy_state_pages(*arena, pairs));
    }
    // One decode step of the whole batch through forward_batch (the CUDA backend runs it as one
    // pass; the CPU backend one sequence after another).
    std::vector<int32_t> toks(static_cast<size_t>(batch));
    std::vector<backend::ForwardOutputs> outs(static_cast<size_t>(batch));
    auto step = [&](int64_t k) -> Status {
      std::vector<backend::ForwardItem> items(static_cast<size_t>(batch));
      for (int64_t i = 0; i < batch; ++i) {
        const size_t j = static_cast<size_t>(i);
        toks[j] = static_cast<int32_t>(3 + (k * 7919 + i * 104729) % (c.vocab_size - 3));
        items[j].state = seqs[j].get();
        items[j].tokens = std::span<const int32_t>(&toks[j], 1);
        items[j].options = last;
        items[j].out = &outs[j];
      }
      DSI_RETURN_IF_ERROR(m.forward_batch(items));
      for (const backend::ForwardItem& it : items) DSI_RETURN_IF_ERROR(it.status);
      return Status();
    };
    DecodeRun r;
    DSI_RETURN_IF_ERROR(step(0));
    for (const backend::ForwardOutputs& o : outs)
      r.first_logits.insert(r.first_logits.end(), o.logits.begin(), o.logits.end());
    const double t0 = now_s();
    for (int64_t k = 0; k < a.decode_steps; ++k) DSI_RETURN_IF_ERROR(step(1 + k));
    r.step_s = (now_s() - t0) / static_cast<double>(a.decode_steps);
    return r;
  };
#if DSINFER_HAVE_CUDA_BACKEND
  auto* cuda_m = dynamic_cast<gpu_v41::CudaV41Backend*>(&m);
#endif
  for (int64_t batch : a.decode_batch) {
    if (a.engram_compare) {
#if DSINFER_HAVE_CUDA_BACKEND
      // The same decode run twice in this process: rows gathered on the host (the store's
      // helper thread, then a copy), then from the tables on the device.
      DecodeRun runs[2];
      for (int dev = 0; dev < 2; ++dev) {
        if (Status s = cuda_m->set_engram_on_device(dev == 1); !s.ok())
          return fail(s);
        auto r = run_decode(batch);
        if (!r.ok())
          return fail(r.status());
        runs[dev] = std::move(r).value();
      }
      const double ratio = runs[0].step_s / runs[1].step_s;
      const bool same = runs[0].first_logits == runs[1].first_logits;
      std::fprintf(stderr,
                   "%s decode batch %lld at %lld context, Engram rows from host: %.3f ms/step, "
                   "from device: %.3f ms/step, host/device %.3f (%s), logits %s\n",
                   tag,
                   static_cast<long long>(batch),
                   static_cast<long long>(a.context),
                   runs[0].step_s * 1e3,
                   runs[1].step_s * 1e3,
                   ratio,
                   ratio <= 1.05 ? "within 5%" : "NOT within 5%",
                   same ? "bit-identical" : "DIFFER");
      decode.push_back({{"batch", batch},
                        {"context", a.context},
                        {"steps", a.decode_steps},
                        {"step_ms", runs[0].step_s * 1e3},
                        {"tokens_per_s", static_cast<double>(batch) / runs[0].step_s},
                        {"engram_compare",
                         {{"host_step_ms", runs[0].step_s * 1e3},
                          {"device_step_ms", runs[1].step_s * 1e3},
                          {"host_over_device", ratio},
                          {"within_5_percent", ratio <= 1.05},
                          {"first_step_logits_identical", same}}}});
      continue;
#endif
    }
    auto r = run_decode(batch);
    if (!r.ok())
      return fail(r.status());
    const double step_s = r->step_s;
    std::fprintf(stderr,
                 "%s decode batch %lld at %lld context: %.2f ms/step, %.1f tok/s\n",
                 tag,
                 static_cast<long long>(batch),
                 static_cast<long long>(a.context),
                 step_s * 1e3,
                 static_cast<double>(batch) / step_s);
    decode.push_back({{"batch", batch},
                      {"context", a.context},
                      {"steps", a.decode_steps},
                      {"step_ms", step_s * 1e3},
                      {"tokens_per_s", static_cast<double>(batch) / step_s}});
  }
  run["decode"] = decode;
  out["runs"] = json::array({run});
  out["notes"] =
      gpu ? "The CUDA V4.1 backend runs a decode batch as one eager pass (no CUDA graphs yet; "
            "docs/gpu.md); decode sequences share one prefilled prefix (forked state). With "
            "--engram-compare each decode batch runs twice from the same prefix, Engram rows "
            "gathered on the host (the store's helper thread, then a copy) and then from the "
            "tables on the device; host_over_device is the step-time ratio (issue 15: <= 1.05)."
          : "V4.1 runs on the reference CPU kernels only (--cpu-kernels is ignored); decode "
            "sequences share one prefilled prefix (forked state).";
  return write_output(out.dump(2), a.output, gpu ? "bench cuda v4.1" : "bench cpu v4.1");
}

}  // namespace dsinfer::cli
