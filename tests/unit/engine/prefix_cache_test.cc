// Prefix cache: a start from a stored state image gives logits bit-identical to the uncached run
// (reference numerics) on the fixture and the bundled model, at every kind of boundary (inside a
// compression block, at a page edge, inside the first window, after the window ring wrapped);
// the engine reuses units across turns, across a restart (SSD tier), never across tenants, and
// a corrupt unit is a miss with unchanged output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include "backend/cpu/cpu_model.h"
#include "engine/engine.h"
#include "model/checkpoint.h"
#include "spec/config.h"
#include "state/sequence_state.h"
#include "unit/engine/engine_test_util.h"

namespace dsinfer::engine {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<const model::Checkpoint> open_ckpt(const std::string& dir) {
  auto r = model::Checkpoint::open(dir);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::shared_ptr<const model::Checkpoint>(std::move(r).value()) : nullptr;
}

std::shared_ptr<const model::Checkpoint> fixture() {
  static auto c = open_ckpt(std::string(DSI_SOURCE_DIR) + "/tests/fixtures/tiny-a/official");
  return c;
}

std::shared_ptr<const model::Checkpoint> bundled() {
  static auto c = open_ckpt(std::string(DSI_SOURCE_DIR) + "/models/dsv4-mini");
  return c;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(2 + g() % static_cast<uint32_t>(vocab - 2));
  return t;
}

std::vector<float> forward(const cpu::CpuModel& m,
                           state::SequenceState& st,
                           std::span<const int32_t> tokens) {
  backend::ForwardOutputs out;
  backend::ForwardOptions o;
  const Status s = m.forward(st, tokens, o, &out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out.logits;
}

bool bit_equal(const std::vector<float>& a, const float* b, size_t n) {
  return a.size() == n && std::memcmp(a.data(), b, n * 4) == 0;
}

// For each boundary n: the uncached forward over all tokens vs (forward over [0, n), capture,
// restore into another arena with another page size, forward over [n, L)).
void check_boundaries(const model::Checkpoint& ckpt, int64_t len, const std::vector<int64_t>& ns) {
  const auto& mc = ckpt.config();
  cpu::CpuModel model(mc, ckpt.weights(), model::Numerics::kReference);
  const auto tokens = random_tokens(len, mc.vocab_size, 11);
  auto arena_a = state::PageArena::growable(state::min_page_bytes(mc));
  auto arena_b = state::PageArena::growable(state::default_page_bytes(mc));
  state::SequenceState full(mc, arena_a.get(), 1, 0);
  const std::vector<float> ref = forward(model, full, tokens);
  const size_t vocab = static_cast<size_t>(mc.vocab_size);
  ASSERT_EQ(ref.size(), static_cast<size_t>(len) * vocab);
  for (int64_t n : ns) {
    SCOPED_TRACE("boundary " + std::to_string(n));
    const std::span<const int32_t> head(tokens.data(), static_cast<size_t>(n));
    const std::span<const int32_t> rest(tokens.data() + n, static_cast<size_t>(len - n));
    state::SequenceState a(mc, arena_a.get(), 2, 0);
    forward(model, a, head);
    auto image = state::capture_state(a, test_support::host_page_reader(*arena_a));
    ASSERT_TRUE(image.ok()) << image.status().to_string();
    auto planned = test_support::planned_image(a);
    ASSERT_TRUE(planned.ok()) << planned.status().to_string();
    EXPECT_TRUE(*planned == *image) << "planned and assembled image differs";
    auto tokens_in = state::state_image_tokens(*image);
    ASSERT_TRUE(tokens_in.ok());
    EXPECT_EQ(*tokens_in, n);
    state::SequenceState b(mc, arena_b.get(), 3, 0);
    const Status rs = state::restore_state(*image, b, test_support::host_page_writer(*arena_b));
    ASSERT_TRUE(rs.ok()) << rs.to_string();
    EXPECT_EQ(b.num_tokens(), n);
    const std::vector<float> cached = forward(model, b, rest);
    // The restored start == the uncached single forward over all tokens, bit for bit.
    EXPECT_TRUE(bit_equal(cached, ref.data() + n * vocab, static_cast<size_t>(len - n) * vocab));
  }
}

TEST(StateImage, FixtureEveryBoundaryKind) {
  // Fixture: window 8, ratios 4 and 16; min page = 512 floats -> 4 entries per page, so
  // ratio-4 entries fill a page every 16 tokens and ratio-16 ones every 64.
  check_boundaries(*fixture(), 80, {1, 5, 7, 13, 16, 31, 64, 66});
}

TEST(StateImage, BundledModelEveryBoundaryKind) {
  // Bundled: window 64, ratios 4 and 16; min page = 1024 floats -> 8 entries per page (a page
  // edge every 32 tokens for ratio 4, every 128 for ratio 16). 21: inside the first window;
  // 37: inside both compression blocks; 128: a page edge of both; 101: ring wrapped, mid-block.
  check_boundaries(*bundled(), 136, {21, 37, 101, 128});
}

TEST(StateImage, RejectsImagesOfAnotherModelAndCorruption) {
  const auto& mc = fixture()->config();
  cpu::CpuModel model(mc, fixture()->weights(), model::Numerics::kReference);
  auto arena = state::PageArena::growable(state::min_page_bytes(mc));
  state::SequenceState a(mc, arena.get(), 1, 0);
  const auto tokens = random_tokens(20, mc.vocab_size, 3);
  forward(model, a, tokens);
  auto image = state::capture_state(a, test_support::host_page_reader(*arena));
  ASSERT_TRUE(image.ok());
  // Another rollback limit = another layout.
  state::SequenceState other(mc, arena.get(), 2, 2);
  EXPECT_FALSE(state::restore_state(*image, other, test_support::host_page_writer(*arena)).ok());
  EXPECT_EQ(other.num_tokens(), 0);
  // Truncated.
  state::SequenceState b(mc, arena.get(), 3, 0);
  EXPECT_FALSE(state::restore_state(std::string_view(*image).substr(0, image->size() - 4),
                                    b,
                                    test_support::host_page_writer(*arena))
                   .ok());
  EXPECT_EQ(b.num_tokens(), 0);
  b.check_integrity();
  // Every header byte flipped: rejected or (payload bytes) restored consistently, never a crash.
  for (size_t i = 0; i < 64; ++i) {
    std::string c = *image;
    c[i] ^= 0x40;
    state::SequenceState d(mc, arena.get(), 4 + static_cast<int64_t>(i), 0);
    (void)state::restore_state(c, d, test_support::host_page_writer(*arena));
    d.check_integrity();
  }
}

// The MTP block's state in an image (V4): a sequence whose prefill ran the block captures with
// its position count, window ring and final streams; restored into another arena (another page
// size) it captures back to the same bytes, and its next drafts equal the original's. A count
// past the sequence's last position is rejected.
TEST(StateImage, MtpStateRoundTripsAndDraftsTheSame) {
  const auto& mc = bundled()->config();
  cpu::CpuModel model(mc, bundled()->weights(), model::Numerics::kReference);
  ASSERT_TRUE(model.can_draft());
  auto arena_a = state::PageArena::growable(state::min_page_bytes(mc));
  auto arena_b = state::PageArena::growable(state::default_page_bytes(mc));
  const int64_t rollback = 3;
  const auto tokens = random_tokens(90, mc.vocab_size, 8);  // past the 64-token window
  state::SequenceState a(mc, arena_a.get(), 1, rollback);
  backend::ForwardOutputs out;
  backend::ForwardOptions o;
  o.run_mtp = true;
  ASSERT_TRUE(model.forward(a, tokens, o, &out).ok());
  ASSERT_EQ(a.mtp_num_tokens(), 89);
  auto image = state::capture_state(a, test_support::host_page_reader(*arena_a));
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  state::SequenceState b(mc, arena_b.get(), 2, rollback);
  ASSERT_TRUE(state::restore_state(*image, b, test_support::host_page_writer(*arena_b)).ok());
  EXPECT_EQ(b.num_tokens(), 90);
  EXPECT_EQ(b.mtp_num_tokens(), 89);
  auto again = state::capture_state(b, test_support::host_page_reader(*arena_b));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *image);
  // Three drafts after the same next token, from each.
  auto draft = [&](state::SequenceState& st) {
    std::vector<int32_t> t(3);
    std::vector<float> p(3);
    backend::DraftItem it;
    it.state = &st;
    it.next_token = 7;
    it.num_steps = 3;
    it.tokens = t.data();
    it.probs = p.data();
    std::vector<backend::DraftItem> items{it};
    EXPECT_TRUE(model.mtp_draft_batch(items).ok());
    EXPECT_TRUE(items[0].status.ok()) << items[0].status.to_string();
    return std::pair{t, p};
  };
  EXPECT_EQ(draft(a), draft(b));
  // The MTP count (header bytes 20..27) past num_tokens - 1: rejected, the sequence left fresh.
  std::string bad = *image;
  const int64_t past = 90;
  std::memcpy(bad.data() + 20, &past, sizeof(past));
  state::SequenceState c(mc, arena_b.get(), 3, rollback);
  const Status s = state::restore_state(bad, c, test_support::host_page_writer(*arena_b));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
  EXPECT_EQ(c.num_tokens(), 0);
}

// Pages come back to the arena with whatever the last sequence wrote. An image of a sequence
// shorter than its window ring must not carry that data (it would be stored under this request's
// tenant key): unwritten ring slots go into the image as zeros, and an image with data in such
// slots is rejected (images are canonical).
TEST(StateImage, UnwrittenRingSlotsCarryNoOtherSequencesData) {
  const auto& mc = fixture()->config();
  cpu::CpuModel model(mc, fixture()->weights(), model::Numerics::kReference);
  auto arena = state::PageArena::growable(state::min_page_bytes(mc));
  {  // an earlier sequence fills every page it holds with a marker, then releases them
    state::SequenceState old(mc, arena.get(), 1, 0);
    forward(model, old, random_tokens(40, mc.vocab_size, 5));
    for (int32_t p = 0; p < arena->num_pages(); ++p) {
      float* page = arena->page(p);
      for (int64_t i = 0; i < arena->page_floats(); ++i) page[i] = 12345.0f;
    }
  }
  state::SequenceState a(mc, arena.get(), 2, 0);
  const int64_t n = 3;  // shorter than every window ring
  forward(model, a, random_tokens(n, mc.vocab_size, 6));
  auto image = state::capture_state(a, test_support::host_page_reader(*arena));
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  const float marker = 12345.0f;
  char m[4];
  std::memcpy(m, &marker, 4);
  EXPECT_EQ(image->find(std::string(m, 4)), std::string::npos)
      << "the image carries a released page's data";
  // The same image with data put into an unwritten slot of the first ring is refused. The first
  // layer's ring rows start right after the header; find them from the end instead: every row
  // after the last written slot of the first ring is zero, so flip one float of the image's
  // zero run that follows the first ring's written rows.
  state::SequenceState b(mc, arena.get(), 3, 0);
  ASSERT_TRUE(state::restore_state(*image, b, test_support::host_page_writer(*arena)).ok());
  auto again = state::capture_state(b, test_support::host_page_reader(*arena));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *image);  // canonical
  size_t flipped = 0;
  for (size_t off = image->size(); off >= 4 && flipped == 0; off -= 4) {
    std::string c = *image;
    uint32_t u;
    std::memcpy(&u, c.data() + off - 4, 4);
    if (u != 0)
      continue;
    u = 0x3f800000u;  // 1.0f
    std::memcpy(c.data() + off - 4, &u, 4);
    state::SequenceState d(mc, arena.get(), 10, 0);
    const Status st = state::restore_state(c, d, test_support::host_page_writer(*arena));
    if (!st.ok() && st.message().find("never wrote") != std::string::npos)
      flipped = off;
    d.check_integrity();
  }
  EXPECT_GT(flipped, 0u) << "no unwritten slot's data was refused";
}

