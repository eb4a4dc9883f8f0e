// TorchScript models partitioned by their top-level children.
//
// A job may name a file holding `torch.jit.script(nn.Sequential(...))`.
// TorchScriptGraph() turns it into a ModelGraph: the INPUT node, one
// LAYER_KIND_TORCHSCRIPT_CHILD node per top-level child, chained in order,
// and the cross-entropy loss. Each child node records in its attributes what
// the torch-free AnalyzedGraph needs (output shape and dtype, parameter names
// and shapes, found by running a batch of 2 through the children one by one)
// and where the child comes from (path, index).
//
// TorchScriptChild runs one such child inside a StageModel with an explicit
// weight version: before each forward it points the child's parameter slots
// at that version's tensors, so autograd differentiates exactly those tensors
// and weight stashing works as for the built-in kernels. Its initial
// parameters are the values saved in the file; its buffers (BatchNorm running
// statistics) stay in the module and are updated in place.
//
// Thread-safety: TorchScriptGraph and LoadTorchScriptChildren are
// thread-safe (each call loads its own copy of the file). A TorchScriptChild
// must be used from one thread at a time: Forward rewrites the module's
// attributes.

#ifndef APAPO_WORKER_TORCHSCRIPT_MODEL_H_
#define APAPO_WORKER_TORCHSCRIPT_MODEL_H_

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/apapo/v1/model.pb.h"
#include "worker/model_graph.h"

namespace apapo {
namespace worker {

// The graph of the TorchScript module in `model.path` for samples of `data`'s
// shape (which must equal `model.input_shape`). A missing file is NOT_FOUND;
// a file that does not load, a top level that is not a sequential container
// of single-tensor children, or children that reject the input are
// INVALID_ARGUMENT naming the file and the cause. Matches TorchScriptImporter.
absl::StatusOr<apapo::v1::ModelGraph> TorchScriptGraph(
    const apapo::v1::TorchScriptModel& model, const DataShape& data);

class TorchScriptChild {
 public:
  ~TorchScriptChild();

  // The child's parameters as saved in the file (fresh leaf tensors with
  // requires_grad), in the order of the node's params.
  std::vector<at::Tensor> InitialParameters() const;
  // Runs the child on `input` with `params` (one tensor per node param) as
  // its parameters. Throws c10::Error on LibTorch failures.
  at::Tensor Forward(const at::Tensor& input, at::ArrayRef<at::Tensor> params,
                     bool training);
  // The module's own buffers (running statistics), updated in place, by
  // their names in the module ("0.running_mean", ...).
  std::vector<std::pair<std::string, at::Tensor>> Buffers() const;

 private:
  friend absl::StatusOr<std::vector<std::unique_ptr<TorchScriptChild>>>
  LoadTorchScriptChildren(const std::vector<const NodeInfo*>& nodes);
  struct Impl;
  explicit TorchScriptChild(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Loads the children that TORCHSCRIPT_CHILD `nodes` name (each file once)
// and checks that their parameters still have the names and shapes the nodes
// recorded (FAILED_PRECONDITION if the file changed since the graph was
// built). Returns one child per node, in order.
absl::StatusOr<std::vector<std::unique_ptr<TorchScriptChild>>>
LoadTorchScriptChildren(const std::vector<const NodeInfo*>& nodes);

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_TORCHSCRIPT_MODEL_H_
