// Step-time interpolation, the greedy verify-length choice and the acceptance predictor.
#include "spec/verify_length.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "base/check.h"
#include "base/strings.h"

namespace dsinfer::spec {

namespace {
// Linear interpolation of v (indexed 1..v.size()) at x >= 1; clamped at the ends.
double along(const std::vector<double>& v, double x) {
  if (v.empty())
    return 0;
  if (x <= 1)
    return v.front();
  const double last = static_cast<double>(v.size());
  if (x >= last)
    return v.back();
  const size_t i = static_cast<size_t>(std::floor(x)) - 1;
  const double f = x - std::floor(x);
  return v[i] + f * (v[i + 1] - v[i]);
}

// Interpolates per-batch-size values f(bi) at batch size b.
template <typename F>
double over_batch(const std::vector<int64_t>& batch, int64_t b, F&& f) {
  DSI_CHECK(!batch.empty(), "empty step-time model");
  if (b <= batch.front())
    return f(0);
  for (size_t i = 1; i < batch.size(); ++i) {
    if (b <= batch[i]) {
      const double t =
          static_cast<double>(b - batch[i - 1]) / static_cast<double>(batch[i] - batch[i - 1]);
      return f(i - 1) + t * (f(i) - f(i - 1));
    }
  }
  // Past the largest measured size: proportional to the batch.
  return f(batch.size() - 1) * static_cast<double>(b) / static_cast<double>(batch.back());
}
}  // namespace

bool StepTimes::valid() const {
  if (batch.empty() || batch.front() != 1 || off_s.size() != batch.size() ||
      verify_s.size() != batch.size() || draft_s.size() != batch.size())
    return false;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (i > 0 && batch[i] <= batch[i - 1])
      return false;
    if (verify_s[i].size() != verify_s[0].size() || verify_s[i].empty() ||
        draft_s[i].size() + 1 != verify_s[i].size())
      return false;
  }
  return true;
}

double StepTimes::off(int64_t b) const {
  return over_batch(batch, b, [&](size_t i) { return off_s[i]; });
}

double StepTimes::verify(int64_t b, double mean_len) const {
  return over_batch(batch, b, [&](size_t i) { return along(verify_s[i], mean_len); });
}

double StepTimes::draft(int64_t b, double mean_steps) const {
  if (mean_steps <= 0)
    return 0;
  return over_batch(batch, b, [&](size_t i) {
    // Below one step (some sequences draft, others not): a share of the one-step time.
    return mean_steps < 1 ? draft_s[i].front() * mean_steps : along(draft_s[i], mean_steps);
  });
}

std::string describe(const StepTimes& t) {
  std::string s;
  for (size_t i = 0; i < t.batch.size(); ++i) {
    s += str_format(
        "b=%lld: off %.2f | verify", static_cast<long long>(t.batch[i]), 1e3 * t.off_s[i]);
    for (double v : t.verify_s[i]) s += str_format(" %.2f", 1e3 * v);
    s += " | draft";
    for (double v : t.draft_s[i]) s += str_format(" %.2f", 1e3 * v);
    s += "\n";
  }
  return s;
}

