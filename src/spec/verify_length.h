// Verify-length scheduling: how many drafts each sequence verifies in a step.
//
// StepTimes is the step-time model, measured at start-up on the engine's own backend: the time
// of a target forward over b sequences of L tokens each (with the drafter's forward options), of
// a plain decode forward (b sequences, 1 token, no drafter), and of drafting s steps for b
// sequences. choose_verify_lengths() then picks per sequence the number of drafts k_r that
// maximises the batch's expected emitted tokens per second,
//     sum_r E_r(k_r) / (verify(b, mean(k_r + 1)) + draft(b, mean(k_r))),
// E_r(k) = 1 + sum_{i<=k} prod_{j<=i} a_rj with a_rj the predicted probability that draft j is
// accepted once drafts 1..j-1 were. AcceptancePredictor supplies the a_rj: before drafting from
// the observed acceptance rate of each draft position, after drafting from the draft's
// confidence, calibrated online against what the target accepted.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dsinfer::spec {

struct StepTimes {
  std::vector<int64_t> batch;                 // measured batch sizes, ascending, batch[0] = 1
  std::vector<double> off_s;                  // [b]: b x 1 tokens, no drafter
  std::vector<std::vector<double>> verify_s;  // [b][L-1]: b x L tokens, L = 1..max_k+1
  std::vector<std::vector<double>> draft_s;   // [b][s-1]: drafting s steps, s = 1..max_k
  int32_t max_k() const {
    return verify_s.empty() ? 0 : static_cast<int32_t>(verify_s[0].size()) - 1;
  }
  bool valid() const;
  // Interpolated (linear in b between measured sizes, proportional beyond the largest; linear in
  // the mean length / steps).
  double off(int64_t b) const;
  double verify(int64_t b, double mean_len) const;
  double draft(int64_t b, double mean_steps) const;
};

// One line per measured batch size, in ms: "b=1: off 4.1 | verify 4.3 4.6 ... | draft 0.9 1.8 ...".
std::string describe(const StepTimes& t);

struct Choice {
  std::vector<int32_t> k;      // per sequence
  double expected_tokens = 0;  // sum_r E_r(k_r)
  double step_s = 0;           // predicted step time
  double rate() const { return step_s > 0 ? expected_tokens / step_s : 0; }
};

// accept[r] holds a_r1.. a_rK for sequence r (its length caps k_r). With draft_cost, the
// drafting time counts (the drafts are yet to be made); without, they exist already. The drafts
// of all sequences are ranked by expected gain (prod_{j<=i} a_rj, as DeepSeek's scheduler ranks
// cumulative confidences), and the number T of the top ones taken is the global maximum of the
// rate over all T (not a greedy stop, which a step in the step-time curve would cut short).
Choice choose_verify_lengths(const StepTimes& times,
                             std::span<const std::vector<double>> accept,
                             bool draft_cost);

