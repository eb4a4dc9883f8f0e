// WeightStore on its own: versions live while used or newest, dropped
// versions' tensors are recycled (never version 0's), 2BW keeps the one
// before the newest, and predictions run ahead of their version.
#include "worker/weight_store.h"

#include <torch/torch.h>

#include "gtest/gtest.h"

namespace apapo::worker {
namespace {

std::unique_ptr<Optimizer> Sgd(double lr, double momentum) {
  apapo::v1::OptimizerSpec spec;
  spec.set_learning_rate(lr);
  spec.mutable_sgd()->set_momentum(momentum);
  auto opt = Optimizer::Create(spec, /*total_steps=*/100);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return *std::move(opt);
}

std::vector<at::Tensor> Weights(float value) {
  return {torch::full({4}, value).set_requires_grad(true)};
}

std::vector<at::Tensor> Grads(float value) { return {torch::full({4}, value)}; }

void UpdateWith(WeightStore& store, std::vector<at::Tensor> grads, int64_t step) {
  store.Update(grads, step);
}

TEST(WeightStoreTest, VersionsLiveWhileInFlightThenAreRecycled) {
  auto opt = Sgd(0.5, 0);
  const std::vector<at::Tensor> initial = Weights(1);
  WeightStore store(opt.get(), {}, initial);
  EXPECT_EQ(store.newest(), 0);
  store.Acquire(0);  // a forward on version 0
  UpdateWith(store, Grads(1), 0);
  EXPECT_EQ(store.newest(), 1);
  EXPECT_TRUE(store.holds(0));  // still in flight
  EXPECT_EQ(store.size(), 2);
  EXPECT_FLOAT_EQ(store.newest_weights()[0][0].item<float>(), 0.5);
  store.Release(0);
  EXPECT_FALSE(store.holds(0));
  EXPECT_EQ(store.size(), 1);
  // Version 0 was the caller's: not reused, untouched.
  EXPECT_FLOAT_EQ(initial[0][0].item<float>(), 1);

  // Version 1 is dropped by the next update: its storage becomes version 3.
  const void* v1 = store.newest_weights()[0].data_ptr();
  UpdateWith(store, Grads(1), 1);
  UpdateWith(store, Grads(1), 2);
  EXPECT_EQ(store.newest(), 3);
  EXPECT_EQ(store.newest_weights()[0].data_ptr(), v1);
  EXPECT_FLOAT_EQ(store.newest_weights()[0][0].item<float>(), -0.5);
}

TEST(WeightStoreTest, NoRecyclingKeepsDroppedTensorsIntact) {
  auto opt = Sgd(0.5, 0);
  WeightStore::Options o;
  o.recycle = false;
  WeightStore store(opt.get(), o, Weights(1));
  UpdateWith(store, Grads(1), 0);
  const at::Tensor v1 = store.newest_weights()[0];
  UpdateWith(store, Grads(1), 1);
  UpdateWith(store, Grads(1), 2);
  EXPECT_FLOAT_EQ(v1[0].item<float>(), 0.5);
}

TEST(WeightStoreTest, TwoBwKeepsThePreviousVersion) {
  auto opt = Sgd(0.5, 0);
  WeightStore::Options o;
  o.keep_previous = true;
  WeightStore store(opt.get(), o, Weights(1));
  UpdateWith(store, Grads(1), 0);
  UpdateWith(store, Grads(1), 1);
  EXPECT_TRUE(store.holds(1));
  EXPECT_FALSE(store.holds(0));
  EXPECT_EQ(store.size(), 2);
}

TEST(WeightStoreTest, PredictionRunsAheadAlongTheMomentum) {
  // SGD with momentum 0.9: after one step with gradient g the velocity is g,
  // so one update ahead is W1 - lr * (0.9 * g) ... within the optimizer's
  // own definition: compare with Predict itself.
  auto opt = Sgd(0.1, 0.9);
  WeightStore::Options o;
  o.prediction_steps = 1;
  WeightStore store(opt.get(), o, Weights(1));
  UpdateWith(store, Grads(1), 0);
  const std::vector<at::Tensor>& predicted = store.ComputeWeights(1, 1);
  const std::vector<at::Tensor> expected =
      opt->Predict(store.newest_weights(), 1, 1);
  EXPECT_TRUE(torch::allclose(predicted[0], expected[0]));
  EXPECT_FALSE(predicted[0].is_same(store.newest_weights()[0]));
  // The same tensors on every call for the version.
  EXPECT_TRUE(store.ComputeWeights(1, 1)[0].is_same(predicted[0]));
  // Without prediction, the version's own tensors.
  WeightStore plain(opt.get(), {}, Weights(1));
  EXPECT_TRUE(plain.ComputeWeights(0, 0)[0].is_same(plain.newest_weights()[0]));
}

TEST(WeightStoreTest, ResetReplacesEverything) {
  auto opt = Sgd(0.5, 0);
  WeightStore store(opt.get(), {}, Weights(1));
  store.Acquire(0);
  UpdateWith(store, Grads(1), 0);
  store.Reset(7, Weights(3));
  EXPECT_EQ(store.newest(), 7);
  EXPECT_EQ(store.size(), 1);
  EXPECT_FALSE(store.holds(0));
  EXPECT_FLOAT_EQ(store.newest_weights()[0][0].item<float>(), 3);
}

}  // namespace
}  // namespace apapo::worker
