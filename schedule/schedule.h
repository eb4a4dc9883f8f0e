// Pipeline schedules: the single definition of which operation each pipeline
// stage replica performs next, communication included. The partitioner's
// simulator and the worker runtime both execute these programs, so a
// simulated and an executed timeline are comparable op by op, and the
// runtime derives no transfer of its own: every receive it posts, every
// send and every all-reduce is an op of the program.
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
// Communication ops (peer = the replica index of the neighbour stage; the
// runtime maps (stage, replica) to a rank):
//   kRecvActivations(j, r)  posts the receive of micro-batch j's input
//       bundle from stage s-1 replica r (= j mod R_{s-1}); non-blocking. The
//       kForward(j) that follows consumes it (waiting if it has not arrived).
//   kSendActivations(j, r)  right after kForward(j): its output bundle to
//       stage s+1 replica j mod R_{s+1} (enqueued; sent on comm threads).
//   kRecvGradients(j, r)    posts the receive of j's output gradients from
//       stage s+1; consumed by kBackward(j).
//   kSendGradients(j, r)    right after kBackward(j): its input gradients to
//       stage s-1.
//   kAllReduce(v)           right before kUpdate(v) on a replicated stage:
//       sums the accumulated gradients over the stage's replicas.
//   kFlush                  last op of a program that sends: waits until
//       every send has completed (a phase boundary drains the pipeline).
//   kReduceResult           evaluation programs only, on every replica of
//       every stage: sums the evaluation's counts over all ranks, so every
//       rank learns the accuracy (and whether the job reached its target).
// Receives are posted `recv_lookahead` consuming ops ahead, in the order
// their sender sends them (increasing j per peer), so the bytes of later
// micro-batches land while the stage computes.
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

#ifndef APAPO_SCHEDULE_SCHEDULE_H_
#define APAPO_SCHEDULE_SCHEDULE_H_

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
  enum Type {
    // Compute.
    kForward,
    kBackward,
    kUpdate,
    // Communication (see above).
    kRecvActivations,
    kSendActivations,
    kRecvGradients,
    kSendGradients,
    kAllReduce,
    kFlush,
    kReduceResult,
  };
  Type type = kForward;
  // kForward / kBackward and the transfers of their tensors: global
  // micro-batch index (evaluation: the test batch). kUpdate / kAllReduce:
  // global index of the last micro-batch of the iteration whose gradients
  // they apply.
  int64_t micro_batch = 0;
  // kForward: version to run with. kBackward: version its forward used.
  // kUpdate / kAllReduce: version produced (1 for the first update).
  int64_t weight_version = 0;
  // Transfers: the neighbour stage's replica index; -1 otherwise.
  int peer = -1;

  bool IsCompute() const {
    return type == kForward || type == kBackward || type == kUpdate;
  }
  bool operator==(const Op& other) const {
    return type == other.type && micro_batch == other.micro_batch &&
           weight_version == other.weight_version && peer == other.peer;
  }
  // "F3@v1", "B3@v1", "U7->v2"; "RA3<0", "SA3>1", "RG3<0", "SG3>0",
  // "AR7->v2", "FL", "RR".
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
  // kAsync only: per stage, the in-flight depth d_s replacing the default
  // (0 keeps it), e.g. deeper than PipeDream's NOAM so that a slow link's
  // transfer round trip is covered by other micro-batches' compute. Still
  // bounded by max_in_flight. Empty, or one entry per stage.
  std::vector<int> in_flight_depth;
  // Receives posted ahead: a program posts the receive of an op's input
  // when it is at most this many receiving ops ahead of the op (>= 1).
  int recv_lookahead = 16;

  int Replicas(int stage) const {
    return replicas.empty() ? 1 : replicas[stage];
  }
};

// Global rank of replica `replica` of `stage`: stage-major (stage 0's
// replicas first), the numbering every process group of a job uses.
int RankOf(const ScheduleOptions& options, int stage, int replica);

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
// is p - s without replication; for kAsync, in_flight_depth[stage] instead
// when set; bounded by max_in_flight when set. For
// kGPipe it is ceil(m / R_s); for k1F1BFlush and kDataParallel
// min(d_s, ceil(m / R_s)).
int InFlightDepth(const ScheduleOptions& options, int stage);

