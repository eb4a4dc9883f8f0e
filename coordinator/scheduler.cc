#include "coordinator/scheduler.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/threads.h"
#include "planning/core_sharing.h"
#include "planning/network_levels.h"
#include "planning/simulated_trace.h"
#include "google/protobuf/util/time_util.h"

namespace apapo::coordinator {
namespace {

using apapo::v1::JobState;

// The network level's bandwidth when no link was measured (one worker).
constexpr double kAssumedBandwidth = 1e9;
// Transfer CPU figures taken from one worker's profile (it sends 3).
constexpr int kMaxTransferCpuPoints = 8;

google::protobuf::Duration ToProtoDuration(absl::Duration d) {
  return google::protobuf::util::TimeUtil::NanosecondsToDuration(
      absl::ToInt64Nanoseconds(d));
}

// The profile the plan is computed from: the first worker's; the others'
// total compute relative to it gives their relative speed.
double TotalCompute(const apapo::v1::ModelProfile& p) {
  double total = 0;
  for (const auto& n : p.nodes()) total += n.forward_seconds() + n.backward_seconds();
  return total;
}

// spec.fault_tolerance with its defaults (job.proto, FaultTolerance).
int MaxRestarts(const apapo::v1::JobSpec& spec) {
  const auto& f = spec.fault_tolerance();
  return f.has_max_restarts() ? f.max_restarts() : 3;
}

// The samples/s the simulator gives `plan` on `profile` and `cluster`; 0
// when it cannot simulate them (a plan naming nodes the profile lacks).
double SimulatedRate(const apapo::v1::ModelProfile& profile,
                     const apapo::v1::ClusterSpec& cluster, const apapo::v1::Plan& plan) {
  apapo::v1::GetPlanResponse stored;
  *stored.mutable_plan() = plan;
  *stored.mutable_profile() = profile;
  *stored.mutable_cluster() = cluster;
  absl::StatusOr<double> rate = planning::SimulatedSamplesPerSecond(stored);
  return rate.ok() && std::isfinite(*rate) ? *rate : 0;
}

// Every check's event begins so (bench/cluster/run.py parses it).
std::string CheckHead(const RunCheck& check) {
  return absl::StrCat("plan checked against the run: ", check.Describe());
}

int MinWorkers(const apapo::v1::JobSpec& spec) {
  const auto& f = spec.fault_tolerance();
  return f.has_min_workers() ? std::max(1, f.min_workers()) : 1;
}
absl::Duration ReplacementWait(const apapo::v1::JobSpec& spec) {
  const auto& f = spec.fault_tolerance();
  if (!f.has_replacement_wait()) return absl::Minutes(5);
  return absl::Seconds(f.replacement_wait().seconds()) +
         absl::Nanoseconds(f.replacement_wait().nanos());
}

// A stage that ended with one of these failed because of a peer or the
// transport (a dead or hung rank, a cut link), not because of the job:
// restarting on the workers still there may succeed.
bool PeerFault(int code) {
  switch (static_cast<absl::StatusCode>(code)) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

}  // namespace

Scheduler::Scheduler(JobManager* jobs, WorkerRegistry* registry,
                     planning::Planner* planner, Clock* clock, SchedulerOptions options,
                     SchedulerObserver* observer)
    : jobs_(jobs),
      registry_(registry),
      planner_(planner),
      clock_(clock),
      options_(options),
      observer_(observer) {}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start() {
  thread_ = std::thread([this] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return dirty_ || stopping_;
        };
        mu_.AwaitWithTimeout(absl::Condition(&woken), options_.tick);
        if (stopping_) return;
        dirty_ = false;
      }
      RunOnce();
    }
  });
}

void Scheduler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Scheduler::Wake() {
  absl::MutexLock lock(&mu_);
  dirty_ = true;
}

void Scheduler::RunOnce() {
  std::vector<PlanRequest> requests;
  {
    absl::MutexLock lock(&mu_);
    CheckDeadlines();
    requests = TakePlanRequests();
  }
  // The planner may search for seconds on a big model: it runs without mu_,
  // so worker messages, lost workers and cancellations are served meanwhile.
  // CommitPlan re-checks what they changed before anything is sent.
  std::vector<PlanRequest> growth;
  std::vector<PlanRequest> replans;
  {
    absl::MutexLock lock(&mu_);
    growth = TakeGrowthRequests();
    replans = TakeReplanRequests();
  }
  for (const PlanRequest& request : requests) {
    absl::StatusOr<apapo::v1::Plan> plan =
        planner_->MakePlan(request.spec, request.profile, request.cluster);
    absl::MutexLock lock(&mu_);
    CommitPlan(request, std::move(plan));
  }
  for (const PlanRequest& request : growth) {
    absl::StatusOr<apapo::v1::Plan> plan =
        planner_->MakePlan(request.spec, request.profile, request.cluster);
    absl::MutexLock lock(&mu_);
    CommitGrowth(request, std::move(plan));
  }
  for (const PlanRequest& request : replans) {
    if (request.simulate_only) {
      const double rate = SimulatedRate(request.profile, request.cluster, request.running);
      absl::MutexLock lock(&mu_);
      CommitWithinCheck(request, rate);
      continue;
    }
    absl::StatusOr<apapo::v1::Plan> plan =
        planner_->MakePlan(request.spec, request.profile, request.cluster);
    Simulated simulated;
    if (plan.ok()) {
      simulated.running = SimulatedRate(request.profile, request.cluster, request.running);
      simulated.chosen = SimulatedRate(request.profile, request.cluster, *plan);
    }
    absl::MutexLock lock(&mu_);
    CommitReplan(request, std::move(plan), simulated);
  }
  absl::MutexLock lock(&mu_);
  AdmitQueued();
}

void Scheduler::AdmitQueued() {
  for (const std::string& id : jobs_->QueuedJobs()) {
    absl::StatusOr<apapo::v1::Job> job = jobs_->Get(id);
    if (!job.ok() || active_.count(id)) continue;
    const auto& spec = job->spec();
    std::map<std::string, std::string> selector(
        spec.resources().worker_selector().begin(),
        spec.resources().worker_selector().end());
    absl::StatusOr<std::vector<std::string>> workers =
        registry_->Reserve(id, spec.resources().workers(), selector);
    if (!workers.ok()) {
      // Still waiting: say so once per distinct situation.
      std::string note = absl::StrCat("waiting: ", workers.status().message());
      if (wait_notes_[id] != note) {
        wait_notes_[id] = note;
        jobs_->RecordEvent(id, note).IgnoreError();
      }
      // Jobs are admitted in order: a later, smaller job may still fit.
      continue;
    }
    wait_notes_.erase(id);
    ActiveJob& a = active_[id];
    a.id = id;
    a.spec = spec;
    a.workers = *workers;
    a.admitted = clock_->Now();
    jobs_->SetWorkers(id, a.workers).IgnoreError();
    absl::Status s = jobs_->Transition(
        id, apapo::v1::JOB_STATE_PROFILING,
        absl::StrCat("profiling on ", absl::StrJoin(a.workers, ", ")));
    if (!s.ok()) {  // cancelled in between
      registry_->Release(id, a.workers);
      active_.erase(id);
      continue;
    }
    const std::string defaults = ApplySpecDefaults(*job, &a.spec);
    if (!defaults.empty()) jobs_->RecordEvent(id, defaults).IgnoreError();
    StartProfiling(a);
  }
}

std::string Scheduler::ApplySpecDefaults(const apapo::v1::Job& job,
                                         apapo::v1::JobSpec* spec) const {
  // Checkpoints are on by default, so that a fault costs at most one
  // interval: into a folder of the job's own under the root, named by the
  // job's id and submit time, so that a coordinator whose state was reset
  // (its ids start over) never resumes a job from another's checkpoint.
  apapo::v1::CheckpointSpec& checkpoint = *spec->mutable_checkpoint();
  if (checkpoint.directory().empty() && !options_.checkpoint_root.empty()) {
    checkpoint.set_directory(absl::StrCat(options_.checkpoint_root, "/", job.id(), ".",
                                          job.create_time().seconds()));
  }
  if (checkpoint.directory().empty()) return "";
  if (checkpoint.every_steps() <= 0) {
    checkpoint.set_every_steps(options_.checkpoint_every_steps);
  }
  return absl::StrCat("checkpoints every ", checkpoint.every_steps(), " steps in ",
                      checkpoint.directory());
}

std::string Scheduler::RendezvousPrefix(const ActiveJob& a) {
  return a.restarts == 0 ? a.id : absl::StrCat(a.id, "/r", a.restarts);
}

void Scheduler::AdoptRunningJobs() {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : jobs_->JobsIn(apapo::v1::JOB_STATE_RUNNING)) {
    absl::StatusOr<apapo::v1::Job> job = jobs_->Get(id);
    absl::StatusOr<apapo::v1::GetPlanResponse> stored = jobs_->GetPlan(id);
    if (!job.ok() || !stored.ok()) continue;
    ActiveJob& a = active_[id];
    a.id = id;
    a.spec = job->spec();
    ApplySpecDefaults(*job, &a.spec);
    a.workers.assign(job->worker_ids().begin(), job->worker_ids().end());
    a.restarts = job->restarts();
    a.plan = stored->plan();
    a.admitted = absl::FromUnixSeconds(job->start_time().seconds());
    for (const auto& st : a.plan.stages()) {
      for (int r = 0; r < st.placement_size(); ++r) {
        a.ranks.push_back({st.placement(r).worker_id(), st.index(), r,
                           st.placement(r).rank()});
      }
    }
    // The profiles the plan came from, for a re-plan without profiling.
    for (const auto& w : stored->cluster().workers()) {
      apapo::v1::ProfileResult& p = a.profiles[w.worker_id()];
      *p.mutable_profile() = stored->profile();
      *p.mutable_resources() = w;
      for (const auto& link : stored->cluster().links()) {
        if (link.from_worker() == w.worker_id()) *p.add_links() = link;
      }
    }
    a.rendezvous.set_prefix(RendezvousPrefix(a));
    a.phase = Phase::kAdopting;
    a.deadline = clock_->Now() + options_.adopt_timeout;
    jobs_->RecordEvent(id, absl::StrCat("waiting up to ",
                                        absl::FormatDuration(options_.adopt_timeout),
                                        " for ", absl::StrJoin(a.workers, ", "),
                                        " to report their stages"))
        .IgnoreError();
  }
}

