#include "server/metrics.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "engine/engine.h"

namespace dsinfer::server {

namespace {

std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

void header(std::string* out, const char* name, const char* type, const char* help) {
  *out += "# HELP ";
  *out += name;
  *out += ' ';
  *out += help;
  *out += "\n# TYPE ";
  *out += name;
  *out += ' ';
  *out += type;
  *out += '\n';
}

void sample(std::string* out, const std::string& name, int64_t v) {
  *out += name;
  *out += ' ';
  *out += std::to_string(v);
  *out += '\n';
}

// Samples of one metric labelled by `label`, a value per name.
template <size_t N>
void labelled_seconds(std::string* out,
                      const char* name,
                      const char* label,
                      const std::array<const char*, N>& names,
                      const std::array<double, N>& values) {
  for (size_t i = 0; i < N; ++i) {
    *out +=
        std::string(name) + "{" + label + "=\"" + names[i] + "\"} " + fmt_double(values[i]) + "\n";
  }
}

// One unlabelled integer metric: its HELP and TYPE lines and its sample.
void metric(std::string* out, const char* name, const char* type, const char* help, int64_t v) {
  header(out, name, type, help);
  sample(out, name, v);
}

// Label values are route names and reasons chosen by the server; escape anyway.
std::string label_value(std::string_view v) {
  std::string s;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      s += '\\';
      s += c;
    } else if (c == '\n') {
      s += "\\n";
    } else {
      s += c;
    }
  }
  return s;
}

std::vector<double> latency_buckets() {
  return {0.001,
          0.0025,
          0.005,
          0.01,
          0.025,
          0.05,
          0.075,
          0.1,
          0.25,
          0.5,
          0.75,
          1.0,
          2.5,
          5.0,
          7.5,
          10.0,
          20.0,
          40.0,
          80.0};
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, std::string* out) const {
  int64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    *out += name + "_bucket{le=\"" + (i < bounds_.size() ? fmt_double(bounds_[i]) : "+Inf") +
            "\"} " + std::to_string(cum) + "\n";
  }
  *out += name + "_sum " + fmt_double(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_(latency_buckets()),
      itl_({0.0005,
            0.001,
            0.0025,
            0.005,
            0.01,
            0.025,
            0.05,
            0.075,
            0.1,
            0.15,
            0.2,
            0.3,
            0.4,
            0.5,
            0.75,
            1.0,
            2.5,
            5.0}),
      duration_(latency_buckets()) {}

void Metrics::count_request(std::string_view endpoint, int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++requests_[{std::string(endpoint), status}];
}

void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_tokens_ += n;
}

void Metrics::on_token(double itl_s) {
  std::lock_guard<std::mutex> l(mu_);
  ++generation_tokens_;
  if (itl_s >= 0)
    itl_.observe(itl_s);
}

void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> l(mu_);
  ttft_.observe(s);
}

void Metrics::observe_request_duration(double s) {
  std::lock_guard<std::mutex> l(mu_);
  duration_.observe(s);
}

void Metrics::count_abort(std::string_view reason) {
  std::lock_guard<std::mutex> l(mu_);
  ++aborts_[std::string(reason)];
}

void Metrics::count_send_timeout() {
  std::lock_guard<std::mutex> l(mu_);
  ++send_timeouts_;
}

int64_t Metrics::send_timeouts() const {
  std::lock_guard<std::mutex> l(mu_);
  return send_timeouts_;
}

void Metrics::set_gauges(const EngineGauges& g) {
  std::lock_guard<std::mutex> l(mu_);
  gauges_ = g;
}

void Metrics::set_max_concurrency(int64_t running, int64_t queue) {
  std::lock_guard<std::mutex> l(mu_);
  max_running_ = running;
  max_queue_ = queue;
}

int64_t Metrics::requests(std::string_view endpoint, int status) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = requests_.find({std::string(endpoint), status});
  return it == requests_.end() ? 0 : it->second;
}

