// Functional optimizers for stage parameters: SGD (momentum, Nesterov,
// weight decay) and Adam, with learning-rate warm-up/decay and gradient-norm
// clipping, following torch.optim's update formulas.
//
// Step() never writes the parameters it is given: it returns a new weight
// version (fresh leaf tensors), so versions stashed for in-flight
// micro-batches stay intact. Optimizer state (momentum, Adam moments) is
// per stage and updated in place.
//
// Thread-safety: not thread-safe; one Optimizer per stage executor thread.

#ifndef APAPO_WORKER_OPTIMIZER_H_
#define APAPO_WORKER_OPTIMIZER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/apapo/v1/job.pb.h"

namespace apapo {
namespace worker {

// An optimizer's state, per parameter, for checkpoints: parameter i's
// tensors are per_param[i], one per slot_names entry, each shaped like the
// parameter (so a checkpoint slices them as it slices the parameter).
struct OptimizerState {
  // Updates applied (Adam's bias corrections); 0 for SGD.
  int64_t steps = 0;
  // SGD with momentum: {"momentum_buffer"}; Adam: {"exp_avg",
  // "exp_avg_sq"} (torch.optim's names); plain SGD: none.
  std::vector<std::string> slot_names;
  // Empty before the first step; else one entry per parameter.
  std::vector<std::vector<at::Tensor>> per_param;
};

class Optimizer {
 public:
  // `total_steps` is the run's number of updates (for cosine decay).
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const apapo::v1::OptimizerSpec& spec, int64_t total_steps);

  // Learning rate of update number `step` (0-based).
  double LearningRate(int64_t step) const;

  // Applies update number `step`: clips `grads` (their global norm, when
  // grad_clip_norm > 0; modified in place), then returns the next version of
  // `params`. `params` and `grads` must have the same length and shapes.
  // `reuse`, when given, holds tensors of a weight version nobody reads any
  // more (same shapes as `params`): the next version is written into them
  // and they are returned, so a steady-state step allocates no parameters.
  //
  // `predict`, when given, asks for the new version's prediction too, as
  // Predict(next, predict->steps, step + 1) would make it (into
  // predict->reuse when it fits): SGD with momentum computes it in the same
  // pass over memory as the update. predict->out is left empty when this
  // step could not (first step, Adam, non-float or non-contiguous tensors):
  // call Predict then.
  struct FusedPrediction {
    double steps = 0;
    std::vector<at::Tensor> reuse;
    std::vector<at::Tensor> out;
  };
  std::vector<at::Tensor> Step(const std::vector<at::Tensor>& params,
                               std::vector<at::Tensor>& grads, int64_t step,
                               std::vector<at::Tensor> reuse = {},
                               FusedPrediction* predict = nullptr);

  // `params` moved `steps` updates ahead along the current step direction
  // (SGD: the momentum buffer; Adam: m_hat / (sqrt(v_hat) + eps)) at update
  // number `step`'s learning rate. A parameter without a direction yet (no
  // momentum, or before the first step) is returned as it is.
  // `reuse`, as in Step, holds tensors no one reads any more: predictions
  // are written into them instead of fresh allocations. SGD momentum on
  // float CPU tensors predicts bit for bit what Step's fused pass predicts,
  // so a run resumed from a checkpoint goes on exactly as it would have.
  std::vector<at::Tensor> Predict(const std::vector<at::Tensor>& params,
                                  double steps, int64_t step,
                                  std::vector<at::Tensor> reuse = {}) const;
  // The slots this optimizer keeps per parameter (OptimizerState).
  std::vector<std::string> SlotNames() const;
  // The state now. Its tensors are the optimizer's own, updated in place by
  // the next Step: clone them to keep them.
  OptimizerState State() const;
  // Replaces the state (e.g. from a checkpoint) for `num_params`
  // parameters. INVALID_ARGUMENT when the slots are not SlotNames() or the
  // parameter count differs.
  absl::Status LoadState(OptimizerState state, size_t num_params);

 private:
  explicit Optimizer(const apapo::v1::OptimizerSpec& spec, int64_t total);

  apapo::v1::OptimizerSpec spec_;
  int64_t total_steps_;
  bool adam_;
  int64_t adam_steps_ = 0;
  std::vector<at::Tensor> slot1_;  // SGD momentum buffer / Adam first moment
  std::vector<at::Tensor> slot2_;  // Adam second moment
};

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_OPTIMIZER_H_
