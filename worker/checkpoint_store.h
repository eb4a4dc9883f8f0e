// Checkpoints of a job, keyed by layer so that a run under any plan of the
// same model (other stage cuts, other layer splits, replicas) resumes from a
// step that another plan wrote. The executor says what one stage holds, by
// its plan's names (StageCheckpoint), and which step it wants; the format,
// the storage and the background writing are this file's business:
//
//   CheckpointStore      what a step holds, whether it is complete, pruning;
//   FileCheckpointStore  the one format, over an injected FileSystem;
//   CheckpointWriter     one stage's writes, on a thread of its own.
//
// Format (FileCheckpointStore) under the checkpoint directory:
//   step-<N>/stage-<S>.data      stage S's tensors at step N: raw bytes,
//                                back to back, in the manifest's order;
//   step-<N>/stage-<S>.manifest  text, one record a line:
//     apapo-checkpoint 1
//     step <N>                   optimizer steps done (the data position and
//                                the LR schedule position follow from it)
//     version <v>                weight version of the parameters
//     stage <S>                  the writer's stage in its plan
//     optimizer_steps <n>        Adam's update count (bias corrections)
//     slots <name>...            optimizer slots (OptimizerState)
//     data stage-<S>.data <bytes> <crc32>
//     tensor <key> <dtype> <begin> <end> <rows> <offset> <bytes> <dims>
//     ...
//     end
//   A key is "param/<node>.<param>", "<slot>/<node>.<param>" (optimizer
//   state) or "buffer/<node>.<buffer>", where <node> is the node's id in
//   the graph before SplitLinearLayers (OriginOf, model_graph.h); the
//   tensor holds rows [begin, end) of that tensor's <rows> rows (first
//   dimension; a part "fc3/j" of a split Linear holds its slice of fc3's
//   weight and bias rows, anything else all rows; a 0-d tensor counts as one
//   row). <dims> is the stored piece's shape ("3x4"; "-" for 0-d).
// Each file is written with FileSystem::WriteAtomically, the data before its
// manifest, so a manifest names a whole data file. A step is complete when
// its manifests cover every row of every parameter of the whole graph (a
// node's buffers are written with its parameters); an incomplete step (a
// crash mid-write) is never loaded. Only replica 0 of each stage writes
// (replicas hold identical weights after each all-reduce); every replica
// loads. Loading gathers each parameter's rows from whichever files of the
// step hold them and concatenates them, so weights and optimizer state come
// back bit-identical per layer.
//
// Pruning: after a save completes step N, steps older than
// N - keep_within_steps are removed (keep_within_steps = the checkpoint
// interval keeps the previous complete step too, so a crash while writing
// step N + interval loses one interval). Only steps older than a complete
// step are removed: every stage wrote N, and each stage writes its steps in
// order, so no stage of the job is still writing one of them. A run that
// starts at step S (the resumed step, 0 for a fresh run) first calls
// RemoveStepsAfter(S): newer steps belong to an abandoned run (a crash before
// they completed) and must not mix with this run's files of the same step;
// no stage of the new run can write before every stage has started.
//
// Errors: unreadable, truncated or corrupt files and tensors missing from a
// complete step are DATA_LOSS naming the file (and the key); a manifest
// naming a node the graph lacks, or shapes or dtypes that disagree with the
// stage's, are INVALID_ARGUMENT naming the file and the key.
//
// Thread-safety: FileCheckpointStore is thread-safe as far as its FileSystem
// is (it keeps no mutable state); the stages of a job share a directory.
// CheckpointWriter: Submit/Wait from one thread (the executor's).
#ifndef APAPO_WORKER_CHECKPOINT_STORE_H_
#define APAPO_WORKER_CHECKPOINT_STORE_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/checkpoint_manifest.h"
#include "worker/file_system.h"
#include "worker/model_graph.h"
#include "worker/optimizer.h"

namespace apapo::worker {

// What one stage holds, by its plan's names.
struct StageCheckpoint {
  int64_t step = 0;     // optimizer steps done
  int64_t version = 0;  // weight version of `parameters`
  // StageModel::param_names() ("<node>.<param>" of the plan's graph) and
  // one tensor each.
  std::vector<std::string> parameter_names;
  std::vector<at::Tensor> parameters;
  OptimizerState optimizer;  // per parameter, in the same order
  // StageModel::Buffers(): "<node>.<buffer>" and the tensor.
  std::vector<std::pair<std::string, at::Tensor>> buffers;

