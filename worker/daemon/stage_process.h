// The stage process of a worker: given the AssignStage the coordinator (or
// `apapo-worker --local`) sent (the whole Plan, this worker's stage and
// replica, the rendezvous), build the stage, join the job's Gloo process
// group through the rendezvous TCPStore (bound to rendezvous.local_host, the
// worker's --host) and train to the job's limits.
//
// In production RunAssignment runs in a child process of the daemon
// (TorchJobRunner re-executes the worker binary with --run_assignment=PATH,
// whose main calls RunAssignmentChildMain), so that a stop is a signal and a
// LibTorch crash does not take the daemon down. Tests call RunAssignment in
// threads of one process.
//
// This header is free of LibTorch includes on purpose: the daemon's
// translation units include it without paying a LibTorch compile.
//
// Thread-safety: RunAssignment is reentrant (each call builds its own graph,
// data, transport and executor); `report` is called on the calling thread.
// RunAssignmentChildMain owns the process (it ends it).
#ifndef APAPO_WORKER_DAEMON_STAGE_PROCESS_H_
#define APAPO_WORKER_DAEMON_STAGE_PROCESS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/apapo/v1/metrics.pb.h"
#include "proto/apapo/v1/worker.pb.h"

namespace apapo::worker {

// Trains the stage replica `a` assigns: RunStage (worker/stage_runner.h),
// the one path every stage runs through, without test hooks. Only the last
// stage's replica 0 reports loss and accuracy while training; every stage
// streams its counters and fills `final_metrics` at the end.
// MetricsReport.worker_id is left to the caller. Errors name the stage
// ("stage 1 replica 0 (rank 1): ...") and the cause; a plan that does not
// fit the model is INVALID_ARGUMENT.
absl::Status RunAssignment(
    const apapo::v1::AssignStage& a,
    std::function<void(const apapo::v1::MetricsReport&)> report,
    apapo::v1::MetricsReport* final_metrics);

// The hidden child mode of the worker binary. `path` holds a serialized
// AssignStage. Bounds the compute threads (spec.resources.threads_per_worker,
// 1 when 0), runs RunAssignment and writes its reports, final metrics and
// status as frames (stage_channel.h) to the process's original stdout; stray
// prints to stdout are redirected to stderr. Ends the process with _exit
// (0 on success, 1 on a stage error, 2 on an unreadable assignment) without
// running c10d's teardown; the int is only there for `return` in main.
int RunAssignmentChildMain(const std::string& path);

// The compute threads a stage or profiling process of `spec` runs with:
// spec.resources.threads_per_worker, 1 when 0, within this process's CPU
// quota (apapo::ThreadsWithin; the coordinator counts the same from the
// quota the daemon registered with). The daemon sets the same in the
// child's OPENBLAS/OMP/MKL_NUM_THREADS.
int StageThreads(const apapo::v1::JobSpec& spec);

// The hidden profiling mode of the worker binary (model code never runs in
// the daemon: a crash or an OOM while profiling ends this child, not the
// daemon). `path` holds a serialized ProfileCommand whose spec already
// carries the memory to report. Bounds the compute threads as
// RunAssignmentChildMain does, runs ProfileJob (profiler.h) and writes the
// ProfileResult (FrameType::kProfile) and the status as frames to the
// original stdout; exit codes as RunAssignmentChildMain's.
int RunProfileChildMain(const std::string& path);

// A job's rendezvous TCPStore, served by this process on a free port.
// Destroying it stops the server.
class JobStore {
 public:
  virtual ~JobStore() = default;
  virtual int port() const = 0;
};
// Starts a TCPStore server (listening on every interface, port chosen by
// the kernel). UNAVAILABLE if it cannot bind.
absl::StatusOr<std::unique_ptr<JobStore>> StartJobStore();

}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_STAGE_PROCESS_H_
