// JobService over a real gRPC server on a free loopback port.
#include "coordinator/job_service.h"

#include <memory>
#include <string>
#include <thread>

#include "coordinator/server.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace apapo::coordinator {
namespace {

using ::testing::HasSubstr;

class JobServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> port = server_.Start("127.0.0.1:0");
    ASSERT_TRUE(port.ok()) << port.status();
    ASSERT_GT(*port, 0);
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(*port),
                                       grpc::InsecureChannelCredentials());
    stub_ = apapo::v1::JobService::NewStub(channel);
  }
  void TearDown() override { server_.Shutdown(); }

  static apapo::v1::SubmitJobRequest Request(const std::string& spec) {
    apapo::v1::SubmitJobRequest req;
    EXPECT_TRUE(
        google::protobuf::TextFormat::ParseFromString(spec, req.mutable_spec()));
    return req;
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ctx;
  }

  static constexpr char kSpec[] = R"pb(
    name: "svc"
    model { builtin { name: "cnn" } }
    data { fashion_mnist {} batch_size: 32 }
    optimizer { adam {} learning_rate: 0.001 }
    resources { workers: 1 }
    limits { max_steps: 10 }
  )pb";

  MemoryJobStore store_;
  RealClock clock_;
  JobManager jobs_{&store_, &clock_};
  JobServiceImpl service_{&jobs_, absl::Milliseconds(20)};
  CoordinatorServer server_{{&service_}};
  std::unique_ptr<apapo::v1::JobService::Stub> stub_;
};

TEST_F(JobServiceTest, InvalidSpecIsInvalidArgumentNamingTheField) {
  auto req = Request(std::string(kSpec) + "schedule { micro_batches: 0 }");
  apapo::v1::SubmitJobResponse resp;
  grpc::Status status = stub_->SubmitJob(Context().get(), req, &resp);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("spec.schedule.micro_batches: must be >= 1, got 0"));
}

