#include "planning/partitioner_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "partitioner/synthetic.h"
#include "planning/chain_profile_testing.h"
#include "planning/stage_plan.h"

namespace apapo::planning {
namespace {

using test_profiles::Chain;

// Two halves that weigh the same: two workers should run it as a 2-stage
// pipeline.
apapo::v1::ModelProfile ChainProfile() { return Chain("chain", 0.02, 0); }

// One level of the named workers at `bandwidth`.
apapo::v1::ClusterSpec Workers(const std::vector<std::string>& ids,
                               double bandwidth) {
  apapo::v1::ClusterSpec c;
  for (const std::string& id : ids) {
    auto* w = c.add_workers();
    w->set_worker_id(id);
    w->set_relative_speed(1.0);
  }
  auto* level = c.add_levels();
  level->set_group_size(static_cast<int>(ids.size()));
  level->set_bandwidth_bytes_per_second(bandwidth);
  return c;
}

apapo::v1::ClusterSpec TwoWorkers(double bandwidth) {
  return Workers({"alpha", "beta"}, bandwidth);
}

apapo::v1::JobSpec Spec() {
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  spec.mutable_schedule()->set_micro_batches(4);
  return spec;
}

TEST(PartitionerPlannerTest, PipelinesAChainOnTwoWorkersNamedByRegistryIds) {
  PartitionerPlanner planner;
  // Slow network: all-reducing 16 MB per layer is dearer than sending 1 MB
  // of activations.
  auto plan = planner.MakePlan(Spec(), ChainProfile(), TwoWorkers(1e8));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages_size(), 2) << plan->DebugString();
  EXPECT_EQ(plan->stages(0).placement(0).worker_id(), "alpha");
  EXPECT_EQ(plan->stages(1).placement(0).worker_id(), "beta");
  EXPECT_EQ(plan->schedule(), apapo::v1::SCHEDULE_KIND_ASYNC);
  EXPECT_EQ(plan->stages(0).node_ids(0), "fc0");
  EXPECT_GT(plan->prediction().samples_per_second(), 0);
  EXPECT_TRUE(plan->prediction().alternatives_samples_per_second().contains("dp"));
  EXPECT_TRUE(plan->prediction().alternatives_samples_per_second().contains("gpipe"));
}

apapo::v1::CheckpointMeasurement Checkpoint(const std::string& worker, double snapshot,
                                            double write_cpu) {
  apapo::v1::CheckpointMeasurement m;
  m.set_worker_id(worker);
  m.set_bytes(2 * 4 * 2048LL * 2048 * 4);  // the chain's parameters and momentum
  m.set_snapshot_seconds(snapshot);
  m.set_write_cpu_seconds(write_cpu);
  m.set_write_seconds(2 * write_cpu);
  return m;
}

// A checkpoint every 10 steps: each drains and refills the 2-stage pipeline
// and pauses the stage whose copy and write take longest (each stage holds
// half the chain's parameters). The whole-run rate spreads that over the
// interval.
TEST(PartitionerPlannerTest, CheckpointsArePredictedFromWhatTheWorkersTimed) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec = Spec();
  spec.mutable_checkpoint()->set_directory("/var/lib/apapo/checkpoints/job-1");
  spec.mutable_checkpoint()->set_every_steps(10);
  apapo::v1::ClusterSpec cluster = TwoWorkers(1e8);

  // Nothing timed: the drain and refill alone.
  auto drain_only = planner.MakePlan(spec, ChainProfile(), cluster);
  ASSERT_TRUE(drain_only.ok()) << drain_only.status();
  ASSERT_EQ(drain_only->stages_size(), 2);
  const auto& p0 = drain_only->prediction();
  const double t = p0.seconds_per_mini_batch();
  const double fill_drain = p0.checkpoint_seconds();
  EXPECT_GT(fill_drain, 0);
  EXPECT_LT(fill_drain, 3 * t);  // about one pass through the pipeline
  EXPECT_EQ(p0.checkpoint_every_steps(), 10);
  EXPECT_NEAR(p0.samples_per_second_with_checkpoints(),
              p0.samples_per_second() * t / (t + fill_drain / 10), 1e-6);
  EXPECT_THAT(drain_only->notes(),
              ::testing::Contains(::testing::HasSubstr("were not timed while profiling")));

  // Each stage's worker timed its own: each stage holds half the state, so
  // beta's stage pauses for half of its 0.02 s copy, and half of its 0.38 s
  // of write CPU in the share of the time the stage computes (the rest of
  // the write runs while it waits); alpha's for half of 0.01 and of 0.09.
  *cluster.add_checkpoints() = Checkpoint("alpha", 0.01, 0.09);
  *cluster.add_checkpoints() = Checkpoint("beta", 0.02, 0.38);
  auto timed = planner.MakePlan(spec, ChainProfile(), cluster);
  ASSERT_TRUE(timed.ok()) << timed.status();
  const auto& p1 = timed->prediction();
  auto busy = [&](int stage) {
    return std::min(1.0, timed->stages(stage).compute_seconds() / t);
  };
  EXPECT_GT(busy(1), 0.5);
  const double beta_pause = 0.5 * (0.02 + busy(1) * 0.38);
  ASSERT_GT(beta_pause, 0.5 * (0.01 + busy(0) * 0.09));
  EXPECT_NEAR(p1.checkpoint_seconds(), fill_drain + beta_pause, 1e-9);
  EXPECT_NEAR(p1.samples_per_second_with_checkpoints(),
              p1.samples_per_second() * t / (t + (fill_drain + beta_pause) / 10), 1e-6);
  EXPECT_LT(p1.samples_per_second_with_checkpoints(), p0.samples_per_second_with_checkpoints());
  EXPECT_THAT(timed->notes(), ::testing::Contains(::testing::HasSubstr(
                                  "checkpoints every 10 steps cost")));

  // Only alpha timed one: beta's stage is charged the slowest measured.
  cluster.mutable_checkpoints()->RemoveLast();
  auto alpha_only = planner.MakePlan(spec, ChainProfile(), cluster);
  ASSERT_TRUE(alpha_only.ok()) << alpha_only.status();
  EXPECT_NEAR(alpha_only->prediction().checkpoint_seconds(),
              fill_drain + 0.5 * (0.01 + std::max(busy(0), busy(1)) * 0.09), 1e-9);

  // A worker's hostile or broken figures are left out, as if not timed.
  apapo::v1::ClusterSpec hostile = TwoWorkers(1e8);
  *hostile.add_checkpoints() = Checkpoint("alpha", std::nan(""), 0.09);
  *hostile.add_checkpoints() = Checkpoint("beta", 0.02, -5);
  *hostile.add_checkpoints() = Checkpoint("beta", 0.02, std::numeric_limits<double>::infinity());
  auto ignored = planner.MakePlan(spec, ChainProfile(), hostile);
  ASSERT_TRUE(ignored.ok()) << ignored.status();
  EXPECT_NEAR(ignored->prediction().checkpoint_seconds(), fill_drain, 1e-9);
  EXPECT_TRUE(std::isfinite(ignored->prediction().samples_per_second_with_checkpoints()));

  // No checkpoints: no figures, no note.
  spec.clear_checkpoint();
  auto none = planner.MakePlan(spec, ChainProfile(), cluster);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->prediction().checkpoint_seconds(), 0);
  EXPECT_EQ(none->prediction().samples_per_second_with_checkpoints(), 0);
  EXPECT_THAT(none->notes(), ::testing::Not(::testing::Contains(
                                 ::testing::HasSubstr("checkpoints every"))));
}

