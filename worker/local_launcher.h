// Trains a JobSpec on this machine without a coordinator: the parent
// process serves a TCPStore on a free port and starts one worker process per
// rank (fork + exec of the same binary in rank mode); each rank builds its
// stage, connects its Gloo process group and runs a StageExecutor. Results
// come back through the store and are written as a JSON summary.
//
// Planning: until the partitioner's planner is wired in, the local plan is
// the schedule the spec forces (auto = async) on `stages` = spec stages or
// workers / replicas, cut by BalancedSplit (balanced forward cost).
//
// Thread-safety: functions are meant to be called from main(); RunLocalJob
// forks, so call it before starting threads.

#ifndef APAPO_WORKER_LOCAL_LAUNCHER_H_
#define APAPO_WORKER_LOCAL_LAUNCHER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "partitioner/schedule.h"
#include "proto/apapo/v1/job.pb.h"
#include "worker/model_graph.h"

namespace apapo {
namespace worker {

// Reads a JobSpec in protobuf text format.
absl::StatusOr<apapo::v1::JobSpec> ReadJobSpec(const std::string& path);

// How a job is laid out over `workers` local processes.
struct LocalPlan {
  std::vector<std::vector<std::string>> stage_nodes;
  schedule::ScheduleOptions schedule;  // num_iterations unused
  int world_size = 0;
  std::string description;  // "async, 2 stages x 1 replica, m=4: ..."
  // Layer splits the plan's stage_nodes refer to (plan.proto LayerSplit).
  std::vector<std::pair<std::string, int>> splits;
};
// When the spec leaves stages and replicas to the planner (and the schedule
// is not data parallelism), the partitioner plans the job, as the
// coordinator does, from costs estimated from the graph (multiply-adds at a
// fixed rate, backward twice forward for layers with weights; activation
// and parameter bytes from the shapes; a 1 GB/s loopback network); it may
// split wide layers. A forced stage count gets the compute-balanced
// contiguous cut of whole layers (BalancedSplit). Deterministic: every rank
// computes the same plan.
absl::StatusOr<LocalPlan> PlanLocalJob(const apapo::v1::JobSpec& spec,
                                       const AnalyzedGraph& graph,
                                       int workers);

// The graph a rank builds its stage from: `graph` with the plan's splits.
absl::StatusOr<AnalyzedGraph> PlannedGraph(const AnalyzedGraph& graph,
                                           const LocalPlan& plan);

struct RankOptions {
  int rank = 0;
  int world_size = 1;
  int store_port = 0;
  absl::Duration timeout = absl::Seconds(120);
};

// Rank mode: trains this rank's stage replica and reports its MetricsReport
// (and an error, if any) to the store. Errors name the stage and the cause.
absl::Status RunRank(const apapo::v1::JobSpec& spec, const RankOptions& options);

struct LocalJobOptions {
  int workers = 2;
  std::string spec_path;
  std::string summary_path;  // empty: no summary file
  // Binary to exec per rank and the arguments that select rank mode; the
  // launcher appends --rank, --world, --store_port.
  std::string self_exe;
  std::vector<std::string> rank_args;
  absl::Duration timeout = absl::Seconds(120);
};

// Runs the whole job in `workers` processes and writes the summary. Returns
// the first rank's error if any rank failed.
absl::Status RunLocalJob(const apapo::v1::JobSpec& spec,
                         const LocalJobOptions& options);

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_LOCAL_LAUNCHER_H_
