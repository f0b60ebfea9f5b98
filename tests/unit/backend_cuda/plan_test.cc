// The CUDA forward planner (backend/cuda/forward_plan.h) checked on the CPU, where every key
// reference can be resolved: for a sequence forked from one the CPU model has advanced, every
// reference of a planned chunk must address exactly the rows the CPU forward reads for that
// chunk (window ring slots, HCA entries, compressor candidates, chunk-local rows), write where
// the CPU writes (ring slots, entries), and leave the same metadata (entry counts, compressor
// windows) as the CPU forward over the same tokens. Runs in CI (no GPU needed).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_model.h"
#include "backend/cuda/forward_plan.h"
#include "model/checkpoint.h"
#include "model/synthetic.h"

namespace dsinfer::gpu {
namespace {

using model::AttentionType;

std::vector<int32_t> ids(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<int32_t>(2 + g() % 500));
  return v;
}

// The float a pool reference points at, in a host-storage arena.
const float* resolve(const state::PageArena& a, int64_t ref) {
  const int64_t pf = a.page_floats();
  return a.page(static_cast<int32_t>(ref / pf)) + ref % pf;
}

bool same_row(const float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] != y[i])
      return false;
  }
  return true;
}

TEST(ForwardPlan, ReferencesAddressTheRowsTheCpuForwardReads) {
  auto ckpt =
      model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const auto& c = (*ckpt)->config();
  cpu::CpuModel m(c, (*ckpt)->weights(), model::Numerics::kReference);
  auto arena = state::PageArena::growable(state::min_page_bytes(c));
  const int64_t hd = c.head_dim;
  for (int prefix : {0, 3, 17, 40}) {
    for (int chunk : {1, 6, 29}) {
      SCOPED_TRACE("prefix " + std::to_string(prefix) + " chunk " + std::to_string(chunk));
      state::SequenceState a(c, arena.get(), 1, 0);
      backend::ForwardOutputs out;
      if (prefix > 0) {
        ASSERT_TRUE(m.forward(a, ids(prefix, 1), {}, &out).ok());
      }
      // b = a before the chunk; a then runs the chunk on the CPU.
      state::SequenceState b(c, arena.get(), 2, 0);
      ASSERT_TRUE(b.fork_from(a, nullptr).ok());
      const std::vector<int32_t> toks = ids(chunk, 2);
      ASSERT_TRUE(b.reserve(chunk));
      HostPack pack;
      PassPlan plan;
      PlanContext ctx;
      ctx.config = &c;
      ctx.page_floats = arena->page_floats();
      std::vector<SeqSpan> spans = {SeqSpan{&b, prefix, chunk, 0, false}};
      plan_pass(ctx, spans, toks, chunk, pack, &plan);
      // Reads happen before the chunk's writes: check them against b's (pre-chunk) contents.
      for (size_t l = 0; l < c.layers.size(); ++l) {
        const auto& lp = plan.layers[l];
        const state::LayerState& ls = a.layers()[l];  // a: still at `prefix`
        const auto begin = pack.read<int64_t>(lp.key_begin);
        // What launch_expand_keys writes on the device (the GPU test checks the kernel
        // against this host expansion).
        const auto keys = expand_keys_host(ctx, pack, plan, l);
        ASSERT_EQ(static_cast<int64_t>(keys.size()), begin.back());
        ASSERT_EQ(static_cast<int64_t>(begin.size()), chunk + 1);
        for (int t = 0; t < chunk; ++t) {
          const int64_t pos = prefix + t;
          int64_t j = begin[t];
          for (int64_t p = std::max<int64_t>(0, pos - c.sliding_window + 1); p <= pos; ++p, ++j) {
            ASSERT_LT(j, begin[t + 1]);
            if (p < prefix) {
              ASSERT_GE(keys[j], 0);
              EXPECT_TRUE(same_row(resolve(*arena, keys[j]), ls.ring_slot(p), hd))
                  << "layer " << l << " query " << pos << " window key " << p;
            } else {
              EXPECT_EQ(keys[j], -2 - (p - prefix) * hd) << "chunk-local key " << p;
            }
          }
          const auto& cl = c.layers[l];
          if (cl.attention == AttentionType::kHca) {
            const int64_t vis = (pos + 1) / cl.compress_ratio;
            EXPECT_EQ(begin[t + 1] - j, vis);
            for (int64_t w = 0; w < vis; ++w, ++j) {
              EXPECT_EQ(keys[j], b.layers()[l].entries.pool_offset(w)) << "entry " << w;
            }
          } else if (cl.attention == AttentionType::kCsa) {
            EXPECT_EQ(begin[t + 1] - j, c.index_topk);  // filled on the device from the top-k
            EXPECT_EQ(pack.read<int64_t>(lp.select_begin)[t], j);
            EXPECT_EQ(pack.read<int64_t>(lp.visible)[t], (pos + 1) / cl.compress_ratio);
          } else {
            EXPECT_EQ(begin[t + 1], j);
          }
        }
        // Ring writes: the slots of the chunk's positions (the ring keeps them all here).
        const auto ring = pack.read<int64_t>(lp.ring_dest);
        for (int t = 0; t < chunk; ++t) {
          const int64_t pos = prefix + t;
          if (t >= chunk - ls.ring_capacity)
            EXPECT_EQ(ring[t], b.layers()[l].ring.pool_offset(pos % ls.ring_capacity));
          else
            EXPECT_EQ(ring[t], -1);
        }
        // Compressor candidates: rows before the chunk from the ring, the chunk's own rows local.
        if (c.layers[l].attention != AttentionType::kSliding) {
          const bool overlap = c.layers[l].attention == AttentionType::kCsa;
          const int64_t mr = c.layers[l].compress_ratio;
          const int64_t width = (overlap ? 2 : 1) * hd;
          const auto refs = pack.read<int64_t>(lp.comp.token_refs);
          const auto blocks = pack.read<int64_t>(lp.comp.block);
          const int64_t nc = (overlap ? 2 : 1) * mr;
          for (size_t e = 0; e < blocks.size(); ++e) {
            const int64_t w = blocks[e];
            for (int64_t i = 0; i < nc; ++i) {
              const int64_t p = overlap ? (w - 1) * mr + i : w * mr + i;
              const int64_t ref = refs[e * nc + i];
              if (p < 0) {
                EXPECT_EQ(ref, -1);
              } else if (p < prefix) {
                EXPECT_TRUE(same_row(resolve(*arena, ref), ls.comp_rows.kv_row(p), 2 * width))
                    << "layer " << l << " entry " << w << " candidate " << p;
              } else {
                EXPECT_EQ(ref, -2 - (p - prefix) * 2 * width);
              }
            }
          }
        }
      }
      // The CPU forward over the chunk; the planned metadata must match it.
      ASSERT_TRUE(m.forward(a, toks, {}, &out).ok());
      b.advance(chunk);
      b.check_integrity();
      for (size_t l = 0; l < c.layers.size(); ++l) {
        const auto& la = a.layers()[l];
        const auto& lb = b.layers()[l];
        EXPECT_EQ(la.num_entries, lb.num_entries) << "layer " << l;
        EXPECT_EQ(la.comp_rows.first_pos(), lb.comp_rows.first_pos()) << "layer " << l;
        EXPECT_EQ(la.comp_rows.end_pos(), lb.comp_rows.end_pos()) << "layer " << l;
        EXPECT_EQ(la.index_rows.end_pos(), lb.index_rows.end_pos()) << "layer " << l;
      }
    }
  }
}

