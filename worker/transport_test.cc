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
#include "absl/synchronization/notification.h"
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

// A ReLU's output at about half zeros, as the mlp's cuts carry.
at::Tensor ReluLike(int64_t batch, int64_t width, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::relu(torch::randn({batch, width}));
}

TEST(SkipZerosTest, ActivationsAndGradientsRoundTripExactlyInFewerBytes) {
  // 37 values a sample: the mask's last byte is partly padding.
  std::vector<BundleEntry> entries = {{"relu1", {37}, DType::kFloat32, true},
                                      {"fc2", {5}, DType::kFloat32, false},
                                      {"labels", {}, DType::kInt64, false}};
  const int64_t batch = 64;
  at::Tensor h = ReluLike(batch, 37, 5);
  h[0][0] = -0.0f;  // a negative zero is a zero
  at::Tensor x = torch::randn({batch, 5});
  at::Tensor y = torch::arange(batch, torch::kLong) + (int64_t{1} << 40);
  std::vector<at::Tensor> sent_masks;
  at::Tensor bytes = PackSkippingZeros({h, x, y}, entries, WirePrecision::kFloat32,
                                       BundleKind::kActivations, sent_masks);
  const int64_t nonzero = (h != 0).sum().item<int64_t>();
  ASSERT_GT(nonzero, batch * 37 / 4);
  ASSERT_LT(nonzero, batch * 37 * 3 / 4);
  // Length, the mask (padded to 8 bytes), the nonzero values, the rest whole.
  const int64_t mask_bytes = (batch * 37 + 7) / 8;
  EXPECT_EQ(bytes.numel(), 8 + (mask_bytes + 7) / 8 * 8 + (nonzero * 4 + 7) / 8 * 8 +
                               batch * 5 * 4 + batch * 8);
  EXPECT_LT(bytes.numel(), SkipZerosCapacity(entries, batch, WirePrecision::kFloat32,
                                             BundleKind::kActivations));
  EXPECT_LT(bytes.numel(), BundleBytes(entries, batch, WirePrecision::kFloat32));
  ASSERT_EQ(sent_masks.size(), 3u);
  EXPECT_TRUE(torch::equal(sent_masks[0], h != 0));
  EXPECT_FALSE(sent_masks[1].defined());

  std::vector<at::Tensor> got_masks;
  auto back = UnpackSkippingZeros(bytes, entries, batch, WirePrecision::kFloat32,
                                  BundleKind::kActivations, got_masks);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(torch::equal((*back)[0], h.abs())) << "every value, bit for bit";
  EXPECT_TRUE(torch::equal((*back)[1], x));
  EXPECT_TRUE(torch::equal((*back)[2], y));
  EXPECT_TRUE(torch::equal(got_masks[0], sent_masks[0]));

  // The gradients answer with values at the mask's positions only; the
  // receiver's zeros elsewhere are what the ReLU's backward makes of any.
  std::vector<BundleEntry> grads = {entries[0], entries[1]};
  at::Tensor gh = torch::randn({batch, 37});
  at::Tensor gx = torch::randn({batch, 5});
  std::vector<at::Tensor> masks = {got_masks[0], at::Tensor()};
  at::Tensor gbytes = PackSkippingZeros({gh, gx}, grads, WirePrecision::kFloat32,
                                        BundleKind::kGradients, masks);
  EXPECT_EQ(gbytes.numel(), 8 + (nonzero * 4 + 7) / 8 * 8 + batch * 5 * 4);
  masks = {sent_masks[0], at::Tensor()};
  auto gback = UnpackSkippingZeros(gbytes, grads, batch, WirePrecision::kFloat32,
                                   BundleKind::kGradients, masks);
  ASSERT_TRUE(gback.ok()) << gback.status();
  EXPECT_TRUE(torch::equal((*gback)[0], gh * sent_masks[0]));
  EXPECT_TRUE(torch::equal((*gback)[1], gx));
  // What the producing ReLU passes back is the same either way.
  at::Tensor pre = torch::randn({batch, 37}).requires_grad_(true);
  at::Tensor out = torch::relu(pre);
  at::Tensor dense = torch::autograd::grad({out}, {pre}, {gh}, true)[0];
  at::Tensor skipped =
      torch::autograd::grad({out}, {pre}, {gh * (out != 0)}, false)[0];
  EXPECT_TRUE(torch::equal(dense, skipped));
}

