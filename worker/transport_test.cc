// Transport tests. Two ranks run as threads of this process, except the
// peer-death test, which re-executes this binary as a real peer process
// (`transport_test --peer=PORT`) and kills it.

#include "worker/transport.h"

#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo {
namespace worker {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

GlooTransportOptions Options(int port, int rank, int world) {
  GlooTransportOptions o;
  o.store_port = port;
  o.rank = rank;
  o.world_size = world;
  o.timeout = absl::Seconds(60);
  o.label = absl::StrCat("stage ", rank, " (rank ", rank, ")");
  o.groups = {{0, 1}};
  return o;
}

TEST(BundleTest, PackUnpackRoundTripsMixedDtypes) {
  std::vector<BundleEntry> entries = {
      {"a", {3}, DType::kFloat32},  // 12 bytes per sample: needs padding
      {"labels", {}, DType::kInt64}};
  at::Tensor a = torch::arange(9, torch::kFloat).view({3, 3});
  at::Tensor y = torch::tensor({7, 8, 9}, torch::kLong);
  at::Tensor bytes = PackBundle({a, y}, WirePrecision::kFloat32);
  EXPECT_EQ(bytes.numel(), BundleBytes(entries, 3, WirePrecision::kFloat32));
  auto back = UnpackBundle(bytes, entries, 3, WirePrecision::kFloat32);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(torch::equal((*back)[0], a));
  EXPECT_TRUE(torch::equal((*back)[1], y));
  EXPECT_FALSE(UnpackBundle(bytes, entries, 4, WirePrecision::kFloat32).ok());
}

TEST(BundleTest, BFloat16HalvesTheFloatBytesAndKeepsIntegersExact) {
  std::vector<BundleEntry> entries = {
      {"h", {256}, DType::kFloat32}, {"labels", {}, DType::kInt64}};
  const int64_t batch = 64;
  torch::manual_seed(3);
  // Values across float32's range, beyond float16's 65504.
  at::Tensor h = torch::randn({batch, 256}) *
                 torch::pow(10.0, torch::randint(-20, 20, {batch, 1}).to(torch::kFloat));
  // Token ids past 2^24 would not survive a float of any width.
  at::Tensor y = torch::arange(batch, torch::kLong) + (int64_t{1} << 40);
  const int64_t full = BundleBytes(entries, batch, WirePrecision::kFloat32);
  const int64_t half = BundleBytes(entries, batch, WirePrecision::kBFloat16);
  EXPECT_EQ(full, batch * 256 * 4 + batch * 8);
  EXPECT_EQ(half, batch * 256 * 2 + batch * 8);

  at::Tensor bytes = PackBundle({h, y}, WirePrecision::kBFloat16);
  EXPECT_EQ(bytes.numel(), half);
  auto back = UnpackBundle(bytes, entries, batch, WirePrecision::kBFloat16);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ((*back)[0].scalar_type(), torch::kFloat);
  EXPECT_EQ((*back)[0].sizes(), h.sizes());
  // One rounding to nearest with 8 significant bits: relative error at
  // most half a unit in the last place, 2^-8.
  at::Tensor rel = ((*back)[0] - h).abs() / h.abs().clamp_min(1e-30);
  EXPECT_LE(rel.max().item<float>(), 1.0f / 256) << "bfloat16 rounds to nearest";
  EXPECT_GT(rel.max().item<float>(), 0.0f) << "the values did travel rounded";
  EXPECT_TRUE(torch::isfinite((*back)[0]).all().item<bool>());
  EXPECT_TRUE(torch::equal((*back)[1], y));
  // A bundle packed in one precision does not unpack as the other.
  EXPECT_FALSE(UnpackBundle(bytes, entries, batch, WirePrecision::kFloat32).ok());
}

TEST(BundleTest, WirePrecisionFollowsTheSpec) {
  apapo::v1::JobSpec spec;
  EXPECT_EQ(WirePrecisionFor(spec), WirePrecision::kFloat32);
  spec.mutable_schedule()->set_transfer_precision(
      apapo::v1::TRANSFER_PRECISION_FLOAT32);
  EXPECT_EQ(WirePrecisionFor(spec), WirePrecision::kFloat32);
  spec.mutable_schedule()->set_transfer_precision(
      apapo::v1::TRANSFER_PRECISION_BFLOAT16);
  EXPECT_EQ(WirePrecisionFor(spec), WirePrecision::kBFloat16);
}

TEST(GlooTransportTest, SendRecvAndAllReduceBetweenTwoRanks) {
  auto server = StartStoreServer();
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  absl::Status peer_status;
  std::thread peer([&] {
    auto t = CreateGlooTransport(Options(port, 1, 2));
    if (!t.ok()) {
      peer_status = t.status();
      return;
    }
    // Receive three messages posted ahead, answer each, then all-reduce.
    for (int i = 0; i < 3; ++i) {
      peer_status.Update((*t)->ExpectRecv(0, i, 16));
    }
    for (int i = 0; i < 3; ++i) {
      auto m = (*t)->Recv(0, i);
      if (!m.ok()) {
        peer_status = m.status();
        return;
      }
      at::Tensor reply = m->clone();
      reply.add_(1);
      peer_status.Update((*t)->Send(0, 100 + i, reply));
    }
    std::vector<at::Tensor> g = {torch::full({4}, 3.0f)};
    peer_status.Update((*t)->AllReduceSum(0, g));
    peer_status.Update((*t)->Flush());
  });
  auto t = CreateGlooTransport(Options(port, 0, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*t)->ExpectRecv(1, 100 + i, 16).ok());
    ASSERT_TRUE(
        (*t)->Send(1, i, torch::full({16}, i, torch::kUInt8)).ok());
  }
  for (int i = 0; i < 3; ++i) {
    auto m = (*t)->Recv(1, 100 + i);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(torch::equal(*m, torch::full({16}, i + 1, torch::kUInt8)));
  }
  std::vector<at::Tensor> g = {torch::full({4}, 1.0f)};
  ASSERT_TRUE((*t)->AllReduceSum(0, g).ok());
  EXPECT_TRUE(torch::allclose(g[0], torch::full({4}, 4.0f)));
  ASSERT_TRUE((*t)->Flush().ok());
  peer.join();
  EXPECT_TRUE(peer_status.ok()) << peer_status;
  const TransportStats stats = (*t)->Stats();
  EXPECT_EQ(stats.bytes_sent, 48);
  EXPECT_EQ(stats.bytes_received, 48);
}