void Scheduler::OnWorkerRegistered(const apapo::v1::WorkerInfo& info) {
  absl::MutexLock lock(&mu_);
  dirty_ = true;
  const std::string& w = info.worker_id();
  for (const apapo::v1::RunningStage& stage : info.running()) {
    auto it = active_.find(stage.job_id());
    bool expected = false;
    if (it != active_.end() && it->second.phase == Phase::kAdopting &&
        stage.rendezvous_prefix() == RendezvousPrefix(it->second)) {
      for (const Rank& r : it->second.ranks) {
        expected |= r.worker_id == w && r.rank == stage.rank();
      }
    }
    if (expected) {
      ActiveJob& a = it->second;
      a.adopted.insert(w);
      jobs_->RecordEvent(a.id, absl::StrFormat("%s reported back: stage %d training, "
                                               "step %d",
                                               w, stage.stage(), stage.step()))
          .IgnoreError();
      MaybeAdopted(a);
      continue;
    }
    // Not a stage this coordinator expects: stop it, free the worker.
    apapo::v1::CoordinatorMessage m;
    m.mutable_stop()->set_job_id(stage.job_id());
    m.mutable_stop()->set_reason(absl::StrCat(
        "stage ", stage.stage(), " of ", stage.job_id(), " (", stage.rendezvous_prefix(),
        ") is not part of a running job here"));
    registry_->Send(w, m).IgnoreError();
    registry_->Release(stage.job_id(), {w});
  }
}

void Scheduler::MaybeAdopted(ActiveJob& a) {
  if (a.phase != Phase::kAdopting) return;
  for (const Rank& r : a.ranks) {
    if (!a.adopted.count(r.worker_id) && !a.outcomes.count(r.worker_id)) return;
  }
  a.phase = Phase::kRunning;
  jobs_->RecordEvent(a.id, absl::StrCat("adopted: all ", a.ranks.size(),
                                        " stage(s) trained on while the coordinator "
                                        "was away"))
      .IgnoreError();
}

void Scheduler::StartProfiling(ActiveJob& a) {
  a.phase = Phase::kProfiling;
  a.deadline = clock_->Now() + options_.profile_timeout;
  a.profiles.clear();
  a.core_set_members.clear();
  a.core_set_elsewhere.clear();
  a.plan_ready = false;
  a.remeasuring.clear();
  a.remeasured.clear();
  a.profile = apapo::v1::ProfileCommand();
  a.profile.set_job_id(a.id);
  *a.profile.mutable_spec() = a.spec;
  a.profile.set_iterations(options_.profile_iterations);
  if (a.workers.size() == 1) {
    SendProfile(a, 0);  // no link to measure
    return;
  }
  // The workers measure their links through a rendezvous hosted by the
  // first, which is sent its command first and reports the store's port
  // (OnAck); the others follow.
  for (const std::string& w : a.workers) a.profile.add_peers(w);
  apapo::v1::Rendezvous* rv = a.profile.mutable_rendezvous();
  rv->set_store_host(HostOf(a.workers[0]));
  rv->set_store_port(0);
  rv->set_prefix(a.restarts == 0 ? absl::StrCat(a.id, "/profile")
                                 : absl::StrCat(a.id, "/r", a.restarts, "/profile"));
  rv->set_world_size(static_cast<int>(a.workers.size()));
  *rv->mutable_timeout() = ToProtoDuration(options_.transfer_timeout);
  rv->set_backend("gloo");
  SendProfile(a, 0);
}

void Scheduler::SendProfile(ActiveJob& a, int rank) {
  const std::string& w = a.workers[rank];
  apapo::v1::CoordinatorMessage m;
  *m.mutable_profile() = a.profile;
  if (a.profile.has_rendezvous()) {
    m.mutable_profile()->mutable_rendezvous()->set_rank(rank);
  }
  absl::StatusOr<int64_t> command = registry_->Send(w, m);
  if (!command.ok()) {
    Finish(a.id, apapo::v1::JOB_STATE_FAILED,
           absl::StrCat("worker ", w, " disconnected before profiling"),
           absl::StatusCode::kUnavailable, /*stop_workers=*/true);
    return;
  }
  if (rank == 0) a.profile_host_command = *command;
}

bool Scheduler::MaybeRemeasure(ActiveJob& a) {
  if (options_.remeasure_below_speed <= 0 || a.workers.size() < 2) return false;
  std::string fastest_worker;
  double fastest = 0;  // the least total compute
  for (const std::string& w : a.workers) {
    const double t = TotalCompute(a.profiles[w].profile());
    if (t > 0 && (fastest == 0 || t < fastest)) {
      fastest = t;
      fastest_worker = w;
    }
  }
  if (fastest <= 0) return false;
  // The fastest as profiled alone (a second round kept its faster
  // profile): the others' first profiles were taken side by side, in
  // whatever spell slowed the first round, so they are measured alone too.
  // Each worker is profiled again at most once a round, so this ends.
  const bool against_alone = a.remeasured.count(fastest_worker) > 0;
  std::vector<std::string> slow;
  for (const std::string& w : a.workers) {
    if (a.remeasured.count(w)) continue;
    const apapo::v1::ProfileResult& r = a.profiles[w];
    // A worker whose cores the job's others crowded while it profiled had
    // its profile scaled to alone (NoteSharedCores); profiled alone, it
    // would be scaled for company it did not have.
    const apapo::v1::WorkerResources& res = r.resources();
    if (!res.core_set().empty() &&
        planning::ShareOfCores(res.core_set_size(), std::max(1, res.threads()),
                               std::max(1, a.core_set_members[res.core_set()]),
                               a.core_set_elsewhere[res.core_set()]) < 1) {
      continue;
    }
    const double t = TotalCompute(r.profile());
    if (t > 0 && fastest / t < options_.remeasure_below_speed) slow.push_back(w);
  }
  if (slow.empty()) return false;
  apapo::v1::CoordinatorMessage m;
  *m.mutable_profile() = a.profile;
  m.mutable_profile()->clear_rendezvous();  // the model alone: links stand
  m.mutable_profile()->clear_peers();
  for (const std::string& w : slow) {
    const double speed = fastest / TotalCompute(a.profiles[w].profile());
    absl::StatusOr<int64_t> command = registry_->Send(w, m);
    if (!command.ok()) {
      Finish(a.id, apapo::v1::JOB_STATE_FAILED,
             absl::StrCat("worker ", w, " disconnected before profiling"),
             absl::StatusCode::kUnavailable, /*stop_workers=*/true);
      return true;
    }
    a.remeasuring[*command] = w;
    a.remeasured.insert(w);
    jobs_->RecordEvent(a.id,
                       against_alone
                           ? absl::StrFormat("%s computed at %.2fx the speed of %s, which was "
                                             "profiled alone: profiling it once more, alone",
                                             w, speed, fastest_worker)
                           : absl::StrFormat("%s computed at %.2fx the fastest worker's "
                                             "speed: profiling it once more, alone",
                                             w, speed))
        .IgnoreError();
  }
  a.deadline = clock_->Now() + options_.profile_timeout;
  return true;
}

void Scheduler::KeepFasterProfile(ActiveJob& a, const std::string& worker_id,
                                  apapo::v1::ProfileResult second) {
  apapo::v1::ProfileResult& first = a.profiles[worker_id];
  NoteSharedCores(a, worker_id, &second);
  const double before = TotalCompute(first.profile());
  const double after = TotalCompute(second.profile());
  const bool faster = after > 0 && after < before;
  jobs_->RecordEvent(a.id, absl::StrFormat(
                               "%s profiled again: %.2fx the time of its first "
                               "profile; %s",
                               worker_id, before > 0 ? after / before : 0.0,
                               faster ? "the second is kept"
                                      : "the first is kept"))
      .IgnoreError();
  if (!faster) return;
  // The link test ran only in the first round.
  *second.mutable_links() = first.links();
  if (first.has_allreduce()) *second.mutable_allreduce() = first.allreduce();
  if (first.has_large_allreduce()) {
    *second.mutable_large_allreduce() = first.large_allreduce();
  }
  if (first.has_host_allreduce()) {
    *second.mutable_host_allreduce() = first.host_allreduce();
  }
  first = std::move(second);
}

std::optional<apapo::v1::WorkerInfo> Scheduler::SetCoreSet(
    const ActiveJob& a, const std::string& worker_id,
    apapo::v1::WorkerResources* res) {
  // The registry's (checked at registration), never a profile result's.
  res->clear_core_set();
  res->clear_core_set_size();
  res->clear_threads();
  res->clear_threads_elsewhere();
  std::optional<apapo::v1::WorkerInfo> info = registry_->Info(worker_id);
  if (!info.has_value() || info->core_set().empty()) return std::nullopt;
  res->set_core_set(info->core_set());
  res->set_core_set_size(info->core_set_size());
  // A stage computes with the spec's threads, else one, within the
  // worker's CPU quota (StageThreads).
  res->set_threads(ThreadsWithin(a.spec.resources().threads_per_worker(), info->cpu_quota()));
  return info;
}

