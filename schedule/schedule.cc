#include "schedule/schedule.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace apapo {
namespace schedule {

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "async") return ScheduleKind::kAsync;
  if (lower == "2bw") return ScheduleKind::k2BW;
  if (lower == "gpipe") return ScheduleKind::kGPipe;
  if (lower == "1f1b_flush") return ScheduleKind::k1F1BFlush;
  if (lower == "dp") return ScheduleKind::kDataParallel;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule '", name,
                   "' (expected async, 2bw, gpipe, 1f1b_flush or dp)"));
}

absl::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kAsync:
      return "async";
    case ScheduleKind::k2BW:
      return "2bw";
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1BFlush:
      return "1f1b_flush";
    case ScheduleKind::kDataParallel:
      return "dp";
  }
  return "unknown";
}

bool IsAsynchronous(ScheduleKind kind) {
  return kind == ScheduleKind::kAsync || kind == ScheduleKind::k2BW;
}

std::string Op::ToString() const {
  switch (type) {
    case kForward:
      return absl::StrCat("F", micro_batch, "@v", weight_version);
    case kBackward:
      return absl::StrCat("B", micro_batch, "@v", weight_version);
    case kUpdate:
      return absl::StrCat("U", micro_batch, "->v", weight_version);
    case kRecvActivations:
      return absl::StrCat("RA", micro_batch, "<", peer);
    case kSendActivations:
      return absl::StrCat("SA", micro_batch, ">", peer);
    case kRecvGradients:
      return absl::StrCat("RG", micro_batch, "<", peer);
    case kSendGradients:
      return absl::StrCat("SG", micro_batch, ">", peer);
    case kAllReduce:
      return absl::StrCat("AR", micro_batch, "->v", weight_version);
    case kFlush:
      return "FL";
    case kReduceResult:
      return "RR";
  }
  return "?";
}

namespace {

// PipeDream's NOAM: workers from this stage to the end, per replica, rounded up.
int DefaultDepth(const ScheduleOptions& options, int stage) {
  int64_t downstream = 0;
  for (int t = stage; t < options.num_stages; ++t) {
    downstream += options.Replicas(t);
  }
  const int r = options.Replicas(stage);
  return static_cast<int>((downstream + r - 1) / r);
}

}  // namespace

int InFlightDepth(const ScheduleOptions& options, int stage) {
  const int r = std::max(1, options.Replicas(stage));
  // Most local micro-batches one replica gets in an iteration.
  const int local = (options.micro_batches_per_iteration + r - 1) / r;
  if (options.kind == ScheduleKind::kGPipe) return std::max(1, local);
  int depth = DefaultDepth(options, stage);
  if (options.kind == ScheduleKind::kAsync &&
      stage < static_cast<int>(options.in_flight_depth.size()) &&
      options.in_flight_depth[stage] > 0) {
    depth = options.in_flight_depth[stage];
  }
  if (options.max_in_flight > 0) depth = std::min(depth, options.max_in_flight);
  if (options.kind == ScheduleKind::k1F1BFlush ||
      options.kind == ScheduleKind::kDataParallel) {
    depth = std::min(depth, local);
  }
  return std::max(1, depth);
}

int DefaultMicroBatches(ScheduleKind kind, const std::vector<int>& replicas,
                        int64_t batch_size) {
  int64_t need = 1;
  for (int r : replicas) need = std::max<int64_t>(need, r);
  const int64_t p = std::max<int64_t>(1, replicas.size());
  if (kind == ScheduleKind::kGPipe || kind == ScheduleKind::k1F1BFlush) {
    need = std::max<int64_t>(need, 4 * p);
  } else if (kind == ScheduleKind::k2BW) {
    // floor(m / R_s) must cover stage s's in-flight depth.
    int64_t downstream = 0;
    for (int64_t s = p - 1; s >= 0 && s < static_cast<int64_t>(replicas.size());
         --s) {
      downstream += replicas[s];
      const int64_t depth = (downstream + replicas[s] - 1) / replicas[s];
      need = std::max(need, depth * replicas[s]);
    }
  }
  need = std::min<int64_t>(need, 1 << 20);
  if (batch_size > 0) {
    for (int64_t m = need; m <= batch_size; ++m) {
      if (batch_size % m == 0) return static_cast<int>(m);
    }
  }
  return static_cast<int>(need);
}

int MicroBatchesPerReplica(int micro_batches, const std::vector<int>& replicas) {
  int most = 1;
  for (int r : replicas) most = std::max(most, r);
  return std::max(1, micro_batches / most);
}

