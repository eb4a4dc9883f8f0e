// TimerQueue: one thread that runs callbacks at given times, in deadline
// order. The fleet simulator's heartbeats and simulated training of
// thousands of workers all go through one of these instead of a thread (or
// a sleeping loop) per worker.
//
// Callbacks run on the queue's thread, one at a time, without the queue's
// lock held, so they may Schedule() more; they should be short (a late
// callback delays every later one).
//
// Call order: construct (the thread starts), Schedule() any number of
// times, Stop() (or destroy). Callbacks still queued at Stop() are dropped;
// Stop() returns once the one running, if any, has returned.
// Thread-safety: all methods are thread-safe; Stop() must not be called
// from a callback.
#ifndef APAPO_BENCH_FLEET_TIMER_QUEUE_H_
#define APAPO_BENCH_FLEET_TIMER_QUEUE_H_

#include <cstdint>
#include <functional>
#include <queue>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace apapo::bench {

class TimerQueue {
 public:
  TimerQueue();
  ~TimerQueue();

  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `callback` on the queue's thread at `when` (at once if past).
  // Callbacks due at the same time run in the order they were scheduled.
  // Ignored after Stop().
  void Schedule(absl::Time when, std::function<void()> callback);

  // Callbacks run so far, and how late the latest one ran (for reports:
  // lateness shows the simulator itself falling behind).
  int64_t fired();
  absl::Duration max_lateness();

  void Stop();

 private:
  struct Entry {
    absl::Time when;
    int64_t sequence;  // ties broken in scheduling order
    std::function<void()> callback;
  };
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.when != b.when ? a.when > b.when : a.sequence > b.sequence;
    }
  };

  void Run();
  // Whether the thread must look at the queue again before its deadline.
  bool Woken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || wake_;
  }

  absl::Mutex mu_;
  std::priority_queue<Entry, std::vector<Entry>, Later> queue_
      ABSL_GUARDED_BY(mu_);
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // Set when an entry earlier than the thread's current deadline arrives.
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t fired_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration max_lateness_ ABSL_GUARDED_BY(mu_);

  // Joined by Stop(); declared last so that it starts after the members
  // it reads are constructed.
  std::thread thread_;
};

}  // namespace apapo::bench

#endif  // APAPO_BENCH_FLEET_TIMER_QUEUE_H_
