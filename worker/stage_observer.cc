#include "worker/stage_observer.h"

namespace apapo::worker {

void ProgressTracker::AddLoss(double loss) {
  recent_losses_.push_back(loss);
  if (recent_losses_.size() > kRecentLosses) recent_losses_.pop_front();
  epoch_loss_sum_ += loss;
  ++epoch_loss_count_;
}

TrainingProgress ProgressTracker::Progress(int64_t step, int64_t total_steps,
                                           int64_t epoch, double test_accuracy,
                                           absl::Time now) const {
  TrainingProgress p;
  p.step = step;
  p.total_steps = total_steps;
  p.epoch = epoch;
  double sum = 0;
  for (double l : recent_losses_) sum += l;
  p.loss = recent_losses_.empty() ? 0 : sum / recent_losses_.size();
  const double secs = absl::ToDoubleSeconds(now - start_);
  p.samples_per_second = secs > 0 ? samples_ / secs : 0;
  p.test_accuracy = test_accuracy;
  return p;
}

double SteadySamplesPerSecond(const StageReport& r, double samples) {
  if (r.steps > 2 * kRateWarmupSteps && r.warm_train_seconds >= 0 &&
      r.train_seconds > r.warm_train_seconds) {
    const double per_step = samples / static_cast<double>(r.steps);
    return per_step * static_cast<double>(r.steps - kRateWarmupSteps) /
           (r.train_seconds - r.warm_train_seconds);
  }
  return r.train_seconds > 0 ? samples / r.train_seconds : 0;
}

void FillStageMetrics(const StageReport& r, int stage, int rank,
                      apapo::v1::StageMetrics* sm) {
  sm->set_stage(stage);
  sm->set_rank(rank);
  sm->set_busy_seconds(r.busy_seconds);
  sm->set_idle_seconds(r.idle_seconds);
  sm->set_comm_exposed_seconds(r.comm_exposed_seconds);
  sm->set_comm_total_seconds(r.comm_total_seconds);
  sm->set_bytes_sent(r.bytes_sent);
  sm->set_bytes_received(r.bytes_received);
  sm->set_forward_micro_batches(r.forward_micro_batches);
  sm->set_backward_micro_batches(r.backward_micro_batches);
  sm->set_max_staleness(static_cast<int32_t>(r.max_staleness));
  sm->set_max_weight_versions(r.max_weight_versions);
  sm->set_checkpoint_seconds(r.checkpoint_seconds);
  sm->set_checkpoint_write_cpu_seconds(r.checkpoint_write_cpu_seconds);
}

}  // namespace apapo::worker