Choice choose_verify_lengths(const StepTimes& times,
                             std::span<const std::vector<double>> accept,
                             bool draft_cost) {
  const size_t n = accept.size();
  Choice c;
  c.k.assign(n, 0);
  if (n == 0)
    return c;
  const int64_t b = static_cast<int64_t>(n);
  const int32_t kmax = times.max_k();
  // Per sequence: the probability that its next draft (k_r + 1) is reached and accepted.
  std::vector<double> reach(n, 1.0);
  double tokens = static_cast<double>(n);
  int64_t total_k = 0;
  auto step_time = [&](int64_t tk) {
    const double mean_k = static_cast<double>(tk) / static_cast<double>(b);
    return times.verify(b, 1.0 + mean_k) + (draft_cost ? times.draft(b, mean_k) : 0.0);
  };
  // Candidates in order of expected gain (the largest first; within a sequence the gains only
  // fall, so every prefix of this order gives each sequence a prefix of its drafts), then the
  // number of them with the best rate over all counts: a global maximum, not a greedy stop, so
  // that a step-time curve with a step in it (a bucket boundary, a cache effect) does not stop
  // the choice short of a better plateau.
  std::vector<size_t> order;
  std::vector<double> gains;
  while (true) {
    size_t pick = n;
    double gain = 0;
    for (size_t r = 0; r < n; ++r) {
      const size_t next = static_cast<size_t>(c.k[r]);
      if (c.k[r] >= kmax || next >= accept[r].size())
        continue;
      const double g = reach[r] * std::clamp(accept[r][next], 0.0, 1.0);
      if (g > gain) {
        gain = g;
        pick = r;
      }
    }
    if (pick == n)
      break;
    reach[pick] = gain;
    ++c.k[pick];
    order.push_back(pick);
    gains.push_back(gain);
  }
  double best = tokens / step_time(0);
  size_t best_t = 0;
  double sum = tokens;
  for (size_t t = 0; t < order.size(); ++t) {
    sum += gains[t];
    const double rate = sum / step_time(static_cast<int64_t>(t + 1));
    // Ties go to more drafts (a flat step-time curve).
    if (rate >= best) {
      best = rate;
      best_t = t + 1;
    }
  }
  c.k.assign(n, 0);
  for (size_t t = 0; t < best_t; ++t) {
    ++c.k[order[t]];
    tokens += gains[t];
  }
  total_k = static_cast<int64_t>(best_t);
  c.expected_tokens = tokens;
  c.step_s = step_time(total_k);
  return c;
}

StepCost::StepCost(StepTimes prior, int32_t max_k, bool padded_buckets)
    : prior_(std::move(prior)),
      max_k_(std::max(0, std::min(max_k, prior_.max_k()))),
      padded_(padded_buckets),
      delta_(kBuckets, std::vector<double>(static_cast<size_t>(max_k_ + 2), 0.0)),
      seen_(kBuckets, std::vector<int64_t>(static_cast<size_t>(max_k_ + 2), 0)),
      level_(kBuckets, 1.0),
      last_(kBuckets, -2),
      cold_skips_(kBuckets, 0),
      emitted_(static_cast<size_t>(max_k_ + 1), 0.0),
      expected_(static_cast<size_t>(max_k_ + 1), 0.0),
      b_emitted_(kBuckets, std::vector<double>(static_cast<size_t>(max_k_ + 1), 0.0)),
      b_expected_(kBuckets, std::vector<double>(static_cast<size_t>(max_k_ + 1), 0.0)),
      mixed_(kBuckets, 0.0),
      mixed_seen_(kBuckets, 0),
      steps_(kBuckets, 0),
      ran_at_(kBuckets, std::vector<int64_t>(static_cast<size_t>(max_k_ + 2), 0)) {
  DSI_CHECK(prior_.valid(), "StepCost: invalid step-time model");
}

int StepCost::bucket(int64_t b) const {
  int i = 0;
  if (padded_) {
    while (i + 1 < kBuckets && (int64_t{1} << i) < b) ++i;
    return i;  // b in (2^(i-1), 2^i], the last bucket open-ended
  }
  while (i + 1 < kBuckets && (int64_t{2} << i) <= b) ++i;
  return i;  // b in [2^i, 2^(i+1)), the last bucket open-ended
}

int64_t StepCost::model_batch(int64_t b) const {
  // A padding backend runs b sequences as the bucket's power of two (where the start-up model
  // measured that batch; beyond, it runs them eagerly as they are).
  if (!padded_ || b < 1)
    return b;
  const int64_t pad = int64_t{1} << bucket(b);
  return pad >= b && pad <= prior_.batch.back() ? pad : b;
}

double StepCost::prior_s(int64_t b, int32_t depth) const {
  // A verification runs the drafter's forward work on top of a plain decode's: never cheaper
  // than off, whatever the noise of the start-up measurement says.
  b = model_batch(b);
  const double off = prior_.off(b);
  if (depth < 0)
    return off;
  return std::max(off, prior_.verify(b, 1.0 + depth) + prior_.draft(b, static_cast<double>(depth)));
}

double StepCost::level(int64_t b) const {
  return b < 1 ? 1.0 : level_[static_cast<size_t>(bucket(b))];
}

