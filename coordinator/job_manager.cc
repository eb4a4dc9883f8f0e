#include "coordinator/job_manager.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/limits.h"
#include "coordinator/spec_validator.h"
#include "google/protobuf/util/time_util.h"

namespace apapo::coordinator {
namespace {

using apapo::v1::Job;
using apapo::v1::JobState;

constexpr int kDefaultPageSize = 100;
// Larger pages are cut to this (AIP-158), so a reply stays well under the
// clients' message-size limit.
constexpr int kMaxPageSize = 1000;

google::protobuf::Timestamp ToProto(absl::Time t) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(
      absl::ToUnixNanos(t));
}

std::string JobId(int64_t n) { return absl::StrFormat("job-%06d", n); }

bool ValidTransition(JobState from, JobState to) {
  if (IsTerminal(from)) return false;
  if (to == apapo::v1::JOB_STATE_FAILED || to == apapo::v1::JOB_STATE_CANCELLED) {
    return true;
  }
  // A fault sends an active job to RECOVERING, which goes back to
  // profiling (new workers) or planning (the survivors' cached profiles).
  if (to == apapo::v1::JOB_STATE_RECOVERING) {
    return from == apapo::v1::JOB_STATE_PROFILING ||
           from == apapo::v1::JOB_STATE_PLANNING ||
           from == apapo::v1::JOB_STATE_RUNNING;
  }
  if (from == apapo::v1::JOB_STATE_RECOVERING) {
    return to == apapo::v1::JOB_STATE_PROFILING ||
           to == apapo::v1::JOB_STATE_PLANNING;
  }
  // Forward moves only; a job may go back to QUEUED when its workers are
  // taken away before it runs.
  return to == apapo::v1::JOB_STATE_QUEUED || static_cast<int>(to) > static_cast<int>(from);
}

}  // namespace

bool IsTerminal(JobState state) {
  return state == apapo::v1::JOB_STATE_SUCCEEDED ||
         state == apapo::v1::JOB_STATE_FAILED ||
         state == apapo::v1::JOB_STATE_CANCELLED;
}

JobManager::JobManager(JobStore* store, Clock* clock,
                       absl::Duration progress_batch_window,
                       std::vector<std::string> data_roots)
    : store_(store),
      clock_(clock),
      progress_batch_window_(progress_batch_window),
      data_roots_(std::move(data_roots)) {
  writer_ = std::thread([this] { WriteProgressLoop(); });
}

JobManager::~JobManager() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  writer_.join();
  FlushProgress().IgnoreError();
}

void JobManager::WriteProgressLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !dirty_progress_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      // Let the batch fill: reports from a job's stages arrive together.
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&stopping), progress_batch_window_);
      if (stopping_) return;
    }
    if (absl::Status s = FlushProgress(); !s.ok()) {
      std::cerr << "apapo-coordinator: saving progress: " << s.message() << "\n";
    }
  }
}

absl::Status JobManager::FlushProgress() {
  // Under mu_, so that no older snapshot can land after a newer write of
  // the same job (Transition writes through under mu_ too).
  absl::MutexLock lock(&mu_);
  if (dirty_progress_.empty()) return absl::OkStatus();
  std::vector<Job> batch;
  batch.reserve(dirty_progress_.size());
  for (const std::string& id : dirty_progress_) {
    auto it = jobs_.find(id);
    if (it != jobs_.end()) batch.push_back(it->second.job);
  }
  dirty_progress_.clear();
  return store_->SaveJobs(batch);
}

