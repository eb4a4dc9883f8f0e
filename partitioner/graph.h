// Layer graph of a model: the partitioner's input. Nodes are layers with
// their profiled costs (seconds per mini-batch, bytes); edges carry a layer's
// output activation to its consumers.
//
// Thread-safety: a Graph is a value type. Const methods may be called from
// several threads at once; mutation needs external synchronisation.
//
// Call order: AddNode / AddEdge freely, then Validate() once before handing
// the graph to the optimizer (which assumes a valid DAG).

#ifndef APAPO_PARTITIONER_GRAPH_H_
#define APAPO_PARTITIONER_GRAPH_H_

#include <string>
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace apapo {
namespace partitioner {

struct Node {
  std::string id;           // as written in the input (e.g. "node17")
  std::string description;  // e.g. "Conv2d(64, 96, ...)"; may be empty
  double forward_seconds = 0;
  double backward_seconds = 0;
  double activation_bytes = 0;  // output activation, per mini-batch
  double parameter_bytes = 0;
  // Share of the output's values that are not zero, for a node whose zeros
  // do not cross a cut (a ReLU's: profile.proto's nonzero_share); 0: every
  // value crosses.
  double nonzero_share = 0;
  // NodeProfile.weight_gradients_after_send: half the backward runs after
  // a split backward's send (StagePlan::backward_weight_seconds).
  bool weights_after_send = false;
  // NodeProfile.weight_gradients_in_product: with a split backward, its
  // later micro-batches' weight gradients cost no add (StagePlan::
  // accumulate_seconds leaves its parameter_bytes out).
  bool weights_in_product = false;
  int line = 0;  // source line in the input file, 0 if unknown

  double compute_seconds() const { return forward_seconds + backward_seconds; }
  // What a split backward computes after its send, per mini-batch as
  // profiled: half the backward of a node whose weight gradients follow it
  // (its weight gradient is one product the size of its input gradient's).
  double weight_gradient_seconds() const {
    return weights_after_send ? 0.5 * backward_seconds : 0.0;
  }
  // The float32 bytes a cut after this node is charged, before dividing
  // by the wire's compression ratio `rho`: the nonzero values and one bit
  // per value for their mask (which does not shrink with the precision),
  // never above the whole output.
  double cut_bytes(double rho) const {
    if (!(nonzero_share > 0)) return activation_bytes;
    return activation_bytes * std::min(1.0, nonzero_share + rho / 32.0);
  }
};

struct Edge {
  int from = 0;
  int to = 0;
  int line = 0;  // source line, 0 if unknown
};

class Graph {
 public:
  // Appends a node and returns its index. Duplicate ids are accepted here and
  // reported by Validate(), so a parser can report every problem by line.
  int AddNode(Node node);
  // Adds an edge between node indices; out-of-range indices fail.
  absl::Status AddEdge(int from, int to, int line = 0);

  // Checks: non-empty, unique non-empty ids, finite non-negative costs,
  // no self-loops or repeated edges, acyclic. On failure the message names the
  // node or edge and, when `error_line` is non-null, receives its source line
  // (0 if unknown).
  absl::Status Validate(int* error_line = nullptr) const;

  // Kahn order, ties broken by insertion order (deterministic). Fails on a
  // cycle.
  absl::StatusOr<std::vector<int>> TopologicalOrder() const;

  // Index of the node with this id, or -1.
  int FindNode(absl::string_view id) const;

  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  const Node& node(int i) const { return nodes_[i]; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Edge>& edges() const { return edges_; }
  const std::vector<int>& successors(int i) const { return succ_[i]; }
  const std::vector<int>& predecessors(int i) const { return pred_[i]; }

  // The optimizer's update of all the parameters, per mini-batch, counted
  // in the nodes' backward_seconds in proportion to their parameter_bytes
  // (ModelProfile.update_seconds); 0 when unknown. Validate() checks it is
  // finite, >= 0 and no more than the nodes' backward seconds.
  double update_seconds() const { return update_seconds_; }
  void set_update_seconds(double seconds) { update_seconds_ = seconds; }
  // What the update of all the parameters costs on top of update_seconds
  // where a stage predicts its weights (ModelProfile.
  // update_prediction_seconds; async stages but the last, PlannerOptions::
  // weight_prediction); not in the nodes' figures; 0 when unknown.
  // Validate() checks it is finite, >= 0 and at most
  // kMaxPredictionOverUpdate times update_seconds.
  double update_prediction_seconds() const { return update_prediction_seconds_; }
  void set_update_prediction_seconds(double seconds) {
    update_prediction_seconds_ = seconds;
  }
  static constexpr double kMaxPredictionOverUpdate = 2;

  // Compute per sample at `rows` rows per micro-batch as a multiple of the
  // nodes' figures (ModelProfile.micro_batch_costs): (rows, scale) pairs,
  // rows ascending. MicroBatchScale interpolates in log2(rows) and holds
  // the end values beyond them; 1 without any. Validate() checks rows >= 1
  // ascending and each scale finite in [kMinMicroBatchScale,
  // kMaxMicroBatchScale].
  static constexpr double kMinMicroBatchScale = 0.25;
  static constexpr double kMaxMicroBatchScale = 8;
  const std::vector<std::pair<double, double>>& micro_batch_costs() const {
    return micro_batch_costs_;
  }
  void set_micro_batch_costs(std::vector<std::pair<double, double>> costs) {
    micro_batch_costs_ = std::move(costs);
  }
  double MicroBatchScale(double rows) const;
  // Seconds per parameter byte to accumulate a micro-batch's gradients
  // (ModelProfile.accumulate_seconds_per_byte); 0 when unknown. Validate()
  // checks it is finite, >= 0 and at most kMaxAccumulateSecondsPerByte.
  static constexpr double kMaxAccumulateSecondsPerByte = 1e-6;
  double accumulate_seconds_per_byte() const { return accumulate_seconds_per_byte_; }
  void set_accumulate_seconds_per_byte(double s) { accumulate_seconds_per_byte_ = s; }

  double TotalComputeSeconds() const;
  double TotalParameterBytes() const;
  // Per node: its parameter_bytes where its weight gradient is one product
  // (weights_in_product) and a parameter-holding node precedes it, else 0.
  // On a first stage those nodes' all-reduce parts start in pass 1, which
  // runs through them (AllReduceWindowSeconds); all zeros on a cycle.
  std::vector<double> PassOneProductBytes() const;

 private:
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<std::vector<int>> succ_;
  std::vector<std::vector<int>> pred_;
  absl::flat_hash_map<std::string, int> index_;  // first node with each id
  double update_seconds_ = 0;
  double update_prediction_seconds_ = 0;
  std::vector<std::pair<double, double>> micro_batch_costs_;
  double accumulate_seconds_per_byte_ = 0;
};

// The parameter bytes of `nodes` whose later micro-batches' gradients are
// added into the first's by an add of their own: all of them, or with a
// split backward those of the nodes not Node::weights_in_product.
double AddedGradientBytes(const Graph& graph, const std::vector<int>& nodes,
                          bool split_backward);

}  // namespace partitioner
}  // namespace apapo

#endif  // APAPO_PARTITIONER_GRAPH_H_
