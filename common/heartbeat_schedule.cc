#include "common/heartbeat_schedule.h"

#include <algorithm>

namespace apapo {

absl::Time NextHeartbeatTime(absl::Time previous, absl::Duration interval,
                             absl::Duration offset) {
  if (previous == absl::InfiniteFuture() || previous == absl::InfinitePast() ||
      interval <= absl::ZeroDuration()) {
    return previous;
  }
  if (offset == absl::InfiniteDuration() || offset == -absl::InfiniteDuration()) {
    offset = absl::ZeroDuration();
  }
  offset = offset % interval;  // absl: the sign of the dividend
  if (offset < absl::ZeroDuration()) offset += interval;
  const absl::Time earliest = previous + interval / 2;
  // The grid point at or before `earliest`, then the next one after it.
  const absl::Duration since = (earliest - absl::UnixEpoch()) - offset;
  absl::Duration rem = since % interval;
  if (rem < absl::ZeroDuration()) rem += interval;
  absl::Time at = earliest - rem;
  if (at <= earliest) at += interval;
  return at;
}

absl::Duration HeartbeatWait(absl::Time due, absl::Time now,
                             absl::Duration interval) {
  return std::clamp(due - now, absl::ZeroDuration(), interval * 3 / 2);
}

}  // namespace apapo
