// ReadPacer: entries resume in order, no earlier than their delay, on the
// tick grid, each released once; the destructor releases what is left.
#include "coordinator/read_pacer.h"

#include <chrono>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace apapo::coordinator {
namespace {

using Clock = std::chrono::steady_clock;

class Recorder : public ReadPacer::Client {
 public:
  void Resume(uint64_t token) override {
    absl::MutexLock lock(&mu_);
    resumed_.push_back({token, Clock::now()});
  }
  void Release() override {
    absl::MutexLock lock(&mu_);
    ++released_;
  }
  bool WaitForReleased(int n) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return released_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(30));
  }
  struct Resumed {
    uint64_t token;
    Clock::time_point when;
  };
  absl::Mutex mu_;
  std::vector<Resumed> resumed_ ABSL_GUARDED_BY(mu_);
  int released_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(ReadPacerTest, ResumesEachEntryOnceNoEarlierThanItsDelay) {
  Recorder a, b;
  ReadPacer pacer(absl::Milliseconds(20), absl::Seconds(1));
  const Clock::time_point parked = Clock::now();
  pacer.Park(&a, 1, absl::Milliseconds(60));
  pacer.Park(&b, 7, absl::Milliseconds(200));
  pacer.Park(&a, 2, absl::Milliseconds(100));
  ASSERT_TRUE(a.WaitForReleased(2));
  ASSERT_TRUE(b.WaitForReleased(1));
  EXPECT_EQ(pacer.parked(), 0);
  EXPECT_EQ(pacer.resumed(), 3);
  absl::MutexLock lock(&a.mu_);
  ASSERT_EQ(a.resumed_.size(), 2u);
  EXPECT_EQ(a.resumed_[0].token, 1u);  // due first, resumed first
  EXPECT_EQ(a.resumed_[1].token, 2u);
  EXPECT_GE(a.resumed_[0].when - parked, std::chrono::milliseconds(60));
  EXPECT_GE(a.resumed_[1].when - parked, std::chrono::milliseconds(100));
  absl::MutexLock lock_b(&b.mu_);
  ASSERT_EQ(b.resumed_.size(), 1u);
  EXPECT_EQ(b.resumed_[0].token, 7u);
  EXPECT_GE(b.resumed_[0].when - parked, std::chrono::milliseconds(200));
}

TEST(ReadPacerTest, EntriesDueWithinOneTickResumeInOneBatch) {
  // Due 10 ms apart, well inside one 500 ms tick: both wait for the tick
  // that follows the later deadline and resume together.
  Recorder r;
  ReadPacer pacer(absl::Milliseconds(500), absl::Seconds(2));
  pacer.Park(&r, 1, absl::Milliseconds(1));
  pacer.Park(&r, 2, absl::Milliseconds(11));
  ASSERT_TRUE(r.WaitForReleased(2));
  absl::MutexLock lock(&r.mu_);
  ASSERT_EQ(r.resumed_.size(), 2u);
  EXPECT_LT(r.resumed_[1].when - r.resumed_[0].when, std::chrono::milliseconds(100));
}

TEST(ReadPacerTest, DelaysBeyondTheMaximumAreClampedToIt) {
  // The wheel holds max_delay: an hour's delay resumes after 100 ms.
  Recorder r;
  ReadPacer pacer(absl::Milliseconds(10), absl::Milliseconds(100));
  pacer.Park(&r, 1, absl::Hours(1));
  pacer.Park(&r, 2, -absl::Seconds(1));  // past: the next tick
  EXPECT_TRUE(r.WaitForReleased(2));
}

TEST(ReadPacerTest, StoppingReleasesWhatIsStillParkedWithoutResumingIt) {
  Recorder r;
  {
    ReadPacer pacer(absl::Milliseconds(10), absl::Seconds(10));
    pacer.Park(&r, 1, absl::Seconds(10));
    pacer.Park(&r, 2, absl::Seconds(5));
    EXPECT_EQ(pacer.parked(), 2);
  }
  absl::MutexLock lock(&r.mu_);
  EXPECT_EQ(r.released_, 2);
  EXPECT_TRUE(r.resumed_.empty());
}

}  // namespace
}  // namespace apapo::coordinator