std::map<std::string, int> Scheduler::ThreadsElsewhere(const ActiveJob& job) {
  std::map<std::string, int> threads;
  for (const auto& [id, other] : active_) {
    if (id == job.id) continue;
    for (const std::string& w : other.workers) {
      std::optional<apapo::v1::WorkerInfo> info = registry_->Info(w);
      if (info.has_value() && !info->core_set().empty()) {
        threads[info->core_set()] +=
            ThreadsWithin(other.spec.resources().threads_per_worker(), info->cpu_quota());
      }
    }
  }
  return threads;
}

void Scheduler::NoteSharedCores(ActiveJob& a, const std::string& worker_id,
                                apapo::v1::ProfileResult* result) {
  std::optional<apapo::v1::WorkerInfo> info =
      SetCoreSet(a, worker_id, result->mutable_resources());
  if (!info.has_value()) return;
  const int threads = result->resources().threads();
  // The job's workers on the same cores profiled beside it, and other
  // jobs' trained there: its times are scaled to what it computes alone.
  // Counted once per round (one registry lookup a worker, not one per
  // worker and result).
  if (a.core_set_members.empty()) {
    for (const std::string& w : a.workers) {
      std::optional<apapo::v1::WorkerInfo> other = registry_->Info(w);
      if (other.has_value() && !other->core_set().empty()) {
        ++a.core_set_members[other->core_set()];
      }
    }
    a.core_set_elsewhere = ThreadsElsewhere(a);
  }
  const int beside = a.core_set_members[info->core_set()];
  const int elsewhere = a.core_set_elsewhere[info->core_set()];
  const double share = planning::ShareOfCores(info->core_set_size(), threads,
                                              std::max(1, beside), elsewhere);
  if (share >= 1) return;
  planning::ProfiledAlone(share, result->mutable_profile());
  jobs_->RecordEvent(a.id, absl::StrFormat(
                               "%s shares %d core(s) with %d of the job's workers "
                               "at %d thread(s) each%s: its profile is scaled to "
                               "%.2f of the times measured",
                               worker_id, info->core_set_size(), beside - 1, threads,
                               elsewhere > 0
                                   ? absl::StrFormat(" and %d thread(s) of other jobs",
                                                     elsewhere)
                                   : std::string(),
                               share))
      .IgnoreError();
}

std::string Scheduler::HostOf(const std::string& worker_id) {
  std::optional<apapo::v1::WorkerInfo> info = registry_->Info(worker_id);
  return info.has_value() && !info->host().empty() ? info->host() : "127.0.0.1";
}

std::vector<Scheduler::PlanRequest> Scheduler::TakePlanRequests() {
  std::vector<PlanRequest> requests;
  for (auto& [id, a] : active_) {
    if (a.phase != Phase::kProfiling || !a.plan_ready) continue;
    a.phase = Phase::kPlanning;
    if (!jobs_->Transition(id, apapo::v1::JOB_STATE_PLANNING,
                           "profiles in; planning").ok()) {
      continue;  // ended meanwhile; its hook or deadline cleans up
    }
    a.plan_attempt = next_plan_attempt_++;
    requests.push_back(MakePlanRequest(a));
  }
  return requests;
}

Scheduler::PlanRequest Scheduler::MakePlanRequest(ActiveJob& a, bool record) {
  PlanRequest request;
  request.job_id = a.id;
  request.attempt = a.plan_attempt;
  request.workers = a.workers;
  request.spec = a.spec;
  // Cluster: reserved workers grouped by the network levels their measured
  // links show (planning/network_levels.h), speed relative to the first.
  request.profile = a.profiles[a.workers[0]].profile();
  double reference = TotalCompute(request.profile);
  apapo::v1::ClusterSpec& cluster = request.cluster;
  std::vector<apapo::v1::LinkMeasurement> links;
  // Links to workers the job no longer holds (lost since they were
  // measured) are left out.
  const std::set<std::string> held(a.workers.begin(), a.workers.end());
  for (const std::string& w : a.workers) {
    for (const auto& link : a.profiles[w].links()) {
      if (held.count(link.from_worker()) && held.count(link.to_worker())) {
        links.push_back(link);
      }
    }
  }
  const planning::NetworkLevels levels =
      planning::InferNetworkLevels(a.workers, links);
  // Other jobs' threads on the workers' cores now (not when profiled).
  std::map<std::string, int> elsewhere = ThreadsElsewhere(a);
  for (int index : levels.order) {
    const std::string& w = a.workers[index];
    const apapo::v1::ProfileResult& r = a.profiles[w];
    apapo::v1::WorkerResources* res = cluster.add_workers();
    *res = r.resources();
    res->set_worker_id(w);
    if (!res->core_set().empty()) res->set_threads_elsewhere(elsewhere[res->core_set()]);
    double mine = TotalCompute(r.profile());
    if (res->relative_speed() <= 0) {
      res->set_relative_speed(mine > 0 && reference > 0 ? reference / mine : 1.0);
    }
    if (a.spec.resources().memory_per_worker_bytes() > 0) {
      res->set_memory_bytes(a.spec.resources().memory_per_worker_bytes());
    }
  }
  for (const auto& link : links) *cluster.add_links() = link;
  for (const std::string& w : a.workers) {
    const apapo::v1::ProfileResult& r = a.profiles[w];
    if (r.has_allreduce()) *cluster.add_allreduces() = r.allreduce();
    if (r.has_large_allreduce()) {
      *cluster.add_allreduces() = r.large_allreduce();
    }
    // The one inside the worker's host, where it names the worker among
    // distinct workers the job still holds, as many as took part (as
    // links, a worker lost since is left out; a worker's report is not
    // trusted to name others).
    if (r.has_host_allreduce()) {
      const auto& ids = r.host_allreduce().worker_ids();
      const std::set<std::string> named(ids.begin(), ids.end());
      const bool sound =
          ids.size() >= 2 && static_cast<int>(named.size()) == ids.size() &&
          r.host_allreduce().ranks() == ids.size() && named.count(w) &&
          std::all_of(ids.begin(), ids.end(),
                      [&](const std::string& id) { return held.count(id) > 0; });
      if (sound) *cluster.add_allreduces() = r.host_allreduce();
    }
    if (r.has_checkpoint()) {
      apapo::v1::CheckpointMeasurement* c = cluster.add_checkpoints();
      *c = r.checkpoint();
      c->set_worker_id(w);
    }
    // A worker times 3 sizes; a longer list is cut, so no worker can make
    // the planner's cost curve (walked in its inner loop) long.
    int kept = 0;
    for (const auto& t : r.transfer_cpu()) {
      if (++kept > kMaxTransferCpuPoints) break;
      apapo::v1::TransferCpuMeasurement* c = cluster.add_transfer_cpu();
      *c = t;
      c->set_worker_id(w);
    }
  }
  if (levels.levels.empty()) {  // nothing measured (one worker)
    apapo::v1::NetworkLevel* level = cluster.add_levels();
    level->set_group_size(static_cast<int>(a.workers.size()));
    level->set_bandwidth_bytes_per_second(kAssumedBandwidth);
    return request;
  }
  for (const auto& level : levels.levels) *cluster.add_levels() = level;
  if (record) {
    jobs_->RecordEvent(a.id, absl::StrFormat("links measured: %d; network %s",
                                             cluster.links_size(),
                                             levels.description))
        .IgnoreError();
  }
  return request;
}

std::vector<Scheduler::PlanRequest> Scheduler::TakeGrowthRequests() {
  std::vector<PlanRequest> requests;
  const absl::Time now = clock_->Now();
  for (auto& [id, a] : active_) {
    const auto& f = a.spec.fault_tolerance();
    const int max_workers = f.has_max_workers() ? f.max_workers() : a.spec.resources().workers();
    if (a.phase != Phase::kRunning || a.awaiting_first_step || !a.growing.empty() ||
        a.replan_at_step > 0 || a.check_pending ||
        static_cast<int>(a.workers.size()) >= max_workers ||
        a.restarts >= MaxRestarts(a.spec) || a.spec.checkpoint().directory().empty() ||
        a.workers.empty() || !a.profiles.count(a.workers[0]) || now < a.next_growth_check) {
      continue;
    }
    a.next_growth_check = now + options_.growth_check_every;
    // Worth a restart only with enough training left.
    absl::StatusOr<apapo::v1::Job> job = jobs_->Get(id);
    if (!job.ok()) continue;
    const auto& p = job->progress();
    const double steps_per_second =
        p.samples_per_second() / std::max(1, a.spec.data().batch_size());
    if (steps_per_second <= 0 || p.total_steps() <= p.step() ||
        absl::Seconds((p.total_steps() - p.step()) / steps_per_second) <
            options_.growth_min_remaining) {
      continue;
    }
    std::map<std::string, std::string> selector(
        a.spec.resources().worker_selector().begin(),
        a.spec.resources().worker_selector().end());
    std::vector<std::string> idle = registry_->IdleMatching(
        max_workers - static_cast<int>(a.workers.size()), selector, a.measured_out);
    if (idle.empty()) continue;
    // The newcomers, as the planner sees them: like the job's first worker,
    // over the slowest link measured (none measured: the assumed one).
    ActiveJob hypothetical = a;
    const apapo::v1::ProfileResult& like = a.profiles[a.workers[0]];
    const apapo::v1::LinkMeasurement* slowest = nullptr;
    for (const auto& [w, r] : a.profiles) {
      for (const auto& link : r.links()) {
        if (slowest == nullptr ||
            link.bandwidth_bytes_per_second() < slowest->bandwidth_bytes_per_second()) {
          slowest = &link;
        }
      }
    }
    for (const std::string& n : idle) {
      apapo::v1::ProfileResult r = like;
      r.mutable_resources()->set_worker_id(n);
      SetCoreSet(a, n, r.mutable_resources());
      r.clear_links();
      hypothetical.workers.push_back(n);
      hypothetical.profiles[n] = r;
    }
    if (slowest != nullptr) {
      for (const std::string& n : idle) {
        for (const std::string& w : hypothetical.workers) {
          if (w == n) continue;
          for (const auto& [from, to] : {std::pair{n, w}, std::pair{w, n}}) {
            apapo::v1::LinkMeasurement link = *slowest;
            link.set_from_worker(from);
            link.set_to_worker(to);
            *hypothetical.profiles[from].add_links() = link;
          }
        }
      }
    }
    PlanRequest request = MakePlanRequest(hypothetical, /*record=*/false);
    request.workers = a.workers;  // what the job must still hold to grow
    request.candidates = idle;
    requests.push_back(std::move(request));
  }
  return requests;
}