TEST(SkipZerosTest, BFloat16MasksWhatRoundsToZero) {
  std::vector<BundleEntry> entries = {{"relu", {64}, DType::kFloat32, true}};
  const int64_t batch = 16;
  at::Tensor h = ReluLike(batch, 64, 9);
  h[1][3] = 1e-45f;  // a float32 denormal bfloat16 rounds to zero
  std::vector<at::Tensor> masks;
  at::Tensor bytes = PackSkippingZeros({h}, entries, WirePrecision::kBFloat16,
                                       BundleKind::kActivations, masks);
  const at::Tensor rounded = h.to(torch::kBFloat16).to(torch::kFloat);
  EXPECT_TRUE(torch::equal(masks[0], rounded != 0));
  EXPECT_FALSE(masks[0][1][3].item<bool>());
  std::vector<at::Tensor> got;
  auto back = UnpackSkippingZeros(bytes, entries, batch, WirePrecision::kBFloat16,
                                  BundleKind::kActivations, got);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(torch::equal((*back)[0], rounded)) << "as PackBundle would round";
  // A bundle read in the other precision does not come out.
  std::vector<at::Tensor> other;
  EXPECT_FALSE(UnpackSkippingZeros(bytes, entries, batch, WirePrecision::kFloat32,
                                   BundleKind::kActivations, other)
                   .ok());
}

TEST(SkipZerosTest, DamagedBundlesAreRefusedNamingTheEntry) {
  std::vector<BundleEntry> entries = {{"relu3", {16}, DType::kFloat32, true}};
  at::Tensor h = ReluLike(8, 16, 2);
  std::vector<at::Tensor> masks;
  at::Tensor bytes = PackSkippingZeros({h}, entries, WirePrecision::kFloat32,
                                       BundleKind::kActivations, masks);
  std::vector<at::Tensor> got;
  // Cut short (its length still says the whole).
  auto cut = UnpackSkippingZeros(bytes.narrow(0, 0, bytes.numel() - 8).clone(),
                                 entries, 8, WirePrecision::kFloat32,
                                 BundleKind::kActivations, got);
  EXPECT_THAT(cut.status().message(), HasSubstr("gives its length"));
  // One more mask bit than values: the count runs past the end.
  at::Tensor more = bytes.clone();
  uint8_t* bits = more.data_ptr<uint8_t>() + 8;
  for (int i = 0; i < 16; ++i) bits[i] = 0xff;
  auto over = UnpackSkippingZeros(more, entries, 8, WirePrecision::kFloat32,
                                  BundleKind::kActivations, got);
  EXPECT_THAT(over.status().message(), HasSubstr("ends inside entry 'relu3'"));
  // Gradients without the mask they answer.
  std::vector<at::Tensor> none = {at::Tensor()};
  auto grads = UnpackSkippingZeros(bytes, entries, 8, WirePrecision::kFloat32,
                                   BundleKind::kGradients, none);
  EXPECT_THAT(grads.status().message(), HasSubstr("no mask"));
}

TEST(GlooTransportTest, LengthPrefixedMessagesArriveAtTheirLength) {
  auto server = StartStoreServer();
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<BundleEntry> entries = {{"relu", {256}, DType::kFloat32, true},
                                      {"labels", {}, DType::kInt64, false}};
  const int64_t batch = 32;
  const int64_t capacity = SkipZerosCapacity(entries, batch, WirePrecision::kFloat32,
                                             BundleKind::kActivations);
  std::vector<at::Tensor> sent;
  std::vector<at::Tensor> masks;
  for (int i = 0; i < 3; ++i) {
    at::Tensor h = ReluLike(batch, 256, 20 + i);
    h.narrow(0, 0, i * 10).zero_();  // three different sizes
    sent.push_back(PackSkippingZeros({h, torch::arange(batch, torch::kLong)}, entries,
                                     WirePrecision::kFloat32,
                                     BundleKind::kActivations, masks));
  }
  absl::Status peer_status;
  std::thread peer([&] {
    auto t = CreateGlooTransport(Options(port, 1, 2));
    if (!t.ok()) {
      peer_status = t.status();
      return;
    }
    for (int i = 0; i < 3; ++i) peer_status.Update((*t)->Send(0, i, sent[i]));
    // A length past what the receiver posted for.
    at::Tensor liar = torch::zeros({16}, torch::kUInt8);
    const int64_t huge = capacity * 2;
    std::memcpy(liar.data_ptr<uint8_t>(), &huge, sizeof(huge));
    peer_status.Update((*t)->Send(0, 3, liar));
    peer_status.Update((*t)->Flush());
  });
  auto t = CreateGlooTransport(Options(port, 0, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE((*t)->ExpectRecvUpTo(1, 9, 4).ok()) << "no room for the length";
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*t)->ExpectRecvUpTo(1, i, capacity).ok());
  int64_t received = 0;
  for (int i = 0; i < 3; ++i) {
    auto m = (*t)->Recv(1, i);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->numel(), sent[i].numel());
    EXPECT_TRUE(torch::equal(*m, sent[i]));
    received += sent[i].numel();
  }
  EXPECT_LT(sent[2].numel(), sent[0].numel());
  EXPECT_EQ((*t)->Stats().bytes_received, received) << "counted at their length";
  auto bad = (*t)->Recv(1, 3);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("(tag 3) gives its length as"));
  EXPECT_THAT(bad.status().message(), HasSubstr("rank 1"));
  peer.join();
  EXPECT_TRUE(peer_status.ok()) << peer_status;
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

