#include "coordinator/worker_registry.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "google/protobuf/util/time_util.h"

namespace apapo::coordinator {
namespace {

google::protobuf::Timestamp ToProto(absl::Time t) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(
      absl::ToUnixNanos(t));
}

bool Matches(const apapo::v1::WorkerInfo& info,
             const std::map<std::string, std::string>& selector) {
  for (const auto& [key, value] : selector) {
    auto it = info.labels().find(key);
    if (it == info.labels().end() || it->second != value) return false;
  }
  return true;
}

}  // namespace

// --- WorkerSession ---

WorkerSession::WorkerSession(std::string worker_id, int64_t id, Clock* clock,
                             WorkerStream* stream)
    : worker_id_(std::move(worker_id)),
      id_(id),
      clock_(clock),
      last_seen_ns_(absl::ToUnixNanos(clock->Now())),
      stream_(stream) {}

void WorkerSession::Heartbeat() {
  last_seen_ns_.store(absl::ToUnixNanos(clock_->Now()),
                      std::memory_order_relaxed);
}

absl::Time WorkerSession::last_seen() const {
  return absl::FromUnixNanos(last_seen_ns_.load(std::memory_order_relaxed));
}

std::optional<apapo::v1::CoordinatorMessage> WorkerSession::TakeCommand() {
  absl::MutexLock lock(&mu_);
  if (outbox_.empty()) return std::nullopt;
  apapo::v1::CoordinatorMessage message = std::move(outbox_.front());
  outbox_.pop_front();
  return message;
}

size_t WorkerSession::pending() const {
  absl::MutexLock lock(&mu_);
  return outbox_.size();
}

void WorkerSession::DetachStream() {
  absl::MutexLock lock(&stream_mu_);
  stream_ = nullptr;
}

bool WorkerSession::Queue(apapo::v1::CoordinatorMessage message) {
  absl::MutexLock lock(&mu_);
  if (!live()) return false;
  outbox_.push_back(std::move(message));
  return true;
}

void WorkerSession::MarkEnded() {
  absl::MutexLock lock(&mu_);
  live_.store(false, std::memory_order_release);
  outbox_.clear();
}

void WorkerSession::NotifyQueued() {
  absl::MutexLock lock(&stream_mu_);
  if (stream_ != nullptr) stream_->OnCommandsQueued();
}

void WorkerSession::NotifyEnded(const std::string& reason) {
  absl::MutexLock lock(&stream_mu_);
  if (stream_ != nullptr) stream_->OnSessionEnded(reason);
}

// --- WorkerRegistry ---

WorkerRegistry::WorkerRegistry(Clock* clock, absl::Duration heartbeat_interval,
                               int max_lost)
    : clock_(clock),
      heartbeat_interval_(heartbeat_interval),
      max_lost_(static_cast<size_t>(std::max(0, max_lost))) {}

void WorkerRegistry::SetStateLocked(Entry& entry, apapo::v1::WorkerState state) {
  if (entry.session != nullptr) {
    entry.session->idle_.store(state == apapo::v1::WORKER_STATE_IDLE,
                               std::memory_order_relaxed);
  }
  const apapo::v1::WorkerState before = entry.status.state();
  if (before == state) return;
  if (before != apapo::v1::WORKER_STATE_UNSPECIFIED) --counts_[before];
  ++counts_[state];
  if (before == apapo::v1::WORKER_STATE_IDLE) idle_.erase(entry.order);
  if (state == apapo::v1::WORKER_STATE_IDLE) {
    idle_.emplace(entry.order, entry.status.info().worker_id());
  }
  entry.status.set_state(state);
}

