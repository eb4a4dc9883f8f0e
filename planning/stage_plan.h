// StagePlan: what every stage replica of a job needs to know about the whole
// pipeline, derived from the JobSpec and the Plan in exactly one place
// (StagePlanFor). The daemon's stage process, the local driver
// (`apapo-worker --local`), the test harness and the coordinator's planner
// all read the schedule's parameters from here, so the rules below live
// nowhere else:
//   * micro-batches per iteration m: the plan's, else the spec's, else the
//     schedule's default (schedule::DefaultMicroBatches);
//   * in-flight bound: spec.schedule.max_staleness s gives max_in_flight
//     s x k + 1, k = max(1, m / the most replicas of a stage): a stage's
//     gradient delay in updates is (its in-flight depth - 1) / k, rounded up;
//   * ranks are numbered stage-major: stage 0's replicas first.
//
// Thread-safety: pure functions and value types.
#ifndef APAPO_PLANNING_STAGE_PLAN_H_
#define APAPO_PLANNING_STAGE_PLAN_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "schedule/schedule.h"
#include "proto/apapo/v1/job.pb.h"
#include "proto/apapo/v1/plan.pb.h"

namespace apapo::planning {

// The in-flight bound `spec` asks for (ScheduleOptions::max_in_flight) with
// `micro_batches` per iteration and `replicas` per stage (empty: one each):
// schedule::MaxInFlightForStaleness of max_staleness when set, else 0 (the
// schedule's default depth).
int MaxInFlight(const apapo::v1::JobSpec& spec, int micro_batches,
                const std::vector<int>& replicas);

// Micro-batches per iteration for a job with `kind` and `replicas` per
// stage: `planned` when > 0 (the plan's), else spec.schedule.micro_batches
// when set, else schedule::DefaultMicroBatches.
int MicroBatches(const apapo::v1::JobSpec& spec, int planned,
                 schedule::ScheduleKind kind, const std::vector<int>& replicas);

struct StagePlan {
  // Kind, stages, replicas (empty when nothing is replicated), m and the
  // in-flight bound; num_iterations is left at 1 (set per training phase).
  schedule::ScheduleOptions schedule;
  // Node ids per stage, in pipeline order (ids of the split graph).
  std::vector<std::vector<std::string>> stage_nodes;
  // Linear layers split column-wise: (node id, parts) (plan.proto LayerSplit).
  std::vector<std::pair<std::string, int>> splits;
  // ReLU outputs cross the cuts without their zeros (Plan.skip_zeros).
  bool skip_zeros = false;
  // Stages after the first send input gradients before computing weight
  // gradients (Plan.split_backward).
  bool split_backward = false;
  // With split_backward: a replicated stage starts its all-reduce in parts
  // during its last backward of an iteration (not Plan.
  // allreduce_after_backward); else one all-reduce after it.
  bool allreduce_in_parts = false;
  int world_size = 0;  // stage replicas in all

  // Global rank of (stage, replica): stage-major.
  int RankOf(int stage, int replica) const;
  // The (stage, replica) of `rank`; requires 0 <= rank < world_size.
  std::pair<int, int> StageOf(int rank) const;
  // "async (planned), 2 stage(s), m=1: [input..fc3/0] | [fc3/1..loss],
  // split fc3/8, weight prediction": `origin` goes in the parentheses; when
  // empty, "auto" if the spec left the schedule open, else none.
  std::string Describe(const apapo::v1::JobSpec& spec,
                       absl::string_view origin = "") const;
};

// The StagePlan of `plan` for `spec`. INVALID_ARGUMENT naming the field
// ("plan.stages[1]: no node ids", "plan: ...") when the plan is malformed or
// its schedule parameters are out of range.
absl::StatusOr<StagePlan> StagePlanFor(const apapo::v1::JobSpec& spec,
                                       const apapo::v1::Plan& plan);

// Whether an async run of `spec` predicts weights (ScheduleSpec.
// weight_prediction; unset: yes). Other schedules never do.
bool WeightPredictionRequested(const apapo::v1::JobSpec& spec);

// Whether ReLU outputs cross the cuts without their zeros (ScheduleSpec.
// skip_zeros; unset: yes).
bool SkipZerosRequested(const apapo::v1::JobSpec& spec);

// Whether the stages after the first split their backward (ScheduleSpec.
// split_backward; unset: yes).
bool SplitBackwardRequested(const apapo::v1::JobSpec& spec);

// ScheduleSpec.allreduce_in_backward: the spec's choice where it makes one
// (true: the parts, false: one all-reduce after the backward), nullopt
// where the planner chooses. false whenever the backward is not split.
std::optional<bool> AllReduceInBackwardRequested(const apapo::v1::JobSpec& spec);

// How many times fewer bytes than the profile's float32 activations cross a
// cut in `precision`: 2 for BFLOAT16, 1 otherwise (the partitioner's
// activation compression ratio).
double TransferCompressionRatio(apapo::v1::TransferPrecision precision);

}  // namespace apapo::planning

#endif  // APAPO_PLANNING_STAGE_PLAN_H_
