#include "planning/stage_plan.h"

#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace apapo::planning {
namespace {

apapo::v1::Plan ParsePlan(const std::string& text) {
  apapo::v1::Plan plan;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &plan));
  return plan;
}

apapo::v1::JobSpec Spec(const std::string& text) {
  apapo::v1::JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec));
  return spec;
}

TEST(StagePlanTest, TwoStagePlanWithSplitAndDefaults) {
  auto sp = StagePlanFor(
      Spec("data { batch_size: 128 }"),
      ParsePlan(R"(schedule: SCHEDULE_KIND_ASYNC
                   stages { node_ids: "a" node_ids: "b/0" replicas: 1 }
                   stages { node_ids: "b/1" node_ids: "loss" replicas: 1 }
                   splits { node_id: "b" parts: 2 }
                   split_backward: true)"));
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_TRUE(sp->split_backward);
  EXPECT_TRUE(sp->allreduce_in_parts);
  EXPECT_EQ(sp->schedule.num_stages, 2);
  EXPECT_TRUE(sp->schedule.replicas.empty());
  // Async without replication: whole mini-batches.
  EXPECT_EQ(sp->schedule.micro_batches_per_iteration, 1);
  EXPECT_EQ(sp->schedule.max_in_flight, 0);
  EXPECT_EQ(sp->world_size, 2);
  ASSERT_EQ(sp->splits.size(), 1u);
  EXPECT_EQ(sp->splits[0].first, "b");
  EXPECT_EQ(sp->splits[0].second, 2);
  EXPECT_EQ(sp->Describe(Spec("")),
            "async (auto), 2 stage(s), m=1: [a..b/0] | [b/1..loss], split b/2, "
            "weight prediction, split backward");
}

// A replicated stage's all-reduce runs in parts with a split backward
// unless the plan says one after it (Plan.allreduce_after_backward), and
// never without a split backward.
TEST(StagePlanTest, TheAllReduceRunsInPartsUnlessThePlanSaysAfter) {
  const std::string dp = R"(schedule: SCHEDULE_KIND_DATA_PARALLEL
                            stages { node_ids: "a" node_ids: "loss" replicas: 2 })";
  auto parts = StagePlanFor(Spec("data { batch_size: 8 }"),
                            ParsePlan(dp + " split_backward: true"));
  auto after = StagePlanFor(Spec("data { batch_size: 8 }"),
                            ParsePlan(dp + " split_backward: true allreduce_after_backward: true"));
  auto unsplit = StagePlanFor(Spec("data { batch_size: 8 }"), ParsePlan(dp));
  ASSERT_TRUE(parts.ok() && after.ok() && unsplit.ok());
  EXPECT_TRUE(parts->allreduce_in_parts);
  EXPECT_FALSE(after->allreduce_in_parts);
  EXPECT_FALSE(unsplit->allreduce_in_parts);
  EXPECT_EQ(after->Describe(Spec("")),
            "dp (auto), 1 stage(s), m=2: [a..loss] x2, one all-reduce after the backward");
  EXPECT_EQ(parts->Describe(Spec("")), "dp (auto), 1 stage(s), m=2: [a..loss] x2");
}

TEST(StagePlanTest, MicroBatchesPlanThenSpecThenDefault) {
  const auto plan = ParsePlan(R"(schedule: SCHEDULE_KIND_GPIPE
                                 stages { node_ids: "a" }
                                 stages { node_ids: "b" })");
  // Flush schedules default to 4 x stages.
  EXPECT_EQ(StagePlanFor(Spec("data { batch_size: 64 }"), plan)
                ->schedule.micro_batches_per_iteration,
            8);
  EXPECT_EQ(StagePlanFor(Spec("data { batch_size: 64 } schedule { micro_batches: 4 }"),
                         plan)
                ->schedule.micro_batches_per_iteration,
            4);
  auto planned = plan;
  planned.set_micro_batches(2);
  EXPECT_EQ(StagePlanFor(Spec("data { batch_size: 64 } schedule { micro_batches: 4 }"),
                         planned)
                ->schedule.micro_batches_per_iteration,
            2);
}

