#include "worker/daemon/transfer_cpu_probe.h"

#include <dirent.h>

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo {
namespace worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

int OpenDescriptors() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

// A real loopback exchange: a positive, finite figure, and no socket or
// thread left behind.
TEST(MeasureTransferCpuTest, TimesMessagesOverLoopbackAndClosesItsSockets) {
  const int before = OpenDescriptors();
  absl::StatusOr<double> cpu = MeasureTransferCpu(1 << 20, 1, 2);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_GT(*cpu, 0);
  EXPECT_TRUE(std::isfinite(*cpu));
  // Under a nanosecond-scale figure by far: a second per byte would mean
  // the division or the clock is wrong.
  EXPECT_LT(*cpu, 1e-6);
  EXPECT_EQ(OpenDescriptors(), before);
}

TEST(MeasureTransferCpuTest, RefusesSizesAndCountsOutOfRange) {
  for (int64_t bytes : {int64_t{0}, int64_t{-5}, kMaxTransferProbeBytes + 1}) {
    absl::StatusOr<double> cpu = MeasureTransferCpu(bytes);
    EXPECT_EQ(cpu.status().code(), absl::StatusCode::kInvalidArgument) << bytes;
    EXPECT_THAT(std::string(cpu.status().message()), HasSubstr("bytes"));
  }
  EXPECT_EQ(MeasureTransferCpu(1024, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureTransferCpu(1024, -1, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasureTransferCpu(1024, 60, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TransferProbeSizesTest, NoneUpToTwiceTheReferenceThenThreeCapped) {
  constexpr int64_t kRef = 4 << 20;
  EXPECT_TRUE(TransferProbeSizes(0, kRef).empty());
  EXPECT_TRUE(TransferProbeSizes(2 * kRef, kRef).empty());
  // The cnn's conv2 cut at batch 128: 18,874,368 bytes.
  EXPECT_THAT(TransferProbeSizes(18874368, kRef),
              ElementsAre(kRef, 8897462, 18874368));
  EXPECT_THAT(TransferProbeSizes(int64_t{1} << 40, kRef),
              ElementsAre(kRef, 11863283, kMaxTransferProbeBytes));
  EXPECT_TRUE(TransferProbeSizes(int64_t{1} << 30, 0).empty());
}

TEST(MeasureTransferCpuBySizeTest, ReportsEachSizeItTimed) {
  // A small reference keeps the test quick: 64 KiB, ~0.7 MiB, 8 MiB.
  auto got = MeasureTransferCpuBySize(8 << 20, 64 << 10);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].message_bytes(), 64 << 10);
  EXPECT_EQ(got[2].message_bytes(), 8 << 20);
  for (const auto& m : got) {
    EXPECT_GT(m.cpu_seconds_per_byte(), 0) << m.message_bytes();
    EXPECT_TRUE(m.worker_id().empty());  // the coordinator names the worker
  }
  EXPECT_TRUE(MeasureTransferCpuBySize(100 << 10, 64 << 10).empty());
}

}  // namespace
}  // namespace worker
}  // namespace apapo
