#include "bench/fleet/timer_queue.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace apapo::bench {

TimerQueue::TimerQueue() : thread_([this] { Run(); }) {}

TimerQueue::~TimerQueue() { Stop(); }

void TimerQueue::Schedule(absl::Time when, std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  if (queue_.empty() || when < queue_.top().when) wake_ = true;
  queue_.push(Entry{when, next_sequence_++, std::move(callback)});
}

int64_t TimerQueue::fired() {
  absl::MutexLock lock(&mu_);
  return fired_;
}

absl::Duration TimerQueue::max_lateness() {
  absl::MutexLock lock(&mu_);
  return max_lateness_;
}

void TimerQueue::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  queue_ = {};
}

void TimerQueue::Run() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    if (!queue_.empty() && queue_.top().when <= now) {
      // priority_queue::top() is const; the entry is popped right after.
      Entry entry = std::move(const_cast<Entry&>(queue_.top()));
      queue_.pop();
      ++fired_;
      max_lateness_ = std::max(max_lateness_, now - entry.when);
      mu_.Unlock();
      entry.callback();
      mu_.Lock();
      continue;
    }
    wake_ = false;
    const absl::Time deadline =
        queue_.empty() ? absl::InfiniteFuture() : queue_.top().when;
    mu_.AwaitWithDeadline(absl::Condition(this, &TimerQueue::Woken), deadline);
  }
}

}  // namespace apapo::bench
