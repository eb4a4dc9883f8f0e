// PartitionerPlanner: the Planner over the partitioner library. It builds
// the partitioner's graph from the measured ModelProfile and its cluster
// from the ClusterSpec (levels, per-worker relative speed, the smallest
// worker memory), runs the augmented-antichain DP under the job's schedule,
// names the placed workers by their registry ids, and fills the plan's
// alternatives with the predicted throughput of the other schedules.
//
// Schedule choice: an explicit ScheduleSpec.kind is used as is; "auto"
// (UNSPECIFIED) plans with the async schedule, whose DP also considers
// replicating stages (one stage replicated everywhere is data parallelism).
//
// Thread-safety: stateless; MakePlan is reentrant.
#ifndef APAPO_PLANNING_PARTITIONER_PLANNER_H_
#define APAPO_PLANNING_PARTITIONER_PLANNER_H_

#include "planning/planner.h"

namespace apapo::planning {

class PartitionerPlanner : public Planner {
 public:
  absl::StatusOr<apapo::v1::Plan> MakePlan(
      const apapo::v1::JobSpec& spec, const apapo::v1::ModelProfile& profile,
      const apapo::v1::ClusterSpec& cluster) override;
};

}  // namespace apapo::planning

#endif  // APAPO_PLANNING_PARTITIONER_PLANNER_H_