int MaxInFlightForStaleness(int max_staleness, int micro_batches,
                            const std::vector<int>& replicas) {
  if (max_staleness < 0) return 0;
  const int64_t local = MicroBatchesPerReplica(micro_batches, replicas);
  return static_cast<int>(
      std::min<int64_t>(int64_t{max_staleness} * local + 1, int64_t{1} << 20));
}

int StalenessAtDepth(int depth, int k) {
  k = std::max(1, k);
  return depth <= 1 ? 0 : (depth - 2) / k + 1;
}

int RankOf(const ScheduleOptions& options, int stage, int replica) {
  int rank = 0;
  for (int s = 0; s < stage; ++s) rank += options.Replicas(s);
  return rank + replica;
}

absl::Status ValidateScheduleOptions(const ScheduleOptions& options) {
  if (options.num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages must be >= 1, got ", options.num_stages));
  }
  if (options.micro_batches_per_iteration < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batches_per_iteration must be >= 1, got ",
                     options.micro_batches_per_iteration));
  }
  if (options.num_iterations < 0) {
    return absl::InvalidArgumentError("num_iterations must be >= 0");
  }
  if (options.max_in_flight < 0) {
    return absl::InvalidArgumentError("max_in_flight must be >= 0");
  }
  if (options.recv_lookahead < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recv_lookahead must be >= 1, got ", options.recv_lookahead));
  }
  if (!options.replicas.empty() &&
      static_cast<int>(options.replicas.size()) != options.num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas has ", options.replicas.size(),
                     " entries for ", options.num_stages, " stages"));
  }
  if (!options.in_flight_depth.empty()) {
    if (static_cast<int>(options.in_flight_depth.size()) != options.num_stages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "in_flight_depth has ", options.in_flight_depth.size(),
          " entries for ", options.num_stages, " stages"));
    }
    for (int s = 0; s < options.num_stages; ++s) {
      const int d = options.in_flight_depth[s];
      if (d < 0 || (d > 0 && options.kind != ScheduleKind::kAsync)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "in_flight_depth[", s, "] = ", d,
            d < 0 ? ": must be >= 0" : ": only the async schedule takes one"));
      }
    }
  }
  if (options.kind == ScheduleKind::kDataParallel && options.num_stages != 1) {
    return absl::InvalidArgumentError(
        "schedule dp runs exactly one (replicated) stage");
  }
  for (int s = 0; s < options.num_stages; ++s) {
    const int r = options.Replicas(s);
    if (r < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", s, " has ", r, " replicas"));
    }
    if (r > options.micro_batches_per_iteration &&
        options.kind != ScheduleKind::kAsync) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", s, " has ", r, " replicas but an iteration only ",
          options.micro_batches_per_iteration, " micro-batches"));
    }
    if (options.kind == ScheduleKind::k2BW &&
        InFlightDepth(options, s) > options.micro_batches_per_iteration / r) {
      return absl::InvalidArgumentError(absl::StrCat(
          "2bw needs at least as many micro-batches per iteration per replica "
          "as in flight: stage ",
          s, " keeps ", InFlightDepth(options, s), " in flight but gets ",
          options.micro_batches_per_iteration / r,
          " per iteration (raise micro_batches_per_iteration or set "
          "max_in_flight)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StageProgram> StageProgram::Create(
    const ScheduleOptions& options, int stage, int replica) {
  if (absl::Status s = ValidateScheduleOptions(options); !s.ok()) return s;
  if (stage < 0 || stage >= options.num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", stage, " out of range [0, ", options.num_stages, ")"));
  }
  if (replica < 0 || replica >= options.Replicas(stage)) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica ", replica, " out of range [0, ",
                     options.Replicas(stage), ") for stage ", stage));
  }
  return StageProgram(options, stage, replica);
}

absl::StatusOr<StageProgram> StageProgram::CreateEvaluation(
    const ScheduleOptions& options, int stage, int replica, int64_t batches) {
  if (batches < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluation batches must be >= 0, got ", batches));
  }
  absl::StatusOr<StageProgram> program = Create(options, stage, replica);
  if (!program.ok()) return program.status();
  program->evaluation_ = true;
  program->eval_batches_ = batches;
  return program;
}

