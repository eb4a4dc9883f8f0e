#include "coordinator/worker_registry.h"

#include <cmath>
#include <limits>
#include <memory>
#include <set>

#include "common/limits.h"
#include "coordinator/fake_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

apapo::v1::WorkerInfo Info(const std::string& id,
                           std::map<std::string, std::string> labels = {}) {
  apapo::v1::WorkerInfo info;
  info.set_worker_id(id);
  info.set_cores(2);
  for (auto& [k, v] : labels) (*info.mutable_labels())[k] = v;
  return info;
}

// Records what the registry tells a stream.
class RecordingStream : public WorkerStream {
 public:
  void OnCommandsQueued() override { ++queued; }
  void OnSessionEnded(const std::string& reason) override { ended.push_back(reason); }
  int queued = 0;
  std::vector<std::string> ended;
};

class WorkerRegistryTest : public ::testing::Test {
 protected:
  std::shared_ptr<WorkerSession> Add(const std::string& id,
                                     WorkerStream* stream = nullptr) {
    auto session = registry_.Register(Info(id), stream);
    EXPECT_TRUE(session.ok()) << session.status();
    return session.value_or(nullptr);
  }

  FakeClock clock_;
  WorkerRegistry registry_{&clock_, absl::Seconds(1)};
};

TEST_F(WorkerRegistryTest, RegisterListAndDuplicateIds) {
  ASSERT_NE(Add("w-1"), nullptr);
  auto dup = registry_.Register(Info("w-1"));
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry_.Register(Info("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto list = registry_.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].state(), apapo::v1::WORKER_STATE_IDLE);
}

// What a worker says about its cores reaches the planner: a hostile one is
// refused at registration, naming the field.
TEST_F(WorkerRegistryTest, CoreSetsAreCheckedAtRegistration) {
  auto with = [](const std::string& id, const std::string& set, int size) {
    apapo::v1::WorkerInfo info = Info(id);
    info.set_core_set(set);
    info.set_core_set_size(size);
    return info;
  };
  ASSERT_TRUE(registry_.Register(with("w-1", "3f1c-09/0-1", 2)).ok());
  ASSERT_TRUE(registry_.Register(with("w-2", "", 0)).ok());  // unknown
  struct Bad {
    std::string set;
    int size;
    const char* field;
  };
  for (const Bad& bad : {Bad{std::string(129, 'a'), 2, "register.core_set:"},
                         Bad{"boot/0 1", 2, "register.core_set:"},
                         Bad{std::string("boot/0\n", 7), 1, "register.core_set:"},
                         Bad{"boot/0", 0, "register.core_set_size:"},
                         Bad{"boot/0", -1, "register.core_set_size:"},
                         Bad{"boot/0", 65537, "register.core_set_size:"},
                         Bad{"", 2, "register.core_set_size:"}}) {
    auto r = registry_.Register(with("w-bad", bad.set, bad.size));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad.set;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(bad.field)) << bad.set;
  }
  EXPECT_EQ(registry_.List().size(), 2u);
}

// A CPU quota the planner would divide by or count threads from.
TEST_F(WorkerRegistryTest, CpuQuotasAreCheckedAtRegistration) {
  apapo::v1::WorkerInfo info = Info("w-1");
  info.set_cpu_quota(2.5);
  ASSERT_TRUE(registry_.Register(info).ok());
  for (double bad : {-1.0, 65537.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    apapo::v1::WorkerInfo b = Info("w-bad");
    b.set_cpu_quota(bad);
    auto r = registry_.Register(b);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("register.cpu_quota:")) << bad;
  }
  ASSERT_EQ(registry_.List().size(), 1u);
  EXPECT_EQ(registry_.List()[0].info().cpu_quota(), 2.5);
}

TEST_F(WorkerRegistryTest, SilentWorkerIsLostAndHookNamesItsJob) {
  std::vector<std::string> lost;
  registry_.SetLostHook([&](const std::string& w, const std::string& job,
                            const std::string& reason) {
    lost.push_back(w + "@" + job + ": " + reason);
  });
  RecordingStream stream1;
  auto s1 = Add("w-1", &stream1);
  auto s2 = Add("w-2");
  ASSERT_TRUE(registry_.Reserve("job-000001", 1, {}).ok());
  clock_.Advance(absl::Seconds(2));
  s2->Heartbeat();
  EXPECT_TRUE(registry_.CheckTimeouts().empty());
  clock_.Advance(absl::Seconds(2));  // w-1 silent 4 s > 3 x 1 s
  EXPECT_EQ(registry_.CheckTimeouts(), std::vector<std::string>{"w-1"});
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_THAT(lost[0], ::testing::StartsWith("w-1@job-000001: no heartbeat for 4s"));
  EXPECT_THAT(stream1.ended, ElementsAre(HasSubstr("no heartbeat")));
  EXPECT_FALSE(s1->live());
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_LOST], 1);
  // A lost worker may come back under its id, on a new session.
  auto again = Add("w-1");
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again->id(), s1->id());
  EXPECT_TRUE(again->live());
  // The old session's stream ending later changes nothing.
  registry_.Disconnect(*s1, "late");
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 2);
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_LOST], 0);
}

