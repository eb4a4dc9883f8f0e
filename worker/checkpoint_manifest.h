// The text manifest of one stage's checkpoint file (checkpoint_store.h):
// which tensors the data file holds, where, and with which rows of which
// layer. LibTorch-free, so that its parser, the first thing a checkpoint
// from disk reaches, is fuzzed (fuzz/checkpoint_manifest_fuzz.cc) and
// tested without a LibTorch build.
//
//   apapo-checkpoint 1
//   step N / version V / stage S / optimizer_steps K
//   slots NAME...
//   data FILE BYTES CRC32
//   tensor KEY DTYPE ROW_BEGIN ROW_END TOTAL_ROWS OFFSET BYTES DIMS|-
//   end
//
// Thread-safety: stateless functions.
#ifndef APAPO_WORKER_CHECKPOINT_MANIFEST_H_
#define APAPO_WORKER_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/model_graph.h"

namespace apapo::worker {

inline constexpr absl::string_view kCheckpointMagic = "apapo-checkpoint 1";

// One tensor record.
struct CheckpointEntry {
  std::string key;
  std::string dtype;
  RowRange rows;
  int64_t total_rows = 0;
  int64_t offset = 0;
  int64_t bytes = 0;
  std::vector<int64_t> dims;  // empty: 0-d
};

// One parsed manifest.
struct CheckpointManifest {
  std::string path;
  std::string data_path;
  int64_t step = 0;
  int64_t version = 0;
  int64_t optimizer_steps = 0;
  std::vector<std::string> slots;
  int64_t data_bytes = 0;
  uint32_t data_crc = 0;
  std::vector<CheckpointEntry> entries;
};

// Bytes per element of a dtype a checkpoint stores, by c10::toString's name
// ("Float", "Long", ...); nullopt for any other name.
std::optional<int64_t> CheckpointElementSize(absl::string_view dtype);
// The rows a tensor of `dims` has (its first dimension; 0-d: one row).
int64_t CheckpointRows(const std::vector<int64_t>& dims);
// "AxB" ("-" for 0-d), as manifests write dims.
std::string CheckpointDims(const std::vector<int64_t>& dims);
// DATA_LOSS "checkpoint file 'PATH': WHAT".
absl::Status CheckpointDataLoss(const std::string& path, absl::string_view what);

// Parses the manifest `text` read from `path`, whose data file lies in
// `dir`. Every number is checked (no overflow, rows within the total, bytes
// = rows x dims x element size, every tensor within the data file, no row
// range twice); anything else is DATA_LOSS naming the path and the line.
absl::StatusOr<CheckpointManifest> ParseCheckpointManifest(const std::string& path,
                                                           const std::string& dir,
                                                           absl::string_view text);
// The manifest's text, as ParseCheckpointManifest reads it.
std::string CheckpointManifestText(const CheckpointManifest& m, int stage,
                                   absl::string_view data_name);

}  // namespace apapo::worker

#endif  // APAPO_WORKER_CHECKPOINT_MANIFEST_H_
