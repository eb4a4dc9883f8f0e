#include "worker/local_driver.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planning/stage_plan.h"

namespace apapo {
namespace worker {
namespace {

using ::testing::HasSubstr;

apapo::v1::JobSpec Spec(const std::string& model) {
  apapo::v1::JobSpec spec;
  spec.set_name("t");
  spec.mutable_model()->mutable_builtin()->set_name(model);
  spec.mutable_data()->mutable_fashion_mnist();
  spec.mutable_data()->set_batch_size(128);
  spec.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_ASYNC);
  return spec;
}

AnalyzedGraph Graph(const apapo::v1::JobSpec& spec) {
  auto proto = GraphForJob(spec);
  EXPECT_TRUE(proto.ok()) << proto.status();
  auto graph = AnalyzedGraph::Create(*proto);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *graph;
}

// PlanLocalRun's Plan as every stage process reads it.
struct LocalPlan {
  apapo::v1::Plan proto;
  planning::StagePlan stages;
  std::string description;
};

absl::StatusOr<LocalPlan> Plan(const apapo::v1::JobSpec& spec,
                               const AnalyzedGraph& graph, int workers) {
  auto proto = PlanLocalRun(spec, graph, workers);
  if (!proto.ok()) return proto.status();
  auto stages = planning::StagePlanFor(spec, *proto);
  if (!stages.ok()) return stages.status();
  return LocalPlan{*proto, *stages, DescribeLocalPlan(spec, *proto)};
}

TEST(PlanLocalRunTest, UnforcedStagesArePlannedByThePartitioner) {
  const apapo::v1::JobSpec spec = Spec("mlp");
  const AnalyzedGraph graph = Graph(spec);
  auto plan = Plan(spec, graph, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->description, HasSubstr("(planned)"));
  EXPECT_EQ(plan->stages.world_size, 2);
  ASSERT_EQ(plan->stages.schedule.num_stages, 2) << plan->description;
  EXPECT_EQ(plan->stages.schedule.micro_batches_per_iteration, 1);
  // The mlp's whole-layer cuts are unbalanced: the planner splits layers.
  EXPECT_FALSE(plan->stages.splits.empty()) << plan->description;
  auto split_proto = SplitLinearLayers(graph.graph(), plan->stages.splits);
  ASSERT_TRUE(split_proto.ok()) << split_proto.status();
  auto split_graph = AnalyzedGraph::Create(*split_proto);
  ASSERT_TRUE(split_graph.ok()) << split_graph.status();
  auto layouts = LayoutStages(*split_graph, plan->stages.stage_nodes);
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  std::set<std::string> covered;
  for (const auto& stage : plan->stages.stage_nodes) {
    covered.insert(stage.begin(), stage.end());
  }
  EXPECT_EQ(covered.size(), split_graph->nodes().size());
  // Planning is deterministic.
  auto again = Plan(spec, graph, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->stages.stage_nodes, plan->stages.stage_nodes);
  EXPECT_EQ(again->stages.splits, plan->stages.splits);
}

TEST(PlanLocalRunTest, ForcedStagesGetTheBalancedWholeLayerCut) {
  apapo::v1::JobSpec spec = Spec("mlp");
  spec.mutable_schedule()->set_stages(2);
  const AnalyzedGraph graph = Graph(spec);
  auto plan = Plan(spec, graph, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->stages.splits.empty());
  EXPECT_EQ(plan->stages.stage_nodes.size(), 2u);
  EXPECT_EQ(plan->stages.stage_nodes[0].front(), "input");
  EXPECT_THAT(plan->description, ::testing::StartsWith("async, 2 stage(s)"));
  // Ranks are placed stage-major, as the coordinator places them.
  EXPECT_EQ(plan->proto.stages(1).placement(0).rank(), 1);
}

TEST(PlanLocalRunTest, OneProcessIsPlainTraining) {
  // Nothing to partition: the whole graph in one stage.
  const apapo::v1::JobSpec spec = Spec("mlp");
  auto plan = Plan(spec, Graph(spec), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages.world_size, 1);
}

TEST(PlanLocalRunTest, LayoutsThatDoNotFitTheWorkersSayWhy) {
  apapo::v1::JobSpec spec = Spec("mlp");
  spec.mutable_schedule()->set_stages(3);
  auto plan = PlanLocalRun(spec, Graph(spec), 2);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("spec.schedule"));
}

}  // namespace
}  // namespace worker
}  // namespace apapo
