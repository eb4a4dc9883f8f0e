// The daemon against a real coordinator WorkerService on loopback, with a
// fake JobRunner: registration, commands, acks, outcomes, reconnection.
#include "worker/daemon/daemon.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "grpcpp/grpcpp.h"

#include "coordinator/server.h"
#include "coordinator/worker_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo::worker {
namespace {

using apapo::v1::WorkerMessage;

class FakeRunner : public JobRunner {
 public:
  absl::StatusOr<apapo::v1::ProfileResult> Profile(
      const apapo::v1::ProfileCommand& command) override {
    {
      absl::MutexLock lock(&mu_);
      profiled_ = command;
    }
    apapo::v1::ProfileResult r;
    r.mutable_profile()->set_model(command.spec().name());
    r.mutable_profile()->add_nodes()->set_id("fc1");
    return r;
  }
  absl::StatusOr<int> HostRendezvous(const std::string&) override { return 4242; }
  absl::Status Train(const apapo::v1::AssignStage& a, const MetricsCallback& report,
                     apapo::v1::MetricsReport* final_metrics) override {
    apapo::v1::MetricsReport m;
    m.set_job_id(a.job_id());
    m.set_step(1);
    report(m);
    absl::MutexLock lock(&mu_);
    auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopped_;
    };
    mu_.Await(absl::Condition(&stopped));
    final_metrics->set_step(1);
    return absl::CancelledError("stage " + std::to_string(a.stage()) + " stopped");
  }
  void Stop(const std::string&) override {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  apapo::v1::ProfileCommand profiled() {
    absl::MutexLock lock(&mu_);
    return profiled_;
  }
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  apapo::v1::ProfileCommand profiled_ ABSL_GUARDED_BY(mu_);
};

// Records worker messages and lets the test wait for one of a kind.
class Inbox : public coordinator::WorkerMessageListener {
 public:
  void OnWorkerMessage(const std::string&, const WorkerMessage& m) override {
    absl::MutexLock lock(&mu_);
    messages_.push_back(m);
  }
  WorkerMessage WaitFor(WorkerMessage::KindCase kind, int nth = 0) {
    absl::MutexLock lock(&mu_);
    auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Count(kind) > nth; };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&has), absl::Seconds(30)))
        << "no message of kind " << kind;
    int seen = 0;
    for (const auto& m : messages_) {
      if (m.kind_case() == kind && seen++ == nth) return m;
    }
    return {};
  }

 private:
  int Count(WorkerMessage::KindCase kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int n = 0;
    for (const auto& m : messages_) n += m.kind_case() == kind;
    return n;
  }
  absl::Mutex mu_;
  std::vector<WorkerMessage> messages_ ABSL_GUARDED_BY(mu_);
};

struct Coordinator {
  explicit Coordinator(const std::string& address) {
    service.SetRegisterHook([this](const apapo::v1::WorkerInfo& info) {
      absl::MutexLock lock(&mu);
      registered.push_back(info);
    });
    auto bound = server.Start(address);
    EXPECT_TRUE(bound.ok()) << bound.status();
    port = bound.ok() ? *bound : 0;
  }
  // What the worker registered with the n-th time (0-based), once it has.
  apapo::v1::WorkerInfo Registered(int n) {
    absl::MutexLock lock(&mu);
    auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return static_cast<int>(registered.size()) > n;
    };
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&has), absl::Seconds(60)));
    return static_cast<int>(registered.size()) > n ? registered[n] : apapo::v1::WorkerInfo();
  }
  coordinator::RealClock clock;
  coordinator::WorkerRegistry registry{&clock, absl::Milliseconds(100)};
  Inbox inbox;
  coordinator::WorkerServiceImpl service{&registry, &inbox};
  coordinator::CoordinatorServer server{{&service}};
  int port = 0;
  absl::Mutex mu;
  std::vector<apapo::v1::WorkerInfo> registered ABSL_GUARDED_BY(mu);
};