TEST(PartitionerPlannerTest, BFloat16TransfersHalveTheBytesTheLinkIsCharged) {
  PartitionerPlanner planner;
  // 10 MB/s: the 1 MB of activations crossing the middle cut take ~0.1 s
  // a mini-batch each way, more than either half computes (0.06 s); in
  // bfloat16 ~0.05 s, hidden behind the compute. The staleness allowed
  // lets stage 0 keep enough micro-batches in flight to cover the round
  // trips either way.
  apapo::v1::JobSpec spec = Spec();
  spec.mutable_schedule()->set_max_staleness(7);
  auto exact = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(exact.ok()) << exact.status();
  spec.mutable_schedule()->set_transfer_precision(
      apapo::v1::TRANSFER_PRECISION_BFLOAT16);
  auto half = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(half.ok()) << half.status();
  ASSERT_EQ(exact->stages_size(), 2) << exact->DebugString();
  ASSERT_EQ(half->stages_size(), 2) << half->DebugString();
  EXPECT_EQ(exact->transfer_precision(), apapo::v1::TRANSFER_PRECISION_UNSPECIFIED);
  EXPECT_EQ(half->transfer_precision(), apapo::v1::TRANSFER_PRECISION_BFLOAT16);
  const double e = exact->prediction().samples_per_second();
  const double h = half->prediction().samples_per_second();
  EXPECT_NEAR(e, 128 / (128 * 2048 * 4 / 1e7), 0.05 * e) << "link-bound";
  EXPECT_NEAR(h, 128 / 0.06, 0.05 * h) << "compute-bound";
  EXPECT_THAT(half->notes(), ::testing::Contains(::testing::HasSubstr(
                                 "cross the cuts in bfloat16")));
  EXPECT_THAT(exact->notes(), ::testing::Not(::testing::Contains(
                                  ::testing::HasSubstr("bfloat16"))));
}

// A conv layer with 19 MB of output and a head: cutting between them costs
// little wire time at 1 GB/s but a lot of copying.
apapo::v1::ModelProfile WideCutProfile() {
  apapo::v1::ModelProfile p;
  p.set_model("cnn");
  p.set_batch_size(128);
  for (const char* id : {"conv", "head"}) {
    auto* n = p.add_nodes();
    n->set_id(id);
    if (std::string(id) == "head") n->add_inputs("conv");
    n->set_forward_seconds(0.05);
    n->set_backward_seconds(0.1);
    n->set_activation_bytes(std::string(id) == "conv" ? 19000000 : 1000);
    n->set_parameter_bytes(5000000);
  }
  return p;
}

void AddLink(apapo::v1::ClusterSpec* c, const char* from, const char* to,
             double cpu_seconds_per_byte) {
  auto* link = c->add_links();
  link->set_from_worker(from);
  link->set_to_worker(to);
  link->set_bandwidth_bytes_per_second(1e9);
  link->set_cpu_seconds_per_byte(cpu_seconds_per_byte);
}

TEST(PartitionerPlannerTest, TheCopiesCpuTheWorkersMeasuredDecidesTheCut) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec = Spec();
  spec.mutable_schedule()->set_micro_batches(0);
  apapo::v1::ClusterSpec cluster = TwoWorkers(1e9);
  auto unmeasured = planner.MakePlan(spec, WideCutProfile(), cluster);
  ASSERT_TRUE(unmeasured.ok()) << unmeasured.status();
  EXPECT_EQ(unmeasured->stages_size(), 2) << unmeasured->DebugString();

  // The median of what the links measured (one disturbed figure aside):
  // at 2.2 ns per byte each stage would copy for 84 ms, the replicas' 10 MB
  // all-reduce for 44 ms, and replicas win.
  AddLink(&cluster, "alpha", "beta", 2e-9);
  AddLink(&cluster, "beta", "alpha", 2.2e-9);
  AddLink(&cluster, "alpha", "beta", 1e-6);
  auto measured = planner.MakePlan(spec, WideCutProfile(), cluster);
  ASSERT_TRUE(measured.ok()) << measured.status();
  ASSERT_EQ(measured->stages_size(), 1) << measured->DebugString();
  EXPECT_EQ(measured->stages(0).placement_size(), 2);

  // An all-reduce the workers timed at 3x the ring model (4 MB: 17.6 ms at
  // 2.2 ns per byte, measured 52.8 ms) makes the replicas' 44 ms 132 ms:
  // the cut wins back.
  for (int w = 0; w < 2; ++w) {
    auto* a = cluster.add_allreduces();
    a->set_ranks(2);
    a->set_bytes(4000000);
    a->set_seconds(0.0528);
  }
  auto timed = planner.MakePlan(spec, WideCutProfile(), cluster);
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_EQ(timed->stages_size(), 2) << timed->DebugString();

  // Cheap copies keep the cut and the plan says what they cost.
  apapo::v1::ClusterSpec cheap = TwoWorkers(1e9);
  AddLink(&cheap, "alpha", "beta", 0.1e-9);
  auto piped = planner.MakePlan(spec, WideCutProfile(), cheap);
  ASSERT_TRUE(piped.ok()) << piped.status();
  ASSERT_EQ(piped->stages_size(), 2);
  EXPECT_THAT(piped->notes(),
              ::testing::Contains(::testing::HasSubstr(
                  "stage 0 spends 3.8 ms of CPU per mini-batch on its "
                  "transfers (0.1 ns per byte, both ways, at its messages' "
                  "size)")));

  // The workers also timed their loopback at the cut's 19 MB messages: 6x
  // the per-byte CPU of the link test's 4 MiB (the median of 6, 6 and a
  // disturbed 40). Each stage would copy for 23 ms, the replicas win.
  for (const char* w : {"alpha", "beta", "gamma"}) {
    for (auto [bytes, cpu] : {std::pair<int64_t, double>{4 << 20, 0.2e-9},
                              {19000000, std::string(w) == "alpha" ? 1.2e-9
                                         : std::string(w) == "beta" ? 1.2e-9
                                                                    : 8e-9}}) {
      auto* t = cheap.add_transfer_cpu();
      t->set_worker_id(w);
      t->set_message_bytes(bytes);
      t->set_cpu_seconds_per_byte(cpu);
    }
  }
  auto scaled = planner.MakePlan(spec, WideCutProfile(), cheap);
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  ASSERT_EQ(scaled->stages_size(), 1) << scaled->DebugString();
  EXPECT_EQ(scaled->stages(0).placement_size(), 2);
  // Told the same pipeline, the simulator charges each stage the copies at
  // the size of its messages: the prediction drops by that much.
  spec.mutable_schedule()->set_stages(2);
  auto forced = planner.MakePlan(spec, WideCutProfile(), cheap);
  ASSERT_TRUE(forced.ok()) << forced.status();
  ASSERT_EQ(forced->stages_size(), 2);
  EXPECT_THAT(forced->notes(),
              ::testing::Contains(::testing::HasSubstr(
                  "stage 0 spends 22.8 ms of CPU per mini-batch on its "
                  "transfers (0.6 ns per byte")));
  EXPECT_LT(forced->prediction().samples_per_second(),
            piped->prediction().samples_per_second());
}

// The benchmark mlp's shape: fc0 costs 1, fc1-fc3 cost 3 each (a Linear's
// backward without an input gradient is cheaper), all splittable. Whole-layer
// cuts leave 4 | 6; splitting gives ~5 | 5.
apapo::v1::ModelProfile UnbalancedMlpProfile() { return Chain("mlp", 0.0, 2048); }

TEST(PartitionerPlannerTest, SplitsWideLayersWhenThatBalancesStages) {
  PartitionerPlanner planner;
  auto spec = Spec();
  spec.mutable_schedule()->clear_micro_batches();
  // 1 GB/s: the cut's round trip (2 ms) stays well inside the cycle of
  // two micro-batches in flight.
  auto plan = planner.MakePlan(spec, UnbalancedMlpProfile(), TwoWorkers(1e9));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages_size(), 2) << plan->DebugString();
  ASSERT_GT(plan->splits_size(), 0) << plan->DebugString();
  EXPECT_GE(plan->splits(0).parts(), 2);
  EXPECT_THAT(plan->notes(), testing::Contains(testing::HasSubstr("column-wise")));
  // Async without replication: whole mini-batches.
  EXPECT_EQ(plan->micro_batches(), 1);
  // Stages name nodes of the split graph, and together cover all of it.
  int parts = 0;
  for (const auto& stage : plan->stages()) {
    for (const auto& id : stage.node_ids()) parts += id.find('/') != std::string::npos;
  }
  int expected = 0;
  for (const auto& split : plan->splits()) expected += split.parts();
  EXPECT_EQ(parts, expected);

  // Balanced beyond any whole-layer cut (4 | 6 of 10 units: 1/0.6 of one).
  spec.mutable_schedule()->set_split_layers(false);
  auto unsplit = planner.MakePlan(spec, UnbalancedMlpProfile(), TwoWorkers(1e8));
  ASSERT_TRUE(unsplit.ok()) << unsplit.status();
  EXPECT_EQ(unsplit->splits_size(), 0);
  EXPECT_GT(plan->prediction().samples_per_second(),
            1.1 * unsplit->prediction().samples_per_second());
}

