// When a worker sends its heartbeats.
//
// The coordinator gives each worker, with its heartbeat interval, an
// offset into the interval (worker.proto, Registered.heartbeat_offset):
// the worker heartbeats at the wall-clock times k x interval + offset
// since the Unix epoch. It hands out a few such offsets ("slots"), so
// the fleet's heartbeats reach it in a few bursts per interval instead of
// one at a time, and gRPC's poller wakes once for many (bench/fleet/
// README.md, "Heartbeats in slots"). Hosts whose clocks agree (NTP) land
// in the same slot; a worker whose clock is off only falls out of its
// burst: whatever the clock does, the gap between two heartbeats stays
// between half an interval and one and a half, well inside the
// coordinator's timeout of three intervals.
#ifndef APAPO_COMMON_HEARTBEAT_SCHEDULE_H_
#define APAPO_COMMON_HEARTBEAT_SCHEDULE_H_

#include "absl/time/time.h"

namespace apapo {

// The first time after `previous + interval / 2` that lies on the grid
// k x interval + offset (k an integer, times since the Unix epoch).
// `previous` is the last heartbeat's send time, or the registration time
// before the first. `interval` must be positive; `offset` is taken modulo
// `interval` (a negative or oversized one from a hostile coordinator is
// folded in, not trusted). An infinite `previous` is returned unchanged.
absl::Time NextHeartbeatTime(absl::Time previous, absl::Duration interval,
                             absl::Duration offset);

// How long to wait, at `now`, for the heartbeat due at `due`: `due - now`
// bounded to [0, 3/2 x interval], so that a wall clock stepped backwards
// between the two readings cannot hold a heartbeat back for longer.
absl::Duration HeartbeatWait(absl::Time due, absl::Time now,
                             absl::Duration interval);

}  // namespace apapo

#endif  // APAPO_COMMON_HEARTBEAT_SCHEDULE_H_
