// Measures the step-time model (verify_length.h) on a backend at start-up: a few timed forwards
// and drafting calls over throwaway sequences in the engine's state arena, rolled back after
// each measurement.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/model.h"
#include "base/status.h"
#include "spec/drafter.h"
#include "spec/verify_length.h"
#include "state/page_arena.h"

namespace dsinfer::spec {

// Batch sizes 1, 2, 4, ... up to max_batch (and max_batch itself), each with L = 1..max_k + 1
// tokens per sequence and s = 1..max_k draft steps; the minimum of `reps` interleaved rounds. Fewer
// batch sizes when the arena cannot hold max_batch throwaway sequences, and when the measurement
// has taken budget_s (a slow backend such as the reference kernels: then also a single round;
// the larger batch sizes are extrapolated). Each batch size first runs its longest verification,
// its longest drafting and its plain decode twice untimed, so that even a single round times the
// steady state the engine's steps see (grown workspace; on CUDA the plain decode replayed from
// its captured graph, as the engine's plain steps are). backend_sampling: the engine samples
// steps without drafts in the backend (Engine::prepare_backend_sample), so off and depth 0 are
// timed that way (only the token comes back); otherwise every returned row is sampled on the host.
// clock: seconds on the engine's clock (EngineConfig::clock); unset: the steady clock.
// launch_ahead (with backend_sampling, on a backend whose can_defer_samples() is true): the
// engine launches its plain decode steps ahead (EngineConfig::async_scheduling), so off is timed
// as a run of such steps, each launched before the previous one's pick is back, per step.
Result<StepTimes> measure_step_times(backend::Model& model,
                                     Drafter& drafter,
                                     state::PageArena& arena,
                                     int64_t max_batch,
                                     int32_t max_k,
                                     bool backend_sampling = false,
                                     int reps = 4,
                                     double budget_s = 2.0,
                                     const std::function<double()>& clock = {},
                                     bool launch_ahead = false);

}  // namespace dsinfer::spec