// Where a whole-layer cut already balances the stages, a split gains
// nothing past its cost: the layers stay whole, and the plan says what the
// best split weighed was predicted at.
TEST(PartitionerPlannerTest, ASplitThatGainsLessThanTheMarginIsNamedInANote) {
  PartitionerPlanner planner;
  auto spec = Spec();
  spec.mutable_schedule()->clear_micro_batches();
  auto plan = planner.MakePlan(spec, Chain("mlp", 0.02, 2048), TwoWorkers(1e9));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages_size(), 2) << plan->DebugString();
  EXPECT_EQ(plan->splits_size(), 0) << plan->DebugString();
  EXPECT_THAT(plan->notes(),
              testing::Contains(testing::MatchesRegex(
                  "layers kept whole: the best column split weighed, fc0, fc1, fc2, fc3 "
                  "in [248] parts each, was predicted at [0-9]+ samples/s against "
                  "[0-9]+ unsplit \\(1\\.03x needed\\)")))
      << plan->DebugString();
  EXPECT_THAT(plan->notes(), testing::Not(testing::Contains(testing::HasSubstr("column-wise"))));
}

// Every candidate layer is split for the DP to find a cut, but a split is
// judged with only the layers its cut runs through split: here the parts
// cost 1.15x in 2 (as measured), and the cut through fc2 with fc0, fc1 and
// fc3 split too (6.3 | 5.2) is slower than the whole-layer cut (4 | 6),
// while fc2 alone split (5.7 | 4.7) is 1.05x faster than it.
TEST(PartitionerPlannerTest, ASplitIsJudgedWithOnlyTheLayersItsCutRunsThroughSplit) {
  PartitionerPlanner planner;
  auto spec = Spec();
  spec.mutable_schedule()->clear_micro_batches();
  apapo::v1::ModelProfile profile = UnbalancedMlpProfile();
  for (const auto& [parts, scale] : {std::pair{2, 1.15}, {4, 1.3}, {8, 1.5}}) {
    apapo::v1::SplitCost* c = profile.add_split_costs();
    c->set_parts(parts);
    c->set_scale(scale);
  }
  auto plan = planner.MakePlan(spec, profile, TwoWorkers(1e9));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages_size(), 2) << plan->DebugString();
  ASSERT_EQ(plan->splits_size(), 1) << plan->DebugString();
  EXPECT_EQ(plan->splits(0).node_id(), "fc2");
  EXPECT_EQ(plan->splits(0).parts(), 2);
  EXPECT_THAT(plan->notes(), testing::Contains(testing::StartsWith(
                                 "split fc2 column-wise into 2 parts each: predicted ")))
      << plan->DebugString();
}

TEST(PartitionerPlannerTest, ExplicitDataParallelReplicatesOneStage) {
  PartitionerPlanner planner;
  auto spec = Spec();
  spec.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_DATA_PARALLEL);
  auto plan = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e10));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages_size(), 1);
  EXPECT_EQ(plan->stages(0).replicas(), 2);
}

// spec.schedule.stages is the DP's stage count, not a hint: the best plan
// with exactly that many stages, whatever the planner would choose.
TEST(PartitionerPlannerTest, TheSpecsStageCountIsHonoured) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec = Spec();
  spec.mutable_schedule()->set_micro_batches(0);
  // Copies at 2.1 ns per byte: free, the planner replicates the wide cut.
  apapo::v1::ClusterSpec cluster = TwoWorkers(1e9);
  AddLink(&cluster, "alpha", "beta", 2.1e-9);
  auto free = planner.MakePlan(spec, WideCutProfile(), cluster);
  ASSERT_TRUE(free.ok()) << free.status();
  ASSERT_EQ(free->stages_size(), 1) << free->DebugString();

  spec.mutable_schedule()->set_stages(2);
  auto two = planner.MakePlan(spec, WideCutProfile(), cluster);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->stages_size(), 2) << two->DebugString();
  EXPECT_EQ(two->stages(0).node_ids(0), "conv");
  EXPECT_EQ(two->stages(1).node_ids(0), "head");
  EXPECT_THAT(two->notes(), ::testing::Contains(::testing::HasSubstr(
                                "2 stage(s) as asked")));
  EXPECT_THAT(two->notes(), ::testing::Not(::testing::Contains(
                                ::testing::HasSubstr("cannot force"))));
  // It predicts what it is: slower than the plan it would have chosen.
  EXPECT_LT(two->prediction().samples_per_second(),
            free->prediction().samples_per_second());

  // The other way round: the chain on a slow link is a pipeline when free
  // (the first test); asked for one stage, the DP still chooses its
  // replicas: one worker at 1e8 B/s, where all-reducing 64 MB costs more
  // than a second replica saves, and both at 1e10 B/s.
  apapo::v1::JobSpec one = Spec();
  one.mutable_schedule()->set_stages(1);
  auto single = planner.MakePlan(one, ChainProfile(), TwoWorkers(1e8));
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_EQ(single->stages_size(), 1) << single->DebugString();
  EXPECT_EQ(single->stages(0).placement_size(), 1);
  auto replicated = planner.MakePlan(one, ChainProfile(), TwoWorkers(1e10));
  ASSERT_TRUE(replicated.ok()) << replicated.status();
  ASSERT_EQ(replicated->stages_size(), 1) << replicated->DebugString();
  EXPECT_EQ(replicated->stages(0).placement_size(), 2);

  // More stages than the model has cuts: the field and the reason.
  spec.mutable_schedule()->set_stages(3);
  apapo::v1::ClusterSpec three_workers =
      Workers({"alpha", "beta", "gamma"}, 1e9);
  auto three = planner.MakePlan(spec, WideCutProfile(), three_workers);
  EXPECT_EQ(three.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(three.status().message()),
              ::testing::StartsWith("spec.schedule.stages: 3 asked for, but "
                                    "the model has at most 2"));

  // More stages than the workers a re-plan has left (the validator keeps
  // a submitted spec within its workers): one stage per worker, noted.
  auto shrunk = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e8));
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(shrunk->stages_size(), 2);
  EXPECT_THAT(shrunk->notes(),
              ::testing::Contains(
                  "spec.schedule asks for 3 stage(s) x 0 replica(s) (0: any); "
                  "2 worker(s) are left: planned with 2 x 0"));
}

apapo::v1::ClusterSpec FourWorkers(double bandwidth) {
  return Workers({"w1", "w2", "w3", "w4"}, bandwidth);
}

TEST(PartitionerPlannerTest, TheSpecsReplicaCountIsHonoured) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec = Spec();
  spec.mutable_schedule()->clear_micro_batches();
  spec.mutable_schedule()->set_stages(2);
  spec.mutable_schedule()->set_replicas(2);
  auto plan = planner.MakePlan(spec, ChainProfile(), FourWorkers(1e10));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages_size(), 2) << plan->DebugString();
  std::set<std::string> placed;
  for (const auto& stage : plan->stages()) {
    EXPECT_EQ(stage.replicas(), 2);
    ASSERT_EQ(stage.placement_size(), 2);
    for (const auto& r : stage.placement()) placed.insert(r.worker_id());
  }
  EXPECT_EQ(placed.size(), 4u);
  EXPECT_THAT(plan->notes(),
              ::testing::Contains("2 replica(s) per stage as asked"));

  // Data parallelism on 2 of the 4 workers, as asked (it took all 4).
  apapo::v1::JobSpec dp = Spec();
  dp.mutable_schedule()->set_stages(1);
  dp.mutable_schedule()->set_replicas(2);
  auto two = planner.MakePlan(dp, ChainProfile(), FourWorkers(1e10));
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->stages_size(), 1);
  EXPECT_EQ(two->stages(0).placement_size(), 2);

  // A re-plan left with 3 workers: fewer replicas first.
  apapo::v1::ClusterSpec three = Workers({"w1", "w2", "w3"}, 1e10);
  auto shrunk = planner.MakePlan(spec, ChainProfile(), three);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(shrunk->stages_size(), 2);
  for (const auto& stage : shrunk->stages()) EXPECT_EQ(stage.replicas(), 1);
  EXPECT_THAT(shrunk->notes(),
              ::testing::Contains(
                  "spec.schedule asks for 2 stage(s) x 2 replica(s) (0: any); "
                  "3 worker(s) are left: planned with 2 x 1"));
}