void Scheduler::CommitGrowth(const PlanRequest& request,
                             absl::StatusOr<apapo::v1::Plan> plan) {
  auto it = active_.find(request.job_id);
  if (it == active_.end() || !plan.ok()) return;
  ActiveJob& a = it->second;
  if (a.phase != Phase::kRunning || a.workers != request.workers || !a.growing.empty() ||
      a.replan_at_step > 0) {
    return;
  }
  const double now_sps = a.plan.prediction().samples_per_second();
  const double gain = now_sps > 0 ? plan->prediction().samples_per_second() / now_sps : 0;
  const std::string who = absl::StrJoin(request.candidates, ", ");
  if (gain < options_.growth_gain) {
    std::string note = absl::StrFormat(
        "%s idle: the planner predicts %.2fx the samples/s with it, below the "
        "%.2fx a restart needs; not taken",
        who, gain, options_.growth_gain);
    if (note != a.growth_note) {
      a.growth_note = note;
      jobs_->RecordEvent(a.id, note).IgnoreError();
    }
    return;
  }
  std::map<std::string, std::string> selector(
      a.spec.resources().worker_selector().begin(),
      a.spec.resources().worker_selector().end());
  std::vector<std::string> joined = registry_->ReserveUpTo(
      a.id, static_cast<int>(request.candidates.size()), selector, a.measured_out);
  if (joined.empty()) return;
  absl::StatusOr<apapo::v1::Job> job = jobs_->Get(a.id);
  const int64_t step = job.ok() ? job->progress().step() : 0;
  const int64_t every = std::max<int64_t>(1, a.spec.checkpoint().every_steps());
  a.growing = joined;
  a.grow_gain = gain;
  a.grow_at_step = (step / every + 1) * every;
  jobs_->RecordEvent(
           a.id, absl::StrFormat("%s idle: the planner predicts %.2fx the samples/s "
                                 "with it (%.2fx needed); taking it in after the "
                                 "checkpoint of step %d",
                                 absl::StrJoin(joined, ", "), gain, options_.growth_gain,
                                 a.grow_at_step))
      .IgnoreError();
}

void Scheduler::CheckRunWindow(ActiveJob& a, const std::string& worker_id,
                               const apapo::v1::MetricsReport& report) {
  if (a.checked || a.phase != Phase::kRunning) return;
  if (!a.window_start.count(worker_id)) {
    if (report.step() - report.resumed_step() >= options_.check_warmup_steps) {
      a.window_start[worker_id] = report;
    }
    return;
  }
  for (const Rank& r : a.ranks) {
    auto first = a.window_start.find(r.worker_id);
    auto last = a.latest.find(r.worker_id);
    if (first == a.window_start.end() || last == a.latest.end() ||
        last->second.step() - first->second.step() < options_.check_steps) {
      return;
    }
  }
  a.checked = true;
  std::optional<RunCheck> check =
      CheckRun(a.plan, a.spec.data().batch_size(), a.window_start, a.latest);
  a.window_start.clear();
  if (!check.has_value()) return;  // counters that account no time
  // Within the tolerance too, the running plan is simulated on the run's
  // own compute (no plan is searched): what is left between that and the
  // measurement is the cost model's error, the rest this machine's drift.
  a.check_within = check->Within(options_.check_tolerance);
  a.calibrated = CalibratedProfiles(a.profiles, *check,
                                    a.workers.empty() ? std::string() : a.workers[0]);
  a.check = std::move(check);
  a.check_pending = true;
  dirty_ = true;
}

void Scheduler::ReportUnansweredCheck(ActiveJob& a, bool ended) {
  // Taken or not, a check keeps its figures until it is recorded (one past
  // the tolerance is recorded once a re-plan answers it: replan_at_step).
  if (!a.check.has_value() || a.replan_at_step > 0) return;
  if (a.check_within) {
    jobs_->RecordEvent(a.id, WithinEvent(*a.check, 0)).IgnoreError();
  } else if (ended) {
    jobs_->RecordEvent(a.id, absl::StrCat(CheckHead(*a.check),
                                          "; the job ended before it was planned again "
                                          "on these figures"))
        .IgnoreError();
  } else {
    return;  // dropped with the attempt, as before
  }
  a.check.reset();
}

std::string Scheduler::WithinEvent(const RunCheck& check, double simulated) const {
  std::string event = absl::StrFormat("%s; within %.0f%%", CheckHead(check),
                                      100 * options_.check_tolerance);
  if (simulated > 0) {
    absl::StrAppendFormat(&event,
                          "; on these figures the running plan simulates at %.1f "
                          "samples/s",
                          simulated);
  }
  return event;
}

void Scheduler::CommitWithinCheck(const PlanRequest& request, double simulated) {
  auto it = active_.find(request.job_id);
  if (it == active_.end() || !it->second.check.has_value()) return;
  ActiveJob& a = it->second;
  // The check is recorded whatever happened meanwhile; the simulation only
  // while the job runs on the workers it was made for.
  const bool same = a.phase == Phase::kRunning && a.workers == request.workers;
  jobs_->RecordEvent(a.id, WithinEvent(*a.check, same ? simulated : 0)).IgnoreError();
  a.check.reset();
  a.calibrated.clear();
}

std::vector<Scheduler::PlanRequest> Scheduler::TakeReplanRequests() {
  std::vector<PlanRequest> requests;
  for (auto& [id, a] : active_) {
    if (!a.check_pending) continue;
    a.check_pending = false;
    if (a.phase != Phase::kRunning || !a.growing.empty() || a.workers.empty()) {
      ReportUnansweredCheck(a, /*ended=*/false);
      a.check.reset();
      a.calibrated.clear();
      continue;
    }
    ActiveJob calibrated = a;
    calibrated.profiles = a.calibrated;
    PlanRequest request = MakePlanRequest(calibrated, /*record=*/false);
    request.running = a.plan;
    request.simulate_only = a.check_within;
    requests.push_back(std::move(request));
  }
  return requests;
}

void Scheduler::CommitReplan(const PlanRequest& request,
                             absl::StatusOr<apapo::v1::Plan> plan, Simulated simulated) {
  auto it = active_.find(request.job_id);
  if (it == active_.end()) return;
  ActiveJob& a = it->second;
  if (a.phase != Phase::kRunning || a.workers != request.workers ||
      !a.check.has_value() || a.replan_at_step > 0 || !a.growing.empty()) {
    return;
  }
  const RunCheck& check = *a.check;
  const std::string head = CheckHead(check);
  auto done = [&](const std::string& what) {
    jobs_->RecordEvent(a.id, absl::StrCat(head, "; ", what)).IgnoreError();
    a.check.reset();
    a.calibrated.clear();
  };
  if (!plan.ok()) {
    done(absl::StrCat("planning on these figures failed (", plan.status().message(),
                      "); kept"));
    return;
  }
  // Both plans on the same calibrated figures where the simulator takes
  // them; else the new plan's prediction against the measured rate.
  const bool simulated_both = simulated.running > 0 && simulated.chosen > 0;
  const std::string running =
      simulated_both ? absl::StrFormat("on these figures the running plan simulates at "
                                       "%.1f samples/s",
                                       simulated.running)
                     : std::string("on these figures");
  if (SameShape(*plan, a.plan)) {
    done(absl::StrCat(running, "; the planner chooses it again; kept"));
    return;
  }
  const double gain =
      simulated_both ? simulated.chosen / simulated.running
                     : plan->prediction().samples_per_second() /
                           check.measured_samples_per_second;
  const std::string other =
      simulated_both
          ? absl::StrFormat("%s, the planner's choice, %s, at %.1f: %.2fx", running,
                            ShapeOf(*plan), simulated.chosen, gain)
          : absl::StrFormat("%s the planner chooses %s, predicted %.1f samples/s: "
                            "%.2fx the measured",
                            running, ShapeOf(*plan), plan->prediction().samples_per_second(),
                            gain);
  absl::StatusOr<apapo::v1::Job> job = jobs_->Get(a.id);
  const auto& p = job.ok() ? job->progress() : apapo::v1::JobProgress();
  const double steps_per_second =
      check.measured_samples_per_second / std::max(1, a.spec.data().batch_size());
  std::string kept;
  if (gain < options_.replan_gain) {
    kept = absl::StrFormat("below the %.2fx a restart needs; kept", options_.replan_gain);
  } else if (!a.spec.schedule().replan_on_measurement()) {
    kept = "kept: spec.schedule.replan_on_measurement is off";
  } else if (a.replanned) {
    kept = "kept: the job restarted on a check before";
  } else if (a.restarts >= MaxRestarts(a.spec)) {
    kept = "kept: no restarts left (spec.fault_tolerance.max_restarts)";
  } else if (a.spec.checkpoint().directory().empty()) {
    kept = "kept: the job does not checkpoint";
  } else if (p.total_steps() <= p.step() ||
             absl::Seconds((p.total_steps() - p.step()) / steps_per_second) <
                 options_.growth_min_remaining) {
    kept = "kept: too little training left for a restart";
  }
  if (!kept.empty()) {
    done(absl::StrCat(other, "; ", kept));
    return;
  }
  const int64_t every = std::max<int64_t>(1, a.spec.checkpoint().every_steps());
  a.replan_at_step = (p.step() / every + 1) * every;
  a.replan_gain = gain;
  jobs_->RecordEvent(a.id, absl::StrFormat("%s; %s; restarting on it after the "
                                           "checkpoint of step %d",
                                           head, other, a.replan_at_step))
      .IgnoreError();
}

