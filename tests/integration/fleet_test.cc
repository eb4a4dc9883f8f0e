// The coordinator in-process against a simulated fleet of 200 workers on
// real gRPC streams (bench/fleet): registration, heartbeats over several
// intervals without a worker wrongly marked lost, paged ListWorkers, and a
// job on 16 of them driven through profile -> assign -> start to success
// with every command acknowledged.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "bench/fleet/canned.h"
#include "bench/fleet/fleet_sim.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "proto/apapo/v1/service.grpc.pb.h"

namespace apapo {
namespace {

using apapo::v1::CoordinatorMessage;

constexpr int kWorkers = 200;
constexpr int kJobWorkers = 16;
constexpr absl::Duration kHeartbeat = absl::Milliseconds(300);
// Generous: a 2-core machine may be busy with builds besides this test.
constexpr absl::Duration kWait = absl::Seconds(60);

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  return ctx;
}

class FleetTest : public ::testing::Test {
 protected:
  static coordinator::CoordinatorOptions Options() {
    coordinator::CoordinatorOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.metrics_port = -1;
    options.state_path = ":memory:";
    options.heartbeat_interval = kHeartbeat;
    // 200 workers in 4 of the 10 heartbeat slots.
    options.heartbeat_slot_size = 50;
    options.scheduler.tick = absl::Milliseconds(50);
    return options;
  }

  void SetUp() override {
    absl::Status started = coordinator_.Start();
    ASSERT_TRUE(started.ok()) << started;
    const std::string target =
        "127.0.0.1:" + std::to_string(coordinator_.port());
    channel_ = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
    jobs_ = apapo::v1::JobService::NewStub(channel_);
    workers_ = apapo::v1::WorkerService::NewStub(channel_);

    bench::FleetOptions options;
    options.target = target;
    options.workers = kWorkers;
    options.workers_per_channel = 50;
    options.id_prefix = "fleet";
    options.train_duration = absl::Milliseconds(300);
    fleet_ = std::make_unique<bench::FleetSimulator>(options);
    absl::Status s = fleet_->Start();
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(fleet_->WaitAllRegistered(absl::Now() + kWait))
        << fleet_->Stats().registered << " of " << kWorkers << " registered";
  }

  void TearDown() override {
    if (fleet_ != nullptr) {
      absl::Status stopped = fleet_->Stop(absl::Now() + kWait);
      EXPECT_TRUE(stopped.ok()) << stopped;
      bench::FleetStats stats = fleet_->Stats();
      EXPECT_EQ(stats.streams_ended, kWorkers);
      EXPECT_EQ(stats.streams_ended_early, 0);
      EXPECT_EQ(stats.errors, 0);
      for (const bench::WorkerRecord& w : fleet_->Workers()) {
        EXPECT_EQ(w.end_code, absl::StatusCode::kOk)
            << w.worker_id << ": " << w.end_message;
      }
    }
    coordinator_.Shutdown();
  }

  // Workers in `states` (all when empty), every page of at most
  // `page_size`; fails the test on an RPC error or a page too large.
  // Returns the workers and the total the first page reported.
  std::pair<std::vector<apapo::v1::WorkerStatus>, int> ListAll(
      int page_size, std::vector<apapo::v1::WorkerState> states) {
    std::vector<apapo::v1::WorkerStatus> all;
    int total = -1;
    apapo::v1::ListWorkersRequest request;
    request.set_page_size(page_size);
    for (auto s : states) request.add_states(s);
    // More pages than workers would mean the token does not advance.
    for (int page = 0; page <= kWorkers; ++page) {
      apapo::v1::ListWorkersResponse response;
      grpc::Status s = workers_->ListWorkers(Context().get(), request, &response);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      EXPECT_LE(response.workers_size(), page_size) << "page " << page;
      if (total < 0) total = response.total();
      for (auto& w : *response.mutable_workers()) all.push_back(std::move(w));
      if (response.next_page_token().empty()) break;
      request.set_page_token(response.next_page_token());
    }
    return {std::move(all), total};
  }

  // Every worker in LOST state, whether or not the server filtered.
  int CountLost() {
    auto [lost, total] = ListAll(500, {apapo::v1::WORKER_STATE_LOST});
    int n = 0;
    for (const auto& w : lost) {
      if (w.state() == apapo::v1::WORKER_STATE_LOST) {
        ++n;
        ADD_FAILURE() << w.info().worker_id() << " marked lost";
      }
    }
    EXPECT_EQ(total, 0);
    EXPECT_EQ(lost.size(), 0u) << "the LOST filter returned other states";
    return n;
  }

  coordinator::Coordinator coordinator_{Options()};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<apapo::v1::JobService::Stub> jobs_;
  std::unique_ptr<apapo::v1::WorkerService::Stub> workers_;
  std::unique_ptr<bench::FleetSimulator> fleet_;
};

TEST_F(FleetTest, HeartbeatingWorkersStayAliveAndArePagedThrough) {
  // Eight intervals of heartbeats from every worker: well past the three
  // intervals of silence after which the coordinator marks one lost.
  ASSERT_TRUE(fleet_->WaitForHeartbeats(8, absl::Now() + kWait));
  EXPECT_EQ(CountLost(), 0);

  auto [all, total] = ListAll(50, {});
  EXPECT_EQ(total, kWorkers);
  std::set<std::string> ids;
  for (const auto& w : all) {
    ids.insert(w.info().worker_id());
    EXPECT_EQ(w.state(), apapo::v1::WORKER_STATE_IDLE) << w.info().worker_id();
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kWorkers));
  EXPECT_EQ(all.size(), static_cast<size_t>(kWorkers)) << "a worker listed twice";

