#include "worker/daemon/daemon.h"

#include <iostream>
#include <map>
#include <set>

#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "google/protobuf/util/time_util.h"
#include "grpcpp/grpcpp.h"

namespace apapo::worker {

using apapo::v1::CoordinatorMessage;
using apapo::v1::WorkerMessage;

// State of one Connect stream: the writer lock, the heartbeat, and the
// threads doing commands' work.
class WorkerDaemon::Session {
 public:
  Session(grpc::ClientReaderWriter<WorkerMessage, CoordinatorMessage>* stream,
          JobRunner* runner, std::string worker_id,
          const std::vector<std::string>* data_roots)
      : stream_(stream),
        runner_(runner),
        worker_id_(std::move(worker_id)),
        data_roots_(data_roots) {}

  ~Session() {
    ended_.Notify();
    if (heartbeat_.joinable()) heartbeat_.join();
    // The stream is gone: stop whatever still runs, then wait for it.
    std::vector<std::string> jobs;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [job, a] : assignments_) jobs.push_back(job);
      // A profile may be waiting for its peers' link test.
      jobs.insert(jobs.end(), profiling_.begin(), profiling_.end());
    }
    for (const auto& job : jobs) runner_->Stop(job);
    for (auto& t : workers_) t.join();
  }

  bool Write(const WorkerMessage& message) {
    absl::MutexLock lock(&write_mu_);
    return stream_->Write(message);
  }

  void StartHeartbeat(absl::Duration interval, const std::string& worker_id) {
    heartbeat_ = std::thread([this, interval] {
      while (!ended_.WaitForNotificationWithTimeout(interval)) {
        WorkerMessage m;
        *m.mutable_heartbeat()->mutable_time() =
            google::protobuf::util::TimeUtil::GetCurrentTime();
        {
          absl::MutexLock lock(&mu_);
          if (!running_job_.empty()) {
            m.mutable_heartbeat()->set_job_id(running_job_);
          }
        }
        if (!Write(m)) return;
      }
    });
  }

  void Ack(int64_t command_id, const absl::Status& status, int store_port = 0) {
    WorkerMessage m;
    m.mutable_ack()->set_command_id(command_id);
    m.mutable_ack()->set_code(static_cast<int>(status.code()));
    m.mutable_ack()->set_message(std::string(status.message()));
    m.mutable_ack()->set_store_port(store_port);
    Write(m);
  }

  void Handle(const CoordinatorMessage& command) {
    const int64_t id = command.command_id();
    switch (command.kind_case()) {
      case CoordinatorMessage::kProfile: {
        // Nothing of a spec runs here unless its paths stay in the roots.
        if (absl::Status s = CheckSpecPathsOnDisk(command.profile().spec(), *data_roots_);
            !s.ok()) {
          Ack(id, s);
          break;
        }
        apapo::v1::ProfileCommand profile = command.profile();
        const apapo::v1::Rendezvous& rv = profile.rendezvous();
        if (rv.world_size() > 1 && rv.rank() == 0 && rv.store_port() == 0) {
          // This worker hosts the link test's store: the coordinator sends
          // the other ranks their commands once it has the port.
          absl::StatusOr<int> bound = runner_->HostRendezvous(profile.job_id());
          if (!bound.ok()) {
            Ack(id, bound.status());
            break;
          }
          profile.mutable_rendezvous()->set_store_port(*bound);
          Ack(id, absl::OkStatus(), *bound);
        }
        {
          absl::MutexLock lock(&mu_);
          profiling_.insert(profile.job_id());
        }
        workers_.emplace_back([this, profile = std::move(profile), id] {
          absl::StatusOr<apapo::v1::ProfileResult> result =
              runner_->Profile(profile);
          {
            absl::MutexLock lock(&mu_);
            profiling_.erase(profile.job_id());
          }
          if (result.ok()) {
            WorkerMessage m;
            *m.mutable_profile_result() = std::move(*result);
            m.mutable_profile_result()->set_job_id(profile.job_id());
            Write(m);
          }
          Ack(id, result.status());
        });
        break;
      }
      case CoordinatorMessage::kAssign: {
        const auto& assign = command.assign();
        if (absl::Status s = CheckSpecPathsOnDisk(assign.spec(), *data_roots_); !s.ok()) {
          Ack(id, s);
          break;
        }
        runner_->PrepareAssignment(assign.job_id());
        int port = 0;
        absl::Status status;
        if (assign.rendezvous().store_port() == 0) {
          absl::StatusOr<int> bound = runner_->HostRendezvous(assign.job_id());
          status = bound.status();
          if (bound.ok()) port = *bound;
        }
        if (status.ok()) {
          absl::MutexLock lock(&mu_);
          assignments_[assign.job_id()] = assign;
          if (port != 0) {
            assignments_[assign.job_id()].mutable_rendezvous()->set_store_port(port);
          }
        }
        Ack(id, status, port);
        break;
      }
      case CoordinatorMessage::kStart: {
        apapo::v1::AssignStage assign;
        {
          absl::MutexLock lock(&mu_);
          auto it = assignments_.find(command.start().job_id());
          if (it == assignments_.end()) {
            Ack(id, absl::FailedPreconditionError(absl::StrCat(
                        "start: ", command.start().job_id(),
                        " was never assigned to ", worker_id_)));
            break;
          }
          assign = it->second;
          running_job_ = assign.job_id();
        }
        Ack(id, absl::OkStatus());
        workers_.emplace_back([this, assign] { Train(assign); });
        break;
      }
      case CoordinatorMessage::kStop:
        runner_->Stop(command.stop().job_id());
        Ack(id, absl::OkStatus());
        break;
      default:
        Ack(id, absl::InvalidArgumentError("unknown command"));
    }
  }

 private:
  void Train(const apapo::v1::AssignStage& assign) {
    apapo::v1::MetricsReport final_metrics;
    absl::Status status = runner_->Train(
        assign,
        [this](const apapo::v1::MetricsReport& report) {
          WorkerMessage m;
          *m.mutable_metrics() = report;
          Write(m);
        },
        &final_metrics);
    WorkerMessage m;
    auto* outcome = m.mutable_outcome();
    outcome->set_job_id(assign.job_id());
    outcome->set_stage(assign.stage());
    outcome->set_code(static_cast<int>(status.code()));
    outcome->set_message(std::string(status.message()));
    *outcome->mutable_final_metrics() = final_metrics;
    {
      absl::MutexLock lock(&mu_);
      assignments_.erase(assign.job_id());
      if (running_job_ == assign.job_id()) running_job_.clear();
    }
    Write(m);
  }

  grpc::ClientReaderWriter<WorkerMessage, CoordinatorMessage>* const stream_;
  JobRunner* const runner_;
  const std::string worker_id_;
  const std::vector<std::string>* const data_roots_;
  absl::Notification ended_;
  std::thread heartbeat_;
  std::vector<std::thread> workers_;  // only touched by the reader thread

  absl::Mutex write_mu_;  // one Write at a time on the stream
  absl::Mutex mu_;
  std::map<std::string, apapo::v1::AssignStage> assignments_ ABSL_GUARDED_BY(mu_);
  std::string running_job_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> profiling_ ABSL_GUARDED_BY(mu_);  // jobs in Profile
};

