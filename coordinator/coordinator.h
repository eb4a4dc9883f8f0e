// Coordinator: the whole apapo-coordinator daemon as a library — job store,
// JobManager, WorkerRegistry, Scheduler and Planner, the gRPC server
// (JobService, WorkerService, health, reflection), the Prometheus /metrics
// endpoint and the thread that marks silent workers lost — wired together,
// so that main.cc only maps flags to CoordinatorOptions and tests can start
// a real coordinator in-process on free ports.
//
// Call order: construct, Start() once, then port() / metrics_port(),
// then Shutdown() (or just destroy it). Start() failing leaves nothing
// running; the object may then only be destroyed.
// Thread-safety: Shutdown() may be called from any thread and more than
// once; the accessors are safe after Start() returned OK. Start() must not
// race with Shutdown().
#ifndef APAPO_COORDINATOR_COORDINATOR_H_
#define APAPO_COORDINATOR_COORDINATOR_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/spec_paths.h"
#include "common/tls.h"
#include "coordinator/clock.h"
#include "coordinator/job_manager.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_service.h"
#include "planning/planner.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace apapo::coordinator {

class AccessPolicy;
class CoordinatorMetrics;
class CoordinatorServer;
class JobManager;
class JobServiceImpl;
class JobStore;
class WorkerRegistry;

struct CoordinatorOptions {
  // Address the gRPC server and the metrics endpoint listen on. Beyond
  // loopback the server must have TLS, unless allow_insecure.
  std::string host = "127.0.0.1";
  // TLS (common/tls.h): the server's certificate and key, and the cluster
  // CA that worker certificates are checked against. With TLS, a worker
  // registers only under its certificate's common name.
  TlsFiles tls;
  bool allow_insecure = false;
  // Bearer tokens with roles for the JobService and ListWorkers
  // (coordinator/access.h); empty = no tokens checked.
  std::string tokens_file;
  // gRPC port; 0 picks a free one (read it back with port()).
  int port = 0;
  // Prometheus /metrics port; 0 picks a free one, -1 serves no metrics.
  int metrics_port = -1;
  // SQLite database of jobs, created if missing; ":memory:" keeps nothing.
  std::string state_path = ":memory:";
  // How often workers heartbeat; one silent for
  // WorkerRegistry::kMissedHeartbeats intervals is marked lost.
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // Park the read after an idle worker's heartbeat for about an interval
  // (WorkerServiceImpl, "Paced reads").
  bool pace_idle_reads = true;
  // Heartbeat offsets handed out per interval, 0 for none
  // (WorkerServiceImpl, "Heartbeats in slots").
  int heartbeat_slots = WorkerServiceImpl::kDefaultHeartbeatSlots;
  // Workers given one slot before the next is used (likewise).
  int heartbeat_slot_size = WorkerServiceImpl::kDefaultHeartbeatSlotSize;
  // Directories job specs may name files under (common/spec_paths.h).
  std::vector<std::string> data_roots = DefaultDataRoots();
  // Ended jobs kept (memory and state file); the oldest beyond are dropped.
  int max_ended_jobs = JobManager::kDefaultMaxEndedJobs;
  // Phase deadlines, transfer timeout and the scheduler's tick.
  SchedulerOptions scheduler;
};

class Coordinator {
 public:
  // `planner` and `clock` may be null (then the PartitionerPlanner and the
  // system clock); if given, they must outlive the coordinator.
  explicit Coordinator(CoordinatorOptions options,
                       planning::Planner* planner = nullptr,
                       Clock* clock = nullptr);
  // Shuts down if still running.
  ~Coordinator();

  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Opens the state, recovers its jobs and starts serving. Errors say what
  // failed and where: INVALID_ARGUMENT for bad options, FAILED_PRECONDITION
  // (or the store's code) when the state cannot be opened or recovered,
  // UNAVAILABLE when the gRPC or metrics port cannot be bound.
  absl::Status Start();

  // The bound gRPC port.
  int port() const { return port_; }
  // The bound metrics port, or -1 when metrics are off.
  int metrics_port() const { return metrics_port_; }

  // Stops accepting RPCs, ends open streams (within a 2 s grace period),
  // stops the scheduler and the heartbeat monitor, closes the metrics
  // endpoint. Returns once all of them have stopped.
  void Shutdown();

 private:
  // Builds and starts everything; on error, Start() tears down what it built.
  absl::Status StartServing();

  // Constant after construction.
  const CoordinatorOptions options_;
  const std::unique_ptr<planning::Planner> owned_planner_;  // if none given
  const std::unique_ptr<Clock> owned_clock_;                // if none given
  planning::Planner* const planner_;
  Clock* const clock_;

  // Built by Start(), in this order; destroyed in reverse. Written only by
  // Start() and Shutdown().
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::shared_ptr<prometheus::Registry> metrics_registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<AccessPolicy> access_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<CoordinatorServer> server_;
  int port_ = 0;
  int metrics_port_ = -1;
  // Marks silent workers lost when the registry's next deadline passes,
  // until notified.
  absl::Notification stop_monitor_;
  std::thread monitor_;

  // Held for the whole of Shutdown(), so a second caller returns only once
  // everything has stopped.
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_COORDINATOR_H_
