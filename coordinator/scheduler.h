// Scheduler: drives each job through its life on the registered workers.
//
//   QUEUED     waits until Reserve() finds enough idle matching workers
//   PROFILING  every reserved worker profiles the model (ProfileCommand);
//              with several workers they first measure their links through
//              a c10d rendezvous hosted by the first, which is sent its
//              command first and reports the store's port in its ack, then
//              the others are sent theirs. The slowest measured link is the
//              network level's bandwidth (1 GB/s assumed for one worker).
//              A worker (not on a shared core set) measured below
//              remeasure_below_speed of the round's fastest is profiled
//              once more, alone and without the link test, and the faster
//              of its two profiles is kept: a worker profiled in a slow
//              spell would otherwise be planned as slow (or left out) for
//              the whole job. Against the new figures the others are
//              checked again: a worker now below that share of one whose
//              kept profile was taken alone is profiled alone too (each at
//              most once a round), so no worker is planned on a crowded
//              profile next to another's quiet one
//   PLANNING   the Planner turns profile + cluster into a Plan; the rank
//              hosting the c10d TCPStore is assigned first (port 0), reports
//              the bound port in its ack, then every other rank is assigned
//   RUNNING    once every rank acknowledged its assignment, all are started;
//              metrics reports become the job's progress
//   SUCCEEDED  every stage reported a normal outcome
//   FAILED     a stage failed on its own, a command was refused, a worker
//              was lost with no restart allowed (below), a phase passed its
//              deadline or the job ran past its limits.max_duration: the
//              others are stopped and every worker is released, never left
//              hung
//   CANCELLED  (JobManager::Cancel) the stages are stopped, workers released
//   RECOVERING a worker of a job past profiling was lost, or a stage failed
//              because a peer did (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED,
//              CANCELLED not asked for), and spec.fault_tolerance allows a
//              restart: every other stage is stopped and its end awaited
//              (at most stop_timeout; a worker whose stage does not end is
//              left out), idle matching workers join up to the job's size,
//              and the job goes back to PLANNING on the survivors' cached
//              profiles (PROFILING when workers joined), its assignments
//              resuming from the newest complete checkpoint. With fewer
//              than min_workers it waits for capacity up to
//              replacement_wait, then fails saying so. One fault that
//              shows several ways (a dead peer's stage errors, then its
//              stream) is one restart.
//
// A restarted coordinator adopts the RUNNING jobs of its store
// (AdoptRunningJobs): their stages train on without it, and their daemons
// register again listing the stages they run (WorkerInfo.running). A job
// whose every stage is back (or has ended, its outcome sent on
// reconnection) runs on, untouched; one with a stage missing after
// adopt_timeout restarts without it (as RECOVERING above). A stage no
// job here expects (another attempt, an unknown job) is stopped.
//
// Growing: a RUNNING job on fewer workers than fault_tolerance.max_workers
// is checked every growth_check_every while idle matching workers exist.
// The planner plans (without the lock) for the job's workers plus them,
// the newcomers taken to be like the job's first worker (its profile, the
// slowest measured link). When that plan predicts at least growth_gain x
// the current plan's samples/s, the job checkpoints and has at least
// growth_min_remaining of training left, the newcomers are reserved and
// the job restarts with them once its progress passes the next checkpoint
// step (the work redone is the second or so that reports lag). A growth is
// a restart like a fault's (it counts, and is only tried while restarts
// remain); the newcomers are profiled with the others first.
//
// Checking the plan against the run (run_check.h): once every stage of an
// attempt has trained check_warmup_steps, a window of check_steps opens;
// when it closes the coordinator compares the samples/s the stages' own
// counters measured with the plan's prediction, and records the check as a
// job event. Past check_tolerance it turns the window into calibration
// factors (each worker's compute, the job's all-reduce), plans again on the
// profiles scaled by them (without the lock, like a growth), simulates the
// running plan and that one on the same figures (what calibration leaves
// unexplained cancels out) and, when the new plan has another shape and
// simulates at least replan_gain x the running one, restarts the job on it
// after its next checkpoint, as a growth does
// (where spec.schedule.replan_on_measurement asks for it; a restart, once
// per job, while restarts remain and enough training is left). The new plan's notes say what it was planned on; its own window
// is checked and recorded the same way.
//
// Events come from the workers' streams (OnWorkerMessage), the registry
// (OnWorkerLost) and the JobManager (OnCancelled); they only update state
// under mu_ and send non-blocking commands. Queue scans, planning and
// deadlines run on the scheduler's own thread (Start/Stop).
//
// The Planner runs without mu_ held, on a copy of the job's profiles and
// cluster, so events keep being served while it searches. Its plan is
// applied only if the job is still the one it was computed for (still
// planning, not cancelled or failed, same workers); otherwise it is
// discarded, and the job re-planned if it merely holds other workers now.
// A plan being computed has no deadline of its own.
//
// Thread-safety: all public methods are thread-safe. Lock order: mu_ before
// the JobManager's and the registry's locks; neither calls back into the
// scheduler while holding its own. The Planner is never called under mu_.
#ifndef APAPO_COORDINATOR_SCHEDULER_H_
#define APAPO_COORDINATOR_SCHEDULER_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "coordinator/job_manager.h"
#include "coordinator/run_check.h"
#include "planning/planner.h"
#include "coordinator/worker_registry.h"
#include "coordinator/worker_listener.h"

