// Runs only with a GPU (built with --config=cuda): one rank sends to itself
// inside an NCCL group and all-reduces. Skips when no device is visible.
#include "worker/nccl_transport.h"

#include <vector>

#include "gtest/gtest.h"

namespace apapo {
namespace worker {
namespace {

TEST(NcclTransportTest, SelfSendReceiveAndAllReduce) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto id = NcclTransport::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto t = NcclTransport::Create(*id, 0, 1, 0, absl::Seconds(30), "stage 0");
  ASSERT_TRUE(t.ok()) << t.status();
  float* a = nullptr;
  float* b = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&a), 64 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&b), 64 * sizeof(float)), cudaSuccess);
  std::vector<float> host(64);
  for (int i = 0; i < 64; ++i) host[i] = i;
  cudaMemcpy(a, host.data(), 64 * sizeof(float), cudaMemcpyHostToDevice);
  // A self send/receive must be in one group to not deadlock.
  ncclGroupStart();
  auto s = (*t)->PostSend(a, 64 * sizeof(float), 0);
  auto r = (*t)->PostRecv(b, 64 * sizeof(float), 0);
  ncclGroupEnd();
  ASSERT_TRUE(s.ok() && r.ok());
  ASSERT_TRUE((*t)->Wait(*s).ok());
  ASSERT_TRUE((*t)->Wait(*r).ok());
  ASSERT_TRUE((*t)->AllReduceSum(b, 64).ok());
  std::vector<float> out(64);
  cudaMemcpy(out.data(), b, 64 * sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(out, host);
  cudaFree(a);
  cudaFree(b);
}

}  // namespace
}  // namespace worker
}  // namespace apapo
