// RunAssignment: a real two-rank pipeline (two threads of this process, one
// TCPStore served here), and assignments that do not fit.

#include "worker/daemon/stage_process.h"

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/daemon/test_jobs.h"

namespace apapo::worker {
namespace {

using ::testing::HasSubstr;
using test_jobs::Assignment;
using test_jobs::TinyMlpSpec;
using test_jobs::TwoStagePlan;

TEST(RunAssignmentTest, TwoStagesTrainOverARealStore) {
  auto store = StartJobStore();
  ASSERT_TRUE(store.ok()) << store.status();
  const apapo::v1::JobSpec spec = TinyMlpSpec(/*epochs=*/2);
  const apapo::v1::Plan plan = TwoStagePlan();

  absl::Status status[2];
  apapo::v1::MetricsReport final_metrics[2];
  std::vector<apapo::v1::MetricsReport> reports[2];
  std::vector<apapo::v1::StageTrace> traces[2];
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      status[rank] = RunAssignment(
          Assignment("job-1", spec, plan, rank, (*store)->port()),
          [&, rank](const apapo::v1::MetricsReport& m) {
            if (m.has_trace()) {
              EXPECT_EQ(m.job_id(), "job-1");
              EXPECT_FALSE(m.has_stage());  // a trace comes alone
              traces[rank].push_back(m.trace());
            } else {
              reports[rank].push_back(m);
            }
          },
          &final_metrics[rank]);
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];

  // Each stage sent its measured window once: steps [10, 15) after warm-up,
  // every kind of op a pipeline stage runs, spans in order, none overlapping.
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(traces[rank].size(), 1u) << rank;
    const apapo::v1::StageTrace& t = traces[rank][0];
    EXPECT_EQ(t.stage(), rank);
    EXPECT_EQ(t.rank(), rank);
    EXPECT_EQ(t.first_step(), 10);
    EXPECT_EQ(t.end_step(), 15);
    EXPECT_EQ(t.dropped_spans(), 0);
    std::set<apapo::v1::SpanKind> kinds;
    int64_t end = 0;
    for (const auto& s : t.spans()) {
      kinds.insert(s.kind());
      EXPECT_GE(s.start_ns(), end);
      EXPECT_GE(s.step(), 10);
      EXPECT_LT(s.step(), 15);
      end = s.start_ns() + s.duration_ns();
    }
    for (auto kind : {apapo::v1::SPAN_KIND_FORWARD, apapo::v1::SPAN_KIND_BACKWARD,
                      apapo::v1::SPAN_KIND_SEND, apapo::v1::SPAN_KIND_RECV,
                      apapo::v1::SPAN_KIND_OPTIMIZER}) {
      EXPECT_TRUE(kinds.count(kind)) << rank << " " << apapo::v1::SpanKind_Name(kind);
    }
  }

  // 512 samples / batch 32 = 16 steps per epoch, 2 epochs.
  for (int rank = 0; rank < 2; ++rank) {
    const auto& m = final_metrics[rank];
    EXPECT_EQ(m.job_id(), "job-1");
    EXPECT_EQ(m.step(), 32);
    EXPECT_EQ(m.samples(), 32 * 32);
    EXPECT_GT(m.samples_per_second(), 0);
    EXPECT_EQ(m.stage().stage(), rank);
    EXPECT_EQ(m.stage().rank(), rank);
    EXPECT_EQ(m.stage().forward_micro_batches(), 32 * 4);
    EXPECT_EQ(m.stage().backward_micro_batches(), 32 * 4);
    EXPECT_GT(m.stage().bytes_sent(), 0);
    EXPECT_GT(m.stage().busy_seconds(), 0);
  }
  EXPECT_TRUE(final_metrics[1].has_loss());
  EXPECT_TRUE(final_metrics[1].has_test_accuracy());
  EXPECT_FALSE(final_metrics[0].has_loss());
  EXPECT_EQ(final_metrics[1].total_steps(), 32);