  bench::FleetStats stats = fleet_->Stats();
  EXPECT_EQ(stats.registered, kWorkers);
  EXPECT_GE(stats.heartbeats_sent(), 8 * kWorkers);
  EXPECT_EQ(stats.received[CoordinatorMessage::kRegistered], kWorkers);
  std::map<absl::Duration, int> per_offset;
  for (const bench::WorkerRecord& w : fleet_->Workers()) {
    EXPECT_EQ(w.heartbeat_interval, kHeartbeat) << w.worker_id;
    ASSERT_TRUE(w.heartbeat_offset.has_value()) << w.worker_id;
    ++per_offset[*w.heartbeat_offset];
  }
  // The first 4 of 10 slots, 50 workers each (registration order decides
  // which worker gets which).
  EXPECT_THAT(per_offset,
              ::testing::ElementsAre(::testing::Pair(absl::ZeroDuration(), 50),
                                     ::testing::Pair(kHeartbeat / 10, 50),
                                     ::testing::Pair(kHeartbeat * 2 / 10, 50),
                                     ::testing::Pair(kHeartbeat * 3 / 10, 50)));
}

TEST_F(FleetTest, AJobOnSixteenWorkersSucceedsWithEveryCommandOnceAndAcked) {
  ASSERT_TRUE(fleet_->WaitForHeartbeats(2, absl::Now() + kWait));
  apapo::v1::SubmitJobRequest submit;
  *submit.mutable_spec() = bench::DataParallelJobSpec("fleet-test", kJobWorkers);
  apapo::v1::SubmitJobResponse submitted;
  grpc::Status s = jobs_->SubmitJob(Context().get(), submit, &submitted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string job_id = submitted.job().id();

  // Follow the job to its end.
  apapo::v1::WatchJobRequest watch;
  watch.set_job_id(job_id);
  auto ctx = Context();
  auto reader = jobs_->WatchJob(ctx.get(), watch);
  apapo::v1::WatchJobResponse update;
  apapo::v1::Job job;
  while (reader->Read(&update)) {
    job = update.job();
    if (job.state() == apapo::v1::JOB_STATE_SUCCEEDED ||
        job.state() == apapo::v1::JOB_STATE_FAILED ||
        job.state() == apapo::v1::JOB_STATE_CANCELLED) {
      break;
    }
  }
  ctx->TryCancel();
  reader->Finish();
  ASSERT_EQ(job.state(), apapo::v1::JOB_STATE_SUCCEEDED)
      << apapo::v1::JobState_Name(job.state()) << ": " << job.error();
  ASSERT_EQ(job.worker_ids_size(), kJobWorkers);
  const std::set<std::string> job_workers(job.worker_ids().begin(),
                                          job.worker_ids().end());

  ASSERT_TRUE(fleet_->AwaitAllAcked(absl::Now() + kWait));
  int with_commands = 0;
  for (const bench::WorkerRecord& w : fleet_->Workers()) {
    std::map<CoordinatorMessage::KindCase, int> kinds;
    for (const auto& [id, c] : w.commands) {
      EXPECT_EQ(c.job_id, job_id) << w.worker_id << " command " << id;
      EXPECT_GE(c.acks_sent, 1) << w.worker_id << " command " << id;
      ++kinds[c.kind];
    }
    if (!job_workers.count(w.worker_id)) {
      EXPECT_TRUE(w.commands.empty()) << w.worker_id << " is not in the job";
      continue;
    }
    ++with_commands;
    EXPECT_EQ(kinds[CoordinatorMessage::kProfile], 1) << w.worker_id;
    EXPECT_EQ(kinds[CoordinatorMessage::kAssign], 1) << w.worker_id;
    EXPECT_EQ(kinds[CoordinatorMessage::kStart], 1) << w.worker_id;
    EXPECT_EQ(kinds[CoordinatorMessage::kStop], 0) << w.worker_id;
  }
  EXPECT_EQ(with_commands, kJobWorkers);
  // A message counts as sent once its write completes, which may be after
  // the coordinator acted on it: wait for the last outcomes' completions.
  EXPECT_TRUE(fleet_->AwaitJobMilestone(job_id, bench::JobMilestone::kOutcomeSent,
                                        kJobWorkers, absl::Now() + kWait));
  bench::JobRecord record = fleet_->Job(job_id);
  EXPECT_EQ(record.at(bench::JobMilestone::kProfileResultSent).count, kJobWorkers);
  EXPECT_EQ(record.at(bench::JobMilestone::kOutcomeSent).count, kJobWorkers);

  // The job's streams were busy; none of the fleet went quiet meanwhile.
  EXPECT_EQ(CountLost(), 0);
}

}  // namespace
}  // namespace apapo