// Auto's cost-aware depth choice: the whole step's wall time as the engine measures it, by batch
// size bucket (powers of two) and depth (the drafts each request verifies; -1: speculation off, a
// plain decode without the drafter's forward work), predicted as
//     (start-up model's time for that step + correction(bucket, depth)) * level(bucket).
// The start-up model (StepTimes: verify + draft, or off) is taken at the batch the backend runs
// (with padded buckets the bucket's power of two while the start-up model measured it: the graph
// a step of 190 sequences replays is the 256 one). The correction is the mean of measured / level
// - model over a depth's first eight steps, then an EWMA of weight 1/64; the level (1 at first) is
// the bucket's common factor: each step of a depth past its first eight moves it by 1/8 of the
// log of measured / predicted. A change that slows every depth alike (a wave of other prompts, the
// device's clocks) goes to the level and leaves the depths' ratios, which the choice rests on,
// as they were: learnt per depth alone, it raised only the depth being run, so that auto left
// the best depth for one measured before the change (the bundled model at batch 256: depth-2
// steps 3.95 then 4.4 ms in a slower wave; auto moved to depth 3 at 5.6 ms; 0.88x fixed:2,
// twentieth session). The correction carries what the start-up model does not see (per-step host
// work, sampling every verified position, graphs against eager launches); a depth not yet measured
// in a bucket takes the corrections of the measured depths of that bucket, interpolated linearly in
// the depth (off counting as depth -1), continued along the line through the two deepest measured
// beyond the deepest while it rises (else held), held below the shallowest, 0 when the bucket has
// none. Off, unmeasured, takes depth 0's correction (a depth-0 step is a plain decode plus the
// drafter's forward work, which the start-up model times), never one held down from the speculating
// depths: theirs carry the cost of every verified position, and made off look too slow ever to be
// tried.
class StepCost {
 public:
  // padded_buckets: batch buckets (2^(i-1), 2^i] instead of [2^i, 2^(i+1)), for a backend that
  // pads a fixed-shape step's sequences up to a power of two and captures one graph per padded
  // batch and depth (CUDA): then a bucket's steps are one shape, cost the same, and share
  // choose_steady's previous depth (with [2^i, 2^(i+1)) batch 64 and batches 33-63, one graph,
  // kept two depths, and a decode wave's tail met uncaptured shapes; eleventh session).
  StepCost(StepTimes prior, int32_t max_k, bool padded_buckets = false);
  int32_t max_k() const { return max_k_; }
  // A step of b decoding requests, each verifying `depth` drafts (-1: no drafter at all), took
  // `seconds` of wall time.
  void record(int64_t b, int32_t depth, double seconds);
  // Predicted wall time of such a step.
  double step_s(int64_t b, int32_t depth) const;
  // b * E(depth) * gain(b, depth) / (step_s(b, depth) + extra_s): the expected emitted tokens per
  // second, where accept[i] is the probability that draft i is accepted given those before were
  // (E(-1) = E(0) = 1), and extra_s time the step spends beside its decode requests (a mixed
  // step's prefill share, choose_mixed).
  double rate(int64_t b, int32_t depth, std::span<const double> accept, double extra_s = 0) const;
  // Tokens a step at `depth` emitted per speculating request, against the E(depth) its choice
  // counted on (from the acceptance rates then), over `requests` requests. The acceptance at a
  // draft position is not the same at every depth (where a verification starts depends on how
  // far the last one got: the bundled model's second drafts are accepted 0.82 of the time
  // verifying 2, 0.79 verifying 4), so rates pooled over the depths auto ran mispredict the
  // others (depth 2 by -6% at batch 64 in the twenty-fourth session, which kept auto from the
  // best depth at batch 256). Per bucket, shrunk towards the depth's gain over every bucket:
  // gain(b, depth) = (emitted + kGainPrior * g) / (expected + kGainPrior) with the bucket's sums
  // and g = (all emitted + kGainPrior) / (all expected + kGainPrior); 1 until the depth has run.
  // (One gain for all batches made batch 1 read the 6% that depth 2 gained at 64 and 256, where
  // its own depth-2 steps emitted 5% less than counted: depth 2 there, 6% slower than 3.)
  void record_tokens(int64_t b, int32_t depth, double expected, double emitted, int64_t requests);
  double gain(int64_t b, int32_t depth) const;
  static constexpr double kGainPrior = 64.0;  // tokens
  // Steps the sums of record_tokens remember (each recorded step's weight decays by 1/e over
  // this many of the depth's later steps), so that a depth's gain follows the traffic as the
  // acceptance rates do. (Counted in request-steps, 1,024 of them, the window was four steps at
  // batch 256: a wave's tail, whose requests stop at max_tokens mid-verification, set depth 2's
  // gain at 0.956, and auto ran depth 3, 4% slower: AutoSim.Batch256.)
  static constexpr double kGainSteps = 256.0;
  // The depth, -1 or 1..max_k() (capped by accept.size()), with the highest rate (depth 0 would
  // emit what -1 does at a higher cost). Ties go to the shallower depth.
  int32_t best_depth(int64_t b, std::span<const double> accept) const;
  // best_depth, except that when it is >= 1: while off has no measurement in b's bucket, depth 0
  // fewer than kExplore, and the best would not beat off were a plain step as fast as the
  // start-up model says, depth 0 (running requests that speculate never run a plain decode, so a
  // depth-0 step, which keeps them speculating, is what measures off's side; the engine drafts
  // nothing that step); then while a speculating depth next to the best (best +-
  // 1, >= 1) has fewer than kExplore measurements, that depth (the deeper first): the start-up
  // model's shape can be wrong where the measured steps would say otherwise, and only steps run
  // at a depth measure it; then a depth measured fewer than kExplore times (or not at all) whose
  // rate is within kNoise of the best's (the highest rate first; a depth not yet measured at the
  // better of its rate and its rate at the start-up model's time alone); otherwise, once every
  // kProbeEvery steps of the bucket since it last ran, the depth next deeper than the best.
  // Deterministic given what was recorded.
  int32_t choose(int64_t b, std::span<const double> accept) const;
  static constexpr double kNoise = 0.10;
  static constexpr int64_t kProbeEvery = 64;
  // choose, except that where it picks the best depth and the bucket's previous choice (a
  // speculating depth) is within kStay of the best's rate, the previous one, so that two depths
  // of nearly the same rate do not alternate with every change of the acceptance estimates.
  // Remembers the choice per bucket. (kStay was 5% while a switch of depth met shapes not yet
  // captured, 53 of 119 steps at batch 64 on the bundled model in the tenth session; choose_warm
  // now keeps auto off cold shapes, and a 5% hold kept it on a depth 4% slower than the best.)
  int32_t choose_steady(int64_t b, std::span<const double> accept);
  static constexpr double kStay = 0.02;
  // choose_steady, except that where it picks the best depth d >= 1 (not an exploring pick: only
  // steps run at a depth measure it) and d is cold (warm[d] == 0: the backend has not prepared
  // that step's shape, so the step would run it eagerly and capture it, 2-5 ms against ~2 ms
  // replayed on the bundled model's H200 runs) and a warm speculating depth has at least
  // (1 - kCold) of d's predicted rate, the warm depth with the highest rate. warm[i] covers depth
  // i for i < warm.size(); deeper depths count as warm. Measured in the thirteenth session:
  // kCold 15% without the exploring exemption locked batch 16 into the first warm depth (2, where
  // 1 is best: 1.05x against 1.18x); dropping choose_steady's hold made no difference.
  // A bucket whose best stays cold for more than kColdPatience consecutive choices runs it then
  // (its capture amortised over the steps that keep coming): without that, a steady batch whose
  // best depth was never run kept the warm substitute for good (the bundled model at batch 256,
  // twenty-fourth session: depth 1 in 198 of 222 steps, 163.8k tok/s, where depth 2, predicted
  // 7% faster and never run, gave 180.7k in fixed:2).
  int32_t choose_warm(int64_t b, std::span<const double> accept, std::span<const uint8_t> warm);
  static constexpr double kCold = 0.08;
  static constexpr int32_t kColdPatience = 16;
  // Mixed steps: decode requests verifying beside prefill chunks (CUDA runs such a step eagerly,
  // without its graphs). Their time beyond a decode step's of the same batch and depth (the
  // prefill's share, the eager launches) is learnt per bucket: the mean of the first kSettled
  // mixed steps, then an EWMA of weight 1/16. In such a step the decode requests' drafts cost
  // only the verification's own rows on top of that time, so deeper ones pay sooner: the
  // depth of choose_mixed (1..max_k) maximises b E(d) gain / (step_s(b, d) + extra). Measured on
  // a simulated device kept at 16 requests with 32-160 tokens each (tests/unit/engine/
  // auto_sim_test.cc, AutoSim.ServingKeepsUpWithTheBestFixedDepth): a step in six was mixed, and
  // choosing their depth as the decode steps' made auto 0.88x the best fixed depth.
  void record_mixed(int64_t b, int32_t depth, double seconds);
  double mixed_extra(int64_t b) const;  // 0 until a mixed step was recorded in b's bucket
  // The depth for a mixed step: `pure` (the decode steps' choice) where that is below 1 or no
  // mixed step of the bucket was measured yet, else the best of 1..max_k (capped by
  // accept.size()) with mixed_extra(b) added to every depth's step time. Changes nothing.
  int32_t choose_mixed(int64_t b, std::span<const double> accept, int32_t pure) const;
  int64_t measured(int64_t b, int32_t depth) const;
  static constexpr int64_t kExplore = 3;
  // The bucket's level (see above; 1 until a depth has more than kSettled steps).
  double level(int64_t b) const;
  static constexpr int64_t kSettled = 8;

