#include "worker/batch_loader.h"

#include <torch/torch.h>

namespace apapo::worker {

std::vector<at::Tensor> LoadRows(const Dataset& data,
                                 absl::Span<const int64_t> rows,
                                 int64_t batch_size) {
  const DataShape& ds = data.shape();
  std::vector<int64_t> xs{batch_size};
  xs.insert(xs.end(), ds.sample_shape.begin(), ds.sample_shape.end());
  std::vector<int64_t> ys{batch_size};
  const Shape ls = data.label_shape();
  ys.insert(ys.end(), ls.begin(), ls.end());
  const auto dtype =
      ds.sample_dtype == DType::kInt64 ? torch::kLong : torch::kFloat;
  // A full batch is overwritten entirely: no need to clear it first.
  const bool full = static_cast<int64_t>(rows.size()) == batch_size;
  at::Tensor x = full ? torch::empty(xs, dtype) : torch::zeros(xs, dtype);
  at::Tensor y = full ? torch::empty(ys, torch::kLong)
                      : torch::zeros(ys, torch::kLong);
  const int64_t x_stride = x.numel() / batch_size;
  const int64_t y_stride = y.numel() / batch_size;
  const int64_t elem = ds.sample_dtype == DType::kInt64 ? 8 : 4;
  for (size_t i = 0; i < rows.size(); ++i) {
    data.Get(rows[i], static_cast<char*>(x.data_ptr()) + i * x_stride * elem,
             y.data_ptr<int64_t>() + i * y_stride);
  }
  return {x, y};
}

}  // namespace apapo::worker
