#include "partitioner/synthetic.h"

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

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

// Builds a NASNet-style graph node by node. Costs follow a GPU roughly:
// convolutions at kFlops, element-wise layers at kBytesPerSecond of memory
// traffic, each jittered by +-20%; the backward pass takes 1.5x-2.5x the
// forward one. A batch of kBatch float32 samples.
class NasNetBuilder {
 public:
  explicit NasNetBuilder(uint64_t seed) : rng_(seed) {}

  // Element-wise layer (ReLU, BatchNorm, pooling, Add, Concat) over `inputs`.
  int Elementwise(const std::string& description, const std::vector<int>& inputs,
                  double params = 0) {
    return Add(description, inputs, Activation(), params,
               Activation() * (inputs.size() + 1) / kBytesPerSecond);
  }
  // Convolution of `in_channels` -> channels() channels, `k` x `k` kernel,
  // depthwise when `depthwise`.
  int Conv(const std::string& description, int input, int in_channels, int k,
           bool depthwise) {
    const double spatial = kBatch * size_ * size_;
    const double macs = depthwise ? spatial * channels_ * k * k
                                  : spatial * channels_ * in_channels * k * k;
    const double params =
        4.0 * (depthwise ? channels_ * k * k : channels_ * in_channels * k * k);
    const double seconds = std::max(2 * macs / kFlops,
                                    2 * Activation() / kBytesPerSecond);
    return Add(description, {input}, Activation(), params, seconds);
  }

  int Add(const std::string& description, const std::vector<int>& inputs,
          double activation, double params, double forward_seconds) {
    std::uniform_real_distribution<double> jitter(0.8, 1.2);
    std::uniform_real_distribution<double> backward(1.5, 2.5);
    Node n;
    n.id = absl::StrCat("node", graph_.num_nodes());
    n.description = description;
    n.forward_seconds = forward_seconds * jitter(rng_);
    n.backward_seconds = n.forward_seconds * backward(rng_);
    n.activation_bytes = activation;
    n.parameter_bytes = params;
    const int v = graph_.AddNode(std::move(n));
    std::set<int> distinct(inputs.begin(), inputs.end());
    for (int p : distinct) (void)graph_.AddEdge(p, v);
    return v;
  }

  double Activation() const { return 4.0 * kBatch * channels_ * size_ * size_; }
  int channels() const { return channels_; }
  void Reduce() {
    channels_ *= 2;
    size_ = std::max(1, size_ / 2);
  }
  std::mt19937_64& rng() { return rng_; }
  Graph Take() { return std::move(graph_); }

 private:
  static constexpr double kBatch = 32;
  static constexpr double kFlops = 10e12;
  static constexpr double kBytesPerSecond = 500e9;
  std::mt19937_64 rng_;
  Graph graph_;
  int channels_ = 168;
  int size_ = 42;
};

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