// The group's buffer is reused from call to call and replaced when the
// size or dtype changes; the caller's inputs are never written.
TEST(GlooTransportTest, AllReduceSumsRightWhateverTheShapesFromCallToCall) {
  auto server = StartStoreServer();
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // Per call: the tensors' shapes and dtype; rank r holds (r + 1) * base.
  auto inputs = [](int call, int rank) {
    const double f = rank + 1;
    switch (call % 3) {
      case 0:
        return std::vector<at::Tensor>{torch::full({2, 3}, f * call),
                                       torch::full({5}, -f)};
      case 1:
        return std::vector<at::Tensor>{torch::full({7}, f * call)};
      default:
        return std::vector<at::Tensor>{
            torch::full({2}, f * call, torch::kDouble)};
    }
  };
  absl::Status peer_status;
  std::thread peer([&] {
    auto t = CreateGlooTransport(Options(port, 1, 2));
    if (!t.ok()) {
      peer_status = t.status();
      return;
    }
    for (int call = 0; call < 7; ++call) {
      std::vector<at::Tensor> g = inputs(call, 1);
      peer_status.Update((*t)->AllReduceSum(0, g));
    }
  });
  auto t = CreateGlooTransport(Options(port, 0, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  for (int call = 0; call < 7; ++call) {
    std::vector<at::Tensor> g = inputs(call, 0);
    const std::vector<at::Tensor> before = g;
    ASSERT_TRUE((*t)->AllReduceSum(0, g).ok()) << "call " << call;
    ASSERT_EQ(g.size(), before.size());
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_EQ(g[i].sizes(), before[i].sizes()) << "call " << call;
      EXPECT_EQ(g[i].scalar_type(), before[i].scalar_type()) << "call " << call;
      // 1x + 2x the input's value; the input itself unchanged.
      EXPECT_TRUE(torch::equal(g[i], before[i] * 3)) << "call " << call << " " << i;
      EXPECT_TRUE(torch::equal(before[i], inputs(call, 0)[i])) << "call " << call;
    }
  }
  peer.join();
  EXPECT_TRUE(peer_status.ok()) << peer_status;
}

TEST(GlooTransportTest, SilentPeerIsADeadlineNotAHang) {
  auto server = StartStoreServer();
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  std::unique_ptr<Transport> peer_transport;
  std::thread peer([&] {
    auto o = Options(port, 1, 2);
    o.timeout = absl::Seconds(1);
    auto t = CreateGlooTransport(o);
    if (t.ok()) peer_transport = *std::move(t);
  });
  auto o = Options(port, 0, 2);
  o.timeout = absl::Seconds(1);
  auto t = CreateGlooTransport(o);
  peer.join();
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->ExpectRecv(1, 5, 8).ok());
  auto m = (*t)->Recv(1, 5);  // the peer never sends
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("stage 0"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("rank 1"));
  // The transport stays failed.
  EXPECT_FALSE((*t)->Send(1, 1, torch::zeros({1}, torch::kUInt8)).ok());
}