WorkerDaemon::WorkerDaemon(DaemonOptions options, JobRunner* runner)
    : options_(std::move(options)), runner_(runner) {}

WorkerDaemon::~WorkerDaemon() { Shutdown(); }

void WorkerDaemon::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (!shutdown_.HasBeenNotified()) shutdown_.Notify();
  if (context_ != nullptr) context_->TryCancel();
}

bool WorkerDaemon::WaitUntilRegistered(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&registered_), timeout);
}

bool WorkerDaemon::WaitForRegistrations(int n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return registrations_ >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

int WorkerDaemon::registrations() {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

absl::Duration JitteredBackoff(absl::Duration backoff, absl::BitGenRef gen) {
  return backoff * absl::Uniform(gen, 0.5, 1.5);
}

void WorkerDaemon::Run() {
  absl::Duration backoff = options_.initial_backoff;
  absl::BitGen gen;
  while (!shutdown_.HasBeenNotified()) {
    int before = registrations();
    RunSession();
    if (registrations() > before) backoff = options_.initial_backoff;
    if (shutdown_.WaitForNotificationWithTimeout(JitteredBackoff(backoff, gen))) {
      break;
    }
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void WorkerDaemon::RunSession() {
  auto channel = grpc::CreateChannel(options_.coordinator, options_.credentials);
  auto stub = apapo::v1::WorkerService::NewStub(channel);
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_.HasBeenNotified()) return;
    context_ = &context;
  }
  auto stream = stub->Connect(&context);
  WorkerMessage hello;
  *hello.mutable_register_() = options_.info;
  CoordinatorMessage reply;
  // Whether the stream may still be open (a first reply that was not
  // Registered): only then is it cancelled before Finish, which would
  // otherwise report CANCELLED instead of the coordinator's status (e.g.
  // PERMISSION_DENIED for a certificate of another worker).
  bool open = stream->Write(hello) && stream->Read(&reply);
  if (open && reply.has_registered()) {
    absl::Duration interval = absl::Nanoseconds(
        google::protobuf::util::TimeUtil::DurationToNanoseconds(
            reply.registered().heartbeat_interval()));
    if (interval <= absl::ZeroDuration()) interval = absl::Seconds(2);
    std::cerr << "apapo-worker: registered as " << reply.registered().worker_id()
              << " with " << options_.coordinator << "\n";
    {
      absl::MutexLock lock(&mu_);
      registered_ = true;
      ++registrations_;
    }
    Session session(stream.get(), runner_, options_.info.worker_id(),
                    &options_.data_roots);
    session.StartHeartbeat(interval, options_.info.worker_id());
    while (stream->Read(&reply)) session.Handle(reply);
    open = false;
    // ~Session stops running jobs and joins its threads.
  }
  {
    absl::MutexLock lock(&mu_);
    registered_ = false;
    context_ = nullptr;
  }
  if (open) context.TryCancel();
  grpc::Status status = stream->Finish();
  if (!shutdown_.HasBeenNotified()) {
    std::cerr << "apapo-worker: connection to " << options_.coordinator
              << " ended: "
              << (status.ok() ? "closed by the coordinator"
                              : status.error_message())
              << "; reconnecting\n";
  }
}

}  // namespace apapo::worker
