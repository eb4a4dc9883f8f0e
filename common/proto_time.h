// google.protobuf.Timestamp from absl::Time.
//
// Debian's protobuf 3.21 builds TimeUtil::GetCurrentTime() on time(), so
// it returns whole seconds (nanos always 0): a heartbeat's send time was
// up to a second early, which the coordinator's paced reads and the
// heartbeat slots both read. Stamp messages with NowTimestamp() instead.
#ifndef APAPO_COMMON_PROTO_TIME_H_
#define APAPO_COMMON_PROTO_TIME_H_

#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"

namespace apapo {

// `t` to the nanosecond; infinite times saturate to the Timestamp's range
// (0001-01-01 to 9999-12-31).
google::protobuf::Timestamp ToTimestamp(absl::Time t);

// The current time, to the nanosecond (as the system clock gives it).
google::protobuf::Timestamp NowTimestamp();

// `d` as absl::Duration, saturating (TimeUtil's conversion overflows on a
// Duration past int64 nanoseconds, which a peer may send).
absl::Duration FromProtoDuration(const google::protobuf::Duration& d);

}  // namespace apapo

#endif  // APAPO_COMMON_PROTO_TIME_H_