absl::Status JobManager::Recover() {
  absl::StatusOr<std::vector<Job>> jobs = store_->LoadJobs();
  if (!jobs.ok()) return jobs.status();
  absl::MutexLock lock(&mu_);
  for (Job& job : *jobs) {
    Entry& entry = jobs_[job.id()];
    entry.job = std::move(job);
    absl::StatusOr<std::vector<apapo::v1::JobEvent>> events =
        store_->LoadEvents(entry.job.id());
    if (!events.ok()) return events.status();
    entry.events = std::move(*events);
    absl::StatusOr<apapo::v1::GetPlanResponse> plan =
        store_->LoadPlan(entry.job.id());
    if (plan.ok()) {
      entry.has_plan = true;
      entry.plan = std::move(*plan);
    }
    int64_t n = 0;
    if (absl::SimpleAtoi(entry.job.id().substr(4), &n)) {
      next_id_ = std::max(next_id_, n + 1);
    }
  }
  for (auto& [id, entry] : jobs_) {
    JobState s = entry.job.state();
    if (s == apapo::v1::JOB_STATE_RUNNING && entry.has_plan) {
      // Its stages train on without a coordinator: the scheduler adopts
      // them as their workers register again (Scheduler::AdoptRunningJobs).
      absl::Status st = AddEventLocked(
          entry, "coordinator restarted; adopting the stages still training");
      if (!st.ok()) return st;
      continue;
    }
    if (!IsTerminal(s) && s != apapo::v1::JOB_STATE_QUEUED) {
      absl::Status st = TransitionLocked(
          entry, apapo::v1::JOB_STATE_FAILED,
          absl::StrCat("coordinator restarted while the job was ",
                       apapo::v1::JobState_Name(s),
                       "; its workers were released"),
          absl::StatusCode::kUnavailable);
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Job> JobManager::Submit(const apapo::v1::JobSpec& spec,
                                       const std::string& owner) {
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return s;
  if (absl::Status s = CheckSpecPaths(spec, data_roots_); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  std::string id = JobId(next_id_++);
  Entry& entry = jobs_[id];
  entry.job.set_id(id);
  entry.job.set_owner(owner);
  *entry.job.mutable_spec() = spec;
  entry.job.set_state(apapo::v1::JOB_STATE_QUEUED);
  *entry.job.mutable_create_time() = ToProto(clock_->Now());
  absl::Status s = AddEventLocked(entry, "submitted");
  if (!s.ok()) {
    jobs_.erase(id);
    return s;
  }
  Job submitted = entry.job;
  PruneEndedLocked();
  return submitted;
}

void JobManager::set_max_ended_jobs(int n) {
  absl::MutexLock lock(&mu_);
  max_ended_jobs_ = n;
  PruneEndedLocked();
}

void JobManager::PruneEndedLocked() {
  // Oldest submitted first.
  std::vector<std::tuple<int64_t, int32_t, std::string>> ended;
  for (const auto& [id, entry] : jobs_) {
    if (IsTerminal(entry.job.state())) {
      ended.emplace_back(entry.job.create_time().seconds(), entry.job.create_time().nanos(),
                         id);
    }
  }
  if (static_cast<int64_t>(ended.size()) <= max_ended_jobs_) return;
  std::sort(ended.begin(), ended.end());
  const size_t drop = ended.size() - static_cast<size_t>(max_ended_jobs_);
  for (size_t i = 0; i < drop; ++i) {
    const std::string& id = std::get<2>(ended[i]);
    if (absl::Status st = store_->DeleteJob(id); !st.ok()) {
      // Kept in memory too, so both stay consistent; retried next submit.
      std::fprintf(stderr, "apapo-coordinator: dropping ended job %s: %s\n", id.c_str(),
                   std::string(st.message()).c_str());
      continue;
    }
    jobs_.erase(id);
    job_version_.erase(id);
    dirty_progress_.erase(id);
  }
}

absl::StatusOr<Job> JobManager::Get(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> entry = Find(job_id);
  if (!entry.ok()) return entry.status();
  return (*entry)->job;
}

absl::StatusOr<apapo::v1::ListJobsResponse> JobManager::List(
    const apapo::v1::ListJobsRequest& request) {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: must be >= 0, got ", request.page_size()));
  }
  int page_size = request.page_size() == 0
                      ? kDefaultPageSize
                      : std::min(request.page_size(), kMaxPageSize);
  absl::MutexLock lock(&mu_);
  if (!request.page_token().empty() && !jobs_.count(request.page_token())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token: unknown job \"", request.page_token(), "\""));
  }
  apapo::v1::ListJobsResponse response;
  size_t page_bytes = 0;
  // Ids sort by submission order; walk newest first.
  auto it = request.page_token().empty()
                ? jobs_.rbegin()
                : std::make_reverse_iterator(jobs_.find(request.page_token()));
  for (; it != jobs_.rend(); ++it) {
    const Job& job = it->second.job;
    if (!request.states().empty() &&
        std::find(request.states().begin(), request.states().end(),
                  job.state()) == request.states().end()) {
      continue;
    }
    // Full by count, or by size (common/limits.h): continue on the next page.
    const size_t job_bytes = job.ByteSizeLong() + 8;  // + field framing
    if (response.jobs_size() == page_size ||
        (response.jobs_size() > 0 && page_bytes + job_bytes > kMaxPageBytes)) {
      response.set_next_page_token(
          response.jobs(response.jobs_size() - 1).id());
      break;
    }
    *response.add_jobs() = job;
    page_bytes += job_bytes;
  }
  return response;
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& job_id,
                                       const std::string& reason) {
  Job job;
  std::function<void(const Job&)> hook, ended;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Entry*> entry = Find(job_id);
    if (!entry.ok()) return entry.status();
    if (IsTerminal((*entry)->job.state())) {
      return absl::FailedPreconditionError(absl::StrCat(
          job_id, " has already ended (",
          apapo::v1::JobState_Name((*entry)->job.state()), ")"));
    }
    absl::Status s = TransitionLocked(
        **entry, apapo::v1::JOB_STATE_CANCELLED,
        reason.empty() ? "cancelled" : absl::StrCat("cancelled: ", reason),
        absl::StatusCode::kOk);
    if (!s.ok()) return s;
    job = (*entry)->job;
    hook = cancel_hook_;
    ended = end_hook_;
  }
  if (ended) ended(job);
  if (hook) hook(job);
  return job;
}

