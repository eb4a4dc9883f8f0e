// WorkerService over a real gRPC server: the Connect protocol.
#include "coordinator/worker_service.h"

#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "coordinator/fake_clock.h"
#include "coordinator/server.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace apapo::coordinator {
namespace {

class RecordingListener : public WorkerMessageListener {
 public:
  void OnWorkerMessage(const std::string& worker_id,
                       const apapo::v1::WorkerMessage& message) override {
    absl::MutexLock lock(&mu_);
    seen_.push_back(worker_id + ":" + std::to_string(message.kind_case()));
  }
  bool WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return seen_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
  }
  absl::Mutex mu_;
  std::vector<std::string> seen_ ABSL_GUARDED_BY(mu_);
};

class WorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.SetLostHook([this](const std::string& id, const std::string&,
                                 const std::string&) {
      if (id == "w-1") lost_.Notify();
    });
    auto port = server_.Start("127.0.0.1:0");
    ASSERT_TRUE(port.ok());
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(*port),
                                   grpc::InsecureChannelCredentials());
    stub_ = apapo::v1::WorkerService::NewStub(channel_);
  }
  void TearDown() override { server_.Shutdown(); }

  apapo::v1::WorkerMessage Register(const std::string& id) {
    apapo::v1::WorkerMessage m;
    m.mutable_register_()->set_worker_id(id);
    m.mutable_register_()->set_host("127.0.0.1");
    return m;
  }

  absl::Notification lost_;
  RealClock clock_;
  WorkerRegistry registry_{&clock_, absl::Seconds(5)};
  RecordingListener listener_;
  WorkerServiceImpl service_{&registry_, &listener_};
  CoordinatorServer server_{{&service_}};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<apapo::v1::WorkerService::Stub> stub_;
};

TEST_F(WorkerServiceTest, RegisterReceiveCommandsReportAndDisconnect) {
  grpc::ClientContext ctx;
  auto stream = stub_->Connect(&ctx);
  ASSERT_TRUE(stream->Write(Register("w-1")));
  apapo::v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_registered());
  EXPECT_EQ(reply.registered().worker_id(), "w-1");
  EXPECT_EQ(reply.registered().heartbeat_interval().seconds(), 5);

  apapo::v1::ListWorkersResponse list;
  grpc::ClientContext list_ctx;
  ASSERT_TRUE(stub_->ListWorkers(&list_ctx, {}, &list).ok());
  ASSERT_EQ(list.workers_size(), 1);
  EXPECT_EQ(list.workers(0).state(), apapo::v1::WORKER_STATE_IDLE);

  apapo::v1::CoordinatorMessage stop;
  stop.mutable_stop()->set_job_id("job-1");
  auto id = registry_.Send("w-1", stop);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.command_id(), *id);
  EXPECT_EQ(reply.stop().job_id(), "job-1");

  apapo::v1::WorkerMessage ack;
  ack.mutable_ack()->set_command_id(*id);
  ASSERT_TRUE(stream->Write(ack));
  EXPECT_TRUE(listener_.WaitFor(1));

  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_TRUE(lost_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(registry_.List()[0].state(), apapo::v1::WORKER_STATE_LOST);
}

TEST_F(WorkerServiceTest, FirstMessageMustBeRegister) {
  grpc::ClientContext ctx;
  auto stream = stub_->Connect(&ctx);
  apapo::v1::WorkerMessage hb;
  hb.mutable_heartbeat();
  ASSERT_TRUE(stream->Write(hb));
  stream->WritesDone();
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("must be register"));
}

TEST_F(WorkerServiceTest, DuplicateLiveIdIsAlreadyExists) {
  grpc::ClientContext ctx1, ctx2;
  auto first = stub_->Connect(&ctx1);
  ASSERT_TRUE(first->Write(Register("dup")));
  apapo::v1::CoordinatorMessage reply;
  ASSERT_TRUE(first->Read(&reply));
  auto second = stub_->Connect(&ctx2);
  ASSERT_TRUE(second->Write(Register("dup")));
  second->WritesDone();
  EXPECT_EQ(second->Finish().error_code(), grpc::StatusCode::ALREADY_EXISTS);
  first->WritesDone();
  EXPECT_TRUE(first->Finish().ok());
}

