// The whole coordinator started in-process on free ports, driven by real
// gRPC clients.
#include "coordinator/coordinator.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/apapo/v1/service.grpc.pb.h"

namespace apapo::coordinator {
namespace {

using ::testing::HasSubstr;

// How long a test waits for something that should happen at once.
constexpr absl::Duration kWait = absl::Seconds(30);

CoordinatorOptions LocalOptions() {
  CoordinatorOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.state_path = ":memory:";
  options.scheduler.tick = absl::Milliseconds(20);
  return options;
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoSeconds(kWait));
  return ctx;
}

apapo::v1::SubmitJobRequest OneWorkerJob() {
  apapo::v1::SubmitJobRequest req;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(name: "inproc"
           model { builtin { name: "mlp" } }
           data { fashion_mnist {} batch_size: 32 }
           optimizer { sgd {} learning_rate: 0.1 }
           resources { workers: 1 }
           limits { max_steps: 10 })pb",
      req.mutable_spec()));
  return req;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status started = coordinator_.Start();
    ASSERT_TRUE(started.ok()) << started;
    ASSERT_GT(coordinator_.port(), 0);
    channel_ = grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(coordinator_.port()),
        grpc::InsecureChannelCredentials());
    jobs_ = apapo::v1::JobService::NewStub(channel_);
    workers_ = apapo::v1::WorkerService::NewStub(channel_);
  }

  Coordinator coordinator_{LocalOptions()};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<apapo::v1::JobService::Stub> jobs_;
  std::unique_ptr<apapo::v1::WorkerService::Stub> workers_;
};

TEST_F(CoordinatorTest, ServesJobsAndDrivesThemOntoAConnectedWorker) {
  EXPECT_GT(coordinator_.metrics_port(), 0);
  apapo::v1::SubmitJobResponse submitted;
  grpc::Status s = jobs_->SubmitJob(Context().get(), OneWorkerJob(), &submitted);
  ASSERT_TRUE(s.ok()) << s.error_message();

  apapo::v1::ListJobsResponse list;
  s = jobs_->ListJobs(Context().get(), {}, &list);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).id(), submitted.job().id());
  EXPECT_EQ(list.jobs(0).state(), apapo::v1::JOB_STATE_QUEUED);

  // A worker that connects is registered, and the scheduler's thread sends
  // it the queued job's profiling command down the same stream.
  auto ctx = Context();
  auto stream = workers_->Connect(ctx.get());
  apapo::v1::WorkerMessage hello;
  hello.mutable_register_()->set_worker_id("w-1");
  hello.mutable_register_()->set_host("127.0.0.1");
  ASSERT_TRUE(stream->Write(hello));
  apapo::v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_registered());
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_profile());
  EXPECT_EQ(reply.profile().job_id(), submitted.job().id());

  apapo::v1::GetJobRequest get;
  get.set_job_id(submitted.job().id());
  apapo::v1::Job job;
  s = jobs_->GetJob(Context().get(), get, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.state(), apapo::v1::JOB_STATE_PROFILING);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(CoordinatorTest, SecondCoordinatorOnAnOccupiedPortFailsNamingIt) {
  CoordinatorOptions options = LocalOptions();
  options.port = coordinator_.port();
  options.metrics_port = -1;
  Coordinator second(options);
  absl::Status s = second.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(),
              HasSubstr("127.0.0.1:" + std::to_string(coordinator_.port())));
  // The first one is unaffected.
  apapo::v1::ListJobsResponse list;
  EXPECT_TRUE(jobs_->ListJobs(Context().get(), {}, &list).ok());
}

TEST_F(CoordinatorTest, OccupiedMetricsPortFailsNamingIt) {
  CoordinatorOptions options = LocalOptions();
  options.metrics_port = coordinator_.metrics_port();
  Coordinator second(options);
  absl::Status s = second.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(),
              HasSubstr("cannot serve metrics on port " +
                        std::to_string(coordinator_.metrics_port())));
}

TEST(CoordinatorStartTest, UnopenableStateFileFailsNamingIt) {
  CoordinatorOptions options = LocalOptions();
  options.state_path = "/nonexistent/dir/x.db";
  Coordinator coordinator(options);
  absl::Status s = coordinator.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("cannot open state database /nonexistent/dir/x.db"));
}

TEST(CoordinatorStartTest, BadOptionsAreInvalidArgument) {
  CoordinatorOptions options = LocalOptions();
  options.heartbeat_interval = absl::ZeroDuration();
  Coordinator coordinator(options);
  absl::Status s = coordinator.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("heartbeat interval"));
  for (int slots : {-1, 1001}) {
    options = LocalOptions();
    options.heartbeat_slots = slots;
    Coordinator bad_slots(options);
    s = bad_slots.Start();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << slots;
    EXPECT_THAT(s.message(), HasSubstr("--heartbeat_slots must be in 0..1000, got " +
                                       std::to_string(slots)));
  }
  options = LocalOptions();
  options.heartbeat_slot_size = 0;
  Coordinator bad_size(options);
  s = bad_size.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--heartbeat_slot_size must be >= 1, got 0"));
}

TEST_F(CoordinatorTest, ShutdownEndsOpenStreamsPromptly) {
  // A worker's stream and a job watch stay open across the shutdown.
  auto worker_ctx = Context();
  auto worker = workers_->Connect(worker_ctx.get());
  apapo::v1::WorkerMessage hello;
  hello.mutable_register_()->set_worker_id("w-1");
  ASSERT_TRUE(worker->Write(hello));
  apapo::v1::CoordinatorMessage reply;
  ASSERT_TRUE(worker->Read(&reply));
  apapo::v1::SubmitJobResponse submitted;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), OneWorkerJob(), &submitted).ok());
  apapo::v1::WatchJobRequest watch;
  watch.set_job_id(submitted.job().id());
  auto watch_ctx = Context();
  auto watcher = jobs_->WatchJob(watch_ctx.get(), watch);
  apapo::v1::WatchJobResponse update;
  ASSERT_TRUE(watcher->Read(&update));

  absl::Notification done;
  std::thread shutdown([&] {
    coordinator_.Shutdown();
    done.Notify();
  });
  // The streams' grace period is 2 s; far less than kWait.
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(kWait));
  shutdown.join();
  coordinator_.Shutdown();  // a second call returns at once

  while (worker->Read(&reply)) {
  }
  worker->Finish();
  while (watcher->Read(&update)) {
  }
  watcher->Finish();
  apapo::v1::ListJobsResponse list;
  EXPECT_FALSE(jobs_->ListJobs(Context().get(), {}, &list).ok());
}

}  // namespace
}  // namespace apapo::coordinator
