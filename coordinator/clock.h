// Time source injected into the coordinator's logic, so tests control time.
//
// Thread-safety: implementations are safe to call from any thread.
#ifndef APAPO_COORDINATOR_CLOCK_H_
#define APAPO_COORDINATOR_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace apapo::coordinator {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
};

// The system clock.
class RealClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
};

// A clock that only moves when told to (tests).
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000))
      : now_(start) {}
  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_CLOCK_H_
