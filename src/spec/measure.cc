// Start-up measurement of the step-time model.
#include "spec/measure.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "base/strings.h"
#include "sampling/sampler.h"
#include "state/sequence_state.h"

namespace dsinfer::spec {

Result<StepTimes> measure_step_times(backend::Model& model,
                                     Drafter& drafter,
                                     state::PageArena& arena,
                                     int64_t max_batch,
                                     int32_t max_k,
                                     bool backend_sampling,
                                     int reps,
                                     double budget_s,
                                     const std::function<double()>& clock,
                                     bool launch_ahead) {
  auto now_s = [&clock] {
    if (clock)
      return clock();
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
  };
  const auto& mc = model.config();
  if (max_k < 1 || max_batch < 1 || reps < 1)
    return invalid_argument("measure_step_times: max_k, max_batch and reps must be >= 1");
  constexpr int64_t kPrompt = 16;
  // Throwaway sequences, with ids far from the engine's request ids.
  constexpr int64_t kIdBase = int64_t{1} << 60;
  std::vector<std::unique_ptr<state::SequenceState>> seqs;
  for (int64_t i = 0; i < max_batch; ++i) {
    // One more rollback than the engine's (a measured verification is undone entirely).
    // A backend with its own state layout (V4.1) has its own rollback limit (>= max_k + 1).
    auto st = model.state_shape() ? std::make_unique<state::SequenceState>(
                                        *model.state_shape(), &arena, kIdBase + i)
                                  : std::make_unique<state::SequenceState>(
                                        mc, &arena, kIdBase + i, max_k + 1, model.row_format());
    if (!st->ok() || !st->reserve(kPrompt + max_k + 1))
      break;
    seqs.push_back(std::move(st));
  }
  if (seqs.empty()) {
    return Status(StatusCode::kResourceExhausted,
                  "no state memory for the speculative step-time measurement");
  }
  auto token = [&](int64_t i) { return static_cast<int32_t>((2 + 37 * i) % mc.vocab_size); };
  std::vector<int32_t> prompt(kPrompt);
  for (int64_t i = 0; i < kPrompt; ++i) prompt[static_cast<size_t>(i)] = token(i);
  std::vector<int32_t> tail(static_cast<size_t>(max_k + 1));
  for (int32_t i = 0; i <= max_k; ++i) tail[static_cast<size_t>(i)] = token(kPrompt + i);

  backend::ForwardOptions spec_opts;  // a prompt chunk's
  drafter.prepare(spec_opts, 0);
  std::vector<backend::ForwardItem> items;
  std::vector<backend::ForwardOutputs> outs(seqs.size());
  auto run = [&](size_t b, std::span<const int32_t> tokens, backend::ForwardOptions o) {
    items.assign(b, backend::ForwardItem{});
    for (size_t i = 0; i < b; ++i) {
      items[i].state = seqs[i].get();
      items[i].tokens = tokens;
      items[i].options = o;
      items[i].out = &outs[i];
    }
    DSI_RETURN_IF_ERROR(model.forward_batch(items));
    for (const auto& it : items) DSI_RETURN_IF_ERROR(it.status);
    return Status();
  };
  auto rollback = [&](size_t b, int64_t k) {
    for (size_t i = 0; i < b; ++i) DSI_RETURN_IF_ERROR(seqs[i]->rollback(k));
    return Status();
  };
  // Plain decodes launched ahead (launch_ahead): `ahead` steps in a row, each but the first
  // taking its token from the previous step's pick on the device, the outputs alternating (the
  // backend writes a step's picks during the next call); the caller rolls them back.
  launch_ahead =
      launch_ahead && backend_sampling && model.can_sample() && model.can_defer_samples();
  const int64_t ahead = std::min<int64_t>(4, max_k + 1);
  std::vector<backend::ForwardOutputs> ahead_outs[2] = {
      std::vector<backend::ForwardOutputs>(seqs.size()),
      std::vector<backend::ForwardOutputs>(seqs.size())};
  auto run_ahead = [&](size_t b, const backend::ForwardOptions& plain) -> Status {
    for (int64_t j = 0; j < ahead; ++j) {
      std::vector<backend::ForwardOutputs>& o = ahead_outs[j % 2];
      items.assign(b, backend::ForwardItem{});
      for (size_t i = 0; i < b; ++i) {
        items[i].state = seqs[i].get();
        items[i].tokens = std::span<const int32_t>(tail.data() + j, 1);
        items[i].options = plain;
        items[i].options.may_defer = true;
        items[i].options.device_token = j > 0;
        items[i].out = &o[i];
      }
      DSI_RETURN_IF_ERROR(model.forward_batch(items));
      for (const auto& it : items) DSI_RETURN_IF_ERROR(it.status);
    }
    return model.complete_deferred_samples();
  };
  {
    // The prompts, with logits so that every weight has been used once (a backend may convert
    // weights on first use) before anything is timed.
    backend::ForwardOptions o = spec_opts;
    o.last_logits_only = true;
    DSI_RETURN_IF_ERROR(run(seqs.size(), prompt, o));
  }

  std::vector<int64_t> sizes;
  for (int64_t b = 1; b < static_cast<int64_t>(seqs.size()); b *= 2) sizes.push_back(b);
  sizes.push_back(static_cast<int64_t>(seqs.size()));

  const size_t vocab = static_cast<size_t>(mc.vocab_size);
  sampling::SamplingConfig greedy;
  greedy.temperature = 0.0f;
  const sampling::PenaltyState no_penalty;
  sampling::SamplerScratch sampler_scratch;
  // Steps without drafts as the engine runs them with backend sampling: greedy in the backend.
  backend::SampleRequest device_greedy;
  device_greedy.config = &greedy;
  device_greedy.penalties = &no_penalty;
  // Verifications as the engine runs them with backend sampling: every row picked in the
  // backend (ForwardOptions::sample_rows), only the picks back; else every row's logits back
  // and sampled on the host.
  const bool device_rows = backend_sampling && model.can_sample();
  const std::vector<backend::SampleRequest> device_rows_greedy(static_cast<size_t>(max_k + 1),
                                                               device_greedy);
  auto verify_opts = [&](int32_t len) {
    backend::ForwardOptions o;
    drafter.prepare(o, len - 1);
    o.last_logits_only = len == 1;
    if (len == 1 && backend_sampling)  // depth 0: no drafts, sampled where a plain step is
      o.sample = &device_greedy;
    else if (len > 1 && device_rows)
      o.sample_rows = std::span<const backend::SampleRequest>(device_rows_greedy.data(),
                                                              static_cast<size_t>(len));
    return o;
  };
  StepTimes t;
  std::vector<Draft> drafts(seqs.size());
  std::vector<DraftRequest> reqs;
  // Drafting `steps` from the first tail token for the first b sequences.
  auto set_reqs = [&](size_t b, int32_t steps) {
    reqs.assign(b, DraftRequest{});
    for (size_t i = 0; i < b; ++i) {
      reqs[i].state = seqs[i].get();
      reqs[i].next_token = tail[0];
      reqs[i].max_drafts = steps;
      reqs[i].out = &drafts[i];
    }
  };
  // Every measurement is the minimum over `reps` rounds, the rounds interleaved (each round
  // times every length once) so that a burst of load from elsewhere spoils one round of several
  // lengths rather than every round of one length.
  const double t_start = now_s();
  for (int64_t b64 : sizes) {
    const size_t b = static_cast<size_t>(b64);
    const double t_size = now_s();
    t.batch.push_back(b64);
    double off = 1e30;
    std::vector<double> verify(static_cast<size_t>(max_k + 1), 1e30);
    std::vector<double> draft(static_cast<size_t>(max_k), 1e30);
    // The host's share of a step: without backend sampling the engine samples every returned
    // row on the host (each verified position), which costs about as much as the GPU's forward
    // at batch 64 on the H200 (~4 ms for 192 rows of 129,280 logits): timed with the forward,
    // greedy (nothing to do where the rows were picked in the backend).
    auto sample_rows = [&](size_t nb) {
      for (size_t i = 0; i < nb; ++i) {
        std::vector<float>& lg = outs[i].logits;
        for (size_t r = 0; r + vocab <= lg.size(); r += vocab)
          (void)sampling::sample(
              std::span<float>(lg.data() + r, vocab), greedy, no_penalty, 0, sampler_scratch);
      }
    };
    backend::ForwardOptions plain;  // a plain decode: no drafter
    plain.last_logits_only = true;
    if (backend_sampling)
      plain.sample = &device_greedy;
    {
      // Untimed, so that every timed call is the steady state the engine's steps see, even when
      // the budget leaves a single round: the longest verification and drafting first (a backend
      // grows its workspace on a new size, which can drop its captured graphs), then every
      // verification length, drafting depth and the plain decode twice (the CUDA backend runs a
      // new shape eagerly once, captures it as a graph the second time and replays it from then
      // on, as it does for the engine's steps; timing the eager runs made off look as costly as
      // a verification, and a verification twice as costly as it is).
      {
        backend::ForwardOptions o;
        drafter.prepare(o, max_k);
        DSI_RETURN_IF_ERROR(run(b, std::span<const int32_t>(tail.data(), tail.size()), o));
        DSI_RETURN_IF_ERROR(rollback(b, max_k + 1));
      }
      for (int w = 0; w < 2; ++w) {
        for (int32_t len = 1; len <= max_k + 1; ++len) {
          DSI_RETURN_IF_ERROR(run(b,
                                  std::span<const int32_t>(tail.data(), static_cast<size_t>(len)),
                                  verify_opts(len)));
          DSI_RETURN_IF_ERROR(rollback(b, len));
        }
        for (int32_t st = 1; st <= max_k; ++st) {
          set_reqs(b, st);
          DSI_RETURN_IF_ERROR(drafter.draft(reqs));
          for (const auto& q : reqs) DSI_RETURN_IF_ERROR(q.status);
          DSI_RETURN_IF_ERROR(rollback(b, 0));
        }
      }
      set_reqs(b, max_k);
      DSI_RETURN_IF_ERROR(drafter.draft(reqs));
      for (const auto& q : reqs) DSI_RETURN_IF_ERROR(q.status);
      DSI_RETURN_IF_ERROR(rollback(b, 0));
      for (int w = 0; w < 2; ++w) {
        DSI_RETURN_IF_ERROR(run(b, std::span<const int32_t>(tail.data(), 1), plain));
        DSI_RETURN_IF_ERROR(rollback(b, 1));
        if (launch_ahead) {
          DSI_RETURN_IF_ERROR(run_ahead(b, plain));
          DSI_RETURN_IF_ERROR(rollback(b, ahead));
        }
      }
    }
    for (int r = 0; r < reps; ++r) {
      if (launch_ahead) {
        const double t0 = now_s();
        DSI_RETURN_IF_ERROR(run_ahead(b, plain));
        off = std::min(off, (now_s() - t0) / static_cast<double>(ahead));
        DSI_RETURN_IF_ERROR(rollback(b, ahead));
      } else {
        const double t0 = now_s();
        DSI_RETURN_IF_ERROR(run(b, std::span<const int32_t>(tail.data(), 1), plain));
        sample_rows(b);
        off = std::min(off, now_s() - t0);
        DSI_RETURN_IF_ERROR(rollback(b, 1));
      }
      for (int32_t len = 1; len <= max_k + 1; ++len) {  // verification of len - 1 drafts
        const backend::ForwardOptions o = verify_opts(len);
        const double t0 = now_s();
        DSI_RETURN_IF_ERROR(run(b, std::span<const int32_t>(tail.data(), len), o));
        sample_rows(b);
        double& v = verify[static_cast<size_t>(len - 1)];
        v = std::min(v, now_s() - t0);
        DSI_RETURN_IF_ERROR(rollback(b, len));
      }
      for (int32_t s = 1; s <= max_k; ++s) {
        set_reqs(b, s);
        const double t0 = now_s();
        DSI_RETURN_IF_ERROR(drafter.draft(reqs));
        double& v = draft[static_cast<size_t>(s - 1)];
        v = std::min(v, now_s() - t0);
        for (const auto& q : reqs) DSI_RETURN_IF_ERROR(q.status);
        DSI_RETURN_IF_ERROR(rollback(b, 0));  // the MTP block back to one position behind
      }
      if (now_s() - t_start > budget_s / 4)
        break;  // a slow backend (the reference kernels): one round is all it gets
    }
    // More tokens or steps never cost less (what is left of noise after the minimum).
    for (size_t i = 1; i < verify.size(); ++i) verify[i] = std::max(verify[i], verify[i - 1]);
    for (size_t i = 1; i < draft.size(); ++i) draft[i] = std::max(draft[i], draft[i - 1]);
    t.off_s.push_back(off);
    t.verify_s.push_back(verify);
    t.draft_s.push_back(draft);
    // Past the budget (the next size takes about twice this one) the larger batch sizes are
    // extrapolated (StepTimes: proportional).
    const double now = now_s();
    if (now - t_start + 2 * (now - t_size) > budget_s)
      break;
  }
  return t;
}

}  // namespace dsinfer::spec
