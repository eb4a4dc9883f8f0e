#include "worker/daemon/daemon.h"

#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/heartbeat_schedule.h"
#include "common/limits.h"
#include "common/proto_time.h"
#include "grpcpp/grpcpp.h"

namespace apapo::worker {

using apapo::v1::CoordinatorMessage;
using apapo::v1::WorkerMessage;

// State of one Connect stream: the writer lock, the heartbeat, and the
// threads doing commands' work. Trainings are the daemon's, not a
// session's: they go on when the stream ends.
class WorkerDaemon::Session {
 public:
  Session(grpc::ClientReaderWriter<WorkerMessage, CoordinatorMessage>* stream,
          WorkerDaemon* daemon)
      : stream_(stream),
        daemon_(daemon),
        runner_(daemon->runner_),
        worker_id_(daemon->options_.info.worker_id()),
        data_roots_(&daemon->options_.data_roots) {}

  ~Session() {
    ended_.Notify();
    if (heartbeat_.joinable()) heartbeat_.join();
    // The stream is gone. Stages that train go on (the coordinator adopts
    // them when it is back); what needed this stream stops: assignments
    // not started yet (their rendezvous) and profiles (their results had
    // nowhere to go).
    std::vector<std::string> jobs;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [job, a] : assignments_) jobs.push_back(job);
      jobs.insert(jobs.end(), profiling_.begin(), profiling_.end());
    }
    for (const auto& job : jobs) runner_->Stop(job);
    for (auto& t : workers_) t.join();
  }

  bool Write(const WorkerMessage& message) {
    absl::MutexLock lock(&write_mu_);
    return stream_->Write(message);
  }

  // Heartbeats every `interval`; with an `offset`, on the coordinator's grid
  // of wall-clock times (common/heartbeat_schedule.h).
  void StartHeartbeat(absl::Duration interval, std::optional<absl::Duration> offset) {
    heartbeat_ = std::thread([this, interval, offset] {
      absl::Time previous = absl::Now();
      for (;;) {
        absl::Duration wait = interval;
        if (offset.has_value()) {
          wait = HeartbeatWait(NextHeartbeatTime(previous, interval, *offset),
                               absl::Now(), interval);
        }
        if (ended_.WaitForNotificationWithTimeout(wait)) return;
        previous = absl::Now();
        WorkerMessage m;
        *m.mutable_heartbeat()->mutable_time() =
            apapo::NowTimestamp();
        const std::string job = daemon_->RunningJob();
        if (!job.empty()) m.mutable_heartbeat()->set_job_id(job);
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
          // From now on the daemon's: it trains on without this stream.
          assignments_.erase(it);
        }
        Ack(id, absl::OkStatus());
        daemon_->StartTraining(assign);
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
  grpc::ClientReaderWriter<WorkerMessage, CoordinatorMessage>* const stream_;
  WorkerDaemon* const daemon_;
  JobRunner* const runner_;
  const std::string worker_id_;
  const std::vector<std::string>* const data_roots_;
  absl::Notification ended_;
  std::thread heartbeat_;
  std::vector<std::thread> workers_;  // only touched by the reader thread

  absl::Mutex write_mu_;  // one Write at a time on the stream
  absl::Mutex mu_;
  // Assigned, not started yet.
  std::map<std::string, apapo::v1::AssignStage> assignments_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> profiling_ ABSL_GUARDED_BY(mu_);  // jobs in Profile
};

// ---- trainings, which outlive sessions ----

std::string WorkerDaemon::RunningJob() {
  absl::MutexLock lock(&jobs_mu_);
  return trainings_.empty() ? "" : trainings_.begin()->first;
}

std::vector<apapo::v1::RunningStage> WorkerDaemon::Running() {
  absl::MutexLock lock(&jobs_mu_);
  std::vector<apapo::v1::RunningStage> out;
  for (const auto& [job, t] : trainings_) {
    apapo::v1::RunningStage r;
    r.set_job_id(job);
    r.set_stage(t.assign.stage());
    r.set_replica(t.assign.replica());
    r.set_rank(t.assign.rendezvous().rank());
    r.set_rendezvous_prefix(t.assign.rendezvous().prefix());
    r.set_step(t.step);
    out.push_back(std::move(r));
  }
  return out;
}

bool WorkerDaemon::Send(const WorkerMessage& message) {
  absl::MutexLock lock(&jobs_mu_);
  return session_ != nullptr && session_->Write(message);
}

void WorkerDaemon::SendOrKeep(const WorkerMessage& message) {
  absl::MutexLock lock(&jobs_mu_);
  if (session_ != nullptr && session_->Write(message)) return;
  // The next session sends it once registered (an outcome must not be lost:
  // the coordinator may be waiting for it to finish or restart the job).
  unsent_.push_back(message);
}

void WorkerDaemon::AttachSession(Session* session) {
  absl::MutexLock lock(&jobs_mu_);
  session_ = session;
  if (session == nullptr) return;
  std::vector<WorkerMessage> unsent = std::move(unsent_);
  unsent_.clear();
  for (size_t i = 0; i < unsent.size(); ++i) {
    if (!session->Write(unsent[i])) {
      unsent_.assign(unsent.begin() + i, unsent.end());
      return;
    }
  }
}

void WorkerDaemon::StartTraining(const apapo::v1::AssignStage& assign) {
  {
    absl::MutexLock lock(&jobs_mu_);
    trainings_[assign.job_id()].assign = assign;
  }
  absl::MutexLock lock(&threads_mu_);
  train_threads_.emplace_back([this, assign] { Train(assign); });
}

void WorkerDaemon::Train(const apapo::v1::AssignStage& assign) {
  apapo::v1::MetricsReport final_metrics;
  absl::Status status = runner_->Train(
      assign,
      [this, job = assign.job_id()](const apapo::v1::MetricsReport& report) {
        {
          absl::MutexLock lock(&jobs_mu_);
          auto it = trainings_.find(job);
          // A trace-only report (MetricsReport.trace) carries no step.
          if (it != trainings_.end() && !report.has_trace()) {
            it->second.step = report.step();
          }
        }
        WorkerMessage m;
        *m.mutable_metrics() = report;
        Send(m);  // a report without a coordinator is dropped
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
    absl::MutexLock lock(&jobs_mu_);
    trainings_.erase(assign.job_id());
  }
  SendOrKeep(m);
}

void WorkerDaemon::StopTrainings() {
  std::vector<std::string> jobs;
  {
    absl::MutexLock lock(&jobs_mu_);
    for (const auto& [job, t] : trainings_) jobs.push_back(job);
  }
  for (const auto& job : jobs) runner_->Stop(job);
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&threads_mu_);
    threads.swap(train_threads_);
  }
  for (auto& t : threads) t.join();
}

WorkerDaemon::WorkerDaemon(DaemonOptions options, JobRunner* runner)
    : options_(std::move(options)), runner_(runner) {}

WorkerDaemon::~WorkerDaemon() {
  Shutdown();
  StopTrainings();
}

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
  // The daemon itself stops: so do its stages.
  StopTrainings();
}

