// StageObserver: the one interface through which a stage executor tells the
// outside how it is doing: its per-stage counters (StageReport) on every
// replica, and the training progress (TrainingProgress: step, loss,
// throughput, accuracy) on the last stage's replica 0. The stage runner's
// implementation turns both into throttled MetricsReports; tests record
// them. Torch-free, so that what consumes the reports needs no LibTorch.
//
// Thread-safety: the executor calls an observer from its one compute
// thread; implementations need no locking unless they share state.
#ifndef APAPO_WORKER_STAGE_OBSERVER_H_
#define APAPO_WORKER_STAGE_OBSERVER_H_

#include <cstdint>
#include <deque>

#include "absl/time/time.h"

#include "proto/apapo/v1/metrics.pb.h"

namespace apapo::worker {

// Counters of one stage replica: cumulative since the executor started.
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
  // Parts of the gradient all-reduce this replica started (a replicated
  // stage with a split backward), and how many of them inside a backward,
  // overlapping its weight gradients, not at the all-reduce itself; of
  // those, how many inside its pass 1 (the first stage's product nodes,
  // overlapping the rest of the backward too).
  int64_t allreduce_parts = 0;
  int64_t allreduce_parts_in_backward = 0;
  int64_t allreduce_parts_in_pass1 = 0;
  int max_weight_versions = 0;
  int64_t steps = 0;
  int64_t resumed_step = 0;  // the checkpoint's step this run started at
  // The newest step whose checkpoint of this stage is on disk complete: the
  // resumed one, or one this replica wrote since (replica 0 writes).
  int64_t checkpoint_step = 0;
  double train_seconds = 0;  // wall time of the training phases
  // train_seconds when this run's kRateWarmupSteps-th step finished; < 0
  // before (see SteadySamplesPerSecond).
  double warm_train_seconds = -1;
  // Executor time spent on checkpoints: snapshots, and waiting for the
  // previous (background) write; the write itself is not counted.
  double checkpoint_seconds = 0;
  // CPU time of this replica's background checkpoint writes.
  double checkpoint_write_cpu_seconds = 0;
  int64_t samples = 0;       // training samples this replica processed
  // Last stage only.
  double final_loss = 0;  // mean over the last epoch's micro-batches
  double test_accuracy = -1;
  int64_t num_params = 0;
};

// Steps at the start of every run (fresh or resumed) that its throughput
// leaves out: the first optimizer steps allocate their buffers, the
// allocator and caches warm up and the pipeline fills, which on the
// benchmark's mlp made its first five steps take 3-9x a steady one.
inline constexpr int64_t kRateWarmupSteps = 10;

// A replica's training throughput over its run: `samples` (what it
// processed in report.steps steps) per second of training phases, counted
// from the end of the run's kRateWarmupSteps-th step at the run's mean
// samples per step. A run of at most 2 x kRateWarmupSteps steps is counted
// whole. Evaluations are not training phases; checkpoints taken between
// phases cost the phases after them (the background write shares the
// cores), so they count. 0 before any training time.
double SteadySamplesPerSecond(const StageReport& report, double samples);

// Progress of the whole pipeline, as the last stage sees it.
struct TrainingProgress {
  int64_t step = 0;         // optimizer steps done
  int64_t total_steps = 0;  // steps the run will do
  int64_t epoch = 0;        // 1-based
  double loss = 0;          // mean over recent micro-batches
  double samples_per_second = 0;
  double test_accuracy = -1;  // after an evaluation, else -1
};

class StageObserver {
 public:
  virtual ~StageObserver() = default;
  // Every replica, every `progress_every` optimizer steps (before
  // OnProgress): the counters so far, train_seconds up to now.
  virtual void OnCounters(const StageReport& counters) {}
  // The last stage's replica 0, every `progress_every` steps and after each
  // evaluation.
  virtual void OnProgress(const TrainingProgress& progress) {}
  // Every replica, once: the op spans of its trace window (stage, replica
  // and rank set), when the window completes or a shorter run ends.
  virtual void OnTrace(const apapo::v1::StageTrace& trace) {}
};

// The last stage's running figures behind TrainingProgress: the mean of the
// recent micro-batch losses, the epoch's mean loss, and the throughput since
// Start. Not thread-safe (the executor's compute thread).
class ProgressTracker {
 public:
  void Start(absl::Time now) { start_ = now; }
  void StartEpoch() {
    epoch_loss_sum_ = 0;
    epoch_loss_count_ = 0;
  }
  void AddLoss(double loss);
  // Training samples of a finished optimizer step.
  void AddSamples(int64_t samples) { samples_ += samples; }
  bool has_epoch_loss() const { return epoch_loss_count_ > 0; }
  double epoch_mean_loss() const {
    return epoch_loss_count_ > 0 ? epoch_loss_sum_ / epoch_loss_count_ : 0;
  }
  TrainingProgress Progress(int64_t step, int64_t total_steps, int64_t epoch,
                            double test_accuracy, absl::Time now) const;

 private:
  static constexpr size_t kRecentLosses = 50;
  std::deque<double> recent_losses_;
  double epoch_loss_sum_ = 0;
  int64_t epoch_loss_count_ = 0;
  absl::Time start_;
  int64_t samples_ = 0;
};

// Copies a replica's counters into the StageMetrics a MetricsReport carries
// (everything but step_seconds, whose source differs by caller).
void FillStageMetrics(const StageReport& report, int stage, int rank,
                      apapo::v1::StageMetrics* metrics);

}  // namespace apapo::worker

#endif  // APAPO_WORKER_STAGE_OBSERVER_H_
