// DeepSeek V4.1 prefix cache ("SWA bounded replay", spec deepseek-v41.md §5.3): with prefill early
// exit the units are images at multiples of 128 tokens holding the compressed caches, index keys,
// token history and the producer layers' window rings only; a hit restores the last save point
// B <= N - K and replays [B, N). The replayed logits are bit-identical to the uncached early-exit
// prefill of the same prompt (reference numerics) for every kind of hit: B inside the prompt with
// a short or long suffix, a prompt ending on a save point, chunks of 1, 7 and 64, after a
// preemption, across the turns of a conversation. The state the replay must rebuild (consumer and
// DSpark rings) is poisoned with NaN after the restore, so a replay that read it would show.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu_v41/backend.h"
#include "engine/engine.h"
#include "kvstore/store.h"
#include "state/sequence_state.h"
#include "unit/engine/engine_test_util.h"

namespace dsinfer::cpu_v41 {
namespace {

using engine::Engine;
using engine::EngineConfig;
using engine::RequestId;
using engine::RequestSpec;

const std::string kTiny = std::string(DSI_SOURCE_DIR) + "/tests/fixtures/v41-tiny/official";
constexpr int64_t kKeep = 22;  // the fixture's window 16 + backtracking 6

std::unique_ptr<V41Backend> open_backend(int64_t keep_rows) {
  V41BackendOptions o;
  o.prefill_keep_rows = keep_rows;
  auto b = V41Backend::open(kTiny, o);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return b.ok() ? std::move(b).value() : nullptr;
}

std::vector<int32_t> random_tokens(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(3 + g() % 90);  // text ids of the fixture
  return t;
}

// Forwards tokens [from, to) in chunks of `chunk` as a prefill of a prompt of `prompt_len`
// tokens with the early exit; returns the last row's logits.
std::vector<float> prefill(const V41CpuModel& m,
                           state::SequenceState& st,
                           const std::vector<int32_t>& tokens,
                           int64_t from,
                           int64_t to,
                           int64_t prompt_len,
                           int64_t chunk) {
  PrefillExit exit{prompt_len, kKeep};
  ForwardResult r;
  for (int64_t p = from; p < to; p += chunk) {
    const int64_t n = std::min(chunk, to - p);
    const Status s = m.forward(
        st, std::span<const int32_t>(tokens.data() + p, static_cast<size_t>(n)), &exit, &r, true);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  return r.logits;
}

// Fills the pages of every ring the image leaves out with NaN.
void poison_skipped_rings(state::SequenceState& st, const state::ImageOptions& o) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  size_t i = 0;
  for (auto* v : {&st.layers(), &st.mtp_layers()}) {
    for (state::LayerState& ls : *v) {
      if (!o.skip_rings.empty() && o.skip_rings[i]) {
        for (int32_t p : ls.ring.pages()) {
          float* f = st.arena()->page(p);
          std::fill(f, f + st.arena()->page_floats(), nan);
        }
      }
      ++i;
    }
  }
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && !a.empty() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(V41PrefixCache, LayoutPersistsProducersOnly) {
  auto b = open_backend(kKeep);
  ASSERT_NE(b, nullptr);
  auto l = b->prefix_cache_layout();
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  const V41Config& c = b->checkpoint().config();
  EXPECT_EQ(l->save_point, 128);
  EXPECT_EQ(l->replay_rows, kKeep);
  EXPECT_TRUE(l->image.skip_compressor_rows);
  ASSERT_EQ(l->image.skip_rings.size(),
            static_cast<size_t>(c.num_hidden_layers + c.num_nextn_predict_layers));
  for (size_t i = 0; i < l->image.skip_rings.size(); ++i)
    EXPECT_EQ(l->image.skip_rings[i], i < static_cast<size_t>(c.yoco_boundary) ? 0 : 1) << i;
  // Exact prefill: whole-state images at any length, under another salt.
  auto exact = open_backend(0);
  ASSERT_NE(exact, nullptr);
  auto e = exact->prefix_cache_layout();
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->save_point, 0);
  EXPECT_TRUE(e->image.full());
  EXPECT_NE(e->salt, l->salt);
}

// The core identity, below the engine: an image at save point B (taken from a run of another
// prompt length: the producers do not depend on the exit), restored into another arena with the
// skipped rings poisoned, then [B, N) replayed == the uncached early-exit prefill of [0, N).
TEST(V41PrefixCache, ReplayFromASavePointEqualsTheUncachedEarlyExitPrefill) {
  auto b = open_backend(kKeep);
  ASSERT_NE(b, nullptr);
  const V41CpuModel& m = b->v41();
  auto layout = b->prefix_cache_layout();
  ASSERT_TRUE(layout.ok());
  const state::StateShape shape = v41_state_shape(m.config());
  struct Hit {
    int64_t n, b;
  };
  // B with a long suffix; the last save point <= N - K inside the prompt; N on a save point
  // (B backs off a whole save point); a suffix just K long.
  const std::vector<Hit> hits = {{400, 128}, {300, 256}, {384, 256}, {278, 256}, {150, 128}};
  const auto tokens = random_tokens(400, 7);
  for (const Hit& h : hits) {
    ASSERT_LE(h.b, h.n - kKeep);
    for (int64_t chunk : {1, 7, 64}) {
      SCOPED_TRACE("N " + std::to_string(h.n) + " B " + std::to_string(h.b) + " chunk " +
                   std::to_string(chunk));
      auto arena_a = state::PageArena::growable(state::min_page_bytes(shape));
      state::SequenceState full(shape, arena_a.get(), 1);
      const auto want = prefill(m, full, tokens, 0, h.n, h.n, chunk);
      ASSERT_EQ(want.size(), static_cast<size_t>(m.config().vocab_size));
      // The image comes from a run whose prompt was longer (400 tokens, other chunks).
      state::SequenceState a(shape, arena_a.get(), 2);
      prefill(m, a, tokens, 0, h.b, 400, 64);
      auto image =
          state::capture_state(a, engine::test_support::host_page_reader(*arena_a), layout->image);
      ASSERT_TRUE(image.ok()) << image.status().to_string();
      auto arena_b = state::PageArena::growable(state::default_page_bytes(shape));
      state::SequenceState r(shape, arena_b.get(), 3);
      const Status rs = state::restore_state(
          *image, r, engine::test_support::host_page_writer(*arena_b), layout->image);
      ASSERT_TRUE(rs.ok()) << rs.to_string();
      poison_skipped_rings(r, layout->image);
      const auto got = prefill(m, r, tokens, h.b, h.n, h.n, chunk);
      EXPECT_TRUE(bit_equal(got, want));
      // Decoding on from both: still equal (the decode windows stay inside the replayed rows).
      int32_t next =
          static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
      for (int k = 0; k < 3; ++k) {
        ForwardResult x, y;
        ASSERT_TRUE(m.forward(full, std::span<const int32_t>(&next, 1), nullptr, &x).ok());
        ASSERT_TRUE(m.forward(r, std::span<const int32_t>(&next, 1), nullptr, &y).ok());
        ASSERT_TRUE(bit_equal(x.logits, y.logits)) << "decode step " << k;
        next = static_cast<int32_t>(std::max_element(x.logits.begin(), x.logits.end()) -
                                    x.logits.begin());
      }
    }
  }
}

TEST(V41PrefixCache, ImagesAreSmallerCanonicalAndChecked) {
  auto b = open_backend(kKeep);
  ASSERT_NE(b, nullptr);
  const V41CpuModel& m = b->v41();
  auto layout = b->prefix_cache_layout();
  ASSERT_TRUE(layout.ok());
  const state::StateShape shape = v41_state_shape(m.config());
  const auto tokens = random_tokens(260, 9);
  auto arena = state::PageArena::growable(state::min_page_bytes(shape));
  state::SequenceState a(shape, arena.get(), 1);
  prefill(m, a, tokens, 0, 256, 260, 64);
  auto replay =
      state::capture_state(a, engine::test_support::host_page_reader(*arena), layout->image);
  auto whole = state::capture_state(a, engine::test_support::host_page_reader(*arena));
  ASSERT_TRUE(replay.ok() && whole.ok());
  EXPECT_LT(replay->size(), whole->size());
  // Planned and assembled from a copy of the pages (the engine's background captures): the
  // same bytes, with and without the parts bounded replay leaves out.
  auto planned_replay = engine::test_support::planned_image(a, layout->image);
  auto planned_whole = engine::test_support::planned_image(a);
  ASSERT_TRUE(planned_replay.ok() && planned_whole.ok());
  EXPECT_TRUE(*planned_replay == *replay);
  EXPECT_TRUE(*planned_whole == *whole);
  // Restored and captured again: the same bytes; a restored state cannot roll back below it.
  state::SequenceState r(shape, arena.get(), 2);
  ASSERT_TRUE(state::restore_state(
                  *replay, r, engine::test_support::host_page_writer(*arena), layout->image)
                  .ok());
  EXPECT_EQ(r.token(255), tokens[255]);
  auto again =
      state::capture_state(r, engine::test_support::host_page_reader(*arena), layout->image);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *replay);
  EXPECT_FALSE(r.rollback(1).ok());
  // An image of one mode is refused by the other.
  state::SequenceState w(shape, arena.get(), 3);
  EXPECT_FALSE(
      state::restore_state(*replay, w, engine::test_support::host_page_writer(*arena)).ok());
  EXPECT_FALSE(
      state::restore_state(*whole, w, engine::test_support::host_page_writer(*arena), layout->image)
          .ok());
  EXPECT_EQ(w.num_tokens(), 0);
  // The whole image restores exactly (exact mode), token history included.
  ASSERT_TRUE(state::restore_state(*whole, w, engine::test_support::host_page_writer(*arena)).ok());
  EXPECT_EQ(w.token(250), tokens[250]);
  auto whole_again = state::capture_state(w, engine::test_support::host_page_reader(*arena));
  ASSERT_TRUE(whole_again.ok());
  EXPECT_EQ(*whole_again, *whole);
  // DSI_WRITE_FUZZ_SEEDS=DIR: writes the state_image_fuzz seeds of V4.1 images (a bounded-replay
  // image at the first save point, a whole-state image inside the first window).
  if (const char* dir = std::getenv("DSI_WRITE_FUZZ_SEEDS")) {
    state::SequenceState s128(shape, arena.get(), 5);
    prefill(m, s128, tokens, 0, 128, 260, 64);
    state::SequenceState s21(shape, arena.get(), 6);
    prefill(m, s21, tokens, 0, 21, 260, 64);
    auto r128 =
        state::capture_state(s128, engine::test_support::host_page_reader(*arena), layout->image);
    auto w21 = state::capture_state(s21, engine::test_support::host_page_reader(*arena));
    ASSERT_TRUE(r128.ok() && w21.ok());
    std::ofstream(std::string(dir) + "/v41_replay_128_tokens.bin", std::ios::binary) << *r128;
    std::ofstream(std::string(dir) + "/v41_whole_21_tokens.bin", std::ios::binary) << *w21;
  }
  // No image without compressor rows where a ratio-2 group is open (an odd length).
  state::SequenceState odd(shape, arena.get(), 4);
  prefill(m, odd, tokens, 0, 129, 260, 64);
  auto open_group =
      state::capture_state(odd, engine::test_support::host_page_reader(*arena), layout->image);
  ASSERT_FALSE(open_group.ok());
  EXPECT_NE(open_group.status().message().find("compression group"), std::string::npos);
  // Every header byte flipped: rejected or restored consistently, never a crash.
  for (size_t i = 0; i < 200 && i < replay->size(); ++i) {
    std::string c = *replay;
    c[i] ^= 0x21;
    state::SequenceState d(shape, arena.get(), 10 + static_cast<int64_t>(i));
    const Status s =
        state::restore_state(c, d, engine::test_support::host_page_writer(*arena), layout->image);
    d.check_integrity();
    if (!s.ok()) {
      EXPECT_EQ(d.num_tokens(), 0);
    }
  }
}

// Engine level.
std::shared_ptr<kvstore::KvStore> host_store() {
  kvstore::KvStoreOptions so;
  so.host_bytes = int64_t{256} << 20;
  auto s = kvstore::KvStore::open(so);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::shared_ptr<kvstore::KvStore>(std::move(s).value()) : nullptr;
}

std::unique_ptr<Engine> make_engine(bool cache,
                                    int64_t keep_rows,
                                    int64_t chunk,
                                    int64_t budget = int64_t{256} << 20,
                                    int64_t page_bytes = 0,
                                    int64_t device_bytes = 0) {
  EngineConfig cfg;
  cfg.model_dir = kTiny;
  cfg.state_budget_bytes = budget;
  cfg.page_bytes = page_bytes;
  cfg.scheduler.prefill_chunk = chunk;
  cfg.scheduler.max_tokens_per_step = std::max<int64_t>(chunk, 64);
  cfg.prefill_keep_rows = keep_rows;
  if (cache) {
    cfg.prefix_cache.store = host_store();
    cfg.prefix_cache.interval = 256;
    cfg.prefix_cache.device_bytes = device_bytes;
  }
  auto e = Engine::create(cfg);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e).value() : nullptr;
}

