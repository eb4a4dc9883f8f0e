// Pipeline schedules: the single definition of which operation each pipeline
// stage replica performs next. The partitioner's simulator and the worker
// runtime both execute these programs, so a simulated and an executed
// timeline are comparable op by op.
//
// Thread-safety: all free functions are thread-safe. A StageProgram is a
// value type with mutable iteration state; use one instance per thread (the
// usual case: one per stage executor).
//
// Vocabulary (p stages, stage s is 0-based, stage s has R_s replicas):
//   * micro-batch: the unit that flows through the pipeline. Micro-batches
//     carry a *global* index j = 0, 1, 2, ... across iterations.
//   * iteration: m = micro_batches_per_iteration consecutive micro-batches
//     (j in [k*m, (k+1)*m) is iteration k). Gradients of one iteration are
//     accumulated and applied by exactly one kUpdate per stage replica.
//   * replica r of stage s processes the micro-batches with j % R_s == r
//     (round robin, as PipeDream). Its i-th *local* micro-batch is
//     j = i * R_s + r. When R_s does not divide m, replicas get floor or ceil
//     of m / R_s micro-batches of an iteration (possibly none). Every replica
//     still emits exactly one kUpdate per iteration, in iteration order: the
//     replicas all-reduce their accumulated gradients inside kUpdate (a
//     replica with no micro-batch contributes zeros) and therefore hold
//     identical weights.
//   * weight version: the number of kUpdate ops a stage replica has applied.
//     Version 0 is the initial weights; the k-th update (k = 1, 2, ...)
//     produces version k, at the end of iteration k-1.
//
// Data dependencies the executor must honour (the program order only fixes
// what one replica does; these say when an op may start):
//   * kForward(j) on stage s > 0 needs stage s-1's output of kForward(j).
//   * kBackward(j) on stage s < p-1 needs stage s+1's input-gradient of
//     kBackward(j); on the last stage it needs the loss of kForward(j), which
//     the same replica computed earlier in its own program.
//   * kUpdate on a replicated stage is a collective over the stage's replicas.
//
// Weight-version contract (weight stashing): every kForward op names the
// version it must use; the kBackward of the same micro-batch names the same
// version, so the runtime can check that a backward pass runs against exactly
// the weights its forward pass used. kUpdate names the version it produces.
//
// Schedules and when they update:
//   kAsync  APapo / PipeDream 1F1B with weight stashing and no flush. Replica
//           keeps at most d_s micro-batches in flight (d_s = InFlightDepth):
//           it warms up with d_s forwards, then alternates backward(i),
//           forward(i + d_s). Micro-batches of iteration k+1 enter before
//           iteration k has drained. A kUpdate follows the backward of the last
//           local micro-batch of each iteration (gradient accumulation over m
//           micro-batches; m = 1 is PipeDream's update-per-micro-batch). Each
//           forward uses the newest local version. With R_s = 1 and m = 1,
//           stage s stashes p-s versions and its gradients are p-s-1 updates
//           stale. `max_in_flight` bounds d_s and therefore the staleness.
//   k2BW    PipeDream-2BW: same op order as kAsync, but every micro-batch of
//           iteration k uses version max(0, k-1) on every stage, so at most two
//           versions live and the gradient applied by an update is 1 version
//           stale: W(k+1) = W(k) - lr * grad(W(k-1)). Requires d_s <= m / R_s.
//   kGPipe  per iteration: all forwards, all backwards, update. Flush: the next
//           iteration's forwards follow the update. Version k in iteration k.
//   k1F1BFlush  per iteration: 1F1B with warm-up min(d_s, m / R_s), drain,
//           update (PipeDream-flush / Megatron 1F1B). Version k in iteration k.
//   kDataParallel  one stage (num_stages == 1) whose replicas each run
//           forward, backward per local micro-batch and all-reduce in kUpdate.

#ifndef APAPO_PARTITIONER_SCHEDULE_H_
#define APAPO_PARTITIONER_SCHEDULE_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace apapo {
namespace schedule {

enum class ScheduleKind { kAsync, k2BW, kGPipe, k1F1BFlush, kDataParallel };

// Names accepted by ParseScheduleKind: "async", "2bw", "gpipe",
// "1f1b_flush", "dp".
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);
absl::string_view ScheduleKindName(ScheduleKind kind);
// True for schedules that never drain the pipeline between iterations.
bool IsAsynchronous(ScheduleKind kind);

struct Op {
  enum Type { kForward, kBackward, kUpdate };
  Type type = kForward;
  // kForward / kBackward: global micro-batch index. kUpdate: global index of
  // the last micro-batch of the iteration whose gradients it applies.
  int64_t micro_batch = 0;
  // kForward: version to run with. kBackward: version its forward used.
  // kUpdate: version produced (1 for the first update).
  int64_t weight_version = 0;

