#include "bench/fleet/fleet_sim.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/fleet/canned.h"
#include "common/heartbeat_schedule.h"
#include "common/proto_time.h"
#include "grpcpp/grpcpp.h"

namespace apapo::bench {
namespace {

using apapo::v1::CoordinatorMessage;
using apapo::v1::WorkerMessage;

// How long Stop() waits for cancelled streams to end.
constexpr absl::Duration kCancelGrace = absl::Seconds(10);

// The job a command is about ("" for Registered).
std::string JobOf(const CoordinatorMessage& m) {
  switch (m.kind_case()) {
    case CoordinatorMessage::kProfile:
      return m.profile().job_id();
    case CoordinatorMessage::kAssign:
      return m.assign().job_id();
    case CoordinatorMessage::kStart:
      return m.start().job_id();
    case CoordinatorMessage::kStop:
      return m.stop().job_id();
    default:
      return "";
  }
}

}  // namespace

// One worker's stream. Writes are serialised through a queue: whoever sets
// writing_ owns current_ and the single write in flight, and passes the
// turn on from OnWriteDone. A hold keeps OnDone back until the read side
// has ended and no write is being started, so that a timer thread never
// starts a write on a finished call. gRPC calls are made without mu_ held.
class FleetSimulator::Worker final
    : public grpc::ClientBidiReactor<WorkerMessage, CoordinatorMessage> {
 public:
  Worker(FleetSimulator* sim, int index)
      : sim_(sim),
        index_(index),
        id_(absl::StrCat(sim->options_.id_prefix, "-", index)) {}

  const std::string& id() const { return id_; }

  // Opens the stream and sends the registration.
  void Begin(apapo::v1::WorkerService::Stub* stub) {
    begin_ = absl::Now();
    stub->async()->Connect(&context_, this);
    AddHold();
    StartRead(&in_);
    WorkerMessage hello;
    apapo::v1::WorkerInfo* info = hello.mutable_register_();
    info->set_worker_id(id_);
    info->set_host("127.0.0.1");
    info->set_cores(1);
    info->set_memory_bytes(sim_->options_.memory_bytes);
    info->mutable_build()->set_version("fleet-sim");
    for (const auto& [k, v] : sim_->options_.labels) {
      (*info->mutable_labels())[k] = v;
    }
    Send(std::move(hello));
    StartCall();
  }

  // Queues `message`; false once the stream no longer takes writes.
  bool Send(WorkerMessage message) {
    {
      absl::MutexLock lock(&mu_);
      if (writes_closed_ || close_requested_) return false;
      pending_.push_back(std::move(message));
      if (writing_) return true;
      writing_ = true;
      current_ = std::move(pending_.front());
      pending_.pop_front();
    }
    StartWrite(&current_);
    return true;
  }

  bool SendHeartbeat() {
    WorkerMessage m;
    *m.mutable_heartbeat()->mutable_time() = apapo::NowTimestamp();
    {
      absl::MutexLock lock(&mu_);
      if (!running_job_.empty()) m.mutable_heartbeat()->set_job_id(running_job_);
    }
    return Send(std::move(m));
  }

  // Half-closes the stream once the writes queued so far are out.
  void CloseWrites() {
    {
      absl::MutexLock lock(&mu_);
      if (close_requested_ || writes_closed_) return;
      close_requested_ = true;
      if (writing_) return;  // the write in flight starts WritesDone
      writing_ = true;
      writes_closed_ = true;
    }
    StartWritesDone();
  }

  void Cancel() { context_.TryCancel(); }

  // Simulated training: the k-th of the job's metrics reports, then the
  // outcome (k == 0). Nothing once the job was stopped.
  void Train(const std::string& job_id, int k) {
    WorkerMessage m;
    {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end() || it->second.stopped) return;
      const Job& job = it->second;
      const int reports = sim_->options_.metrics_reports;
      const double done = k == 0 ? 1.0 : static_cast<double>(k) / (reports + 1);
      apapo::v1::MetricsReport report = Report(job_id, job, done);
      if (k != 0) {
        *m.mutable_metrics() = std::move(report);
      } else {
        apapo::v1::StageOutcome* outcome = m.mutable_outcome();
        outcome->set_job_id(job_id);
        outcome->set_stage(job.stage);
        outcome->set_code(0);
        if (job.last_stage) report.set_test_accuracy(0.5);
        *outcome->mutable_final_metrics() = std::move(report);
        if (running_job_ == job_id) running_job_.clear();
        jobs_.erase(it);
      }
    }
    Send(std::move(m));
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      Handle(in_);
      StartRead(&in_);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      writes_closed_ = true;
      read_ended_ = true;
      pending_.clear();
      if (writing_ || hold_released_) return;  // the writer releases it
      hold_released_ = true;
    }
    RemoveHold();
  }

  void OnWriteDone(bool ok) override {
    sim_->OnSent(index_, current_, ok);
    enum { kNothing, kWrite, kWritesDone, kReleaseHold } next = kNothing;
    {
      absl::MutexLock lock(&mu_);
      if (!ok) {
        writes_closed_ = true;
        pending_.clear();
      }
      if (!writes_closed_ && !pending_.empty()) {
        current_ = std::move(pending_.front());
        pending_.pop_front();
        next = kWrite;
      } else if (close_requested_ && !writes_closed_) {
        writes_closed_ = true;
        next = kWritesDone;
      } else {
        writing_ = false;
        if (read_ended_ && !hold_released_) {
          hold_released_ = true;
          next = kReleaseHold;
        }
      }
    }
    switch (next) {
      case kWrite:
        StartWrite(&current_);
        break;
      case kWritesDone:
        StartWritesDone();
        break;
      case kReleaseHold:
        RemoveHold();
        break;
      case kNothing:
        break;
    }
  }

  void OnWritesDoneDone(bool ok) override {
    if (!ok) sim_->OnError(index_);
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!read_ended_ || hold_released_) return;
      hold_released_ = true;
    }
    RemoveHold();
  }

  void OnDone(const grpc::Status& status) override {
    // The last use of this object: Stop() may free it once this returns.
    sim_->OnEnded(index_, static_cast<absl::StatusCode>(status.error_code()),
                  status.error_message());
  }

 private:
  // What the worker remembers of an assigned job.
  struct Job {
    int stage = 0;
    int rank = 0;
    bool last_stage = false;
    int64_t batch = 1;
    int64_t total_steps = 100;
    bool stopped = false;
    absl::Time started = absl::InfiniteFuture();
  };

  apapo::v1::MetricsReport Report(const std::string& job_id, const Job& job,
                                  double done) const {
    apapo::v1::MetricsReport r;
    r.set_job_id(job_id);
    r.set_worker_id(id_);
    *r.mutable_time() = apapo::NowTimestamp();
    const int64_t step = static_cast<int64_t>(done * job.total_steps);
    r.set_step(step);
    r.set_epoch(1);
    r.set_samples(step * job.batch);
    r.set_total_steps(job.total_steps);
    const double seconds =
        absl::ToDoubleSeconds(sim_->options_.train_duration);
    if (seconds > 0) r.set_samples_per_second(job.total_steps * job.batch / seconds);
    if (job.last_stage) {
      r.set_has_loss(true);
      r.set_loss(2.3 * (1 - 0.5 * done));
    }
    apapo::v1::StageMetrics* s = r.mutable_stage();
    s->set_stage(job.stage);
    s->set_rank(job.rank);
    const double elapsed = done * seconds;
    s->set_busy_seconds(0.8 * elapsed);
    s->set_idle_seconds(0.2 * elapsed);
    s->set_forward_micro_batches(step);
    s->set_backward_micro_batches(step);
    return r;
  }

  void Ack(int64_t command_id, int code = 0, const std::string& message = "",
           int store_port = 0) {
    WorkerMessage m;
    apapo::v1::CommandAck* ack = m.mutable_ack();
    ack->set_command_id(command_id);
    ack->set_code(code);
    ack->set_message(message);
    ack->set_store_port(store_port);
    Send(std::move(m));
  }

  // Runs on the read chain; never blocks.
  void Handle(const CoordinatorMessage& m) {
    sim_->OnReceived(index_, m);
    const int64_t id = m.command_id();
    const int store_port = sim_->options_.fake_store_port;
    switch (m.kind_case()) {
      case CoordinatorMessage::kRegistered: {
        std::optional<absl::Duration> offset;
        if (m.registered().has_heartbeat_offset()) {
          offset = FromProtoDuration(m.registered().heartbeat_offset());
        }
        sim_->OnRegistered(index_, absl::Now() - begin_,
                           FromProtoDuration(m.registered().heartbeat_interval()), offset);
        return;
      }
      case CoordinatorMessage::kProfile: {
        const apapo::v1::ProfileCommand& p = m.profile();
        const apapo::v1::Rendezvous& rv = p.rendezvous();
        // The rank hosting the link test's store reports its port first:
        // the coordinator sends the other ranks their commands only then.
        if (p.has_rendezvous() && rv.world_size() > 1 && rv.rank() == 0 &&
            rv.store_port() == 0) {
          Ack(id, 0, "", store_port);
        }
        WorkerMessage result;
        apapo::v1::ProfileResult* r = result.mutable_profile_result();
        r->set_job_id(p.job_id());
        *r->mutable_profile() = CannedProfile(p.spec());
        r->mutable_resources()->set_worker_id(id_);
        r->mutable_resources()->set_relative_speed(1.0);
        r->mutable_resources()->set_memory_bytes(sim_->options_.memory_bytes);
        if (p.has_rendezvous()) {
          std::vector<std::string> peers(p.peers().begin(), p.peers().end());
          for (auto& link : CannedLinks(peers, rv.rank())) {
            *r->add_links() = std::move(link);
          }
        }
        Send(std::move(result));
        Ack(id);
        return;
      }
      case CoordinatorMessage::kAssign: {
        const apapo::v1::AssignStage& a = m.assign();
        {
          absl::MutexLock lock(&mu_);
          Job& job = jobs_[a.job_id()];
          job.stage = a.stage();
          job.rank = a.rendezvous().rank();
          job.last_stage = a.stage() == a.plan().stages_size() - 1;
          job.batch = std::max(1, a.spec().data().batch_size());
          if (a.spec().limits().max_steps() > 0) {
            job.total_steps = a.spec().limits().max_steps();
          }
        }
        // Port 0: this rank hosts the job's store.
        Ack(id, 0, "", a.rendezvous().store_port() == 0 ? store_port : 0);
        return;
      }
      case CoordinatorMessage::kStart: {
        const std::string& job_id = m.start().job_id();
        bool known = false;
        {
          absl::MutexLock lock(&mu_);
          auto it = jobs_.find(job_id);
          if (it != jobs_.end() && !it->second.stopped) {
            known = true;
            it->second.started = absl::Now();
            running_job_ = job_id;
          }
        }
        if (!known) {
          sim_->OnError(index_);
          Ack(id, static_cast<int>(absl::StatusCode::kFailedPrecondition),
              absl::StrCat("start: ", job_id, " was never assigned to ", id_));
          return;
        }
        Ack(id);
        const FleetOptions& o = sim_->options_;
        const absl::Time now = absl::Now();
        for (int k = 1; k <= o.metrics_reports; ++k) {
          sim_->timers_.Schedule(now + o.train_duration * k / (o.metrics_reports + 1),
                                 [this, job_id, k] { Train(job_id, k); });
        }
        sim_->timers_.Schedule(now + o.train_duration,
                               [this, job_id] { Train(job_id, 0); });
        return;
      }
      case CoordinatorMessage::kStop: {
        {
          absl::MutexLock lock(&mu_);
          const std::string& job_id = m.stop().job_id();
          auto it = jobs_.find(job_id);
          if (it != jobs_.end()) it->second.stopped = true;
          if (running_job_ == job_id) running_job_.clear();
        }
        Ack(id);
        return;
      }
      default:
        sim_->OnError(index_);
        if (id != 0) {
          Ack(id, static_cast<int>(absl::StatusCode::kInvalidArgument),
              "unknown command");
        }
        return;
    }
  }

  FleetSimulator* const sim_;
  const int index_;
  const std::string id_;
  grpc::ClientContext context_;
  absl::Time begin_;        // set before the call starts
  CoordinatorMessage in_;   // the read chain's buffer
  WorkerMessage current_;   // the write in flight (writing_'s owner)

  absl::Mutex mu_;
  std::deque<WorkerMessage> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool close_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::string running_job_ ABSL_GUARDED_BY(mu_);
};