namespace apapo::coordinator {

struct SchedulerOptions {
  // Deadline of the profiling phase and of the assignment phase.
  absl::Duration profile_timeout = absl::Minutes(5);
  absl::Duration assign_timeout = absl::Minutes(2);
  // Timeout of every blocking transfer on the workers (Rendezvous.timeout),
  // in training and in the link test of the profiling phase.
  absl::Duration transfer_timeout = absl::Seconds(60);
  // Forward/backward repetitions per layer when profiling.
  int profile_iterations = 3;
  // How often the scheduler's thread re-checks the queue and deadlines
  // when nothing wakes it.
  absl::Duration tick = absl::Milliseconds(200);
  // How long a restart waits for the surviving stages to end after their
  // stop (they are killed after the daemon's grace period).
  absl::Duration stop_timeout = absl::Seconds(30);
  // Every job without a checkpoint directory of its own checkpoints into
  // <checkpoint_root>/<job id>.<submit time, Unix seconds> (empty: such
  // jobs do not checkpoint, and a restart starts from the beginning).
  std::string checkpoint_root;
  // Steps between checkpoints for a job that sets none.
  int64_t checkpoint_every_steps = 100;
  // How long a restarted coordinator waits for the workers of a running
  // job to register again before it restarts the job without the missing.
  absl::Duration adopt_timeout = absl::Seconds(60);
  // Growing into idle workers (see the header comment).
  double growth_gain = 1.2;
  absl::Duration growth_min_remaining = absl::Minutes(1);
  absl::Duration growth_check_every = absl::Seconds(10);
  // Checking the plan against the run (see the header comment).
  int64_t check_warmup_steps = 10;
  int64_t check_steps = 20;
  double check_tolerance = 0.10;
  double replan_gain = 1.2;
  // A worker whose profile computes below this fraction of the round's
  // fastest worker's speed is profiled once more (see PROFILING above);
  // 0 never does. A disturbance only slows a measurement, so the faster
  // one stands. The lab's two identical workers were measured at 0.54x
  // and 0.76x each other in slow spells (bench/cluster, 2026-12-05 03:50).
  double remeasure_below_speed = 0.8;
};

// Observes what the scheduler sees, for metrics export.
class SchedulerObserver {
 public:
  virtual ~SchedulerObserver() = default;
  virtual void OnMetrics(const std::string& job_id,
                         const apapo::v1::MetricsReport& report) = 0;
  // The job ended (any final state); it reports nothing more.
  virtual void OnJobEnded(const std::string& job_id) {}
  // A fault restarts the job: its stages start over (their running
  // totals begin again at 0).
  virtual void OnJobRestarted(const std::string& job_id) {}
  // The restarted job trained its first step, `seconds` after the fault.
  virtual void OnJobRecovered(const std::string& job_id, double seconds) {}
};

class Scheduler : public WorkerMessageListener {
 public:
  // All pointers must outlive the scheduler; `observer` may be null.
  Scheduler(JobManager* jobs, WorkerRegistry* registry, planning::Planner* planner,
            Clock* clock, SchedulerOptions options,
            SchedulerObserver* observer = nullptr);
  ~Scheduler() override;

  // Starts / stops the scheduler's thread.
  void Start();
  void Stop();

  // Something changed (a job was submitted, a worker registered).
  void Wake();

