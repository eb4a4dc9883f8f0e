#include "common/threads.h"

#include "gtest/gtest.h"

namespace apapo {
namespace {

TEST(ThreadsWithinTest, AQuotaBoundsThreadsToItsWholeCores) {
  EXPECT_EQ(ThreadsWithin(64, 2), 2);          // a 2-CPU limit on a 64-core node
  EXPECT_EQ(ThreadsWithin(64, 2.5), 2);        // a third thread would be throttled
  EXPECT_EQ(ThreadsWithin(64, 0.5), 1);        // at least one
  EXPECT_EQ(ThreadsWithin(4, 16), 4);          // what is wanted bounds too
  EXPECT_EQ(ThreadsWithin(4, 0), 4);           // no limit
  EXPECT_EQ(ThreadsWithin(0, 0), 1);
  EXPECT_EQ(ThreadsWithin(-3, 2), 1);
  EXPECT_EQ(ThreadsWithin(8, 3 - 1e-12), 3);  // 300000 / 100000 read back
  EXPECT_EQ(ThreadsWithin(8, -1), 8);          // v1's "-1": none
}

}  // namespace
}  // namespace apapo