TEST_F(WorkerRegistryTest, DeadlineQueueFollowsHeartbeats) {
  // One interval = 1 s; lost after 3 s of silence.
  auto a = Add("a");
  clock_.Advance(absl::Seconds(1));
  auto b = Add("b");
  EXPECT_EQ(registry_.NextDeadline(), a->last_seen() + absl::Seconds(3));
  // a keeps heartbeating: each due time finds it alive and re-queues it at
  // its own new deadline, never before.
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Milliseconds(900));
    a->Heartbeat();
    EXPECT_THAT(registry_.CheckTimeouts(), ::testing::Each("b"));
    EXPECT_GT(registry_.NextDeadline(), clock_.Now());
  }
  EXPECT_FALSE(b->live());
  EXPECT_TRUE(a->live());
  // Nobody connected: nothing due.
  registry_.Disconnect(*a, "bye");
  EXPECT_TRUE(registry_.CheckTimeouts().empty());
  clock_.Advance(absl::Seconds(10));
  EXPECT_TRUE(registry_.CheckTimeouts().empty());
  EXPECT_EQ(registry_.NextDeadline(), absl::InfiniteFuture());
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
  registry_.Release("j1", {"c"});
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 2);
  registry_.Release("j1");
  EXPECT_EQ(registry_.CountByState()[apapo::v1::WORKER_STATE_IDLE], 3);
  // Registration order, not id order, decides who is taken first.
  auto all = registry_.Reserve("j3", 3, {});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<std::string>{"a", "b", "c"}));
  // Workers a job excludes are neither offered nor taken.
  registry_.Release("j3");
  EXPECT_EQ(registry_.IdleMatching(3, {}, {"a"}), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(registry_.ReserveUpTo("j4", 1, {}, {"a"}), (std::vector<std::string>{"b"}));
}

