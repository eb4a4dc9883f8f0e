// JobManager: the coordinator's record of every job — its spec, state,
// progress, plan and event history — and the only place job state changes.
//
// Every change is written through to the JobStore before it becomes visible,
// and bumps a change counter that watchers wait on (WaitForChange), so
// WatchJob streams see every event in order and every progress update.
// Progress is the exception: it arrives with every metrics report, so it is
// written behind, by the manager's writer thread, in one store transaction
// per batch (all jobs whose progress changed within `progress_batch_window`
// of the first change). A crash loses at most that window of progress.
//
// State machine: QUEUED -> PROFILING -> PLANNING -> RUNNING -> SUCCEEDED,
// with FAILED and CANCELLED reachable from any non-terminal state; a fault
// takes PROFILING, PLANNING or RUNNING to RECOVERING, which goes on to
// PROFILING or PLANNING. Transitions out of a terminal state are
// FAILED_PRECONDITION.
//
// Call order: construct, Recover() once, then any method from any thread.
// Thread-safety: all methods are thread-safe.
#ifndef APAPO_COORDINATOR_JOB_MANAGER_H_
#define APAPO_COORDINATOR_JOB_MANAGER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/spec_paths.h"
#include "coordinator/clock.h"
#include "coordinator/job_store.h"
#include "proto/apapo/v1/job.pb.h"
#include "proto/apapo/v1/service.pb.h"

namespace apapo::coordinator {

bool IsTerminal(apapo::v1::JobState state);

// What changed since a watcher last looked.
struct JobChange {
  apapo::v1::Job job;                       // the job now
  std::vector<apapo::v1::JobEvent> events;  // events after the cursor
  int64_t version = 0;                      // pass back to WaitForChange
};

class JobManager {
 public:
  // `store` and `clock` must outlive the manager. Starts the progress
  // writer.
  // Specs may name files only under `data_roots` (common/spec_paths.h).
  JobManager(JobStore* store, Clock* clock,
             absl::Duration progress_batch_window = absl::Milliseconds(200),
             std::vector<std::string> data_roots = DefaultDataRoots());
  // Stops the writer and writes the progress not yet saved.
  ~JobManager();

  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Loads stored jobs. RUNNING jobs stay RUNNING: their stages train on
  // without a coordinator, and the scheduler adopts them
  // (Scheduler::AdoptRunningJobs). Jobs that were profiling, planning or
  // recovering are failed with UNAVAILABLE, since their workers were
  // waiting on the coordinator that stopped; queued jobs stay queued.
  absl::Status Recover();

  // Validates `spec` (INVALID_ARGUMENT naming the field), including that
  // every path it names lies under the data roots, and queues a job.
  absl::StatusOr<apapo::v1::Job> Submit(const apapo::v1::JobSpec& spec,
                                        const std::string& owner = "anonymous");

  absl::StatusOr<apapo::v1::Job> Get(const std::string& job_id);

  // Newest first. `page_token` is the id of the last job of the previous page.
  absl::StatusOr<apapo::v1::ListJobsResponse> List(
      const apapo::v1::ListJobsRequest& request);

  // Cancels a job that has not ended and runs the cancel hook (which stops
  // its workers). FAILED_PRECONDITION if it has ended.
  absl::StatusOr<apapo::v1::Job> Cancel(const std::string& job_id,
                                        const std::string& reason);

  // FAILED_PRECONDITION until SetPlan was called for the job.
  absl::StatusOr<apapo::v1::GetPlanResponse> GetPlan(const std::string& job_id);

  // The measured timelines the job's stage replicas sent (AddStageTrace),
  // by stage and replica; empty when none has. NOT_FOUND for an unknown job.
  absl::StatusOr<std::vector<apapo::v1::StageTrace>> StageTraces(
      const std::string& job_id);

  // Returns as soon as the job's change counter exceeds `seen_version`, or at
  // `deadline` (then `version` == seen_version). Events are those with
  // sequence > `after_sequence`.
  absl::StatusOr<JobChange> WaitForChange(const std::string& job_id,
                                          int64_t seen_version,
                                          int64_t after_sequence,
                                          absl::Time deadline);

  // --- Used by the scheduler that drives jobs through their life. ---