TEST_F(WorkerServiceTest, CommandsQueuedBeforeRegisteredArriveAfterIt) {
  // The scheduler may queue a command the moment a worker registers: the
  // Registered reply still comes first, then the commands in order.
  registry_.SetLostHook(nullptr);
  service_.SetRegisterHook([this](const apapo::v1::WorkerInfo& info) {
    const std::string& id = info.worker_id();
    apapo::v1::CoordinatorMessage stop;
    stop.mutable_stop()->set_job_id("early");
    ASSERT_TRUE(registry_.Send(id, stop).ok());
    ASSERT_TRUE(registry_.Send(id, stop).ok());
  });
  grpc::ClientContext ctx;
  auto stream = stub_->Connect(&ctx);
  ASSERT_TRUE(stream->Write(Register("w-early")));
  apapo::v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_TRUE(reply.has_registered());
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.stop().job_id(), "early");
  const int64_t first = reply.command_id();
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_GT(reply.command_id(), first);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(WorkerServiceTest, ListWorkersPagesAndNamesABadField) {
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<
      apapo::v1::WorkerMessage, apapo::v1::CoordinatorMessage>>> streams;
  for (int i = 0; i < 5; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(stub_->Connect(contexts.back().get()));
    ASSERT_TRUE(streams.back()->Write(Register("w-" + std::to_string(i))));
    apapo::v1::CoordinatorMessage reply;
    ASSERT_TRUE(streams.back()->Read(&reply));
  }
  apapo::v1::ListWorkersRequest request;
  request.set_page_size(2);
  std::vector<std::string> seen;
  while (true) {
    grpc::ClientContext ctx;
    apapo::v1::ListWorkersResponse page;
    ASSERT_TRUE(stub_->ListWorkers(&ctx, request, &page).ok());
    EXPECT_EQ(page.total(), 5);
    EXPECT_LE(page.workers_size(), 2);
    for (const auto& w : page.workers()) seen.push_back(w.info().worker_id());
    if (page.next_page_token().empty()) break;
    request.set_page_token(page.next_page_token());
  }
  EXPECT_THAT(seen, ::testing::ElementsAre("w-0", "w-1", "w-2", "w-3", "w-4"));
  grpc::ClientContext bad_ctx;
  apapo::v1::ListWorkersRequest bad;
  bad.set_page_size(-3);
  apapo::v1::ListWorkersResponse unused;
  grpc::Status status = stub_->ListWorkers(&bad_ctx, bad, &unused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("page_size"));
  for (auto& stream : streams) {
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
}

// The registry marks a silent worker lost (the monitor's CheckTimeouts): its
// stream is closed with UNAVAILABLE saying why, so the daemon reconnects.
TEST(WorkerServiceTimeoutTest, SilentWorkerIsLostAndItsStreamClosed) {
  FakeClock clock;
  WorkerRegistry registry{&clock, absl::Seconds(1)};
  WorkerServiceImpl service{&registry, nullptr};
  CoordinatorServer server{{&service}};
  auto port = server.Start("127.0.0.1:0");
  ASSERT_TRUE(port.ok());
  auto stub = apapo::v1::WorkerService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(*port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Connect(&ctx);
  apapo::v1::WorkerMessage reg;
  reg.mutable_register_()->set_worker_id("quiet");
  ASSERT_TRUE(stream->Write(reg));
  apapo::v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_registered());
  clock.Advance(absl::Seconds(4));
  EXPECT_THAT(registry.CheckTimeouts(), ::testing::ElementsAre("quiet"));
  EXPECT_FALSE(stream->Read(&reply));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("no heartbeat for 4s"));
  EXPECT_EQ(registry.List()[0].state(), apapo::v1::WORKER_STATE_LOST);
  server.Shutdown();
}

// --- Heartbeats in slots: Registered says when in the interval to beat ---

// Registers `n` workers "s-<i>" one after the other and returns the
// heartbeat offset each was given (-1 s: none), closing each stream.
std::vector<absl::Duration> RegisterAndReadOffsets(int slots, int slot_size, int n) {
  RealClock clock;
  WorkerRegistry registry{&clock, absl::Seconds(5)};
  WorkerServiceImpl service{&registry, nullptr, /*pace_idle_reads=*/true, slots,
                            slot_size};
  CoordinatorServer server{{&service}};
  auto port = server.Start("127.0.0.1:0");
  EXPECT_TRUE(port.ok());
  auto stub = apapo::v1::WorkerService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port.value_or(0)),
      grpc::InsecureChannelCredentials()));
  std::vector<absl::Duration> offsets;
  for (int i = 0; i < n; ++i) {
    grpc::ClientContext ctx;
    auto stream = stub->Connect(&ctx);
    apapo::v1::WorkerMessage reg;
    reg.mutable_register_()->set_worker_id("s-" + std::to_string(i));
    EXPECT_TRUE(stream->Write(reg));
    apapo::v1::CoordinatorMessage reply;
    EXPECT_TRUE(stream->Read(&reply));
    EXPECT_TRUE(reply.has_registered());
    const auto& r = reply.registered();
    offsets.push_back(r.has_heartbeat_offset()
                          ? absl::Seconds(r.heartbeat_offset().seconds()) +
                                absl::Nanoseconds(r.heartbeat_offset().nanos())
                          : absl::Seconds(-1));
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  server.Shutdown();
  return offsets;
}

