#include "partitioner/simulator.h"

#include <string>

#include "gtest/gtest.h"
#include "partitioner/pipedream_format.h"
#include "partitioner/testdata.h"

namespace apapo {
namespace partitioner {
namespace {

using schedule::Op;
using schedule::ScheduleKind;

// p uniform stages, forward 1 s, backward 2 s, no communication.
Plan UniformPlan(int p, int m) {
  Plan plan;
  plan.micro_batches = m;
  for (int s = 0; s < p; ++s) {
    StagePlan stage;
    stage.replicas = 1;
    stage.workers = {s};
    stage.forward_seconds = 1;
    stage.backward_seconds = 2;
    stage.parameter_bytes = 100;
    stage.activation_bytes = 10;
    plan.stages.push_back(stage);
  }
  return plan;
}

Cluster Flat(int n) { return *MakeCluster(n, "", "", ""); }

SimulationResult RunSim(const Plan& plan, ScheduleKind kind, int64_t iters = 8) {
  SimulationOptions o;
  o.iterations = iters;
  absl::StatusOr<SimulationResult> r =
      Simulate(plan, Flat(plan.stages.size()), kind, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SimulationResult();
}

TEST(SimulatorTest, FlushSchedulesHaveTheClosedFormBubble) {
  for (int p : {2, 4}) {
    for (int m : {4, 8}) {
      const double bubble = (p - 1.0) / (m + p - 1.0);
      for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1BFlush}) {
        SimulationResult r = RunSim(UniformPlan(p, m), kind);
        EXPECT_NEAR(r.bubble_fraction, bubble, 1e-9)
            << ScheduleKindName(kind) << " p=" << p << " m=" << m;
        EXPECT_NEAR(r.seconds_per_iteration, (m + p - 1) * 3.0, 1e-9);
      }
    }
  }
}

TEST(SimulatorTest, ActivationsInFlightMatchClosedForms) {
  const int p = 4, m = 8;
  SimulationResult flush = RunSim(UniformPlan(p, m), ScheduleKind::k1F1BFlush);
  SimulationResult gpipe = RunSim(UniformPlan(p, m), ScheduleKind::kGPipe);
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(flush.stages[s].max_in_flight, p - s);
    EXPECT_EQ(gpipe.stages[s].max_in_flight, m);
    EXPECT_EQ(flush.stages[s].max_staleness, 0);
    EXPECT_EQ(flush.stages[s].weight_versions, 1);
    EXPECT_DOUBLE_EQ(gpipe.stages[s].peak_memory_bytes, 100 + m * 10);
  }
}

TEST(SimulatorTest, AsyncHasNoSteadyStateBubbleAndStashesPMinusS) {
  const int p = 4;
  SimulationResult r = RunSim(UniformPlan(p, 1), ScheduleKind::kAsync, 64);
  EXPECT_NEAR(r.bubble_fraction, 0, 1e-9);
  EXPECT_NEAR(r.micro_batches_per_second, 1.0 / 3.0, 1e-9);
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(r.stages[s].weight_versions, p - s) << s;
    EXPECT_EQ(r.stages[s].max_staleness, p - s - 1) << s;
    EXPECT_EQ(r.stages[s].max_in_flight, p - s) << s;
  }
}

TEST(SimulatorTest, ADeeperAsyncStageHidesTheLinksRoundTrip) {
  // Two stages of 3 s per micro-batch joined by a link that takes 2 s each
  // way: at NOAM's depth 2, stage 0 waits for the round trip (3 + 2 + 3 + 2
  // = 10 s for 2 micro-batches: 0.2 per s); one more micro-batch in flight
  // covers it and the stages run compute-bound (1/3 per s).
  Plan plan = UniformPlan(2, 1);
  plan.stages[0].output_bytes = 2;
  plan.stages[0].output_bandwidth = 1;
  SimulationResult shallow = RunSim(plan, ScheduleKind::kAsync, 64);
  EXPECT_NEAR(shallow.micro_batches_per_second, 0.2, 0.01);
  plan.stages[0].in_flight_depth = 4;
  SimulationResult deep = RunSim(plan, ScheduleKind::kAsync, 64);
  EXPECT_NEAR(deep.micro_batches_per_second, 1.0 / 3.0, 0.01);
  EXPECT_EQ(deep.stages[0].max_in_flight, 4);
  EXPECT_EQ(deep.stages[0].max_staleness, 3);
}