// What the tests' daemon registers as, reconnecting fast.
DaemonOptions TestDaemonOptions(int port) {
  DaemonOptions options;
  options.coordinator = "127.0.0.1:" + std::to_string(port);
  options.info.set_worker_id("w-test");
  options.initial_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  return options;
}

TEST(WorkerDaemonTest, ServesCommandsAndReconnectsAfterCoordinatorRestart) {
  auto coord = std::make_unique<Coordinator>("127.0.0.1:0");
  const int port = coord->port;
  FakeRunner runner;
  WorkerDaemon daemon(TestDaemonOptions(port), &runner);
  std::thread run([&] { daemon.Run(); });
  ASSERT_TRUE(daemon.WaitUntilRegistered(absl::Seconds(30)));
  ASSERT_EQ(coord->registry.List().size(), 1u);

  apapo::v1::CoordinatorMessage profile;
  profile.mutable_profile()->set_job_id("job-1");
  profile.mutable_profile()->mutable_spec()->set_name("m");
  auto profile_id = coord->registry.Send("w-test", profile);
  ASSERT_TRUE(profile_id.ok());
  WorkerMessage result = coord->inbox.WaitFor(WorkerMessage::kProfileResult);
  EXPECT_EQ(result.profile_result().job_id(), "job-1");
  EXPECT_EQ(result.profile_result().profile().nodes(0).id(), "fc1");
  // The profile is acked after its result (on the profiling thread): wait
  // for that ack, so the next ack is the assignment's.
  EXPECT_EQ(coord->inbox.WaitFor(WorkerMessage::kAck, 0).ack().command_id(),
            *profile_id);

  apapo::v1::CoordinatorMessage assign;
  assign.mutable_assign()->set_job_id("job-1");
  assign.mutable_assign()->set_stage(1);
  auto assign_id = coord->registry.Send("w-test", assign);
  WorkerMessage ack = coord->inbox.WaitFor(WorkerMessage::kAck, 1);
  EXPECT_EQ(ack.ack().command_id(), *assign_id);
  EXPECT_EQ(ack.ack().code(), 0);
  EXPECT_EQ(ack.ack().store_port(), 4242);  // hosted the rendezvous

  apapo::v1::CoordinatorMessage start;
  start.mutable_start()->set_job_id("job-1");
  ASSERT_TRUE(coord->registry.Send("w-test", start).ok());
  EXPECT_EQ(coord->inbox.WaitFor(WorkerMessage::kMetrics).metrics().step(), 1);
  apapo::v1::CoordinatorMessage stop;
  stop.mutable_stop()->set_job_id("job-1");
  ASSERT_TRUE(coord->registry.Send("w-test", stop).ok());
  WorkerMessage outcome = coord->inbox.WaitFor(WorkerMessage::kOutcome);
  EXPECT_EQ(outcome.outcome().code(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(outcome.outcome().message(), "stage 1 stopped");

  // Start for a job never assigned: a FAILED_PRECONDITION ack, no crash.
  start.mutable_start()->set_job_id("job-2");
  auto bad = coord->registry.Send("w-test", start);
  WorkerMessage bad_ack = coord->inbox.WaitFor(WorkerMessage::kAck, 4);
  EXPECT_EQ(bad_ack.ack().command_id(), *bad);
  EXPECT_EQ(bad_ack.ack().code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));

  // The coordinator goes away and comes back on the same port.
  coord->server.Shutdown();
  coord.reset();
  coord = std::make_unique<Coordinator>("127.0.0.1:" + std::to_string(port));
  ASSERT_EQ(coord->port, port);
  EXPECT_TRUE(daemon.WaitForRegistrations(2, absl::Seconds(60)));
  EXPECT_GE(daemon.registrations(), 2);

  daemon.Shutdown();
  run.join();
}

TEST(WorkerDaemonTest, TrainingOutlivesTheCoordinatorAndIsReportedWhenItIsBack) {
  auto coord = std::make_unique<Coordinator>("127.0.0.1:0");
  const int port = coord->port;
  const std::string address = "127.0.0.1:" + std::to_string(port);
  FakeRunner runner;
  WorkerDaemon daemon(TestDaemonOptions(port), &runner);
  std::thread run([&] { daemon.Run(); });
  ASSERT_TRUE(daemon.WaitUntilRegistered(absl::Seconds(30)));
  EXPECT_EQ(coord->Registered(0).running_size(), 0);

  apapo::v1::CoordinatorMessage assign;
  assign.mutable_assign()->set_job_id("job-1");
  assign.mutable_assign()->set_stage(1);
  assign.mutable_assign()->mutable_rendezvous()->set_rank(1);
  assign.mutable_assign()->mutable_rendezvous()->set_store_port(7000);
  assign.mutable_assign()->mutable_rendezvous()->set_prefix("job-1/r2");
  ASSERT_TRUE(coord->registry.Send("w-test", assign).ok());
  coord->inbox.WaitFor(WorkerMessage::kAck);
  apapo::v1::CoordinatorMessage start;
  start.mutable_start()->set_job_id("job-1");
  ASSERT_TRUE(coord->registry.Send("w-test", start).ok());
  EXPECT_EQ(coord->inbox.WaitFor(WorkerMessage::kMetrics).metrics().step(), 1);

  // The coordinator dies: the stage trains on.
  coord->server.Shutdown();
  coord.reset();
  coord = std::make_unique<Coordinator>(address);
  ASSERT_EQ(coord->port, port);
  // It registers again, listing the stage it still trains.
  apapo::v1::WorkerInfo again = coord->Registered(0);
  ASSERT_EQ(again.running_size(), 1);
  EXPECT_EQ(again.running(0).job_id(), "job-1");
  EXPECT_EQ(again.running(0).stage(), 1);
  EXPECT_EQ(again.running(0).rank(), 1);
  EXPECT_EQ(again.running(0).rendezvous_prefix(), "job-1/r2");
  EXPECT_EQ(again.running(0).step(), 1);
  {
    absl::MutexLock lock(&runner.mu_);
    EXPECT_FALSE(runner.stopped_) << "the stream's end stopped the stage";
  }

  // Gone again; the stage ends meanwhile: its outcome is kept and sent to
  // the next coordinator.
  coord->server.Shutdown();
  coord.reset();
  runner.Stop("job-1");
  coord = std::make_unique<Coordinator>(address);
  WorkerMessage outcome = coord->inbox.WaitFor(WorkerMessage::kOutcome);
  EXPECT_EQ(outcome.outcome().job_id(), "job-1");
  EXPECT_EQ(outcome.outcome().message(), "stage 1 stopped");

  daemon.Shutdown();
  run.join();
}

TEST(WorkerDaemonTest, ProfileThatHostsTheLinkTestAcksThePortFirst) {
  Coordinator coord("127.0.0.1:0");
  FakeRunner runner;
  DaemonOptions options;
  options.coordinator = "127.0.0.1:" + std::to_string(coord.port);
  options.info.set_worker_id("w-host");
  WorkerDaemon daemon(options, &runner);
  std::thread run([&] { daemon.Run(); });
  ASSERT_TRUE(daemon.WaitUntilRegistered(absl::Seconds(30)));

  apapo::v1::CoordinatorMessage profile;
  profile.mutable_profile()->set_job_id("job-1");
  auto* rv = profile.mutable_profile()->mutable_rendezvous();
  rv->set_world_size(2);
  rv->set_rank(0);
  auto id = coord.registry.Send("w-host", profile);
  ASSERT_TRUE(id.ok());
  WorkerMessage early = coord.inbox.WaitFor(WorkerMessage::kAck, 0);
  EXPECT_EQ(early.ack().command_id(), *id);
  EXPECT_EQ(early.ack().code(), 0);
  EXPECT_EQ(early.ack().store_port(), 4242);
  coord.inbox.WaitFor(WorkerMessage::kProfileResult);
  // The runner measured through the store it hosts.
  EXPECT_EQ(runner.profiled().rendezvous().store_port(), 4242);
  WorkerMessage done = coord.inbox.WaitFor(WorkerMessage::kAck, 1);
  EXPECT_EQ(done.ack().command_id(), *id);
  EXPECT_EQ(done.ack().code(), 0);

  daemon.Shutdown();
  run.join();
  coord.server.Shutdown();
}

// A coordinator that gives a heartbeat offset and records the heartbeats'
// send times (the real WorkerService does not pass heartbeats on).
class OffsetGivingService final : public apapo::v1::WorkerService::Service {
 public:
  OffsetGivingService(absl::Duration interval, absl::Duration offset)
      : interval_(interval), offset_(offset) {}

  grpc::Status Connect(grpc::ServerContext*,
                       grpc::ServerReaderWriter<apapo::v1::CoordinatorMessage,
                                                WorkerMessage>* stream) override {
    WorkerMessage m;
    if (!stream->Read(&m) || !m.has_register_()) return grpc::Status::OK;
    apapo::v1::CoordinatorMessage reply;
    reply.mutable_registered()->set_worker_id(m.register_().worker_id());
    reply.mutable_registered()->mutable_heartbeat_interval()->set_nanos(
        static_cast<int>(absl::ToInt64Nanoseconds(interval_)));
    reply.mutable_registered()->mutable_heartbeat_offset()->set_nanos(
        static_cast<int>(absl::ToInt64Nanoseconds(offset_)));
    if (!stream->Write(reply)) return grpc::Status::OK;
    while (stream->Read(&m)) {
      if (!m.has_heartbeat()) continue;
      absl::MutexLock lock(&mu_);
      sent_.push_back(absl::FromUnixSeconds(m.heartbeat().time().seconds()) +
                      absl::Nanoseconds(m.heartbeat().time().nanos()));
    }
    return grpc::Status::OK;
  }

  // The send times of the first `n` heartbeats, once there are that many.
  std::vector<absl::Time> WaitForHeartbeats(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sent_.size() >= n; };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30)));
    return std::vector<absl::Time>(sent_.begin(),
                                   sent_.begin() + std::min(n, sent_.size()));
  }

 private:
  const absl::Duration interval_, offset_;
  absl::Mutex mu_;
  std::vector<absl::Time> sent_ ABSL_GUARDED_BY(mu_);
};

