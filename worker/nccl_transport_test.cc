// Runs only with a GPU (built with --config=cuda). One GPU is enough: NCCL
// refuses two ranks on one device, so rank 0 sends to itself inside a group
// and all-reduces alone, and the failure tests use a communicator whose
// other rank never joins. Skips when no device is visible.
#include "worker/nccl_transport.h"

#include <chrono>
#include <cstdio>
#include <vector>

#include "gtest/gtest.h"

namespace apapo {
namespace worker {
namespace {

bool HaveDevice() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

std::unique_ptr<NcclTransport> SoloTransport() {
  auto id = NcclTransport::NewUniqueId();
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return nullptr;
  auto t = NcclTransport::Create(*id, 0, 1, 0, absl::Seconds(60), "stage 0");
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  return std::move(*t);
}

// A device buffer of `count` floats, freed on scope exit.
struct DeviceFloats {
  explicit DeviceFloats(size_t count) : count(count) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr), bytes()),
              cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(ptr); }
  size_t bytes() const { return count * sizeof(float); }
  float* ptr = nullptr;
  size_t count;
};

TEST(NcclTransportTest, SelfSendReceiveInAGroupThenAllReduce) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  auto t = SoloTransport();
  ASSERT_NE(t, nullptr);
  // 64 MiB: large enough that an event recorded before the group launched
  // (the bug this guards against) would be seen complete long before the
  // data arrived.
  const size_t n = size_t{16} << 20;
  DeviceFloats a(n), b(n);
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 4099);
  ASSERT_EQ(cudaMemcpy(a.ptr, host.data(), a.bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemset(b.ptr, 0, b.bytes()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(t->GroupStart().ok());
  auto s = t->PostSend(a.ptr, a.bytes(), 0);
  auto r = t->PostRecv(b.ptr, b.bytes(), 0);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(r.ok()) << r.status();
  // Inside the open group nothing has launched: waiting is refused.
  EXPECT_EQ(t->Wait(*r).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t->GroupEnd().ok());
  ASSERT_TRUE(t->Wait(*s).ok());
  ASSERT_TRUE(t->Wait(*r).ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  // Read b on the receive's own (non-blocking) stream's terms: Wait returned,
  // so a plain copy must see every received byte.
  std::vector<float> out(n);
  ASSERT_EQ(cudaMemcpy(out.data(), b.ptr, b.bytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(out, host);
  std::printf("self send/receive of %zu MiB: %.3f ms (%.1f GB/s)\n",
              a.bytes() >> 20, seconds * 1e3, a.bytes() / seconds / 1e9);

  ASSERT_TRUE(t->AllReduceSum(b.ptr, n).ok());
  ASSERT_EQ(cudaMemcpy(out.data(), b.ptr, b.bytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(out, host);  // one rank: the sum is itself
}

TEST(NcclTransportTest, UnknownTicketAndUnbalancedGroupAreErrors) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  auto t = SoloTransport();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Wait(12345).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->GroupEnd().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(NcclTransportTest, MalformedIdIsRejected) {
  auto t = NcclTransport::Create("short", 0, 2, 0, absl::Seconds(1), "stage 0");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclTransportTest, APeerThatNeverJoinsTimesOutInsteadOfHanging) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  auto id = NcclTransport::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const auto start = std::chrono::steady_clock::now();
  auto t = NcclTransport::Create(*id, 0, 2, 0, absl::Seconds(3), "stage 0");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded)
      << t.status();
  EXPECT_NE(t.status().message().find("rank 0 of 2"), std::string::npos)
      << t.status();
  EXPECT_NE(t.status().message().find("stage 0"), std::string::npos)
      << t.status();
  std::printf("a missing peer was reported after %.1f s: %s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                            start)
                  .count(),
              std::string(t.status().message()).c_str());
}

}  // namespace
}  // namespace worker
}  // namespace apapo