TEST(PartitionerPlannerTest, BadProfileIsInvalidArgument) {
  PartitionerPlanner planner;
  auto profile = ChainProfile();
  profile.mutable_nodes(2)->set_inputs(0, "missing");
  auto plan = planner.MakePlan(Spec(), profile, TwoWorkers(1e9));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), ::testing::HasSubstr("missing"));
}

TEST(PartitionerPlannerTest, NothingFitsInMemoryIsResourceExhausted) {
  PartitionerPlanner planner;
  auto cluster = TwoWorkers(1e9);
  for (auto& w : *cluster.mutable_workers()) w.set_memory_bytes(1 << 20);
  auto plan = planner.MakePlan(Spec(), ChainProfile(), cluster);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted)
      << plan.status();
}

// The measured profile a worker would report for `graph`.
apapo::v1::ModelProfile ProfileOf(const partitioner::Graph& graph,
                                  const std::string& model) {
  apapo::v1::ModelProfile p;
  p.set_model(model);
  p.set_batch_size(32);
  for (int v = 0; v < graph.num_nodes(); ++v) {
    const partitioner::Node& node = graph.node(v);
    auto* n = p.add_nodes();
    n->set_id(node.id);
    for (int q : graph.predecessors(v)) n->add_inputs(graph.node(q).id);
    n->set_forward_seconds(node.forward_seconds);
    n->set_backward_seconds(node.backward_seconds);
    n->set_activation_bytes(node.activation_bytes);
    n->set_parameter_bytes(node.parameter_bytes);
  }
  return p;
}

apapo::v1::ClusterSpec FlatCluster(int n) {
  apapo::v1::ClusterSpec c;
  for (int i = 0; i < n; ++i) {
    auto* w = c.add_workers();
    w->set_worker_id("w-" + std::to_string(i));
    w->set_relative_speed(1.0);
  }
  auto* level = c.add_levels();
  level->set_group_size(n);
  level->set_bandwidth_bytes_per_second(10e9);
  return c;
}

// The issue-12 shape submitted as a measured profile: planned (coarsened, and
// the plan says so) rather than taking the coordinator down.
TEST(PartitionerPlannerTest, PlansAWideNasNetStyleModelOnSixteenWorkers) {
  PartitionerPlanner planner;
  const partitioner::Graph graph = partitioner::SyntheticNasNet(1);
  auto spec = Spec();
  spec.mutable_schedule()->clear_micro_batches();
  auto plan = planner.MakePlan(spec, ProfileOf(graph, "nasnet"), FlatCluster(16));
  ASSERT_TRUE(plan.ok()) << plan.status();
  int nodes = 0, replicas = 0;
  for (const auto& stage : plan->stages()) {
    nodes += stage.node_ids_size();
    replicas += stage.placement_size();
  }
  EXPECT_EQ(nodes, graph.num_nodes());
  EXPECT_LE(replicas, 16);
  EXPECT_THAT(plan->notes(),
              testing::Contains(testing::HasSubstr("search: prefixes of a "
                                                   "topological order")));
}

TEST(PartitionerPlannerTest, ExceedingTheBudgetIsResourceExhaustedNamingIt) {
  partitioner::PlannerOptions::Budget budget = kCoordinatorBudget;
  budget.max_dp_steps = 1000;
  PartitionerPlanner planner(budget);
  auto plan = planner.MakePlan(
      Spec(), ProfileOf(partitioner::SyntheticLayeredDag(300, 1), "layered"),
      FlatCluster(8));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted)
      << plan.status();
  EXPECT_THAT(std::string(plan.status().message()),
              testing::HasSubstr("max_dp_steps 1000"));
}


// `profile` with micro-batches of `rows` costing `scale` per row against
// its own batch's (ModelProfile.micro_batch_costs).
apapo::v1::ModelProfile WithRowCost(apapo::v1::ModelProfile profile, int64_t rows,
                                    double scale) {
  auto* c = profile.add_micro_batch_costs();
  c->set_rows(rows);
  c->set_scale(scale);
  c = profile.add_micro_batch_costs();
  c->set_rows(profile.batch_size());
  c->set_scale(1.0);
  return profile;
}

// 128 rows a mini-batch, two stages of the async schedule on whole
// mini-batches: the default depth, with nothing for the planner to weigh
// but the cut.
apapo::v1::JobSpec TwoAsyncStagesOnWholeMiniBatches() {
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  spec.mutable_schedule()->set_stages(2);
  spec.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_ASYNC);
  spec.mutable_schedule()->set_micro_batches(1);
  return spec;
}

// Where a slow link binds a 2-stage pipeline, the async schedule on whole
// mini-batches keeps 2 in flight, which do not cover the link's round
// trips; m micro-batches a mini-batch let stage 0 keep up to m + 1 at the
// same staleness (one update), each at its rows' measured cost. Auto takes
// them where predicted >= 1.1x, and leaves a spec's micro_batches alone.
// A stage after the first that sends its input gradients before its
// weight gradients (ScheduleSpec.split_backward, the default) takes those
// of its Linear-like layers (NodeProfile.weight_gradients_after_send) out
// of the upstream stage's round trip: on a link whose round trip whole
// mini-batches do not cover, the plan is predicted faster and its
// depth-bound note counts less compute.
TEST(PartitionerPlannerTest, SplitBackwardShortensTheRoundTrip) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec = TwoAsyncStagesOnWholeMiniBatches();
  const auto cycle_note = [](const apapo::v1::Plan& plan) {
    for (const std::string& n : plan.notes()) {
      if (absl::StrContains(n, "do not cover their cycle")) return n;
    }
    return std::string("(none)");
  };
  // Linear-like layers: their weight gradients may follow the send.
  apapo::v1::ModelProfile profile = ChainProfile();
  for (auto& n : *profile.mutable_nodes()) n.set_weight_gradients_after_send(true);
  auto split = planner.MakePlan(spec, profile, TwoWorkers(1e7));
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_TRUE(split->split_backward());
  // Layers whose weight gradients come before the send (a transformer
  // block's, PipeDream's profiles): nothing leaves the cycle.
  auto unmarked = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(unmarked.ok()) << unmarked.status();
  spec.mutable_schedule()->set_split_backward(false);
  auto one = planner.MakePlan(spec, profile, TwoWorkers(1e7));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_FALSE(one->split_backward());
  ASSERT_EQ(split->stages_size(), 2);
  ASSERT_EQ(one->stages_size(), 2);
  // The same stages; one pass leaves the round trip uncovered.
  EXPECT_EQ(split->stages(0).node_ids_size(), one->stages(0).node_ids_size());
  EXPECT_THAT(cycle_note(*one), ::testing::HasSubstr("ms of compute"));
  // Stage 1 holds half the chain's layers, each with parameters: half its
  // backward (1/3 of its compute in ChainProfile) leaves the cycle.
  EXPECT_GT(split->prediction().samples_per_second(),
            1.05 * one->prediction().samples_per_second())
      << cycle_note(*one) << " | " << cycle_note(*split);
  EXPECT_DOUBLE_EQ(unmarked->prediction().samples_per_second(),
                   one->prediction().samples_per_second());
}

// Three equal layers, each splittable column-wise: whole-layer cuts leave
// 1 | 2 of the work.
apapo::v1::ModelProfile ThreeLayers() {
  apapo::v1::ModelProfile p = Chain("three", 0.02, 2048, 3);
  for (auto& n : *p.mutable_nodes()) n.set_weight_gradients_after_send(true);
  return p;
}

