#include "worker/data.h"

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/confined_files.h"

namespace apapo {
namespace worker {
namespace {

constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
// Fashion-MNIST training-set pixel mean and standard deviation (of x / 255).
constexpr float kFashionMean = 0.2860f;
constexpr float kFashionStd = 0.3530f;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class ImageDataset : public Dataset {
 public:
  ImageDataset(IdxFile images, IdxFile labels)
      : images_(std::move(images)), labels_(std::move(labels)) {
    shape_.sample_shape = {1, images_.dims[1], images_.dims[2]};
    shape_.num_classes = 10;
    pixels_ = images_.dims[1] * images_.dims[2];
  }
  int64_t size() const override { return images_.dims[0]; }
  const DataShape& shape() const override { return shape_; }
  Shape label_shape() const override { return {}; }
  void Get(int64_t index, void* x, int64_t* y) const override {
    float* out = static_cast<float*>(x);
    const uint8_t* in = images_.bytes.data() + index * pixels_;
    for (int64_t i = 0; i < pixels_; ++i) {
      out[i] = (in[i] / 255.0f - kFashionMean) / kFashionStd;
    }
    *y = labels_.bytes[index];
  }

 private:
  IdxFile images_;
  IdxFile labels_;
  DataShape shape_;
  int64_t pixels_ = 0;
};

class TextDataset : public Dataset {
 public:
  // Samples are non-overlapping windows of context+1 bytes of `text`.
  TextDataset(std::shared_ptr<const std::string> text, int64_t begin,
              int64_t end, int64_t context)
      : text_(std::move(text)), begin_(begin), context_(context) {
    shape_.sample_shape = {context};
    shape_.sample_dtype = DType::kInt64;
    shape_.num_classes = 256;
    size_ = std::max<int64_t>(0, (end - begin - 1) / context);
  }
  int64_t size() const override { return size_; }
  const DataShape& shape() const override { return shape_; }
  Shape label_shape() const override { return {context_}; }
  void Get(int64_t index, void* x, int64_t* y) const override {
    int64_t* out = static_cast<int64_t*>(x);
    const unsigned char* p = reinterpret_cast<const unsigned char*>(
        text_->data() + begin_ + index * context_);
    for (int64_t i = 0; i < context_; ++i) {
      out[i] = p[i];
      y[i] = p[i + 1];
    }
  }

 private:
  std::shared_ptr<const std::string> text_;
  int64_t begin_;
  int64_t context_;
  int64_t size_;
  DataShape shape_;
};

class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(DataShape shape, int64_t size, uint64_t seed)
      : shape_(std::move(shape)), size_(size), seed_(seed) {
    numel_ = 1;
    for (int64_t d : shape_.sample_shape) numel_ *= d;
  }
  int64_t size() const override { return size_; }
  const DataShape& shape() const override { return shape_; }
  Shape label_shape() const override { return {}; }
  void Get(int64_t index, void* x, int64_t* y) const override {
    // The label shifts the mean of a few features so the task is learnable.
    const int64_t label =
        static_cast<int64_t>(SplitMix64(seed_ ^ (index * 2 + 1)) %
                             static_cast<uint64_t>(shape_.num_classes));
    float* out = static_cast<float*>(x);
    const uint64_t base = SplitMix64(seed_ + static_cast<uint64_t>(index));
    for (int64_t i = 0; i < numel_; ++i) {
      const uint64_t r = SplitMix64(base + i);
      out[i] = static_cast<float>(r >> 40) / static_cast<float>(1 << 24) - 0.5f;
      if (i % shape_.num_classes == label) out[i] += 0.5f;
    }
    *y = label;
  }