  // A deep copy (shares no storage), e.g. a snapshot that training may not
  // change while it is written.
  StageCheckpoint Clone() const;
};

class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;
  // Writes stage `stage`'s part of step `c.step`; prunes older steps once
  // the step is complete. Errors name the file.
  virtual absl::Status Save(int stage, const StageCheckpoint& c) = 0;
  // The newest complete step; nullopt when there is none.
  virtual absl::StatusOr<std::optional<int64_t>> NewestCompleteStep() = 0;
  // Loads step `step` into `into`: its parameter_names, parameters (for
  // their shapes), optimizer.slot_names and buffers say what to load; the
  // tensors, step, version and optimizer state are replaced.
  virtual absl::Status Load(int64_t step, StageCheckpoint* into) = 0;
  // Removes the steps after `step` (see the file comment).
  virtual absl::Status RemoveStepsAfter(int64_t step) = 0;
};

class FileCheckpointStore : public CheckpointStore {
 public:
  // `graph` is this plan's (split) graph: names are resolved through it,
  // completeness is judged against it. `graph` and `fs` outlive the store.
  FileCheckpointStore(std::string directory, int64_t keep_within_steps,
                      const AnalyzedGraph* graph, FileSystem* fs);

  absl::Status Save(int stage, const StageCheckpoint& c) override;
  absl::StatusOr<std::optional<int64_t>> NewestCompleteStep() override;
  absl::Status Load(int64_t step, StageCheckpoint* into) override;
  absl::Status RemoveStepsAfter(int64_t step) override;

  std::string StepDir(int64_t step) const;
  std::string ManifestPath(int64_t step, int stage) const;
  std::string DataPath(int64_t step, int stage) const;

  // A parsed manifest and its records (checkpoint_manifest.h).
  using Entry = CheckpointEntry;
  using Manifest = CheckpointManifest;

 private:
  // The key and rows of tensor `t` named `name` ("<node>.<rest>" of this
  // plan's graph) under `prefix` ("param", a slot, "buffer").
  absl::StatusOr<Entry> KeyOf(const std::string& prefix,
                              const std::string& name,
                              const at::Tensor& t) const;
  absl::StatusOr<std::vector<int64_t>> Steps() const;
  // The step's manifests, parsed and checked against the graph.
  absl::StatusOr<std::vector<Manifest>> ReadManifests(int64_t step) const;
  // Whether `manifests` cover every parameter row of the graph.
  bool Complete(const std::vector<Manifest>& manifests) const;
  absl::Status RemoveStep(int64_t step) const;

  const std::string directory_;
  const int64_t keep_within_steps_;
  const AnalyzedGraph* const graph_;
  FileSystem* const fs_;
  // Every parameter key of the whole graph -> its rows (completeness).
  std::map<std::string, int64_t> required_;
  // Node ids of the graph before splitting (for buffer keys).
  std::map<std::string, int> origins_;
};

// Writes one stage's checkpoints on a thread of its own, one at a time, so
// that training goes on while a snapshot is serialized and stored.
class CheckpointWriter {
 public:
  // `store` outlives the writer.
  CheckpointWriter(CheckpointStore* store, int stage);
  // Waits for the write in progress.
  ~CheckpointWriter();

  // Waits for the previous write; if it failed, returns its error and drops
  // `snapshot`; else hands `snapshot` (which nobody else may change) to the
  // writer thread and returns at once.
  absl::Status Submit(StageCheckpoint snapshot);
  // Waits for the write in progress; the first write error, if any.
  absl::Status Wait();
  // The newest step this writer has written completely (0: none yet). A
  // stop (SIGTERM) kills a write in flight, so this, not the step trained,
  // says what a restart can resume from.
  int64_t written_step() const { return written_step_.load(std::memory_order_acquire); }
  // CPU time the writer thread has spent writing, seconds: what the
  // background write takes from training when the cores are busy.
  double write_cpu_seconds() const {
    return write_cpu_ns_.load(std::memory_order_relaxed) * 1e-9;
  }

 private:
  void Loop();
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_.has_value() && !writing_;
  }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_.has_value() || stop_;
  }

  // ---- constant after construction ----
  CheckpointStore* const store_;
  const int stage_;

  // ---- protected by mu_ ----
  absl::Mutex mu_;
  std::optional<StageCheckpoint> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> written_step_{0};
  std::atomic<int64_t> write_cpu_ns_{0};

  std::thread thread_;  // last: starts after the members it reads
};

}  // namespace apapo::worker

#endif  // APAPO_WORKER_CHECKPOINT_STORE_H_
