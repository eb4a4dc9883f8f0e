// `apapo-worker --local=N`: trains a JobSpec on this machine without a
// coordinator, as a thin driver over the daemon's own stage path. It plans
// the job into an apapo.v1.Plan, serves the job's rendezvous TCPStore, makes
// one AssignStage per rank and hands each to a TorchJobRunner, which runs it
// in a stage child process (worker --run_assignment, RunAssignmentChildMain)
// and reads its reports over the parent/child frame channel: exactly what a
// worker daemon does with the coordinator's assignments. The summary is a
// LocalRunSummary (metrics.proto) written as protobuf JSON.
//
// Planning (PlanLocalRun): when the spec leaves stages and replicas open
// (and is not data parallelism), the partitioner plans it as the coordinator
// does, from costs estimated from the graph (EstimatedProfile) on a 1 GB/s
// network of `workers` equal workers; it may split wide layers. A forced
// stage count gets the compute-balanced contiguous cut of whole layers
// (BalancedSplit). Deterministic.
//
// Thread-safety: RunLocalJob is meant to be called from main(); it starts
// one thread per rank and forks the stage children from them.

#ifndef APAPO_WORKER_LOCAL_DRIVER_H_
#define APAPO_WORKER_LOCAL_DRIVER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/apapo/v1/job.pb.h"
#include "proto/apapo/v1/plan.pb.h"
#include "proto/apapo/v1/profile.pb.h"
#include "worker/model_graph.h"

namespace apapo {
namespace worker {

// Reads a JobSpec in protobuf text format. INVALID_ARGUMENT naming the field
// for a spec no run could start from (batch size, limits); NOT_FOUND for a
// missing file.
absl::StatusOr<apapo::v1::JobSpec> ReadJobSpec(const std::string& path);

// Costs the local planner plans from without measuring: multiply-adds at a
// fixed rate per core, backward twice forward for layers with weights;
// activation and parameter bytes from the shapes.
apapo::v1::ModelProfile EstimatedProfile(const AnalyzedGraph& graph,
                                         int64_t batch);

// The plan of `spec` on `workers` local processes (see above): as many stage
// replicas as workers, or FAILED_PRECONDITION / INVALID_ARGUMENT saying why
// not. The plan's notes say whether the partitioner chose it.
absl::StatusOr<apapo::v1::Plan> PlanLocalRun(const apapo::v1::JobSpec& spec,
                                             const AnalyzedGraph& graph,
                                             int workers);

// One line for logs and the summary: the StagePlan's description, "(planned)"
// after the schedule when the partitioner chose the layout.
std::string DescribeLocalPlan(const apapo::v1::JobSpec& spec,
                              const apapo::v1::Plan& plan);

struct LocalJobOptions {
  int workers = 2;
  // Compute threads per stage process (spec.resources.threads_per_worker).
  int threads = 1;
  std::string summary_path;  // empty: no summary file
  // The worker binary the stage children exec (main passes /proc/self/exe).
  std::string exe;
  // Timeout of every blocking transfer between stages.
  absl::Duration timeout = absl::Seconds(120);
};

// Runs the whole job in `options.workers` stage processes and writes the
// summary. When a rank fails, the others are stopped at once and its error
// (naming the stage and the cause) is returned.
absl::Status RunLocalJob(const apapo::v1::JobSpec& spec,
                         const LocalJobOptions& options);

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_LOCAL_DRIVER_H_