// A resumed MTP block (SequenceState::resume_mtp) reads its window only from its floor on: the
// ring rows below it were never written, so their keys are kKvRefNone, while the rows between the
// floor and the span stay ring references and the span's own rows stay local. The main layers of
// the same sequence are not floored.
TEST(ForwardPlan, MtpWindowKeysBelowTheFloorAreLeftOut) {
  auto ckpt =
      model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  const auto& c = (*ckpt)->config();
  ASSERT_FALSE(c.mtp_layers.empty());
  cpu::CpuModel m(c, (*ckpt)->weights(), model::Numerics::kReference);
  auto arena = state::PageArena::growable(state::min_page_bytes(c));
  state::SequenceState a(c, arena.get(), 1, 3);
  backend::ForwardOutputs out;
  ASSERT_TRUE(m.forward(a, ids(30, 3), {}, &out).ok());
  // The MTP block two positions past its floor (a later drafting step); the main layers at the
  // sequence's end.
  const int64_t floor = 27, n = 2;
  ASSERT_LT(29 - c.sliding_window + 1, floor);  // the window reaches below the floor
  a.mtp_layers()[0].window_floor = floor;
  ASSERT_TRUE(a.reserve(n));
  PlanContext ctx;
  ctx.config = &c;
  ctx.page_floats = arena->page_floats();
  for (bool mtp : {true, false}) {
    SCOPED_TRACE(mtp ? "MTP block" : "main layers");
    const int64_t first = mtp ? 29 : a.num_tokens();
    HostPack pack;
    PassPlan plan;
    plan_pass(ctx, {SeqSpan{&a, first, n, 0, mtp}}, {5, 6}, n, pack, &plan);
    const auto begin = pack.read<int64_t>(plan.layers[0].key_begin);
    const auto keys = expand_keys_host(ctx, pack, plan, 0);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t pos = first + t;
      int64_t j = begin[static_cast<size_t>(t)];
      for (int64_t p = std::max<int64_t>(0, pos - c.sliding_window + 1); p <= pos; ++p, ++j) {
        const int64_t k = keys[static_cast<size_t>(j)];
        if (p >= first)
          EXPECT_EQ(k, -2 - (p - first) * c.head_dim) << "local key " << p;
        else if (mtp && p < floor)
          EXPECT_EQ(k, -1) << "key " << p << " below the floor";
        else
          EXPECT_GE(k, 0) << "ring key " << p;
      }
    }
  }
}

}  // namespace
}  // namespace dsinfer::gpu