// A cut inside fc1 balances the stages (45 ms each against 60) but sends
// 1.5 MiB each way, whose round trip (31.5 ms at 100 MB/s) 2 whole
// mini-batches in flight do not cover: the split on whole mini-batches is
// bound by its depth at 53.2 ms a mini-batch (2,405 samples/s against
// 2,133 for whole layers). 2 micro-batches of 64 rows cover it (2,844).
// Weighed on the whole layers alone, micro-batches gained nothing (that
// plan is not bound by its depth) and were never weighed with the split:
// each split graph weighs micro-batches of its own.
TEST(PartitionerPlannerTest, ALayerSplitWeighsItsOwnMicroBatches) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  auto plan = planner.MakePlan(spec, ThreeLayers(), TwoWorkers(1e8));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::string notes = absl::StrJoin(plan->notes(), " | ");
  ASSERT_EQ(plan->splits_size(), 1) << notes;
  EXPECT_EQ(plan->splits(0).node_id(), "fc1");
  EXPECT_EQ(plan->micro_batches(), 2) << notes;
  EXPECT_THAT(notes, ::testing::HasSubstr("micro-batches: 2 of 64 rows"));
  spec.mutable_schedule()->set_split_layers(false);
  auto whole = planner.MakePlan(spec, ThreeLayers(), TwoWorkers(1e8));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->splits_size(), 0);
  EXPECT_EQ(whole->micro_batches(), 1);
  EXPECT_GT(plan->prediction().samples_per_second(),
            1.2 * whole->prediction().samples_per_second())
      << notes;
}

// Two stages across 10 MB/s on whole mini-batches: the round trip binds
// the default depth. The plan lists what bfloat16 transfers and a bound of
// 2 would buy (each over 1.05x), without taking either; neither once the
// spec sets it.
TEST(PartitionerPlannerTest, ALinkBoundPlanListsWhatBfloat16AndADeeperBoundWouldBuy) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec = TwoAsyncStagesOnWholeMiniBatches();
  spec.mutable_schedule()->set_split_backward(false);
  auto plan = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string notes = absl::StrJoin(plan->notes(), " | ");
  ASSERT_EQ(plan->stages_size(), 2) << notes;
  // 4 in flight would cover it (bound 3); 3 cover more of it than 2.
  ASSERT_THAT(notes, ::testing::HasSubstr("schedule.max_staleness: 3 allows it"));
  const auto& alternatives = plan->prediction().alternatives_samples_per_second();
  const double rate = plan->prediction().samples_per_second();
  ASSERT_TRUE(alternatives.contains("bfloat16")) << notes;
  ASSERT_TRUE(alternatives.contains("staleness_2")) << notes;
  EXPECT_GT(alternatives.at("bfloat16"), 1.1 * rate);
  EXPECT_GT(alternatives.at("staleness_2"), 1.1 * rate);
  // Not taken: the plan runs float32, one update stale.
  EXPECT_EQ(plan->transfer_precision(), apapo::v1::TRANSFER_PRECISION_UNSPECIFIED);
  EXPECT_EQ(plan->stages(0).in_flight_depth(), 0);  // 0: 1F1B's own depth
  // Each is this plan with the setting; here (stages, micro-batches and
  // schedule set, no layer to split) the job that sets it plans the same.
  apapo::v1::JobSpec bf16 = spec;
  bf16.mutable_schedule()->set_transfer_precision(apapo::v1::TRANSFER_PRECISION_BFLOAT16);
  auto with_bf16 = planner.MakePlan(bf16, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(with_bf16.ok()) << with_bf16.status();
  EXPECT_DOUBLE_EQ(with_bf16->prediction().samples_per_second(), alternatives.at("bfloat16"));
  EXPECT_FALSE(with_bf16->prediction().alternatives_samples_per_second().contains("bfloat16"));
  apapo::v1::JobSpec deeper = spec;
  deeper.mutable_schedule()->set_max_staleness(2);
  auto with_bound = planner.MakePlan(deeper, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(with_bound.ok()) << with_bound.status();
  EXPECT_DOUBLE_EQ(with_bound->prediction().samples_per_second(),
                   alternatives.at("staleness_2"));
  EXPECT_FALSE(
      with_bound->prediction().alternatives_samples_per_second().contains("staleness_2"));
  // Where the planner took micro-batches to hide the link (the spec
  // leaves their count unset), each setting's micro-batches are weighed
  // again from the spec's count, as a job that sets it is planned:
  // bfloat16 takes more of them than float32 did.
  apapo::v1::JobSpec free = spec;
  free.mutable_schedule()->clear_micro_batches();
  auto micro = planner.MakePlan(free, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(micro.ok()) << micro.status();
  ASSERT_GT(micro->micro_batches(), 1) << absl::StrJoin(micro->notes(), " | ");
  bf16.mutable_schedule()->clear_micro_batches();
  auto free_bf16 = planner.MakePlan(bf16, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(free_bf16.ok()) << free_bf16.status();
  const auto& micro_alternatives = micro->prediction().alternatives_samples_per_second();
  ASSERT_TRUE(micro_alternatives.contains("bfloat16")) << absl::StrJoin(micro->notes(), " | ");
  EXPECT_DOUBLE_EQ(micro_alternatives.at("bfloat16"),
                   free_bf16->prediction().samples_per_second());
  EXPECT_GT(free_bf16->micro_batches(), micro->micro_batches());  // weighed again
  // A bound of 2 buys no more than the micro-batches' 3 in flight already
  // do: the job that sets it is planned under 1.05x, and it is not listed.
  apapo::v1::JobSpec free_deeper = free;
  free_deeper.mutable_schedule()->set_max_staleness(2);
  auto with_free_bound = planner.MakePlan(free_deeper, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(with_free_bound.ok()) << with_free_bound.status();
  EXPECT_LT(with_free_bound->prediction().samples_per_second(),
            1.05 * micro->prediction().samples_per_second());
  EXPECT_FALSE(micro_alternatives.contains("staleness_2"));
  // A fast link barely binds (60.1 ms a mini-batch against 60): neither
  // buys 1.05x, and neither is listed.
  auto fast = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e10));
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_FALSE(fast->prediction().alternatives_samples_per_second().contains("staleness_2"))
      << absl::StrJoin(fast->notes(), " | ");
  EXPECT_FALSE(fast->prediction().alternatives_samples_per_second().contains("bfloat16"));
}

TEST(PartitionerPlannerTest, AsyncTakesMicroBatchesWhereTheyHideTheLink) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  // Two stages asked for: unpinned, this link makes the pipeline too small
  // a gain over one worker (ALinkThatCostsTheGainLeavesOneWorker).
  spec.mutable_schedule()->set_stages(2);
  // Backward in one pass: its weight gradients lengthen the round trip
  // whole mini-batches leave uncovered (SplitBackwardShortensTheRoundTrip
  // shortens it, and micro-batches then gain less).
  spec.mutable_schedule()->set_split_backward(false);
  const auto note = [](const apapo::v1::Plan& plan) {
    for (const std::string& n : plan.notes()) {
      if (absl::StartsWith(n, "micro-batches:")) return n;
    }
    return std::string("(none)");
  };
  // 10 MB/s: 1 MiB each way per mini-batch against 60 ms of compute a
  // stage.
  auto slow = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->schedule(), apapo::v1::SCHEDULE_KIND_ASYNC) << note(*slow);
  ASSERT_EQ(slow->stages_size(), 2);
  EXPECT_GT(slow->micro_batches(), 1) << note(*slow);
  EXPECT_GT(slow->stages(0).in_flight_depth(), 2);
  EXPECT_THAT(note(*slow), ::testing::HasSubstr("at the same staleness"));
  const double whole_rate =
      slow->prediction().alternatives_samples_per_second().at("async");
  EXPECT_GT(slow->prediction().samples_per_second(), 1.1 * whole_rate);
  // The workers run it one update stale, as whole mini-batches would.
  absl::StatusOr<StagePlan> runnable = StagePlanFor(spec, *slow);
  ASSERT_TRUE(runnable.ok()) << runnable.status();
  EXPECT_EQ(runnable->schedule.micro_batches_per_iteration, slow->micro_batches());
  EXPECT_EQ(schedule::InFlightDepth(runnable->schedule, 0),
            slow->stages(0).in_flight_depth());
  EXPECT_EQ(schedule::AnalyzeStage(runnable->schedule, 0)->max_staleness, 1);
  // A finer m is taken only 1.1x faster than a coarser one: every m
  // weighed is named, and none coarser than the choice is within 1.1x of
  // it nor any finer beyond it.
  EXPECT_THAT(note(*slow), ::testing::HasSubstr("weighed 2 x 64 rows "));
  EXPECT_THAT(note(*slow), ::testing::HasSubstr("a finer one needs 1.10x"));
  const double chosen = slow->prediction().samples_per_second();
  for (int m : {2, 4, 8}) {
    if (m == slow->micro_batches()) continue;
    apapo::v1::JobSpec forced = spec;
    forced.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_ASYNC);
    forced.mutable_schedule()->set_micro_batches(m);
    auto other = planner.MakePlan(forced, ChainProfile(), TwoWorkers(1e7));
    ASSERT_TRUE(other.ok()) << other.status();
    const double rate = other->prediction().samples_per_second();
    if (m < slow->micro_batches()) {
      EXPECT_GT(chosen, 1.1 * rate) << "m=" << m << ": " << note(*slow);
    } else {
      EXPECT_LE(rate, 1.1 * chosen * (1 + 1e-9)) << "m=" << m << ": " << note(*slow);
    }
  }

  // Micro-batches too dear per row (16 rows at 3x, 32 at 2.5x): kept whole,
  // and the note says what the best would have given.
  auto costly =
      planner.MakePlan(spec, WithRowCost(ChainProfile(), 16, 3.0), TwoWorkers(1e7));
  ASSERT_TRUE(costly.ok()) << costly.status();
  EXPECT_EQ(costly->micro_batches(), 1) << note(*costly);
  EXPECT_THAT(note(*costly), ::testing::HasSubstr("kept"));

  // 1 GB/s: 2 ms of round trip in a 122 ms cycle; micro-batches gain
  // nothing and go unmentioned.
  auto lan = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e9));
  ASSERT_TRUE(lan.ok()) << lan.status();
  EXPECT_EQ(lan->schedule(), apapo::v1::SCHEDULE_KIND_ASYNC);
  EXPECT_EQ(lan->micro_batches(), 1);
  EXPECT_EQ(note(*lan), "(none)");

  // micro_batches asked for is kept; max_staleness 0 leaves nothing to hide
  // the link with at any m.
  apapo::v1::JobSpec asked = spec;
  asked.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_ASYNC);
  asked.mutable_schedule()->set_micro_batches(1);
  auto kept = planner.MakePlan(asked, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->micro_batches(), 1);
  asked.mutable_schedule()->clear_micro_batches();
  asked.mutable_schedule()->set_max_staleness(0);
  auto fresh = planner.MakePlan(asked, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->micro_batches(), 1);
  EXPECT_EQ(fresh->stages(0).in_flight_depth(), 0);
}

