// TorchJobRunner with real stage processes: this test binary re-executes
// itself in the worker's hidden child mode (--run_assignment=PATH), exactly
// as apapo-worker does.

#include "worker/daemon/torch_job_runner.h"

#include <sys/stat.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/daemon/stage_process.h"
#include "worker/daemon/test_jobs.h"

namespace apapo::worker {
namespace {

using ::testing::HasSubstr;
using test_jobs::Assignment;
using test_jobs::TinyMlpSpec;

constexpr char kSelf[] = "/proc/self/exe";

TEST(TorchJobRunnerTest, TwoRanksTrainInChildProcesses) {
  TorchJobRunner host(kSelf), peer(kSelf);
  auto port = host.HostRendezvous("job-1");
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  auto again = host.HostRendezvous("job-1");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *port);

  const apapo::v1::JobSpec spec = TinyMlpSpec(2);
  const apapo::v1::Plan plan = test_jobs::TwoStagePlan();
  absl::Status status[2];
  apapo::v1::MetricsReport final_metrics[2];
  std::vector<apapo::v1::MetricsReport> reports[2];
  std::vector<std::thread> threads;
  TorchJobRunner* runners[2] = {&host, &peer};
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      status[rank] = runners[rank]->Train(
          Assignment("job-1", spec, plan, rank, *port),
          [&, rank](const apapo::v1::MetricsReport& m) {
            reports[rank].push_back(m);
          },
          &final_metrics[rank]);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  EXPECT_EQ(final_metrics[0].step(), 32);
  EXPECT_EQ(final_metrics[1].step(), 32);
  EXPECT_EQ(final_metrics[1].stage().stage(), 1);
  EXPECT_TRUE(final_metrics[1].has_test_accuracy());
  ASSERT_FALSE(reports[1].empty());
  EXPECT_EQ(reports[1].back().step(), 32);
  EXPECT_EQ(reports[1].front().job_id(), "job-1");
}

TEST(TorchJobRunnerTest, StopMakesTrainReturnCancelledPromptly) {
  TorchJobRunner runner(kSelf);
  // Thousands of epochs: runs until stopped.
  apapo::v1::AssignStage a = Assignment(
      "job-long", TinyMlpSpec(100000), test_jobs::OneStagePlan(), 0, 0);
  absl::Notification training;
  absl::Status status;
  absl::Time returned;
  std::thread train([&] {
    apapo::v1::MetricsReport final_metrics;
    status = runner.Train(
        a,
        [&](const apapo::v1::MetricsReport& m) {
          if (m.step() > 0 && !training.HasBeenNotified()) training.Notify();
        },
        &final_metrics);
    returned = absl::Now();
  });
  const bool started =
      training.WaitForNotificationWithTimeout(absl::Seconds(45));
  const absl::Time stop = absl::Now();
  runner.Stop("job-long");
  train.join();
  ASSERT_TRUE(started) << status;
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_THAT(status.message(), HasSubstr("stage 0 stopped"));
  EXPECT_LT(returned - stop, absl::Seconds(5));
}

TEST(TorchJobRunnerTest, StopJustBeforeTrainCancelsIt) {
  TorchJobRunner runner(kSelf);
  runner.Stop("job-early");
  absl::Status s = runner.Train(
      Assignment("job-early", TinyMlpSpec(1), test_jobs::OneStagePlan(), 0, 0),
      nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
}

TEST(TorchJobRunnerTest, BadNodeIdInThePlanFailsNamingTheStage) {
  TorchJobRunner runner(kSelf);
  apapo::v1::Plan plan = test_jobs::OneStagePlan();
  plan.mutable_stages(0)->set_node_ids(2, "relu7");
  apapo::v1::MetricsReport final_metrics;
  absl::Status s = runner.Train(
      Assignment("job-bad", TinyMlpSpec(1), plan, 0, 0), nullptr,
      &final_metrics);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("stage 0 replica 0 (rank 0)"));
  EXPECT_THAT(s.message(), HasSubstr("'relu7'"));
}

TEST(TorchJobRunnerTest, ChildThatDiesWithoutAStatusIsNamed) {
  TorchJobRunner runner("/bin/false");
  absl::Status s = runner.Train(
      Assignment("job-x", TinyMlpSpec(1), test_jobs::TwoStagePlan(), 1, 1),
      nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_THAT(s.message(), HasSubstr("stage 1 replica 0 (rank 1)"));
  EXPECT_THAT(s.message(), HasSubstr("exited with code 1"));

  TorchJobRunner missing("/nonexistent/apapo-worker");
  s = missing.Train(
      Assignment("job-y", TinyMlpSpec(1), test_jobs::OneStagePlan(), 0, 0),
      nullptr, nullptr);
  EXPECT_THAT(s.message(), HasSubstr("cannot run the stage process"));
}

apapo::v1::ProfileCommand ModelProfile(const std::string& job) {
  apapo::v1::ProfileCommand c;
  c.set_job_id(job);
  c.set_iterations(1);
  *c.mutable_spec() = TinyMlpSpec(1);
  return c;
}

// An executable shell script standing in for the worker binary.
std::string WriteScript(const std::string& name, const std::string& body) {
  const std::string path = ::testing::TempDir() + "/" + name;
  {
    std::ofstream f(path);
    f << "#!/bin/sh\n" << body << "\n";
  }
  EXPECT_EQ(::chmod(path.c_str(), 0755), 0);
  return path;
}

// Profiles `c` on a thread and stops the job until the profile returns (a
// Stop before the profile starts finds nothing to stop); fails the test if
// that takes a minute.
absl::StatusOr<apapo::v1::ProfileResult> ProfileUntilStopped(
    TorchJobRunner& runner, const apapo::v1::ProfileCommand& c) {
  absl::StatusOr<apapo::v1::ProfileResult> result;
  absl::Notification returned;
  std::thread profile([&] {
    result = runner.Profile(c);
    returned.Notify();
  });
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (!returned.WaitForNotificationWithTimeout(absl::Milliseconds(20)) &&
         absl::Now() < deadline) {
    runner.Stop(c.job_id());
  }
  profile.join();
  EXPECT_LT(absl::Now(), deadline);
  return result;
}

TEST(TorchJobRunnerTest, ProfileTimesTheModelInAChildProcess) {
  TorchJobRunnerOptions options{kSelf};
  options.memory_bytes = 123 << 20;  // what the daemon was told it has
  TorchJobRunner runner(options);
  auto result = runner.Profile(ModelProfile("job-p"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->profile().nodes_size(), 7);
  // The child reports the daemon's memory, not its own reading.
  EXPECT_EQ(result->resources().memory_bytes(), 123 << 20);
}

// A profiling process that dies (a LibTorch crash, the OOM killer) fails
// the profile naming the cause; the daemon's process goes on.
TEST(TorchJobRunnerTest, AProfilingProcessThatDiesFailsTheProfileNotTheDaemon) {
  TorchJobRunner crashing(WriteScript("apapo_crashing_worker.sh", "kill -SEGV $$"));
  auto result = crashing.Profile(ModelProfile("job-c"));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
  EXPECT_THAT(result.status().message(),
              HasSubstr("profiling job-c: the profiling process was killed by signal 11"));

  TorchJobRunner quitting("/bin/true");
  result = quitting.Profile(ModelProfile("job-t"));
  EXPECT_THAT(result.status().message(),
              HasSubstr("the profiling process exited without reporting a profile"));
}

TEST(TorchJobRunnerTest, StopEndsARunningProfilingProcess) {
  // A child that would profile for ever: only the stop ends it.
  TorchJobRunner runner(WriteScript("apapo_endless_worker.sh", "exec tail -f /dev/null"));
  auto result = ProfileUntilStopped(runner, ModelProfile("job-z"));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
}

apapo::v1::ProfileCommand LinkProfile(const std::string& job, int port,
                                      int rank, int world) {
  apapo::v1::ProfileCommand c;
  c.set_job_id(job);
  c.set_iterations(1);
  *c.mutable_spec() = TinyMlpSpec(1);
  auto* rv = c.mutable_rendezvous();
  rv->set_store_host("127.0.0.1");
  rv->set_store_port(port);
  rv->set_prefix(job + "/profile");
  rv->set_world_size(world);
  rv->set_rank(rank);
  rv->mutable_timeout()->set_seconds(600);
  rv->set_backend("gloo");
  c.add_peers("w-a");
  c.add_peers("w-b");
  return c;
}

TEST(TorchJobRunnerTest, TwoRunnersProfileTheirLinkThroughTheHostsStore) {
  TorchJobRunnerOptions host_options{kSelf};
  host_options.host = "127.0.0.1";
  TorchJobRunnerOptions peer_options{kSelf};
  peer_options.host = "localhost";
  TorchJobRunner host(host_options), peer(peer_options);
  auto port = host.HostRendezvous("job-l");
  ASSERT_TRUE(port.ok()) << port.status();
  absl::StatusOr<apapo::v1::ProfileResult> result[2];
  TorchJobRunner* runners[2] = {&host, &peer};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      result[rank] = runners[rank]->Profile(LinkProfile("job-l", *port, rank, 2));
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(result[rank].ok()) << result[rank].status();
    EXPECT_EQ(result[rank]->profile().nodes_size(), 7);
    ASSERT_EQ(result[rank]->links_size(), 1);
    EXPECT_GT(result[rank]->links(0).bandwidth_bytes_per_second(), 0);
  }
  EXPECT_EQ(result[0]->links(0).from_worker(), "w-a");
  EXPECT_EQ(result[0]->links(0).to_worker(), "w-b");
  EXPECT_EQ(result[1]->links(0).from_worker(), "w-b");
}

TEST(TorchJobRunnerTest, StopCancelsAProfileWaitingForItsPeer) {
  TorchJobRunner host(kSelf), lonely(kSelf);
  auto port = host.HostRendezvous("job-s");
  ASSERT_TRUE(port.ok()) << port.status();
  // Rank 0 never comes: only Stop ends the 10-minute wait.
  auto result = ProfileUntilStopped(lonely, LinkProfile("job-s", *port, 1, 2));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled)
      << result.status();
}

}  // namespace
}  // namespace apapo::worker

int main(int argc, char** argv) {
  // Child mode, as apapo-worker's main dispatches it.
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--run_assignment=")) {
      return apapo::worker::RunAssignmentChildMain(std::string(arg));
    }
    if (absl::ConsumePrefix(&arg, "--run_profile=")) {
      return apapo::worker::RunProfileChildMain(std::string(arg));
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