double StepCost::correction(int bk, int32_t depth) const {
  const auto& seen = seen_[static_cast<size_t>(bk)];
  const auto& delta = delta_[static_cast<size_t>(bk)];
  const int d = depth + 1;
  const int n = static_cast<int>(seen.size());
  if (seen[static_cast<size_t>(d)] > 0)
    return delta[static_cast<size_t>(d)];
  // Off not measured in this bucket: depth 0's correction (measured, or inferred from the
  // speculating depths). A depth-0 step is the plain decode plus the drafter's forward work,
  // and the start-up model times that difference; what the engine adds to a step (host work,
  // sampling the one position) is the same for both. Not the speculating depths' corrections
  // held down to off: those carry the cost of sampling and checking every verified position,
  // which made off look as slow as the shallowest measured depth, so that auto, having gone
  // deep on a start-up model that made speculation look cheap, never tried off again.
  if (depth < 0)
    return correction(bk, 0);
  // Between the nearest measured depths below and above: linear in the depth (the overhead of
  // sampling and checking grows with the tokens verified); below the shallowest: that one's;
  // past the deepest: continued along the line through the two deepest measured while it rises
  // (held otherwise). Held flat, a per-verified-position overhead the start-up model misses
  // made every unmeasured deeper depth look cheaper than it is (the bundled model at batch 64:
  // 0.5, 1.0 and 1.4 ms over the model at depths 1, 2, 3), and auto went deeper than the best.
  int lo = d - 1, hi = d + 1;
  while (lo >= 0 && seen[static_cast<size_t>(lo)] == 0) --lo;
  while (hi < n && seen[static_cast<size_t>(hi)] == 0) ++hi;
  if (lo < 0 && hi >= n)
    return 0.0;
  if (lo < 0)
    return delta[static_cast<size_t>(hi)];
  if (hi >= n) {
    int lo2 = lo - 1;
    while (lo2 >= 0 && seen[static_cast<size_t>(lo2)] == 0) --lo2;
    const double at = delta[static_cast<size_t>(lo)];
    if (lo2 < 0)
      return at;
    const double slope = (at - delta[static_cast<size_t>(lo2)]) / static_cast<double>(lo - lo2);
    return slope > 0 ? at + slope * static_cast<double>(d - lo) : at;
  }
  const double f = static_cast<double>(d - lo) / static_cast<double>(hi - lo);
  return delta[static_cast<size_t>(lo)] +
         f * (delta[static_cast<size_t>(hi)] - delta[static_cast<size_t>(lo)]);
}

int64_t StepCost::measured(int64_t b, int32_t depth) const {
  if (b < 1 || depth < -1 || depth > max_k_)
    return 0;
  return seen_[static_cast<size_t>(bucket(b))][static_cast<size_t>(depth + 1)];
}

void StepCost::record(int64_t b, int32_t depth, double seconds) {
  if (b < 1 || depth < -1 || depth > max_k_ || !(seconds > 0))
    return;
  const size_t bk = static_cast<size_t>(bucket(b));
  const size_t d = static_cast<size_t>(depth + 1);
  const double p = prior_s(b, depth);
  double& level = level_[bk];
  // A depth whose correction has settled: what it mispredicts now is a change common to the
  // bucket (the level's EWMA, in the log, 1/8 per step; one step moves it by at most 9%).
  if (seen_[bk][d] >= kSettled) {
    const double predicted = std::max(p + delta_[bk][d], 0.1 * p) * level;
    level *= std::pow(std::clamp(seconds / predicted, 0.5, 2.0), 1.0 / 8.0);
  }
  const double x = seconds / level - p;
  // The mean of the first eight measurements, then an EWMA of weight 1/64 (the level follows a
  // change of load within a few dozen steps). (The first measurement used to replace the
  // prior's 0 and the EWMA start from it: one slow step after a depth's captures, 3.21 ms
  // against the ~2.97 its steps take, kept it 0.2 ms too dear after three steps.)
  const int64_t n = ++seen_[bk][d];
  delta_[bk][d] += (x - delta_[bk][d]) / static_cast<double>(n <= kSettled ? n : 64);
  ran_at_[bk][d] = ++steps_[bk];
}