TEST(SimulatorTest, ASplitBackwardSendsItsGradientsBeforeItsWeightGradients) {
  // The shallow pipeline above (10 s a cycle of 2 micro-batches), with 1 s
  // of stage 1's 2 s backward computed after its gradients leave: the
  // cycle is 3 + 2 + (3 - 1) + 2 = 9 s, so 2/9 micro-batches a second;
  // stage 1 still computes 3 s a micro-batch.
  Plan plan = UniformPlan(2, 1);
  plan.stages[0].output_bytes = 2;
  plan.stages[0].output_bandwidth = 1;
  plan.stages[1].backward_weight_seconds = 1;
  SimulationOptions o;
  o.iterations = 64;
  o.record_trace = true;
  absl::StatusOr<SimulationResult> r = Simulate(plan, Flat(2), ScheduleKind::kAsync, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->micro_batches_per_second, 2.0 / 9.0, 0.01);
  // Stage 1's trace, as the runtime's shows it: each backward in two
  // events, 1 s and 1 s, with the send of its gradients between them.
  std::vector<TraceEvent> stage1;
  for (const TraceEvent& e : r->trace) {
    if (e.stage == 1) stage1.push_back(e);
  }
  int sends = 0;
  for (size_t i = 0; i + 2 < stage1.size(); ++i) {
    if (stage1[i].op.type != Op::kBackward) continue;
    const TraceEvent& send = stage1[i + 1];
    const TraceEvent& weights = stage1[i + 2];
    ASSERT_EQ(send.op.type, Op::kSendGradients) << i;
    ASSERT_EQ(weights.op.type, Op::kBackward) << i;
    EXPECT_EQ(send.op.micro_batch, stage1[i].op.micro_batch);
    EXPECT_EQ(weights.op.micro_batch, stage1[i].op.micro_batch);
    EXPECT_NEAR(stage1[i].end - stage1[i].start, 1, 1e-9);
    EXPECT_NEAR(send.start, stage1[i].end, 1e-9);
    EXPECT_NEAR(weights.start, stage1[i].end, 1e-9);
    EXPECT_NEAR(weights.end - weights.start, 1, 1e-9);
    ++sends;
    i += 2;
  }
  EXPECT_EQ(sends, 64);
}

TEST(SimulatorTest, ALinkCarriesOneTransferAtATimeEachWay) {
  // A 1F1B flush of 4 micro-batches over a link of 5 s each way per
  // micro-batch (forward 1 s, backward 2 s). Stage 0 runs F0 F1 B0 F2 B1 F3
  // B2 B3, stage 1 F0 B0 F1 B1 F2 B2 F3 B3. F1 leaves stage 0 at 2 s but
  // waits for F0's transfer (to 6) and arrives at 11; stage 1's gradients
  // leave at 9 and 14 and arrive at 14 and 19; F2 and F3 leave at 17 and
  // 22 and arrive at 22 and 27; the last gradients leave at 25 and 30 and,
  // one at a time, arrive at 30 and 35: stage 0 ends B3 at 37. A link that
  // carried F1 beside F0 (arriving at 7) would end the iteration at 35.
  Plan plan = UniformPlan(2, 4);
  plan.stages[0].output_bytes = 5;
  plan.stages[0].output_bandwidth = 1;
  SimulationResult r = RunSim(plan, ScheduleKind::k1F1BFlush, 8);
  EXPECT_NEAR(r.seconds_per_iteration, 37, 1e-9);
}

