#include "worker/optimizer.h"

#include <torch/torch.h>

#include <cmath>

#include "absl/strings/str_cat.h"

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
                                        std::vector<at::Tensor> reuse) {
  torch::NoGradGuard no_grad;
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
                                           double steps, int64_t step) const {
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
    out.push_back(
        params[i].detach().add(dir, -lr * steps).set_requires_grad(true));
  }
  return out;
}

std::vector<at::Tensor> Optimizer::State() const {
  std::vector<at::Tensor> out;
  out.push_back(torch::tensor({adam_steps_}, torch::kLong));
  for (const auto& t : slot1_) out.push_back(t.defined() ? t : torch::Tensor());
  for (const auto& t : slot2_) out.push_back(t.defined() ? t : torch::Tensor());
  // Undefined tensors cannot be serialised: mark them with empty tensors.
  for (auto& t : out) {
    if (!t.defined()) t = torch::empty({0});
  }
  return out;
}

absl::Status Optimizer::LoadState(const std::vector<at::Tensor>& state,
                                  const std::vector<at::Tensor>& params) {
  if (state.empty()) return absl::OkStatus();
  const size_t n = params.size();
  if (state.size() != 1 + 2 * n) {
    return absl::DataLossError(absl::StrCat(
        "optimizer state has ", state.size(), " tensors, expected ",
        1 + 2 * n));
  }
  adam_steps_ = state[0].item<int64_t>();
  slot1_.assign(n, at::Tensor());
  slot2_.assign(n, at::Tensor());
  for (size_t i = 0; i < n; ++i) {
    if (state[1 + i].numel() > 0) slot1_[i] = state[1 + i].clone();
    if (state[1 + n + i].numel() > 0) slot2_[i] = state[1 + n + i].clone();
  }
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace apapo