absl::StatusOr<std::shared_ptr<WorkerSession>> WorkerRegistry::Register(
    const apapo::v1::WorkerInfo& info, WorkerStream* stream) {
  if (info.worker_id().empty()) {
    return absl::InvalidArgumentError("register.worker_id: must not be empty");
  }
  // What the planner takes from a worker about its cores (WorkerInfo).
  if (info.core_set().size() > 128 ||
      !std::all_of(info.core_set().begin(), info.core_set().end(),
                   [](char c) { return c > ' ' && c < 0x7f; })) {
    return absl::InvalidArgumentError(
        "register.core_set: at most 128 printable ASCII characters, no spaces");
  }
  if (info.core_set_size() < 0 || info.core_set_size() > 65536 ||
      (info.core_set_size() == 0) != info.core_set().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register.core_set_size: ", info.core_set_size(),
        "; must be 1..65536 with a core_set, 0 without one"));
  }
  if (!(info.cpu_quota() >= 0 && info.cpu_quota() <= 65536)) {  // NaN fails too
    return absl::InvalidArgumentError(absl::StrCat(
        "register.cpu_quota: ", info.cpu_quota(), "; must be 0 (none) to 65536 cores"));
  }
  std::shared_ptr<WorkerSession> session;
  {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = workers_.try_emplace(info.worker_id());
    Entry& entry = it->second;
    if (!inserted && entry.status.state() != apapo::v1::WORKER_STATE_LOST) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker id \"", info.worker_id(),
          "\" is already connected; give each worker a unique --id"));
    }
    if (inserted) entry.order = next_order_++;
    const absl::Time now = clock_->Now();
    *entry.status.mutable_info() = info;
    entry.status.mutable_info()->clear_running();  // a snapshot: not kept
    entry.status.clear_job_id();
    *entry.status.mutable_registered_time() = ToProto(now);
    session = std::make_shared<WorkerSession>(info.worker_id(),
                                              next_session_++, clock_, stream);
    entry.session = session;
    // A worker that still trains a stage is not idle: it stays its job's
    // until the scheduler adopts the stage or stops it (and releases it).
    if (info.running_size() > 0) {
      SetStateLocked(entry, apapo::v1::WORKER_STATE_BUSY);
      entry.status.set_job_id(info.running(0).job_id());
    } else {
      SetStateLocked(entry, apapo::v1::WORKER_STATE_IDLE);
    }
  }
  Schedule(session->last_seen() + timeout(), session);
  return session;
}

void WorkerRegistry::Schedule(absl::Time when,
                              std::shared_ptr<WorkerSession> session) {
  absl::MutexLock lock(&due_mu_);
  due_.push(Due{when, std::move(session)});
}

std::function<void()> WorkerRegistry::MarkLostLocked(Entry& entry,
                                                     const std::string& reason) {
  std::string id = entry.status.info().worker_id();
  std::string job = entry.status.job_id();
  SetStateLocked(entry, apapo::v1::WORKER_STATE_LOST);
  entry.status.clear_job_id();
  *entry.status.mutable_last_heartbeat() = ToProto(entry.session->last_seen());
  entry.session->MarkEnded();
  lost_order_.emplace_back(id, entry.session->id());
  // Forget the oldest lost workers beyond the cap (never `entry` itself
  // while it is being reported: it is the newest).
  while (counts_[apapo::v1::WORKER_STATE_LOST] > static_cast<int>(max_lost_) &&
         lost_order_.size() > 1) {
    auto [old_id, old_session] = lost_order_.front();
    lost_order_.pop_front();
    auto old = workers_.find(old_id);
    if (old == workers_.end() || old->second.session->id() != old_session ||
        old->second.status.state() != apapo::v1::WORKER_STATE_LOST) {
      continue;  // came back since
    }
    --counts_[apapo::v1::WORKER_STATE_LOST];
    workers_.erase(old);
  }
  std::cerr << "apapo-coordinator: worker " << id << " lost: " << reason
            << (job.empty() ? "" : absl::StrCat(" (job ", job, ")")) << "\n";
  LostHook hook = lost_hook_;
  std::shared_ptr<WorkerSession> session = entry.session;
  return [hook, id, job, reason, session] {
    session->NotifyEnded(reason);
    if (hook) hook(id, job, reason);
  };
}

void WorkerRegistry::Disconnect(const WorkerSession& session,
                                const std::string& reason) {
  std::function<void()> notify;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(session.worker_id());
    if (it == workers_.end() || it->second.session.get() != &session ||
        !session.live()) {
      return;
    }
    notify = MarkLostLocked(it->second, reason);
  }
  notify();
}