TEST(HeartbeatSlotsTest, WorkersFillASlotBeforeTheNextAndWrapAround) {
  // 4 slots of a 5 s interval (0, 1.25, 2.5, 3.75 s), 2 workers each.
  const absl::Duration s0 = absl::ZeroDuration(), s1 = absl::Milliseconds(1250),
                       s2 = absl::Milliseconds(2500), s3 = absl::Milliseconds(3750);
  EXPECT_THAT(RegisterAndReadOffsets(4, 2, 10),
              ::testing::ElementsAre(s0, s0, s1, s1, s2, s2, s3, s3, s0, s0));
}

TEST(HeartbeatSlotsTest, NoSlotsGivesNoOffset) {
  EXPECT_THAT(RegisterAndReadOffsets(0, 2, 2),
              ::testing::ElementsAre(absl::Seconds(-1), absl::Seconds(-1)));
}

// --- Paced reads: an idle worker's read after a heartbeat is parked ---

// A heartbeat stamped `sent` (the worker's clock), as daemons send them.
apapo::v1::WorkerMessage Heartbeat(const std::string& job_id = "",
                                   absl::Time sent = absl::Now()) {
  apapo::v1::WorkerMessage m;
  m.mutable_heartbeat()->set_job_id(job_id);
  const int64_t ns = absl::ToUnixNanos(sent);
  m.mutable_heartbeat()->mutable_time()->set_seconds(ns / 1000000000);
  m.mutable_heartbeat()->mutable_time()->set_nanos(static_cast<int>(ns % 1000000000));
  return m;
}

// A server whose registry has `interval`: with an hour, a parked read never
// resumes within a test, so whatever arrives got there without the pacer.
struct PacedServer {
  PacedServer(absl::Duration interval, Clock* clock, bool pace = true)
      : registry(clock, interval), service(&registry, &listener, pace) {
    registry.SetLostHook([this](const std::string& id, const std::string&,
                                const std::string&) {
      if (id == "w-1" && !lost.HasBeenNotified()) lost.Notify();
    });
    auto port = server.Start("127.0.0.1:0");
    EXPECT_TRUE(port.ok());
    stub = apapo::v1::WorkerService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port.value_or(0)),
        grpc::InsecureChannelCredentials()));
  }
  ~PacedServer() { server.Shutdown(); }

  // Opens w-1's stream and reads its Registered reply.
  std::unique_ptr<grpc::ClientReaderWriter<apapo::v1::WorkerMessage,
                                           apapo::v1::CoordinatorMessage>>
  Connect(grpc::ClientContext* ctx) {
    auto stream = stub->Connect(ctx);
    apapo::v1::WorkerMessage reg;
    reg.mutable_register_()->set_worker_id("w-1");
    EXPECT_TRUE(stream->Write(reg));
    apapo::v1::CoordinatorMessage reply;
    EXPECT_TRUE(stream->Read(&reply));
    EXPECT_TRUE(reply.has_registered());
    return stream;
  }

  // Waits until the service has parked `n` reads.
  bool WaitForPaced(int64_t n, absl::Duration limit = absl::Seconds(30)) {
    absl::Time deadline = absl::Now() + limit;
    while (service.paced_reads() < n) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(2));  // polls a counter, not a server
    }
    return true;
  }

  // Sends heartbeats until the read after one is parked. The first may
  // not park: the Registered reply's write can still be completing (a
  // read is never parked while a write is in flight).
  template <typename Stream>
  bool ParkARead(Stream& stream) {
    for (int i = 0; i < 20; ++i) {
      if (!stream->Write(Heartbeat())) return false;
      if (WaitForPaced(1, absl::Seconds(1))) return true;
    }
    return false;
  }

  WorkerRegistry registry;
  RecordingListener listener;
  WorkerServiceImpl service;
  CoordinatorServer server{{&service}};
  std::unique_ptr<apapo::v1::WorkerService::Stub> stub;
  absl::Notification lost;
};

apapo::v1::WorkerMessage Ack(int64_t id) {
  apapo::v1::WorkerMessage m;
  m.mutable_ack()->set_command_id(id);
  return m;
}

