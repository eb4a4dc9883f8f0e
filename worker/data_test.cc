#include "worker/data.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo {
namespace worker {
namespace {

using ::testing::HasSubstr;

TEST(DataTest, FashionMnistLoadsFromDebianPackage) {
  apapo::v1::DataSpec spec;
  spec.mutable_fashion_mnist();
  auto data = LoadData(spec, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train->size(), 60000);
  EXPECT_EQ(data->test->size(), 10000);
  std::vector<float> x(784);
  int64_t y = -1;
  data->train->Get(0, x.data(), &y);
  EXPECT_GE(y, 0);
  EXPECT_LT(y, 10);
  float lo = 1e9, hi = -1e9;
  for (float v : x) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_LT(lo, 0.0f);  // normalised: background below the mean
  EXPECT_GT(hi, 1.0f);
}

TEST(DataTest, MissingFileNamesThePath) {
  apapo::v1::DataSpec spec;
  spec.mutable_fashion_mnist()->set_directory("/nonexistent/fmnist");
  auto data = LoadData(spec, 1);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(data.status().message()),
              HasSubstr("/nonexistent/fmnist/train-images-idx3-ubyte.gz"));

  apapo::v1::DataSpec text;
  text.mutable_text()->set_path("/nonexistent/corpus.txt");
  text.mutable_text()->set_context(8);
  EXPECT_THAT(std::string(LoadData(text, 1).status().message()),
              HasSubstr("/nonexistent/corpus.txt"));
}

TEST(DataTest, CorruptIdxIsDataLoss) {
  const std::string path = ::testing::TempDir() + "/bad.idx";
  std::ofstream(path) << "not an idx file";
  auto f = ReadIdxGz(path);  // zlib reads plain files transparently
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(path));
}

TEST(DataTest, IdxDimensionsMustDescribeTheDataExactly) {
  using std::string_literals::operator""s;
  // 2 x 3 bytes.
  auto ok = ParseIdx("\0\0\x08\x02\0\0\0\x02\0\0\0\x03"s "abcdef", "f");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ok->bytes.size(), 6u);
  // Dimensions whose product overflows 64 bits: refused, not wrapped round.
  std::string huge = "\0\0\x08\x03"s;
  for (int i = 0; i < 3; ++i) huge += "\xff\xff\xff\xff"s;
  auto bad = ParseIdx(huge + "abcd", "huge.idx");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("'huge.idx' holds 4 data bytes, expected more (dimensions "
                        "4294967295x4294967295x4294967295)"));
  // A zero dimension holds no bytes.
  EXPECT_TRUE(ParseIdx("\0\0\x08\x01\0\0\0\0"s, "empty").ok());
  EXPECT_FALSE(ParseIdx("\0\0\x08\x01\0\0\0\0x"s, "extra").ok());
  EXPECT_FALSE(ParseIdx("\0\0\x08\x05\0"s, "short").ok());
}

TEST(DataTest, TextStreamShiftsLabelsByOne) {
  const std::string path = ::testing::TempDir() + "/corpus.txt";
  std::string text;
  for (int i = 0; i < 100; ++i) text += "abcdefghij";
  std::ofstream(path) << text;
  apapo::v1::DataSpec spec;
  spec.mutable_text()->set_path(path);
  spec.mutable_text()->set_context(4);
  auto data = LoadData(spec, 1);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train->label_shape(), (Shape{4}));
  int64_t x[4], y[4];
  data->train->Get(1, x, y);
  EXPECT_EQ(x[0], 'e');
  EXPECT_EQ(y[0], 'f');
  EXPECT_EQ(y[3], 'i');
  EXPECT_GT(data->test->size(), 0);
}

TEST(DataTest, EpochOrderIsASeededPermutation) {
  auto a = EpochOrder(1000, 7, 0, true);
  auto b = EpochOrder(1000, 7, 0, true);
  auto c = EpochOrder(1000, 7, 1, true);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(EpochOrder(3, 7, 0, false), (std::vector<int64_t>{0, 1, 2}));
}

TEST(DataTest, SyntheticIsDeterministic) {
  apapo::v1::DataSpec spec;
  spec.mutable_synthetic()->add_sample_shape(16);
  spec.mutable_synthetic()->set_num_classes(4);
  spec.mutable_synthetic()->set_samples_per_epoch(100);
  auto a = LoadData(spec, 3);
  auto b = LoadData(spec, 3);
  ASSERT_TRUE(a.ok());
  float xa[16], xb[16];
  int64_t ya, yb;
  a->train->Get(5, xa, &ya);
  b->train->Get(5, xb, &yb);
  EXPECT_EQ(ya, yb);
  EXPECT_EQ(std::vector<float>(xa, xa + 16), std::vector<float>(xb, xb + 16));
}

}  // namespace
}  // namespace worker
}  // namespace apapo