double StepCost::step_s(int64_t b, int32_t depth) const {
  // Never below a tenth of the prior (a burst of noise in the corrections cannot make a step
  // free).
  const double p = prior_s(b, depth);
  return std::max(p + correction(bucket(b), depth), 0.1 * p) * level(b);
}

namespace {
// E(depth): the tokens a request's verification of `depth` drafts is expected to emit.
double expected_tokens(int32_t depth, std::span<const double> accept) {
  double tokens = 1.0, reach = 1.0;
  for (int32_t i = 0; i < depth && i < static_cast<int32_t>(accept.size()); ++i) {
    reach *= std::clamp(accept[static_cast<size_t>(i)], 0.0, 1.0);
    tokens += reach;
  }
  return tokens;
}
}  // namespace

double StepCost::rate(int64_t b,
                      int32_t depth,
                      std::span<const double> accept,
                      double extra_s) const {
  const double t = step_s(b, depth) + extra_s;
  return t > 0 ? static_cast<double>(b) * expected_tokens(depth, accept) * gain(b, depth) / t : 0.0;
}

int32_t StepCost::best_depth_with(int64_t b, std::span<const double> accept, double extra_s) const {
  const int32_t top = std::min(max_k_, static_cast<int32_t>(accept.size()));
  int32_t best = -1;
  double best_rate = rate(b, -1, accept, extra_s);
  // Depth 0 (the drafter's forward work, no drafts) emits what off does at a higher cost: not a
  // choice. (It was: a start-up model in which noise made it look cheaper than off kept requests
  // on the drafter's work without ever drafting.)
  for (int32_t d = 1; d <= top; ++d) {
    const double r = rate(b, d, accept, extra_s);
    if (r > best_rate) {
      best_rate = r;
      best = d;
    }
  }
  return best;
}

void StepCost::record_tokens(
    int64_t b, int32_t depth, double expected, double emitted, int64_t requests) {
  if (b < 1 || depth < 1 || depth > max_k_ || requests < 1 || !(expected > 0) || !(emitted >= 0))
    return;
  const size_t d = static_cast<size_t>(depth);
  const size_t bk = static_cast<size_t>(bucket(b));
  const double n = static_cast<double>(requests);
  // Sums that forget (kGainSteps steps of the depth): a depth's gain follows the traffic.
  constexpr double keep = 1.0 - 1.0 / kGainSteps;
  expected_[d] = expected_[d] * keep + expected * n;
  emitted_[d] = emitted_[d] * keep + emitted * n;
  b_expected_[bk][d] = b_expected_[bk][d] * keep + expected * n;
  b_emitted_[bk][d] = b_emitted_[bk][d] * keep + emitted * n;
}

double StepCost::gain(int64_t b, int32_t depth) const {
  if (b < 1 || depth < 1 || depth > max_k_)
    return 1.0;
  const size_t d = static_cast<size_t>(depth);
  const size_t bk = static_cast<size_t>(bucket(b));
  const double all = (emitted_[d] + kGainPrior) / (expected_[d] + kGainPrior);
  return (b_emitted_[bk][d] + kGainPrior * all) / (b_expected_[bk][d] + kGainPrior);
}

int32_t StepCost::best_depth(int64_t b, std::span<const double> accept) const {
  return best_depth_with(b, accept, 0.0);
}

