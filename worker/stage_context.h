// StageContext: what the parts of one stage replica's executor (the op loop
// in stage_executor.cc, the Evaluator) share, fixed when the executor is
// created, and the conventions they share: message tags, ranks, labelled
// errors. Internal to the stage executor's parts.
//
// Thread-safety: immutable after creation (the pointees are not: they are
// used from the executor's one compute thread).
#ifndef APAPO_WORKER_STAGE_CONTEXT_H_
#define APAPO_WORKER_STAGE_CONTEXT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "schedule/schedule.h"
#include "worker/model_builder.h"
#include "worker/model_graph.h"
#include "worker/transport.h"

namespace apapo::worker {

struct StageContext {
  schedule::ScheduleOptions schedule;
  int stage = 0;
  int replica = 0;
  int rank = 0;
  const StageLayout* layout = nullptr;
  StageModel* model = nullptr;
  Transport* transport = nullptr;  // null for a world of one
  std::string label;               // "stage 1 replica 0 (rank 1)"

  // Global rank of (stage, replica) of this job.
  int RankOf(int s, int r) const { return schedule::RankOf(schedule, s, r); }
  // The transport group of every rank (after the stages' replica groups).
  int world_group() const { return schedule.num_stages; }
  bool first() const { return layout->is_first; }
  bool last() const { return layout->is_last; }

  // `cause` prefixed with the label and `what`, unless it already names
  // this replica (the transport's errors do).
  absl::Status Fail(absl::string_view what, const absl::Status& cause) const {
    if (absl::StrContains(cause.message(), label)) return cause;
    return absl::Status(cause.code(),
                        absl::StrCat(label, ": ", what, ": ", cause.message()));
  }
};

// The tag of micro-batch (or test batch) `index`'s messages in the
// executor's `phase`-th program: 64 phases x 2^24 indices fit Gloo's 32-bit
// tag, and a message of one program can never match another's.
inline int64_t MessageTag(int64_t phase, int64_t index) {
  return (phase % 64) * (int64_t{1} << 24) + (index % (int64_t{1} << 24));
}

}  // namespace apapo::worker

#endif  // APAPO_WORKER_STAGE_CONTEXT_H_