TEST(SimulatorTest, TwoBWKeepsTwoVersionsAndStalenessOne) {
  const int p = 4;
  SimulationResult r = RunSim(UniformPlan(p, 8), ScheduleKind::k2BW, 16);
  EXPECT_NEAR(r.bubble_fraction, 0, 1e-9);
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(r.stages[s].weight_versions, 2);
    EXPECT_EQ(r.stages[s].max_staleness, 1);
  }
}

TEST(SimulatorTest, ReplicatedStageAllReducesAndRunsRoundRobin) {
  Plan plan = UniformPlan(2, 2);
  plan.stages[0].replicas = 2;
  plan.stages[0].workers = {0, 1};
  plan.stages[1].workers = {2};
  plan.stages[0].forward_seconds = 2;  // twice the work, twice the replicas
  plan.stages[0].backward_seconds = 4;
  SimulationOptions o;
  o.iterations = 32;
  absl::StatusOr<SimulationResult> r =
      Simulate(plan, Flat(3), ScheduleKind::kAsync, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->micro_batches_per_second, 1.0 / 3.0, 1e-6);
}

// One stage of two replicas, one micro-batch each (3 s), then a ring
// all-reduce of 100 B at 50 B/s (2 s): 5 s an iteration. A split backward
// whose last 1.5 s are weight gradients hides 1.5 s of the link's time
// (3.5 s); where the copies take half the ring (0.005 s a byte each way),
// only that half can be hidden (4 s).
TEST(SimulatorTest, TheLastWeightGradientsHideTheAllReducesLinkTime) {
  Plan plan = UniformPlan(1, 2);
  plan.stages[0].replicas = 2;
  plan.stages[0].workers = {0, 1};
  plan.stages[0].allreduce_bandwidth = 50;
  Cluster c = Flat(2);
  SimulationOptions o;
  o.iterations = 16;
  auto seconds = [&]() {
    absl::StatusOr<SimulationResult> r =
        Simulate(plan, c, ScheduleKind::kDataParallel, o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->seconds_per_iteration : 0.0;
  };
  EXPECT_NEAR(seconds(), 5, 1e-9);
  plan.stages[0].allreduce_window_seconds = 1.5;
  EXPECT_NEAR(seconds(), 3.5, 1e-9);
  c.transfer_cpu_seconds_per_byte = 0.005;
  EXPECT_NEAR(seconds(), 4, 1e-9);
  // A replica at half speed takes 6 s, and its window is 3 s.
  c.transfer_cpu_seconds_per_byte = 0;
  c.speeds = {1, 0.5};
  EXPECT_NEAR(seconds(), 6, 1e-9);
}

TEST(SimulatorTest, SimulatesARealPlanAndWritesATrace) {
  absl::StatusOr<Graph> g = ReadPipeDreamGraph(ProfilePath("gnmt"));
  ASSERT_TRUE(g.ok());
  const Cluster c = Flat(8);
  absl::StatusOr<Plan> plan = PlanPipeline(*g, c, PlannerOptions());
  ASSERT_TRUE(plan.ok());
  SimulationOptions o;
  o.record_trace = true;
  for (ScheduleKind kind : {ScheduleKind::kAsync, ScheduleKind::kGPipe,
                            ScheduleKind::k1F1BFlush}) {
    absl::StatusOr<SimulationResult> r = Simulate(*plan, c, kind, o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->micro_batches_per_second, 0);
    EXPECT_FALSE(r->trace.empty());
    const std::string json = ChromeTraceJson(*r);
    EXPECT_EQ(json.rfind("{\"traceEvents\":[", 0), 0u);
    EXPECT_NE(json.find("\"ph\":\"X\""), std::string::npos);
  }
}

TEST(SimulatorTest, RejectsEmptyPlans) {
  EXPECT_FALSE(
      Simulate(Plan(), Flat(1), ScheduleKind::kAsync, SimulationOptions()).ok());
}

}  // namespace
}  // namespace partitioner
}  // namespace apapo