struct Out {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int64_t cached = 0;
};

RequestSpec greedy(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  RequestSpec s;
  s.prompt = prompt;
  s.max_tokens = max_tokens;
  s.sampling.temperature = 0.0f;
  s.ignore_eos = true;
  return s;
}

std::vector<Out> run(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int64_t max_t) {
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    auto id = e.submit(greedy(p, max_t));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    ids.push_back(*id);
  }
  while (e.step()) e.check_integrity();
  std::vector<Out> out;
  for (RequestId id : ids) {
    const engine::Request* r = e.request(id);
    EXPECT_EQ(r->state, engine::RequestState::kFinished) << r->error;
    out.push_back({r->output, r->output_logprobs, r->cached_tokens});
    e.release(id);
  }
  return out;
}

bool same(const Out& a, const Out& b) {
  return !a.tokens.empty() && a.tokens == b.tokens && a.logprobs.size() == b.logprobs.size() &&
         std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * 4) == 0;
}

// One request at a time through two engines (cached, uncached), in order: each hit's greedy
// tokens and logprobs equal the uncached run's bit for bit.
TEST(V41PrefixCache, EngineHitsEqualTheUncachedRunAtEveryKindOfHit) {
  const auto base = random_tokens(520, 21);
  auto prefix = [&](int64_t n) { return std::vector<int32_t>(base.begin(), base.begin() + n); };
  // The last pass keeps units in the device tier too (whole states forked in the arena: hits
  // served from there must equal the bounded replay's as well).
  for (int64_t pass : {1, 7, 64, -7}) {
    const int64_t chunk = pass < 0 ? -pass : pass;
    const int64_t device_bytes = pass < 0 ? int64_t{64} << 20 : 0;
    SCOPED_TRACE("chunk " + std::to_string(chunk) + (device_bytes ? " device tier" : ""));
    auto cached = make_engine(true, kKeep, chunk, int64_t{256} << 20, 0, device_bytes);
    auto plain = make_engine(false, kKeep, chunk);
    ASSERT_TRUE(cached && plain);
    struct Step {
      int64_t n;       // prompt length
      int64_t cached;  // the save point it must restore (0: a miss)
    };
    // 300: miss (stores 256, an interval point and its repeat point). 400: B = 256, a long
    // suffix (stores 384, its last save point, when it ends). 390: the unit at 384 exists but
    // 390 - K < 384, so B backs off to 256. 384: a prompt ending on a save point: B = 256.
    // 520: B = 384, a suffix of 136.
    const std::vector<Step> steps = {{300, 0}, {400, 256}, {390, 256}, {384, 256}, {520, 384}};
    for (const Step& s : steps) {
      SCOPED_TRACE("prompt " + std::to_string(s.n));
      const auto a = run(*cached, {prefix(s.n)}, 4);
      const auto b = run(*plain, {prefix(s.n)}, 4);
      EXPECT_TRUE(same(a[0], b[0]));
      EXPECT_EQ(a[0].cached, s.cached);
    }
    const auto st = cached->stats();
    EXPECT_EQ(st.cache_hits, 4);
    EXPECT_EQ(st.cache_restore_failures, 0);
    // Units held until their request ends (bounded replay's last save point) are stored from
    // their captured image only: those hits come from the host tier.
    EXPECT_EQ(st.device_tier.hits > 0, device_bytes > 0);
    EXPECT_EQ(st.prompt_tokens + st.cached_prompt_tokens, plain->stats().prompt_tokens);
  }
}

