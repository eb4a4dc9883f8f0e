// The functional optimizers against LibTorch's torch::optim on the same
// gradients, and the learning-rate schedule.
#include "worker/optimizer.h"

#include <torch/torch.h>

#include "gtest/gtest.h"

namespace apapo {
namespace worker {
namespace {

// Runs 5 steps of ours and of `reference` from the same start with the
// same (parameter-dependent) gradients; returns the largest difference
// relative to the largest weight. (Float rounding differs: our SGD step is
// one fused loop, ATen's kernels use FMA; the cubic loss amplifies it.)
double Compare(const apapo::v1::OptimizerSpec& spec,
               torch::optim::Optimizer& reference, torch::Tensor ref_param) {
  auto opt = Optimizer::Create(spec, 5);
  EXPECT_TRUE(opt.ok());
  std::vector<at::Tensor> params = {ref_param.detach().clone()};
  for (int step = 0; step < 5; ++step) {
    // Loss sum(p^3) has a gradient that depends on the current weights.
    std::vector<at::Tensor> grads = {3 * params[0].detach().pow(2)};
    params = (*opt)->Step(params, grads, step);
    reference.zero_grad();
    ref_param.pow(3).sum().backward();
    reference.step();
  }
  return (params[0] - ref_param.detach()).abs().max().item<double>() /
         ref_param.detach().abs().max().item<double>();
}

TEST(OptimizerTest, SgdMomentumWeightDecayMatchesTorchOptim) {
  torch::manual_seed(0);
  torch::Tensor p = torch::randn({7, 3}).requires_grad_(true);
  apapo::v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_momentum(0.9);
  spec.set_learning_rate(0.05);
  spec.set_weight_decay(0.01);
  std::vector<torch::Tensor> start = {p.detach().clone()};
  torch::Tensor q = start[0].clone().requires_grad_(true);
  torch::optim::SGD sgd2({q}, torch::optim::SGDOptions(0.05).momentum(0.9)
                                  .weight_decay(0.01));
  EXPECT_LT(Compare(spec, sgd2, q), 1e-6);

  spec.mutable_sgd()->set_nesterov(true);
  torch::Tensor n = start[0].clone().requires_grad_(true);
  torch::optim::SGD nesterov({n}, torch::optim::SGDOptions(0.05).momentum(0.9)
                                      .weight_decay(0.01).nesterov(true));
  EXPECT_LT(Compare(spec, nesterov, n), 1e-6);
}

TEST(OptimizerTest, AdamMatchesTorchOptim) {
  torch::manual_seed(1);
  torch::Tensor p = torch::randn({5, 4}).requires_grad_(true);
  apapo::v1::OptimizerSpec spec;
  spec.mutable_adam();
  spec.set_learning_rate(0.01);
  spec.set_weight_decay(0.001);
  torch::optim::Adam adam({p}, torch::optim::AdamOptions(0.01)
                                   .weight_decay(0.001));
  EXPECT_LT(Compare(spec, adam, p), 1e-6);
}

TEST(OptimizerTest, StepNeverWritesTheGivenVersion) {
  apapo::v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_momentum(0.9);
  spec.set_learning_rate(0.1);
  auto opt = Optimizer::Create(spec, 1);
  std::vector<at::Tensor> v0 = {torch::ones({3}).requires_grad_(true)};
  std::vector<at::Tensor> g = {torch::ones({3})};
  auto v1 = (*opt)->Step(v0, g, 0);
  EXPECT_TRUE(torch::equal(v0[0], torch::ones({3})));
  EXPECT_TRUE(torch::allclose(v1[0], torch::full({3}, 0.9)));
  EXPECT_TRUE(v1[0].requires_grad());
  EXPECT_TRUE(v1[0].is_leaf());
}

TEST(OptimizerTest, StepWritesIntoRecycledTensors) {
  apapo::v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_momentum(0.9);
  spec.set_learning_rate(0.1);
  auto opt = Optimizer::Create(spec, 2);
  std::vector<at::Tensor> v0 = {torch::ones({3}).requires_grad_(true)};
  std::vector<at::Tensor> g = {torch::ones({3})};
  std::vector<at::Tensor> spare = {torch::zeros({3}).requires_grad_(true)};
  const void* storage = spare[0].data_ptr();
  auto v1 = (*opt)->Step(v0, g, 0, spare);
  EXPECT_EQ(v1[0].data_ptr(), storage);
  EXPECT_TRUE(torch::allclose(v1[0], torch::full({3}, 0.9)));
  EXPECT_TRUE(torch::equal(v0[0], torch::ones({3})));
  // Wrong shapes are not reused.
  auto v2 = (*opt)->Step(v1, g, 1, {torch::zeros({4})});
  EXPECT_NE(v2[0].data_ptr(), storage);
  EXPECT_EQ(v2[0].sizes(), v1[0].sizes());
}

TEST(OptimizerTest, PredictMovesAlongTheStepDirection) {
  apapo::v1::OptimizerSpec sgd;
  sgd.mutable_sgd()->set_momentum(0.9);
  sgd.set_learning_rate(0.1);
  auto opt = Optimizer::Create(sgd, 3);
  std::vector<at::Tensor> v0 = {torch::ones({3}).requires_grad_(true)};
  // No direction before the first step: the weights as they are.
  EXPECT_TRUE(torch::equal((*opt)->Predict(v0, 2, 0)[0], v0[0]));
  std::vector<at::Tensor> g = {torch::full({3}, 2.0)};
  auto v1 = (*opt)->Step(v0, g, 0);  // buffer = 2, v1 = 1 - 0.1 * 2 = 0.8
  auto p = (*opt)->Predict(v1, 2, 1);
  EXPECT_TRUE(torch::allclose(p[0], torch::full({3}, 0.8 - 2 * 0.1 * 2)));
  EXPECT_TRUE(torch::allclose(v1[0], torch::full({3}, 0.8)));  // untouched
  EXPECT_TRUE(p[0].requires_grad());
  // Into a recycled tensor: same values, its storage, no allocation.
  at::Tensor recycled = torch::zeros({3}).requires_grad_(true);
  void* storage = recycled.data_ptr();
  auto r = (*opt)->Predict(v1, 2, 1, {recycled});
  EXPECT_EQ(r[0].data_ptr(), storage);
  EXPECT_TRUE(torch::equal(r[0], p[0]));
  EXPECT_TRUE(r[0].requires_grad());

  apapo::v1::OptimizerSpec adam;
  adam.mutable_adam();
  adam.set_learning_rate(0.01);
  auto a = Optimizer::Create(adam, 3);
  auto w1 = (*a)->Step(v0, g, 0);
  // After one step m_hat = g, v_hat = g^2: the direction is ~sign(g).
  auto q = (*a)->Predict(w1, 1, 1);
  EXPECT_TRUE(torch::allclose(q[0], w1[0] - 0.01, 1e-5, 1e-6));
}

// The fused SGD-momentum pass (every step after the first) computes what
// torch.optim's formulas give, and its prediction is Predict's.
TEST(OptimizerTest, FusedStepAndPredictionMatchTheFormulas) {
  for (bool nesterov : {false, true}) {
    apapo::v1::OptimizerSpec spec;
    spec.mutable_sgd()->set_momentum(0.9);
    spec.mutable_sgd()->set_nesterov(nesterov);
    spec.set_learning_rate(0.1);
    spec.set_weight_decay(0.01);
    spec.mutable_lr_schedule()->set_warmup_steps(3);
    auto opt = Optimizer::Create(spec, 10);
    ASSERT_TRUE(opt.ok());
    torch::manual_seed(3);
    std::vector<at::Tensor> w = {torch::randn({5, 7}).requires_grad_(true),
                                 torch::randn({7}).requires_grad_(true)};
    std::vector<at::Tensor> buf(2);
    for (int64_t step = 0; step < 4; ++step) {
      std::vector<at::Tensor> g = {torch::randn({5, 7}), torch::randn({7})};
      // The reference: torch.optim.SGD's update, written out.
      std::vector<at::Tensor> expect;
      const double lr = (*opt)->LearningRate(step);
      for (size_t i = 0; i < w.size(); ++i) {
        at::Tensor gi = g[i] + 0.01 * w[i].detach();
        buf[i] = step == 0 ? gi.clone() : 0.9 * buf[i] + gi;
        at::Tensor dir = nesterov ? gi + 0.9 * buf[i] : buf[i];
        expect.push_back(w[i].detach() - lr * dir);
      }
      Optimizer::FusedPrediction pred;
      pred.steps = 1;
      auto next = (*opt)->Step(w, g, step, {}, &pred);
      for (size_t i = 0; i < w.size(); ++i) {
        EXPECT_TRUE(torch::allclose(next[i], expect[i], 1e-5, 1e-6))
            << "step " << step << " param " << i << " nesterov " << nesterov;
      }
      if (step == 0) {
        EXPECT_TRUE(pred.out.empty());  // the first step is not fused
      } else {
        ASSERT_EQ(pred.out.size(), w.size());
        auto lazy = (*opt)->Predict(next, 1, step + 1);
        for (size_t i = 0; i < w.size(); ++i) {
          // Bit for bit: a resumed run predicts lazily what an
          // uninterrupted one predicted in the fused pass.
          EXPECT_TRUE(torch::equal(pred.out[i], lazy[i]));
          EXPECT_TRUE(pred.out[i].requires_grad());
        }
      }
      w = next;
    }
  }
}

TEST(OptimizerTest, LearningRateWarmupDecayAndClipping) {
  apapo::v1::OptimizerSpec spec;
  spec.mutable_sgd();
  spec.set_learning_rate(1.0);
  spec.mutable_lr_schedule()->set_warmup_steps(4);
  spec.mutable_lr_schedule()->set_decay(
      apapo::v1::LearningRateSchedule::DECAY_COSINE);
  spec.set_grad_clip_norm(1.0);
  auto opt = Optimizer::Create(spec, 14);
  ASSERT_TRUE(opt.ok());
  EXPECT_DOUBLE_EQ((*opt)->LearningRate(0), 0.25);
  EXPECT_DOUBLE_EQ((*opt)->LearningRate(3), 1.0);
  EXPECT_NEAR((*opt)->LearningRate(9), 0.5, 1e-12);  // half-way down
  std::vector<at::Tensor> p = {torch::zeros({2}).requires_grad_(true)};
  std::vector<at::Tensor> g = {torch::tensor({3.0f, 4.0f})};  // norm 5
  auto next = (*opt)->Step(p, g, 3);  // lr 1
  EXPECT_NEAR(next[0].norm().item<double>(), 1.0, 1e-5);

  apapo::v1::OptimizerSpec bad;
  bad.mutable_sgd();
  EXPECT_EQ(Optimizer::Create(bad, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace worker
}  // namespace apapo