void Scheduler::CommitPlan(const PlanRequest& request,
                           absl::StatusOr<apapo::v1::Plan> plan) {
  const std::string& id = request.job_id;
  auto it = active_.find(id);
  // Cancelled, failed by a lost worker, or planned again while the planner
  // ran: the plan is for a job that no longer exists in that form.
  if (it == active_.end() || it->second.plan_attempt != request.attempt ||
      it->second.phase != Phase::kPlanning) {
    return;
  }
  ActiveJob& a = it->second;
  a.plan_attempt = 0;
  if (a.workers != request.workers) {
    // The plan places workers the job no longer holds: plan again once
    // every worker it holds has profiled.
    a.phase = Phase::kProfiling;
    a.plan_ready = std::all_of(
        a.workers.begin(), a.workers.end(),
        [&](const std::string& w) { return a.profiles.count(w) > 0; });
    dirty_ = true;
    jobs_->RecordEvent(id, "workers changed while planning; planning again")
        .IgnoreError();
    return;
  }
  // Cancelled after the planner started, its hook not run yet: the hook
  // stops the workers and forgets the job; nothing must be assigned.
  absl::StatusOr<apapo::v1::Job> job = jobs_->Get(id);
  if (!job.ok() || job->state() != apapo::v1::JOB_STATE_PLANNING) return;
  ApplyPlan(a, request, std::move(plan));
}

void Scheduler::ApplyPlan(ActiveJob& a, const PlanRequest& request,
                          absl::StatusOr<apapo::v1::Plan> plan) {
  const std::string id = a.id;
  if (!plan.ok()) {
    Finish(id, apapo::v1::JOB_STATE_FAILED,
           absl::StrCat("planning failed: ", plan.status().message()),
           plan.status().code(), /*stop_workers=*/false);
    return;
  }
  // Ranks, stage-major; any replica without a placement gets a free worker.
  std::set<std::string> used;
  for (const auto& st : plan->stages()) {
    for (const auto& p : st.placement()) used.insert(p.worker_id());
  }
  std::vector<std::string> spare;
  for (const auto& w : a.workers) {
    if (!used.count(w)) spare.push_back(w);
  }
  a.ranks.clear();
  for (auto& st : *plan->mutable_stages()) {
    while (st.placement_size() < std::max(1, st.replicas())) {
      if (spare.empty()) {
        Finish(id, apapo::v1::JOB_STATE_FAILED,
               "planning failed: the plan needs more workers than reserved",
               absl::StatusCode::kInternal, false);
        return;
      }
      st.add_placement()->set_worker_id(spare.back());
      spare.pop_back();
    }
    for (int r = 0; r < st.placement_size(); ++r) {
      st.mutable_placement(r)->set_rank(static_cast<int>(a.ranks.size()));
      a.ranks.push_back({st.placement(r).worker_id(), st.index(), r,
                         static_cast<int>(a.ranks.size())});
    }
  }
  const bool on_measurement = !a.calibration_note.empty();
  if (on_measurement) {
    plan->add_notes(a.calibration_note);
    a.calibration_note.clear();
  }
  a.plan = *plan;
  apapo::v1::GetPlanResponse stored;
  *stored.mutable_plan() = a.plan;
  *stored.mutable_profile() = request.profile;
  *stored.mutable_cluster() = request.cluster;
  jobs_->SetPlan(id, stored).IgnoreError();
  jobs_->RecordEvent(
           id, absl::StrFormat("planned %d stage(s) on %d worker(s): predicted "
                               "%.1f samples/s",
                               a.plan.stages_size(), a.ranks.size(),
                               a.plan.prediction().samples_per_second()))
      .IgnoreError();
  // Workers the plan leaves out go back to the pool.
  if (!spare.empty()) {
    registry_->Release(id, spare);
    a.workers.erase(std::remove_if(a.workers.begin(), a.workers.end(),
                                   [&](const std::string& w) {
                                     return std::count(spare.begin(), spare.end(), w) > 0;
                                   }),
                    a.workers.end());
    jobs_->SetWorkers(id, a.workers).IgnoreError();
    jobs_->RecordEvent(id, absl::StrCat("plan leaves ", absl::StrJoin(spare, ", "),
                                        " unused; released",
                                        on_measurement
                                            ? " (measured too slow for it: not grown into "
                                              "again by this job)"
                                            : ""))
        .IgnoreError();
    // A growth would see them as fresh workers, like the first (it has no
    // measurement of idle ones) and take them back on a profile the run
    // contradicted: restart after restart.
    if (on_measurement) a.measured_out.insert(spare.begin(), spare.end());
  }

  // The rank-0 worker hosts the store; it is assigned first.
  a.rendezvous.set_store_host(HostOf(a.ranks[0].worker_id));
  a.rendezvous.set_store_port(0);
  a.rendezvous.set_prefix(RendezvousPrefix(a));
  a.rendezvous.set_world_size(static_cast<int>(a.ranks.size()));
  *a.rendezvous.mutable_timeout() = ToProtoDuration(options_.transfer_timeout);
  a.rendezvous.set_backend(a.spec.resources().device() == "cuda" ? "nccl" : "gloo");
  a.phase = Phase::kAssigning;
  a.deadline = clock_->Now() + options_.assign_timeout;
  AssignRank(a, a.ranks[0]);
}

void Scheduler::AssignRank(ActiveJob& a, const Rank& rank) {
  apapo::v1::CoordinatorMessage m;
  auto* assign = m.mutable_assign();
  assign->set_job_id(a.id);
  *assign->mutable_spec() = a.spec;
  *assign->mutable_plan() = a.plan;
  assign->set_stage(rank.stage);
  assign->set_replica(rank.replica);
  if (a.resume) assign->mutable_spec()->mutable_checkpoint()->set_resume(true);
  *assign->mutable_rendezvous() = a.rendezvous;
  assign->mutable_rendezvous()->set_rank(rank.rank);
  absl::StatusOr<int64_t> id = registry_->Send(rank.worker_id, m);
  if (!id.ok()) {
    Recover(a, {rank.worker_id},
            absl::StrCat("worker ", rank.worker_id,
                         " disconnected before its assignment"));
    return;
  }
  a.pending_assign[*id] = rank.worker_id;
}

void Scheduler::OnWorkerMessage(const std::string& worker_id,
                                const apapo::v1::WorkerMessage& message) {
  absl::MutexLock lock(&mu_);
  switch (message.kind_case()) {
    case apapo::v1::WorkerMessage::kProfileResult: {
      ActiveJob* a = FindByWorker(worker_id, message.profile_result().job_id());
      if (a == nullptr || a->phase != Phase::kProfiling) return;
      auto second = std::find_if(a->remeasuring.begin(), a->remeasuring.end(),
                                 [&](const auto& c) { return c.second == worker_id; });
      if (second != a->remeasuring.end()) {
        a->remeasuring.erase(second);
        KeepFasterProfile(*a, worker_id, message.profile_result());
      } else {
        apapo::v1::ProfileResult& r = a->profiles[worker_id] = message.profile_result();
        NoteSharedCores(*a, worker_id, &r);
      }
      if (a->profiles.size() == a->workers.size() && a->remeasuring.empty()) {
        const std::string id = a->id;
        if (MaybeRemeasure(*a) || !active_.count(id)) return;
        a->plan_ready = true;
        dirty_ = true;
      }
      return;
    }
    case apapo::v1::WorkerMessage::kAck: {
      ActiveJob* a = FindByWorker(worker_id, "");
      if (a != nullptr) OnAck(*a, worker_id, message.ack());
      return;
    }
    case apapo::v1::WorkerMessage::kMetrics: {
      ActiveJob* a = FindByWorker(worker_id, message.metrics().job_id());
      if (a != nullptr) OnMetrics(*a, worker_id, message.metrics());
      return;
    }
    case apapo::v1::WorkerMessage::kOutcome: {
      ActiveJob* a = FindByWorker(worker_id, message.outcome().job_id());
      if (a != nullptr) OnOutcome(*a, worker_id, message.outcome());
      return;
    }
    default:
      return;
  }
}