// A conversation: each turn resends the history with the model's replies (long enough to
// cross save points while decoding) plus a new message. Outputs equal the uncached run's and the
// cached run computes far fewer prompt tokens.
TEST(V41PrefixCache, MultiTurnReplayComputesFewerPromptTokens) {
  auto cached = make_engine(true, kKeep, 64);
  auto plain = make_engine(false, kKeep, 64);
  ASSERT_TRUE(cached && plain);
  std::vector<int32_t> history = random_tokens(150, 31);
  for (int turn = 0; turn < 5; ++turn) {
    SCOPED_TRACE("turn " + std::to_string(turn));
    const auto a = run(*cached, {history}, 90);
    const auto b = run(*plain, {history}, 90);
    ASSERT_TRUE(same(a[0], b[0]));
    if (turn > 0) {
      EXPECT_GT(a[0].cached, 0);
    }
    history.insert(history.end(), b[0].tokens.begin(), b[0].tokens.end());
    const auto msg = random_tokens(30, 100 + static_cast<uint32_t>(turn));
    history.insert(history.end(), msg.begin(), msg.end());
  }
  const auto sc = cached->stats(), sp = plain->stats();
  std::printf(
      "V4.1 bounded replay, 5 turns: prompt tokens computed %lld with the cache (%lld "
      "restored), %lld without\n",
      static_cast<long long>(sc.prompt_tokens),
      static_cast<long long>(sc.cached_prompt_tokens),
      static_cast<long long>(sp.prompt_tokens));
  EXPECT_EQ(sc.prompt_tokens + sc.cached_prompt_tokens, sp.prompt_tokens);
  EXPECT_LT(sc.prompt_tokens * 2, sp.prompt_tokens);
  EXPECT_EQ(sc.cache_hits, 4);
}