int32_t StepCost::choose(int64_t b, std::span<const double> accept) const {
  const int32_t best = best_depth(b, accept);
  if (best < 1)
    return best;
  // Off not measured in this bucket (running requests that speculate never run a plain decode)
  // and not beaten by the best even if a plain step costs no more than the start-up model says:
  // first depth 0, kExplore times, which measures what off's prediction rests on (the engine's
  // cost of a one-token step) without stopping speculation.
  if (measured(b, -1) == 0 && measured(b, 0) < kExplore) {
    const double off_s = (prior_s(b, -1) + std::min(0.0, correction(bucket(b), -1))) * level(b);
    if (off_s > 0 && rate(b, best, accept) <= static_cast<double>(b) / off_s)
      return 0;
  }
  const int32_t top = std::min(max_k_, static_cast<int32_t>(accept.size()));
  for (int32_t d : {best + 1, best - 1}) {
    if (d >= 1 && d <= top && measured(b, d) < kExplore)
      return d;
  }
  // A depth measured fewer than kExplore times (or never) whose predicted rate is within kNoise
  // of the best's: its estimate may rest on one slow step, or on the prior and a correction
  // carried over from other depths, and it is measured until it rests on kExplore (the highest
  // rate first). Without this, a depth explored while it was next to an earlier best kept the
  // estimate of its single measured step once the best moved away; and a depth two below a best
  // at the deepest (the bundled model at batch 64 on the H200: depth 3, 6% faster than the depth
  // 5 auto ran) was never run in the bucket.
  // A depth never run in the bucket counts at the better of its two estimates: with the
  // corrections carried over from the measured depths, and with the start-up model's time alone.
  // The carried correction can be far off where the step time jumps between two token counts:
  // the bundled model at batch 16 on the H200 (twenty-seventh session), depth 2's steps 0.23 ms
  // over the model, held below it, made depth 1 look 15% slower than depth 3; it ran 0.11 ms
  // under the model and was the best depth (fixed:1 1.46x off, auto 1.30x at depth 3).
  const double best_rate = rate(b, best, accept);
  int32_t pick = best;
  double pick_rate = 0.0;
  for (int32_t d = 1; d <= top; ++d) {
    const int64_t m = measured(b, d);
    double r = rate(b, d, accept);
    if (m == 0) {
      const double prior = prior_s(b, d) * level(b);
      if (prior > 0)
        r = std::max(r, r * step_s(b, d) / prior);
    }
    if (d != best && m < kExplore && r >= (1.0 - kNoise) * best_rate && r > pick_rate) {
      pick = d;
      pick_rate = r;
    }
  }
  // The deeper neighbour, once every kProbeEvery of the bucket's steps: the acceptance of the
  // draft positions past the best depth is learnt only from steps that verify them, so without
  // this the estimates behind a deeper depth stayed those of the first steps.
  const size_t bk = static_cast<size_t>(bucket(b));
  if (pick == best && best + 1 <= top &&
      steps_[bk] - ran_at_[bk][static_cast<size_t>(best + 2)] >= kProbeEvery)
    pick = best + 1;
  return pick;
}

void StepCost::record_mixed(int64_t b, int32_t depth, double seconds) {
  if (b < 1 || depth < 1 || depth > max_k_ || !(seconds > 0))
    return;
  const size_t bk = static_cast<size_t>(bucket(b));
  const double x = seconds - step_s(b, depth);
  const int64_t n = ++mixed_seen_[bk];
  mixed_[bk] += (x - mixed_[bk]) / static_cast<double>(n <= kSettled ? n : 16);
}

double StepCost::mixed_extra(int64_t b) const {
  if (b < 1)
    return 0.0;
  const size_t bk = static_cast<size_t>(bucket(b));
  return mixed_seen_[bk] > 0 ? std::max(0.0, mixed_[bk]) : 0.0;
}

int32_t StepCost::choose_mixed(int64_t b, std::span<const double> accept, int32_t pure) const {
  if (pure < 1 || b < 1 || mixed_seen_[static_cast<size_t>(bucket(b))] == 0)
    return pure;
  // The requests speculate: the depth that pays best in a mixed step (at least 1).
  return std::max(best_depth_with(b, accept, mixed_extra(b)), 1);
}

int32_t StepCost::choose_steady(int64_t b, std::span<const double> accept) {
  if (b < 1)
    return choose(b, accept);
  int32_t d = choose(b, accept);
  int32_t& last = last_[static_cast<size_t>(bucket(b))];
  const int32_t top = std::min(max_k_, static_cast<int32_t>(accept.size()));
  if (d >= 1 && d == best_depth(b, accept) && last >= 1 && last <= top && last != d &&
      rate(b, last, accept) >= (1.0 - kStay) * rate(b, d, accept))
    d = last;
  last = d;
  return d;
}