FleetSimulator::FleetSimulator(FleetOptions options)
    : options_(std::move(options)) {}

FleetSimulator::~FleetSimulator() {
  Stop(absl::Now() + absl::Seconds(5)).IgnoreError();
}

absl::Status FleetSimulator::Start() {
  if (options_.target.empty()) {
    return absl::InvalidArgumentError("fleet: target must be set");
  }
  if (options_.workers < 1 || options_.workers_per_channel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("fleet: workers (", options_.workers,
                     ") and workers_per_channel (", options_.workers_per_channel,
                     ") must be >= 1"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("fleet: already started");
    started_ = true;
    records_.resize(options_.workers);
    stats_.workers = options_.workers;
    heartbeat_levels_.assign(2, 0);
  }
  const int n = options_.workers;
  const int channels =
      (n + options_.workers_per_channel - 1) / options_.workers_per_channel;
  for (int c = 0; c < channels; ++c) {
    grpc::ChannelArguments args;
    // A channel of its own (own TCP connection) rather than a subchannel
    // shared with the other channels to the same target.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("apapo.fleet_channel", c);
    channels_.push_back(grpc::CreateCustomChannel(
        options_.target, grpc::InsecureChannelCredentials(), args));
    stubs_.push_back(apapo::v1::WorkerService::NewStub(channels_.back()));
  }
  for (int i = 0; i < n; ++i) {
    workers_.push_back(std::make_unique<Worker>(this, i));
  }
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < n; ++i) records_[i].worker_id = workers_[i]->id();
  }
  start_time_ = absl::Now();
  for (int i = 0; i < n; ++i) {
    workers_[i]->Begin(stubs_[i / options_.workers_per_channel].get());
  }
  return absl::OkStatus();
}

