// Turns the nodes of one pipeline stage (an AnalyzedGraph plus a StageLayout)
// into LibTorch computations.
//
// Each layer kind's kernel (the settings it reads from its node once, and its
// forward computation) is one entry of a table in model_builder.cc; a new
// kind adds its entry there next to the graph library's (layer_kinds.h), and
// model_builder_test fails while either table lacks a kind the other has.
//
// Parameters are NOT owned by the model: Forward() takes them as an explicit
// list of tensors. That is what makes weight stashing exact and cheap: a
// weight version is just a std::vector<at::Tensor>, an in-flight micro-batch
// keeps the list its forward used (its autograd graph references those
// tensors), and an update produces new tensors instead of writing in place.
// Non-trainable buffers (BatchNorm running statistics) are owned by the model
// and updated in place.
//
// Initialisation is seeded per node (seed, node id), so a node's initial
// weights are the same whichever stage or process runs it; a pipeline and a
// single-process model built from the same graph and seed start identical.
// TorchScript children (torchscript_model.h) start from their file's values
// and keep their buffers in the loaded module.
//
// Thread-safety: Create/InitParameters are thread-safe; Forward mutates
// buffers and must be called from one thread at a time.

#ifndef APAPO_WORKER_MODEL_BUILDER_H_
#define APAPO_WORKER_MODEL_BUILDER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model_graph.h"

namespace apapo {
namespace worker {

// What a stage's forward pass produced.
struct StageForward {
  // Non-last stages: one tensor per layout.outputs entry (labels included).
  std::vector<at::Tensor> outputs;
  // Last stage: mean cross-entropy of the micro-batch, the logits and labels.
  at::Tensor loss;
  at::Tensor logits;
  at::Tensor labels;
  // With keep_param_outputs: the output of every node with parameters
  // whose kind WeightGradientsAfterSend, and its range of `params`, in node
  // order (a split backward takes their gradients on the way to the
  // inputs, then each node's weight gradients from its own output alone:
  // stage_executor.cc).
  struct ParamNodeOutput {
    at::Tensor output;
    int first_param = 0;
    int num_params = 0;
    // A Linear's input where both are 2-D (rows x features): its weight
    // gradient is one product, output_grad^T input, which the executor
    // adds into the mini-batch's gradient inside the product (addmm_), and
    // its bias gradient the output gradient's column sums. Undefined for
    // other nodes.
    at::Tensor product_input;
  };
  std::vector<ParamNodeOutput> param_outputs;
};

class StageModel {
 public:
  // `graph` must outlive the model. Fails (INVALID_ARGUMENT naming the node)
  // if a node's attributes cannot be turned into a kernel; TorchScript
  // children are loaded from their file here (see LoadTorchScriptChildren).
  static absl::StatusOr<std::unique_ptr<StageModel>> Create(
      const AnalyzedGraph& graph, const StageLayout& layout);
  ~StageModel();

  // Fresh initial parameters (leaf tensors with requires_grad), in the order
  // of param_names().
  std::vector<at::Tensor> InitParameters(int64_t seed) const;
  // "<node>.<param>" for every parameter, in Forward()'s order.
  const std::vector<std::string>& param_names() const { return param_names_; }
  int64_t num_params() const { return layout_.num_params; }
  const StageLayout& layout() const { return layout_; }

  // Runs the stage. `inputs`: stage 0 gets {samples, labels}; other stages
  // one tensor per layout().inputs entry. Shapes carry a leading micro-batch
  // dimension. `params` is one weight version (see InitParameters).
  // LibTorch errors become INTERNAL / INVALID_ARGUMENT naming the node.
  absl::StatusOr<StageForward> Forward(const std::vector<at::Tensor>& inputs,
                                       const std::vector<at::Tensor>& params,
                                       bool training,
                                       bool keep_param_outputs = false);

  // The nodes whose outputs a training Forward with keep_param_outputs
  // returns in param_outputs, in the same order: their parameter ranges and
  // whether their weight gradient is one product (param_outputs'
  // product_input defined). Known before any forward (the executor's
  // all-reduce in parts is laid out from it).
  struct WeightGradientNode {
    int first_param = 0;
    int num_params = 0;
    bool in_product = false;
  };
  std::vector<WeightGradientNode> WeightGradientNodes() const;

  // BatchNorm running statistics, for checkpoints (may be empty), each
  // named "<node>.<buffer>" ("bn1.running_mean"); the tensors are the
  // model's own, updated in place by Forward.
  std::vector<std::pair<std::string, at::Tensor>> Buffers() const;

 private:
  struct Kernel;
  StageModel(const AnalyzedGraph& graph, StageLayout layout);

  const AnalyzedGraph& graph_;
  StageLayout layout_;
  std::vector<std::unique_ptr<Kernel>> kernels_;  // one per layout_.nodes
  std::vector<std::string> param_names_;
  std::vector<int> output_slots_;  // value-table index of each output entry
  int labels_slot_ = -1;           // value-table index of the labels
};

// The kinds StageModel has a kernel for, in table order (for the test that
// keeps this table and the graph library's in step).
std::vector<apapo::v1::LayerKind> KernelLayerKinds();

// Number of correct top-1 predictions of `logits` ([N, C] or [N, T, C])
// against `labels` (first `valid` rows only; -1 = all), and the number of
// predictions counted.
std::pair<int64_t, int64_t> CountCorrect(const at::Tensor& logits,
                                         const at::Tensor& labels,
                                         int64_t valid = -1);

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_MODEL_BUILDER_H_