 private:
  static constexpr int kBuckets = 16;
  int bucket(int64_t b) const;
  int64_t model_batch(int64_t b) const;
  double prior_s(int64_t b, int32_t depth) const;
  // best_depth with extra_s added to every depth's step time (choose_mixed: mixed_extra(b)).
  int32_t best_depth_with(int64_t b, std::span<const double> accept, double extra_s) const;
  double correction(int bucket, int32_t depth) const;
  StepTimes prior_;
  int32_t max_k_;
  bool padded_ = false;
  // [bucket][depth + 1]: mean, then EWMA, of measured / level - prior (seconds); count of
  // measurements.
  std::vector<std::vector<double>> delta_;
  std::vector<std::vector<int64_t>> seen_;
  std::vector<double> level_;        // [bucket]
  std::vector<int32_t> last_;        // [bucket]: choose_steady's previous choice (-2: none)
  std::vector<int32_t> cold_skips_;  // [bucket]: consecutive warm substitutes for a cold best
  // record_tokens' sums: [depth] over every bucket, [bucket][depth].
  std::vector<double> emitted_, expected_;
  std::vector<std::vector<double>> b_emitted_, b_expected_;
  std::vector<double> mixed_;                 // [bucket]: mixed steps' extra time (seconds)
  std::vector<int64_t> mixed_seen_;           // [bucket]
  std::vector<int64_t> steps_;                // [bucket]: steps recorded
  std::vector<std::vector<int64_t>> ran_at_;  // [bucket][depth + 1]: steps_ at its latest
};

