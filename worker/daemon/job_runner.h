// JobRunner: what the worker daemon asks of the training runtime. The daemon
// (worker/daemon/daemon.h) speaks the coordinator protocol; a JobRunner does the
// work: profile a model, host a job's rendezvous, train an assigned stage.
//
// Call order per job: [HostRendezvous, on rank 0 of the link test] ->
// [Profile] -> [HostRendezvous, on the hosting rank] -> Train (blocks for the
// whole run) ; Stop may be called from another thread at any time and makes
// a running Profile or Train return CANCELLED promptly.
// Thread-safety: implementations must allow Stop concurrently with Train and
// Profile; one job at a time per worker.
#ifndef APAPO_WORKER_DAEMON_JOB_RUNNER_H_
#define APAPO_WORKER_DAEMON_JOB_RUNNER_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/apapo/v1/metrics.pb.h"
#include "proto/apapo/v1/worker.pb.h"

namespace apapo::worker {

class JobRunner {
 public:
  using MetricsCallback = std::function<void(const apapo::v1::MetricsReport&)>;

  virtual ~JobRunner() = default;

  // Builds the job's model and measures it (per-node times, bytes, memory)
  // and, when the command carries a rendezvous of several ranks, the links
  // to its peers (an error naming the peer if that fails).
  virtual absl::StatusOr<apapo::v1::ProfileResult> Profile(
      const apapo::v1::ProfileCommand& command) = 0;

  // Starts the job's c10d TCPStore on a free port of this host; returns it
  // (the same port while it lives). The store lives until the job's link
  // test (Profile of rank 0) or Train returns, or Stop.
  virtual absl::StatusOr<int> HostRendezvous(const std::string& job_id) = 0;

  // Builds the assigned stage, joins the job's process group and trains to
  // the job's limits, calling `report` with progress. Returns OK when the
  // limits were reached; CANCELLED after Stop; otherwise an error naming the
  // stage and the cause (e.g. a peer that died, a transfer timeout).
  virtual absl::Status Train(const apapo::v1::AssignStage& assignment,
                             const MetricsCallback& report,
                             apapo::v1::MetricsReport* final_metrics) = 0;

  // Stops the job's Profile/Train as soon as possible.
  virtual void Stop(const std::string& job_id) = 0;

  // A new assignment of `job_id` came (the coordinator restarted the job
  // after a fault): a Stop that arrived before it, when nothing of the job
  // ran here, is forgotten, so that it does not cancel the new Train.
  virtual void PrepareAssignment(const std::string& job_id) {}
};

}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_JOB_RUNNER_H_