TEST(GlooTransportTest, DeadPeerProcessFailsPendingReceive) {
  auto server = StartStoreServer();
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string arg = absl::StrCat("--peer=", port);
    execl("/proc/self/exe", "transport_test", arg.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  auto t = CreateGlooTransport(Options(port, 0, 2));  // 60 s timeout
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->ExpectRecv(1, 3, 64).ok());
  // The peer is connected and waiting; kill it mid-job.
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  auto m = (*t)->Recv(1, 3);
  ASSERT_FALSE(m.ok());
  // A closed connection is reported as such, not as an expired timeout.
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("stage 0"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("rank 1"));
}

TEST(GlooTransportTest, BindsToTheHostItIsGiven) {
  auto server = StartStoreServer();
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // Rank 1 names the loopback by name, rank 0 by address.
  absl::Status peer_status;
  std::thread peer([&] {
    auto o = Options(port, 1, 2);
    o.host = "localhost";
    auto t = CreateGlooTransport(o);
    if (!t.ok()) {
      peer_status = t.status();
      return;
    }
    peer_status.Update((*t)->ExpectRecv(0, 1, 8));
    auto m = (*t)->Recv(0, 1);
    if (!m.ok()) {
      peer_status = m.status();
      return;
    }
    peer_status.Update((*t)->Send(0, 2, m->clone()));
    peer_status.Update((*t)->Flush());
  });
  auto o = Options(port, 0, 2);
  o.host = "127.0.0.1";
  auto t = CreateGlooTransport(o);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->ExpectRecv(1, 2, 8).ok());
  ASSERT_TRUE((*t)->Send(1, 1, torch::full({8}, 7, torch::kUInt8)).ok());
  auto m = (*t)->Recv(1, 2);
  peer.join();
  ASSERT_TRUE(peer_status.ok()) << peer_status;
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(torch::equal(*m, torch::full({8}, 7, torch::kUInt8)));
}

TEST(GlooTransportTest, HostThatIsNotThisMachineIsAClearErrorAtOnce) {
  auto server = StartStoreServer();
  ASSERT_TRUE(server.ok()) << server.status();
  // A name that cannot resolve and an address (TEST-NET-3) no interface of
  // this machine has; rank 1 never shows up, so only the bind check can
  // end these before the 60 s timeout.
  for (const char* host : {"no-such-host.invalid", "203.0.113.7"}) {
    auto o = Options((*server)->port(), 0, 2);
    o.host = host;
    const absl::Time start = absl::Now();
    auto t = CreateGlooTransport(o);
    ASSERT_FALSE(t.ok()) << host;
    EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << host;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition)
        << t.status();
    EXPECT_THAT(std::string(t.status().message()),
                HasSubstr(absl::StrCat("host '", host, "'")));
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("stage 0"));
    // One readable cause, not LibTorch's C++ backtrace.
    EXPECT_THAT(std::string(t.status().message()), Not(HasSubstr("frame #")));
  }
  EXPECT_TRUE(CheckTransportHost("127.0.0.1").ok());
  EXPECT_EQ(CheckTransportHost("no-such-host.invalid").code(),
            absl::StatusCode::kFailedPrecondition);
}

// Peer mode: connect as rank 1, then wait to be killed.
int RunPeer(int port) {
  auto t = CreateGlooTransport(Options(port, 1, 2));
  if (!t.ok()) return 2;
  pause();
  return 0;
}

}  // namespace
}  // namespace worker
}  // namespace apapo

int main(int argc, char** argv) {
  if (argc == 2 && std::strncmp(argv[1], "--peer=", 7) == 0) {
    int port = 0;
    if (!absl::SimpleAtoi(argv[1] + 7, &port)) return 2;
    return apapo::worker::RunPeer(port);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