std::vector<std::string> WorkerRegistry::CheckTimeouts() {
  const absl::Time now = clock_->Now();
  std::vector<std::shared_ptr<WorkerSession>> silent;
  {
    absl::MutexLock lock(&due_mu_);
    while (!due_.empty() && due_.top().when <= now) {
      std::shared_ptr<WorkerSession> session = due_.top().session;
      due_.pop();
      if (!session->live()) continue;  // ended: forget it
      const absl::Time deadline = session->last_seen() + timeout();
      if (deadline > now) {
        due_.push(Due{deadline, std::move(session)});  // spoke since
      } else {
        silent.push_back(std::move(session));
      }
    }
  }
  std::vector<std::string> lost;
  std::vector<std::function<void()>> notifications;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& session : silent) {
      auto it = workers_.find(session->worker_id());
      if (it == workers_.end() || it->second.session != session ||
          !session->live()) {
        continue;
      }
      lost.push_back(session->worker_id());
      notifications.push_back(MarkLostLocked(
          it->second, absl::StrCat("no heartbeat for ",
                                   absl::FormatDuration(absl::Trunc(
                                       now - session->last_seen(),
                                       absl::Milliseconds(1))))));
    }
  }
  for (auto& n : notifications) n();
  return lost;
}

absl::Time WorkerRegistry::NextDeadline() {
  absl::MutexLock lock(&due_mu_);
  return due_.empty() ? absl::InfiniteFuture() : due_.top().when;
}

absl::StatusOr<int64_t> WorkerRegistry::Send(
    const std::string& worker_id, apapo::v1::CoordinatorMessage message) {
  std::shared_ptr<WorkerSession> session;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = workers_.find(worker_id);
    if (it != workers_.end() &&
        it->second.status.state() != apapo::v1::WORKER_STATE_LOST) {
      session = it->second.session;
    }
  }
  const int64_t id = next_command_.fetch_add(1);
  message.set_command_id(id);
  if (session == nullptr || !session->Queue(std::move(message))) {
    return absl::UnavailableError(
        absl::StrCat("worker ", worker_id, " is not connected"));
  }
  session->NotifyQueued();
  return id;
}

absl::StatusOr<std::vector<std::string>> WorkerRegistry::Reserve(
    const std::string& job_id, int count,
    const std::map<std::string, std::string>& selector) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> chosen = MatchingIdleLocked(count, selector);
  if (static_cast<int>(chosen.size()) < count) {
    return absl::ResourceExhaustedError(absl::StrCat(
        job_id, " needs ", count, " idle worker(s), ", chosen.size(),
        " available"));
  }
  TakeLocked(job_id, chosen);
  return chosen;
}

std::vector<std::string> WorkerRegistry::IdleMatching(
    int max_count, const std::map<std::string, std::string>& selector,
    const std::set<std::string>& exclude) {
  absl::ReaderMutexLock lock(&mu_);
  return MatchingIdleLocked(max_count, selector, exclude);
}

std::vector<std::string> WorkerRegistry::ReserveUpTo(
    const std::string& job_id, int max_count,
    const std::map<std::string, std::string>& selector,
    const std::set<std::string>& exclude) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> chosen = MatchingIdleLocked(max_count, selector, exclude);
  TakeLocked(job_id, chosen);
  return chosen;
}

std::vector<std::string> WorkerRegistry::MatchingIdleLocked(
    int max_count, const std::map<std::string, std::string>& selector,
    const std::set<std::string>& exclude) {
  std::vector<std::string> chosen;
  for (const auto& [order, id] : idle_) {
    if (static_cast<int>(chosen.size()) >= max_count) break;
    if (!exclude.count(id) && Matches(workers_.at(id).status.info(), selector)) {
      chosen.push_back(id);
    }
  }
  return chosen;
}

void WorkerRegistry::TakeLocked(const std::string& job_id,
                                const std::vector<std::string>& worker_ids) {
  for (const std::string& id : worker_ids) {
    Entry& entry = workers_.at(id);
    SetStateLocked(entry, apapo::v1::WORKER_STATE_BUSY);
    entry.status.set_job_id(job_id);
  }
}

