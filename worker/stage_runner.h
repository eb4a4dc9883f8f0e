// RunStage: one stage replica of a job, from its AssignStage to its final
// metrics. This is the only path a stage runs through:
//   * the worker daemon's stage child process (TorchJobRunner ->
//     `apapo-worker --run_assignment` -> RunAssignmentChildMain -> here);
//   * `apapo-worker --local=N`, which makes one AssignStage per rank and
//     hands them to the same TorchJobRunner (worker/local_driver.h);
//   * the in-process test harness (pipeline_harness.h), through the hooks.
// It derives the schedule from the JobSpec and the Plan (planning::
// StagePlanFor), builds the split graph and the stage layouts, loads the
// data, joins the job's Gloo process group through the rendezvous, and runs
// a StageExecutor, reporting progress through a MetricsReport callback.
//
// Thread-safety: RunStage is reentrant (each call builds its own graph,
// data, transport and executor); `report` is called on the calling thread.
#ifndef APAPO_WORKER_STAGE_RUNNER_H_
#define APAPO_WORKER_STAGE_RUNNER_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "planning/stage_plan.h"
#include "proto/apapo/v1/job.pb.h"
#include "proto/apapo/v1/metrics.pb.h"
#include "proto/apapo/v1/worker.pb.h"
#include "worker/data.h"
#include "worker/stage_executor.h"

namespace apapo::worker {

// Progress reports are sent at most this often (plus one as soon as the
// first optimizer step is done, and one after every evaluation).
inline constexpr absl::Duration kStageReportInterval = absl::Seconds(1);

// The executor options of replica `replica` of stage `stage` of `spec` run
// under `plan`: the one mapping from a job to what the executor does (batch,
// optimizer, limits, evaluation, checkpoints, weight prediction, the
// schedule with its micro-batches and in-flight bound). The graph and the
// layouts are left to the caller. INVALID_ARGUMENT for a replica the plan
// does not have.
absl::StatusOr<ExecutorConfig> ExecutorConfigFor(const apapo::v1::JobSpec& spec,
                                                 const planning::StagePlan& plan,
                                                 int stage, int replica);

// What only tests change about a run.
struct StageRunHooks {
  // Data to train on instead of loading spec.data (not owned).
  const DataSplit* data = nullptr;
  // Adjusts the executor's options before it is created (e.g. recording
  // backward passes, initial weights, no evaluation).
  std::function<void(ExecutorConfig*)> configure;
  // Called with the executor after Run, whatever its outcome.
  std::function<void(const StageExecutor&)> finished;
};

// Trains the stage replica `a` assigns (a.plan, a.spec, a.rendezvous: rank,
// world size, store address, key prefix, transfer timeout). Progress goes
// to `report` (throttled to one report per kStageReportInterval, plus one
// per evaluation); `final_metrics` gets the replica's totals.
// MetricsReport.worker_id is left to the caller. Errors name the stage
// ("stage 1 replica 0 (rank 1): ...") and the cause; a plan that does not
// fit the model is INVALID_ARGUMENT.
absl::Status RunStage(const apapo::v1::AssignStage& a,
                      std::function<void(const apapo::v1::MetricsReport&)> report,
                      apapo::v1::MetricsReport* final_metrics,
                      const StageRunHooks& hooks = {});

}  // namespace apapo::worker

#endif  // APAPO_WORKER_STAGE_RUNNER_H_