TEST(StagePlanTest, MaxStalenessBoundsInFlight) {
  const auto spec = Spec("data { batch_size: 8 } schedule { max_staleness: 0 }");
  EXPECT_EQ(MaxInFlight(spec, 1, {}), 1);
  EXPECT_EQ(MaxInFlight(Spec(""), 1, {}), 0);
  // The bound is in updates: m micro-batches a mini-batch on one replica
  // keep m more in flight per update of staleness; replicas share them.
  const auto one = Spec("data { batch_size: 8 } schedule { max_staleness: 1 }");
  EXPECT_EQ(MaxInFlight(one, 1, {1, 1}), 2);
  EXPECT_EQ(MaxInFlight(one, 4, {1, 1}), 5);
  EXPECT_EQ(MaxInFlight(one, 4, {2, 1}), 3);
  EXPECT_EQ(MaxInFlight(one, 2, {2, 2}), 2);
  EXPECT_EQ(MaxInFlight(spec, 4, {1, 1}), 1);
  auto sp = StagePlanFor(spec, ParsePlan(R"(stages { node_ids: "a" }
                                           stages { node_ids: "b" })"));
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_EQ(sp->schedule.max_in_flight, 1);
  EXPECT_EQ(schedule::InFlightDepth(sp->schedule, 0), 1);
}

TEST(StagePlanTest, APlannedDepthReachesTheSchedule) {
  const auto plan = ParsePlan(R"(schedule: SCHEDULE_KIND_ASYNC
                                 stages { node_ids: "a" in_flight_depth: 3 }
                                 stages { node_ids: "b" })");
  auto sp = StagePlanFor(Spec("data { batch_size: 8 }"), plan);
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_EQ(sp->schedule.in_flight_depth, (std::vector<int>{3, 0}));
  EXPECT_EQ(schedule::InFlightDepth(sp->schedule, 0), 3);
  EXPECT_EQ(schedule::InFlightDepth(sp->schedule, 1), 1);
  EXPECT_EQ(sp->Describe(Spec("")),
            "async (auto), 2 stage(s), m=1: [a..a] (3 in flight) | [b..b], "
            "weight prediction");
  // The spec's staleness bound still wins.
  auto bounded = StagePlanFor(
      Spec("data { batch_size: 8 } schedule { max_staleness: 1 }"), plan);
  ASSERT_TRUE(bounded.ok());
  EXPECT_EQ(schedule::InFlightDepth(bounded->schedule, 0), 2);
  // Only the async schedule takes a depth; a negative one names the field.
  auto flush = plan;
  flush.set_schedule(apapo::v1::SCHEDULE_KIND_1F1B_FLUSH);
  auto refused = StagePlanFor(Spec("data { batch_size: 8 }"), flush);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("only the async schedule"),
            std::string::npos)
      << refused.status();
  auto negative = plan;
  negative.mutable_stages(1)->set_in_flight_depth(-2);
  auto bad = StagePlanFor(Spec("data { batch_size: 8 }"), negative);
  EXPECT_NE(bad.status().message().find("plan.stages[1].in_flight_depth"),
            std::string::npos)
      << bad.status();
}

TEST(StagePlanTest, RanksAreStageMajor) {
  auto sp = StagePlanFor(Spec("data { batch_size: 8 }"),
                         ParsePlan(R"(stages { node_ids: "a" replicas: 2 }
                                      stages { node_ids: "b" replicas: 1 }
                                      stages { node_ids: "c" replicas: 3 })"));
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_EQ(sp->world_size, 6);
  EXPECT_EQ(sp->RankOf(0, 1), 1);
  EXPECT_EQ(sp->RankOf(1, 0), 2);
  EXPECT_EQ(sp->RankOf(2, 2), 5);
  for (int rank = 0; rank < sp->world_size; ++rank) {
    auto [stage, replica] = sp->StageOf(rank);
    EXPECT_EQ(sp->RankOf(stage, replica), rank);
  }
}

TEST(StagePlanTest, MalformedPlansNameTheField) {
  auto empty = StagePlanFor(Spec(""), apapo::v1::Plan());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("plan.stages"), std::string::npos);
  auto no_nodes = StagePlanFor(Spec(""), ParsePlan(R"(stages { node_ids: "a" }
                                                      stages { })"));
  EXPECT_NE(no_nodes.status().message().find("plan.stages[1]: no node ids"),
            std::string::npos);
  auto dp = StagePlanFor(Spec(""), ParsePlan(R"(schedule: SCHEDULE_KIND_DATA_PARALLEL
                                                stages { node_ids: "a" }
                                                stages { node_ids: "b" })"));
  EXPECT_EQ(dp.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace apapo::planning
