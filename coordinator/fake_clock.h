// FakeClock: a Clock that only moves when told to, for tests of the
// coordinator's logic (deadlines, heartbeats, progress throttling).
//
// Testonly: product code uses RealClock (clock.h).
// Thread-safety: Now and Advance are safe to call from any thread.
#ifndef APAPO_COORDINATOR_FAKE_CLOCK_H_
#define APAPO_COORDINATOR_FAKE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"

namespace apapo::coordinator {

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

#endif  // APAPO_COORDINATOR_FAKE_CLOCK_H_