absl::Status JobManager::AddStageTrace(const std::string& job_id,
                                      apapo::v1::StageTrace trace) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> entry = Find(job_id);
  if (!entry.ok()) return entry.status();
  auto it = traces_.find(job_id);
  if (it == traces_.end()) {
    while (static_cast<int>(traced_jobs_.size()) >= kMaxTracedJobs) {
      traces_.erase(traced_jobs_.front());
      traced_jobs_.pop_front();
    }
    traced_jobs_.push_back(job_id);
    it = traces_.emplace(job_id, decltype(it->second)()).first;
  }
  const std::pair<int, int> key(trace.stage(), trace.replica());
  int64_t spans = trace.spans_size();
  for (const auto& [k, t] : it->second) {
    if (k != key) spans += t.spans_size();
  }
  if (spans > kMaxTraceSpans) {
    return absl::ResourceExhaustedError(absl::StrCat(
        job_id, ": stage ", key.first, " replica ", key.second, "'s trace: ",
        spans, " spans in all, more than ", kMaxTraceSpans));
  }
  it->second[key] = std::move(trace);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<apapo::v1::StageTrace>> JobManager::StageTraces(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> entry = Find(job_id);
  if (!entry.ok()) return entry.status();
  std::vector<apapo::v1::StageTrace> out;
  auto it = traces_.find(job_id);
  if (it == traces_.end()) return out;
  for (const auto& [key, trace] : it->second) out.push_back(trace);
  return out;
}

absl::StatusOr<apapo::v1::GetPlanResponse> JobManager::GetPlan(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> entry = Find(job_id);
  if (!entry.ok()) return entry.status();
  if (!(*entry)->has_plan) {
    return absl::FailedPreconditionError(absl::StrCat(
        job_id, " has no plan yet (state ",
        apapo::v1::JobState_Name((*entry)->job.state()), ")"));
  }
  apapo::v1::GetPlanResponse response = (*entry)->plan;
  *response.mutable_measured() = (*entry)->job.progress();
  return response;
}

absl::StatusOr<JobChange> JobManager::WaitForChange(const std::string& job_id,
                                                    int64_t seen_version,
                                                    int64_t after_sequence,
                                                    absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (!jobs_.count(job_id)) {
    return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
  }
  auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = job_version_.find(job_id);
    return jobs_.count(job_id) == 0 || (it != job_version_.end() && it->second > seen_version);
  };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  if (!jobs_.count(job_id)) {  // dropped meanwhile (PruneEndedLocked)
    return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
  }
  const Entry& entry = jobs_[job_id];
  JobChange change;
  change.job = entry.job;
  change.version = job_version_[job_id];
  for (const auto& e : entry.events) {
    if (e.sequence() > after_sequence) change.events.push_back(e);
  }
  return change;
}

absl::Status JobManager::Transition(const std::string& job_id, JobState state,
                                    const std::string& message,
                                    absl::StatusCode error_code) {
  Job job;
  std::function<void(const Job&)> ended;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Entry*> entry = Find(job_id);
    if (!entry.ok()) return entry.status();
    absl::Status s = TransitionLocked(**entry, state, message, error_code);
    if (!s.ok()) return s;
    if (!IsTerminal(state) || !end_hook_) return absl::OkStatus();
    job = (*entry)->job;
    ended = end_hook_;
  }
  ended(job);
  return absl::OkStatus();
}

absl::Status JobManager::RecordEvent(const std::string& job_id,
                                     const std::string& message) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> entry = Find(job_id);
  if (!entry.ok()) return entry.status();
  return AddEventLocked(**entry, message);
}

absl::Status JobManager::SetWorkers(const std::string& job_id,
                                    const std::vector<std::string>& worker_ids) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> entry = Find(job_id);
  if (!entry.ok()) return entry.status();
  Job& job = (*entry)->job;
  job.clear_worker_ids();
  for (const auto& w : worker_ids) job.add_worker_ids(w);
  ++job_version_[job_id];
  return store_->SaveJob(job);
}

