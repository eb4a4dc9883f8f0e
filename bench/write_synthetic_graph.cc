// Writes a synthetic layer graph (partitioner/synthetic.h) in PipeDream's
// graph.txt format, to reproduce planner cases with apapo-partition:
//
//   bazel run //bench:write_synthetic_graph -- nasnet 1 > /tmp/nasnet.txt
//   bazel run //bench:write_synthetic_graph -- layered 2000 7 > /tmp/l2000.txt
//   apapo-partition --profile=/tmp/nasnet.txt --cost-model=pipedream --workers=4

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "partitioner/pipedream_format.h"
#include "partitioner/synthetic.h"

int main(int argc, char** argv) {
  namespace pt = apapo::partitioner;
  const std::string kind = argc > 1 ? argv[1] : "";
  uint64_t seed = 1;
  int n = 2000;
  pt::Graph graph;
  if (kind == "nasnet" && argc == 3 && absl::SimpleAtoi(argv[2], &seed)) {
    graph = pt::SyntheticNasNet(seed);
  } else if (kind == "layered" && argc == 4 && absl::SimpleAtoi(argv[2], &n) &&
             n > 0 && absl::SimpleAtoi(argv[3], &seed)) {
    graph = pt::SyntheticLayeredDag(n, seed);
  } else {
    std::fprintf(stderr,
                 "usage: write_synthetic_graph nasnet SEED | layered N SEED\n");
    return 2;
  }
  const std::string text = pt::FormatPipeDreamGraph(graph);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}
