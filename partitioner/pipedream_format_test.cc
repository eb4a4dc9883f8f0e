#include "partitioner/pipedream_format.h"

#include <string>

#include "gtest/gtest.h"
#include "partitioner/testdata.h"

namespace apapo {
namespace partitioner {
namespace {

constexpr char kGraph[] =
    "node1 -- Input0 -- forward_compute_time=0.000, "
    "backward_compute_time=0.000, activation_size=0.0, parameter_size=0.000\n"
    "node2 -- LSTM(2, 2) -- forward_compute_time=1.5, "
    "backward_compute_time=2.5, activation_size=[10.0; 20.0; 5.0], "
    "parameter_size=64.000 -- stage_id=1\n"
    "\tnode1 -- node2\n";

TEST(PipeDreamFormatTest, ParsesNodesEdgesListsAndStageIds) {
  absl::StatusOr<Graph> g = ParsePipeDreamGraph(kGraph, "g.txt");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->num_nodes(), 2);
  const Node& lstm = g->node(1);
  EXPECT_EQ(lstm.id, "node2");
  EXPECT_EQ(lstm.description, "LSTM(2, 2)");
  EXPECT_DOUBLE_EQ(lstm.forward_seconds, 0.0015);
  EXPECT_DOUBLE_EQ(lstm.backward_seconds, 0.0025);
  EXPECT_DOUBLE_EQ(lstm.activation_bytes, 35);
  EXPECT_DOUBLE_EQ(lstm.parameter_bytes, 64);
  EXPECT_EQ(lstm.line, 2);
  ASSERT_EQ(g->edges().size(), 1u);
  EXPECT_EQ(g->successors(0), std::vector<int>{1});
}

TEST(PipeDreamFormatTest, RoundTrips) {
  absl::StatusOr<Graph> g = ParsePipeDreamGraph(kGraph, "g.txt");
  ASSERT_TRUE(g.ok());
  absl::StatusOr<Graph> again =
      ParsePipeDreamGraph(FormatPipeDreamGraph(*g), "again.txt");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_DOUBLE_EQ(again->node(1).backward_seconds, 0.0025);
  EXPECT_EQ(again->edges().size(), 1u);
}

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<Graph> g = ParsePipeDreamGraph(text, "bad.txt");
  return g.ok() ? "" : std::string(g.status().message());
}

constexpr char kA[] =
    "a -- A -- forward_compute_time=1, backward_compute_time=1, "
    "activation_size=1, parameter_size=1\n";
constexpr char kB[] =
    "b -- B -- forward_compute_time=1, backward_compute_time=1, "
    "activation_size=1, parameter_size=1\n";

TEST(PipeDreamFormatTest, ErrorsNameFileLineAndReason) {
  EXPECT_EQ(ErrorOf(""), "bad.txt:0: empty graph: no nodes");
  EXPECT_EQ(ErrorOf(std::string(kA) + kB + "\ta -- c\n"),
            "bad.txt:3: dangling edge: no node 'c'");
  EXPECT_EQ(ErrorOf(std::string(kA) + kA),
            "bad.txt:2: duplicate node 'a' (first defined on line 1)");
  EXPECT_EQ(ErrorOf(std::string(kA) + kB + "\ta -- b\n\tb -- a\n")
                .substr(0, 10),
            "bad.txt:3:");
  EXPECT_NE(ErrorOf(std::string(kA) + kB + "\ta -- b\n\tb -- a\n").find("cycle"),
            std::string::npos);
  EXPECT_EQ(ErrorOf("a -- A -- forward_compute_time=-1, backward_compute_time=1, "
                    "activation_size=1, parameter_size=1\n"),
            "bad.txt:1: forward_compute_time '-1' is not a finite non-negative "
            "number");
  EXPECT_EQ(ErrorOf("a -- A -- forward_compute_time=x, backward_compute_time=1, "
                    "activation_size=1, parameter_size=1\n")
                .substr(0, 10),
            "bad.txt:1:");
  EXPECT_EQ(ErrorOf("a -- A -- forward_compute_time=nan, backward_compute_time=1, "
                    "activation_size=1, parameter_size=1\n")
                .substr(0, 10),
            "bad.txt:1:");
  EXPECT_EQ(ErrorOf("a -- A -- forward_compute_time=1, activation_size=1, "
                    "parameter_size=1\n"),
            "bad.txt:1: missing field backward_compute_time");
  EXPECT_EQ(ErrorOf(std::string(kA) + "\ta b\n"),
            "bad.txt:2: edge line must be '<TAB>nodeA -- nodeB'");
  EXPECT_EQ(ErrorOf("garbage\n"),
            "bad.txt:1: node line must be 'id -- description -- metrics'");
}

TEST(PipeDreamFormatTest, ReadsEveryRealProfile) {
  ASSERT_NE(ProfilesDir(), "") << "set APAPO_PROFILES_DIR";
  for (const std::string& name : ProfileNames()) {
    absl::StatusOr<Graph> g = ReadPipeDreamGraph(ProfilePath(name));
    ASSERT_TRUE(g.ok()) << name << ": " << g.status();
    EXPECT_GT(g->num_nodes(), 20) << name;
  }
  EXPECT_FALSE(ReadPipeDreamGraph("/nonexistent/graph.txt").ok());
}

}  // namespace
}  // namespace partitioner
}  // namespace apapo