  // Stage 0 streams its counters while training (no loss: that is the last
  // stage's), at least from its first step; they only grow.
  ASSERT_GE(reports[0].size(), 1u);
  for (size_t i = 0; i < reports[0].size(); ++i) {
    const auto& r = reports[0][i];
    EXPECT_EQ(r.job_id(), "job-1");
    EXPECT_EQ(r.stage().stage(), 0);
    EXPECT_FALSE(r.has_loss());
    EXPECT_GE(r.step(), 1);
    EXPECT_LE(r.step(), 32);
    EXPECT_GT(r.stage().busy_seconds(), 0);
    EXPECT_GT(r.stage().bytes_sent(), 0);
    EXPECT_GT(r.stage().forward_micro_batches(), 0);
    if (i > 0) {
      EXPECT_GE(r.step(), reports[0][i - 1].step());
      EXPECT_GE(r.stage().busy_seconds(), reports[0][i - 1].stage().busy_seconds());
    }
  }
  EXPECT_LE(reports[0].back().stage().busy_seconds(),
            final_metrics[0].stage().busy_seconds());
  // The last stage's progress: the first step, and one after each of the
  // two evaluations at least, with its own counters.
  ASSERT_GE(reports[1].size(), 3u);
  EXPECT_GT(reports[1].back().stage().busy_seconds(), 0);
  EXPECT_GT(reports[1].back().stage().backward_micro_batches(), 0);
  const auto& first = reports[1].front();
  EXPECT_EQ(first.job_id(), "job-1");
  EXPECT_GE(first.step(), 1);
  EXPECT_EQ(first.total_steps(), 32);
  EXPECT_EQ(first.epoch(), 1);
  EXPECT_TRUE(first.has_loss());
  EXPECT_EQ(first.stage().stage(), 1);
  const auto& last = reports[1].back();
  EXPECT_EQ(last.step(), 32);
  EXPECT_EQ(last.epoch(), 2);
  EXPECT_TRUE(last.has_test_accuracy());
  for (size_t i = 1; i < reports[1].size(); ++i) {
    EXPECT_GE(reports[1][i].step(), reports[1][i - 1].step());
  }
  // Step durations: one per step after the first, each reported once.
  int durations = final_metrics[1].stage().step_seconds_size();
  for (const auto& r : reports[1]) {
    durations += r.stage().step_seconds_size();
    for (double d : r.stage().step_seconds()) EXPECT_GT(d, 0);
  }
  EXPECT_EQ(durations, 31);
  // Stage 0 times its own steps too (training time between updates).
  int durations0 = final_metrics[0].stage().step_seconds_size();
  for (const auto& r : reports[0]) {
    durations0 += r.stage().step_seconds_size();
    for (double d : r.stage().step_seconds()) EXPECT_GT(d, 0);
  }
  EXPECT_EQ(durations0, 31);
}

TEST(RunAssignmentTest, DataParallelReplicasAllReduce) {
  auto store = StartJobStore();
  ASSERT_TRUE(store.ok()) << store.status();
  apapo::v1::Plan plan = test_jobs::OneStagePlan();
  plan.set_schedule(apapo::v1::SCHEDULE_KIND_DATA_PARALLEL);
  plan.mutable_stages(0)->set_replicas(2);
  plan.mutable_stages(0)->add_placement()->set_rank(1);
  const apapo::v1::JobSpec spec = TinyMlpSpec(1);
  absl::Status status[2];
  apapo::v1::MetricsReport final_metrics[2];
  std::vector<std::thread> ranks;
  for (int replica = 0; replica < 2; ++replica) {
    ranks.emplace_back([&, replica] {
      apapo::v1::AssignStage a =
          Assignment("job-dp", spec, plan, 0, (*store)->port());
      a.set_replica(replica);
      a.mutable_rendezvous()->set_rank(replica);
      a.mutable_rendezvous()->set_world_size(2);
      status[replica] = RunAssignment(a, nullptr, &final_metrics[replica]);
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  for (int replica = 0; replica < 2; ++replica) {
    EXPECT_EQ(final_metrics[replica].step(), 16);
    // Each replica trains half of every mini-batch.
    EXPECT_EQ(final_metrics[replica].samples(), 16 * 32 / 2);
    EXPECT_EQ(final_metrics[replica].stage().rank(), replica);
  }
}

TEST(RunAssignmentTest, UnknownNodeNamesTheStageAndTheNode) {
  apapo::v1::Plan plan = test_jobs::OneStagePlan();
  plan.mutable_stages(0)->set_node_ids(3, "fc9");
  apapo::v1::MetricsReport final_metrics;
  absl::Status s = RunAssignment(
      Assignment("job-2", TinyMlpSpec(1), plan, 0, 0), nullptr,
      &final_metrics);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("stage 0 replica 0 (rank 0)"));
  EXPECT_THAT(s.message(), HasSubstr("'fc9'"));
}

TEST(RunAssignmentTest, RankMustMatchTheStageMajorNumbering) {
  apapo::v1::AssignStage a =
      Assignment("job-3", TinyMlpSpec(1), TwoStagePlan(), 1, 1234);
  a.mutable_rendezvous()->set_rank(0);
  absl::Status s = RunAssignment(a, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("stage 1"));
  EXPECT_THAT(s.message(), HasSubstr("rank 1, not 0"));

  a = Assignment("job-3", TinyMlpSpec(1), TwoStagePlan(), 1, 1234);
  a.mutable_rendezvous()->set_world_size(3);
  s = RunAssignment(a, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("world size is 3"));
}

TEST(RunAssignmentTest, SingleStageRunsWithoutATransport) {
  apapo::v1::MetricsReport final_metrics;
  apapo::v1::AssignStage a = Assignment("job-4", TinyMlpSpec(1),
                                        test_jobs::OneStagePlan(), 0, 0);
  int reports = 0;
  absl::Status s = RunAssignment(
      a, [&](const apapo::v1::MetricsReport&) { ++reports; }, &final_metrics);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(final_metrics.step(), 16);
  EXPECT_TRUE(final_metrics.has_loss());
  EXPECT_GE(reports, 2);
}

}  // namespace
}  // namespace apapo::worker
