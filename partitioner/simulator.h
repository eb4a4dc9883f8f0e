// Event-driven simulator: executes a Plan under a schedule, driving every
// stage replica with the same schedule::StageProgram the worker runtime runs,
// and reports throughput, bubble fraction, per-stage busy/idle time, peak
// memory and weight staleness; optionally the timeline as Chrome trace JSON.
//
// Model: a replica runs its ops in program order, one at a time. kForward(j)
// on stage s starts when stage s-1's kForward(j) finished plus the transfer
// time of its output (bytes / link bandwidth); kBackward(j) likewise waits for
// stage s+1's kBackward(j) plus the gradient transfer, or, where stage s+1
// splits its backward (StagePlan::backward_weight_seconds), for the part
// of it before the weight gradients plus the transfer. Transfers overlap
// compute (they run on their own threads in the runtime); the CPU their
// copies take is in the stage's forward/backward times when the planner
// charged it. kAllReduce is a collective over the stage's replicas lasting
// one ring all-reduce (RingAllReduceSeconds), zero for one replica, less
// what its last micro-batch's weight gradients hide of it where the plan
// has a split backward (StagePlan::allreduce_window_seconds,
// ExposedAllReduceSeconds), as the planner charges it. Op times are
// StagePlan's per micro-batch figures. A link carries one transfer at a
// time in each direction (a send waits for the one before it on that link),
// as one TCP connection per peer does; links between different pairs of
// replicas do not contend with each other.
//
// Thread-safety: Simulate is reentrant.

#ifndef APAPO_PARTITIONER_SIMULATOR_H_
#define APAPO_PARTITIONER_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "partitioner/cluster.h"
#include "partitioner/optimizer.h"
#include "schedule/schedule.h"

namespace apapo {
namespace partitioner {

struct SimulationOptions {
  int64_t iterations = 16;
  // 0: plan.micro_batches.
  int micro_batches = 0;
  int max_in_flight = 0;
  bool record_trace = false;
};

struct StageStats {
  double busy_seconds = 0;  // mean over replicas
  double idle_seconds = 0;  // mean over replicas, within the makespan
  double peak_memory_bytes = 0;
  int weight_versions = 0;
  int64_t max_staleness = 0;
  int max_in_flight = 0;
};

struct TraceEvent {
  int stage = 0;
  int replica = 0;
  schedule::Op op;
  double start = 0;
  double end = 0;
};

struct SimulationResult {
  double makespan_seconds = 0;
  // Steady state, measured over the middle half of the iterations.
  double seconds_per_iteration = 0;
  double micro_batches_per_second = 0;
  // Iterations (one mini-batch of m micro-batches, one update) per second:
  // what Plan::mini_batches_per_second predicts.
  double mini_batches_per_second = 0;
  // 1 - busy / (devices x window): idle share of the devices in the steady
  // state window (the middle half of the iterations).
  double bubble_fraction = 0;
  std::vector<StageStats> stages;
  std::vector<TraceEvent> trace;  // when record_trace
};

// Simulates `plan` (its stages, replicas, workers) under `kind` on `cluster`.
absl::StatusOr<SimulationResult> Simulate(const Plan& plan,
                                          const Cluster& cluster,
                                          schedule::ScheduleKind kind,
                                          const SimulationOptions& options);

// Chrome trace JSON ({"traceEvents": [...]}, pid = stage, tid = replica).
std::string ChromeTraceJson(const SimulationResult& result);

}  // namespace partitioner
}  // namespace apapo

#endif  // APAPO_PARTITIONER_SIMULATOR_H_