StageProgram::StageProgram(const ScheduleOptions& options, int stage,
                           int replica)
    : kind_(options.kind),
      stage_(stage),
      replica_(replica),
      replicas_(options.Replicas(stage)),
      depth_(InFlightDepth(options, stage)),
      local_per_iteration_(options.micro_batches_per_iteration /
                           options.Replicas(stage)),
      m_(options.micro_batches_per_iteration),
      iterations_(options.num_iterations) {
  if (stage > 0) prev_replicas_ = options.Replicas(stage - 1);
  if (stage + 1 < options.num_stages) next_replicas_ = options.Replicas(stage + 1);
  recv_lookahead_ = std::max(1, options.recv_lookahead);
  const int64_t total_global = m_ * iterations_;
  total_local_ = total_global > replica_
                     ? (total_global - replica_ + replicas_ - 1) / replicas_
                     : 0;
}

int64_t StageProgram::FirstLocal(int64_t iteration) const {
  // Smallest local i with i * R + r >= iteration * m.
  const int64_t g = iteration * m_ - replica_;
  return g <= 0 ? 0 : (g + replicas_ - 1) / replicas_;
}

void StageProgram::PushUpdatesBefore(int64_t iteration) {
  while (version_ < iteration) {
    ++version_;
    queue_.push_back(Op{Op::kUpdate, version_ * m_ - 1, version_});
  }
}

void StageProgram::PushForward(int64_t local) {
  int64_t version = version_;
  if (kind_ == ScheduleKind::k2BW) {
    // Iteration k uses version k-1 (the version before the newest).
    version = std::max<int64_t>(0, Iteration(local) - 1);
  }
  stash_.push_back(version);
  queue_.push_back(Op{Op::kForward, Global(local), version});
}

void StageProgram::PushBackward(int64_t local) {
  // Backwards retire in forward order in every schedule, so the stash is FIFO.
  const int64_t iteration = Iteration(local);
  if (IsAsynchronous(kind_)) PushUpdatesBefore(iteration);
  const int64_t version = stash_.front();
  stash_.pop_front();
  queue_.push_back(Op{Op::kBackward, Global(local), version});
  if (IsAsynchronous(kind_) &&
      (local + 1 >= total_local_ || Iteration(local + 1) > iteration)) {
    // Last local micro-batch of its iteration: the iteration's update.
    PushUpdatesBefore(iteration + 1);
  }
}

void StageProgram::Refill() {
  if (evaluation_) {
    // Forward-only, through replica 0 of every stage.
    if (replica_ == 0 && eval_next_ < eval_batches_) {
      queue_.push_back(Op{Op::kForward, eval_next_++, 0});
    }
    return;
  }
  if (IsAsynchronous(kind_)) {
    if (!warmed_up_) {
      warmed_up_ = true;
      for (int64_t i = 0; i < std::min<int64_t>(depth_, total_local_); ++i) {
        PushForward(i);
      }
      if (total_local_ == 0) PushUpdatesBefore(iterations_);
      return;
    }
    if (step_ >= total_local_) return;
    PushBackward(step_);
    if (step_ + depth_ < total_local_) PushForward(step_ + depth_);
    ++step_;
    // Iterations this replica has no micro-batch in still need its update.
    if (step_ >= total_local_) PushUpdatesBefore(iterations_);
    return;
  }
  // Flush schedules: one whole iteration at a time.
  if (step_ >= iterations_) return;
  const int64_t base = FirstLocal(step_);
  const int64_t n = std::min(FirstLocal(step_ + 1), total_local_) - base;
  if (kind_ == ScheduleKind::kGPipe) {
    for (int64_t i = 0; i < n; ++i) PushForward(base + i);
    for (int64_t i = 0; i < n; ++i) PushBackward(base + i);
  } else {
    const int64_t warm = std::min<int64_t>(depth_, n);
    for (int64_t i = 0; i < warm; ++i) PushForward(base + i);
    for (int64_t i = 0; i < n; ++i) {
      PushBackward(base + i);
      if (i + warm < n) PushForward(base + i + warm);
    }
  }
  ++step_;
  PushUpdatesBefore(step_);
}

bool StageProgram::NextCompute(Op* op) {
  if (queue_.empty()) Refill();
  if (queue_.empty()) return false;
  *op = queue_.front();
  queue_.pop_front();
  return true;
}

namespace {

// The neighbour replica micro-batch j travels to or from: round robin, and
// replica 0 alone during evaluation.
int PeerOf(int64_t j, int replicas, bool evaluation) {
  return evaluation ? 0 : static_cast<int>(j % replicas);
}

bool Receives(const Op& op, int prev_replicas, int next_replicas) {
  return (op.type == Op::kForward && prev_replicas > 0) ||
         (op.type == Op::kBackward && next_replicas > 0);
}

}  // namespace