TEST(PacedReadsTest, ACommandUnparksTheReadSoItsAnswerIsReadAtOnce) {
  RealClock clock;
  PacedServer s(absl::Hours(1), &clock);
  grpc::ClientContext ctx;
  auto stream = s.Connect(&ctx);
  ASSERT_TRUE(s.ParkARead(stream));  // parked for an hour

  apapo::v1::CoordinatorMessage stop;
  stop.mutable_stop()->set_job_id("job-1");
  auto id = s.registry.Send("w-1", stop);
  ASSERT_TRUE(id.ok());
  apapo::v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.command_id(), *id);
  ASSERT_TRUE(stream->Write(Ack(*id)));
  EXPECT_TRUE(s.listener.WaitFor(1));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(PacedReadsTest, AWorkerThatGoesAwayWhileParkedIsLostAtOnce) {
  RealClock clock;
  PacedServer s(absl::Hours(1), &clock);
  {
    grpc::ClientContext ctx;
    auto stream = s.Connect(&ctx);
    ASSERT_TRUE(s.ParkARead(stream));
    ctx.TryCancel();  // the connection's stream is reset: OnCancel
  }
  EXPECT_TRUE(s.lost.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(s.registry.List()[0].state(), apapo::v1::WORKER_STATE_LOST);
}

TEST(PacedReadsTest, ASilentWorkerWhoseReadIsParkedIsStillLost) {
  FakeClock clock;
  PacedServer s(absl::Seconds(1), &clock);
  grpc::ClientContext ctx;
  auto stream = s.Connect(&ctx);
  ASSERT_TRUE(s.ParkARead(stream));
  clock.Advance(absl::Seconds(4));
  EXPECT_THAT(s.registry.CheckTimeouts(), ::testing::ElementsAre("w-1"));
  apapo::v1::CoordinatorMessage reply;
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(s.lost.HasBeenNotified());
}

TEST(PacedReadsTest, ABusyWorkersReadsAreNeverParked) {
  RealClock clock;
  PacedServer s(absl::Hours(1), &clock);
  grpc::ClientContext ctx;
  auto stream = s.Connect(&ctx);
  ASSERT_TRUE(s.registry.Reserve("job-1", 1, {}).ok());
  ASSERT_TRUE(stream->Write(Heartbeat("job-1")));
  ASSERT_TRUE(stream->Write(Ack(0)));  // read at once, or never
  EXPECT_TRUE(s.listener.WaitFor(1));
  EXPECT_EQ(s.service.paced_reads(), 0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(PacedReadsTest, ParkedReadsResumeAndEverySixteenthReadIsPostedAtOnce) {
  // 40 heartbeats stamped 100 ms apart (the interval) but sent back to
  // back, then an ack: the pacer reads one about every interval, as if
  // they had been sent on time, and every 16th heartbeat is followed by a
  // read posted at once, which finds the next one queued. All 41 messages
  // are read; at most 38 reads were parked (39 or 40 without the reads
  // posted at once; the first may find the Registered reply still being
  // written and not park).
  //
  // A heartbeat read while the service still finishes writing the
  // Registered reply is not parked (on a loaded host that write's
  // completion once came after all 40 had been read, and none was
  // parked): heartbeats go one at a time until one read is parked, then
  // the rest back to back.
  RealClock clock;
  PacedServer s(absl::Milliseconds(100), &clock);
  grpc::ClientContext ctx;
  auto stream = s.Connect(&ctx);
  const absl::Time start = absl::Now();
  int i = 0;
  while (i < 3) {
    ASSERT_TRUE(stream->Write(Heartbeat("", start + i++ * absl::Milliseconds(100))));
    if (s.WaitForPaced(1, absl::Milliseconds(500))) break;
  }
  for (; i < 40; ++i) {
    ASSERT_TRUE(stream->Write(Heartbeat("", start + i * absl::Milliseconds(100))));
  }
  ASSERT_TRUE(stream->Write(Ack(0)));
  EXPECT_TRUE(s.listener.WaitFor(1));
  EXPECT_GE(s.service.paced_reads(), 30);
  EXPECT_LE(s.service.paced_reads(), 38);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(PacedReadsTest, PacingOffReadsEveryMessageAtOnce) {
  RealClock clock;
  PacedServer s(absl::Hours(1), &clock, /*pace=*/false);
  grpc::ClientContext ctx;
  auto stream = s.Connect(&ctx);
  ASSERT_TRUE(stream->Write(Heartbeat()));
  ASSERT_TRUE(stream->Write(Ack(0)));  // read at once, or never
  EXPECT_TRUE(s.listener.WaitFor(1));
  EXPECT_EQ(s.service.paced_reads(), 0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace apapo::coordinator
