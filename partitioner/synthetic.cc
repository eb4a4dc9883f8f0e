#include "partitioner/synthetic.h"

#include <algorithm>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"

namespace apapo {
namespace partitioner {
namespace {

Node RandomNode(int i, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> ms(0.05, 5.0);
  std::uniform_real_distribution<double> mb(0.1, 20.0);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  Node n;
  n.id = absl::StrCat("node", i);
  n.description = "Synthetic";
  n.forward_seconds = ms(rng) / 1000.0;
  n.backward_seconds = 2 * n.forward_seconds;
  n.activation_bytes = mb(rng) * 1e6;
  n.parameter_bytes = coin(rng) < 0.5 ? 0.0 : mb(rng) * 1e6;
  return n;
}

}  // namespace

Graph SyntheticChain(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Graph g;
  for (int i = 0; i < n; ++i) {
    g.AddNode(RandomNode(i, rng));
    if (i > 0) (void)g.AddEdge(i - 1, i);
  }
  return g;
}

Graph SyntheticDag(int n, uint64_t seed, int max_fan_in, int window) {
  std::mt19937_64 rng(seed);
  Graph g;
  for (int i = 0; i < n; ++i) {
    g.AddNode(RandomNode(i, rng));
    if (i == 0) continue;
    std::uniform_int_distribution<int> fan(1, std::max(1, max_fan_in));
    const int lo = std::max(0, i - window);
    std::uniform_int_distribution<int> pick(lo, i - 1);
    std::set<int> inputs = {i - 1};  // keeps one source and a long spine
    const int k = fan(rng);
    while (static_cast<int>(inputs.size()) < std::min(k, i - lo)) {
      inputs.insert(pick(rng));
    }
    for (int p : inputs) (void)g.AddEdge(p, i);
  }
  return g;
}

}  // namespace partitioner
}  // namespace apapo
