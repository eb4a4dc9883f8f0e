#include "worker/weight_store.h"

#include <utility>

namespace apapo::worker {

WeightStore::WeightStore(Optimizer* optimizer, Options options,
                         std::vector<at::Tensor> initial)
    : optimizer_(optimizer), options_(options) {
  versions_[0] = std::move(initial);
}

const std::vector<at::Tensor>& WeightStore::newest_weights() const {
  return versions_.at(newest_);
}

void WeightStore::Acquire(int64_t version) { ++refs_[version]; }

void WeightStore::Release(int64_t version) {
  if (--refs_[version] == 0) refs_.erase(version);
  DropUnused();
}

const std::vector<at::Tensor>& WeightStore::ComputeWeights(int64_t version,
                                                           int64_t step) {
  if (options_.prediction_steps <= 0) return versions_.at(version);
  auto it = predicted_.find(version);
  if (it == predicted_.end()) {
    it = predicted_
             .emplace(version,
                      optimizer_->Predict(versions_.at(version),
                                          options_.prediction_steps, step,
                                          std::move(predicted_spare_)))
             .first;
    predicted_spare_.clear();
  }
  return it->second;
}

void WeightStore::Update(std::vector<at::Tensor>& grads, int64_t step) {
  const bool predicting = options_.prediction_steps > 0;
  Optimizer::FusedPrediction prediction;
  if (predicting) {
    prediction.steps = options_.prediction_steps;
    prediction.reuse = std::move(predicted_spare_);
    predicted_spare_.clear();
  }
  std::vector<at::Tensor> next =
      optimizer_->Step(versions_.at(newest_), grads, step, std::move(spare_),
                       predicting ? &prediction : nullptr);
  spare_.clear();
  ++newest_;
  versions_[newest_] = std::move(next);
  if (predicting) {
    if (!prediction.out.empty()) {
      predicted_[newest_] = std::move(prediction.out);  // made in the step
    } else {
      predicted_spare_ = std::move(prediction.reuse);  // ComputeWeights will
    }
  }
  DropUnused();
}

void WeightStore::Reset(int64_t version, std::vector<at::Tensor> weights) {
  versions_.clear();
  refs_.clear();
  predicted_.clear();
  spare_.clear();
  predicted_spare_.clear();
  newest_ = version;
  versions_[newest_] = std::move(weights);
}

void WeightStore::RecyclePrediction(int64_t version,
                                    const std::vector<at::Tensor>& own) {
  auto it = predicted_.find(version);
  if (it == predicted_.end()) return;
  std::vector<at::Tensor> keep(it->second.size());
  for (size_t i = 0; i < keep.size(); ++i) {
    if (i >= own.size() || !it->second[i].is_same(own[i])) {
      keep[i] = std::move(it->second[i]);
    }
  }
  predicted_spare_ = std::move(keep);
}

void WeightStore::DropUnused() {
  const int64_t keep_from = options_.keep_previous ? newest_ - 1 : newest_;
  for (auto it = versions_.begin(); it != versions_.end();) {
    if (it->first < keep_from && !refs_.count(it->first)) {
      // Version 0 may be the caller's tensors: never reused.
      if (it->first > 0 && options_.recycle) {
        RecyclePrediction(it->first, it->second);
        spare_ = std::move(it->second);
      }
      predicted_.erase(it->first);
      it = versions_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace apapo::worker
