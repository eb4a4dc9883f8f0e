#include "worker/optimizer.h"

#include <torch/torch.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace apapo {
namespace worker {

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const apapo::v1::OptimizerSpec& spec, int64_t total_steps) {
  if (!(spec.learning_rate() > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.optimizer.learning_rate: must be > 0, got ",
                     spec.learning_rate()));
  }
  if (spec.weight_decay() < 0) {
    return absl::InvalidArgumentError(
        "spec.optimizer.weight_decay: must be >= 0");
  }
  if (spec.grad_clip_norm() < 0) {
    return absl::InvalidArgumentError(
        "spec.optimizer.grad_clip_norm: must be >= 0");
  }
  const auto& lr = spec.lr_schedule();
  if (lr.decay() == apapo::v1::LearningRateSchedule::DECAY_STEP &&
      (lr.step_size() < 1 || lr.gamma() <= 0 || lr.gamma() > 1)) {
    return absl::InvalidArgumentError(
        "spec.optimizer.lr_schedule: DECAY_STEP needs step_size >= 1 and "
        "gamma in (0, 1]");
  }
  if (spec.kind_case() == apapo::v1::OptimizerSpec::kSgd &&
      spec.sgd().momentum() < 0) {
    return absl::InvalidArgumentError(
        "spec.optimizer.sgd.momentum: must be >= 0");
  }
  return std::unique_ptr<Optimizer>(new Optimizer(spec, total_steps));
}

Optimizer::Optimizer(const apapo::v1::OptimizerSpec& spec, int64_t total)
    : spec_(spec),
      total_steps_(total),
      adam_(spec.kind_case() == apapo::v1::OptimizerSpec::kAdam) {}

double Optimizer::LearningRate(int64_t step) const {
  const double base = spec_.learning_rate();
  const auto& s = spec_.lr_schedule();
  const int64_t warm = s.warmup_steps();
  if (warm > 0 && step < warm) {
    // Linear warm-up: the first update uses base / warm.
    return base * static_cast<double>(step + 1) / static_cast<double>(warm);
  }
  switch (s.decay()) {
    case apapo::v1::LearningRateSchedule::DECAY_COSINE: {
      const int64_t span = std::max<int64_t>(1, total_steps_ - warm);
      const double t =
          std::min(1.0, static_cast<double>(step - warm) / span);
      return base * 0.5 * (1.0 + std::cos(M_PI * t));
    }
    case apapo::v1::LearningRateSchedule::DECAY_STEP:
      return base * std::pow(s.gamma(), static_cast<double>(
                                            (step - warm) / s.step_size()));
    default:
      return base;
  }
}

