#include "partitioner/plan_proto.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "partitioner/pipedream_format.h"
#include "partitioner/testdata.h"

namespace apapo {
namespace partitioner {
namespace {

TEST(PlanProtoTest, JsonCarriesNodeIdsAndReplicas) {
  absl::StatusOr<Graph> g = ReadPipeDreamGraph(ProfilePath("vgg16"));
  ASSERT_TRUE(g.ok());
  PlannerOptions o;
  o.cost_model = CostModel::kPipeDream;
  absl::StatusOr<Plan> plan = PlanPipeline(*g, *MakeCluster(4, "", "", ""), o);
  ASSERT_TRUE(plan.ok());
  const apapo::v1::Plan proto = PlanToProto(*plan, *g, "vgg16");
  ASSERT_EQ(proto.stages_size(), 2);
  EXPECT_EQ(proto.stages(0).replicas(), 3);
  int nodes = 0;
  for (const auto& s : proto.stages()) nodes += s.node_ids_size();
  EXPECT_EQ(nodes, g->num_nodes());
  absl::StatusOr<std::string> json = PlanToJson(proto);
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"nodeIds\""), std::string::npos);
  EXPECT_NE(json->find("\"replicas\": 3"), std::string::npos);
}

// "a" (1 s forward, no parameters), then "fc" on it: a Linear of
// `width` outputs, 0.4 s forward, `backward` s backward, 4000 bytes of
// parameters, 400 of activations.
apapo::v1::ModelProfile AThenFc(int width, double backward) {
  apapo::v1::ModelProfile p;
  auto* a = p.add_nodes();
  a->set_id("a");
  a->set_forward_seconds(1);
  auto* fc = p.add_nodes();
  fc->set_id("fc");
  fc->add_inputs("a");
  fc->set_forward_seconds(0.4);
  fc->set_backward_seconds(backward);
  fc->set_activation_bytes(400);
  fc->set_parameter_bytes(4000);
  fc->set_split_width(width);
  return p;
}

TEST(PlanProtoTest, SplitProfileSharesCostsAmongParts) {
  apapo::v1::ModelProfile p = AThenFc(10, 0.8);
  auto* out = p.add_nodes();
  out->set_id("out");
  out->add_inputs("fc");
  out->set_forward_seconds(0.01);
  // fc is 54.5% of the time, out 0.5%: only fc is worth splitting.
  EXPECT_EQ(SplitCandidates(p, 0.05), std::vector<std::string>{"fc"});

  auto split = SplitProfile(p, {{"fc", 4}});
  ASSERT_TRUE(split.ok()) << split.status();
  absl::StatusOr<Graph> g = GraphFromProfile(*split);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->num_nodes(), 7);
  double forward = 0, params = 0;
  for (const auto& n : split->nodes()) {
    if (n.id().rfind("fc/", 0) == 0) {
      EXPECT_EQ(n.inputs(0), "a");
      EXPECT_DOUBLE_EQ(n.backward_seconds(), 0.2);
      EXPECT_EQ(n.activation_bytes(), 100);
      forward += n.forward_seconds();
      params += n.parameter_bytes();
    }
    if (n.id() == "fc") {
      EXPECT_EQ(n.inputs_size(), 4);  // the concat
      EXPECT_EQ(n.activation_bytes(), 400);
      EXPECT_EQ(n.forward_seconds(), 0);
    }
  }
  EXPECT_DOUBLE_EQ(forward, 0.4);
  EXPECT_DOUBLE_EQ(params, 4000);

  EXPECT_FALSE(SplitProfile(p, {{"out", 2}}).ok());  // split_width 0
  EXPECT_FALSE(SplitProfile(p, {{"fc", 11}}).ok());
  EXPECT_FALSE(SplitProfile(p, {{"zz", 2}}).ok());
}

// Measured split costs: 4 parts compute 1.2x the whole node, the update
// in its backward excepted; 8 parts fall back to the nearest count below
// (4), 2 parts to none (1).
TEST(PlanProtoTest, SplitProfileChargesTheMeasuredSplitCost) {
  apapo::v1::ModelProfile p = AThenFc(16, 0.9);  // 0.8 computed + 0.1 of update
  p.set_update_seconds(0.1);  // all fc's: a has no parameters
  auto* c4 = p.add_split_costs();
  c4->set_parts(4);
  c4->set_scale(1.2);
  EXPECT_DOUBLE_EQ(SplitScale(p, 2), 1.0);
  EXPECT_DOUBLE_EQ(SplitScale(p, 4), 1.2);
  EXPECT_DOUBLE_EQ(SplitScale(p, 8), 1.2);
  for (int parts : {2, 4, 8}) {
    auto split = SplitProfile(p, {{"fc", parts}});
    ASSERT_TRUE(split.ok()) << split.status();
    double forward = 0, backward = 0;
    for (const auto& n : split->nodes()) {
      if (n.id().rfind("fc/", 0) == 0) {
        forward += n.forward_seconds();
        backward += n.backward_seconds();
      }
    }
    const double scale = parts == 2 ? 1.0 : 1.2;
    EXPECT_NEAR(forward, 0.4 * scale, 1e-12) << parts;
    EXPECT_NEAR(backward, 0.8 * scale + 0.1, 1e-12) << parts;
    EXPECT_TRUE(GraphFromProfile(*split).ok());
  }
  // A profile whose split costs are out of range fails naming the field.
  for (double bad : {0.5, 5.0, std::nan("")}) {
    c4->set_scale(bad);
    absl::Status st = GraphFromProfile(p).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(st.message()), testing::HasSubstr("split_costs[0].scale"));
    EXPECT_DOUBLE_EQ(SplitScale(p, 4), 1.0) << bad;  // not charged
  }
  c4->set_scale(1.2);
  p.add_split_costs()->set_parts(2);
  p.mutable_split_costs(1)->set_scale(1.1);
  EXPECT_THAT(std::string(GraphFromProfile(p).status().message()),
              testing::HasSubstr("split_costs[1].parts must be >= 2 and ascending"));
}

TEST(PlanProtoTest, ReadsTextAndJsonProfiles) {
  const std::string dir = testing::TempDir();
  const std::string text_path = dir + "/p.textproto";
  std::ofstream(text_path) << "model: \"tiny\"\n"
                              "nodes { id: \"a\" forward_seconds: 0.1 "
                              "backward_seconds: 0.2 activation_bytes: 10 }\n"
                              "nodes { id: \"b\" inputs: \"a\" "
                              "forward_seconds: 0.1 parameter_bytes: 5 }\n";
  absl::StatusOr<Graph> g = ReadModelProfile(text_path);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->num_nodes(), 2);
  EXPECT_EQ(g->edges().size(), 1u);
  const std::string json_path = dir + "/p.json";
  std::ofstream(json_path)
      << R"({"nodes": [{"id": "a", "forwardSeconds": 0.1},
                       {"id": "b", "inputs": ["a"], "backwardSeconds": 0.3}]})";
  g = ReadModelProfile(json_path);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_DOUBLE_EQ(g->node(1).backward_seconds, 0.3);
  std::ofstream(text_path) << "nodes { id: \"a\" }\nnodes { id: \"b\" inputs: \"zz\" }\n";
  g = ReadModelProfile(text_path);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("dangling input 'zz'"), std::string::npos);
  std::ofstream(text_path) << "nodes {\n id: 3 3\n";
  g = ReadModelProfile(text_path);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message().rfind(text_path + ":2:", 0), 0u) << g.status();
}

}  // namespace
}  // namespace partitioner
}  // namespace apapo