  // Moves the job to `state`, recording `message` as an event. For FAILED,
  // `error_code` / the message become Job.error_code / Job.error.
  absl::Status Transition(const std::string& job_id, apapo::v1::JobState state,
                          const std::string& message,
                          absl::StatusCode error_code = absl::StatusCode::kOk);
  // Records an event without a state change (e.g. "worker w-2 lost").
  absl::Status RecordEvent(const std::string& job_id,
                           const std::string& message);
  absl::Status SetWorkers(const std::string& job_id,
                          const std::vector<std::string>& worker_ids);
  // A restart begins: appended to Job.restart_history, Job.restarts + 1.
  absl::Status BeginRestart(const std::string& job_id,
                            const apapo::v1::JobRestart& restart);
  // Replaces the newest restart entry (its outcome is known).
  absl::Status UpdateRestart(const std::string& job_id,
                             const apapo::v1::JobRestart& restart);
  absl::Status SetPlan(const std::string& job_id,
                       const apapo::v1::GetPlanResponse& plan);
  // Replaces the job's progress; visible at once, saved in the writer's
  // next batch.
  absl::Status UpdateProgress(const std::string& job_id,
                              const apapo::v1::JobProgress& progress);
  // Saves every progress change not yet saved, in one transaction, now.
  absl::Status FlushProgress();
  // Keeps a stage replica's measured timeline (MetricsReport.trace), in
  // memory only: the newest per (stage, replica), at most kMaxTraceSpans
  // spans per job (a trace past that is refused: RESOURCE_EXHAUSTED), for
  // the kMaxTracedJobs jobs traced most recently (the oldest's go first).
  absl::Status AddStageTrace(const std::string& job_id,
                             apapo::v1::StageTrace trace);
  static constexpr int kMaxTracedJobs = 32;
  static constexpr int kMaxTraceSpans = 64 * 4096;

  // Ids of queued jobs, oldest first.
  std::vector<std::string> QueuedJobs();
  // Ids of the jobs in `state`, oldest first.
  std::vector<std::string> JobsIn(apapo::v1::JobState state);

  // Number of jobs in each state (for metrics).
  std::map<apapo::v1::JobState, int> CountByState();

  // Called (outside the lock) after a job is cancelled.
  void SetCancelHook(std::function<void(const apapo::v1::Job&)> hook);
  // Called (outside the lock) after any job reaches a final state
  // (succeeded, failed, cancelled) through Cancel or Transition: what the
  // jobs-finished counter counts. Jobs that Recover fails at startup are not
  // reported (it runs before hooks are set).
  void SetEndHook(std::function<void(const apapo::v1::Job&)> hook);

  // Job history retention: at most `n` ended jobs (succeeded, failed,
  // cancelled) are kept, in memory and in the store; beyond that the oldest
  // submitted are dropped (their events and plan too) at the next submit
  // and now. Get/Watch of a dropped job is NOT_FOUND.
  static constexpr int kDefaultMaxEndedJobs = 10000;
  void set_max_ended_jobs(int n);

 private:
  struct Entry {
    apapo::v1::Job job;
    std::vector<apapo::v1::JobEvent> events;
    bool has_plan = false;
    apapo::v1::GetPlanResponse plan;
  };

  absl::StatusOr<Entry*> Find(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the oldest ended jobs beyond max_ended_jobs_ (memory and store).
  void PruneEndedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends an event, persists job + event, bumps the change counter.
  absl::Status AddEventLocked(Entry& entry, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TransitionLocked(Entry& entry, apapo::v1::JobState state,
                                const std::string& message,
                                absl::StatusCode error_code)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The writer thread's body: batches of dirty progress until stopping_.
  void WriteProgressLoop();

  // Constant after construction.
  JobStore* const store_;
  Clock* const clock_;
  const absl::Duration progress_batch_window_;
  const std::vector<std::string> data_roots_;

  absl::Mutex mu_;
  std::map<std::string, Entry> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t max_ended_jobs_ ABSL_GUARDED_BY(mu_) = kDefaultMaxEndedJobs;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Per-job change counters; watchers wait on them.
  std::map<std::string, int64_t> job_version_ ABSL_GUARDED_BY(mu_);
  std::function<void(const apapo::v1::Job&)> cancel_hook_ ABSL_GUARDED_BY(mu_);
  std::function<void(const apapo::v1::Job&)> end_hook_ ABSL_GUARDED_BY(mu_);
  // Jobs whose progress changed since the last batch was written.
  std::set<std::string> dirty_progress_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // AddStageTrace's: (stage, replica) -> trace per job, and the jobs in the
  // order their first trace came.
  std::map<std::string, std::map<std::pair<int, int>, apapo::v1::StageTrace>>
      traces_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> traced_jobs_ ABSL_GUARDED_BY(mu_);
  std::thread writer_;
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_JOB_MANAGER_H_
