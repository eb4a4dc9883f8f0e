// Measures a job's model on this worker for the coordinator's planner: per
// layer node, the forward and backward time, the output activation bytes and
// the parameter bytes, as a ModelProfile whose node ids and edges are exactly
// the job's ModelGraph (so the planner's stages name nodes RunAssignment can
// find).
//
// Method: every node of the AnalyzedGraph becomes a one-node StageModel (the
// graph laid out as one stage per node), the nodes run in topological order
// on a synthetic micro-batch of spec.data.batch_size / micro_batches samples,
// and each node is timed on its own: forward, then backward through autograd
// from that node's output with a ones-like gradient (to its parameters and
// floating-point inputs). One warm-up pass, then `iterations` timed passes,
// averaged. The profile is expressed per mini-batch, as ModelProfile
// documents: batch_size = spec.data.batch_size, seconds and activation bytes
// are the micro-batch figures times the number of micro-batches (the
// runtime executes micro-batches, so this is the cost it will see).
//
// Thread-safety: ProfileJob is reentrant; it sets the calling thread's
// LibTorch intra-op thread count when ProfileOptions.threads > 0.
#ifndef APAPO_WORKER_DAEMON_PROFILER_H_
#define APAPO_WORKER_DAEMON_PROFILER_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "proto/apapo/v1/worker.pb.h"
#include "worker/daemon/memory.h"

namespace apapo::worker {

struct ProfileOptions {
  // LibTorch intra-op threads to measure with (the training child's count);
  // 0 leaves the current setting.
  int threads = 0;
  // Memory reported in WorkerResources when the spec sets none; 0 reads
  // MemAvailable from /proc/meminfo.
  int64_t memory_bytes = 0;
  // Polled between nodes; true makes ProfileJob return CANCELLED.
  std::function<bool()> cancelled;
};

// Profiles `command.spec`'s model with `command.iterations` timed passes
// (3 when <= 0). WorkerResources.relative_speed is left 0 (the coordinator
// derives it); memory_bytes is spec.resources.memory_per_worker_bytes, else
// options.memory_bytes, else AvailableMemoryBytes() (memory.h: MemAvailable
// within the cgroup's limit). Links are measured
// separately (link_profiler.h).
// Errors: INVALID_ARGUMENT / UNIMPLEMENTED for specs the worker cannot
// build, INTERNAL naming the node for LibTorch failures.
absl::StatusOr<apapo::v1::ProfileResult> ProfileJob(
    const apapo::v1::ProfileCommand& command,
    const ProfileOptions& options = {});


}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_PROFILER_H_
