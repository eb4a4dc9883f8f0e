#include "worker/local_launcher.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

TEST(PlanLocalJobTest, UnforcedStagesArePlannedByThePartitioner) {
  const apapo::v1::JobSpec spec = Spec("mlp");
  const AnalyzedGraph graph = Graph(spec);
  auto plan = PlanLocalJob(spec, graph, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->description, HasSubstr("(planned)"));
  EXPECT_EQ(plan->world_size, 2);
  ASSERT_EQ(plan->schedule.num_stages, 2) << plan->description;
  EXPECT_EQ(plan->schedule.micro_batches_per_iteration, 1);
  // The mlp's whole-layer cuts are unbalanced: the planner splits layers.
  EXPECT_FALSE(plan->splits.empty()) << plan->description;
  auto split_graph = PlannedGraph(graph, *plan);
  ASSERT_TRUE(split_graph.ok()) << split_graph.status();
  auto layouts = LayoutStages(*split_graph, plan->stage_nodes);
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  std::set<std::string> covered;
  for (const auto& stage : plan->stage_nodes) covered.insert(stage.begin(), stage.end());
  EXPECT_EQ(covered.size(), split_graph->nodes().size());
  // Every rank computes the same plan.
  auto again = PlanLocalJob(spec, graph, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->stage_nodes, plan->stage_nodes);
  EXPECT_EQ(again->splits, plan->splits);
}

TEST(PlanLocalJobTest, ForcedStagesGetTheBalancedWholeLayerCut) {
  apapo::v1::JobSpec spec = Spec("mlp");
  spec.mutable_schedule()->set_stages(2);
  const AnalyzedGraph graph = Graph(spec);
  auto plan = PlanLocalJob(spec, graph, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->splits.empty());
  EXPECT_EQ(plan->stage_nodes.size(), 2u);
  EXPECT_EQ(plan->stage_nodes[0].front(), "input");
  EXPECT_THAT(plan->description, ::testing::StartsWith("async, 2 stage(s)"));
}

TEST(PlanLocalJobTest, OneProcessIsPlainTraining) {
  // Nothing to partition: the whole graph in one stage.
  const apapo::v1::JobSpec spec = Spec("mlp");
  auto plan = PlanLocalJob(spec, Graph(spec), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->world_size, 1);
}

}  // namespace
}  // namespace worker
}  // namespace apapo
