// WorkerDaemon: the worker side of WorkerService.Connect. It dials the
// coordinator, registers, heartbeats, and carries out the commands it is
// sent (profile, assign, start, stop) through a JobRunner, streaming
// metrics, acknowledgements and stage outcomes back. A command that makes
// this worker host the job's rendezvous (store_port 0: an AssignStage, or the
// ProfileCommand of rank 0 of a link test) is acknowledged with the bound
// port before its work starts. When the coordinator
// is away it reconnects with exponential backoff, each wait jittered by
// +-50% so that a fleet whose coordinator restarts does not reconnect in
// one burst. Training does not depend on the stream: when it breaks, the
// stages go on; the daemon registers again with the stages it still runs
// (WorkerInfo.running), and a stage outcome that came while no coordinator
// was there is sent once it is back. What needs the stream stops with it:
// profiles and assignments not started yet. Run() returning (Shutdown)
// stops every stage.
//
// Call order: construct, Run() (blocks) on one thread; Shutdown() from any
// other thread ends Run().
// Thread-safety: Run/Shutdown/WaitUntilRegistered as above; internally a
// heartbeat thread and one thread per command that does work share the
// stream's writer under a mutex.
#ifndef APAPO_WORKER_DAEMON_DAEMON_H_
#define APAPO_WORKER_DAEMON_DAEMON_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/bit_gen_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/spec_paths.h"
#include "grpcpp/security/credentials.h"
#include "proto/apapo/v1/service.grpc.pb.h"
#include "worker/daemon/job_runner.h"

namespace apapo::worker {

struct DaemonOptions {
  // Coordinator address HOST:PORT, and how to reach it (TLS with this
  // worker's certificate, or insecure; common/tls.h).
  std::string coordinator;
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  // What the worker registers as (worker_id must be set).
  apapo::v1::WorkerInfo info;
  // Directories a job spec may name files under; every spec is checked
  // against them on this machine before anything of it runs.
  std::vector<std::string> data_roots = DefaultDataRoots();
  // Reconnect backoff: doubles from initial to max (before jitter).
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(5);
};

// A reconnect wait: `backoff` scaled by a uniform factor in [0.5, 1.5).
absl::Duration JitteredBackoff(absl::Duration backoff, absl::BitGenRef gen);

class WorkerDaemon {
 public:
  // `runner` must outlive the daemon.
  WorkerDaemon(DaemonOptions options, JobRunner* runner);
  ~WorkerDaemon();

  // Connects and serves until Shutdown().
  void Run();
  void Shutdown();

  // True once registered on the current connection (tests, logs).
  bool WaitUntilRegistered(absl::Duration timeout);
  // Number of successful registrations so far (reconnects count).
  int registrations();
  // True once the daemon has registered `n` times (reconnects count).
  bool WaitForRegistrations(int n, absl::Duration timeout);

 private:
  class Session;
  // One connection: returns when the stream ends or on shutdown.
  void RunSession();

  // A started stage, trained on a thread of the daemon.
  struct Training {
    apapo::v1::AssignStage assign;
    int64_t step = 0;  // newest reported
  };
  void StartTraining(const apapo::v1::AssignStage& assign);
  void Train(const apapo::v1::AssignStage& assign);
  // Stops every stage and joins their threads.
  void StopTrainings();
  std::vector<apapo::v1::RunningStage> Running();
  std::string RunningJob();  // a job being trained, or ""
  // On the current session's stream; false when there is none or the
  // write failed (the message is dropped).
  bool Send(const apapo::v1::WorkerMessage& message);
  // Sent now, or kept for the next session.
  void SendOrKeep(const apapo::v1::WorkerMessage& message);
  // The session messages go to (null: none); sends what was kept.
  void AttachSession(Session* session);

  const DaemonOptions options_;
  JobRunner* const runner_;
  absl::Notification shutdown_;

  // Lock order: jobs_mu_ before a session's writer lock.
  absl::Mutex jobs_mu_;
  Session* session_ ABSL_GUARDED_BY(jobs_mu_) = nullptr;
  std::map<std::string, Training> trainings_ ABSL_GUARDED_BY(jobs_mu_);
  std::vector<apapo::v1::WorkerMessage> unsent_ ABSL_GUARDED_BY(jobs_mu_);
  absl::Mutex threads_mu_;
  std::vector<std::thread> train_threads_ ABSL_GUARDED_BY(threads_mu_);

  absl::Mutex mu_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_DAEMON_H_
