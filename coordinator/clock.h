// Time source injected into the coordinator's logic, so tests control time
// (FakeClock, in the testonly fake_clock.h).
//
// Thread-safety: implementations are safe to call from any thread.
#ifndef APAPO_COORDINATOR_CLOCK_H_
#define APAPO_COORDINATOR_CLOCK_H_

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

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_CLOCK_H_