// Auto runs 1F1B with flushes where it is predicted >= 1.1x the async
// plan: with a staleness bound of 0 (async keeps one micro-batch in
// flight) across a slow link; not where its micro-batches compute too
// slowly per row to gain that much. With the natural staleness the async
// schedule's micro-batches hide the link (above) and the flush's bubble
// loses.
TEST(PartitionerPlannerTest, AutoFlushesOnlyWherePredictedTenPercentFaster) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  spec.mutable_schedule()->set_stages(2);  // as above
  spec.mutable_schedule()->set_max_staleness(0);
  const auto note = [](const apapo::v1::Plan& plan) {
    for (const std::string& n : plan.notes()) {
      if (absl::StartsWith(n, "schedule auto")) return n;
    }
    return std::string("(none)");
  };

  auto slow = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->schedule(), apapo::v1::SCHEDULE_KIND_1F1B_FLUSH) << note(*slow);
  EXPECT_EQ(slow->stages_size(), 2);
  EXPECT_EQ(slow->micro_batches(), 8);
  EXPECT_THAT(note(*slow), ::testing::HasSubstr("1F1B with flushes, 8 micro-batches"));
  // Its placement runs as a schedule the workers accept.
  absl::StatusOr<StagePlan> runnable = StagePlanFor(spec, *slow);
  ASSERT_TRUE(runnable.ok()) << runnable.status();
  EXPECT_EQ(runnable->schedule.kind, apapo::schedule::ScheduleKind::k1F1BFlush);

  // With 16-row micro-batches at 3x the per-row cost the flush loses.
  auto costly =
      planner.MakePlan(spec, WithRowCost(ChainProfile(), 16, 3.0), TwoWorkers(1e7));
  ASSERT_TRUE(costly.ok()) << costly.status();
  EXPECT_EQ(costly->schedule(), apapo::v1::SCHEDULE_KIND_ASYNC) << note(*costly);
  EXPECT_THAT(note(*costly), ::testing::HasSubstr("1.10x needed to choose it"));
  EXPECT_LT(costly->prediction().alternatives_samples_per_second().at("1f1b_flush"),
            1.1 * costly->prediction().samples_per_second());

  // The natural staleness: the async schedule's micro-batches win.
  spec.mutable_schedule()->clear_max_staleness();
  auto natural = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(natural.ok()) << natural.status();
  EXPECT_EQ(natural->schedule(), apapo::v1::SCHEDULE_KIND_ASYNC) << note(*natural);

  // A schedule asked for is kept, however slow the link.
  spec.mutable_schedule()->set_max_staleness(0);
  spec.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_ASYNC);
  auto asked = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e7));
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->schedule(), apapo::v1::SCHEDULE_KIND_ASYNC);
}

// A plan on more workers than one must be predicted 1.1x the fastest
// worker's alone. At 10 MB/s the chain's 1 MiB each way per mini-batch
// binds the pipeline near one worker's rate: the job runs on one, a note
// gives both predictions, and the other worker is left out. At 1 GB/s the
// pipeline is kept, with the one-worker prediction beside it. A spec that
// fixes the stages or the data parallelism, or asks for two workers at the
// least, is planned as asked.
TEST(PartitionerPlannerTest, ALinkThatCostsTheGainLeavesOneWorker) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  const auto note = [](const apapo::v1::Plan& plan) {
    for (const std::string& n : plan.notes()) {
      if (absl::StartsWith(n, "planned on one worker")) return n;
    }
    return std::string("(none)");
  };
  const auto workers = [](const apapo::v1::Plan& plan) {
    std::set<std::string> ids;
    for (const auto& st : plan.stages()) {
      for (const auto& r : st.placement()) ids.insert(r.worker_id());
    }
    return ids;
  };
  // beta measured faster: the one worker is the fastest, not the first.
  apapo::v1::ClusterSpec slow_link = TwoWorkers(1e7);
  slow_link.mutable_workers(1)->set_relative_speed(1.05);

  auto slow = planner.MakePlan(spec, ChainProfile(), slow_link);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(workers(*slow), std::set<std::string>{"beta"}) << slow->DebugString();
  EXPECT_THAT(note(*slow), ::testing::HasSubstr("planned on one worker (beta, the fastest): 2 "
                                                "workers were predicted "));
  EXPECT_THAT(note(*slow), ::testing::HasSubstr("(1.10x needed for more than one)"));
  const double one = slow->prediction().samples_per_second();
  EXPECT_DOUBLE_EQ(slow->prediction().alternatives_samples_per_second().at("one_worker"), one);
  // What it gave up: the pipeline on both, asked for.
  apapo::v1::JobSpec pinned = spec;
  pinned.mutable_schedule()->set_stages(2);
  auto two = planner.MakePlan(pinned, ChainProfile(), slow_link);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(workers(*two).size(), 2u);
  EXPECT_GT(two->prediction().samples_per_second(), one);
  EXPECT_LT(two->prediction().samples_per_second(), 1.1 * one);
  EXPECT_EQ(note(*two), "(none)");

  // Two workers at the least: both, however small the gain.
  apapo::v1::JobSpec at_least_two = spec;
  at_least_two.mutable_fault_tolerance()->set_min_workers(2);
  auto kept = planner.MakePlan(at_least_two, ChainProfile(), slow_link);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(workers(*kept).size(), 2u);

  // A fast link: the pipeline pays, and the one-worker figure is beside it.
  auto fast = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e9));
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_EQ(workers(*fast).size(), 2u);
  EXPECT_EQ(note(*fast), "(none)");
  EXPECT_GE(fast->prediction().samples_per_second(),
            1.1 * fast->prediction().alternatives_samples_per_second().at("one_worker"));
}

