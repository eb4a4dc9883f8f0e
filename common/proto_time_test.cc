#include "common/proto_time.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace apapo {
namespace {

TEST(ProtoTimeTest, KeepsTheNanoseconds) {
  const google::protobuf::Timestamp t =
      ToTimestamp(absl::FromUnixSeconds(1796236244) + absl::Nanoseconds(123456789));
  EXPECT_EQ(t.seconds(), 1796236244);
  EXPECT_EQ(t.nanos(), 123456789);
}

TEST(ProtoTimeTest, BeforeTheEpochNanosStayPositive) {
  const google::protobuf::Timestamp t =
      ToTimestamp(absl::UnixEpoch() - absl::Milliseconds(1500));
  EXPECT_EQ(t.seconds(), -2);
  EXPECT_EQ(t.nanos(), 500000000);
}

TEST(ProtoTimeTest, InfiniteTimesSaturateToTheTimestampRange) {
  EXPECT_EQ(ToTimestamp(absl::InfiniteFuture()).seconds(), 253402300799);
  EXPECT_EQ(ToTimestamp(absl::InfiniteFuture()).nanos(), 999999999);
  EXPECT_EQ(ToTimestamp(absl::InfinitePast()).seconds(), -62135596800);
  EXPECT_EQ(ToTimestamp(absl::InfinitePast()).nanos(), 0);
}

TEST(ProtoTimeTest, DurationsConvertAndSaturate) {
  google::protobuf::Duration d;
  d.set_seconds(2);
  d.set_nanos(250000000);
  EXPECT_EQ(FromProtoDuration(d), absl::Milliseconds(2250));
  d.set_seconds(315576000000);  // the largest a Duration may hold
  d.set_nanos(0);
  EXPECT_EQ(FromProtoDuration(d), absl::Seconds(315576000000));
}

TEST(ProtoTimeTest, NowIsFinerThanASecond) {
  // Debian's TimeUtil::GetCurrentTime() gives whole seconds; ours must not.
  // Ten readings 1.3 ms apart: all with nanos 0 by chance is impossible.
  bool any_fraction = false;
  for (int i = 0; i < 10 && !any_fraction; ++i) {
    any_fraction = NowTimestamp().nanos() != 0;
    absl::SleepFor(absl::Microseconds(1300));
  }
  EXPECT_TRUE(any_fraction);
}

}  // namespace
}  // namespace apapo
