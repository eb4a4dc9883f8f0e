// LoadRows: dataset rows as the {samples, labels} tensors a first stage
// takes, for training micro-batches and test batches alike.
//
// Thread-safety: as the Dataset's Get (read-only datasets are safe).
#ifndef APAPO_WORKER_BATCH_LOADER_H_
#define APAPO_WORKER_BATCH_LOADER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "worker/data.h"

namespace apapo::worker {

// Rows `rows` of `data` as a batch of `batch_size` samples (>= rows.size());
// samples past the rows are zeros (a short last test batch).
std::vector<at::Tensor> LoadRows(const Dataset& data,
                                 absl::Span<const int64_t> rows,
                                 int64_t batch_size);

}  // namespace apapo::worker

#endif  // APAPO_WORKER_BATCH_LOADER_H_