TEST_F(JobServiceTest, SubmitGetListCancel) {
  apapo::v1::SubmitJobResponse submitted;
  ASSERT_TRUE(stub_->SubmitJob(Context().get(), Request(kSpec), &submitted).ok());
  EXPECT_EQ(submitted.job().state(), apapo::v1::JOB_STATE_QUEUED);

  apapo::v1::GetJobRequest get;
  get.set_job_id(submitted.job().id());
  apapo::v1::Job job;
  ASSERT_TRUE(stub_->GetJob(Context().get(), get, &job).ok());
  EXPECT_EQ(job.spec().name(), "svc");

  apapo::v1::ListJobsResponse list;
  ASSERT_TRUE(
      stub_->ListJobs(Context().get(), apapo::v1::ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);

  apapo::v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  ASSERT_TRUE(stub_->CancelJob(Context().get(), cancel, &job).ok());
  EXPECT_EQ(job.state(), apapo::v1::JOB_STATE_CANCELLED);
  grpc::Status again = stub_->CancelJob(Context().get(), cancel, &job);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  get.set_job_id("job-424242");
  EXPECT_EQ(stub_->GetJob(Context().get(), get, &job).error_code(),
            grpc::StatusCode::NOT_FOUND);
  apapo::v1::GetPlanRequest plan_req;
  plan_req.set_job_id(submitted.job().id());
  apapo::v1::GetPlanResponse plan;
  EXPECT_EQ(stub_->GetPlan(Context().get(), plan_req, &plan).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(JobServiceTest, WatchStreamsSnapshotThenEveryChangeUntilTheEnd) {
  apapo::v1::SubmitJobResponse submitted;
  ASSERT_TRUE(stub_->SubmitJob(Context().get(), Request(kSpec), &submitted).ok());
  const std::string id = submitted.job().id();

  apapo::v1::WatchJobRequest watch;
  watch.set_job_id(id);
  auto ctx = Context();
  auto reader = stub_->WatchJob(ctx.get(), watch);
  apapo::v1::WatchJobResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  EXPECT_FALSE(msg.has_event());  // the snapshot
  ASSERT_TRUE(reader->Read(&msg));
  EXPECT_EQ(msg.event().sequence(), 1);  // history: "submitted"

  // Drive the job while the stream is open; each change must arrive.
  std::thread driver([&] {
    ASSERT_TRUE(jobs_.Transition(id, apapo::v1::JOB_STATE_PROFILING, "profiling").ok());
    apapo::v1::JobProgress p;
    p.set_step(7);
    ASSERT_TRUE(jobs_.UpdateProgress(id, p).ok());
    ASSERT_TRUE(jobs_.Transition(id, apapo::v1::JOB_STATE_FAILED, "boom",
                                 absl::StatusCode::kInternal).ok());
  });
  std::vector<std::string> events;
  bool saw_progress = false;
  while (reader->Read(&msg)) {
    if (msg.has_event()) events.push_back(msg.event().message());
    if (msg.job().progress().step() == 7) saw_progress = true;
  }
  driver.join();
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(events, (std::vector<std::string>{"profiling", "boom"}));
  EXPECT_TRUE(saw_progress);
  EXPECT_EQ(msg.job().state(), apapo::v1::JOB_STATE_FAILED);

  // Resume from a cursor: only the events after it.
  watch.set_after_sequence(2);
  auto ctx2 = Context();
  auto resumed = stub_->WatchJob(ctx2.get(), watch);
  std::vector<int64_t> seqs;
  while (resumed->Read(&msg)) {
    if (msg.has_event()) seqs.push_back(msg.event().sequence());
  }
  EXPECT_TRUE(resumed->Finish().ok());
  EXPECT_EQ(seqs, std::vector<int64_t>{3});
}

TEST_F(JobServiceTest, WatchUnknownJobIsNotFound) {
  apapo::v1::WatchJobRequest watch;
  watch.set_job_id("job-000404");
  auto ctx = Context();
  auto reader = stub_->WatchJob(ctx.get(), watch);
  apapo::v1::WatchJobResponse msg;
  EXPECT_FALSE(reader->Read(&msg));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace apapo::coordinator

namespace apapo::coordinator {
namespace {

TEST_F(JobServiceTest, GetTraceServesStoredTracesAndRefuses) {
  apapo::v1::GetTraceRequest request;
  apapo::v1::GetTraceResponse response;
  grpc::Status status = stub_->GetTrace(Context().get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("job_id"));
  request.set_job_id("job-424242");
  status = stub_->GetTrace(Context().get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("job-424242"));

  apapo::v1::SubmitJobResponse submitted;
  ASSERT_TRUE(stub_->SubmitJob(Context().get(), Request(kSpec), &submitted).ok());
  const std::string id = submitted.job().id();
  request.set_job_id(id);
  request.set_simulated_steps(51);
  status = stub_->GetTrace(Context().get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("simulated_steps"));
  request.set_simulated_steps(0);

  // Before any trace and any plan: empty, with why there is no simulation.
  ASSERT_TRUE(stub_->GetTrace(Context().get(), request, &response).ok());
  EXPECT_EQ(response.stages_size(), 0);
  EXPECT_EQ(response.simulated_size(), 0);
  EXPECT_THAT(response.simulated_note(), HasSubstr("no plan yet"));

  // Stored traces come back by stage; a newer one of a stage replaces it.
  for (int stage : {1, 0, 1}) {
    apapo::v1::StageTrace t;
    t.set_stage(stage);
    t.add_spans()->set_kind(apapo::v1::SPAN_KIND_FORWARD);
    ASSERT_TRUE(jobs_.AddStageTrace(id, t).ok());
  }
  response.Clear();
  ASSERT_TRUE(stub_->GetTrace(Context().get(), request, &response).ok());
  ASSERT_EQ(response.stages_size(), 2);
  EXPECT_EQ(response.stages(0).stage(), 0);
  EXPECT_EQ(response.stages(1).stage(), 1);
  EXPECT_FALSE(jobs_.AddStageTrace("job-424242", {}).ok());
}

}  // namespace
}  // namespace apapo::coordinator
