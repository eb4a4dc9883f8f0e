#include "coordinator/worker_registry.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
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

WorkerRegistry::WorkerRegistry(Clock* clock, absl::Duration heartbeat_interval)
    : clock_(clock), heartbeat_interval_(heartbeat_interval) {}

absl::StatusOr<int64_t> WorkerRegistry::Register(
    const apapo::v1::WorkerInfo& info) {
  if (info.worker_id().empty()) {
    return absl::InvalidArgumentError("register.worker_id: must not be empty");
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = workers_.try_emplace(info.worker_id());
  Entry& entry = it->second;
  if (!inserted && entry.status.state() != apapo::v1::WORKER_STATE_LOST) {
    return absl::AlreadyExistsError(absl::StrCat(
        "worker id \"", info.worker_id(),
        "\" is already connected; give each worker a unique --id"));
  }
  if (inserted) order_.push_back(info.worker_id());
  absl::Time now = clock_->Now();
  *entry.status.mutable_info() = info;
  entry.status.set_state(apapo::v1::WORKER_STATE_IDLE);
  entry.status.clear_job_id();
  *entry.status.mutable_registered_time() = ToProto(now);
  *entry.status.mutable_last_heartbeat() = ToProto(now);
  entry.last_seen = now;
  entry.session = next_session_++;
  entry.outbox.clear();
  return entry.session;
}

void WorkerRegistry::Heartbeat(const std::string& worker_id, int64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.session != session ||
      it->second.status.state() == apapo::v1::WORKER_STATE_LOST) {
    return;
  }
  absl::Time now = clock_->Now();
  it->second.last_seen = now;
  *it->second.status.mutable_last_heartbeat() = ToProto(now);
}

std::function<void()> WorkerRegistry::MarkLostLocked(Entry& entry,
                                                     const std::string& reason) {
  std::string id = entry.status.info().worker_id();
  std::string job = entry.status.job_id();
  entry.status.set_state(apapo::v1::WORKER_STATE_LOST);
  entry.status.clear_job_id();
  entry.outbox.clear();
  std::cerr << "apapo-coordinator: worker " << id << " lost: " << reason
            << (job.empty() ? "" : absl::StrCat(" (job ", job, ")")) << "\n";
  LostHook hook = lost_hook_;
  return [hook, id, job, reason] {
    if (hook) hook(id, job, reason);
  };
}

void WorkerRegistry::Disconnect(const std::string& worker_id, int64_t session,
                                const std::string& reason) {
  std::function<void()> notify;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(worker_id);
    if (it == workers_.end() || it->second.session != session ||
        it->second.status.state() == apapo::v1::WORKER_STATE_LOST) {
      return;
    }
    notify = MarkLostLocked(it->second, reason);
  }
  notify();
}

std::vector<std::string> WorkerRegistry::CheckTimeouts() {
  std::vector<std::string> lost;
  std::vector<std::function<void()>> notifications;
  {
    absl::MutexLock lock(&mu_);
    absl::Time now = clock_->Now();
    for (auto& [id, entry] : workers_) {
      if (entry.status.state() == apapo::v1::WORKER_STATE_LOST) continue;
      absl::Duration silent = now - entry.last_seen;
      if (silent > heartbeat_interval_ * kMissedHeartbeats) {
        lost.push_back(id);
        notifications.push_back(MarkLostLocked(
            entry, absl::StrCat("no heartbeat for ",
                                absl::FormatDuration(silent))));
      }
    }
  }
  for (auto& n : notifications) n();
  return lost;
}

absl::StatusOr<int64_t> WorkerRegistry::Send(
    const std::string& worker_id, apapo::v1::CoordinatorMessage message) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() ||
      it->second.status.state() == apapo::v1::WORKER_STATE_LOST) {
    return absl::UnavailableError(
        absl::StrCat("worker ", worker_id, " is not connected"));
  }
  int64_t id = next_command_++;
  message.set_command_id(id);
  it->second.outbox.push_back(std::move(message));
  return id;
}

std::optional<apapo::v1::CoordinatorMessage> WorkerRegistry::NextCommand(
    const std::string& worker_id, int64_t session, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = workers_.find(worker_id);
    return it == workers_.end() || it->second.session != session ||
           it->second.status.state() == apapo::v1::WORKER_STATE_LOST ||
           !it->second.outbox.empty();
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.session != session ||
      it->second.outbox.empty()) {
    return std::nullopt;
  }
  apapo::v1::CoordinatorMessage message = std::move(it->second.outbox.front());
  it->second.outbox.pop_front();
  return message;
}

bool WorkerRegistry::IsCurrent(const std::string& worker_id, int64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  return it != workers_.end() && it->second.session == session &&
         it->second.status.state() != apapo::v1::WORKER_STATE_LOST;
}

absl::StatusOr<std::vector<std::string>> WorkerRegistry::Reserve(
    const std::string& job_id, int count,
    const std::map<std::string, std::string>& selector) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> chosen;
  for (const std::string& id : order_) {
    Entry& e = workers_[id];
    if (e.status.state() == apapo::v1::WORKER_STATE_IDLE &&
        Matches(e.status.info(), selector)) {
      chosen.push_back(id);
      if (static_cast<int>(chosen.size()) == count) break;
    }
  }
  if (static_cast<int>(chosen.size()) < count) {
    return absl::ResourceExhaustedError(absl::StrCat(
        job_id, " needs ", count, " idle worker(s), ", chosen.size(),
        " available"));
  }
  for (const std::string& id : chosen) {
    workers_[id].status.set_state(apapo::v1::WORKER_STATE_BUSY);
    workers_[id].status.set_job_id(job_id);
  }
  return chosen;
}

void WorkerRegistry::Release(const std::string& job_id,
                             const std::vector<std::string>& worker_ids) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, e] : workers_) {
    if (!worker_ids.empty() &&
        std::find(worker_ids.begin(), worker_ids.end(), id) == worker_ids.end()) {
      continue;
    }
    if (e.status.job_id() == job_id &&
        e.status.state() == apapo::v1::WORKER_STATE_BUSY) {
      e.status.set_state(apapo::v1::WORKER_STATE_IDLE);
      e.status.clear_job_id();
    }
  }
}

std::vector<apapo::v1::WorkerStatus> WorkerRegistry::List() {
  absl::MutexLock lock(&mu_);
  std::vector<apapo::v1::WorkerStatus> out;
  for (const auto& [id, e] : workers_) out.push_back(e.status);
  return out;
}

std::map<apapo::v1::WorkerState, int> WorkerRegistry::CountByState() {
  absl::MutexLock lock(&mu_);
  std::map<apapo::v1::WorkerState, int> counts;
  for (const auto& [id, e] : workers_) ++counts[e.status.state()];
  return counts;
}

void WorkerRegistry::SetLostHook(LostHook hook) {
  absl::MutexLock lock(&mu_);
  lost_hook_ = std::move(hook);
}

}  // namespace apapo::coordinator
