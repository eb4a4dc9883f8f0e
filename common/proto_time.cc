#include "common/proto_time.h"

#include <algorithm>
#include <cstdint>

#include "absl/time/clock.h"

namespace apapo {

google::protobuf::Timestamp ToTimestamp(absl::Time t) {
  // The range google/protobuf/timestamp.proto allows.
  constexpr int64_t kMinSeconds = -62135596800;  // 0001-01-01T00:00:00Z
  constexpr int64_t kMaxSeconds = 253402300799;  // 9999-12-31T23:59:59Z
  google::protobuf::Timestamp out;
  const absl::Time lo = absl::FromUnixSeconds(kMinSeconds);
  const absl::Time hi = absl::FromUnixSeconds(kMaxSeconds) + absl::Nanoseconds(999999999);
  t = std::clamp(t, lo, hi);
  const absl::Duration since = t - absl::UnixEpoch();
  absl::Duration rem;
  int64_t seconds = absl::IDivDuration(since, absl::Seconds(1), &rem);
  int64_t nanos = absl::ToInt64Nanoseconds(rem);
  if (nanos < 0) {  // Timestamp's nanos are never negative
    nanos += 1000000000;
    --seconds;
  }
  out.set_seconds(seconds);
  out.set_nanos(static_cast<int32_t>(nanos));
  return out;
}

google::protobuf::Timestamp NowTimestamp() { return ToTimestamp(absl::Now()); }

absl::Duration FromProtoDuration(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

}  // namespace apapo