// k, the micro-batches of each iteration that the replica of the most
// replicated stage runs: max(1, micro_batches / the most replicas of a
// stage), with `replicas` per stage (empty: one each).
int MicroBatchesPerReplica(int micro_batches, const std::vector<int>& replicas);

// The in-flight bound (ScheduleOptions::max_in_flight) that keeps every
// stage's gradient delay within `max_staleness` updates (< 0: no bound, 0
// returned) with `micro_batches` per iteration and `replicas` per stage:
// max_staleness x k + 1, k = MicroBatchesPerReplica. A replica that runs k micro-batches of each
// iteration and keeps d in flight computes on weights ceil((d - 1) / k)
// updates old: whole mini-batches (k = 1) give PipeDream's d - 1, and
// smaller micro-batches let a stage keep more in flight (to hide a slow
// link's round trips) at the same staleness.
int MaxInFlightForStaleness(int max_staleness, int micro_batches,
                            const std::vector<int>& replicas);

// The gradient delay, in updates, of a replica that runs k micro-batches of
// each iteration and keeps `depth` in flight: ceil((depth - 1) / k), the
// inverse of MaxInFlightForStaleness.
int StalenessAtDepth(int depth, int k);

// Generates one stage replica's op sequence lazily.
//
//   auto program = StageProgram::Create(options, stage, replica);
//   Op op;
//   while (program->Next(&op)) Execute(op);
class StageProgram {
 public:
  // The training program of num_iterations iterations.
  static absl::StatusOr<StageProgram> Create(const ScheduleOptions& options,
                                             int stage, int replica);
  // The forward-only evaluation program over `batches` test batches:
  // replica 0 of every stage runs kForward(b) (with its transfers) for
  // b = 0 .. batches-1 on the newest weights (weight_version 0, relative to
  // the version at the program's start); then every replica runs
  // kReduceResult. Other replicas run only kReduceResult.
  static absl::StatusOr<StageProgram> CreateEvaluation(
      const ScheduleOptions& options, int stage, int replica, int64_t batches);

  // Writes the next op and returns true, or returns false when the program
  // is complete.
  bool Next(Op* op);

  int stage() const { return stage_; }
  int replica() const { return replica_; }
  int in_flight_depth() const { return depth_; }
  // Local micro-batches this replica processes per iteration when R_s
  // divides m (floor(m / R_s) otherwise).
  int local_per_iteration() const { return local_per_iteration_; }

 private:
  StageProgram(const ScheduleOptions& options, int stage, int replica);
  // The compute ops alone (the schedule proper).
  bool NextCompute(Op* op);
  // Appends the receive a compute op consumes, if any, to out_.
  void PushReceiveFor(const Op& compute);
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
  // Neighbour stages' replica counts (0: no such neighbour).
  int prev_replicas_ = 0;
  int next_replicas_ = 0;
  int recv_lookahead_ = 16;
  bool evaluation_ = false;
  int64_t eval_batches_ = 0;
  int64_t eval_next_ = 0;  // next batch to generate
  bool eval_reduced_ = false;

  // Generation state.
  int64_t step_ = 0;  // no-flush: next backward; flush: next iteration
  bool warmed_up_ = false;   // no-flush only
  int64_t version_ = 0;      // updates generated so far
  std::deque<int64_t> stash_;  // versions of forwards not yet backwarded
  std::deque<Op> queue_;       // compute ops generated, not yet windowed
  // Compute ops whose receives are posted, not yet emitted, and how many of
  // them receive.
  std::deque<Op> window_;
  int window_receives_ = 0;
  std::deque<Op> out_;  // ops ready to emit, in order
  bool sends_ = false;  // the program has emitted a send
  bool done_ = false;
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

#endif  // APAPO_SCHEDULE_SCHEDULE_H_
