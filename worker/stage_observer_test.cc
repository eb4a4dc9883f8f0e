#include "worker/stage_observer.h"

#include "gtest/gtest.h"

namespace apapo::worker {
namespace {

StageReport RunOf(int64_t steps, double train_seconds, double warm_train_seconds) {
  StageReport r;
  r.steps = steps;
  r.train_seconds = train_seconds;
  r.warm_train_seconds = warm_train_seconds;
  return r;
}

TEST(SteadySamplesPerSecondTest, LeavesOutTheWarmUpSteps) {
  // 110 steps of 10 samples in 20 s, of which the first 10 took 9 s: the
  // other 100 steps (1,000 samples) took 11 s.
  const StageReport r = RunOf(110, 20.0, 9.0);
  EXPECT_DOUBLE_EQ(SteadySamplesPerSecond(r, 1100), 1000.0 / 11.0);
}

TEST(SteadySamplesPerSecondTest, CountsAShortRunWhole) {
  // 2 x kRateWarmupSteps steps: too few to leave any out.
  const StageReport r = RunOf(2 * kRateWarmupSteps, 4.0, 1.0);
  EXPECT_DOUBLE_EQ(SteadySamplesPerSecond(r, 200), 50.0);
  // One more step and the warm-up is left out.
  const StageReport longer = RunOf(2 * kRateWarmupSteps + 1, 4.0, 1.0);
  EXPECT_DOUBLE_EQ(SteadySamplesPerSecond(longer, 210),
                   10.0 * (kRateWarmupSteps + 1) / 3.0);
}

TEST(SteadySamplesPerSecondTest, WithoutAWarmUpMarkItCountsTheWholeRun) {
  EXPECT_DOUBLE_EQ(SteadySamplesPerSecond(RunOf(100, 10.0, -1), 1000), 100.0);
  // A mark at or past the end (no time after it) is not used either.
  EXPECT_DOUBLE_EQ(SteadySamplesPerSecond(RunOf(100, 10.0, 10.0), 1000), 100.0);
}

TEST(SteadySamplesPerSecondTest, NoTrainingTimeIsZero) {
  EXPECT_EQ(SteadySamplesPerSecond(RunOf(0, 0, -1), 0), 0);
}

}  // namespace
}  // namespace apapo::worker
