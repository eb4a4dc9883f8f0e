#include "partitioner/graph.h"

#include "gtest/gtest.h"

namespace apapo {
namespace partitioner {
namespace {

Node MakeNode(const std::string& id, double seconds = 1) {
  Node n;
  n.id = id;
  n.forward_seconds = seconds;
  return n;
}

TEST(GraphTest, TopologicalOrderFollowsEdges) {
  Graph g;
  const int a = g.AddNode(MakeNode("a"));
  const int b = g.AddNode(MakeNode("b"));
  const int c = g.AddNode(MakeNode("c"));
  ASSERT_TRUE(g.AddEdge(c, b).ok());
  ASSERT_TRUE(g.AddEdge(a, c).ok());
  ASSERT_TRUE(g.Validate().ok());
  absl::StatusOr<std::vector<int>> order = g.TopologicalOrder();
  ASSERT_TRUE(order.ok());
  EXPECT_EQ(*order, (std::vector<int>{a, c, b}));
  EXPECT_EQ(g.FindNode("c"), c);
  EXPECT_EQ(g.FindNode("zz"), -1);
  EXPECT_DOUBLE_EQ(g.TotalComputeSeconds(), 3);
}

// Pass 1 runs through a product node only where parameters precede it:
// not the first Linear on the data, nor one after parameter-free nodes only;
// a branch joining after a parameter-holding node counts.
TEST(GraphTest, PassOneProductBytesAreProductNodesAfterParameters) {
  Graph g;
  const auto add = [&](const std::string& id, double bytes, bool product) {
    Node n = MakeNode(id);
    n.parameter_bytes = bytes;
    n.weights_in_product = product;
    return g.AddNode(n);
  };
  const int input = add("input", 0, false);
  const int fc1 = add("fc1", 100, true);
  const int relu = add("relu", 0, false);
  const int fc2 = add("fc2", 200, true);
  const int side = add("side", 50, true);  // on the data, beside fc1
  const int head = add("head", 30, true);  // joins fc2 and side
  ASSERT_TRUE(g.AddEdge(input, fc1).ok());
  ASSERT_TRUE(g.AddEdge(fc1, relu).ok());
  ASSERT_TRUE(g.AddEdge(relu, fc2).ok());
  ASSERT_TRUE(g.AddEdge(input, side).ok());
  ASSERT_TRUE(g.AddEdge(fc2, head).ok());
  ASSERT_TRUE(g.AddEdge(side, head).ok());
  ASSERT_TRUE(g.Validate().ok());
  EXPECT_EQ(g.PassOneProductBytes(), (std::vector<double>{0, 0, 0, 200, 0, 30}));
}

TEST(GraphTest, RejectsCycleWithTheEdgeLine) {
  Graph g;
  const int a = g.AddNode(MakeNode("a"));
  const int b = g.AddNode(MakeNode("b"));
  ASSERT_TRUE(g.AddEdge(a, b, 7).ok());
  ASSERT_TRUE(g.AddEdge(b, a, 8).ok());
  int line = -1;
  absl::Status s = g.Validate(&line);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cycle"), std::string::npos) << s;
  EXPECT_TRUE(line == 7 || line == 8);
}

TEST(GraphTest, RejectsBadValuesDuplicatesAndEmpty) {
  EXPECT_FALSE(Graph().Validate().ok());
  Graph dup;
  dup.AddNode(MakeNode("a"));
  dup.AddNode(MakeNode("a"));
  EXPECT_NE(dup.Validate().message().find("duplicate"), std::string::npos);
  Graph negative;
  negative.AddNode(MakeNode("a", -1));
  EXPECT_FALSE(negative.Validate().ok());
  Graph nan;
  nan.AddNode(MakeNode("a", std::nan("")));
  EXPECT_FALSE(nan.Validate().ok());
  Graph loop;
  loop.AddNode(MakeNode("a"));
  ASSERT_TRUE(loop.AddEdge(0, 0).ok());
  EXPECT_FALSE(loop.Validate().ok());
  EXPECT_FALSE(loop.AddEdge(0, 5).ok());
}

// The update is part of the nodes' backward: a figure that is not finite,
// negative, or more than all of the backward is refused, naming the field.
TEST(GraphTest, TheUpdateIsWithinTheBackward) {
  Graph g;
  Node n = MakeNode("a");
  n.backward_seconds = 0.5;
  g.AddNode(n);
  for (const double bad : {std::nan(""), -0.1, 0.6}) {
    g.set_update_seconds(bad);
    const absl::Status s = g.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("update_seconds"), std::string::npos) << s;
  }
  g.set_update_seconds(0.5);
  EXPECT_TRUE(g.Validate().ok());
  // A predicting stage's extra: finite, >= 0, at most twice the update.
  for (const double bad : {std::nan(""), -0.1, 1.1}) {
    g.set_update_prediction_seconds(bad);
    const absl::Status s = g.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("update_prediction_seconds"), std::string::npos) << s;
  }
  g.set_update_prediction_seconds(1.0);
  EXPECT_TRUE(g.Validate().ok());
}

}  // namespace
}  // namespace partitioner
}  // namespace apapo
