// Runs one replica of one pipeline stage by executing its schedule's
// programs (schedule/schedule.h): the op loop, and nothing else. What
// the ops need lives in parts of its own:
//   WeightStore (weight_store.h)          weight versions: stashing,
//                                         recycling, prediction;
//   CheckpointStore (checkpoint_store.h)  where checkpoints go, their
//                                         format, and (CheckpointWriter)
//                                         their writing in the background;
//   Evaluator (evaluator.h)               test accuracy, by the schedule's
//                                         evaluation program;
//   StageObserver (stage_observer.h)      counters and progress, out;
//   SpanRecorder (span_recorder.h)        the op spans of a window of
//                                         steps (the measured timeline).
//
// Per op (j = global micro-batch, v = weight version; transfers name their
// peer replica, the executor maps it to a rank):
//   kRecvActivations(j) / kRecvGradients(j)  post the receive (the transport
//                   lands the bytes while the stage computes);
//   kForward(j, v)  stage 0 reads micro-batch j from the dataset, others take
//                   the received bundle; runs the stage's nodes on version v
//                   (or its prediction); keeps what backward needs;
//   kSendActivations(j)  sends the output bundle (labels included);
//   kBackward(j, v) differentiates the loss (last stage) or the received
//                   gradients with respect to exactly the tensors forward
//                   used (weight stashing, checked) and accumulates them;
//   kSendGradients(j)  sends the input gradients back;
//   kAllReduce(v')  sums the accumulated gradients over the stage's replicas;
//   kUpdate(v')     the optimizer makes version v';
//   kFlush          waits for every send.
// Training is split into phases (an epoch, or the part of one between two
// checkpoints); each phase runs one StageProgram, so a phase boundary drains
// the pipeline. An evaluation runs between phases.
//
// Transport groups: the transport's replica groups are the stages' (in
// stage order), followed by one group of every rank (evaluation results).
//
// Thread-safety: Run() is called once, from one thread; the executor uses
// the transport's communication threads. Report() may be called after Run().

#ifndef APAPO_WORKER_STAGE_EXECUTOR_H_
#define APAPO_WORKER_STAGE_EXECUTOR_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "schedule/schedule.h"
#include "proto/apapo/v1/job.pb.h"
#include "worker/checkpoint_store.h"
#include "worker/data.h"
#include "worker/model_graph.h"
#include "worker/span_recorder.h"
#include "worker/stage_observer.h"
#include "worker/transport.h"

namespace apapo {
namespace worker {

// How the stage reads its data.
struct DataOptions {
  int64_t batch_size = 1;  // samples per iteration (mini-batch)
  bool shuffle = true;
};

// When training stops.
struct LimitOptions {
  int64_t epochs = 1;
  int64_t max_steps = 0;       // 0: no limit
  double target_accuracy = 0;  // 0: off; else stop once an evaluation reaches it
};

struct EvaluationOptions {
  int64_t every_epochs = 1;  // 0: never evaluate
  int64_t batch_size = 0;    // 0: the training batch size
};

// Checkpoints. At every `every_steps`-th step (a phase boundary, so the
// pipeline has drained) the stage's replica 0 snapshots its newest weights,
// optimizer state and buffers in memory and hands them to a CheckpointWriter
// thread; training goes on while it writes, the next checkpoint waits for
// the previous write, and Run() waits for the last one (a write error fails
// the run, naming the file). With `resume`, Run() starts from the store's
// newest complete step, whichever plan wrote it: weights, optimizer state,
// buffers, the step and the weight version; the data position (epoch and
// iteration) and the learning-rate schedule follow from the step.
// Dropout's generator is re-seeded from (seed, rank, step) at every
// checkpoint and on resuming, so under the same plan a resumed run draws the
// masks an uninterrupted one draws; under another plan ranks differ, so the
// masks differ (deterministically for the new plan, seed and step).
struct CheckpointOptions {
  CheckpointStore* store = nullptr;  // null: no checkpoints; outlives the run
  int64_t every_steps = 0;           // 0: only at the end
  bool resume = false;  // start from the newest complete step
};

// What only tests set.
struct ExecutorTestHooks {
  // Record every backward pass (see BackwardRecord).
  bool record_backwards = false;
  // Initial weights: when empty, initialised from the seed.
  std::vector<at::Tensor> initial_parameters;
};

struct ExecutorConfig {
  const AnalyzedGraph* graph = nullptr;  // outlives the executor
  std::vector<StageLayout> layouts;      // every stage, in order
  int stage = 0;
  int replica = 0;
  // Schedule kind, stages, replicas per stage, micro-batches per iteration
  // and max_in_flight; num_iterations is set per phase.
  schedule::ScheduleOptions schedule;
  int64_t seed = 0;  // initial weights, epoch order, dropout
  DataOptions data;
  apapo::v1::OptimizerSpec optimizer;
  // Async only: forward and backward run on weights predicted `delay`
  // updates ahead (see ScheduleSpec.weight_prediction in job.proto).
  bool weight_prediction = false;
  // The precision activations and their gradients cross the cuts in
  // (ScheduleSpec.transfer_precision); evaluation always sends float32.
  WirePrecision wire_precision = WirePrecision::kFloat32;
  // ReLU outputs cross the cuts without their zeros, and their gradients
  // only where they are not zero (ScheduleSpec.skip_zeros; transport.h).
  bool skip_zeros = false;
  // Every stage computes its backward in two passes: the input gradients
  // (and, on the way, the gradients of its nodes' outputs), then, after
  // the first stage, their send, then each node's weight gradients from
  // its output's gradient (Plan.split_backward). The same gradients as one
  // pass; the upstream stage gets its gradients a weight-gradient pass
  // sooner, and a Linear's weight gradient is added into the mini-batch's
  // by its product (addmm_), with no add per micro-batch.
  bool split_backward = false;
  // With split_backward, a replicated stage starts its gradient all-reduce
  // in parts during its last backward of an iteration (AllReduceParts);
  // false: one all-reduce after that backward (Plan.
  // allreduce_after_backward). The same sums either way.
  bool allreduce_in_parts = true;
  LimitOptions limits;
  EvaluationOptions evaluation;
  CheckpointOptions checkpoint;
  // Told of the counters (every replica) and progress (last stage, replica
  // 0) every `progress_every` steps and after each evaluation. May be null.
  StageObserver* observer = nullptr;
  int64_t progress_every = 50;
  // The measured timeline (span_recorder.h): a window of steps after
  // warm-up, handed to observer->OnTrace once it completes (or when a
  // shorter run ends). steps = 0: off.
  TraceOptions trace;
  ExecutorTestHooks test;
};

// One backward pass, recorded when ExecutorTestHooks::record_backwards is set.
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

class StageExecutor {
 public:
  // `transport` may be null only for a single, unreplicated stage.
  // `train`/`test` must be given: every stage derives the epoch length and
  // the number of test batches from them; stage 0 reads their samples.
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

 private:
  struct Impl;
  explicit StageExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_STAGE_EXECUTOR_H_
