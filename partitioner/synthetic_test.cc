#include "partitioner/synthetic.h"

#include "gtest/gtest.h"
#include "partitioner/pipedream_format.h"

namespace apapo {
namespace partitioner {
namespace {

// Nodes every path runs through (comparable with all others).
int CountTrunkNodes(const Graph& g) {
  const int n = g.num_nodes();
  int trunk = 0;
  for (int v = 0; v < n; ++v) {
    std::vector<bool> seen(n, false);
    int related = 0;
    for (bool forward : {true, false}) {
      std::vector<int> stack = {v};
      while (!stack.empty()) {
        const int x = stack.back();
        stack.pop_back();
        for (int y : forward ? g.successors(x) : g.predecessors(x)) {
          if (!seen[y]) {
            seen[y] = true;
            ++related;
            stack.push_back(y);
          }
        }
      }
    }
    trunk += related + 1 == n;
  }
  return trunk;
}

TEST(SyntheticTest, NasNetIsAWideValidDagOfAbout900Nodes) {
  const Graph g = SyntheticNasNet(1);
  ASSERT_TRUE(g.Validate().ok()) << g.Validate();
  EXPECT_GT(g.num_nodes(), 800);
  EXPECT_LT(g.num_nodes(), 1000);
  // Only the source, the stem, the last cell's output and the head are on
  // every path.
  EXPECT_EQ(CountTrunkNodes(g), 7);
  int concats = 0, feeding_two_cells = 0;
  for (const Node& n : g.nodes()) {
    EXPECT_GT(n.activation_bytes, 0) << n.id;
    if (n.description == "Concat") {
      ++concats;
      feeding_two_cells += g.successors(g.FindNode(n.id)).size() == 2;
    }
  }
  EXPECT_EQ(concats, 15);
  EXPECT_EQ(feeding_two_cells, 13);  // all but the last two cells' outputs
}

TEST(SyntheticTest, LayeredDagHasWideCuts) {
  const Graph g = SyntheticLayeredDag(2000, 7);
  ASSERT_TRUE(g.Validate().ok()) << g.Validate();
  EXPECT_EQ(g.num_nodes(), 2000);
  EXPECT_EQ(CountTrunkNodes(g), 2);  // the source and the sink
  int sources = 0, sinks = 0;
  for (int v = 0; v < g.num_nodes(); ++v) {
    sources += g.predecessors(v).empty();
    sinks += g.successors(v).empty();
  }
  EXPECT_EQ(sources, 1);
  EXPECT_EQ(sinks, 1);
}

TEST(SyntheticTest, SameSeedSameGraph) {
  EXPECT_EQ(FormatPipeDreamGraph(SyntheticNasNet(3)),
            FormatPipeDreamGraph(SyntheticNasNet(3)));
  EXPECT_NE(FormatPipeDreamGraph(SyntheticNasNet(3)),
            FormatPipeDreamGraph(SyntheticNasNet(4)));
  EXPECT_EQ(FormatPipeDreamGraph(SyntheticLayeredDag(500, 3)),
            FormatPipeDreamGraph(SyntheticLayeredDag(500, 3)));
}

}  // namespace
}  // namespace partitioner
}  // namespace apapo