TEST_F(WorkerRegistryTest, CommandsArePushedToTheStreamInOrderWithIds) {
  RecordingStream stream;
  auto s = Add("w", &stream);
  apapo::v1::CoordinatorMessage start;
  start.mutable_start()->set_job_id("j");
  auto id1 = registry_.Send("w", start);
  auto id2 = registry_.Send("w", start);
  ASSERT_TRUE(id1.ok() && id2.ok());
  EXPECT_LT(*id1, *id2);
  EXPECT_EQ(stream.queued, 2);
  EXPECT_EQ(s->pending(), 2u);
  auto m1 = s->TakeCommand();
  ASSERT_TRUE(m1.has_value());
  EXPECT_EQ(m1->command_id(), *id1);
  EXPECT_EQ(s->TakeCommand()->command_id(), *id2);
  EXPECT_FALSE(s->TakeCommand().has_value());
  // Queued commands of a session that ends are dropped; later sends fail.
  ASSERT_TRUE(registry_.Send("w", start).ok());
  registry_.Disconnect(*s, "bye");
  EXPECT_EQ(s->pending(), 0u);
  EXPECT_EQ(registry_.Send("w", start).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(registry_.Send("nobody", start).status().code(),
            absl::StatusCode::kUnavailable);
  // A detached stream hears nothing more.
  auto again = Add("w", &stream);
  again->DetachStream();
  ASSERT_TRUE(registry_.Send("w", start).ok());
  EXPECT_EQ(stream.queued, 3);
}

TEST_F(WorkerRegistryTest, ListPagesInIdOrderAndFiltersByState) {
  std::vector<std::shared_ptr<WorkerSession>> sessions;
  for (int i = 0; i < 7; ++i) sessions.push_back(Add("w-" + std::to_string(i)));
  ASSERT_TRUE(registry_.Reserve("j", 2, {}).ok());  // w-0, w-1
  registry_.Disconnect(*sessions[6], "bye");
  apapo::v1::ListWorkersRequest request;
  request.set_page_size(3);
  std::vector<std::string> seen;
  for (int page = 0; page < 10; ++page) {
    auto response = registry_.List(request);
    ASSERT_TRUE(response.ok());
    EXPECT_EQ(response->total(), 7);
    for (const auto& w : response->workers()) seen.push_back(w.info().worker_id());
    if (response->next_page_token().empty()) break;
    request.set_page_token(response->next_page_token());
  }
  EXPECT_THAT(seen, ElementsAre("w-0", "w-1", "w-2", "w-3", "w-4", "w-5", "w-6"));

  apapo::v1::ListWorkersRequest busy_or_lost;
  busy_or_lost.add_states(apapo::v1::WORKER_STATE_BUSY);
  busy_or_lost.add_states(apapo::v1::WORKER_STATE_LOST);
  auto filtered = registry_.List(busy_or_lost);
  ASSERT_TRUE(filtered.ok());
  EXPECT_EQ(filtered->total(), 3);
  ASSERT_EQ(filtered->workers_size(), 3);
  EXPECT_EQ(filtered->workers(2).info().worker_id(), "w-6");
  EXPECT_EQ(filtered->workers(2).state(), apapo::v1::WORKER_STATE_LOST);
  EXPECT_TRUE(filtered->next_page_token().empty());

  apapo::v1::ListWorkersRequest bad;
  bad.set_page_size(-1);
  auto error = registry_.List(bad);
  EXPECT_EQ(error.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(error.status().message(), HasSubstr("page_size"));
}

TEST_F(WorkerRegistryTest, ListReportsTheLastHeartbeat) {
  auto s = Add("w");
  clock_.Advance(absl::Milliseconds(700));
  s->Heartbeat();
  const absl::Time beat = clock_.Now();
  clock_.Advance(absl::Milliseconds(300));
  auto list = registry_.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].last_heartbeat().seconds(), absl::ToUnixSeconds(beat));
  EXPECT_EQ(list[0].last_heartbeat().nanos(),
            absl::ToUnixNanos(beat) % 1000000000);
  auto beats = registry_.LastHeartbeats();
  ASSERT_EQ(beats.size(), 1u);
  EXPECT_EQ(beats[0].second, beat);
}

TEST_F(WorkerRegistryTest, ListPagesStayUnderTheReplyLimit) {
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(registry_
                    .Register(Info("w-" + std::to_string(100 + i),
                                   {{"note", std::string(100 << 10, 'x')}}))
                    .ok());
  }
  apapo::v1::ListWorkersRequest request;
  int seen = 0;
  for (int page = 0; page < 10; ++page) {
    auto response = registry_.List(request);
    ASSERT_TRUE(response.ok());
    EXPECT_LE(response->ByteSizeLong(), kMaxPageBytes);
    seen += response->workers_size();
    if (response->next_page_token().empty()) break;
    request.set_page_token(response->next_page_token());
  }
  EXPECT_EQ(seen, 30);
}

TEST(WorkerRegistryCapTest, OnlyTheNewestLostWorkersAreKept) {
  FakeClock clock;
  WorkerRegistry registry(&clock, absl::Seconds(1), /*max_lost=*/2);
  std::vector<std::shared_ptr<WorkerSession>> sessions;
  for (int i = 0; i < 5; ++i) {
    sessions.push_back(*registry.Register(Info("w-" + std::to_string(i))));
  }
  registry.Disconnect(*sessions[0], "bye");
  registry.Disconnect(*sessions[1], "bye");
  // w-1 comes back: it is no longer lost, so it is never forgotten.
  auto back = registry.Register(Info("w-1"));
  ASSERT_TRUE(back.ok());
  registry.Disconnect(*sessions[2], "bye");
  registry.Disconnect(*sessions[3], "bye");  // third lost: w-0 is forgotten
  std::vector<std::string> ids;
  for (const auto& w : registry.List()) ids.push_back(w.info().worker_id());
  EXPECT_THAT(ids, ElementsAre("w-1", "w-2", "w-3", "w-4"));
  EXPECT_EQ(registry.CountByState()[apapo::v1::WORKER_STATE_LOST], 2);
  EXPECT_EQ(registry.CountByState()[apapo::v1::WORKER_STATE_IDLE], 2);
  // A forgotten worker may register again like a new one.
  EXPECT_TRUE(registry.Register(Info("w-0")).ok());
}

}  // namespace
}  // namespace apapo::coordinator
