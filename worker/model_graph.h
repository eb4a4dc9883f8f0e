// Layer graphs without LibTorch: the built-in networks as ModelGraph protos,
// validation, topological order, shape and cost inference, and the layout of
// pipeline stages (which tensors cross each cut, in which order).
//
// Everything here is pure C++ over protos so that planning, the launcher and
// the shape checks build and test without a LibTorch translation unit; the
// torch side (model_builder.h) consumes an AnalyzedGraph.
//
// What each layer kind accepts and how its shapes, parameters and cost are
// inferred is not here but in one table, layer_kinds.h/.cc (a new kind is an
// entry there plus its kernel in model_builder.cc).
//
// Thread-safety: free functions are thread-safe; AnalyzedGraph and
// StageLayout are immutable values after construction.

#ifndef APAPO_WORKER_MODEL_GRAPH_H_
#define APAPO_WORKER_MODEL_GRAPH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/apapo/v1/job.pb.h"
#include "proto/apapo/v1/model.pb.h"

namespace apapo {
namespace worker {

// The shape of one sample (no batch dimension).
using Shape = std::vector<int64_t>;
std::string ShapeToString(const Shape& shape);

enum class DType { kFloat32, kInt64 };
absl::string_view DTypeName(DType dtype);

// What the data source feeds the graph: one input tensor and the labels.
struct DataShape {
  Shape sample_shape;       // e.g. {1, 28, 28}
  DType sample_dtype = DType::kFloat32;
  int64_t num_classes = 0;  // classes (or vocabulary size for LMs)
};

// The sample shape a job's data yields (Fashion-MNIST {1,28,28}/10 classes,
// text {context} int64 tokens/256, synthetic as given).
absl::StatusOr<DataShape> DataShapeForJob(const apapo::v1::DataSpec& data);

// A built-in network as a layer graph. Hyper-parameters (missing ones take
// these defaults):
//   mlp: hidden (2048), layers (4 hidden layers), dropout (0).
//   cnn: the PyTorch MNIST example: conv 32 (conv1) - conv 64 (conv2) -
//        maxpool - dropout (dropout1, 0.25) - fc 128 (fc1) - dropout
//        (dropout2, 0.5) - fc classes.
//   resnet: width (16), blocks (2 basic blocks per width, two widths, the
//        second with a strided 1x1 projection shortcut).
//   transformer_lm: layers (2), d_model (128), heads (4), mlp_ratio (4).
//        Context and vocabulary come from the data shape.
// A model that reads a key its BuiltinHyperParameters() entry does not list
// fails with INTERNAL naming it (model_graph_test builds every model).
absl::StatusOr<apapo::v1::ModelGraph> BuiltinGraph(
    const apapo::v1::BuiltinModel& model, const DataShape& data);

// The hyper-parameters each built-in model reads, by model name: what the
// coordinator lets spec.model.builtin.hyper_parameters set (integers >= 1;
// keys starting with "dropout" are probabilities in [0, 1)).
const std::map<std::string, std::set<std::string>>& BuiltinHyperParameters();

// Builds the graph of a TorchScript model for data of shape `data`. Loading
// TorchScript needs LibTorch, so callers that have it pass one in
// (TorchScriptGraph in torchscript_model.h) and this library stays torch-free.
using TorchScriptImporter = std::function<absl::StatusOr<apapo::v1::ModelGraph>(
    const apapo::v1::TorchScriptModel& model, const DataShape& data)>;

// The graph a job trains: built-in, given, or imported from TorchScript with
// `torchscript` (without one, a TorchScript spec is UNIMPLEMENTED).
absl::StatusOr<apapo::v1::ModelGraph> GraphForJob(
    const apapo::v1::JobSpec& spec,
    const TorchScriptImporter& torchscript = nullptr);

// Applies a plan's layer splits (proto/apapo/v1/plan.proto, LayerSplit):
// each named LINEAR node becomes `parts` Linear nodes "<id>/0".. on the same
// input plus a CONCAT that keeps the id, so consumers are unchanged and the
// network computes the same function. Errors (INVALID_ARGUMENT) name the
// split: an unknown node, a node that is not Linear, parts < 2 or more parts
// than output features, a node split twice.
absl::StatusOr<apapo::v1::ModelGraph> SplitLinearLayers(
    apapo::v1::ModelGraph graph,
    const std::vector<std::pair<std::string, int>>& splits);

// Whether a split backward (ScheduleSpec.split_backward) takes this kind's
// weight gradients after the send of the input gradients, from its
// output's gradient alone: one operation lies between its parameters and
// its output (Linear, Conv2d, BatchNorm2d, Embedding, LayerNorm). Other
// kinds with parameters (a transformer block, a TorchScript child) would
// repeat their inner input gradients on that path, so their weight
// gradients come with the input gradients, before the send.
bool WeightGradientsAfterSend(apapo::v1::LayerKind kind);

// Rows [begin, end) of a tensor's first dimension.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The output features part `part` of a Linear of `width` features split in
// `parts` holds (SplitLinearLayers' partition: contiguous, the first
// width % parts parts one feature wider). 0 <= part < parts <= width.
RowRange SplitPartRows(int64_t width, int parts, int part);


// A parameter tensor of a node, in the order the node's kernel expects it.
struct ParamInfo {
  std::string name;  // "weight", "bias", "qkv.weight", ...
  Shape shape;
  // Init bound for U(-bound, bound); NaN-free. <0 means a constant (see
  // `fill`): LayerNorm/BatchNorm weights are 1, their biases 0. Unused for
  // TorchScript children, whose initial values come from their file.
  double bound = 0.0;
  double fill = 0.0;
};

// One node after validation and shape inference.
struct NodeInfo {
  const apapo::v1::LayerNode* node = nullptr;  // points into the graph
  std::vector<int> inputs;                     // indices into nodes
  std::vector<int> consumers;
  Shape out_shape;
  DType out_dtype = DType::kFloat32;
  std::vector<ParamInfo> params;
  int64_t num_params = 0;
  // Forward multiply-accumulates (or element operations) per sample.
  int64_t forward_ops = 0;

