// WorkerService over a real gRPC server: the Connect protocol.
#include "coordinator/worker_service.h"

#include <memory>

#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
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
  WorkerServiceImpl service_{&registry_, &listener_, absl::Milliseconds(20)};
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

}  // namespace
}  // namespace apapo::coordinator
