// SimulatedTrace: the simulator's timeline (partitioner/simulator.h) of a
// job's stored plan, as the StageTraces a stage measures (one per stage
// replica, spans from 0), to set beside the measured ones (GetTrace).
//
// The plan proto keeps stage node ids, not the partitioner's StagePlan, so
// the simulator's inputs are rebuilt from the measured profile (split as
// the plan says): per stage the summed forward/backward seconds, parameter
// bytes, and the activations its nodes send to later stages, the per
// mini-batch figures divided by the plan's micro-batches (the simulator's
// ops are micro-batches); links at the cluster's first level bandwidth,
// one transfer at a time each way.
//
// Thread-safety: stateless; reentrant.
#ifndef APAPO_PLANNING_SIMULATED_TRACE_H_
#define APAPO_PLANNING_SIMULATED_TRACE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "proto/apapo/v1/metrics.pb.h"
#include "proto/apapo/v1/service.pb.h"

namespace apapo::planning {

// `steps` optimizer steps (at least 2). FAILED_PRECONDITION when the plan
// names nodes the profile lacks (a plan of another model).
absl::StatusOr<std::vector<apapo::v1::StageTrace>> SimulatedTrace(
    const apapo::v1::GetPlanResponse& plan, int steps);

// Iterations SimulatedSamplesPerSecond simulates (its rate is the steady
// state's, over the middle half).
inline constexpr int kRateIterations = 12;

// The samples/s the simulator gives the stored plan on its profile and
// cluster: the rate of `plan` re-predicted on other figures (a profile the
// run calibrated, coordinator/run_check.h). Errors as SimulatedTrace's;
// FAILED_PRECONDITION for a profile without batch_size.
absl::StatusOr<double> SimulatedSamplesPerSecond(const apapo::v1::GetPlanResponse& plan);

}  // namespace apapo::planning

#endif  // APAPO_PLANNING_SIMULATED_TRACE_H_