namespace dsinfer::gpu {
namespace {

// The host planning of a prefill of 8192 tokens on four real-width V4-Flash layers (what `dsinfer
// bench` times on the GPU), here on the CPU: the reference count and the time, for the record.
TEST(ForwardPlan, PlansAnEightThousandTokenFlashPrefill) {
  auto cfg = model::v4_flash_preset_config(4);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const model::ModelConfig& c = *cfg;
  auto arena = state::PageArena::growable(state::default_page_bytes(c));
  const int64_t n = 8192;
  const std::vector<int32_t> toks = ids(static_cast<int>(n), 3);
  HostPack pack;
  PassPlan plan;
  PlanContext ctx;
  ctx.config = &c;
  ctx.page_floats = arena->page_floats();
  std::vector<uint8_t> staging;
  {  // a first forward (as bench's warm-up): the pack and the planner's scratch keep storage
    state::SequenceState warm(c, arena.get(), 2, 0);
    ASSERT_TRUE(warm.reserve(n));
    plan_pass(ctx, {SeqSpan{&warm, 0, n, 0, false}}, toks, n, pack, &plan);
    pack.layout(false);
    staging.resize(static_cast<size_t>(pack.host_bytes()));
    pack.copy_to(staging.data());
    pack.clear();
  }
  state::SequenceState st(c, arena.get(), 1, 0);
  ASSERT_TRUE(st.reserve(n));
  const auto t0 = std::chrono::steady_clock::now();
  plan_pass(ctx, {SeqSpan{&st, 0, n, 0, false}}, toks, n, pack, &plan);
  const double plan_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  pack.layout(false);
  staging.resize(static_cast<size_t>(pack.host_bytes()));
  pack.copy_to(staging.data());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  int64_t refs = 0;
  for (const LayerPass& lp : plan.layers) refs += pack.size_bytes(lp.key_refs) / 8;
  std::printf(
      "[plan] 8192-token prefill, 4 Flash layers: %lld key references (expanded on the "
      "device), %.2f MB packed and copied, %.1f ms (planning %.1f ms, staging copy %.1f ms)\n",
      static_cast<long long>(refs),
      static_cast<double>(pack.host_bytes()) / 1e6,
      ms,
      plan_ms,
      ms - plan_ms);
  // Window keys of every row, plus 512 selections per CSA row and the visible HCA entries; none
  // of them travels from the host any more (per-row counts and page tables do).
  EXPECT_GT(refs, 4 * n * 100);
  EXPECT_LT(pack.host_bytes(), 8 << 20);
}

}  // namespace
}  // namespace dsinfer::gpu

