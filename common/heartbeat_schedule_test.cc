#include "common/heartbeat_schedule.h"

#include "gtest/gtest.h"

namespace apapo {
namespace {

const absl::Duration kSecond = absl::Seconds(1);

absl::Time At(double unix_seconds) {
  return absl::UnixEpoch() + absl::Seconds(unix_seconds);
}

TEST(HeartbeatScheduleTest, HeartbeatsLandOnTheOffsetOfEveryInterval) {
  const absl::Duration offset = absl::Milliseconds(300);
  // Registered at 1000.9: half an interval later is 1001.4, past the
  // 1001.3 grid point, so the first heartbeat is at 1002.3.
  absl::Time t = NextHeartbeatTime(At(1000.9), kSecond, offset);
  EXPECT_EQ(t, At(1002.3));
  // Sent a little late (the sender's timer): the next is still on the
  // grid, one interval on.
  t = NextHeartbeatTime(t + absl::Milliseconds(40), kSecond, offset);
  EXPECT_EQ(t, At(1003.3));
  // Sent early by a clock that stepped: never sooner than half an interval.
  t = NextHeartbeatTime(At(1003.2), kSecond, offset);
  EXPECT_EQ(t, At(1004.3));
}

TEST(HeartbeatScheduleTest, GapsStayBetweenHalfAndOneAndAHalfIntervals) {
  const absl::Duration interval = absl::Milliseconds(700);
  for (int p = 0; p < 1000; ++p) {
    const absl::Time previous = At(5000) + absl::Microseconds(p * 1237);
    for (absl::Duration offset :
         {absl::ZeroDuration(), absl::Milliseconds(1), absl::Milliseconds(699),
          absl::Milliseconds(350)}) {
      const absl::Time next = NextHeartbeatTime(previous, interval, offset);
      EXPECT_GT(next - previous, interval / 2) << p;
      EXPECT_LE(next - previous, interval * 3 / 2) << p;
      // On the grid.
      EXPECT_EQ(((next - absl::UnixEpoch()) - offset) % interval,
                absl::ZeroDuration())
          << p;
    }
  }
}

TEST(HeartbeatScheduleTest, AHostileOffsetIsFoldedIntoTheInterval) {
  const absl::Time previous = At(100.0);
  EXPECT_EQ(NextHeartbeatTime(previous, kSecond, absl::Milliseconds(-200)),
            NextHeartbeatTime(previous, kSecond, absl::Milliseconds(800)));
  EXPECT_EQ(NextHeartbeatTime(previous, kSecond, absl::Seconds(7.25)),
            NextHeartbeatTime(previous, kSecond, absl::Milliseconds(250)));
  EXPECT_EQ(NextHeartbeatTime(previous, kSecond, absl::InfiniteDuration()),
            NextHeartbeatTime(previous, kSecond, absl::ZeroDuration()));
  // Before the epoch works the same.
  EXPECT_EQ(NextHeartbeatTime(At(-10.0), kSecond, absl::Milliseconds(500)),
            At(-8.5));
}

TEST(HeartbeatScheduleTest, AClockSteppedBackCannotHoldAHeartbeatBack) {
  const absl::Time due = At(2000.0);
  EXPECT_EQ(HeartbeatWait(due, At(1999.75), kSecond), absl::Milliseconds(250));
  EXPECT_EQ(HeartbeatWait(due, At(2000.5), kSecond), absl::ZeroDuration());
  // The clock went back an hour after `due` was computed.
  EXPECT_EQ(HeartbeatWait(due, At(2000.0 - 3600), kSecond),
            absl::Milliseconds(1500));
}

}  // namespace
}  // namespace apapo