int64_t Metrics::aborts(std::string_view reason) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = aborts_.find(std::string(reason));
  return it == aborts_.end() ? 0 : it->second;
}

EngineGauges Metrics::gauges() const {
  std::lock_guard<std::mutex> l(mu_);
  return gauges_;
}

namespace {
// The step loop's time: the engine's phases always, the device's timing where measured.
void render_step_time(const EngineGauges& g, std::string* out) {
  header(out,
         "dsinfer_engine_step_phase_seconds_total",
         "counter",
         "Wall time of the engine's step phases (schedule, draft, prepare, forward: the backend's "
         "batched call whole, finish).");
  labelled_seconds(out,
                   "dsinfer_engine_step_phase_seconds_total",
                   "phase",
                   engine::EngineStats::StepPhases::kNames,
                   g.step_phase_s);
  if (!g.device_timing)
    return;
  header(out,
         "dsinfer_gpu_decode_busy_seconds_total",
         "counter",
         "GPU time of decode-shaped launches (decode steps, verifications, drafting calls).");
  *out += "dsinfer_gpu_decode_busy_seconds_total " + fmt_double(g.device_busy_s) + "\n";
  header(out,
         "dsinfer_gpu_decode_idle_seconds_total",
         "counter",
         "GPU idle time between consecutive decode-shaped launches: the host's share of a step.");
  *out += "dsinfer_gpu_decode_idle_seconds_total " + fmt_double(g.device_idle_s) + "\n";
  header(out,
         "dsinfer_backend_host_seconds_total",
         "counter",
         "The backend's host time in decode-shaped calls, by phase: before the GPU can start "
         "(checks, planning, upload), launch, wait (blocked on the GPU), after.");
  // (The partition only, not before's parts: the phases sum to the calls' host time.)
  using Timing = backend::Model::DeviceTiming;
  std::array<const char*, Timing::kHostPhases> names{};
  std::copy_n(Timing::kHostPhaseNames.begin(), names.size(), names.begin());
  labelled_seconds(out, "dsinfer_backend_host_seconds_total", "phase", names, g.backend_host_s);
}

void render_prefix_cache(const EngineGauges& g, std::string* out) {
  const kvstore::StoreStats& kv = g.kv;
  const char* tiers[2] = {"host", "ssd"};
  metric(out,
         "dsinfer_prefix_cache_lookups_total",
         "counter",
         "Prefix-cache lookups (requests).",
         g.cache_lookups);
  header(out,
         "dsinfer_prefix_cache_hits_total",
         "counter",
         "Requests started from a stored unit, by the tier it was served from.");
  // The device tier (state memory) sits above the store's host RAM and SSD tiers.
  const int64_t hits[3] = {g.device_hits, kv.hits[0], kv.hits[1]};
  const char* all_tiers[3] = {"device", "host", "ssd"};
  for (int t = 0; t < 3; ++t) {
    *out += std::string("dsinfer_prefix_cache_hits_total{tier=\"") + all_tiers[t] + "\"} " +
            std::to_string(hits[t]) + "\n";
  }
  header(out, "dsinfer_prefix_cache_hit_rate", "gauge", "Hits per lookup, by tier.");
  for (int t = 0; t < 3; ++t) {
    const double rate = g.cache_lookups > 0 ? static_cast<double>(hits[t]) / g.cache_lookups : 0.0;
    *out += std::string("dsinfer_prefix_cache_hit_rate{tier=\"") + all_tiers[t] + "\"} " +
            std::to_string(rate) + "\n";
  }
  header(out,
         "dsinfer_prefix_cache_prompt_tokens_total",
         "counter",
         "Prompt tokens restored from the cache (cached) and prefilled (computed).");
  *out += "dsinfer_prefix_cache_prompt_tokens_total{kind=\"cached\"} " +
          std::to_string(g.cached_prompt_tokens) + "\n";
  *out += "dsinfer_prefix_cache_prompt_tokens_total{kind=\"computed\"} " +
          std::to_string(g.computed_prompt_tokens) + "\n";
  metric(out,
         "dsinfer_prefix_cache_restore_failures_total",
         "counter",
         "Units found at submission but unusable at admission (gone, corrupt): computed instead.",
         g.cache_restore_failures);
  metric(out,
         "dsinfer_prefix_cache_units_stored_total",
         "counter",
         "Units stored.",
         g.cache_units_stored);
  metric(out,
         "dsinfer_prefix_cache_store_failures_total",
         "counter",
         "Captures that failed (a page copy or the image assembly): their units are not stored.",
         g.cache_store_failures);
  metric(out,
         "dsinfer_prefix_cache_async_captures_total",
         "counter",
         "Captures whose device-to-host page copy ran in the background (async_state_reads).",
         g.cache_async_captures);
  metric(out,
         "dsinfer_prefix_cache_captures_pending",
         "gauge",
         "Background captures still copying (their units are not in the store yet).",
         g.cache_captures_pending);
  metric(out,
         "dsinfer_prefix_cache_device_entries",
         "gauge",
         "Units kept in the device tier (state memory).",
         g.device_entries);
  metric(out,
         "dsinfer_prefix_cache_device_bytes",
         "gauge",
         "State memory held by the device tier's units.",
         g.device_bytes);
  metric(out,
         "dsinfer_prefix_cache_device_evictions_total",
         "counter",
         "Units evicted from the device tier (for its budget or for running requests; the "
         "host and SSD tiers keep them).",
         g.device_evictions);
  metric(out,
         "dsinfer_prefix_cache_device_puts_total",
         "counter",
         "Units put into the device tier.",
         g.device_puts);
  metric(out,
         "dsinfer_prefix_cache_device_rejected_total",
         "counter",
         "Device-tier puts that did not fit (larger than its budget, or no free pages).",
         g.device_rejected);
  metric(out, "dsinfer_kv_store_entries", "gauge", "Entries in the KV store.", kv.entries);
  header(out, "dsinfer_kv_store_bytes", "gauge", "KV store bytes by tier and retention class.");
  for (int t = 0; t < 2; ++t) {
    for (int c = 0; c < static_cast<int>(kvstore::RetentionClass::kCount); ++c) {
      *out += std::string("dsinfer_kv_store_bytes{tier=\"") + tiers[t] + "\",class=\"" +
              kvstore::retention_class_name(static_cast<kvstore::RetentionClass>(c)) + "\"} " +
              std::to_string(kv.class_bytes[t][c]) + "\n";
    }
  }
  header(out, "dsinfer_kv_store_evictions_total", "counter", "Entries evicted, by tier.");
  for (int t = 0; t < 2; ++t) {
    *out += std::string("dsinfer_kv_store_evictions_total{tier=\"") + tiers[t] + "\"} " +
            std::to_string(kv.evictions[t]) + "\n";
  }
  metric(out,
         "dsinfer_kv_store_expirations_total",
         "counter",
         "Entries removed by retention.",
         kv.expirations);
  metric(out,
         "dsinfer_kv_store_expired_bytes_total",
         "counter",
         "Bytes removed by retention.",
         kv.expired_bytes);
  metric(
      out, "dsinfer_kv_store_demotions_total", "counter", "Entries written to SSD.", kv.demotions);
  metric(out,
         "dsinfer_kv_store_promotions_total",
         "counter",
         "Entries read back from SSD.",
         kv.promotions);
  metric(out,
         "dsinfer_kv_store_write_errors_total",
         "counter",
         "Failed SSD writes (entry kept in RAM only).",
         kv.write_errors);
  metric(out,
         "dsinfer_kv_store_corrupt_total",
         "counter",
         "Entries found corrupt, truncated or missing (each a miss).",
         kv.corrupt);
}
}  // namespace