void Scheduler::OnAck(ActiveJob& a, const std::string& worker_id,
                      const apapo::v1::CommandAck& ack) {
  // Acks of the stopped attempt's commands (stops, late assignments).
  if (a.phase == Phase::kStopping || a.phase == Phase::kWaiting ||
      a.phase == Phase::kAdopting) {
    return;
  }
  if (auto second = a.remeasuring.find(ack.command_id());
      ack.code() != 0 && a.phase == Phase::kProfiling && second != a.remeasuring.end() &&
      second->second == worker_id) {
    // A second profile that failed (its process killed, say): the first
    // is a measurement still, and the job goes on with it.
    a.remeasuring.erase(second);
    jobs_->RecordEvent(a.id, absl::StrCat(worker_id, "'s second profile failed (",
                                          ack.message(), "); its first is kept"))
        .IgnoreError();
    if (a.remeasuring.empty()) {
      const std::string id = a.id;
      if (MaybeRemeasure(a) || !active_.count(id)) return;
      a.plan_ready = true;
      dirty_ = true;
    }
    return;
  }
  if (ack.code() != 0) {
    Finish(a.id, apapo::v1::JOB_STATE_FAILED,
           absl::StrCat("worker ", worker_id, ": ", ack.message()),
           static_cast<absl::StatusCode>(ack.code()), true);
    return;
  }
  if (a.phase == Phase::kProfiling && a.profile.has_rendezvous() &&
      a.profile.rendezvous().store_port() == 0 &&
      ack.command_id() == a.profile_host_command) {
    if (ack.store_port() <= 0) {
      Finish(a.id, apapo::v1::JOB_STATE_FAILED,
             absl::StrCat("worker ", worker_id,
                          " did not report the port of the link test's "
                          "rendezvous"),
             absl::StatusCode::kInternal, true);
      return;
    }
    a.profile.mutable_rendezvous()->set_store_port(ack.store_port());
    // A failed send finishes (and forgets) the job: stop at once.
    const std::string id = a.id;
    for (size_t r = 1; r < a.workers.size(); ++r) {
      SendProfile(a, static_cast<int>(r));
      if (!active_.count(id)) return;
    }
    return;
  }
  auto it = a.pending_assign.find(ack.command_id());
  if (it == a.pending_assign.end()) return;  // acks of profile/start/stop
  a.pending_assign.erase(it);
  a.assigned.insert(worker_id);
  if (a.rendezvous.store_port() == 0) {
    if (ack.store_port() <= 0) {
      Finish(a.id, apapo::v1::JOB_STATE_FAILED,
             absl::StrCat("worker ", worker_id,
                          " did not report its rendezvous port"),
             absl::StatusCode::kInternal, true);
      return;
    }
    a.rendezvous.set_store_port(ack.store_port());
    // A failed send finishes (and forgets) the job: stop at once.
    const std::string id = a.id;
    for (size_t r = 1; r < a.ranks.size(); ++r) {
      AssignRank(a, a.ranks[r]);
      if (!active_.count(id) || a.phase != Phase::kAssigning) return;
    }
  }
  if (a.assigned.size() == a.ranks.size() && a.pending_assign.empty()) {
    for (const Rank& r : a.ranks) {
      apapo::v1::CoordinatorMessage m;
      m.mutable_start()->set_job_id(a.id);
      registry_->Send(r.worker_id, m).IgnoreError();
    }
    a.phase = Phase::kRunning;
    jobs_->Transition(a.id, apapo::v1::JOB_STATE_RUNNING,
                      absl::StrCat("training on ", a.ranks.size(),
                                   " rank(s), rendezvous ",
                                   a.rendezvous.store_host(), ":",
                                   a.rendezvous.store_port(),
                                   a.resume ? ", resuming from the newest checkpoint" : ""))
        .IgnoreError();
    if (a.recovering) {
      // Restarted: a fault from now on is a new one (a job that fails
      // again before its first step still uses up its restarts).
      a.recovering = false;
      a.awaiting_first_step = true;
      a.restart_progress = true;
      a.restart.set_stages_after(a.plan.stages_size());
      a.restart.set_workers_after(static_cast<int>(a.ranks.size()));
      jobs_->UpdateRestart(a.id, a.restart).IgnoreError();
    }
  }
}

int64_t Scheduler::CheckpointedStep(const ActiveJob& a) {
  // Per stage, the newest its replicas wrote (replica 0 writes); the job's
  // is the oldest of those: a stage with no report has nothing written.
  std::vector<int64_t> written(a.plan.stages_size(), 0);
  for (const auto& [w, r] : a.latest) {
    const int s = r.stage().stage();
    if (s >= 0 && s < static_cast<int>(written.size())) {
      written[s] = std::max(written[s], r.checkpoint_step());
    }
  }
  return written.empty() ? 0 : *std::min_element(written.begin(), written.end());
}

void Scheduler::OnMetrics(ActiveJob& a, const std::string& worker_id,
                          const apapo::v1::MetricsReport& in) {
  // The stream the report came on says which worker sent it (stage
  // processes leave worker_id empty): the per-worker series need it, or two
  // replicas of one stage would share their labels.
  // A stage's measured timeline comes alone (metrics.proto): kept for
  // GetTrace, whichever attempt measured it; no counters in it.
  if (in.has_trace()) {
    apapo::v1::StageTrace trace = in.trace();
    trace.set_worker_id(worker_id);
    if (absl::Status st = jobs_->AddStageTrace(a.id, std::move(trace));
        !st.ok()) {
      std::cerr << "apapo-coordinator: dropped a trace: " << st.message() << "\n";
    }
    return;
  }
  // Reports of a stopped attempt's stages are not this attempt's.
  if (a.phase != Phase::kRunning && a.phase != Phase::kAdopting) return;
  apapo::v1::MetricsReport report = in;
  report.set_worker_id(worker_id);
  if (a.awaiting_first_step && report.step() > report.resumed_step()) {
    OnRecovered(a, report);
  }
  if (observer_ != nullptr) observer_->OnMetrics(a.id, report);
  a.latest[worker_id] = report;
  absl::StatusOr<apapo::v1::Job> job = jobs_->Get(a.id);
  if (!job.ok()) return;
  apapo::v1::JobProgress progress = job->progress();
  progress.clear_stages();
  const int last_stage = a.plan.stages_size() - 1;
  if (a.restart_progress && report.stage().stage() == last_stage) {
    // Restarted from a checkpoint: the steps since it are trained again,
    // and progress shows them so.
    a.restart_progress = false;
    progress.set_step(0);
    progress.set_epoch(0);
  }
  double last_stage_sps = 0;
  int32_t max_staleness = 0;
  for (const auto& [w, r] : a.latest) {
    const auto& s = r.stage();
    apapo::v1::StageProgress* sp = progress.add_stages();
    sp->set_stage(s.stage());
    sp->set_worker_id(w);
    sp->set_busy_seconds(s.busy_seconds());
    sp->set_idle_seconds(s.idle_seconds());
    sp->set_steps(std::max<int64_t>(0, r.step() - r.resumed_step()));
    sp->set_comm_seconds(s.comm_exposed_seconds());
    sp->set_comm_hidden_fraction(
        s.comm_total_seconds() > 0
            ? std::clamp(1.0 - s.comm_exposed_seconds() / s.comm_total_seconds(), 0.0, 1.0)
            : 0.0);
    sp->set_max_staleness(s.max_staleness());
    sp->set_peak_memory_bytes(s.peak_memory_bytes());
    sp->set_bytes_sent(s.bytes_sent());
    max_staleness = std::max(max_staleness, s.max_staleness());
    if (s.stage() == last_stage) {
      last_stage_sps += r.samples_per_second();
      progress.set_step(std::max(progress.step(), r.step()));
      progress.set_epoch(std::max(progress.epoch(), r.epoch()));
      if (r.total_steps() > 0) progress.set_total_steps(r.total_steps());
      if (r.has_loss()) progress.set_loss(r.loss());
      if (r.has_test_accuracy()) progress.set_test_accuracy(r.test_accuracy());
    }
  }
  if (last_stage_sps > 0) progress.set_samples_per_second(last_stage_sps);
  progress.set_max_staleness(max_staleness);
  int batch = std::max(1, a.spec.data().batch_size());
  if (progress.samples_per_second() > 0 && progress.total_steps() > progress.step()) {
    double steps_per_second = progress.samples_per_second() / batch;
    *progress.mutable_eta() = ToProtoDuration(absl::Seconds(
        (progress.total_steps() - progress.step()) / steps_per_second));
  }
  jobs_->UpdateProgress(a.id, progress).IgnoreError();
  CheckRunWindow(a, worker_id, report);
  if (a.replan_at_step > 0 && a.phase == Phase::kRunning &&
      CheckpointedStep(a) >= a.replan_at_step) {
    // As a growth: every stage has the checkpoint written; restart on the
    // plan the run's measurement chose, from the profiles it calibrated.
    a.profiles = std::move(a.calibrated);
    a.calibrated.clear();
    a.calibration_note =
        absl::StrCat("planned on what the run measured: ", a.check->Describe());
    a.replanned = true;
    const double gain = a.replan_gain;
    Recover(a, {},
            absl::StrFormat("re-planned on the run's measurement: predicted %.2fx the "
                            "samples/s measured",
                            gain));
    return;
  }
  if (!a.growing.empty() && a.phase == Phase::kRunning &&
      CheckpointedStep(a) >= a.grow_at_step) {
    // Every stage has reported the checkpoint of grow_at_step written (a
    // stop kills a write in flight, so the step trained is not enough):
    // restart with the newcomers.
    std::vector<std::string> joining = std::move(a.growing);
    a.growing.clear();
    Recover(a, {},
            absl::StrFormat("%s joined: predicted %.2fx the samples/s",
                            absl::StrJoin(joining, ", "), a.grow_gain),
            joining);
  }
}