  void OnWorkerMessage(const std::string& worker_id,
                       const apapo::v1::WorkerMessage& message) override;
  void OnWorkerLost(const std::string& worker_id, const std::string& job_id,
                    const std::string& reason);
  // A worker registered (a reconnect included); adopts or stops the stages
  // it still trains (info.running), and wakes the scheduler.
  void OnWorkerRegistered(const apapo::v1::WorkerInfo& info);
  // Takes over the RUNNING jobs of the JobManager (a restarted
  // coordinator), waiting for their workers to report back. Call once,
  // before workers can register.
  void AdoptRunningJobs();
  void OnCancelled(const apapo::v1::Job& job);

  // Runs one pass of deadline checks, planning of the jobs whose profiles
  // are in, and queue admission (the thread's body; tests call it directly).
  // Returns once those plans are applied or discarded. The planner runs
  // without mu_; a job being planned is not planned again by a concurrent
  // pass.
  void RunOnce();

 private:
  enum class Phase {
    kProfiling,
    kPlanning,
    kAssigning,
    kRunning,
    kStopping,  // restarting: waiting for the surviving stages to end
    kWaiting,   // restarting: waiting for enough workers
    kAdopting,  // a restarted coordinator: waiting for the stages to report
  };
  struct Rank {
    std::string worker_id;
    int stage = 0;
    int replica = 0;
    int rank = 0;
  };
  struct ActiveJob {
    std::string id;
    apapo::v1::JobSpec spec;
    Phase phase = Phase::kProfiling;
    std::vector<std::string> workers;  // reserved, in registry order
    absl::Time deadline;               // of the profiling or assignment phase
    absl::Time admitted;               // left the queue (limits.max_duration)
    // The ProfileCommand every worker gets (rendezvous.rank set per worker).
    apapo::v1::ProfileCommand profile;
    int64_t profile_host_command = -1;  // rank 0's ProfileCommand id
    std::map<std::string, apapo::v1::ProfileResult> profiles;
    // How many of the job's workers each core set holds, and the threads
    // other jobs' workers train with on it, counted once per profiling
    // round (NoteSharedCores; empty until then). They describe the load the
    // round's profiles were measured under, so a re-plan from those
    // profiles (workers lost while planning, or all of them profiled)
    // keeps them: StartProfiling, which sends new ProfileCommands, clears
    // them. The plan's own load is counted afresh (ThreadsElsewhere).
    std::map<std::string, int> core_set_members;
    std::map<std::string, int> core_set_elsewhere;
    bool plan_ready = false;  // all profiles in; the thread plans
    // Workers being profiled again this round (MaybeRemeasure), and every
    // worker profiled again this round; StartProfiling clears both.
    std::map<int64_t, std::string> remeasuring;  // command id -> worker
    std::set<std::string> remeasured;
    // Non-zero while the planner computes this job's plan: the attempt the
    // result must match to be applied (PlanRequest::attempt).
    int64_t plan_attempt = 0;
    apapo::v1::Plan plan;
    std::vector<Rank> ranks;
    std::map<int64_t, std::string> pending_assign;  // command id -> worker
    std::set<std::string> assigned;
    apapo::v1::Rendezvous rendezvous;
    std::map<std::string, apapo::v1::MetricsReport> latest;  // per worker
    std::map<std::string, apapo::v1::StageOutcome> outcomes;
    // Fault tolerance. `recovering` from a fault until the job runs again,
    // then `awaiting_first_step` until it trained a step; `restart` is that
    // restart's record.
    bool recovering = false;
    bool awaiting_first_step = false;
    // The restarted attempt's first progress replaces the old attempt's
    // (which may be ahead of the checkpoint it resumed from).
    bool restart_progress = false;
    bool resume = false;  // assignments resume from the checkpoint
    int restarts = 0;
    absl::Time fault_time;
    apapo::v1::JobRestart restart;
    std::set<std::string> stopping;  // kStopping: stages not ended yet
    std::set<std::string> adopted;   // kAdopting: stages reported back
    // Growing: idle workers reserved to join at step grow_at_step, the
    // gain the planner predicted, and when to look for idle ones next.
    std::vector<std::string> growing;
    int64_t grow_at_step = 0;
    double grow_gain = 0;
    absl::Time next_growth_check;
    std::string growth_note;  // the last "not taken" event, said once
    // Left out because their stage did not end: still reserved.
    std::vector<std::string> held_back;
    absl::Time wait_deadline;        // kWaiting: end of the wait
    // kWaiting: the idle matching workers its last check found (too few
    // to go on with), named when the wait ends in failure.
    std::vector<std::string> idle_in_wait;
    // Checking the plan against the run, once per attempt: each worker's
    // report where the window opened; `checked` once it closed. A check
    // past the tolerance keeps its figures and calibrated profiles while
    // it is re-planned (`check_pending`: not taken yet); one within it keeps
    // them until the running plan is simulated on them (`check_within`,
    // no re-plan: the event then names the cost model's own error); a re-plan taken
    // waits for the checkpoint of replan_at_step. `replanned`: the job
    // restarted on a check (once per job). calibration_note goes into the
    // next plan's notes.
    std::map<std::string, apapo::v1::MetricsReport> window_start;
    bool checked = false;
    bool check_pending = false;
    bool check_within = false;
    std::optional<RunCheck> check;
    std::map<std::string, apapo::v1::ProfileResult> calibrated;
    int64_t replan_at_step = 0;
    double replan_gain = 0;
    bool replanned = false;
    std::string calibration_note;
    // Workers the plan made on the run's measurement left out: growth does
    // not take them back for this job.
    std::set<std::string> measured_out;
  };