class AcceptancePredictor {
 public:
  explicit AcceptancePredictor(int32_t max_k);
  // Probability that the draft at position i (0-based) is accepted given those before were, from
  // the acceptance observed at that position (prior: 0.8 at the first, the previous position's
  // rate at the others).
  double position_rate(int32_t i) const;
  // Same for a draft at position i whose drafter confidence is c: the observed acceptance of
  // drafts with similar confidence, with position_rate(i) as the prior (so that confidences
  // never seen verified do not cut verification short before there is evidence).
  double calibrated(int32_t i, float c) const;
  void record(int32_t i, float confidence, bool accepted);
  // First drafts verified that every position's counts remember (weights decaying by 1/e over
  // this many; the confidence bins' over this many drafts in them): the rates follow a change of
  // traffic within about a window. With counts that
  // never forgot, a fall in acceptance after a long run at a high one kept auto drafting deep
  // (tests/unit/engine/auto_sim_test.cc, AutoSim.AcceptanceFallingAfterTheWarmUp).
  static constexpr double kWindow = 512.0;
  // A step in which requests decoded and none of them speculated (auto off): the counts fade by
  // 1/e over kUnobservedSteps such steps, adding nothing, so that the evidence that turned
  // speculation off does not outlive the traffic it came from. While off no draft is verified, so
  // without it a fall in acceptance kept auto off for good after the traffic changed back
  // (tests/unit/engine/auto_sim_test.cc, AutoSim.AcceptanceRisingAfterAnOffWarmUp: 1.00x off
  // at batch 16 and 64 where fixed depths gave 1.8x and 2.3x). The rates drift back to the prior
  // (0.8) until auto finds that speculation pays and tries it again; where it still does not, the
  // drafts of those steps turn it off again.
  void unobserved_step();
  static constexpr double kUnobservedSteps = 64.0;
  // A step that verified drafts of `first_drafts` requests: the position counts fade as if at
  // least kMinDraftsPerStep first drafts had been recorded, so that at small batches the window is
  // kWindow / kMinDraftsPerStep steps rather than kWindow drafts (512 steps at batch 1, where a
  // rise in acceptance took most of the simulated timed rounds to show: auto 0.94 of the best
  // fixed depth, 0.98 with this). The confidence bins keep fading by their own drafts.
  void verified_step(int64_t first_drafts);
  static constexpr double kMinDraftsPerStep = 4.0;
  // True when further steps cannot change position_rate much: none verified yet (the prior then
  // stays as it is until a draft is verified) or enough (64 first drafts) that it no longer leans
  // on the prior.
  bool settled() const { return pos_verified_[0] == 0 || pos_verified_[0] >= kSettledDrafts; }
  // True when position_rate rests on verified drafts rather than on its prior.
  bool evidenced() const { return pos_verified_[0] >= kSettledDrafts; }
  static constexpr double kSettledDrafts = 64.0;

 private:
  static constexpr int kBins = 10;
  void fade_positions(double keep);  // every position's counts times keep
  std::vector<double> pos_accepted_, pos_verified_;
  double bin_accepted_[kBins] = {};
  double bin_verified_[kBins] = {};
};

}  // namespace dsinfer::spec