// Data parallelism on two workers runs micro-batches of half the batch:
// their compute, not the update, is charged the measured per-row cost. A
// cost of ~1 predicts what no cost does (the DP's value and the stage
// times agree).
TEST(PartitionerPlannerTest, ReplicasComputeHalfBatchesAtTheirMeasuredCost) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec = Spec();
  spec.mutable_schedule()->clear_micro_batches();
  spec.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_DATA_PARALLEL);
  apapo::v1::ModelProfile profile = ChainProfile();
  profile.set_update_seconds(0.02);  // of the 0.08 s of backward
  auto plain = planner.MakePlan(spec, profile, TwoWorkers(1e9));
  auto same = planner.MakePlan(spec, WithRowCost(profile, 64, 1.0001), TwoWorkers(1e9));
  auto dearer = planner.MakePlan(spec, WithRowCost(profile, 64, 1.25), TwoWorkers(1e9));
  ASSERT_TRUE(plain.ok() && same.ok() && dearer.ok());
  ASSERT_EQ(plain->micro_batches(), 2);
  ASSERT_EQ(plain->stages(0).replicas(), 2);
  EXPECT_NEAR(same->prediction().samples_per_second(),
              plain->prediction().samples_per_second(),
              1e-3 * plain->prediction().samples_per_second());
  // 0.12 s of forward and backward less the update, a replica half of it;
  // each replica's update whole.
  const double plain_compute = plain->stages(0).compute_seconds();
  EXPECT_NEAR(dearer->stages(0).compute_seconds() - plain_compute,
              0.25 * (0.12 - 0.02) / 2, 1e-9);
  EXPECT_LT(dearer->prediction().samples_per_second(),
            plain->prediction().samples_per_second());
  EXPECT_THAT(dearer->notes(), ::testing::Contains(::testing::HasSubstr(
                                   "micro-batches of 64 rows compute at 1.25x")));
}

// 1F1B with flushes on 2 stages, mini-batches of 128.
apapo::v1::JobSpec FlushOnTwoStages() {
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  spec.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_1F1B_FLUSH);
  spec.mutable_schedule()->set_stages(2);
  return spec;
}

// A replica that runs k micro-batches of a mini-batch adds k - 1 of their
// gradients into the first's: a 2-stage flush of 8 pays 7 adds over each
// stage's 32 MiB, data parallelism on 2 (one micro-batch a replica) none.
TEST(PartitionerPlannerTest, GradientAccumulationIsChargedPerLaterMicroBatch) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec = FlushOnTwoStages();
  apapo::v1::ModelProfile adding = ChainProfile();
  adding.set_accumulate_seconds_per_byte(1e-10);  // 10 GB/s
  auto plain = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e9));
  auto charged = planner.MakePlan(spec, adding, TwoWorkers(1e9));
  ASSERT_TRUE(plain.ok() && charged.ok()) << plain.status() << charged.status();
  ASSERT_EQ(charged->micro_batches(), 8);
  ASSERT_EQ(charged->stages_size(), 2);
  const double stage_bytes = 2 * 2048.0 * 2048 * 4;
  for (int s = 0; s < 2; ++s) {
    EXPECT_NEAR(charged->stages(s).compute_seconds() - plain->stages(s).compute_seconds(),
                7 * stage_bytes * 1e-10, 1e-9);
  }
  EXPECT_LT(charged->prediction().samples_per_second(),
            plain->prediction().samples_per_second());
  EXPECT_THAT(charged->notes(), ::testing::Contains(::testing::HasSubstr(
                                    "adds 7 micro-batches' gradients")));

  spec.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_DATA_PARALLEL);
  spec.mutable_schedule()->clear_stages();
  auto dp_plain = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e9));
  auto dp_charged = planner.MakePlan(spec, adding, TwoWorkers(1e9));
  ASSERT_TRUE(dp_plain.ok() && dp_charged.ok());
  ASSERT_EQ(dp_charged->micro_batches(), 2);
  EXPECT_DOUBLE_EQ(dp_charged->stages(0).compute_seconds(),
                   dp_plain->stages(0).compute_seconds());

  // A hostile figure fails the plan, naming it.
  adding.set_accumulate_seconds_per_byte(1.0);
  auto hostile = planner.MakePlan(spec, adding, TwoWorkers(1e9));
  ASSERT_FALSE(hostile.ok());
  EXPECT_EQ(hostile.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(hostile.status().message(), ::testing::HasSubstr("accumulate_seconds_per_byte"));
}

// With a split backward a Linear's later micro-batches add their weight
// gradients into the first's inside their product
// (NodeProfile.weight_gradients_in_product): the stage holding fc0 pays
// 7 adds over fc1's 16 MiB alone, the other stage over both its layers.
// In one pass every parameter pays them.
TEST(PartitionerPlannerTest, ALinearAddsItsGradientsInItsProduct) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec = FlushOnTwoStages();
  apapo::v1::ModelProfile adding = ChainProfile();
  adding.set_accumulate_seconds_per_byte(1e-10);
  apapo::v1::ModelProfile in_product = adding;
  in_product.mutable_nodes(0)->set_weight_gradients_in_product(true);
  auto plain = planner.MakePlan(spec, ChainProfile(), TwoWorkers(1e9));
  auto charged = planner.MakePlan(spec, in_product, TwoWorkers(1e9));
  ASSERT_TRUE(plain.ok() && charged.ok()) << plain.status() << charged.status();
  ASSERT_EQ(charged->micro_batches(), 8);
  ASSERT_EQ(charged->stages_size(), 2);
  ASSERT_EQ(charged->stages(0).node_ids(0), "fc0");
  const double layer_bytes = 2048.0 * 2048 * 4;
  EXPECT_NEAR(charged->stages(0).compute_seconds() - plain->stages(0).compute_seconds(),
              7 * layer_bytes * 1e-10, 1e-9);
  EXPECT_NEAR(charged->stages(1).compute_seconds() - plain->stages(1).compute_seconds(),
              7 * 2 * layer_bytes * 1e-10, 1e-9);
  EXPECT_THAT(charged->notes(), ::testing::Contains(::testing::HasSubstr(
                                    "stage 0 adds 7 micro-batches' gradients into the first's per "
                                    "mini-batch: 11.7 ms over 16.8 MB of its parameters")));
  spec.mutable_schedule()->set_split_backward(false);
  auto one_pass = planner.MakePlan(spec, in_product, TwoWorkers(1e9));
  ASSERT_TRUE(one_pass.ok()) << one_pass.status();
  for (int s = 0; s < 2; ++s) {
    EXPECT_NEAR(one_pass->stages(s).compute_seconds() - plain->stages(s).compute_seconds(),
                7 * 2 * layer_bytes * 1e-10, 1e-9);
  }
}

// A hostile or broken profile's costs fail the plan naming the field.
TEST(PartitionerPlannerTest, MicroBatchCostsOutOfRangeAreInvalidArgument) {
  PartitionerPlanner planner;
  for (auto [rows, scale] : std::vector<std::pair<int64_t, double>>{
           {16, 1e9}, {16, -1}, {16, std::numeric_limits<double>::quiet_NaN()},
           {0, 1.0}, {256, 1.0}}) {
    auto plan = planner.MakePlan(Spec(), WithRowCost(ChainProfile(), rows, scale),
                                 TwoWorkers(1e9));
    ASSERT_FALSE(plan.ok()) << rows << " " << scale;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(plan.status().message(), ::testing::HasSubstr("micro_batch_costs["));
  }
}