int32_t StepCost::choose_warm(int64_t b,
                              std::span<const double> accept,
                              std::span<const uint8_t> warm) {
  const int32_t d = choose_steady(b, accept);
  auto is_warm = [&](int32_t depth) {
    return static_cast<size_t>(depth) >= warm.size() || warm[static_cast<size_t>(depth)] != 0;
  };
  // An exploring pick (not the best) runs as chosen: only steps run at a depth measure it, and a
  // depth never run would stay cold.
  if (b < 1 || d < 1 || d != best_depth(b, accept))
    return d;
  int32_t& skips = cold_skips_[static_cast<size_t>(bucket(b))];
  if (is_warm(d)) {
    skips = 0;
    return d;
  }
  const int32_t top = std::min(max_k_, static_cast<int32_t>(accept.size()));
  const double cold_rate = rate(b, d, accept);
  int32_t pick = d;
  double pick_rate = 0.0;
  for (int32_t w = 1; w <= top; ++w) {
    const double r = rate(b, w, accept);
    if (w != d && is_warm(w) && r >= (1.0 - kCold) * cold_rate && r > pick_rate) {
      pick = w;
      pick_rate = r;
    }
  }
  // The bucket keeps running while the best stays cold: past kColdPatience such steps the capture
  // pays for itself, and the best is run (and so prepared).
  if (pick != d && ++skips > kColdPatience) {
    skips = 0;
    pick = d;
  }
  last_[static_cast<size_t>(bucket(b))] = pick;
  return pick;
}

AcceptancePredictor::AcceptancePredictor(int32_t max_k)
    : pos_accepted_(static_cast<size_t>(std::max(max_k, 1)), 0.0),
      pos_verified_(static_cast<size_t>(std::max(max_k, 1)), 0.0) {}

double AcceptancePredictor::position_rate(int32_t i) const {
  // Prior of 4 pseudo-drafts: optimistic at the first position (0.8) so that auto tries drafting
  // before it has seen any; at a deeper one the rate of the position before it (whose drafts are
  // verified more often), so that a change of traffic seen at the shallow positions carries to
  // the deep ones whose own counts have faded. The observations take over within a few steps.
  const size_t p = std::min(static_cast<size_t>(std::max(i, 0)), pos_verified_.size() - 1);
  const double prior = p == 0 ? 0.8 : position_rate(static_cast<int32_t>(p) - 1);
  return (pos_accepted_[p] + 4.0 * prior) / (pos_verified_[p] + 4.0);
}

double AcceptancePredictor::calibrated(int32_t i, float c) const {
  const double conf = std::clamp(static_cast<double>(c), 0.0, 1.0);
  const int b = std::min(kBins - 1, static_cast<int>(conf * kBins));
  return (bin_accepted_[b] + 4.0 * position_rate(i)) / (bin_verified_[b] + 4.0);
}

void AcceptancePredictor::fade_positions(double keep) {
  for (size_t j = 0; j < pos_verified_.size(); ++j) {
    pos_verified_[j] *= keep;
    pos_accepted_[j] *= keep;
  }
}

void AcceptancePredictor::unobserved_step() {
  constexpr double kKeep = 1.0 - 1.0 / kUnobservedSteps;
  fade_positions(kKeep);
  for (int b = 0; b < kBins; ++b) {
    bin_verified_[b] *= kKeep;
    bin_accepted_[b] *= kKeep;
  }
}

void AcceptancePredictor::verified_step(int64_t first_drafts) {
  const double extra = kMinDraftsPerStep - static_cast<double>(first_drafts);
  if (extra > 0)
    fade_positions(std::pow(1.0 - 1.0 / kWindow, extra));
}

void AcceptancePredictor::record(int32_t i, float confidence, bool accepted) {
  constexpr double kKeep = 1.0 - 1.0 / kWindow;
  const size_t p = std::min(static_cast<size_t>(std::max(i, 0)), pos_verified_.size() - 1);
  // Every position's counts fade with the first drafts' (one per verifying request-step), so
  // that a deep position's old evidence gives way to its prior when its drafts are seldom
  // verified.
  if (p == 0)
    fade_positions(kKeep);
  pos_verified_[p] += 1;
  pos_accepted_[p] += accepted ? 1 : 0;
  const double conf = std::clamp(static_cast<double>(confidence), 0.0, 1.0);
  const int b = std::min(kBins - 1, static_cast<int>(conf * kBins));
  bin_verified_[b] = bin_verified_[b] * kKeep + 1;
  bin_accepted_[b] = bin_accepted_[b] * kKeep + (accepted ? 1 : 0);
}

}  // namespace dsinfer::spec
