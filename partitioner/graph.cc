#include "partitioner/graph.h"

#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace apapo {
namespace partitioner {

int Graph::AddNode(Node node) {
  const int index = num_nodes();
  index_.emplace(node.id, index);  // keeps the first on duplicates
  nodes_.push_back(std::move(node));
  succ_.emplace_back();
  pred_.emplace_back();
  return index;
}

absl::Status Graph::AddEdge(int from, int to, int line) {
  if (from < 0 || from >= num_nodes() || to < 0 || to >= num_nodes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("edge ", from, " -> ", to, " names a missing node"));
  }
  edges_.push_back(Edge{from, to, line});
  succ_[from].push_back(to);
  pred_[to].push_back(from);
  return absl::OkStatus();
}

int Graph::FindNode(absl::string_view id) const {
  auto it = index_.find(id);
  return it == index_.end() ? -1 : it->second;
}

absl::Status Graph::Validate(int* error_line) const {
  auto fail = [error_line](int line, std::string message) {
    if (error_line != nullptr) *error_line = line;
    return absl::InvalidArgumentError(std::move(message));
  };
  if (error_line != nullptr) *error_line = 0;
  if (nodes_.empty()) return fail(0, "empty graph: no nodes");
  absl::flat_hash_map<absl::string_view, int> seen;
  for (const Node& n : nodes_) {
    if (n.id.empty()) return fail(n.line, "node with an empty id");
    auto [it, inserted] = seen.emplace(n.id, n.line);
    if (!inserted) {
      return fail(n.line, absl::StrCat("duplicate node '", n.id,
                                       "' (first defined on line ",
                                       it->second, ")"));
    }
    const std::pair<const char*, double> fields[] = {
        {"forward_compute_time", n.forward_seconds},
        {"backward_compute_time", n.backward_seconds},
        {"activation_size", n.activation_bytes},
        {"parameter_size", n.parameter_bytes}};
    for (const auto& [name, value] : fields) {
      if (!std::isfinite(value) || value < 0) {
        return fail(n.line, absl::StrCat("node '", n.id, "': ", name,
                                         " must be finite and >= 0, got ",
                                         value));
      }
    }
  }
  double backward = 0;
  for (const Node& n : nodes_) backward += n.backward_seconds;
  if (!std::isfinite(update_seconds_) || update_seconds_ < 0 ||
      update_seconds_ > backward * (1 + 1e-9)) {
    return fail(0, absl::StrCat(
                       "update_seconds must be finite, >= 0 and within the "
                       "nodes' backward seconds (",
                       backward, ") it is part of, got ", update_seconds_));
  }
  if (!std::isfinite(update_prediction_seconds_) || update_prediction_seconds_ < 0 ||
      update_prediction_seconds_ > kMaxPredictionOverUpdate * update_seconds_) {
    return fail(0, absl::StrCat("update_prediction_seconds must be finite, >= 0 "
                                "and at most ", kMaxPredictionOverUpdate,
                                "x update_seconds (", update_seconds_, "), got ",
                                update_prediction_seconds_));
  }
  for (size_t i = 0; i < micro_batch_costs_.size(); ++i) {
    const auto& [rows, scale] = micro_batch_costs_[i];
    if (!std::isfinite(rows) || rows < 1 ||
        (i > 0 && rows <= micro_batch_costs_[i - 1].first)) {
      return fail(0, absl::StrCat("micro_batch_costs[", i,
                                  "].rows must be >= 1 and ascending, got ", rows));
    }
    if (!std::isfinite(scale) || scale < kMinMicroBatchScale ||
        scale > kMaxMicroBatchScale) {
      return fail(0, absl::StrCat("micro_batch_costs[", i, "].scale must be in [",
                                  kMinMicroBatchScale, ", ", kMaxMicroBatchScale,
                                  "], got ", scale));
    }
  }
  if (!std::isfinite(accumulate_seconds_per_byte_) || accumulate_seconds_per_byte_ < 0 ||
      accumulate_seconds_per_byte_ > kMaxAccumulateSecondsPerByte) {
    return fail(0, absl::StrCat("accumulate_seconds_per_byte must be in [0, ",
                                kMaxAccumulateSecondsPerByte, "], got ",
                                accumulate_seconds_per_byte_));
  }
  absl::flat_hash_set<std::pair<int, int>> edge_set;
  for (const Edge& e : edges_) {
    if (e.from == e.to) {
      return fail(e.line, absl::StrCat("self-loop on node '",
                                       nodes_[e.from].id, "'"));
    }
    if (!edge_set.insert({e.from, e.to}).second) {
      return fail(e.line, absl::StrCat("repeated edge '", nodes_[e.from].id,
                                       " -- ", nodes_[e.to].id, "'"));
    }
  }
  absl::StatusOr<std::vector<int>> order = TopologicalOrder();
  if (!order.ok()) {
    // Report an edge between two nodes left on the cycle.
    std::vector<bool> placed(nodes_.size(), false);
    std::vector<int> indegree(nodes_.size(), 0);
    for (const Edge& e : edges_) ++indegree[e.to];
    std::vector<int> ready;
    for (int i = 0; i < num_nodes(); ++i) {
      if (indegree[i] == 0) ready.push_back(i);
    }
    while (!ready.empty()) {
      const int v = ready.back();
      ready.pop_back();
      placed[v] = true;
      for (int w : succ_[v]) {
        if (--indegree[w] == 0) ready.push_back(w);
      }
    }
    for (const Edge& e : edges_) {
      if (!placed[e.from] && !placed[e.to]) {
        return fail(e.line, absl::StrCat("cycle through edge '",
                                         nodes_[e.from].id, " -- ",
                                         nodes_[e.to].id, "'"));
      }
    }
    return fail(0, "graph has a cycle");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> Graph::TopologicalOrder() const {
  std::vector<int> indegree(nodes_.size(), 0);
  for (const Edge& e : edges_) ++indegree[e.to];
  std::vector<int> order;
  order.reserve(nodes_.size());
  // A FIFO over insertion order keeps the order stable and readable.
  std::vector<int> queue;
  for (int i = 0; i < num_nodes(); ++i) {
    if (indegree[i] == 0) queue.push_back(i);
  }
  for (size_t head = 0; head < queue.size(); ++head) {
    const int v = queue[head];
    order.push_back(v);
    for (int w : succ_[v]) {
      if (--indegree[w] == 0) queue.push_back(w);
    }
  }
  if (order.size() != nodes_.size()) {
    return absl::InvalidArgumentError("graph has a cycle");
  }
  return order;
}

double Graph::MicroBatchScale(double rows) const {
  const auto& c = micro_batch_costs_;
  if (c.empty() || !(rows > 0)) return 1.0;
  if (rows <= c.front().first) return c.front().second;
  if (rows >= c.back().first) return c.back().second;
  size_t i = 1;
  while (c[i].first < rows) ++i;
  const double x0 = std::log2(c[i - 1].first), x1 = std::log2(c[i].first);
  const double t = (std::log2(rows) - x0) / (x1 - x0);
  return c[i - 1].second + t * (c[i].second - c[i - 1].second);
}

double Graph::TotalComputeSeconds() const {
  double total = 0;
  for (const Node& n : nodes_) total += n.compute_seconds();
  return total;
}

double Graph::TotalParameterBytes() const {
  double total = 0;
  for (const Node& n : nodes_) total += n.parameter_bytes;
  return total;
}

std::vector<double> Graph::PassOneProductBytes() const {
  std::vector<double> out(nodes_.size(), 0.0);
  absl::StatusOr<std::vector<int>> order = TopologicalOrder();
  if (!order.ok()) return out;
  std::vector<bool> after_params(nodes_.size(), false);
  for (int v : *order) {
    for (int p : pred_[v]) {
      if (after_params[p] || nodes_[p].parameter_bytes > 0) after_params[v] = true;
    }
    if (after_params[v] && nodes_[v].weights_in_product) out[v] = nodes_[v].parameter_bytes;
  }
  return out;
}

double AddedGradientBytes(const Graph& graph, const std::vector<int>& nodes,
                          bool split_backward) {
  double bytes = 0;
  for (int v : nodes) {
    const Node& n = graph.node(v);
    if (!(split_backward && n.weights_in_product)) bytes += n.parameter_bytes;
  }
  return bytes;
}

}  // namespace partitioner
}  // namespace apapo