namespace {

// SGD momentum's prediction of a weight `ahead` (lr x steps) updates on:
// w - ahead x buf, in float. The fused step and the lazy prediction both
// call this one expression, so a prediction made later from the stored
// weights and buffer (after a resume, or where a step could not fuse) has
// the fused one's bits and a resumed run goes on exactly as an
// uninterrupted one.
inline float PredictedWeight(float w, float ahead, float buf) {
  return w - ahead * buf;
}

// A dense float tensor in host memory: what the single-pass SGD kernels
// below read and write.
bool PlainCpuFloat(const at::Tensor& t) {
  return t.defined() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
         t.device().is_cpu();
}

// One SGD-momentum update over n floats, torch.optim's formula:
//   g = grad + wd w;  buf = momentum buf + g;  w' = w - lr (Nesterov ? g +
//   momentum buf : buf);  and, when pred is given, pred = w' - ahead buf.
// Built for AVX2 and for plain x86-64 (the loader picks what the CPU has)
// and vectorised: ~2x faster than the same loop scalar, and ~2x faster than
// ATen's four kernels for step + prediction (7M floats: 6.1 ms vs 12.4 ms
// here). The pointers must not overlap. One loop per (prediction, Nesterov)
// case, so that each vectorises without a branch inside.
__attribute__((target_clones("avx2", "default"), optimize("O3")))
void FusedSgdMomentum(const float* __restrict w, const float* __restrict grad,
                      float* __restrict buf, float* __restrict out,
                      float* __restrict pred, int64_t n, float momentum,
                      float wd, float lr, float ahead, bool nesterov) {
  if (pred != nullptr && !nesterov) {
    for (int64_t k = 0; k < n; ++k) {
      const float g = grad[k] + wd * w[k];
      const float b = momentum * buf[k] + g;
      buf[k] = b;
      const float nw = w[k] - lr * b;
      out[k] = nw;
      pred[k] = PredictedWeight(nw, ahead, b);
    }
  } else if (pred != nullptr) {
    for (int64_t k = 0; k < n; ++k) {
      const float g = grad[k] + wd * w[k];
      const float b = momentum * buf[k] + g;
      buf[k] = b;
      const float nw = w[k] - lr * (g + momentum * b);
      out[k] = nw;
      pred[k] = PredictedWeight(nw, ahead, b);
    }
  } else if (!nesterov) {
    for (int64_t k = 0; k < n; ++k) {
      const float g = grad[k] + wd * w[k];
      const float b = momentum * buf[k] + g;
      buf[k] = b;
      out[k] = w[k] - lr * b;
    }
  } else {
    for (int64_t k = 0; k < n; ++k) {
      const float g = grad[k] + wd * w[k];
      const float b = momentum * buf[k] + g;
      buf[k] = b;
      out[k] = w[k] - lr * (g + momentum * b);
    }
  }
}

// SGD momentum's prediction alone, as FusedSgdMomentum writes it into `pred`.
void SgdPrediction(const float* __restrict w, const float* __restrict buf,
                   float* __restrict out, int64_t n, float ahead) {
  for (int64_t k = 0; k < n; ++k) out[k] = PredictedWeight(w[k], ahead, buf[k]);
}

// Adam's betas, epsilon (torch.optim's defaults when unset) and the bias
// corrections after `steps` updates.
struct AdamConstants {
  double b1, b2, eps, bc1, bc2;
};
AdamConstants AdamConstantsAt(const apapo::v1::AdamOptimizer& a, int64_t steps) {
  AdamConstants c;
  c.b1 = a.has_beta1() ? a.beta1() : 0.9;
  c.b2 = a.has_beta2() ? a.beta2() : 0.999;
  c.eps = a.has_epsilon() ? a.epsilon() : 1e-8;
  c.bc1 = 1.0 - std::pow(c.b1, static_cast<double>(steps));
  c.bc2 = 1.0 - std::pow(c.b2, static_cast<double>(steps));
  return c;
}

}  // namespace