bool FleetSimulator::WaitAllRegistered(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stats_.registered == options_.workers || ended_unregistered_ > 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  return stats_.registered == options_.workers;
}

bool FleetSimulator::WaitForHeartbeats(int64_t count, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return count <= 0 ||
           (count < static_cast<int64_t>(heartbeat_levels_.size()) &&
            heartbeat_levels_[count] == options_.workers);
  };
  return mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
}

bool FleetSimulator::AwaitJobMilestone(const std::string& job_id,
                                       JobMilestone milestone, int count,
                                       absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = jobs_.find(job_id);
    return it != jobs_.end() && it->second.at(milestone).count >= count;
  };
  // A stopped job (failed or cancelled) will not get any further.
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reached()) return true;
    auto it = jobs_.find(job_id);
    return milestone != JobMilestone::kStopReceived && it != jobs_.end() &&
           it->second.at(JobMilestone::kStopReceived).count > 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  return reached();
}

bool FleetSimulator::AwaitAllAcked(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return commands_acked_ == commands_received_;
  };
  return mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
}

FleetStats FleetSimulator::Stats() {
  const absl::Duration lateness = timers_.max_lateness();
  absl::MutexLock lock(&mu_);
  FleetStats s = stats_;
  for (const WorkerRecord& r : records_) {
    if (r.registered) s.registration_latencies.push_back(r.registration_latency);
  }
  std::sort(s.registration_latencies.begin(), s.registration_latencies.end());
  s.max_timer_lateness = lateness;
  return s;
}