Graph SyntheticNasNet(uint64_t seed, int cells, int branches) {
  NasNetBuilder b(seed);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  const int input = b.Add("Input", {}, b.Activation() / 8, 0, 0);
  const int stem_conv =
      b.Conv("Conv2d(3, 168, kernel_size=(3, 3), stride=(2, 2))", input, 3, 3,
             false);
  const int stem = b.Elementwise("BatchNorm2d(168)", {stem_conv},
                                 8.0 * b.channels());
  int prev = stem, prev_prev = stem;
  int prev_channels = b.channels(), prev_prev_channels = b.channels();
  for (int c = 0; c < cells; ++c) {
    const bool reduction = c % 3 == 2;
    // Squares an input to this cell's channel count.
    auto square = [&](int from, int from_channels) {
      const int relu = b.Elementwise("ReLU", {from});
      const int conv = b.Conv(
          absl::StrCat("Conv2d(", from_channels, ", ", b.channels(),
                       ", kernel_size=(1, 1))"),
          relu, from_channels, 1, false);
      return b.Elementwise(absl::StrCat("BatchNorm2d(", b.channels(), ")"),
                           {conv}, 8.0 * b.channels());
    };
    const int a = square(prev, prev_channels);
    const int d = square(prev_prev, prev_prev_channels);
    if (reduction) b.Reduce();
    std::vector<int> hidden = {a, d};
    std::vector<int> sums;
    for (int pair = 0; pair * 2 < branches; ++pair) {
      std::vector<int> ends;
      for (int q = 0; q < 2 && pair * 2 + q < branches; ++q) {
        // Mostly one of the cell's two inputs, sometimes an earlier sum.
        std::uniform_int_distribution<int> pick(0, hidden.size() - 1);
        int x = coin(b.rng()) < 0.8 ? hidden[coin(b.rng()) < 0.5 ? 0 : 1]
                                    : hidden[pick(b.rng())];
        const double op = coin(b.rng());
        if (op < 0.55) {
          const int k = coin(b.rng()) < 0.5 ? 3 : 5;
          for (int rep = 0; rep < 2; ++rep) {
            x = b.Elementwise("ReLU", {x});
            x = b.Conv(absl::StrCat("Conv2d(", b.channels(), ", ", b.channels(),
                                    ", kernel_size=(", k, ", ", k,
                                    "), groups=", b.channels(), ")"),
                       x, b.channels(), k, true);
            x = b.Conv(absl::StrCat("Conv2d(", b.channels(), ", ", b.channels(),
                                    ", kernel_size=(1, 1))"),
                       x, b.channels(), 1, false);
            x = b.Elementwise(absl::StrCat("BatchNorm2d(", b.channels(), ")"),
                              {x}, 8.0 * b.channels());
          }
        } else if (op < 0.85) {
          x = b.Elementwise(coin(b.rng()) < 0.5 ? "AvgPool2d(3)" : "MaxPool2d(3)",
                            {x});
        }  // else identity: the branch's input goes straight to the sum
        ends.push_back(x);
      }
      const int sum = b.Elementwise("Add", ends);
      sums.push_back(sum);
      hidden.push_back(sum);
    }
    const int out_channels = b.channels() * static_cast<int>(sums.size());
    const int concat = b.Add("Concat", sums, b.Activation() * sums.size(), 0,
                             b.Activation() * sums.size() * 2 / 500e9);
    prev_prev = prev;
    prev_prev_channels = prev_channels;
    prev = concat;
    prev_channels = out_channels;
  }
  const int relu = b.Elementwise("ReLU", {prev});
  const int pool = b.Add("AdaptiveAvgPool2d(1)", {relu}, 4.0 * 32 * prev_channels,
                         0, 1e-4);
  b.Add(absl::StrCat("Linear(", prev_channels, ", 1000)"), {pool}, 4.0 * 32 * 1000,
        4.0 * prev_channels * 1000, 2.0 * 32 * prev_channels * 1000 / 10e12);
  return b.Take();
}

Graph SyntheticLayeredDag(int n, uint64_t seed, int width) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  width = std::max(1, width);
  Graph g;
  g.AddNode(RandomNode(0, rng));
  std::vector<int> before = {}, previous = {0};
  std::uniform_int_distribution<int> layer_size(std::max(1, width * 3 / 4),
                                                std::max(1, width * 5 / 4));
  while (g.num_nodes() < n - 1) {
    const int size = std::min(layer_size(rng), n - 1 - g.num_nodes());
    std::vector<int> layer;
    std::vector<bool> used(previous.size(), false);
    std::uniform_int_distribution<int> fan(1, 3);
    std::uniform_int_distribution<int> pick(0, previous.size() - 1);
    for (int q = 0; q < size; ++q) {
      const int v = g.AddNode(RandomNode(g.num_nodes(), rng));
      std::set<int> inputs;
      const int k = std::min<int>(fan(rng), previous.size());
      while (static_cast<int>(inputs.size()) < k) {
        const int p = pick(rng);
        used[p] = true;
        inputs.insert(previous[p]);
      }
      if (!before.empty() && coin(rng) < 0.25) {
        std::uniform_int_distribution<int> skip(0, before.size() - 1);
        inputs.insert(before[skip(rng)]);
      }
      for (int p : inputs) (void)g.AddEdge(p, v);
      layer.push_back(v);
    }
    // Every node of the previous layer feeds this one.
    std::uniform_int_distribution<int> to(0, layer.size() - 1);
    for (size_t p = 0; p < previous.size(); ++p) {
      if (used[p]) continue;
      const int v = layer[to(rng)];
      bool present = false;
      for (int s : g.successors(previous[p])) present |= s == v;
      if (!present) (void)g.AddEdge(previous[p], v);
    }
    before = std::move(previous);
    previous = std::move(layer);
  }
  if (n > 1) {
    const int sink = g.AddNode(RandomNode(g.num_nodes(), rng));
    for (int p : previous) (void)g.AddEdge(p, sink);
  }
  return g;
}

}  // namespace partitioner
}  // namespace apapo