std::vector<at::Tensor> Optimizer::Step(const std::vector<at::Tensor>& params,
                                        std::vector<at::Tensor>& grads,
                                        int64_t step,
                                        std::vector<at::Tensor> reuse,
                                        FusedPrediction* predict) {
  torch::NoGradGuard no_grad;
  if (predict != nullptr) predict->out.clear();
  const double lr = LearningRate(step);
  const double wd = spec_.weight_decay();
  if (spec_.grad_clip_norm() > 0 && !grads.empty()) {
    // Global L2 norm over the stage, as torch.nn.utils.clip_grad_norm_.
    at::Tensor sq = torch::zeros({}, torch::kDouble);
    for (const auto& g : grads) sq += g.to(torch::kDouble).pow(2).sum();
    const double norm = std::sqrt(sq.item<double>());
    const double coef = spec_.grad_clip_norm() / (norm + 1e-6);
    if (coef < 1.0) {
      for (auto& g : grads) g.mul_(coef);
    }
  }
  const bool first = slot1_.empty();
  if (first) {
    slot1_.resize(params.size());
    slot2_.resize(params.size());
  }
  if (reuse.size() != params.size()) reuse.clear();
  for (size_t i = 0; i < reuse.size(); ++i) {
    if (!reuse[i].defined() || !reuse[i].sizes().equals(params[i].sizes()) ||
        reuse[i].scalar_type() != params[i].scalar_type()) {
      reuse.clear();
      break;
    }
  }
  // Writes the new value of parameter i: into its recycled tensor when there
  // is one, else into a fresh tensor.
  std::vector<at::Tensor> next;
  next.reserve(params.size());
  if (adam_) {
    ++adam_steps_;
    const auto [b1, b2, eps, bc1, bc2] = AdamConstantsAt(spec_.adam(), adam_steps_);
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor g = grads[i];
      if (wd != 0) g = g.add(params[i], wd);
      if (!slot1_[i].defined()) {
        slot1_[i] = torch::zeros_like(params[i]);
        slot2_[i] = torch::zeros_like(params[i]);
      }
      slot1_[i].mul_(b1).add_(g, 1 - b1);
      slot2_[i].mul_(b2).addcmul_(g, g, 1 - b2);
      at::Tensor denom = (slot2_[i].sqrt() / std::sqrt(bc2)).add_(eps);
      if (reuse.empty()) {
        next.push_back(params[i].detach().addcdiv(slot1_[i], denom, -lr / bc1));
      } else {
        at::Tensor out = reuse[i].detach();
        at::addcdiv_out(out, params[i].detach(), slot1_[i], denom, -lr / bc1);
        next.push_back(reuse[i]);
      }
    }
  } else {
    const double mom = spec_.sgd().momentum();
    const bool nesterov = spec_.sgd().nesterov();
    // SGD with momentum in one pass per parameter (reads w, g, buf; writes
    // buf, w' and, when asked, the prediction) instead of ATen's four to
    // five; every step after the first takes it, so runs with and without
    // recycled tensors compute bit-identical weights.
    auto fusable = [&](size_t i) {
      return mom != 0 && PlainCpuFloat(params[i]) && PlainCpuFloat(grads[i]) &&
             PlainCpuFloat(slot1_[i]) && grads[i].numel() == params[i].numel();
    };
    bool fuse = !first;
    for (size_t i = 0; fuse && i < params.size(); ++i) fuse = fusable(i);
    if (fuse) {
      auto fits = [&](const std::vector<at::Tensor>& pool, size_t i) {
        return i < pool.size() && pool[i].defined() &&
               pool[i].sizes().equals(params[i].sizes()) &&
               pool[i].scalar_type() == at::kFloat && pool[i].is_contiguous();
      };
      const bool predicting = predict != nullptr && predict->steps > 0;
      const float a = static_cast<float>(
          predicting ? LearningRate(step + 1) * predict->steps : 0.0);
      const float m = static_cast<float>(mom);
      const float d = static_cast<float>(wd);
      const float l = static_cast<float>(lr);
      for (size_t i = 0; i < params.size(); ++i) {
        at::Tensor out = fits(reuse, i) ? reuse[i].detach()
                                        : torch::empty_like(params[i].detach());
        at::Tensor pred;
        if (predicting) {
          pred = predict != nullptr && fits(predict->reuse, i)
                     ? predict->reuse[i].detach()
                     : torch::empty_like(params[i].detach());
        }
        FusedSgdMomentum(params[i].data_ptr<float>(), grads[i].data_ptr<float>(),
                         slot1_[i].data_ptr<float>(), out.data_ptr<float>(),
                         predicting ? pred.data_ptr<float>() : nullptr,
                         params[i].numel(), m, d, l, a, nesterov);
        next.push_back(out.set_requires_grad(true));
        if (predicting) predict->out.push_back(pred.set_requires_grad(true));
      }
      return next;
    }
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor g = grads[i];
      if (wd != 0) g = g.add(params[i], wd);
      if (mom != 0) {
        if (!slot1_[i].defined()) {
          slot1_[i] = g.detach().clone();
        } else {
          slot1_[i].mul_(mom).add_(g);
        }
        g = nesterov ? g.add(slot1_[i], mom) : slot1_[i];
      }
      if (reuse.empty()) {
        next.push_back(params[i].detach().add(g, -lr));
      } else {
        at::Tensor out = reuse[i].detach();
        at::add_out(out, params[i].detach(), g, -lr);
        next.push_back(reuse[i]);
      }
    }
  }
  for (auto& p : next) p.set_requires_grad(true);
  return next;
}

