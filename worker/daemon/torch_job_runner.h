// TorchJobRunner: the LibTorch JobRunner of the worker daemon.
//
//   Profile         on the calling thread: first the link test when the
//                   command carries a rendezvous of several ranks
//                   (MeasureLinks, bound to `host`, in this process: no
//                   model code), then the model (ProfileJob) in a child
//                   process, `exe --run_profile=/proc/self/fd/N`
//                   (RunProfileChildMain), with the training child's thread
//                   count and environment, so that a crash or an OOM while
//                   building or timing the model cannot take the daemon
//                   down. Stop makes it return CANCELLED while it waits for
//                   peers, or signals the child as for Train. On the rank
//                   that hosts the rendezvous, the link test's store is
//                   released when the test ends.
//   HostRendezvous  serves the job's c10d TCPStore on a free port from this
//                   process until the job's link test (rank 0 of a profile
//                   rendezvous) or Train returns, or Stop when neither runs.
//   Train           runs the stage in a child process (its transport bound
//                   to `host` unless the rendezvous names a local_host):
//                   fork + exec of
//                   `exe --run_assignment=/proc/self/fd/N`, N a memfd holding
//                   the serialized AssignStage; the child (main ->
//                   RunAssignmentChildMain) writes frames (stage_channel.h)
//                   to a pipe that the calling thread reads, forwarding
//                   reports. OPENBLAS/OMP/MKL_NUM_THREADS are set in the
//                   child's environment and it dies with the daemon
//                   (PR_SET_PDEATHSIG).
//   Stop            SIGTERM to the child, SIGKILL after `stop_grace`; Train
//                   then returns CANCELLED "stage S stopped: ...". A Stop
//                   that arrives just before its Train starts (within
//                   `stop_memory`) cancels that Train, unless a new
//                   assignment of the job came in between
//                   (PrepareAssignment: the job was restarted).
//
// A child that dies by a signal or exits non-zero without reporting a status
// makes Train fail with an error naming the stage and the exit cause.
//
// Thread-safety: all methods are thread-safe; Stop may run concurrently with
// Train and Profile. One Train per job at a time.
#ifndef APAPO_WORKER_DAEMON_TORCH_JOB_RUNNER_H_
#define APAPO_WORKER_DAEMON_TORCH_JOB_RUNNER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/daemon/job_runner.h"
#include "worker/daemon/stage_process.h"

namespace apapo::worker {

struct TorchJobRunnerOptions {
  // The worker binary to exec in child mode (main passes /proc/self/exe).
  std::string exe;
  // The worker's own address (its --host): the Gloo transports of the link
  // test and of the stages bind to it.
  std::string host = "127.0.0.1";
  // Time between SIGTERM and SIGKILL on Stop.
  absl::Duration stop_grace = absl::Seconds(2);
  // How long a Stop for a job that is not running is remembered.
  absl::Duration stop_memory = absl::Seconds(30);
  // Memory reported by Profile when the spec sets none; 0: MemAvailable.
  int64_t memory_bytes = 0;
  // The data roots the children open spec paths beneath
  // (worker/confined_files.h; passed as --confine_to); empty: unconfined.
  std::vector<std::string> data_roots;
};

class TorchJobRunner : public JobRunner {
 public:
  explicit TorchJobRunner(std::string exe);
  explicit TorchJobRunner(TorchJobRunnerOptions options);
  ~TorchJobRunner() override;

  absl::StatusOr<apapo::v1::ProfileResult> Profile(
      const apapo::v1::ProfileCommand& command) override;
  absl::StatusOr<int> HostRendezvous(const std::string& job_id) override;
  absl::Status Train(const apapo::v1::AssignStage& assignment,
                     const MetricsCallback& report,
                     apapo::v1::MetricsReport* final_metrics) override;
  void Stop(const std::string& job_id) override;
  void PrepareAssignment(const std::string& job_id) override;

 private:
  // A running stage child.
  struct Child {
    pid_t pid = -1;
    int wake_fd = -1;  // write end of the Train thread's wake-up pipe
    bool stop_requested = false;
    absl::Time kill_at = absl::InfiniteFuture();
  };

  // Where a child's frames go (null: dropped). A child with `profile` set
  // must send one ProfileResult to succeed.
  struct ChildOutput {
    const MetricsCallback* report = nullptr;
    apapo::v1::MetricsReport* final_metrics = nullptr;
    apapo::v1::ProfileResult* profile = nullptr;
  };
  // Runs `exe FLAG=/proc/self/fd/N` (N: a memfd holding `payload`) as the
  // job's child, with `threads` compute threads, and supervises it (Stop
  // signals it); CANCELLED "stopped" when stopped. Errors start with
  // `label`.
  absl::Status RunChild(const std::string& job, const std::string& label,
                        const std::string& flag, const std::string& payload, int threads,
                        const ChildOutput& out);
  // Waits for the child, forwarding its frames; returns its outcome.
  absl::Status Supervise(const std::string& job, const std::string& label,
                         const std::string& flag, Child* child, int data_fd, int wake_fd,
                         const ChildOutput& out);
  // True (and forgets it) if Stop(job_id) came recently with nothing running.
  bool TakeEarlyStop(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops serving the job's store, if this process serves it.
  void ReleaseStore(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const TorchJobRunnerOptions options_;

  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<JobStore>> stores_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, Child*> children_ ABSL_GUARDED_BY(mu_);
  // Running profiles: job -> notified by Stop (only under mu_, so once).
  std::map<std::string, std::shared_ptr<absl::Notification>> profiling_
      ABSL_GUARDED_BY(mu_);
  // Stops that found nothing running: job -> when.
  std::map<std::string, absl::Time> early_stops_ ABSL_GUARDED_BY(mu_);
};

}  // namespace apapo::worker

#endif  // APAPO_WORKER_DAEMON_TORCH_JOB_RUNNER_H_