namespace dsinfer::gpu {
namespace {

// The host planning of one decode step of 64 sequences at 8192 tokens of context on four
// real-width V4-Flash layers (what `dsinfer bench` decodes at batch 64): the part of a decode
// step the GPU waits for unless the step loop overlaps it. For the record, and a loose bound.
// Times the planning of graph-replayed decode steps of `batch` sequences at `ctx_len` tokens of
// context (best of `reps` successive steps after the first), as run_batch plans them.
void time_decode_plans(const model::ModelConfig& c,
                       int64_t ctx_len,
                       int64_t batch,
                       int reps,
                       const char* what,
                       ThreadPool* pool = nullptr) {
  auto arena =
      state::PageArena::growable(state::default_page_bytes(c), state::PageArena::Storage::kNone);
  HostPack pack;
  PassPlan plan;
  PlanContext pc;
  pc.config = &c;
  pc.page_floats = arena->page_floats();
  // Each sequence's state as after a prefill of ctx_len tokens (planned, as run_batch does,
  // which keeps the state's metadata: entry counts, compressor windows).
  const std::vector<int32_t> prompt = ids(static_cast<int>(ctx_len), 4);
  std::vector<std::unique_ptr<state::SequenceState>> seqs;
  for (int64_t i = 0; i < batch; ++i) {
    seqs.push_back(std::make_unique<state::SequenceState>(c, arena.get(), i, 0));
    ASSERT_TRUE(seqs.back()->reserve(ctx_len));
    pack.clear();
    plan_pass(pc, {SeqSpan{seqs.back().get(), 0, ctx_len, 0, false}}, prompt, ctx_len, pack, &plan);
    seqs.back()->advance(ctx_len);
  }
  const std::vector<int32_t> toks = ids(static_cast<int>(batch), 5);
  pc.fixed_shape = true;  // a graph-replayed decode step
  pc.pool = pool;
  std::vector<uint8_t> staging;
  double best_ms = 1e30;
  for (int rep = 0; rep <= reps; ++rep) {  // successive steps; the first sizes the pack
    std::vector<SeqSpan> spans;
    for (int64_t i = 0; i < batch; ++i) {
      ASSERT_TRUE(seqs[i]->reserve(1));
      spans.push_back(SeqSpan{seqs[i].get(), ctx_len + rep, 1, i, false});
    }
    pack.clear();
    const auto t0 = std::chrono::steady_clock::now();
    plan_pass(pc, spans, toks, batch, pack, &plan);
    pack.layout(true);
    staging.resize(static_cast<size_t>(pack.host_bytes()));
    pack.copy_to(staging.data(), pool);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0)
      best_ms = std::min(best_ms, ms);
    for (auto& st : seqs) st->advance(1);  // as run_batch does after the launches
  }
  std::printf("[plan] decode step, %s: %.2f MB packed, %.3f ms (best of %d, %d threads)\n",
              what,
              static_cast<double>(pack.host_bytes()) / 1e6,
              best_ms,
              reps,
              pool != nullptr ? pool->threads() : 1);
  EXPECT_LT(best_ms, 200.0);  // loose: a shared CI core; the device run reports the real gap
}

TEST(ForwardPlan, PlansADecodeStepOf64SequencesAt8kContext) {
  auto cfg = model::v4_flash_preset_config(4);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  time_decode_plans(*cfg, 8192, 64, 4, "64 sequences at 8192 tokens, 4 Flash layers");
}

// The bundled model's large decode batch, where the backend's planning is most of the GPU's idle
// time between steps (docs/performance.md, thirty-fourth session).
TEST(ForwardPlan, PlansADecodeStepOf256BundledSequences) {
  auto cfg =
      model::load_model_config(std::string(DSI_SOURCE_DIR) + "/models/dsv4-mini/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  time_decode_plans(*cfg, 512, 256, 50, "256 sequences at 512 tokens, the bundled model");
  // Its layers side by side, as the CUDA backend plans large passes.
  ThreadPool pool(
      static_cast<int>(std::min(4u, std::max(1u, std::thread::hardware_concurrency()))));
  time_decode_plans(*cfg, 512, 256, 50, "256 sequences at 512 tokens, the bundled model", &pool);
}

// Layers planned side by side on a pool (PlanContext::pool, passes of many rows) give the plan
// that planning them one after another gives: the same pack, byte for byte and in the same
// layout, the same array ids, and the same metadata left in every sequence. Prefill chunks,
// decode steps and verification-shaped steps, packed and fixed-shape, over sequences of
// different lengths.
TEST(ForwardPlan, LayersPlannedOnAPoolGiveTheSamePlan) {
  auto cfg =
      model::load_model_config(std::string(DSI_SOURCE_DIR) + "/models/dsv4-mini/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const model::ModelConfig& c = *cfg;
  ThreadPool pool(4);
  struct World {
    std::unique_ptr<state::PageArena> arena;
    std::vector<std::unique_ptr<state::SequenceState>> seqs;
    HostPack pack;
    PassPlan plan;
  };
  World w[2];  // [0]: one layer after another, [1]: on the pool
  const int64_t batch = 48;
  std::mt19937 g(11);
  std::vector<int64_t> lens;
  for (int64_t i = 0; i < batch; ++i) lens.push_back(1 + static_cast<int64_t>(g() % 400));
  auto compare = [&](const char* what) {
    SCOPED_TRACE(what);
    ASSERT_EQ(w[0].pack.layout_key(), w[1].pack.layout_key());
    ASSERT_EQ(w[0].pack.host_bytes(), w[1].pack.host_bytes());
    std::vector<uint8_t> a(static_cast<size_t>(w[0].pack.host_bytes()));
    std::vector<uint8_t> b(a.size());
    w[0].pack.copy_to(a.data());
    w[1].pack.copy_to(b.data());
    ASSERT_TRUE(a == b);
    std::vector<int64_t> ka, kb;
    append_geometry_key(w[0].plan, &ka);
    append_geometry_key(w[1].plan, &kb);
    ASSERT_EQ(ka, kb);
    ASSERT_EQ(w[0].plan.layers.size(), w[1].plan.layers.size());
    for (size_t l = 0; l < w[0].plan.layers.size(); ++l) {
      const LayerPass& x = w[0].plan.layers[l];
      const LayerPass& y = w[1].plan.layers[l];
      const std::vector<int64_t> xs = {x.key_begin,
                                       x.key_refs,
                                       x.ring_pages,
                                       x.ring_dest,
                                       x.hca_pages,
                                       x.index_pages,
                                       x.visible,
                                       x.select_begin,
                                       x.comp.n_entries,
                                       x.comp.token_refs,
                                       x.comp.out_offset,
                                       x.index_comp.block,
                                       x.index_comp.ring_dest};
      const std::vector<int64_t> ys = {y.key_begin,
                                       y.key_refs,
                                       y.ring_pages,
                                       y.ring_dest,
                                       y.hca_pages,
                                       y.index_pages,
                                       y.visible,
                                       y.select_begin,
                                       y.comp.n_entries,
                                       y.comp.token_refs,
                                       y.comp.out_offset,
                                       y.index_comp.block,
                                       y.index_comp.ring_dest};
      ASSERT_EQ(xs, ys) << "layer " << l;
    }
    for (size_t i = 0; i < w[0].seqs.size(); ++i) {
      for (size_t l = 0; l < c.layers.size(); ++l) {
        const state::LayerState& x = w[0].seqs[i]->layers()[l];
        const state::LayerState& y = w[1].seqs[i]->layers()[l];
        ASSERT_EQ(x.num_entries, y.num_entries) << "sequence " << i << " layer " << l;
        ASSERT_EQ(x.comp_rows.end_pos(), y.comp_rows.end_pos());
        ASSERT_EQ(x.index_rows.end_pos(), y.index_rows.end_pos());
      }
    }
  };
  for (int k = 0; k < 2; ++k) {
    w[k].arena =
        state::PageArena::growable(state::default_page_bytes(c), state::PageArena::Storage::kNone);
  }
  // Prefills, one sequence each (the longer ones past kParallelRows).
  for (int64_t i = 0; i < batch; ++i) {
    const std::vector<int32_t> prompt = ids(static_cast<int>(lens[i]), 7);
    for (int k = 0; k < 2; ++k) {
      PlanContext pc;
      pc.config = &c;
      pc.page_floats = w[k].arena->page_floats();
      pc.pool = k == 1 ? &pool : nullptr;
      w[k].seqs.push_back(std::make_unique<state::SequenceState>(c, w[k].arena.get(), i, 4));
      ASSERT_TRUE(w[k].seqs.back()->reserve(lens[i]));
      w[k].pack.clear();
      plan_pass(pc,
                {SeqSpan{w[k].seqs.back().get(), 0, lens[i], 0, false}},
                prompt,
                lens[i],
                w[k].pack,
                &w[k].plan);
      w[k].pack.layout(false);
      w[k].seqs.back()->advance(lens[i]);
    }
    compare("prefill");
  }
  // Decode and verification-shaped steps of every sequence.
  for (int step = 0; step < 24; ++step) {
    const int64_t L = step % 3 == 2 ? 3 : 1;
    const bool fixed = step % 2 == 0;
    const int64_t rows = fixed ? pow2_at_least(batch) * L : batch * L;
    const std::vector<int32_t> toks = ids(static_cast<int>(rows), 100 + step);
    for (int k = 0; k < 2; ++k) {
      PlanContext pc;
      pc.config = &c;
      pc.page_floats = w[k].arena->page_floats();
      pc.fixed_shape = fixed;
      pc.slot_rows = fixed ? L : 0;
      pc.pool = k == 1 ? &pool : nullptr;
      std::vector<SeqSpan> spans;
      for (int64_t i = 0; i < batch; ++i) {
        state::SequenceState& st = *w[k].seqs[i];
        ASSERT_TRUE(st.reserve(L));
        spans.push_back(SeqSpan{&st, st.num_tokens(), L, i * L, false});
      }
      w[k].pack.clear();
      plan_pass(pc, spans, toks, rows, w[k].pack, &w[k].plan);
      w[k].pack.layout(fixed);
      for (auto& st : w[k].seqs) st->advance(L);
    }
    compare(fixed ? "fixed-shape step" : "packed step");
  }
}

// A fixed-shape pass (a graph-replayed step) keeps one layout, and so one graph key, while a
// short context grows past the window and while the sequences of a padded batch finish: for the
// bundled model, batches of 33 to 64 sequences (padded to 64) over 48 tokens from a 32-token
// context give one layout per tokens-per-sequence L (11 layouts before the fixed-shape bounds).
// The padded arrays change no key: every real row's window keys address its sequence's ring
// slots and every HCA key its sequence's entries.
TEST(ForwardPlan, FixedShapeLayoutHoldsAsContextsGrowAndBatchesShrink) {
  auto ck = model::Checkpoint::open(std::string(DSI_SOURCE_DIR) + "/models/dsv4-mini");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const model::ModelConfig& c = (*ck)->config();
  auto arena = state::PageArena::growable(state::default_page_bytes(c));
  const int64_t ctx_len = 32, pad = 64;
  for (int64_t L : {1, 3}) {
    std::set<std::vector<int64_t>> layouts;
    for (int64_t batch : {33, 47, 64}) {
      SCOPED_TRACE("L " + std::to_string(L) + " batch " + std::to_string(batch));
      PlanContext pc;
      pc.config = &c;
      pc.page_floats = arena->page_floats();
      HostPack pack;
      PassPlan plan;
      std::vector<std::unique_ptr<state::SequenceState>> seqs;
      const std::vector<int32_t> prompt = ids(static_cast<int>(ctx_len), 4);
      for (int64_t i = 0; i < batch; ++i) {
        seqs.push_back(std::make_unique<state::SequenceState>(c, arena.get(), i, 4));
        ASSERT_TRUE(seqs.back()->reserve(ctx_len));
        pack.clear();
        plan_pass(
            pc, {SeqSpan{seqs.back().get(), 0, ctx_len, 0, false}}, prompt, ctx_len, pack, &plan);
        seqs.back()->advance(ctx_len);
      }
      pc.fixed_shape = true;
      for (int64_t step = 0; step < 48 / L; ++step) {
        std::vector<SeqSpan> spans;
        for (int64_t i = 0; i < batch; ++i) {
          ASSERT_TRUE(seqs[i]->reserve(L));
          spans.push_back(SeqSpan{seqs[i].get(), seqs[i]->num_tokens(), L, i * L, false});
        }
        pack.clear();
        plan_pass(pc, spans, ids(static_cast<int>(pad * L), 5), pad * L, pack, &plan);
        pack.layout(true);
        std::vector<int64_t> key = pack.layout_key();
        for (const LayerPass& lp : plan.layers) key.push_back(lp.visible_room);
        layouts.insert(key);
        for (size_t l = 0; l < c.layers.size(); ++l) {
          const LayerPass& lp = plan.layers[l];
          const auto begin = pack.read<int64_t>(lp.key_begin);
          const auto keys = expand_keys_host(pc, pack, plan, l);
          for (int64_t i = 0; i < batch; ++i) {
            const state::LayerState& ls = seqs[i]->layers()[l];
            const int64_t first = seqs[i]->num_tokens();
            for (int64_t t = 0; t < L; ++t) {
              const int64_t r = i * L + t, p0 = first + t;
              int64_t j = begin[r];
              for (int64_t p = std::max<int64_t>(0, p0 - c.sliding_window + 1); p <= p0; ++p, ++j) {
                if (p < first) {
                  ASSERT_EQ(keys[j], ls.ring.pool_offset(p % ls.ring_capacity))
                      << "layer " << l << " sequence " << i << " window key " << p;
                }
              }
              if (c.layers[l].attention == AttentionType::kHca) {
                for (int64_t w = 0; w < (p0 + 1) / c.layers[l].compress_ratio; ++w, ++j) {
                  ASSERT_EQ(keys[j], ls.entries.pool_offset(w))
                      << "layer " << l << " sequence " << i << " entry " << w;
                }
              }
            }
          }
        }
        for (auto& st : seqs) st->advance(L);
      }
    }
    EXPECT_EQ(layouts.size(), 1u) << "L " << L;
  }
}

}  // namespace
}  // namespace dsinfer::gpu