std::vector<WorkerRecord> FleetSimulator::Workers() {
  absl::MutexLock lock(&mu_);
  return records_;
}

JobRecord FleetSimulator::Job(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? JobRecord() : it->second;
}

absl::Status FleetSimulator::Stop(absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return stop_status_;
    if (!started_) {
      stopped_ = true;
      return stop_status_;
    }
    stopping_ = true;
  }
  // No heartbeat or report is started after this.
  timers_.Stop();
  for (auto& w : workers_) w->CloseWrites();
  const int n = static_cast<int>(workers_.size());
  auto all_ended = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stats_.streams_ended == n;
  };
  absl::Status status;
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithDeadline(absl::Condition(&all_ended), deadline)) {
    const int open = n - stats_.streams_ended;
    mu_.Unlock();
    for (auto& w : workers_) w->Cancel();
    mu_.Lock();
    status = absl::DeadlineExceededError(
        absl::StrCat("fleet: ", open, " of ", n,
                     " stream(s) still open at the deadline; cancelled"));
    if (!mu_.AwaitWithTimeout(absl::Condition(&all_ended), kCancelGrace)) {
      status = absl::InternalError(absl::StrCat(
          "fleet: ", n - stats_.streams_ended,
          " stream(s) did not end even when cancelled; leaking them"));
      for (int i = 0; i < n; ++i) {
        if (!records_[i].ended) workers_[i].release();
      }
    }
  }
  stopped_ = true;
  stop_status_ = status;
  return status;
}