void StageProgram::PushReceiveFor(const Op& c) {
  if (c.type == Op::kForward && prev_replicas_ > 0) {
    out_.push_back(Op{Op::kRecvActivations, c.micro_batch, 0,
                      PeerOf(c.micro_batch, prev_replicas_, evaluation_)});
  } else if (c.type == Op::kBackward && next_replicas_ > 0) {
    out_.push_back(Op{Op::kRecvGradients, c.micro_batch, 0,
                      PeerOf(c.micro_batch, next_replicas_, evaluation_)});
  }
}

bool StageProgram::Next(Op* op) {
  // A window far longer than any warm-up bounds a stage that never receives.
  const size_t max_window = 8 * static_cast<size_t>(recv_lookahead_) + 64;
  while (out_.empty() && !done_) {
    // Post the receives of the next `recv_lookahead_` receiving ops.
    Op c;
    while (window_receives_ < recv_lookahead_ && window_.size() < max_window &&
           NextCompute(&c)) {
      if (Receives(c, prev_replicas_, next_replicas_)) {
        PushReceiveFor(c);
        ++window_receives_;
      }
      window_.push_back(c);
    }
    if (window_.empty()) {
      // The end: drain the sends, then (evaluation) share the result.
      if (sends_) out_.push_back(Op{Op::kFlush, 0, 0});
      if (evaluation_) out_.push_back(Op{Op::kReduceResult, 0, 0});
      done_ = true;
      break;
    }
    c = window_.front();
    window_.pop_front();
    if (Receives(c, prev_replicas_, next_replicas_)) --window_receives_;
    if (c.type == Op::kUpdate && replicas_ > 1) {
      out_.push_back(Op{Op::kAllReduce, c.micro_batch, c.weight_version});
    }
    out_.push_back(c);
    if (c.type == Op::kForward && next_replicas_ > 0) {
      out_.push_back(Op{Op::kSendActivations, c.micro_batch, 0,
                        PeerOf(c.micro_batch, next_replicas_, evaluation_)});
      sends_ = true;
    } else if (c.type == Op::kBackward && prev_replicas_ > 0) {
      out_.push_back(Op{Op::kSendGradients, c.micro_batch, 0,
                        PeerOf(c.micro_batch, prev_replicas_, evaluation_)});
      sends_ = true;
    }
  }
  if (out_.empty()) return false;
  *op = out_.front();
  out_.pop_front();
  return true;
}

absl::StatusOr<StageScheduleStats> AnalyzeStage(const ScheduleOptions& options,
                                                int stage) {
  ScheduleOptions run = options;
  // Enough iterations for the deepest warm-up to reach steady state twice.
  const int local = std::max(
      1, options.micro_batches_per_iteration /
             std::max(1, options.Replicas(std::max(0, stage))));
  const int64_t depth = std::max(1, InFlightDepth(options, std::max(0, stage)));
  run.num_iterations = 4 + (2 * depth + local - 1) / local;
  absl::StatusOr<StageProgram> program = StageProgram::Create(run, stage, 0);
  if (!program.ok()) return program.status();

  StageScheduleStats stats;
  std::multiset<int64_t> live;  // versions of in-flight micro-batches
  int64_t newest = 0;
  Op op;
  while (program->Next(&op)) {
    if (!op.IsCompute()) continue;
    switch (op.type) {
      case Op::kForward: {
        live.insert(op.weight_version);
        stats.max_activations_in_flight = std::max(
            stats.max_activations_in_flight, static_cast<int>(live.size()));
        std::set<int64_t> distinct(live.begin(), live.end());
        distinct.insert(newest);
        stats.weight_versions =
            std::max(stats.weight_versions, static_cast<int>(distinct.size()));
        break;
      }
      case Op::kBackward:
        stats.max_staleness =
            std::max(stats.max_staleness, newest - op.weight_version);
        live.erase(live.find(op.weight_version));
        break;
      case Op::kUpdate: {
        newest = op.weight_version;
        std::set<int64_t> distinct(live.begin(), live.end());
        distinct.insert(newest);
        stats.weight_versions =
            std::max(stats.weight_versions, static_cast<int>(distinct.size()));
        break;
      }
      default:
        break;
    }
  }
  return stats;
}

}  // namespace schedule
}  // namespace apapo
