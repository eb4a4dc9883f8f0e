#include "coordinator/worker_registry.h"

#include <thread>

#include "coordinator/fake_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo::coordinator {
namespace {

apapo::v1::WorkerInfo Info(const std::string& id,
                           std::map<std::string, std::string> labels = {}) {
  apapo::v1::WorkerInfo info;
  info.set_worker_id(id);
  info.set_cores(2);
  for (auto& [k, v] : labels) (*info.mutable_labels())[k] = v;
  return info;
}

class WorkerRegistryTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  WorkerRegistry registry_{&clock_, absl::Seconds(1)};
};

TEST_F(WorkerRegistryTest, RegisterListAndDuplicateIds) {
  ASSERT_TRUE(registry_.Register(Info("w-1")).ok());
  auto dup = registry_.Register(Info("w-1"));
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry_.Register(Info("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto list = registry_.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].state(), apapo::v1::WORKER_STATE_IDLE);
}

TEST_F(WorkerRegistryTest, SilentWorkerIsLostAndHookNamesItsJob) {
  std::vector<std::string> lost;
  registry_.SetLostHook([&](const std::string& w, const std::string& job,
                            const std::string& reason) {
    lost.push_back(w + "@" + job + ": " + reason);
  });
  auto s1 = registry_.Register(Info("w-1"));
  auto s2 = registry_.Register(Info("w-2"));
  ASSERT_TRUE(registry_.Reserve("job-000001", 1, {}).ok());
  clock_.Advance(absl::Seconds(2));
  registry_.Heartbeat("w-2", *s2);
  clock_.Advance(absl::Seconds(2));  // w-1 silent 4 s > 3 x 1 s
  EXPECT_EQ(registry_.CheckTimeouts(), std::vector<std::string>{"w-1"});
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_THAT(lost[0], ::testing::StartsWith("w-1@job-000001: no heartbeat for 4s"));
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_LOST], 1);
  // A lost worker may come back under its id, on a new session.
  auto again = registry_.Register(Info("w-1"));
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, *s1);
  EXPECT_FALSE(registry_.IsCurrent("w-1", *s1));
}

TEST_F(WorkerRegistryTest, ReserveHonoursSelectorAndCountThenRelease) {
  ASSERT_TRUE(registry_.Register(Info("a", {{"zone", "x"}})).ok());
  ASSERT_TRUE(registry_.Register(Info("b", {{"zone", "y"}})).ok());
  ASSERT_TRUE(registry_.Register(Info("c", {{"zone", "x"}})).ok());
  auto too_many = registry_.Reserve("j1", 3, {{"zone", "x"}});
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_BUSY], 0);
  auto got = registry_.Reserve("j1", 2, {{"zone", "x"}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(registry_.Reserve("j2", 2, {}).status().code(),
            absl::StatusCode::kResourceExhausted);
  registry_.Release("j1");
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 3);
}

TEST_F(WorkerRegistryTest, CommandsQueueInOrderWithIdsAndStopOnDisconnect) {
  auto s = registry_.Register(Info("w"));
  apapo::v1::CoordinatorMessage start;
  start.mutable_start()->set_job_id("j");
  auto id1 = registry_.Send("w", start);
  auto id2 = registry_.Send("w", start);
  ASSERT_TRUE(id1.ok() && id2.ok());
  EXPECT_LT(*id1, *id2);
  auto m1 = registry_.NextCommand("w", *s, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(m1.has_value());
  EXPECT_EQ(m1->command_id(), *id1);
  registry_.NextCommand("w", *s, absl::Now() + absl::Seconds(10));
  // A waiting writer wakes up when its session ends.
  std::thread closer([&] { registry_.Disconnect("w", *s, "bye"); });
  EXPECT_FALSE(registry_.NextCommand("w", *s, absl::Now() + absl::Seconds(30))
                   .has_value());
  closer.join();
  EXPECT_EQ(registry_.Send("w", start).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace apapo::coordinator