void FleetSimulator::OnRegistered(int index, absl::Duration latency,
                                  absl::Duration interval,
                                  std::optional<absl::Duration> offset) {
  {
    absl::MutexLock lock(&mu_);
    WorkerRecord& r = records_[index];
    if (r.registered) {
      ++stats_.errors;  // registered twice
      return;
    }
    r.registered = true;
    r.registration_latency = latency;
    r.heartbeat_interval = interval;
    r.heartbeat_offset = offset;
    last_registered_ = absl::Now();
    if (++stats_.registered == options_.workers) {
      stats_.time_to_register_all = last_registered_ - start_time_;
    }
  }
  if (interval <= absl::ZeroDuration()) return;
  // On the coordinator's grid, as the daemon does; without an offset,
  // spread the fleet's first heartbeats evenly over one interval.
  const absl::Time first =
      offset.has_value()
          ? NextHeartbeatTime(absl::Now(), interval, *offset)
          : absl::Now() + interval * index / std::max(1, options_.workers);
  timers_.Schedule(first, [this, index, first, interval, offset] {
    Heartbeat(index, first, interval, offset);
  });
}

void FleetSimulator::Heartbeat(int index, absl::Time when, absl::Duration interval,
                               std::optional<absl::Duration> offset) {
  if (!workers_[index]->SendHeartbeat()) return;
  // Keep the cadence; after a stall, resume from now instead of bursting.
  const absl::Time now = absl::Now();
  absl::Time next = offset.has_value()
                        ? NextHeartbeatTime(std::max(when, now - interval / 2),
                                            interval, *offset)
                        : when + interval;
  if (next < now - interval) next = now;
  timers_.Schedule(next, [this, index, next, interval, offset] {
    Heartbeat(index, next, interval, offset);
  });
}

void FleetSimulator::RecordMilestone(const std::string& job_id,
                                     JobMilestone m) {
  JobRecord::Point& p = jobs_[job_id].points[static_cast<int>(m)];
  const absl::Time now = absl::Now();
  ++p.count;
  p.first = std::min(p.first, now);
  p.last = std::max(p.last, now);
}

void FleetSimulator::OnReceived(int index, const CoordinatorMessage& m) {
  absl::MutexLock lock(&mu_);
  ++stats_.received[m.kind_case()];
  if (m.command_id() == 0) return;
  const std::string job_id = JobOf(m);
  CommandRecord& c = records_[index].commands[m.command_id()];
  c.kind = m.kind_case();
  c.job_id = job_id;
  c.received = absl::Now();
  ++commands_received_;
  switch (m.kind_case()) {
    case CoordinatorMessage::kProfile:
      RecordMilestone(job_id, JobMilestone::kProfileReceived);
      break;
    case CoordinatorMessage::kAssign:
      RecordMilestone(job_id, JobMilestone::kAssignReceived);
      break;
    case CoordinatorMessage::kStart:
      RecordMilestone(job_id, JobMilestone::kStartReceived);
      break;
    case CoordinatorMessage::kStop:
      RecordMilestone(job_id, JobMilestone::kStopReceived);
      break;
    default:
      break;
  }
}

void FleetSimulator::OnSent(int index, const WorkerMessage& m, bool ok) {
  absl::MutexLock lock(&mu_);
  if (!ok) {
    ++stats_.errors;
    return;
  }
  ++stats_.sent[m.kind_case()];
  WorkerRecord& r = records_[index];
  switch (m.kind_case()) {
    case WorkerMessage::kHeartbeat: {
      const int64_t level = ++r.heartbeats_sent;
      if (level >= static_cast<int64_t>(heartbeat_levels_.size())) {
        heartbeat_levels_.resize(level + 1, 0);
      }
      ++heartbeat_levels_[level];
      break;
    }
    case WorkerMessage::kAck: {
      auto it = r.commands.find(m.ack().command_id());
      if (it == r.commands.end()) {
        ++stats_.errors;  // acknowledges a command never received
      } else if (it->second.acks_sent++ == 0) {
        ++commands_acked_;
      }
      break;
    }
    case WorkerMessage::kProfileResult:
      RecordMilestone(m.profile_result().job_id(),
                      JobMilestone::kProfileResultSent);
      break;
    case WorkerMessage::kOutcome:
      RecordMilestone(m.outcome().job_id(), JobMilestone::kOutcomeSent);
      break;
    default:
      break;
  }
}

void FleetSimulator::OnError(int index) {
  absl::MutexLock lock(&mu_);
  ++stats_.errors;
}

void FleetSimulator::OnEnded(int index, absl::StatusCode code,
                             const std::string& message) {
  absl::MutexLock lock(&mu_);
  WorkerRecord& r = records_[index];
  r.ended = true;
  r.end_time = absl::Now();
  r.end_code = code;
  r.end_message = message;
  ++stats_.streams_ended;
  if (!stopping_) ++stats_.streams_ended_early;
  if (!r.registered) ++ended_unregistered_;
}

}  // namespace apapo::bench
