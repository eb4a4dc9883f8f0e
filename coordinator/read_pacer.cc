#include "coordinator/read_pacer.h"

#include <algorithm>
#include <utility>

namespace apapo::coordinator {

ReadPacer::ReadPacer(absl::Duration tick, absl::Duration max_delay)
    : tick_(absl::ToChronoNanoseconds(tick)),
      max_delay_(absl::ToChronoNanoseconds(max_delay)),
      origin_(std::chrono::steady_clock::now()) {
  // Slots for every tick a delay of up to max_delay can land on, plus the
  // one being resumed.
  slots_.resize(static_cast<size_t>(max_delay_ / tick_) + 2);
  thread_ = std::thread([this] { Run(); });
}

ReadPacer::~ReadPacer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  std::vector<std::vector<Entry>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(slots_);
  }
  for (const auto& slot : left) {
    for (const Entry& e : slot) e.client->Release();
  }
}

void ReadPacer::Park(Client* client, uint64_t token, absl::Duration delay) {
  const std::chrono::nanoseconds wait = std::clamp(
      absl::ToChronoNanoseconds(delay), std::chrono::nanoseconds(0), max_delay_);
  const std::chrono::nanoseconds due =
      std::chrono::steady_clock::now() + wait - origin_;
  // The first tick at or after `due`.
  int64_t tick = (due.count() + tick_.count() - 1) / tick_.count();
  absl::MutexLock lock(&mu_);
  tick = std::clamp<int64_t>(tick, next_tick_,
                             next_tick_ + static_cast<int64_t>(slots_.size()) - 1);
  slots_[static_cast<size_t>(tick) % slots_.size()].push_back(Entry{client, token});
  ++parked_;
}

int64_t ReadPacer::parked() const {
  absl::MutexLock lock(&mu_);
  return parked_;
}

int64_t ReadPacer::resumed() const {
  absl::MutexLock lock(&mu_);
  return resumed_;
}

void ReadPacer::Run() {
  std::vector<Entry> due;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const SteadyTime at = origin_ + next_tick_ * tick_;
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(
              absl::Condition(&stopping),
              absl::FromChrono(at - std::chrono::steady_clock::now()))) {
        return;
      }
      // One slot per pass: after a stall the passes run back to back until
      // the wheel has caught up with the clock.
      due.swap(slots_[static_cast<size_t>(next_tick_) % slots_.size()]);
      ++next_tick_;
      parked_ -= static_cast<int64_t>(due.size());
      resumed_ += static_cast<int64_t>(due.size());
    }
    for (const Entry& e : due) {
      e.client->Resume(e.token);
      e.client->Release();
    }
    due.clear();
  }
}

}  // namespace apapo::coordinator