  bool operator==(const Op& other) const {
    return type == other.type && micro_batch == other.micro_batch &&
           weight_version == other.weight_version;
  }
  // "F3@v1", "B3@v1", "U7->v2".
  std::string ToString() const;
};

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::kAsync;
  int num_stages = 1;  // p
  // R_s per stage; empty means one replica everywhere. Size num_stages.
  std::vector<int> replicas;
  int micro_batches_per_iteration = 1;  // m
  int64_t num_iterations = 1;
  // Upper bound on micro-batches a replica keeps in flight (forward done,
  // backward not). 0: the schedule's default (see InFlightDepth).
  int max_in_flight = 0;

  int Replicas(int stage) const {
    return replicas.empty() ? 1 : replicas[stage];
  }
};

// Checks ranges (p >= 1, m >= 1, R_s >= 1, iterations >= 0, dp has one
// stage, synchronous schedules have R_s <= m, 2bw has d_s <= m / R_s).
absl::Status ValidateScheduleOptions(const ScheduleOptions& options);

// The micro-batch count m a job gets when its spec leaves it unset: at least
// one micro-batch per replica of every stage; 4 x stages for the flush
// schedules (kGPipe, k1F1BFlush), whose bubble shrinks with m; enough to
// cover the in-flight depth for k2BW; and 1 for kAsync without replication,
// which fills the pipeline with the next iterations instead of smaller
// micro-batches (smaller GEMMs cost throughput: an mlp step of 128 samples
// ran at 502 samples/s as 4 x 32 and 780 as 1 x 128 on one core here). When
// `batch_size` > 0 the result is the smallest divisor of it that is at least
// that need (the need itself if none is).
int DefaultMicroBatches(ScheduleKind kind, const std::vector<int>& replicas,
                        int64_t batch_size);

// Warm-up depth d_s: micro-batches one replica of `stage` keeps in flight in
// steady state. Default (PipeDream's NOAM): ceil(sum_{t>=s} R_t / R_s), which
// is p - s without replication; bounded by max_in_flight when set. For
// kGPipe it is ceil(m / R_s); for k1F1BFlush and kDataParallel
// min(d_s, ceil(m / R_s)).
int InFlightDepth(const ScheduleOptions& options, int stage);

// Generates one stage replica's op sequence lazily.
//
//   auto program = StageProgram::Create(options, stage, replica);
//   Op op;
//   while (program->Next(&op)) Execute(op);
class StageProgram {
 public:
  static absl::StatusOr<StageProgram> Create(const ScheduleOptions& options,
                                             int stage, int replica);

  // Writes the next op and returns true, or returns false when the program
  // (num_iterations iterations) is complete.
  bool Next(Op* op);

  int stage() const { return stage_; }
  int replica() const { return replica_; }
  int in_flight_depth() const { return depth_; }
  // Local micro-batches this replica processes per iteration when R_s
  // divides m (floor(m / R_s) otherwise).
  int local_per_iteration() const { return local_per_iteration_; }

 private:
  StageProgram(const ScheduleOptions& options, int stage, int replica);
  void Refill();
  void PushForward(int64_t local);
  void PushBackward(int64_t local);
  // Emits the updates of every iteration before `iteration` not yet emitted.
  void PushUpdatesBefore(int64_t iteration);
  int64_t FirstLocal(int64_t iteration) const;
  int64_t Global(int64_t local) const { return local * replicas_ + replica_; }
  int64_t Iteration(int64_t local) const { return Global(local) / m_; }

  ScheduleKind kind_;
  int stage_;
  int replica_;
  int replicas_;
  int depth_;
  int local_per_iteration_;
  int64_t m_;
  int64_t iterations_;
  int64_t total_local_ = 0;  // local micro-batches over all iterations

  // Generation state.
  int64_t step_ = 0;  // no-flush: next backward; flush: next iteration
  bool warmed_up_ = false;   // no-flush only
  int64_t version_ = 0;      // updates generated so far
  std::deque<int64_t> stash_;  // versions of forwards not yet backwarded
  std::deque<Op> queue_;
};

// What one stage replica's program needs, measured by running it.
struct StageScheduleStats {
  // Distinct weight versions alive at once: those referenced by in-flight
  // micro-batches plus the newest one.
  int weight_versions = 1;
  // Max over backwards of (newest version at the backward) - (version used).
  int64_t max_staleness = 0;
  // Max micro-batches whose activations are held (forward done, backward not).
  int max_activations_in_flight = 0;
};

// Runs replica 0 of `stage` for enough iterations to reach steady state
// (options.num_iterations is ignored) and reports its needs.
absl::StatusOr<StageScheduleStats> AnalyzeStage(const ScheduleOptions& options,
                                                int stage);

}  // namespace schedule
}  // namespace apapo

#endif  // APAPO_PARTITIONER_SCHEDULE_H_