void WorkerDaemon::RunSession() {
  // Keepalive pings find a cut link (common/limits.h): the stream then ends
  // and the daemon reconnects, its stages training on.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  auto channel = grpc::CreateCustomChannel(options_.coordinator, options_.credentials, args);
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
  // Stages still training from before (the coordinator restarted, or the
  // connection was cut): the coordinator adopts or stops them.
  for (auto& r : Running()) *hello.mutable_register_()->add_running() = std::move(r);
  CoordinatorMessage reply;
  // Whether the stream may still be open (a first reply that was not
  // Registered): only then is it cancelled before Finish, which would
  // otherwise report CANCELLED instead of the coordinator's status (e.g.
  // PERMISSION_DENIED for a certificate of another worker).
  bool open = stream->Write(hello) && stream->Read(&reply);
  if (open && reply.has_registered()) {
    // Saturating, whatever the coordinator sent. The offset is folded into
    // the interval.
    const auto& registered = reply.registered();
    absl::Duration interval = FromProtoDuration(registered.heartbeat_interval());
    if (interval <= absl::ZeroDuration() || interval == absl::InfiniteDuration()) {
      interval = absl::Seconds(2);
    }
    std::optional<absl::Duration> offset;
    if (registered.has_heartbeat_offset()) {
      offset = FromProtoDuration(registered.heartbeat_offset());
    }
    std::cerr << "apapo-worker: registered as " << reply.registered().worker_id()
              << " with " << options_.coordinator << "\n";
    {
      absl::MutexLock lock(&mu_);
      registered_ = true;
      ++registrations_;
    }
    Session session(stream.get(), this);
    AttachSession(&session);  // sends what ended while there was none
    session.StartHeartbeat(interval, offset);
    while (stream->Read(&reply)) session.Handle(reply);
    open = false;
    AttachSession(nullptr);
    // ~Session stops what needed this stream and joins its threads.
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
