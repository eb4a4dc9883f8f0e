// Training and evaluation data for the worker, without LibTorch: Fashion-MNIST
// read from IDX .gz files, a byte-level token stream from a text file, and
// synthetic samples for benchmarks. Samples are written into caller-owned
// buffers so the stage executor can wrap them as tensors without copies.
//
// Thread-safety: a Dataset is immutable after loading; Get() is const and may
// be called from any thread. EpochOrder() is a pure function.

#ifndef APAPO_WORKER_DATA_H_
#define APAPO_WORKER_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/apapo/v1/job.pb.h"
#include "worker/model_graph.h"

namespace apapo {
namespace worker {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Shape and dtype of one sample and the label count.
  virtual const DataShape& shape() const = 0;
  // Per-sample label shape: {} for classification, {T} for token streams.
  virtual Shape label_shape() const = 0;
  // Writes sample `index` to `x` (numel(sample_shape) elements of float when
  // the dtype is float32, else of int64, reinterpreted) and its label(s) to
  // `y`. `index` must be in [0, size()).
  virtual void Get(int64_t index, void* x, int64_t* y) const = 0;
};

struct DataSplit {
  std::unique_ptr<Dataset> train;
  std::unique_ptr<Dataset> test;
};

// Loads the data a job names. Missing or malformed files are NOT_FOUND /
// DATA_LOSS errors naming the path. `seed` seeds synthetic data.
absl::StatusOr<DataSplit> LoadData(const apapo::v1::DataSpec& spec,
                                   int64_t seed);

// Reads one IDX file (gzip-compressed or not): returns the dimensions and
// the raw bytes. Exposed for tests.
struct IdxFile {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};
// `built_in`: a file of the default dataset directory (not a spec path:
// opened as given even when the process is confined to data roots).
absl::StatusOr<IdxFile> ReadIdxGz(const std::string& path, bool built_in = false);
// The IDX bytes `bytes` (already decompressed) read from `path`: DATA_LOSS
// naming the path unless the header's dimensions describe exactly the data
// that follows.
absl::StatusOr<IdxFile> ParseIdx(absl::string_view bytes, const std::string& path);

// The order of training samples in `epoch`: a seeded permutation when
// `shuffle`, else 0..size-1. Identical on every process and platform.
std::vector<int64_t> EpochOrder(int64_t size, int64_t seed, int64_t epoch,
                                bool shuffle);

}  // namespace worker
}  // namespace apapo

#endif  // APAPO_WORKER_DATA_H_