// A replicated stage's all-reduce starts in parts during the backward only
// where they are predicted 1.05x one all-reduce after it: where the link
// binds it, the weight gradients hide much of it; where the copies on the
// replicas' own cores bind, they hide nothing, the parts are predicted at
// 1.00x and one all-reduce after is taken. A spec's choice stands unweighed.
TEST(PartitionerPlannerTest, TheAllReduceRunsInPartsOnlyWherePredictedFivePercentFaster) {
  PartitionerPlanner planner;
  apapo::v1::JobSpec spec = Spec();
  spec.mutable_schedule()->clear_micro_batches();
  spec.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_DATA_PARALLEL);
  apapo::v1::ModelProfile profile = ChainProfile();
  for (auto& n : *profile.mutable_nodes()) n.set_weight_gradients_after_send(true);
  const auto notes = [](const apapo::v1::Plan& plan) {
    return absl::StrJoin(plan.notes(), " | ");
  };
  // 64 MiB of parameters at 1 GB/s: a 67 ms ring beside 40 ms of backward
  // a replica.
  auto linked = planner.MakePlan(spec, profile, TwoWorkers(1e9));
  ASSERT_TRUE(linked.ok()) << linked.status();
  ASSERT_EQ(linked->stages(0).replicas(), 2);
  EXPECT_FALSE(linked->allreduce_after_backward()) << notes(*linked);
  EXPECT_THAT(notes(*linked), ::testing::HasSubstr(
                                  "all-reduce in parts during the backward (behind the "
                                  "last weight gradients): predicted "));
  const double linked_rate = linked->prediction().samples_per_second();
  EXPECT_LT(linked->prediction().alternatives_samples_per_second().at(
                "allreduce_after_backward"),
            linked_rate / 1.1);

  // 2 ns of copies per byte each way, 10 GB/s of wire: the copies bind.
  apapo::v1::ClusterSpec copies = TwoWorkers(1e10);
  AddLink(&copies, "alpha", "beta", 2e-9);
  AddLink(&copies, "beta", "alpha", 2e-9);
  auto bound = planner.MakePlan(spec, profile, copies);
  ASSERT_TRUE(bound.ok()) << bound.status();
  ASSERT_EQ(bound->stages(0).replicas(), 2);
  EXPECT_TRUE(bound->allreduce_after_backward()) << notes(*bound);
  EXPECT_THAT(notes(*bound),
              ::testing::ContainsRegex("one all-reduce after the backward: in parts during "
                                       "it was predicted [0-9]+ samples/s against [0-9]+ "
                                       "\\(1.00x, under the 1.05x it must gain"));
  EXPECT_NEAR(bound->prediction().alternatives_samples_per_second().at(
                  "allreduce_in_backward"),
              bound->prediction().samples_per_second(),
              1e-6 * bound->prediction().samples_per_second());
  // The stored plan simulates as it was predicted (no window charged).
  apapo::v1::JobSpec one_pass = spec;
  one_pass.mutable_schedule()->set_split_backward(false);
  auto unsplit = planner.MakePlan(one_pass, profile, copies);
  ASSERT_TRUE(unsplit.ok()) << unsplit.status();
  EXPECT_FALSE(unsplit->allreduce_after_backward());  // nothing to start in parts
  EXPECT_NEAR(unsplit->prediction().samples_per_second(),
              bound->prediction().samples_per_second(),
              1e-6 * bound->prediction().samples_per_second());

  // The spec's choice, either way, is not weighed.
  spec.mutable_schedule()->set_allreduce_in_backward(true);
  auto parts = planner.MakePlan(spec, profile, copies);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_FALSE(parts->allreduce_after_backward());
  EXPECT_THAT(notes(*parts), ::testing::Not(::testing::HasSubstr("all-reduce after")));
  EXPECT_THAT(notes(*parts), ::testing::Not(::testing::HasSubstr("in parts during")));
  spec.mutable_schedule()->set_allreduce_in_backward(false);
  auto after = planner.MakePlan(spec, profile, TwoWorkers(1e9));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->allreduce_after_backward());
  EXPECT_THAT(notes(*after), ::testing::Not(::testing::HasSubstr("in parts during")));
  EXPECT_NEAR(after->prediction().samples_per_second(),
              linked->prediction().alternatives_samples_per_second().at(
                  "allreduce_after_backward"),
              1e-6 * linked_rate);
}

TEST(PartitionerPlannerTest, ZerosSkippedAreNotChargedToTheLink) {
  PartitionerPlanner planner;
  // The chain above at 10 MB/s, its layers' outputs 40% nonzero (ReLUs):
  // a cut carries 40% of the values and 1/32 for the mask, ~0.043 s each
  // way, hidden behind the 0.06 s each half computes.
  apapo::v1::ModelProfile relus = ChainProfile();
  for (auto& n : *relus.mutable_nodes()) n.set_nonzero_share(0.4);
  apapo::v1::JobSpec spec = Spec();
  spec.mutable_schedule()->set_max_staleness(7);
  auto skipped = planner.MakePlan(spec, relus, TwoWorkers(1e7));
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  spec.mutable_schedule()->set_skip_zeros(false);
  auto whole = planner.MakePlan(spec, relus, TwoWorkers(1e7));
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(skipped->stages_size(), 2) << skipped->DebugString();
  ASSERT_EQ(whole->stages_size(), 2) << whole->DebugString();
  EXPECT_TRUE(skipped->skip_zeros());
  EXPECT_FALSE(whole->skip_zeros());
  const double s = skipped->prediction().samples_per_second();
  const double w = whole->prediction().samples_per_second();
  EXPECT_NEAR(w, 128 / (128 * 2048 * 4 / 1e7), 0.05 * w) << "link-bound";
  EXPECT_NEAR(s, 128 / 0.06, 0.05 * s) << "compute-bound";
  EXPECT_NEAR(skipped->stages(0).comm_seconds(),
              (0.4 + 1.0 / 32) * whole->stages(0).comm_seconds(),
              0.02 * whole->stages(0).comm_seconds());
  EXPECT_THAT(skipped->notes(), ::testing::Contains(::testing::HasSubstr(
                                    "charged 43%-43% of its bytes")));
  EXPECT_THAT(skipped->notes(), ::testing::Contains(::testing::HasSubstr(
                                    "with a ReLU's zeros skipped, 1.7")));
  // On a link that binds nothing skipping gains nothing: whole tensors,
  // as the spec allows but does not ask.
  spec.mutable_schedule()->clear_skip_zeros();
  auto fast = planner.MakePlan(spec, relus, TwoWorkers(1e10));
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_FALSE(fast->skip_zeros());
  EXPECT_THAT(fast->notes(), ::testing::Contains(::testing::HasSubstr(
                                 "ReLU outputs cross whole: skipping their zeros "
                                 "was predicted at")));
  EXPECT_THAT(whole->notes(), ::testing::Not(::testing::Contains(
                                  ::testing::HasSubstr("without their zeros"))));

  // Packing and unpacking touch every value, zeros too: the transfers'
  // copies cost the stages the same CPU either way.
  apapo::v1::ClusterSpec copying = TwoWorkers(1e7);
  AddLink(&copying, "alpha", "beta", 1e-9);
  auto copy_note = [&](bool skip) {
    spec.mutable_schedule()->set_skip_zeros(skip);
    auto plan = planner.MakePlan(spec, relus, copying);
    EXPECT_TRUE(plan.ok()) << plan.status();
    for (const std::string& n : plan->notes()) {
      if (absl::StrContains(n, "stage 0 spends")) return n;
    }
    return std::string("no note on stage 0's copies");
  };
  const std::string skipping_copies = copy_note(true);
  EXPECT_THAT(skipping_copies, ::testing::HasSubstr("of CPU per mini-batch on its transfers"));
  EXPECT_EQ(skipping_copies, copy_note(false));

  // A worker's impossible share fails planning naming the node.
  for (double bad : {1.5, -0.1, std::nan("")}) {
    apapo::v1::ModelProfile broken = relus;
    broken.mutable_nodes(2)->set_nonzero_share(bad);
    spec.mutable_schedule()->clear_skip_zeros();
    auto refused = planner.MakePlan(spec, broken, TwoWorkers(1e7));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(),
                ::testing::HasSubstr("node 'fc2': nonzero_share must be in [0, 1]"));
  }
}

}  // namespace
}  // namespace apapo::planning
