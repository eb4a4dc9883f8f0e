// Runs one replica of one pipeline stage: executes the op stream of the
// shared schedule library (partitioner/schedule.h: StageProgram), moving
// activations forward and gradients backward through a Transport.
//
// What it does per op (j = global micro-batch, v = weight version):
//   kForward(j, v)  stage 0 reads micro-batch j from the dataset, other
//                   stages receive the bundle of the cut before them; runs
//                   the stage's nodes with weight version v; sends the output
//                   bundle on (tensors crossing a cut travel as one message,
//                   labels included). The stage keeps what backward needs.
//   kBackward(j, v) the last stage differentiates its loss, others receive
//                   the gradient bundle; gradients are taken with respect to
//                   version v's tensors (weight stashing: exactly the weights
//                   that forward used, checked) and accumulated; the input
//                   gradients go back to the previous stage.
//   kUpdate(v')     replicated stages all-reduce the accumulated gradients;
//                   the optimizer produces version v' as new tensors.
// Training is split into phases (an epoch, or the part of one between two
// checkpoints); each phase runs one StageProgram, so a phase boundary drains
// the pipeline. Evaluation runs between phases through replica 0 of each
// stage.
//
// Thread-safety: Run() is called once, from one thread; the executor uses
// the transport's communication threads. Report() may be called after Run().

#ifndef APAPO_WORKER_STAGE_EXECUTOR_H_
#define APAPO_WORKER_STAGE_EXECUTOR_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "partitioner/schedule.h"
#include "proto/apapo/v1/job.pb.h"
#include "proto/apapo/v1/metrics.pb.h"
#include "worker/data.h"
#include "worker/model_builder.h"
#include "worker/model_graph.h"
#include "worker/optimizer.h"
#include "worker/transport.h"

namespace apapo {
namespace worker {

// Counters of one stage replica after Run() (and, while it
// runs, in ExecutorConfig::on_stage_report).
struct StageReport {
  int stage = 0;
  int replica = 0;
  int rank = 0;
  double busy_seconds = 0;
  double idle_seconds = 0;          // blocked receiving inputs/gradients
  double comm_exposed_seconds = 0;  // blocked on send drains and all-reduce
  double comm_total_seconds = 0;    // transfer time on comm threads
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t forward_micro_batches = 0;
  int64_t backward_micro_batches = 0;
  int64_t max_staleness = 0;
  int max_weight_versions = 0;
  int64_t steps = 0;
  double train_seconds = 0;  // wall time of the training phases
  int64_t samples = 0;       // training samples this replica processed
  // Last stage only.
  double final_loss = 0;  // mean over the last epoch's micro-batches
  double test_accuracy = -1;
  int64_t num_params = 0;
};

// Progress the last stage reports while training.
struct TrainingProgress {
  int64_t step = 0;         // optimizer steps done
  int64_t total_steps = 0;  // steps the run will do
  int64_t epoch = 0;        // 1-based
  double loss = 0;          // mean over recent micro-batches
  double samples_per_second = 0;
  double test_accuracy = -1;  // after an evaluation, else -1
};

struct ExecutorConfig {
  const AnalyzedGraph* graph = nullptr;  // outlives the executor
  std::vector<StageLayout> layouts;      // every stage, in order
  int stage = 0;
  int replica = 0;
  // Schedule kind, stages, replicas per stage, micro-batches per iteration
  // and max_in_flight; num_iterations is set per phase.
  schedule::ScheduleOptions schedule;
  int64_t batch_size = 1;  // samples per iteration (mini-batch)
  apapo::v1::OptimizerSpec optimizer;
  int64_t seed = 0;
  bool shuffle = true;
  int64_t epochs = 1;
  int64_t max_steps = 0;          // 0: no limit
  double target_accuracy = 0;     // 0: off
  int64_t eval_every_epochs = 1;  // 0: never evaluate
  int64_t eval_batch_size = 0;    // 0: batch_size
  apapo::v1::CheckpointSpec checkpoint;
  // Called on the last stage's replica 0 every `progress_every` steps and
  // after each evaluation.
  std::function<void(const TrainingProgress&)> on_progress;
  // Called on every stage replica every `progress_every` steps (before
  // on_progress) with its counters so far: busy/idle/comm seconds, bytes,
  // staleness, train_seconds up to now. Lets every stage stream its state
  // while training, not only at the end.
  std::function<void(const StageReport&)> on_stage_report;
  int64_t progress_every = 50;
  // Async only: forward and backward run on weights predicted `delay`
  // updates ahead (see ScheduleSpec.weight_prediction in job.proto).
  bool weight_prediction = false;
  // Test hook: record every backward pass (see BackwardRecord).
  bool record_backwards = false;
  // Initial weights: when empty, initialised from `seed`.
  std::vector<at::Tensor> initial_parameters;
};

// One backward pass, recorded when ExecutorConfig::record_backwards is set.
struct BackwardRecord {
  int64_t micro_batch = 0;  // global within the run
  int64_t forward_version = 0;
  int64_t backward_version = 0;
  int64_t newest_version = 0;  // at the time of the backward
  std::vector<at::Tensor> params;        // the version differentiated
  std::vector<at::Tensor> inputs;        // the stage's inputs (detached)
  std::vector<at::Tensor> grad_outputs;  // received gradients (non-last)
  std::vector<at::Tensor> param_grads;   // gradients it produced
};


// Copies a replica's counters into the StageMetrics a MetricsReport carries
// (everything but step_seconds, whose source differs by caller).
void FillStageMetrics(const StageReport& report, int stage, int rank,
                      apapo::v1::StageMetrics* metrics);

class StageExecutor {
 public:
  // `transport` may be null only for a single, unreplicated stage.
  // `train`/`test` are read by stage 0 only (others may pass null).
  static absl::StatusOr<std::unique_ptr<StageExecutor>> Create(
      ExecutorConfig config, Transport* transport, const Dataset* train,
      const Dataset* test);
  ~StageExecutor();

  // Trains until a limit is reached. Errors name the stage and the cause.
  absl::Status Run();

  // The newest weight version (for tests and checkpoints).
  const std::vector<at::Tensor>& parameters() const;
  const std::vector<std::string>& parameter_names() const;
  StageReport Report() const;
  const std::vector<BackwardRecord>& backward_records() const;
  // Global rank of (stage, replica) under the config's replication.
  static int RankOf(const schedule::ScheduleOptions& schedule, int stage,
                    int replica);

 private:
  struct Impl;
  explicit StageExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_STAGE_EXECUTOR_H_