std::vector<at::Tensor> Optimizer::Predict(const std::vector<at::Tensor>& params,
                                           double steps, int64_t step,
                                           std::vector<at::Tensor> reuse) const {
  torch::NoGradGuard no_grad;
  const double lr = LearningRate(step);
  std::vector<at::Tensor> out;
  out.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor dir;
    if (i < slot1_.size() && slot1_[i].defined()) {
      if (adam_ && i < slot2_.size() && slot2_[i].defined() && adam_steps_ > 0) {
        const AdamConstants c = AdamConstantsAt(spec_.adam(), adam_steps_);
        dir = (slot1_[i] / c.bc1) / ((slot2_[i] / c.bc2).sqrt_().add_(c.eps));
      } else if (!adam_) {
        dir = slot1_[i];
      }
    }
    if (!dir.defined() || steps <= 0) {
      out.push_back(params[i]);
      continue;
    }
    const bool fits = i < reuse.size() && reuse[i].defined() &&
                      reuse[i].sizes().equals(params[i].sizes()) &&
                      reuse[i].scalar_type() == params[i].scalar_type();
    if (!adam_ && PlainCpuFloat(params[i]) && PlainCpuFloat(dir) &&
        dir.numel() == params[i].numel()) {
      // As Step's fused pass predicts (ahead rounded to float there too).
      at::Tensor target = fits && reuse[i].is_contiguous()
                              ? reuse[i].detach()
                              : torch::empty_like(params[i].detach());
      SgdPrediction(params[i].data_ptr<float>(), dir.data_ptr<float>(),
                    target.data_ptr<float>(), params[i].numel(),
                    static_cast<float>(lr * steps));
      out.push_back(target.set_requires_grad(true));
      continue;
    }
    if (fits) {
      // A fresh tensor per step page-faults a whole stage's weights in.
      at::Tensor target = reuse[i].detach();
      at::add_out(target, params[i].detach(), dir, -lr * steps);
      out.push_back(reuse[i].set_requires_grad(true));
    } else {
      out.push_back(
          params[i].detach().add(dir, -lr * steps).set_requires_grad(true));
    }
  }
  return out;
}

std::vector<std::string> Optimizer::SlotNames() const {
  if (adam_) return {"exp_avg", "exp_avg_sq"};
  if (spec_.sgd().momentum() != 0) return {"momentum_buffer"};
  return {};
}

OptimizerState Optimizer::State() const {
  OptimizerState state;
  state.steps = adam_steps_;
  state.slot_names = SlotNames();
  if (slot1_.empty() || state.slot_names.empty()) return state;
  state.per_param.resize(slot1_.size());
  for (size_t i = 0; i < slot1_.size(); ++i) {
    state.per_param[i].push_back(slot1_[i]);
    if (adam_) state.per_param[i].push_back(slot2_[i]);
  }
  return state;
}

absl::Status Optimizer::LoadState(OptimizerState state, size_t num_params) {
  if (state.slot_names != SlotNames()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer state has slots {", absl::StrJoin(state.slot_names, ", "),
        "}, this optimizer keeps {", absl::StrJoin(SlotNames(), ", "), "}"));
  }
  if (!state.per_param.empty() && state.per_param.size() != num_params) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer state for ", state.per_param.size(),
        " parameters, the stage has ", num_params));
  }
  for (const auto& slots : state.per_param) {
    if (slots.size() != state.slot_names.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state has ", slots.size(), " tensors for a parameter, "
          "expected ", state.slot_names.size()));
    }
  }
  adam_steps_ = state.steps;
  slot1_.clear();
  slot2_.clear();
  if (state.per_param.empty()) return absl::OkStatus();
  slot1_.resize(num_params);
  slot2_.resize(num_params);
  for (size_t i = 0; i < num_params; ++i) {
    // The fused SGD step writes the buffer through a raw pointer.
    if (state.per_param[i].size() > 0) {
      slot1_[i] = state.per_param[i][0].contiguous();
    }
    if (state.per_param[i].size() > 1) {
      slot2_[i] = state.per_param[i][1].contiguous();
    }
  }
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace apapo