// Engine level.
using test_support::Turn;

std::string temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("dsinfer-pc-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

EngineConfig cache_config(const model::Checkpoint& ckpt,
                          std::shared_ptr<kvstore::KvStore> store,
                          int64_t block = 16,
                          const std::string& salt = "test-model-v1",
                          int64_t interval = 0,
                          int64_t device_bytes = 0,
                          int64_t state_bytes = int64_t{64} << 20) {
  EngineConfig cfg;
  cfg.state_budget_bytes = state_bytes;
  cfg.prefix_cache.device_bytes = device_bytes;
  cfg.page_bytes = state::min_page_bytes(ckpt.config());
  cfg.scheduler.prefill_chunk = 32;
  cfg.prefix_cache.store = std::move(store);
  cfg.prefix_cache.block = block;
  cfg.prefix_cache.min_tokens = 4;
  cfg.prefix_cache.interval = interval;
  cfg.prefix_cache.promote_wait_ms = 5000;
  cfg.prefix_cache.salt = salt;
  return cfg;
}

// An engine on cache_config(ckpt, store, rest...).
template <typename... Rest>
std::unique_ptr<Engine> make_engine(std::shared_ptr<const model::Checkpoint> ckpt,
                                    std::shared_ptr<kvstore::KvStore> store,
                                    Rest&&... rest) {
  const EngineConfig cfg = cache_config(*ckpt, std::move(store), std::forward<Rest>(rest)...);
  auto e = Engine::create(cfg, std::move(ckpt));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

Turn run(Engine& e,
         const std::vector<int32_t>& prompt,
         int64_t max_tokens,
         const std::string& tenant = "") {
  RequestSpec s;
  s.prompt = prompt;
  s.max_tokens = max_tokens;
  s.sampling.temperature = 0.0f;
  s.ignore_eos = true;
  s.cache_tenant = tenant;
  auto id = e.submit(std::move(s));
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  e.run_until_done();
  e.check_integrity();
  const Request* r = e.request(*id);
  Turn t{r->output, r->output_logprobs, r->cached_tokens};
  e.release(*id);
  return t;
}

std::shared_ptr<kvstore::KvStore> open_store(const std::string& dir, int64_t host = 64 << 20) {
  kvstore::KvStoreOptions o;
  o.host_bytes = host;
  o.dir = dir;
  o.ssd_bytes = int64_t{256} << 20;
  auto s = kvstore::KvStore::open(o);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::shared_ptr<kvstore::KvStore>(std::move(s).value());
}

// A conversation: each turn's prompt = the previous prompt + its output + new user tokens.
std::vector<std::vector<int32_t>> conversation_prompts(Engine& plain,
                                                       int turns,
                                                       uint32_t seed,
                                                       std::vector<Turn>* expected) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> ctx = random_tokens(23, plain.model_config().vocab_size, seed);
  for (int t = 0; t < turns; ++t) {
    prompts.push_back(ctx);
    expected->push_back(run(plain, ctx, 6));
    ctx.insert(ctx.end(), expected->back().output.begin(), expected->back().output.end());
    const auto more = random_tokens(5 + t * 7, plain.model_config().vocab_size, seed + 100 + t);
    ctx.insert(ctx.end(), more.begin(), more.end());
  }
  return prompts;
}

void check_conversation(std::shared_ptr<const model::Checkpoint> ckpt, int turns) {
  auto plain = make_engine(ckpt, nullptr);
  std::vector<Turn> expected;
  const auto prompts = conversation_prompts(*plain, turns, 5, &expected);
  {
    auto cached = make_engine(ckpt, open_store(""));
    for (size_t t = 0; t < prompts.size(); ++t) {
      SCOPED_TRACE("turn " + std::to_string(t));
      const Turn got = run(*cached, prompts[t], 6);
      EXPECT_EQ(got.output, expected[t].output);
      EXPECT_EQ(got.logprobs, expected[t].logprobs);  // bit-equal floats
      if (t == 0) {
        EXPECT_EQ(got.cached, 0);
      } else {
        // Everything the previous turn computed: its prompt and all but its last output token.
        EXPECT_EQ(got.cached, static_cast<int64_t>(prompts[t - 1].size() + 5));
      }
    }
    // The same prompt again: all but its last token come from the cache.
    const Turn again = run(*cached, prompts[1], 6);
    EXPECT_EQ(again.output, expected[1].output);
    EXPECT_EQ(again.logprobs, expected[1].logprobs);
    EXPECT_EQ(again.cached, static_cast<int64_t>(prompts[1].size()) - 1);
    // Another tenant never hits this tenant's units.
    EXPECT_EQ(run(*cached, prompts[1], 6, "tenant-b").cached, 0);
    const EngineStats st = cached->stats();
    EXPECT_GT(st.cached_prompt_tokens, 0);
    EXPECT_EQ(st.cache_restore_failures, 0);
  }
}

TEST(PrefixCache, FixtureConversationIsIdenticalAndHits) {
  check_conversation(fixture(), 4);
}

TEST(PrefixCache, BundledConversationIsIdenticalAndHits) {
  check_conversation(bundled(), 3);
}

TEST(PrefixCache, RestartHitsTheSsdTierAndCorruptionIsAMiss) {
  auto ckpt = fixture();
  auto plain = make_engine(ckpt, nullptr);
  std::vector<Turn> expected;
  const auto prompts = conversation_prompts(*plain, 2, 9, &expected);
  const std::string dir = temp_dir("restart");
  {
    auto store = open_store(dir);
    auto e = make_engine(ckpt, store);
    run(*e, prompts[0], 6);
    store->wait_idle();
    EXPECT_GT(store->stats().demotions, 0);
  }
  // A new process: the store rescans the directory; the second turn hits the SSD tier.
  {
    auto store = open_store(dir);
    auto e = make_engine(ckpt, store);
    const Turn got = run(*e, prompts[1], 6);
    EXPECT_EQ(got.output, expected[1].output);
    EXPECT_EQ(got.logprobs, expected[1].logprobs);
    EXPECT_EQ(got.cached, static_cast<int64_t>(prompts[0].size() + 5));
    EXPECT_GE(store->stats().hits[1], 1);
  }
  // Another model version (salt) never hits them.
  {
    auto store = open_store(dir);
    auto e = make_engine(ckpt, store, 16, "test-model-v2");
    EXPECT_EQ(run(*e, prompts[1], 6).cached, 0);
  }
  // Corrupt every stored file's last byte: the request is a miss with the same output.
  for (const auto& f : fs::directory_iterator(dir)) {
    std::fstream s(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    s.seekp(-1, std::ios::end);
    s.put('\x7f');
  }
  {
    auto store = open_store(dir);
    auto e = make_engine(ckpt, store);
    const Turn got = run(*e, prompts[1], 6);
    EXPECT_EQ(got.output, expected[1].output);
    EXPECT_EQ(got.logprobs, expected[1].logprobs);
    EXPECT_EQ(got.cached, 0);
    EXPECT_GE(store->stats().corrupt, 1);
    EXPECT_GE(e->stats().cache_restore_failures, 1);
  }
  fs::remove_all(dir);
}

// Speculative decoding with the prefix cache (docs/kv-store.md): state images and device-tier
// copies carry the MTP block's state, so a request that starts from a cached prefix speculates
// at once, with the block in step (its first drafts accepted as often as without the cache), and
// its greedy outputs equal the plain engine's. A prefix stored by a request that did not
// speculate leaves the block behind by the whole prefix: a request starting from it decodes
// without speculation, still identically.
std::unique_ptr<Engine> make_spec_engine(std::shared_ptr<const model::Checkpoint> ckpt,
                                         std::shared_ptr<kvstore::KvStore> store,
                                         const char* mode,
                                         int64_t device_bytes = 0,
                                         std::optional<spec::StepTimes> times = std::nullopt) {
  EngineConfig cfg = cache_config(*ckpt, std::move(store), 16, "test-model-v1", 0, device_bytes);
  cfg.speculative = *spec::parse_config(mode);
  cfg.step_times = std::move(times);
  auto e = Engine::create(cfg, std::move(ckpt));
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

TEST(PrefixCache, SpeculativeRequestsResumeTheMtpStateFromTheCache) {
  auto ckpt = bundled();
  auto plain = make_engine(ckpt, nullptr);
  std::vector<Turn> expected;
  const auto prompts = conversation_prompts(*plain, 3, 21, &expected);
  // Per turn: the speculative engine's drafts verified and accepted at each position, without
  // the cache (every prompt computed from the start).
  auto spec_deltas = [](const spec::Stats& a, const spec::Stats& b) {
    std::vector<int64_t> d;
    for (size_t i = 0; i < b.verified.size(); ++i) {
      d.push_back(b.verified[i] - a.verified[i]);
      d.push_back(b.accepted[i] - a.accepted[i]);
    }
    return d;
  };
  std::vector<std::vector<int64_t>> uncached;
  {
    auto e = make_spec_engine(ckpt, nullptr, "fixed:3");
    for (const auto& prompt : prompts) {
      const spec::Stats before = e->stats().spec;
      run(*e, prompt, 6);
      uncached.push_back(spec_deltas(before, e->stats().spec));
    }
  }
  for (int64_t device_bytes : {int64_t{0}, int64_t{32} << 20}) {
    SCOPED_TRACE(device_bytes ? "device tier" : "host store");
    auto e = make_spec_engine(ckpt, open_store(""), "fixed:3", device_bytes);
    ASSERT_EQ(e->speculative().mode, spec::Mode::kFixed);
    for (size_t t = 0; t < prompts.size(); ++t) {
      SCOPED_TRACE("turn " + std::to_string(t));
      const spec::Stats before = e->stats().spec;
      const Turn got = run(*e, prompts[t], 6);
      EXPECT_EQ(got.output, expected[t].output);
      EXPECT_EQ(got.cached > 0, t > 0);
      // A turn that started from the cache drafted what the same turn computed from the start
      // drafts (the MTP block's restored state is the one the prefix left): the same drafts
      // verified and accepted at every position.
      const std::vector<int64_t> d = spec_deltas(before, e->stats().spec);
      EXPECT_EQ(d, uncached[t]);
      EXPECT_GT(d[0], 0);  // it speculated
    }
    EXPECT_EQ(e->stats().cache_restore_failures, 0);
  }
  // Stored by requests that did not speculate (auto, on a step-time model in which verifying
  // never pays, keeps every request off), then read by an engine that drafts as many tokens
  // (the same state shape): hits, no speculation for those requests, the same outputs.
  spec::StepTimes dear;
  for (int64_t b : {1, 64}) {
    dear.batch.push_back(b);
    dear.off_s.push_back(1.0);
    dear.verify_s.emplace_back();
    for (int32_t l = 1; l <= 6; ++l) dear.verify_s.back().push_back(10.0 * l);
    dear.draft_s.emplace_back();
    for (int32_t st = 1; st <= 5; ++st) dear.draft_s.back().push_back(1.0 * st);
  }
  auto store = open_store("");
  {
    auto off = make_spec_engine(ckpt, store, "auto", 0, dear);
    ASSERT_EQ(off->speculative().k, 5);
    const Turn got = run(*off, prompts[0], 6);
    EXPECT_EQ(got.output, expected[0].output);
    EXPECT_EQ(off->stats().spec.spec_steps, 0);
  }
  auto e = make_spec_engine(ckpt, store, "fixed:5");
  const Turn got = run(*e, prompts[1], 6);
  EXPECT_EQ(got.output, expected[1].output);
  EXPECT_GT(got.cached, 0);
  EXPECT_EQ(e->stats().spec.spec_steps, 0);
  EXPECT_EQ(e->stats().cache_restore_failures, 0);
  // A prompt not in the cache speculates in that engine as usual.
  const Turn fresh = run(*e, random_tokens(40, ckpt->config().vocab_size, 77), 6);
  EXPECT_EQ(fresh.cached, 0);
  EXPECT_GT(e->stats().spec.spec_steps, 0);
}

// Shared prefixes under tiny RAM and disk budgets: every output equals the uncached engine's and
// neither tier ever holds more than its budget.
TEST(PrefixCache, RandomTraceStaysWithinBudgetsAndMatchesUncached) {
  auto ckpt = fixture();
  auto plain = make_engine(ckpt, nullptr);
  const std::string dir = temp_dir("budget");
  kvstore::KvStoreOptions o;
  o.host_bytes = 400 << 10;
  o.dir = dir;
  o.ssd_bytes = 900 << 10;
  auto opened = kvstore::KvStore::open(o);
  ASSERT_TRUE(opened.ok());
  std::shared_ptr<kvstore::KvStore> store(std::move(opened).value());
  auto cached = make_engine(ckpt, store, 8, "test-model-v1", /*interval=*/8);
  const int64_t vocab = ckpt->config().vocab_size;
  std::vector<std::vector<int32_t>> bases;
  for (uint32_t b = 0; b < 3; ++b) bases.push_back(random_tokens(20 + 9 * b, vocab, 40 + b));
  std::mt19937 g(3);
  int64_t hits = 0;
  for (int i = 0; i < 30; ++i) {
    std::vector<int32_t> prompt = bases[g() % bases.size()];
    prompt.resize(prompt.size() - g() % 6);
    const auto tail = random_tokens(1 + g() % 12, vocab, 1000 + static_cast<uint32_t>(i));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const Turn want = run(*plain, prompt, 3);
    const Turn got = run(*cached, prompt, 3);
    EXPECT_EQ(got.output, want.output) << "request " << i;
    EXPECT_EQ(got.logprobs, want.logprobs) << "request " << i;
    hits += got.cached > 0;
    const kvstore::StoreStats st = store->stats();
    ASSERT_LE(st.bytes[0], o.host_bytes);
    ASSERT_LE(st.bytes[1], o.ssd_bytes);
  }
  store->wait_idle();
  int64_t on_disk = 0;
  for (const auto& f : fs::directory_iterator(dir)) on_disk += fs::file_size(f.path());
  EXPECT_LE(on_disk, o.ssd_bytes);
  EXPECT_GT(hits, 5);
  EXPECT_GT(store->stats().evictions[0] + store->stats().evictions[1], 0);
  fs::remove_all(dir);
}

// The device tier: units kept as whole sequences in the state arena are forked into the next
// turn's state (no host image, no store hit), with outputs bit-identical to the uncached engine;
// a unit evicted from it is still served by the host tier.
TEST(PrefixCache, DeviceTierServesHitsIdenticallyAndFallsBackToHost) {
  auto ckpt = fixture();
  auto plain = make_engine(ckpt, nullptr);
  std::vector<Turn> expected;
  const auto prompts = conversation_prompts(*plain, 4, 31, &expected);
  auto store = open_store("");
  auto cached = make_engine(ckpt, store, 16, "test-model-v1", 0, int64_t{32} << 20);
  for (size_t t = 0; t < prompts.size(); ++t) {
    SCOPED_TRACE("turn " + std::to_string(t));
    const Turn got = run(*cached, prompts[t], 6);
    EXPECT_EQ(got.output, expected[t].output);
    EXPECT_EQ(got.logprobs, expected[t].logprobs);  // bit-equal floats
    if (t > 0) {
      EXPECT_EQ(got.cached, static_cast<int64_t>(prompts[t - 1].size() + 5));
    }
  }
  EngineStats st = cached->stats();
  EXPECT_EQ(st.device_tier.hits, 3);
  EXPECT_GT(st.device_tier.entries, 0);
  EXPECT_GT(st.device_tier.bytes, 0);
  EXPECT_EQ(store->stats().hits[0] + store->stats().hits[1], 0) << "served from the device";
  // A device tier too small for any unit: every hit comes from the host tier, identically.
  auto small_store = open_store("");
  auto small = make_engine(ckpt, small_store, 16, "test-model-v1", 0, 1);
  for (size_t t = 0; t < prompts.size(); ++t) {
    const Turn got = run(*small, prompts[t], 6);
    EXPECT_EQ(got.output, expected[t].output);
    EXPECT_EQ(got.logprobs, expected[t].logprobs);
  }
  st = small->stats();
  EXPECT_EQ(st.device_tier.entries, 0);
  EXPECT_EQ(st.device_tier.hits, 0);
  EXPECT_GT(st.device_tier.rejected, 0);
  EXPECT_EQ(small_store->stats().hits[0], 3);
}

// The device tier gives its pages to running requests: under a state budget that cannot hold
// the tier's units and the running requests together, nobody is preempted for the tier, every
// output equals the uncached engine's, and the tier is evicted instead.
TEST(PrefixCache, DeviceTierYieldsStateMemoryToRequests) {
  auto ckpt = fixture();
  const auto& mc = ckpt->config();
  const int64_t page = state::min_page_bytes(mc);
  auto plain = make_engine(ckpt, nullptr);
  // Units of ~20-60 tokens; a state budget of 3 sequences' fixed state plus a few pages.
  const int64_t fixed = state::SequenceState::pages_for(mc, page, 1, 0);
  const int64_t budget = (3 * fixed + 12) * page;
  auto cached = make_engine(ckpt, open_store(""), 8, "test-model-v1", 8, budget, budget);
  const int64_t vocab = mc.vocab_size;
  std::mt19937 g(8);
  for (int i = 0; i < 12; ++i) {
    const auto prompt = random_tokens(10 + g() % 40, vocab, 300 + static_cast<uint32_t>(i));
    const Turn want = run(*plain, prompt, 4);
    const Turn got = run(*cached, prompt, 4);
    EXPECT_EQ(got.output, want.output) << "request " << i;
    EXPECT_EQ(got.logprobs, want.logprobs) << "request " << i;
  }
  const EngineStats st = cached->stats();
  EXPECT_GT(st.device_tier.puts, 0);
  EXPECT_GT(st.device_tier.evictions, 0);
  EXPECT_LE(st.device_tier.bytes, budget);
  EXPECT_EQ(st.preemptions, 0);
}

// A disk that is full: every write fails after creating a partial file.
class FullDisk : public kvstore::FileOps {
 public:
  Status write_file(const std::string& path, std::string_view head, std::string_view) override {
    (void)kvstore::FileOps::write_file(path, head.substr(0, 10), "");
    return io_error("write " + path + ": No space left on device");
  }
};

TEST(PrefixCache, FullDiskAndDeletedDirectoryLoseNoRequest) {
  auto ckpt = fixture();
  auto plain = make_engine(ckpt, nullptr);
  std::vector<Turn> expected;
  const auto prompts = conversation_prompts(*plain, 3, 21, &expected);
  const std::string dir = temp_dir("faults");
  FullDisk full;
  kvstore::KvStoreOptions o;
  o.dir = dir;
  o.ssd_bytes = int64_t{64} << 20;
  o.file_ops = &full;
  auto opened = kvstore::KvStore::open(o);
  ASSERT_TRUE(opened.ok());
  std::shared_ptr<kvstore::KvStore> store(std::move(opened).value());
  auto e = make_engine(ckpt, store);
  for (size_t t = 0; t < prompts.size(); ++t) {
    if (t == 1) {
      // The directory disappears mid-run, between two turns. The store's worker is let finish
      // the first turn's writes first: one in flight re-created files under it while it was
      // being removed (a fresh-clone CI run on a loaded machine saw the directory outlive 1000
      // removals).
      store->wait_idle();
      std::error_code ec;
      for (int i = 0; i < 1000 && fs::exists(dir, ec); ++i) fs::remove_all(dir, ec);
      ASSERT_FALSE(fs::exists(dir, ec)) << ec.message();
    }
    const Turn got = run(*e, prompts[t], 6);
    EXPECT_EQ(got.output, expected[t].output);
    EXPECT_EQ(got.logprobs, expected[t].logprobs);
    if (t > 0) {
      EXPECT_GT(got.cached, 0);  // the host tier still serves
    }
  }
  store->wait_idle();
  EXPECT_GT(store->stats().write_errors, 0);
  EXPECT_EQ(store->stats().bytes[1], 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dsinfer::engine