absl::Status JobManager::BeginRestart(const std::string& job_id,
                                      const apapo::v1::JobRestart& restart) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> entry = Find(job_id);
  if (!entry.ok()) return entry.status();
  Job& job = (*entry)->job;
  job.set_restarts(job.restarts() + 1);
  *job.add_restart_history() = restart;
  ++job_version_[job_id];
  return store_->SaveJob(job);
}

absl::Status JobManager::UpdateRestart(const std::string& job_id,
                                       const apapo::v1::JobRestart& restart) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> entry = Find(job_id);
  if (!entry.ok()) return entry.status();
  Job& job = (*entry)->job;
  if (job.restart_history_size() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, ": no restart to update"));
  }
  *job.mutable_restart_history(job.restart_history_size() - 1) = restart;
  ++job_version_[job_id];
  return store_->SaveJob(job);
}

absl::Status JobManager::SetPlan(const std::string& job_id,
                                 const apapo::v1::GetPlanResponse& plan) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> entry = Find(job_id);
  if (!entry.ok()) return entry.status();
  if (absl::Status s = store_->SavePlan(job_id, plan); !s.ok()) return s;
  (*entry)->has_plan = true;
  (*entry)->plan = plan;
  ++job_version_[job_id];
  return absl::OkStatus();
}

absl::Status JobManager::UpdateProgress(const std::string& job_id,
                                        const apapo::v1::JobProgress& progress) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Entry*> entry = Find(job_id);
  if (!entry.ok()) return entry.status();
  *(*entry)->job.mutable_progress() = progress;
  ++job_version_[job_id];
  dirty_progress_.insert(job_id);
  return absl::OkStatus();
}

std::vector<std::string> JobManager::QueuedJobs() {
  return JobsIn(apapo::v1::JOB_STATE_QUEUED);
}

std::vector<std::string> JobManager::JobsIn(apapo::v1::JobState state) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, entry] : jobs_) {
    if (entry.job.state() == state) out.push_back(id);
  }
  return out;
}

std::map<JobState, int> JobManager::CountByState() {
  absl::MutexLock lock(&mu_);
  std::map<JobState, int> counts;
  for (const auto& [id, entry] : jobs_) ++counts[entry.job.state()];
  return counts;
}

void JobManager::SetCancelHook(std::function<void(const Job&)> hook) {
  absl::MutexLock lock(&mu_);
  cancel_hook_ = std::move(hook);
}

void JobManager::SetEndHook(std::function<void(const Job&)> hook) {
  absl::MutexLock lock(&mu_);
  end_hook_ = std::move(hook);
}

absl::StatusOr<JobManager::Entry*> JobManager::Find(const std::string& job_id) {
  if (job_id.empty()) {
    return absl::InvalidArgumentError("job_id: must not be empty");
  }
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
  }
  return &it->second;
}

absl::Status JobManager::AddEventLocked(Entry& entry,
                                        const std::string& message) {
  apapo::v1::JobEvent event;
  event.set_sequence(entry.job.last_event_sequence() + 1);
  *event.mutable_time() = ToProto(clock_->Now());
  event.set_state(entry.job.state());
  event.set_message(message);
  entry.job.set_last_event_sequence(event.sequence());
  // The event first: a job whose last_event_sequence points past its stored
  // history would confuse a resumed watcher.
  if (absl::Status s = store_->AppendEvent(entry.job.id(), event); !s.ok()) {
    entry.job.set_last_event_sequence(event.sequence() - 1);
    return s;
  }
  entry.events.push_back(event);
  ++job_version_[entry.job.id()];
  return store_->SaveJob(entry.job);
}

absl::Status JobManager::TransitionLocked(Entry& entry, JobState state,
                                          const std::string& message,
                                          absl::StatusCode error_code) {
  JobState from = entry.job.state();
  if (!ValidTransition(from, state)) {
    return absl::FailedPreconditionError(absl::StrCat(
        entry.job.id(), ": cannot move from ", apapo::v1::JobState_Name(from),
        " to ", apapo::v1::JobState_Name(state)));
  }
  Job& job = entry.job;
  job.set_state(state);
  absl::Time now = clock_->Now();
  if (state == apapo::v1::JOB_STATE_RUNNING && !job.has_start_time()) {
    *job.mutable_start_time() = ToProto(now);
  }
  if (IsTerminal(state)) *job.mutable_end_time() = ToProto(now);
  if (state == apapo::v1::JOB_STATE_FAILED) {
    job.set_error_code(static_cast<int>(error_code == absl::StatusCode::kOk
                                            ? absl::StatusCode::kUnknown
                                            : error_code));
    job.set_error(message);
  }
  return AddEventLocked(entry, message);
}

}  // namespace apapo::coordinator