void Scheduler::OnOutcome(ActiveJob& a, const std::string& worker_id,
                          const apapo::v1::StageOutcome& outcome) {
  if (a.phase == Phase::kStopping) {
    // A stopped stage ended: once all have, the job goes on.
    a.stopping.erase(worker_id);
    if (a.stopping.empty()) ContinueRecovery(a);
    return;
  }
  if (a.phase != Phase::kRunning && a.phase != Phase::kAdopting) return;
  a.outcomes[worker_id] = outcome;
  MaybeAdopted(a);  // a stage that ended while the coordinator was away
  if (outcome.final_metrics().job_id() == a.id) {
    OnMetrics(a, worker_id, outcome.final_metrics());
  }
  if (outcome.code() != 0) {
    const std::string cause = absl::StrCat("stage ", outcome.stage(), " on ",
                                           worker_id, ": ", outcome.message());
    if (PeerFault(outcome.code())) {
      Recover(a, {}, cause);
    } else {
      Finish(a.id, apapo::v1::JOB_STATE_FAILED, cause,
             static_cast<absl::StatusCode>(outcome.code()), true);
    }
    return;
  }
  if (a.outcomes.size() == a.ranks.size()) {
    absl::StatusOr<apapo::v1::Job> job = jobs_->Get(a.id);
    std::string summary = "finished";
    if (job.ok() && job->progress().has_test_accuracy()) {
      summary = absl::StrFormat("finished: test accuracy %.2f%%, %.1f samples/s",
                                100 * job->progress().test_accuracy(),
                                job->progress().samples_per_second());
    }
    Finish(a.id, apapo::v1::JOB_STATE_SUCCEEDED, summary, absl::StatusCode::kOk,
           false);
  }
}

void Scheduler::OnWorkerLost(const std::string& worker_id,
                             const std::string& job_id,
                             const std::string& reason) {
  absl::MutexLock lock(&mu_);
  dirty_ = true;
  if (job_id.empty() || !active_.count(job_id)) return;
  ActiveJob& a = active_[job_id];
  const std::string cause = absl::StrCat("worker ", worker_id, " lost: ", reason);
  if (a.phase == Phase::kProfiling) {
    // Its profile (and the link test with it) will not come; the job has
    // not trained yet, so there is nothing to resume.
    Finish(job_id, apapo::v1::JOB_STATE_FAILED, cause,
           absl::StatusCode::kUnavailable, true);
    return;
  }
  Recover(a, {worker_id}, cause);
}

void Scheduler::DropWorker(ActiveJob& a, const std::string& worker_id, bool hung) {
  auto it = std::find(a.workers.begin(), a.workers.end(), worker_id);
  if (it == a.workers.end()) return;
  a.workers.erase(it);
  a.stopping.erase(worker_id);
  a.profiles.erase(worker_id);
  if (hung) {
    // Its stage may still run: it stays reserved (no job, this one
    // included, gets it) until the job ends.
    a.held_back.push_back(worker_id);
  } else {
    registry_->Release(a.id, {worker_id});
  }
}

void Scheduler::Recover(ActiveJob& a, const std::vector<std::string>& lost,
                        const std::string& cause,
                        const std::vector<std::string>& joining) {
  const std::string id = a.id;
  if (a.phase == Phase::kStopping || a.phase == Phase::kWaiting) {
    // The same fault seen again (its stream after its stage's error), or
    // another one while restarting: one restart, more workers lost.
    for (const std::string& w : lost) {
      if (std::find(a.workers.begin(), a.workers.end(), w) == a.workers.end()) continue;
      DropWorker(a, w, /*hung=*/false);
      a.restart.add_lost_workers(w);
    }
    jobs_->UpdateRestart(id, a.restart).IgnoreError();
    if (a.phase == Phase::kStopping && a.stopping.empty()) ContinueRecovery(a);
    return;
  }
  if (!a.recovering && a.restarts >= MaxRestarts(a.spec)) {
    Finish(id, apapo::v1::JOB_STATE_FAILED,
           absl::StrCat(cause, "; not restarted: spec.fault_tolerance.max_restarts (",
                        MaxRestarts(a.spec), ") used up"),
           absl::StatusCode::kUnavailable, true);
    return;
  }
  absl::StatusOr<apapo::v1::Job> job = jobs_->Get(id);
  if (!a.recovering) {
    // A new fault: a new restart.
    ++a.restarts;
    a.recovering = true;
    a.awaiting_first_step = false;
    a.fault_time = clock_->Now();
    a.restart = apapo::v1::JobRestart();
    *a.restart.mutable_time() = google::protobuf::util::TimeUtil::NanosecondsToTimestamp(
        absl::ToUnixNanos(a.fault_time));
    a.restart.set_cause(cause);
    a.restart.set_stages_before(a.plan.stages_size());
    a.restart.set_workers_before(static_cast<int>(a.workers.size()));
    if (job.ok()) a.restart.set_step_at_fault(job->progress().step());
    jobs_->BeginRestart(id, a.restart).IgnoreError();
    if (observer_ != nullptr) observer_->OnJobRestarted(id);
  }
  for (const std::string& w : lost) {
    if (std::find(a.workers.begin(), a.workers.end(), w) == a.workers.end()) continue;
    DropWorker(a, w, /*hung=*/false);
    a.restart.add_lost_workers(w);
  }
  // Stop every stage still there. Those that were started end with an
  // outcome, which is awaited: nothing of this attempt may still train (or
  // write a checkpoint) when the next one starts.
  a.stopping.clear();
  for (const std::string& w : a.workers) {
    if (a.outcomes.count(w)) continue;  // its stage has ended
    apapo::v1::CoordinatorMessage m;
    m.mutable_stop()->set_job_id(id);
    m.mutable_stop()->set_reason(absl::StrCat("restarting: ", cause));
    registry_->Send(w, m).IgnoreError();
    if (a.phase == Phase::kRunning ||
        (a.phase == Phase::kAdopting && a.adopted.count(w))) {
      a.stopping.insert(w);
    }
  }
  // A growth that was waiting for its checkpoint is off: its workers go
  // back to the pool (a later check may take them again).
  if (!a.growing.empty()) {
    registry_->Release(id, a.growing);
    a.growing.clear();
  }
  // The check is per attempt; a re-plan not taken yet is off (the next
  // attempt is checked again).
  a.window_start.clear();
  a.checked = false;
  a.check_pending = false;
  a.check.reset();
  a.calibrated.clear();
  a.replan_at_step = 0;
  a.workers.insert(a.workers.end(), joining.begin(), joining.end());
  a.phase = Phase::kStopping;
  a.deadline = clock_->Now() + options_.stop_timeout;
  a.plan_attempt = 0;  // a plan being computed is for the old workers
  a.plan_ready = false;
  a.ranks.clear();
  a.pending_assign.clear();
  a.assigned.clear();
  a.latest.clear();
  a.outcomes.clear();
  a.adopted.clear();
  a.rendezvous = apapo::v1::Rendezvous();
  a.resume = !a.spec.checkpoint().directory().empty();
  jobs_->SetWorkers(id, a.workers).IgnoreError();
  jobs_->UpdateRestart(id, a.restart).IgnoreError();
  jobs_->Transition(id, apapo::v1::JOB_STATE_RECOVERING,
                    absl::StrFormat("restart %d of %d: %s; stopping %d stage(s)",
                                    a.restarts, MaxRestarts(a.spec), cause,
                                    a.stopping.size()))
      .IgnoreError();
  if (a.stopping.empty()) ContinueRecovery(a);
}

void Scheduler::ContinueRecovery(ActiveJob& a) {
  const std::string id = a.id;
  // Idle matching workers join, up to the job's size.
  const int want = a.spec.resources().workers() - static_cast<int>(a.workers.size());
  std::vector<std::string> joined;
  if (want > 0) {
    std::map<std::string, std::string> selector(
        a.spec.resources().worker_selector().begin(),
        a.spec.resources().worker_selector().end());
    joined = registry_->ReserveUpTo(id, want, selector);
    // One that is already the job's (idle in the registry after its stage
    // ended while a coordinator was away) is not taken twice.
    joined.erase(std::remove_if(joined.begin(), joined.end(),
                                [&](const std::string& w) {
                                  return std::count(a.workers.begin(), a.workers.end(), w) > 0;
                                }),
                 joined.end());
  }
  const int have = static_cast<int>(a.workers.size() + joined.size());
  const int min_workers = MinWorkers(a.spec);
  if (have < min_workers) {
    if (!joined.empty()) registry_->Release(id, joined);  // {} means all
    a.idle_in_wait = joined;
    if (a.phase != Phase::kWaiting) {
      a.phase = Phase::kWaiting;
      a.wait_deadline = clock_->Now() + ReplacementWait(a.spec);
      jobs_->RecordEvent(
               id, absl::StrFormat(
                       "waiting for capacity: %d worker(s) left, "
                       "spec.fault_tolerance.min_workers is %d; waiting up to %s "
                       "for idle matching workers",
                       have, min_workers,
                       absl::FormatDuration(ReplacementWait(a.spec))))
          .IgnoreError();
    }
    return;
  }
  a.workers.insert(a.workers.end(), joined.begin(), joined.end());
  jobs_->SetWorkers(id, a.workers).IgnoreError();
  const bool profiled = std::all_of(a.workers.begin(), a.workers.end(),
                                    [&](const std::string& w) { return a.profiles.count(w) > 0; });
  if (profiled) {
    // Everyone left has profiled this model: plan from those profiles.
    a.phase = Phase::kProfiling;
    a.plan_ready = true;
    dirty_ = true;
    jobs_->RecordEvent(id, absl::StrCat("re-planning on ", absl::StrJoin(a.workers, ", "),
                                        " from their profiles"))
        .IgnoreError();
    return;
  }
  if (!jobs_->Transition(id, apapo::v1::JOB_STATE_PROFILING,
                         absl::StrCat("profiling on ", absl::StrJoin(a.workers, ", "),
                                      " (not all have profiled this model)"))
           .ok()) {
    return;
  }
  StartProfiling(a);
}

