// CheckpointStore: where a stage replica's checkpoints live and in what
// format. The executor only says what to save (StageCheckpoint) and asks
// which steps exist; the format and the storage are this file's business,
// so replacing the format (the elastic-jobs work) is a change here alone.
//
// FileCheckpointStore, the one implementation: "step<N>.stage<S>.replica<R>
// .pt" files in a directory, each a LibTorch-serialized list of tensors,
// written through an injected FileSystem (atomically: a crash leaves the
// previous checkpoint intact). After saving step N it removes this replica's
// checkpoints older than N - keep_within_steps (by default the previous one
// survives, so a crash while writing loses at most one interval).
//
// Thread-safety: FileCheckpointStore is thread-safe as far as its
// FileSystem is; replicas of one job may share a directory.
#ifndef APAPO_WORKER_CHECKPOINT_STORE_H_
#define APAPO_WORKER_CHECKPOINT_STORE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/file_system.h"

namespace apapo::worker {

// What one stage replica needs to resume.
struct StageCheckpoint {
  int64_t step = 0;     // optimizer steps done
  int64_t version = 0;  // weight version of `parameters`
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> optimizer_state;
  std::vector<at::Tensor> buffers;  // e.g. batch-norm running statistics
};

class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;
  virtual absl::Status Save(int stage, int replica,
                            const StageCheckpoint& checkpoint) = 0;
  // Steps this replica has a checkpoint of, any order.
  virtual absl::StatusOr<std::vector<int64_t>> Steps(int stage,
                                                     int replica) = 0;
  // DATA_LOSS naming the file when it is unreadable or does not hold
  // `num_parameters` parameters.
  virtual absl::StatusOr<StageCheckpoint> Load(int stage, int replica,
                                               int64_t step,
                                               size_t num_parameters) = 0;
};

class FileCheckpointStore : public CheckpointStore {
 public:
  // `fs` outlives the store.
  FileCheckpointStore(std::string directory, int64_t keep_within_steps,
                      FileSystem* fs);

  absl::Status Save(int stage, int replica,
                    const StageCheckpoint& checkpoint) override;
  absl::StatusOr<std::vector<int64_t>> Steps(int stage, int replica) override;
  absl::StatusOr<StageCheckpoint> Load(int stage, int replica, int64_t step,
                                       size_t num_parameters) override;

  std::string PathOf(int64_t step, int stage, int replica) const;

 private:
  const std::string directory_;
  const int64_t keep_within_steps_;
  FileSystem* const fs_;
};

// The newest step every one of `replicas` (stage, replica) has a checkpoint
// of; nullopt when there is none.
absl::StatusOr<std::optional<int64_t>> NewestCommonStep(
    CheckpointStore& store, const std::vector<std::pair<int, int>>& replicas);

}  // namespace apapo::worker

#endif  // APAPO_WORKER_CHECKPOINT_STORE_H_