  const std::string& id() const { return node->id(); }
  apapo::v1::LayerKind kind() const { return node->kind(); }
};

// Whether a split backward adds `node`'s weight gradient into the
// mini-batch's inside its product: a Linear on rows (per-sample output
// of rank 1), whose weight gradient is output_grad^T input
// (NodeProfile.weight_gradients_in_product; stage_executor.cc).
bool WeightGradientsInProduct(const NodeInfo& node);

// A validated graph with nodes in a topological order.
class AnalyzedGraph {
 public:
  // Validates `graph` (unique ids, known inputs, acyclic, exactly one INPUT
  // and one CROSS_ENTROPY_LOSS sink, known kinds and attributes) and infers
  // every node's output shape (through layer_kinds.h). Errors are
  // INVALID_ARGUMENT naming the node, unknown kinds included; shape
  // mismatches name the node and both shapes.
  static absl::StatusOr<AnalyzedGraph> Create(apapo::v1::ModelGraph graph);

  const apapo::v1::ModelGraph& graph() const { return *graph_; }
  // Topological order (stable: ties keep the proto's order).
  const std::vector<NodeInfo>& nodes() const { return nodes_; }
  int IndexOf(absl::string_view id) const;  // -1 when unknown
  int input_index() const { return input_index_; }
  int loss_index() const { return loss_index_; }
  // Per-sample label shape the loss expects ({} or {T}).
  const Shape& label_shape() const { return label_shape_; }
  int64_t num_params() const;

 private:
  AnalyzedGraph() = default;
  // Shared and immutable so NodeInfo::node stays valid across copies.
  std::shared_ptr<const apapo::v1::ModelGraph> graph_;
  std::vector<NodeInfo> nodes_;
  absl::flat_hash_map<std::string, int> index_;
  int input_index_ = -1;
  int loss_index_ = -1;
  Shape label_shape_;
};

// Where a node of a (possibly split) graph came from in the graph before
// SplitLinearLayers: the node `id` and, for a part "<id>/<j>" of a split
// Linear (recognised by its CONCAT "<id>" of parts "<id>/0".. whose widths
// are SplitPartRows'), the rows of the whole Linear's output features it
// holds; those are the rows of each of its parameters (weight and bias).
struct NodeOrigin {
  std::string id;
  bool is_part = false;
  RowRange rows;           // parts only
  int64_t total_rows = 0;  // parts only: the whole Linear's out_features
};
NodeOrigin OriginOf(const AnalyzedGraph& graph, int node_index);

// The name of the labels entry that travels with every cut's bundle.
inline constexpr absl::string_view kLabelsEntry = "__labels__";

// One tensor of the bundle that crosses a cut.
struct BundleEntry {
  std::string name;  // producing node id, or kLabelsEntry
  Shape sample_shape;
  DType dtype = DType::kFloat32;
  // A ReLU's output: no gradient flows back through its zeros, so it may
  // cross a cut without them (ScheduleSpec.skip_zeros; transport.h).
  bool skip_zeros = false;
};

// What one stage runs and what crosses its two cuts.
struct StageLayout {
  int index = 0;
  std::vector<int> nodes;            // graph node indices, topological
  std::vector<BundleEntry> inputs;   // empty for stage 0 (it reads data)
  std::vector<BundleEntry> outputs;  // empty for the last stage
  bool is_first = false;
  bool is_last = false;
  int64_t num_params = 0;
  int64_t forward_ops = 0;
};

// Lays out the stages given each stage's node ids. Every node must belong to
// exactly one stage, the INPUT node to stage 0, the loss to the last stage,
// and no node may consume a later stage's output. A tensor needed by a later
// stage passes through the stages in between (it is part of each cut's
// bundle), as are the labels.
absl::StatusOr<std::vector<StageLayout>> LayoutStages(
    const AnalyzedGraph& graph,
    const std::vector<std::vector<std::string>>& stage_nodes);

// Splits the topological order into `num_stages` contiguous pieces that
// minimise the largest per-stage forward cost (a stand-in until the
// partitioner's planner is wired in). Returns node ids per stage.
absl::StatusOr<std::vector<std::vector<std::string>>> BalancedSplit(
    const AnalyzedGraph& graph, int num_stages);

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_MODEL_GRAPH_H_