// Preemption under a tight budget: preempted requests are admitted again from their unit (a
// second restore) and finish with the uncached run's output. One token each, so that every
// preemption happens during the prefill (a recomputation after decoding changes N, which the
// early exit depends on by design).
TEST(V41PrefixCache, PreemptedRequestsRestoreAgain) {
  const auto shape = [] {
    auto b = open_backend(kKeep);
    return v41_state_shape(b->v41().config());
  }();
  const int64_t page = state::min_page_bytes(shape);  // small pages: growth is fine-grained
  const auto base = random_tokens(460, 41);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    auto p = std::vector<int32_t>(base.begin(), base.begin() + 420 + 10 * i);
    p.back() = static_cast<int32_t>(3 + i);
    prompts.push_back(p);
  }
  auto plain = make_engine(false, kKeep, 16);
  ASSERT_NE(plain, nullptr);
  std::vector<Out> want;
  for (const auto& p : prompts) want.push_back(run(*plain, {p}, 1)[0]);
  // Warm the cache with the shared prefix, then run all four at once in an arena that holds one
  // finished request and one restored at 384 that has not grown much.
  const int64_t pages = state::SequenceState::pages_for(shape, page, 451) +
                        state::SequenceState::pages_for(shape, page, 400);
  auto cached = make_engine(true, kKeep, 16, pages * page, page);
  ASSERT_NE(cached, nullptr);
  run(*cached, {std::vector<int32_t>(base.begin(), base.begin() + 420)}, 1);
  const auto got = run(*cached, prompts, 1);
  const auto st = cached->stats();
  std::printf("preemption test: %lld preemptions, %lld hits, %lld restore failures\n",
              static_cast<long long>(st.preemptions),
              static_cast<long long>(st.cache_hits),
              static_cast<long long>(st.cache_restore_failures));
  EXPECT_GT(st.preemptions, 0);
  // Some request was restored more than once (admitted again after its preemption).
  EXPECT_GT(st.cache_hits, static_cast<int64_t>(prompts.size()));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_TRUE(same(got[i], want[i])) << "request " << i;
}

