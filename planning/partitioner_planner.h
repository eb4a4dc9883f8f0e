// PartitionerPlanner: the Planner over the partitioner library. It builds
// the partitioner's graph from the measured ModelProfile and its cluster
// from the ClusterSpec (levels, per-worker relative speed, the smallest
// worker memory), runs the augmented-antichain DP under the job's schedule,
// names the placed workers by their registry ids, and fills the plan's
// alternatives with the predicted throughput of the other schedules.
//
// Schedule choice: an explicit ScheduleSpec.kind is used as is; "auto"
// (UNSPECIFIED) plans with the async schedule, whose DP also considers
// replicating stages (one stage replicated everywhere is data parallelism),
// and takes 1F1B with flushes instead where that is predicted at least
// 1.1x faster (a slow link binds; a note gives both predictions). Every
// schedule's micro-batches are charged the per-row cost the profile
// measured at their size (ModelProfile.micro_batch_costs).
//
// More workers than one: a plan that places more than one worker must be
// predicted kMinMoreWorkersGain (1.1x) faster than the best plan on the
// fastest worker alone, else the job runs on that worker and a note gives
// both predictions; the others are the coordinator's to release. Not
// applied where the spec fixes stages, replicas or data parallelism, or
// asks for fault_tolerance.min_workers above one.
//
// Shared cores: when workers report core sets that hold fewer cores than
// their threads with all of them busy (core_sharing.h), the plan is the
// best of all the workers at their shares and of fewer per core set at
// larger ones; a note gives each prediction. Workers it leaves out are
// the coordinator's to release.
//
// Budget: every DP run of a MakePlan call (the plan, its layer-split trials,
// the alternatives) is bounded by `budget` (default kCoordinatorBudget), so
// a model whose search would outgrow it fails with RESOURCE_EXHAUSTED naming
// the limit: the coordinator fails that job, not itself. With the default
// state cap no DAG reaches it; it binds where the DP's memory-bound inner
// loop or an extreme worker count would run long.
//
// Thread-safety: no mutable state; MakePlan is reentrant.
#ifndef APAPO_PLANNING_PARTITIONER_PLANNER_H_
#define APAPO_PLANNING_PARTITIONER_PLANNER_H_

#include "partitioner/optimizer.h"
#include "planning/planner.h"

namespace apapo::planning {

// At most 256 Ki states per enumeration, 512 MiB of search tables and 2e9
// DP steps (a few seconds) per DP run.
inline constexpr partitioner::PlannerOptions::Budget kCoordinatorBudget = {
    int64_t{1} << 18, int64_t{512} << 20, int64_t{2'000'000'000}};

class PartitionerPlanner : public Planner {
 public:
  explicit PartitionerPlanner(
      partitioner::PlannerOptions::Budget budget = kCoordinatorBudget)
      : budget_(budget) {}

  // Where the spec lets a ReLU's zeros stay home (skip_zeros) and the
  // profile measured a ReLU's nonzero share, the model is planned both
  // ways: zeros are skipped only where that is predicted at least
  // kMinSkipZerosGain the throughput of whole tensors (packing costs CPU
  // the cost model does not see in full: the cnn's 2-stage plan at
  // 1 Gbit/s, weighed above data parallelism for it, ran 23% below its
  // prediction; bench/cluster 2026-12-05 11:00).
  absl::StatusOr<apapo::v1::Plan> MakePlan(
      const apapo::v1::JobSpec& spec, const apapo::v1::ModelProfile& profile,
      const apapo::v1::ClusterSpec& cluster) override;

 private:
  // MakePlan without weighing the settings it lists as alternatives
  // (bfloat16, staleness_2) as jobs that set them.
  absl::StatusOr<apapo::v1::Plan> MakePlanOnce(
      const apapo::v1::JobSpec& spec, const apapo::v1::ModelProfile& profile,
      const apapo::v1::ClusterSpec& cluster);
  // MakePlan for the spec's skip_zeros as it is.
  absl::StatusOr<apapo::v1::Plan> MakePlanAsAsked(
      const apapo::v1::JobSpec& spec, const apapo::v1::ModelProfile& profile,
      const apapo::v1::ClusterSpec& cluster);
  // MakePlan on `cluster` as given (no core sharing weighed), or on its
  // fastest worker alone where the plan on more is predicted less than
  // kMinMoreWorkersGain faster.
  absl::StatusOr<apapo::v1::Plan> PlanOn(const apapo::v1::JobSpec& spec,
                                         const apapo::v1::ModelProfile& profile,
                                         const apapo::v1::ClusterSpec& cluster);
  // PlanOn without the one-worker comparison.
  absl::StatusOr<apapo::v1::Plan> PlanOnAll(const apapo::v1::JobSpec& spec,
                                            const apapo::v1::ModelProfile& profile,
                                            const apapo::v1::ClusterSpec& cluster);

  const partitioner::PlannerOptions::Budget budget_;
};

}  // namespace apapo::planning

#endif  // APAPO_PLANNING_PARTITIONER_PLANNER_H_