TEST(WorkerDaemonTest, HeartbeatsAtTheOffsetTheCoordinatorGives) {
  // 400 ms beats at 250 ms into each: a daemon that ignored the offset
  // would send each heartbeat anywhere in the interval, so the odds that
  // four land in the 150 ms after the offset by chance are (3/8)^4 = 2%.
  const absl::Duration interval = absl::Milliseconds(400);
  const absl::Duration offset = absl::Milliseconds(250);
  OffsetGivingService service(interval, offset);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  FakeRunner runner;
  WorkerDaemon daemon(TestDaemonOptions(port), &runner);
  std::thread run([&] { daemon.Run(); });
  const std::vector<absl::Time> sent = service.WaitForHeartbeats(4);
  for (absl::Time t : sent) {
    const absl::Duration into = ((t - absl::UnixEpoch()) - offset) % interval;
    EXPECT_GE(into, absl::ZeroDuration()) << t;
    EXPECT_LT(into, absl::Milliseconds(150)) << t;
  }
  for (size_t i = 1; i < sent.size(); ++i) {
    EXPECT_GT(sent[i] - sent[i - 1], interval / 2);
  }
  daemon.Shutdown();
  run.join();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
}

TEST(JitteredBackoffTest, SpreadsAroundTheBackoff) {
  absl::BitGen gen;
  absl::Duration lo = absl::InfiniteDuration(), hi = absl::ZeroDuration();
  for (int i = 0; i < 1000; ++i) {
    absl::Duration d = JitteredBackoff(absl::Seconds(1), gen);
    ASSERT_GE(d, absl::Milliseconds(500));
    ASSERT_LT(d, absl::Milliseconds(1500));
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  // A fleet of 1,000 reconnects over (nearly) the whole second, not at once.
  EXPECT_LT(lo, absl::Milliseconds(550));
  EXPECT_GT(hi, absl::Milliseconds(1450));
}

}  // namespace
}  // namespace apapo::worker