void Scheduler::OnRecovered(ActiveJob& a, const apapo::v1::MetricsReport& report) {
  a.awaiting_first_step = false;
  const double seconds = absl::ToDoubleSeconds(clock_->Now() - a.fault_time);
  a.restart.set_resumed_step(report.resumed_step());
  // The fault's step was the newest reported, up to a report interval old:
  // the checkpoint resumed from is a lower bound too.
  a.restart.set_step_at_fault(std::max(a.restart.step_at_fault(), report.resumed_step()));
  a.restart.set_seconds_lost(seconds);
  jobs_->UpdateRestart(a.id, a.restart).IgnoreError();
  jobs_->RecordEvent(
           a.id, absl::StrFormat(
                     "restart %d: training again from step %d (the fault came at "
                     "step %d), %d -> %d stage(s) on %d worker(s), %.1f s after the "
                     "fault",
                     a.restarts, a.restart.resumed_step(), a.restart.step_at_fault(),
                     a.restart.stages_before(), a.restart.stages_after(),
                     a.restart.workers_after(), seconds))
      .IgnoreError();
  if (observer_ != nullptr) observer_->OnJobRecovered(a.id, seconds);
}

void Scheduler::OnCancelled(const apapo::v1::Job& job) {
  absl::MutexLock lock(&mu_);
  dirty_ = true;
  wait_notes_.erase(job.id());
  auto it = active_.find(job.id());
  if (it == active_.end()) return;
  ReportUnansweredCheck(it->second, /*ended=*/true);
  for (const std::string& w : it->second.workers) {
    apapo::v1::CoordinatorMessage m;
    m.mutable_stop()->set_job_id(job.id());
    m.mutable_stop()->set_reason("cancelled");
    registry_->Send(w, m).IgnoreError();
  }
  registry_->Release(job.id(), it->second.workers);
  if (!it->second.held_back.empty()) registry_->Release(job.id(), it->second.held_back);
  if (!it->second.growing.empty()) registry_->Release(job.id(), it->second.growing);
  active_.erase(it);
  if (observer_ != nullptr) observer_->OnJobEnded(job.id());
}

void Scheduler::CheckDeadlines() {
  absl::Time now = clock_->Now();
  // Jobs past their own time limit, in any phase.
  std::vector<std::pair<std::string, std::string>> overdue;
  for (const auto& [id, a] : active_) {
    const auto& limit = a.spec.limits().max_duration();
    const absl::Duration max =
        absl::Seconds(limit.seconds()) + absl::Nanoseconds(limit.nanos());
    if (max > absl::ZeroDuration() && now - a.admitted > max) {
      overdue.emplace_back(
          id, absl::StrCat("ran past spec.limits.max_duration (",
                           absl::FormatDuration(max), "): stopped after ",
                           absl::FormatDuration(absl::Trunc(
                               now - a.admitted, absl::Milliseconds(100)))));
    }
  }
  for (const auto& [id, message] : overdue) {
    Finish(id, apapo::v1::JOB_STATE_FAILED, message,
           absl::StatusCode::kDeadlineExceeded, true);
  }
  // Restarting jobs: stages that did not end in time are left out (their
  // workers may be hung); a job short of workers looks for idle ones.
  std::vector<std::string> restarting;
  for (const auto& [id, a] : active_) {
    if (a.phase == Phase::kStopping || a.phase == Phase::kWaiting) restarting.push_back(id);
  }
  for (const std::string& id : restarting) {
    ActiveJob& a = active_[id];
    if (a.phase == Phase::kStopping) {
      if (now <= a.deadline) continue;
      const std::vector<std::string> hung(a.stopping.begin(), a.stopping.end());
      for (const std::string& w : hung) DropWorker(a, w, /*hung=*/true);
      jobs_->RecordEvent(id, absl::StrCat("left out ", absl::StrJoin(hung, ", "),
                                          ": its stage did not end within ",
                                          absl::FormatDuration(options_.stop_timeout),
                                          " of its stop"))
          .IgnoreError();
      ContinueRecovery(a);
      continue;
    }
    ContinueRecovery(a);
    if (active_.count(id) && a.phase == Phase::kWaiting && now > a.wait_deadline) {
      // Idle matching workers may have been there all along, too few to go
      // on with (the plan had released one of the job's own): said so.
      const std::string idle =
          a.idle_in_wait.empty()
              ? "no idle matching worker came"
              : absl::StrFormat("only %d idle matching worker(s) (%s) came",
                                a.idle_in_wait.size(), absl::StrJoin(a.idle_in_wait, ", "));
      Finish(id, apapo::v1::JOB_STATE_FAILED,
             absl::StrFormat("%s; only %d worker(s) left%s%s and %s within "
                             "spec.fault_tolerance.replacement_wait (%s); "
                             "min_workers is %d",
                             a.restart.cause(), a.workers.size(),
                             a.workers.empty() ? "" : ": ",
                             absl::StrJoin(a.workers, ", "), idle,
                             absl::FormatDuration(ReplacementWait(a.spec)),
                             MinWorkers(a.spec)),
             absl::StatusCode::kUnavailable, true);
    }
  }
  // Adopted jobs with stages that did not report back in time restart
  // without them.
  std::vector<std::string> adopting;
  for (const auto& [id, a] : active_) {
    if (a.phase == Phase::kAdopting && now > a.deadline) adopting.push_back(id);
  }
  for (const std::string& id : adopting) {
    ActiveJob& a = active_[id];
    std::vector<std::string> missing;
    for (const Rank& r : a.ranks) {
      if (!a.adopted.count(r.worker_id) && !a.outcomes.count(r.worker_id)) {
        missing.push_back(r.worker_id);
      }
    }
    Recover(a, missing,
            absl::StrCat("coordinator restarted and ", absl::StrJoin(missing, ", "),
                         " did not report back within ",
                         absl::FormatDuration(options_.adopt_timeout)));
  }
  std::vector<std::string> late;
  for (const auto& [id, a] : active_) {
    // A plan being computed is not timed: it is checked when it comes back.
    if (a.phase == Phase::kRunning || a.phase == Phase::kStopping ||
        a.phase == Phase::kWaiting || a.phase == Phase::kAdopting ||
        a.plan_attempt != 0) {
      continue;
    }
    if (now > a.deadline) late.push_back(id);
  }
  for (const std::string& id : late) {
    const ActiveJob& a = active_[id];
    std::vector<std::string> missing;
    if (a.phase == Phase::kProfiling) {
      for (const auto& w : a.workers) {
        const bool again = std::any_of(a.remeasuring.begin(), a.remeasuring.end(),
                                       [&](const auto& c) { return c.second == w; });
        if (!a.profiles.count(w) || again) missing.push_back(w);
      }
    } else {
      for (const auto& [cmd, w] : a.pending_assign) missing.push_back(w);
    }
    Finish(id, apapo::v1::JOB_STATE_FAILED,
           absl::StrCat(a.phase == Phase::kProfiling ? "profiling" : "assignment",
                        " did not finish in time; waiting on ",
                        missing.empty() ? "nothing" : absl::StrJoin(missing, ", ")),
           absl::StatusCode::kDeadlineExceeded, true);
  }
}

void Scheduler::Finish(const std::string& job_id_ref, JobState state,
                       const std::string& message, absl::StatusCode code,
                       bool stop_workers) {
  // Callers pass the ActiveJob's own id, which dies with the entry.
  const std::string job_id = job_id_ref;
  auto it = active_.find(job_id);
  if (it == active_.end()) return;
  ReportUnansweredCheck(it->second, /*ended=*/true);
  if (stop_workers) {
    for (const std::string& w : it->second.workers) {
      apapo::v1::CoordinatorMessage m;
      m.mutable_stop()->set_job_id(job_id);
      m.mutable_stop()->set_reason(message);
      registry_->Send(w, m).IgnoreError();
    }
  }
  registry_->Release(job_id, it->second.workers);
  if (!it->second.held_back.empty()) registry_->Release(job_id, it->second.held_back);
  if (!it->second.growing.empty()) registry_->Release(job_id, it->second.growing);
  active_.erase(it);
  dirty_ = true;
  if (observer_ != nullptr) observer_->OnJobEnded(job_id);
  absl::Status s = jobs_->Transition(job_id, state, message, code);
  if (!s.ok()) {
    std::cerr << "apapo-coordinator: " << job_id << ": " << s.message() << "\n";
  }
}

Scheduler::ActiveJob* Scheduler::FindByWorker(const std::string& worker_id,
                                              const std::string& job_id) {
  if (!job_id.empty()) {
    auto it = active_.find(job_id);
    if (it == active_.end()) return nullptr;
    const auto& ws = it->second.workers;
    return std::find(ws.begin(), ws.end(), worker_id) != ws.end() ? &it->second
                                                                   : nullptr;
  }
  for (auto& [id, a] : active_) {
    if (std::find(a.workers.begin(), a.workers.end(), worker_id) != a.workers.end()) {
      return &a;
    }
  }
  return nullptr;
}

}  // namespace apapo::coordinator