  // What the planner needs for one job, copied out under mu_ so that it
  // runs without the lock.
  struct PlanRequest {
    std::string job_id;
    int64_t attempt = 0;               // ActiveJob::plan_attempt when taken
    std::vector<std::string> workers;  // the job's workers when taken
    apapo::v1::JobSpec spec;
    apapo::v1::ModelProfile profile;
    apapo::v1::ClusterSpec cluster;
    // A growth check: the idle workers planned with the job's (not its).
    std::vector<std::string> candidates;
    // A re-plan on a check: the plan the job runs.
    apapo::v1::Plan running;
    // A check within the tolerance: `running` is only simulated on the
    // calibrated figures (no plan is searched).
    bool simulate_only = false;
  };
  // What the simulator gives the running plan and the re-plan on a check's
  // calibrated figures (0: it could not simulate them).
  struct Simulated {
    double running = 0;
    double chosen = 0;
  };

  void AdmitQueued() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckDeadlines() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves every job whose profiles are in to PLANNING and returns what to
  // plan for each.
  std::vector<PlanRequest> TakePlanRequests() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The cluster the job's profiles describe (records the links measured
  // when `record`).
  PlanRequest MakePlanRequest(ActiveJob& job, bool record = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Growth checks due (see the header comment): plans for running jobs
  // with idle workers added.
  std::vector<PlanRequest> TakeGrowthRequests() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves the candidates if the plan predicts enough gain.
  void CommitGrowth(const PlanRequest& request, absl::StatusOr<apapo::v1::Plan> plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes `report` in the job's check window; closes the window when every
  // rank is check_steps past its start (see the header comment).
  void CheckRunWindow(ActiveJob& job, const std::string& worker_id,
                      const apapo::v1::MetricsReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Plans for the jobs whose check asks for a re-plan, on their calibrated
  // profiles (or, within the tolerance, only simulates their running plan).
  std::vector<PlanRequest> TakeReplanRequests() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a check within the tolerance with the running plan's rate
  // simulated on the run's figures (the planning thread's answer).
  void CommitWithinCheck(const PlanRequest& request, double simulated)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The event of a check within the tolerance, with the running plan's
  // rate simulated on the run's figures where there is one (> 0).
  std::string WithinEvent(const RunCheck& check, double simulated) const;
  // A check the planning thread has not answered yet, recorded without the
  // answer so that every check is reported once: one within the tolerance
  // whenever it is dropped (the job ends, or no longer runs as checked),
  // one past it when the job `ended` first (short jobs end while the
  // planner searches).
  void ReportUnansweredCheck(ActiveJob& job, bool ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the check with the re-plan's answer; takes the re-plan (a
  // restart after the next checkpoint) when it predicts enough.
  void CommitReplan(const PlanRequest& request, absl::StatusOr<apapo::v1::Plan> plan,
                    Simulated simulated) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the planner's answer if the job is still as `request` saw it;
  // otherwise discards it (see the header comment).
  void CommitPlan(const PlanRequest& request,
                  absl::StatusOr<apapo::v1::Plan> plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the job on a planner error; otherwise records the plan, releases
  // the workers it leaves out and assigns rank 0.
  void ApplyPlan(ActiveJob& job, const PlanRequest& request,
                 absl::StatusOr<apapo::v1::Plan> plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends job.profile to the worker of `rank` (an index into job.workers);
  // fails the job if that worker is gone.
  void SendProfile(ActiveJob& job, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once every profile of the round is in (second ones too): sends the
  // workers measured below options_.remeasure_below_speed of the fastest,
  // and not yet profiled again this round, a compute-only ProfileCommand;
  // true if any was sent (the plan waits for them). Called again when the
  // second profiles are in: one that made its worker the fastest has the
  // others, profiled beside each other, measured alone too.
  bool MaybeRemeasure(ActiveJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker's second profile: kept (with the first's link figures) if it
  // computes faster than the first.
  void KeepFasterProfile(ActiveJob& job, const std::string& worker_id,
                         apapo::v1::ProfileResult second)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets `res`'s core set and threads from the registry's entry for the
  // worker and the job's spec (cleared when it has none); that entry.
  std::optional<apapo::v1::WorkerInfo> SetCoreSet(
      const ActiveJob& job, const std::string& worker_id,
      apapo::v1::WorkerResources* res) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Per core set, the compute threads of the workers that jobs other than
  // `job` hold (each its spec's threads_per_worker, else 1, within the
  // worker's CPU quota: apapo::ThreadsWithin).
  std::map<std::string, int> ThreadsElsewhere(const ActiveJob& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills a profile result's core set from the registry and, when the
  // job's workers on those cores hold more threads than cores, scales its
  // profile to what the worker computes alone (planning/core_sharing.h).
  void NoteSharedCores(ActiveJob& job, const std::string& worker_id,
                       apapo::v1::ProfileResult* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The address a worker registered (127.0.0.1 if none).
  std::string HostOf(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AssignRank(ActiveJob& job, const Rank& rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnAck(ActiveJob& job, const std::string& worker_id,
             const apapo::v1::CommandAck& ack) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnMetrics(ActiveJob& job, const std::string& worker_id,
                 const apapo::v1::MetricsReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The newest step whose checkpoint every stage of the job's plan has
  // reported written (0: none).
  static int64_t CheckpointedStep(const ActiveJob& job);
  void OnOutcome(ActiveJob& job, const std::string& worker_id,
                 const apapo::v1::StageOutcome& outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job: stops its stages (unless `already_stopped`), releases
  // workers, records the final state, forgets it.
  void Finish(const std::string& job_id, apapo::v1::JobState state,
              const std::string& message, absl::StatusCode code,
              bool stop_workers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The spec as the workers run it: a checkpoint folder and interval
  // filled in when the job names none. Returns what was filled in, for
  // the job's events ("" when nothing).
  std::string ApplySpecDefaults(const apapo::v1::Job& job,
                                apapo::v1::JobSpec* spec) const;
  // The rendezvous prefix of the job's current attempt.
  static std::string RendezvousPrefix(const ActiveJob& a);
  // kAdopting: every placed stage reported back or ended: run on.
  void MaybeAdopted(ActiveJob& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the profiling of a.workers (link test first with several).
  void StartProfiling(ActiveJob& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fault: `lost` (may be empty) are gone, `cause` says what happened.
  // Restarts the job if its policy allows (see the header comment),
  // otherwise fails it.
  // `joining` (reserved, idle) join the job's workers once the stages are
  // stopped.
  void Recover(ActiveJob& a, const std::vector<std::string>& lost,
               const std::string& cause,
               const std::vector<std::string>& joining = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every stage has ended: take idle workers, then plan, profile or wait.
  void ContinueRecovery(ActiveJob& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `worker_id` from a job that is restarting: released when lost,
  // held back (reserved until the job ends) when `hung`.
  void DropWorker(ActiveJob& a, const std::string& worker_id, bool hung)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first step after a restart: completes its record.
  void OnRecovered(ActiveJob& a, const apapo::v1::MetricsReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ActiveJob* FindByWorker(const std::string& worker_id,
                          const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  JobManager* const jobs_;
  WorkerRegistry* const registry_;
  planning::Planner* const planner_;
  Clock* const clock_;
  const SchedulerOptions options_;
  SchedulerObserver* const observer_;

  absl::Mutex mu_;
  std::map<std::string, ActiveJob> active_ ABSL_GUARDED_BY(mu_);
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_plan_attempt_ ABSL_GUARDED_BY(mu_) = 1;
  // Last "waiting for workers" note per queued job (recorded once each).
  std::map<std::string, std::string> wait_notes_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_SCHEDULER_H_
