// WeightStore: the weight versions of one stage replica (weight stashing).
//
// Version 0 is the initial weights; every Update applies the accumulated
// gradients to the newest version with the optimizer and makes the next
// one. A version lives while it is the newest (or, under 2BW, the one
// before it) or while an in-flight micro-batch uses it: Acquire at its
// forward, Release after its backward, so a backward pass differentiates
// exactly the tensors its forward used. Dropped versions' tensors are
// recycled as the buffers of the next update (allocating and faulting in a
// fresh 57 MB version per step cost the mlp ~15% of a core).
//
// Weight prediction (async schedule): forward and backward of version v run
// on weights predicted `prediction_steps` updates ahead of v (W - delay x
// lr x momentum for SGD, made by the fused optimizer step that made v, else
// on v's first use), recycled like versions.
//
// Thread-safety: not thread-safe; one stage replica's compute thread owns
// it.
#ifndef APAPO_WORKER_WEIGHT_STORE_H_
#define APAPO_WORKER_WEIGHT_STORE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "worker/optimizer.h"

namespace apapo::worker {

class WeightStore {
 public:
  struct Options {
    // 2BW runs iteration k on version k-1: keep the version before the
    // newest even when no micro-batch uses it.
    bool keep_previous = false;
    // Reuse dropped versions' tensors (off when their tensors must stay
    // intact, e.g. recorded by a test).
    bool recycle = true;
    // Updates ahead to predict (0: no prediction).
    double prediction_steps = 0;
  };

  // `optimizer` outlives the store. `initial` becomes version 0 (its
  // tensors are never recycled: they may be the caller's).
  WeightStore(Optimizer* optimizer, Options options,
              std::vector<at::Tensor> initial);

  int64_t newest() const { return newest_; }
  // The newest version's own tensors (not a prediction).
  const std::vector<at::Tensor>& newest_weights() const;
  bool holds(int64_t version) const { return versions_.count(version) > 0; }
  // Versions held now.
  int size() const { return static_cast<int>(versions_.size()); }

  // A forward pass starts using `version` (which must be held): it stays
  // held until the matching Release.
  void Acquire(int64_t version);
  void Release(int64_t version);
  // The weights forward and backward of `version` compute with: its own
  // tensors, or its prediction. `step` is the optimizer step count now.
  const std::vector<at::Tensor>& ComputeWeights(int64_t version, int64_t step);

  // The optimizer step: applies `grads` (one per parameter, all defined) to
  // the newest version at step `step` and makes version newest() + 1
  // (clipping, when the optimizer clips, modifies `grads` in place).
  // LibTorch errors are thrown.
  void Update(std::vector<at::Tensor>& grads, int64_t step);

  // Replaces every version with `weights` as version `version` (resuming
  // from a checkpoint).
  void Reset(int64_t version, std::vector<at::Tensor> weights);

 private:
  void DropUnused();
  // Keeps `version`'s predicted tensors for the next prediction, except
  // those that are the version's own (Predict passes a parameter without a
  // step direction through).
  void RecyclePrediction(int64_t version, const std::vector<at::Tensor>& own);

  Optimizer* const optimizer_;
  const Options options_;
  int64_t newest_ = 0;
  // Version -> tensors; refs = in-flight users.
  std::map<int64_t, std::vector<at::Tensor>> versions_;
  std::map<int64_t, int> refs_;
  std::map<int64_t, std::vector<at::Tensor>> predicted_;
  // Tensors of the last dropped version / prediction, overwritten next.
  std::vector<at::Tensor> spare_;
  std::vector<at::Tensor> predicted_spare_;
};

}  // namespace apapo::worker

#endif  // APAPO_WORKER_WEIGHT_STORE_H_
