// Evaluator: the test-set accuracy of the pipeline's newest weights, by
// running the schedule's evaluation program (schedule::StageProgram::
// CreateEvaluation): forward-only passes over the test set through replica
// 0 of every stage, the activations moved by the program's own transfer
// ops, then a kReduceResult in which every rank contributes its counts
// (the last stage's correct and counted samples, zeros elsewhere) to an
// all-reduce over the job's world group, so every rank returns the same
// accuracy and can make the same stop decision. No control messages.
//
// Thread-safety: not thread-safe; one stage replica's compute thread.
#ifndef APAPO_WORKER_EVALUATOR_H_
#define APAPO_WORKER_EVALUATOR_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data.h"
#include "worker/stage_context.h"

namespace apapo::worker {

// `model`'s eval-mode forward of `inputs` (every tensor with the same
// leading row count), `chunk_rows` rows at a time (<= 0: at once), the
// pieces' outputs, logits and labels joined back into whole-batch tensors.
absl::StatusOr<StageForward> ForwardInChunks(
    StageModel& model, const std::vector<at::Tensor>& inputs,
    const std::vector<at::Tensor>& weights, int64_t chunk_rows);

class Evaluator {
 public:
  // `context` and `test` outlive the evaluator; `batch_size` > 0. Every
  // stage derives the number of test batches from `test`'s size (stage 0
  // reads its samples). A test batch crosses the cuts whole, but each stage
  // runs its forward over it `chunk_rows` rows at a time (0 or >=
  // batch_size: whole): a convolution's working set grows with the rows it
  // is given, and past the caches a 1000-row batch ran the cnn's forward
  // 10x slower per sample than 128-row pieces (page faults on buffers of
  // hundreds of MB). In eval mode no layer mixes rows, so the result is the
  // same.
  Evaluator(const StageContext* context, const Dataset* test,
            int64_t batch_size, int64_t chunk_rows = 0);

  // Test accuracy (0..1) of `weights` (this stage's newest), the same on
  // every rank. `phase` separates this program's message tags.
  absl::StatusOr<double> Evaluate(const std::vector<at::Tensor>& weights,
                                  int64_t phase);

 private:
  // Test batch `b` as {samples, labels}, zero-padded past the set's end.
  std::vector<at::Tensor> LoadBatch(int64_t b) const;

  const StageContext* const context_;
  const Dataset* const test_;
  const int64_t batch_size_;
  const int64_t chunk_rows_;
};

}  // namespace apapo::worker

#endif  // APAPO_WORKER_EVALUATOR_H_