void WorkerRegistry::Release(const std::string& job_id,
                             const std::vector<std::string>& worker_ids) {
  absl::MutexLock lock(&mu_);
  auto release = [&](Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (e.status.job_id() == job_id &&
        e.status.state() == apapo::v1::WORKER_STATE_BUSY) {
      SetStateLocked(e, apapo::v1::WORKER_STATE_IDLE);
      e.status.clear_job_id();
    }
  };
  if (worker_ids.empty()) {
    for (auto& [id, e] : workers_) release(e);
    return;
  }
  for (const std::string& id : worker_ids) {
    auto it = workers_.find(id);
    if (it != workers_.end()) release(it->second);
  }
}

std::optional<apapo::v1::WorkerInfo> WorkerRegistry::Info(
    const std::string& worker_id) {
  absl::ReaderMutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return std::nullopt;
  return it->second.status.info();
}

apapo::v1::WorkerStatus WorkerRegistry::StatusOf(const Entry& entry) const {
  apapo::v1::WorkerStatus status = entry.status;
  if (status.state() != apapo::v1::WORKER_STATE_LOST) {
    *status.mutable_last_heartbeat() = ToProto(entry.session->last_seen());
  }
  return status;
}

absl::StatusOr<apapo::v1::ListWorkersResponse> WorkerRegistry::List(
    const apapo::v1::ListWorkersRequest& request) {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: must be >= 0, got ", request.page_size()));
  }
  const int page_size = request.page_size() == 0
                            ? kDefaultPageSize
                            : std::min(request.page_size(), kMaxPageSize);
  auto wanted = [&](apapo::v1::WorkerState state) {
    return request.states().empty() ||
           std::find(request.states().begin(), request.states().end(),
                     state) != request.states().end();
  };
  apapo::v1::ListWorkersResponse response;
  absl::ReaderMutexLock lock(&mu_);
  int total = 0;
  for (const auto& [state, count] : counts_) {
    if (wanted(state)) total += count;
  }
  response.set_total(total);
  size_t page_bytes = 0;
  // The token is the last id of the previous page: continue after it (the
  // worker may have gone since; ids are ordered, so that still works).
  auto it = request.page_token().empty()
                ? workers_.begin()
                : workers_.upper_bound(request.page_token());
  for (; it != workers_.end(); ++it) {
    if (!wanted(it->second.status.state())) continue;
    // Full by count, or by size (common/limits.h): continue on the next page.
    // + the heartbeat time filled in below and the field framing.
    const size_t worker_bytes = it->second.status.ByteSizeLong() + 24;
    if (response.workers_size() == page_size ||
        (response.workers_size() > 0 &&
         page_bytes + worker_bytes > kMaxPageBytes)) {
      response.set_next_page_token(
          response.workers(response.workers_size() - 1).info().worker_id());
      break;
    }
    *response.add_workers() = StatusOf(it->second);
    page_bytes += worker_bytes;
  }
  return response;
}

std::vector<apapo::v1::WorkerStatus> WorkerRegistry::List() {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<apapo::v1::WorkerStatus> out;
  out.reserve(workers_.size());
  for (const auto& [id, e] : workers_) out.push_back(StatusOf(e));
  return out;
}

std::vector<std::pair<std::string, absl::Time>>
WorkerRegistry::LastHeartbeats() {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::pair<std::string, absl::Time>> out;
  for (const auto& [id, e] : workers_) {
    if (e.status.state() == apapo::v1::WORKER_STATE_LOST) continue;
    out.emplace_back(id, e.session->last_seen());
  }
  return out;
}

std::map<apapo::v1::WorkerState, int> WorkerRegistry::CountByState() {
  absl::ReaderMutexLock lock(&mu_);
  return counts_;
}

void WorkerRegistry::SetLostHook(LostHook hook) {
  absl::MutexLock lock(&mu_);
  lost_hook_ = std::move(hook);
}

}  // namespace apapo::coordinator