// Exact prefill: whole-state images at any length (consumer and DSpark rings included), so a
// hit at P - 1 is exact too.
TEST(V41PrefixCache, ExactModeStoresTheWholeStateAtAnyLength) {
  auto cached = make_engine(true, 0, 7);
  auto plain = make_engine(false, 0, 7);
  ASSERT_TRUE(cached && plain);
  const auto base = random_tokens(200, 51);
  for (int64_t n : {37, 37, 90, 161, 200}) {
    const std::vector<int32_t> p(base.begin(), base.begin() + n);
    const auto a = run(*cached, {p}, 5);
    const auto b = run(*plain, {p}, 5);
    EXPECT_TRUE(same(a[0], b[0])) << n;
  }
  EXPECT_EQ(cached->stats().cache_hits, 4);
}

TEST(V41PrefixCache, CombinationsThatCannotBeServedAreRefused) {
  EngineConfig cfg;
  cfg.model_dir = kTiny;
  cfg.prefill_keep_rows = kKeep;
  cfg.prefix_cache.store = host_store();
  cfg.prefix_cache.interval = 100;  // not a multiple of the save point
  auto e = Engine::create(cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("save point"), std::string::npos) << e.status().message();
  cfg.prefix_cache.interval = 0;
  EXPECT_TRUE(Engine::create(cfg).ok());
}

}  // namespace
}  // namespace dsinfer::cpu_v41