std::string Metrics::render() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out;
  out.reserve(8192);
  header(&out, "dsinfer_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (const auto& [key, n] : requests_) {
    out += "dsinfer_requests_total{endpoint=\"" + label_value(key.first) + "\",status=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  }
  header(&out,
         "dsinfer_requests_aborted_total",
         "counter",
         "Generation requests ended early, by reason (disconnect, timeout, shutdown, error).");
  for (const char* reason : {"disconnect", "timeout", "shutdown", "error"}) {
    auto it = aborts_.find(reason);
    out += std::string("dsinfer_requests_aborted_total{reason=\"") + reason + "\"} " +
           std::to_string(it == aborts_.end() ? 0 : it->second) + "\n";
  }
  header(&out,
         "dsinfer_send_timeouts_total",
         "counter",
         "Connections closed because the client did not read a response within --send-timeout.");
  sample(&out, "dsinfer_send_timeouts_total", send_timeouts_);
  header(&out, "dsinfer_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.");
  sample(&out, "dsinfer_prompt_tokens_total", prompt_tokens_);
  header(&out, "dsinfer_generation_tokens_total", "counter", "Generated tokens.");
  sample(&out, "dsinfer_generation_tokens_total", generation_tokens_);
  header(&out,
         "dsinfer_time_to_first_token_seconds",
         "histogram",
         "Time from admission to the first generated token.");
  ttft_.render("dsinfer_time_to_first_token_seconds", &out);
  header(&out,
         "dsinfer_inter_token_latency_seconds",
         "histogram",
         "Time between consecutive generated tokens of a request.");
  itl_.render("dsinfer_inter_token_latency_seconds", &out);
  header(&out,
         "dsinfer_request_duration_seconds",
         "histogram",
         "Time from admission to the end of generation.");
  duration_.render("dsinfer_request_duration_seconds", &out);
  header(&out, "dsinfer_queue_depth", "gauge", "Admitted requests waiting to run.");
  sample(&out, "dsinfer_queue_depth", gauges_.queue_depth);
  header(&out, "dsinfer_running_requests", "gauge", "Requests holding sequence state.");
  sample(&out, "dsinfer_running_requests", gauges_.running);
  header(&out, "dsinfer_requests_in_flight", "gauge", "Admitted requests not yet finished.");
  sample(&out, "dsinfer_requests_in_flight", gauges_.in_flight);
  header(&out,
         "dsinfer_max_requests",
         "gauge",
         "Admission limits: running sequences and queue slots (429 beyond their sum).");
  out += "dsinfer_max_requests{kind=\"running\"} " + std::to_string(max_running_) + "\n";
  out += "dsinfer_max_requests{kind=\"queue\"} " + std::to_string(max_queue_) + "\n";
  header(&out,
         "dsinfer_state_memory_bytes",
         "gauge",
         "Sequence-state memory (the one budget of the state arena), used and total.");
  out += "dsinfer_state_memory_bytes{kind=\"used\"} " + std::to_string(gauges_.state_used_bytes) +
         "\n";
  out += "dsinfer_state_memory_bytes{kind=\"total\"} " + std::to_string(gauges_.state_total_bytes) +
         "\n";
  header(&out, "dsinfer_state_memory_used_bytes", "gauge", "Sequence-state memory in use.");
  sample(&out, "dsinfer_state_memory_used_bytes", gauges_.state_used_bytes);
  header(&out,
         "dsinfer_state_sequence_fixed_bytes",
         "gauge",
         "State one sequence holds at one token (window rings, compressor rows).");
  sample(&out, "dsinfer_state_sequence_fixed_bytes", gauges_.state_fixed_bytes);
  header(&out,
         "dsinfer_state_bytes_per_token",
         "gauge",
         "State per further token of context (long contexts: compressed entries, index keys).");
  out += "dsinfer_state_bytes_per_token " + fmt_double(gauges_.state_bytes_per_token) + "\n";
  header(&out,
         "dsinfer_state_max_context_tokens",
         "gauge",
         "Longest context one sequence can hold in the state memory.");
  sample(&out, "dsinfer_state_max_context_tokens", gauges_.state_max_context);
  header(&out, "dsinfer_engine_steps_total", "counter", "Engine iterations.");
  sample(&out, "dsinfer_engine_steps_total", gauges_.steps);
  header(&out, "dsinfer_engine_preemptions_total", "counter", "Sequences preempted for memory.");
  sample(&out, "dsinfer_engine_preemptions_total", gauges_.preemptions);
  header(&out,
         "dsinfer_engine_async_steps_total",
         "counter",
         "Steps launched before the previous step's tokens were back (--async-scheduling).");
  sample(&out, "dsinfer_engine_async_steps_total", gauges_.async_steps);
  if (gauges_.prefix_cache)
    render_prefix_cache(gauges_, &out);
  render_step_time(gauges_, &out);
  if (!gauges_.spec_verified.empty()) {
    auto labelled = [&out](const char* name, const char* label, size_t i, int64_t v) {
      out += std::string(name) + "{" + label + "=\"" + std::to_string(i) + "\"} " +
             std::to_string(v) + "\n";
    };
    header(&out,
           "dsinfer_spec_drafts_verified_total",
           "counter",
           "Speculative decoding: drafts verified, by draft position (1 = first draft).");
    for (size_t i = 0; i < gauges_.spec_verified.size(); ++i)
      labelled("dsinfer_spec_drafts_verified_total", "position", i + 1, gauges_.spec_verified[i]);
    header(&out,
           "dsinfer_spec_drafts_accepted_total",
           "counter",
           "Speculative decoding: drafts accepted, by draft position (1 = first draft).");
    for (size_t i = 0; i < gauges_.spec_accepted.size(); ++i)
      labelled("dsinfer_spec_drafts_accepted_total", "position", i + 1, gauges_.spec_accepted[i]);
    header(&out,
           "dsinfer_spec_acceptance_rate",
           "gauge",
           "Speculative decoding: accepted / verified drafts, by draft position.");
    for (size_t i = 0; i < gauges_.spec_verified.size(); ++i) {
      const double r = gauges_.spec_verified[i] > 0
                           ? static_cast<double>(gauges_.spec_accepted[i]) /
                                 static_cast<double>(gauges_.spec_verified[i])
                           : 0.0;
      out += "dsinfer_spec_acceptance_rate{position=\"" + std::to_string(i + 1) + "\"} " +
             fmt_double(r) + "\n";
    }
    header(&out,
           "dsinfer_spec_verify_length_total",
           "counter",
           "Speculative decoding: decode steps of requests, by the number of drafts verified.");
    for (size_t k = 0; k < gauges_.spec_verify_len.size(); ++k)
      labelled("dsinfer_spec_verify_length_total", "drafts", k, gauges_.spec_verify_len[k]);
    header(&out,
           "dsinfer_spec_verify_steps_total",
           "counter",
           "Speculative decoding: decode steps of requests that verified at least one draft.");
    sample(&out, "dsinfer_spec_verify_steps_total", gauges_.spec_steps);
    header(&out,
           "dsinfer_spec_emitted_tokens_total",
           "counter",
           "Speculative decoding: tokens those steps emitted (accepted drafts + the model's own "
           "token); divided by dsinfer_spec_verify_steps_total, the mean accepted length.");
    sample(&out, "dsinfer_spec_emitted_tokens_total", gauges_.spec_tokens);
    header(
        &out,
        "dsinfer_spec_resumed_total",
        "counter",
        "Speculative decoding (auto): requests that stopped speculating and resumed once it paid "
        "again at their batch.");
    sample(&out, "dsinfer_spec_resumed_total", gauges_.spec_resumed);
  }
  return out;
}

}  // namespace dsinfer::server