// Parts started one by one (the executor's overlap of the all-reduce with
// the backward) sum as one call would: each is copied when started (the
// caller may change its tensors at once), its sums come back in order, in
// the shapes given, and the buffers are reused over iterations whose parts
// differ in size.
TEST(GlooTransportTest, AllReduceInPartsSumsEachPartAsCopiedWhenStarted) {
  auto server = StartStoreServer();
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // Iteration it, part k: rank r holds (r + 1) * (10 * it + k + 1).
  auto part = [](int it, int k, int rank) {
    const float f = (rank + 1) * (10.0f * it + k + 1);
    switch (k) {
      case 0:
        return std::vector<at::Tensor>{torch::full({3, 2}, f), torch::full({4}, -f)};
      case 1:
        return std::vector<at::Tensor>{torch::full({5 + it}, f)};
      default:
        return std::vector<at::Tensor>{torch::full({1}, f)};
    }
  };
  absl::Status peer_status;
  std::thread peer([&] {
    auto t = CreateGlooTransport(Options(port, 1, 2));
    if (!t.ok()) {
      peer_status = t.status();
      return;
    }
    for (int it = 0; it < 3; ++it) {
      for (int k = 0; k < 3; ++k) peer_status.Update((*t)->StartAllReduceSum(0, part(it, k, 1)));
      auto sums = (*t)->FinishAllReduceSums(0);
      peer_status.Update(sums.status());
    }
  });
  auto t = CreateGlooTransport(Options(port, 0, 2));
  ASSERT_TRUE(t.ok()) << t.status();
  for (int it = 0; it < 3; ++it) {
    for (int k = 0; k < 3; ++k) {
      std::vector<at::Tensor> given = part(it, k, 0);
      ASSERT_TRUE((*t)->StartAllReduceSum(0, given).ok()) << it << " " << k;
      for (auto& g : given) g.fill_(1e6);  // after the start: not summed
    }
    // The parts complete on the group's threads; done says when.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!(*t)->AllReduceSumsDone(0) && absl::Now() < deadline) {
      std::this_thread::yield();
    }
    EXPECT_TRUE((*t)->AllReduceSumsDone(0)) << "iteration " << it;
    auto sums = (*t)->FinishAllReduceSums(0);
    ASSERT_TRUE(sums.ok()) << sums.status();
    ASSERT_EQ(sums->size(), 3u) << "iteration " << it;
    for (int k = 0; k < 3; ++k) {
      const std::vector<at::Tensor> want = part(it, k, 0);
      ASSERT_EQ((*sums)[k].size(), want.size()) << it << " " << k;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ((*sums)[k][i].sizes(), want[i].sizes()) << it << " " << k << " " << i;
        EXPECT_TRUE(torch::equal((*sums)[k][i], want[i] * 3)) << it << " " << k << " " << i;
      }
    }
  }
  // Nothing started: nothing to wait for.
  EXPECT_TRUE((*t)->AllReduceSumsDone(0));
  auto none = (*t)->FinishAllReduceSums(0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  EXPECT_EQ((*t)->StartAllReduceSum(3, part(0, 0, 0)).code(),
            absl::StatusCode::kInvalidArgument);
  peer.join();
  EXPECT_TRUE(peer_status.ok()) << peer_status;
}

// A peer that starts fewer parts than this rank (a hung or diverged
// replica) fails the finish within the timeout, naming the group, and the
// transport stays failed.
TEST(GlooTransportTest, AllReducePartTheGroupNeverJoinsIsAnErrorNotAHang) {
  auto server = StartStoreServer();
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  absl::Notification done;
  absl::Status peer_status;
  std::thread peer([&] {
    auto o = Options(port, 1, 2);
    o.timeout = absl::Seconds(1);
    auto t = CreateGlooTransport(o);
    if (!t.ok()) {
      peer_status = t.status();
      return;
    }
    peer_status.Update((*t)->StartAllReduceSum(0, {torch::ones({8})}));
    done.WaitForNotification();  // connected, silent after one part
  });
  auto o = Options(port, 0, 2);
  o.timeout = absl::Seconds(1);
  auto t = CreateGlooTransport(o);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->StartAllReduceSum(0, {torch::ones({8})}).ok());
  ASSERT_TRUE((*t)->StartAllReduceSum(0, {torch::ones({4})}).ok());
  EXPECT_FALSE((*t)->AllReduceSumsDone(0));  // the second part has no peer
  auto sums = (*t)->FinishAllReduceSums(0);
  done.Notify();
  peer.join();
  ASSERT_FALSE(sums.ok());
  EXPECT_EQ(sums.status().code(), absl::StatusCode::kUnavailable) << sums.status();
  EXPECT_THAT(std::string(sums.status().message()), HasSubstr("replica group 0"));
  EXPECT_THAT(std::string(sums.status().message()), HasSubstr("stage 0"));
  EXPECT_FALSE((*t)->StartAllReduceSum(0, {torch::ones({8})}).ok());
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