 private:
  DataShape shape_;
  int64_t size_;
  uint64_t seed_;
  int64_t numel_;
};

// `built_in`: a file of the default dataset directory, not one a spec
// named (confined_files.h).
absl::StatusOr<std::string> ReadGz(const std::string& path, bool built_in) {
  auto fd = OpenForReading(path, "data file", built_in);
  if (!fd.ok()) return fd.status();
  gzFile f = gzdopen(fd->get(), "rb");
  if (f == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot read data file '", path, "': ", std::strerror(errno)));
  }
  fd->release();  // gzclose closes it
  std::string out;
  char buf[1 << 16];
  int n;
  // A data file larger than this is refused (a gzip bomb in a data root
  // must not take the stage's memory): Fashion-MNIST's largest is 47 MB.
  constexpr size_t kMaxDataFileBytes = size_t{4} << 30;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) {
    out.append(buf, n);
    if (out.size() > kMaxDataFileBytes) {
      gzclose(f);
      return absl::ResourceExhaustedError(absl::StrCat(
          "data file '", path, "' decompresses to more than ", kMaxDataFileBytes >> 30,
          " GiB"));
    }
  }
  int err = 0;
  const char* msg = gzerror(f, &err);
  const bool failed = n < 0 || (err != Z_OK && err != Z_STREAM_END);
  const std::string why = failed ? msg : "";
  gzclose(f);
  if (failed) {
    return absl::DataLossError(
        absl::StrCat("cannot read data file '", path, "': ", why));
  }
  return out;
}

absl::StatusOr<DataSplit> LoadFashionMnist(std::string dir) {
  const bool built_in = dir.empty();
  if (built_in) dir = kDefaultFashionMnistDir;
  auto load = [&](const std::string& prefix) -> absl::StatusOr<
                                                  std::unique_ptr<Dataset>> {
    auto images = ReadIdxGz(absl::StrCat(dir, "/", prefix,
                                         "-images-idx3-ubyte.gz"), built_in);
    if (!images.ok()) return images.status();
    auto labels = ReadIdxGz(absl::StrCat(dir, "/", prefix,
                                         "-labels-idx1-ubyte.gz"), built_in);
    if (!labels.ok()) return labels.status();
    if (images->dims.size() != 3 || labels->dims.size() != 1 ||
        images->dims[0] != labels->dims[0]) {
      return absl::DataLossError(absl::StrCat(
          "Fashion-MNIST files in '", dir, "' (", prefix,
          ") have inconsistent dimensions"));
    }
    return std::unique_ptr<Dataset>(
        new ImageDataset(*std::move(images), *std::move(labels)));
  };
  DataSplit split;
  auto train = load("train");
  if (!train.ok()) return train.status();
  auto test = load("t10k");
  if (!test.ok()) return test.status();
  split.train = *std::move(train);
  split.test = *std::move(test);
  return split;
}

absl::StatusOr<DataSplit> LoadText(const apapo::v1::TextData& spec) {
  auto bytes = ReadFileConfined(spec.path(), "text file", int64_t{4} << 30);
  if (!bytes.ok()) return bytes.status();
  auto text = std::make_shared<const std::string>(*std::move(bytes));
  const double frac = spec.has_test_fraction() ? spec.test_fraction() : 0.1;
  if (frac <= 0 || frac >= 1) {
    return absl::InvalidArgumentError(
        "spec.data.text.test_fraction: must be in (0, 1)");
  }
  const int64_t n = static_cast<int64_t>(text->size());
  const int64_t cut = static_cast<int64_t>(n * (1 - frac));
  DataSplit split;
  split.train = std::make_unique<TextDataset>(text, 0, cut, spec.context());
  split.test = std::make_unique<TextDataset>(text, cut, n, spec.context());
  if (split.train->size() < 1 || split.test->size() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text file '", spec.path(), "' (", n,
        " bytes) is too small for context ", spec.context()));
  }
  return split;
}

}  // namespace

absl::StatusOr<IdxFile> ParseIdx(absl::string_view s, const std::string& path) {
  if (s.size() < 4 || s[0] != 0 || s[1] != 0 ||
      static_cast<uint8_t>(s[2]) != 0x08) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' is not an unsigned-byte IDX file"));
  }
  const int rank = static_cast<uint8_t>(s[3]);
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (s.size() < header) {
    return absl::DataLossError(absl::StrCat("'", path, "' is truncated"));
  }
  IdxFile f;
  // The product of the dimensions, checked against the bytes there are as
  // it grows (no overflow, whatever the header claims).
  const uint64_t data = s.size() - header;
  uint64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    const unsigned char* p =
        reinterpret_cast<const unsigned char*>(s.data() + 4 + 4 * i);
    const uint64_t d = (uint64_t{p[0]} << 24) | (uint64_t{p[1]} << 16) |
                       (uint64_t{p[2]} << 8) | uint64_t{p[3]};
    f.dims.push_back(static_cast<int64_t>(d));
    total = d == 0 ? 0 : (total > data / d ? data + 1 : total * d);
  }
  if (total != data) {
    return absl::DataLossError(absl::StrCat(
        "'", path, "' holds ", data, " data bytes, expected ",
        total > data ? absl::StrCat("more (dimensions ", absl::StrJoin(f.dims, "x"), ")")
                     : absl::StrCat(total)));
  }
  f.bytes.assign(s.begin() + header, s.end());
  return f;
}

absl::StatusOr<IdxFile> ReadIdxGz(const std::string& path, bool built_in) {
  auto raw = ReadGz(path, built_in);
  if (!raw.ok()) return raw.status();
  return ParseIdx(*raw, path);
}

absl::StatusOr<DataSplit> LoadData(const apapo::v1::DataSpec& spec,
                                   int64_t seed) {
  switch (spec.source_case()) {
    case apapo::v1::DataSpec::kFashionMnist:
      return LoadFashionMnist(spec.fashion_mnist().directory());
    case apapo::v1::DataSpec::kText:
      if (spec.text().context() < 1) {
        return absl::InvalidArgumentError(
            "spec.data.text.context: must be >= 1");
      }
      return LoadText(spec.text());
    case apapo::v1::DataSpec::kSynthetic: {
      auto shape = DataShapeForJob(spec);
      if (!shape.ok()) return shape.status();
      const int64_t n = spec.synthetic().samples_per_epoch() > 0
                            ? spec.synthetic().samples_per_epoch()
                            : 10000;
      DataSplit split;
      split.train = std::make_unique<SyntheticDataset>(*shape, n, seed);
      split.test = std::make_unique<SyntheticDataset>(
          *shape, std::max<int64_t>(1, n / 6), seed ^ 0x5eed);
      return split;
    }
    default:
      return absl::InvalidArgumentError("spec.data: no data source given");
  }
}

std::vector<int64_t> EpochOrder(int64_t size, int64_t seed, int64_t epoch,
                                bool shuffle) {
  std::vector<int64_t> order(size);
  for (int64_t i = 0; i < size; ++i) order[i] = i;
  if (!shuffle) return order;
  uint64_t state = SplitMix64(static_cast<uint64_t>(seed) * 1000003u +
                              static_cast<uint64_t>(epoch));
  // Fisher-Yates with our own generator: std::shuffle is not portable.
  for (int64_t i = size - 1; i > 0; --i) {
    state = SplitMix64(state);
    const int64_t j = static_cast<int64_t>(state % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace worker
}  // namespace apapo
