#include "bench/fleet/timer_queue.h"

#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo::bench {
namespace {

using ::testing::ElementsAre;

constexpr absl::Duration kWait = absl::Seconds(30);

// Collects the order callbacks ran in.
class Log {
 public:
  void Add(int v) {
    absl::MutexLock lock(&mu_);
    values_.push_back(v);
  }
  // Waits until `n` values are in; returns them.
  std::vector<int> WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return values_.size() >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
    return values_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int> values_ ABSL_GUARDED_BY(mu_);
};

TEST(TimerQueueTest, RunsCallbacksInDeadlineOrderThenSchedulingOrder) {
  TimerQueue timers;
  Log log;
  const absl::Time base = absl::Now() + absl::Milliseconds(50);
  timers.Schedule(base + absl::Milliseconds(20), [&] { log.Add(3); });
  timers.Schedule(base, [&] { log.Add(1); });
  timers.Schedule(base, [&] { log.Add(2); });
  EXPECT_THAT(log.WaitFor(3), ElementsAre(1, 2, 3));
  EXPECT_EQ(timers.fired(), 3);
}

TEST(TimerQueueTest, AnEarlierEntryWakesTheThreadBeforeItsDeadline) {
  TimerQueue timers;
  Log log;
  // The thread first waits for an entry an hour away...
  timers.Schedule(absl::Now() + absl::Hours(1), [&] { log.Add(2); });
  // ...and must still run one due now.
  timers.Schedule(absl::Now(), [&] { log.Add(1); });
  EXPECT_THAT(log.WaitFor(1), ElementsAre(1));
}

TEST(TimerQueueTest, CallbacksMayScheduleMore) {
  TimerQueue timers;
  Log log;
  std::function<void(int)> tick = [&](int n) {
    log.Add(n);
    if (n < 5) timers.Schedule(absl::Now(), [&, n] { tick(n + 1); });
  };
  timers.Schedule(absl::Now(), [&] { tick(1); });
  EXPECT_THAT(log.WaitFor(5), ElementsAre(1, 2, 3, 4, 5));
}

TEST(TimerQueueTest, StopDropsPendingCallbacksAndIgnoresNewOnes) {
  Log log;
  {
    TimerQueue timers;
    timers.Schedule(absl::Now() + absl::Hours(1), [&] { log.Add(1); });
    timers.Stop();
    timers.Schedule(absl::Now(), [&] { log.Add(2); });
    EXPECT_EQ(timers.fired(), 0);
  }
  EXPECT_TRUE(log.WaitFor(0).empty());
}

}  // namespace
}  // namespace apapo::bench
