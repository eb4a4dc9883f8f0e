// Planner: turns a job's measured profile and cluster into a pipeline Plan.
// The coordinator's scheduler depends on this interface; the implementation
// over the partitioner library is PartitionerPlanner (partitioner_planner.h),
// and tests use fakes.
//
// Thread-safety: implementations must be callable from any thread.
#ifndef APAPO_PLANNING_PLANNER_H_
#define APAPO_PLANNING_PLANNER_H_

#include "absl/status/statusor.h"
#include "proto/apapo/v1/job.pb.h"
#include "proto/apapo/v1/plan.pb.h"
#include "proto/apapo/v1/profile.pb.h"

namespace apapo::planning {

class Planner {
 public:
  virtual ~Planner() = default;
  // A plan whose stages' placements name workers of `cluster` (one per
  // replica). RESOURCE_EXHAUSTED when nothing fits in memory or planning
  // would exceed the planner's budget, with why.
  virtual absl::StatusOr<apapo::v1::Plan> MakePlan(
      const apapo::v1::JobSpec& spec, const apapo::v1::ModelProfile& profile,
      const apapo::v1::ClusterSpec& cluster) = 0;
};

}  // namespace apapo::planning

#endif  // APAPO_PLANNING_PLANNER_H_
