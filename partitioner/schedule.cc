#include "partitioner/schedule.h"

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
  const int local = options.micro_batches_per_iteration /
                    std::max(1, options.Replicas(stage));
  if (options.kind == ScheduleKind::kGPipe) return std::max(1, local);
  int depth = DefaultDepth(options, stage);
  if (options.max_in_flight > 0) depth = std::min(depth, options.max_in_flight);
  if (options.kind == ScheduleKind::k1F1BFlush ||
      options.kind == ScheduleKind::kDataParallel) {
    depth = std::min(depth, local);
  }
  return std::max(1, depth);
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
  if (!options.replicas.empty() &&
      static_cast<int>(options.replicas.size()) != options.num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas has ", options.replicas.size(),
                     " entries for ", options.num_stages, " stages"));
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
    if (options.micro_batches_per_iteration % r != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "micro_batches_per_iteration (", options.micro_batches_per_iteration,
          ") must be a multiple of stage ", s, "'s replica count (", r, ")"));
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

StageProgram::StageProgram(const ScheduleOptions& options, int stage,
                           int replica)
    : kind_(options.kind),
      stage_(stage),
      replica_(replica),
      replicas_(options.Replicas(stage)),
      depth_(InFlightDepth(options, stage)),
      local_per_iteration_(options.micro_batches_per_iteration /
                           options.Replicas(stage)),
      total_local_(options.num_iterations * local_per_iteration_) {}

void StageProgram::PushForward(int64_t local) {
  int64_t version = version_;
  if (kind_ == ScheduleKind::k2BW) {
    // Iteration k uses version k-1 (the version before the newest).
    version = std::max<int64_t>(0, local / local_per_iteration_ - 1);
  }
  stash_.push_back(version);
  queue_.push_back(Op{Op::kForward, Global(local), version});
}

void StageProgram::PushBackward(int64_t local) {
  // Backwards retire in forward order in every schedule, so the stash is FIFO.
  const int64_t version = stash_.front();
  stash_.pop_front();
  queue_.push_back(Op{Op::kBackward, Global(local), version});
  if ((local + 1) % local_per_iteration_ == 0) {
    ++version_;
    // The update names the iteration's last global micro-batch.
    const int64_t iteration = local / local_per_iteration_;
    const int64_t replicas = replicas_;
    const int64_t m = local_per_iteration_ * replicas;
    queue_.push_back(Op{Op::kUpdate, iteration * m + m - 1, version_});
  }
}

void StageProgram::Refill() {
  if (IsAsynchronous(kind_)) {
    if (!warmed_up_) {
      warmed_up_ = true;
      for (int64_t i = 0; i < std::min<int64_t>(depth_, total_local_); ++i) {
        PushForward(i);
      }
      return;
    }
    if (step_ >= total_local_) return;
    PushBackward(step_);
    if (step_ + depth_ < total_local_) PushForward(step_ + depth_);
    ++step_;
    return;
  }
  // Flush schedules: one whole iteration at a time.
  const int64_t iterations = total_local_ / std::max(1, local_per_iteration_);
  if (step_ >= iterations) return;
  const int64_t base = step_ * local_per_iteration_;
  const int64_t n = local_per_iteration_;
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
}

bool StageProgram::Next(Op* op) {
  if (queue_.empty()) Refill();
  if (queue_.empty()) return false;
  *op = queue_.front();
  queue_.pop_front();
  return true;
}

absl::StatusOr<StageScheduleStats> AnalyzeStage(const ScheduleOptions& options,
                                                int stage) {
  ScheduleOptions run = options;
  // Enough iterations for the deepest warm-up to reach steady state twice.
  const int local = options.micro_batches_per_iteration /
                    std::max(1, options.Replicas(std::max(0, stage)));
  const int64_t depth = std::max(1, InFlightDepth(options, std::max(0, stage)));
  run.num_iterations = 4 + (2 * depth + local - 1) / std::max(1, local);
  absl::StatusOr<StageProgram> program = StageProgram::Create(run, stage, 0);
  if (!program.ok()) return program.status();

  StageScheduleStats stats;
  std::multiset<int64_t> live;  // versions of in-flight micro-batches
  int64_t newest = 0;
  Op op;
  while (program->Next(&op)) {
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
    }
  }
  return stats;
}

}  // namespace schedule
}  // namespace apapo
