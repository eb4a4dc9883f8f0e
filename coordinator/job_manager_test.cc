#include "coordinator/job_manager.h"

#include <atomic>
#include <string>
#include <thread>

#include "common/limits.h"
#include "coordinator/fake_clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace apapo::coordinator {
namespace {

using apapo::v1::JobState;
using ::testing::HasSubstr;

apapo::v1::JobSpec ValidSpec() {
  apapo::v1::JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        name: "t"
        model { builtin { name: "mlp" } }
        data { fashion_mnist {} batch_size: 64 }
        optimizer { sgd {} learning_rate: 0.1 }
        resources { workers: 2 }
        limits { epochs: 1 }
      )pb",
      &spec));
  return spec;
}

class JobManagerTest : public ::testing::Test {
 protected:
  MemoryJobStore store_;
  FakeClock clock_;
  JobManager jobs_{&store_, &clock_};
};

TEST_F(JobManagerTest, SubmitQueuesAndRecordsEvent) {
  auto job = jobs_.Submit(ValidSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), "job-000001");
  EXPECT_EQ(job->state(), apapo::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job->last_event_sequence(), 1);
  EXPECT_EQ(jobs_.QueuedJobs(), std::vector<std::string>{"job-000001"});
  EXPECT_EQ(store_.LoadEvents("job-000001")->size(), 1u);
}

// Job history retention: beyond max_ended_jobs, the oldest ended jobs go
// (memory and store, events too); running ones stay whatever their age.
TEST_F(JobManagerTest, OnlyTheNewestEndedJobsAreKept) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto job = jobs_.Submit(ValidSpec());
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->id());
    clock_.Advance(absl::Seconds(1));
  }
  // ids[0] stays queued (never ended); the other four end.
  for (int i = 1; i < 5; ++i) ASSERT_TRUE(jobs_.Cancel(ids[i], "test").ok());
  jobs_.set_max_ended_jobs(2);
  EXPECT_TRUE(jobs_.Get(ids[0]).ok());  // not ended: kept though oldest
  EXPECT_EQ(jobs_.Get(ids[1]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs_.Get(ids[2]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(jobs_.Get(ids[3]).ok());
  EXPECT_TRUE(jobs_.Get(ids[4]).ok());
  EXPECT_TRUE(store_.LoadEvents(ids[1])->empty());
  EXPECT_EQ(store_.LoadJobs()->size(), 3u);
  // A watcher of a job that is dropped is told so, not left waiting.
  absl::StatusOr<JobChange> change;
  std::thread watcher([&] {
    change = jobs_.WaitForChange(ids[3], /*seen_version=*/1 << 30, 0,
                                 absl::Now() + absl::Minutes(5));
  });
  // The next submit prunes again: one more ended job drops ids[3].
  auto next = jobs_.Submit(ValidSpec());
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE(jobs_.Cancel(next->id(), "test").ok());
  ASSERT_TRUE(jobs_.Submit(ValidSpec()).ok());
  watcher.join();
  EXPECT_EQ(change.status().code(), absl::StatusCode::kNotFound) << change.status();
  EXPECT_EQ(jobs_.Get(ids[3]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(jobs_.Get(ids[4]).ok());
}

TEST_F(JobManagerTest, SubmitRejectsInvalidSpecWithFieldPath) {
  auto spec = ValidSpec();
  spec.mutable_schedule()->set_micro_batches(0);
  auto job = jobs_.Submit(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()),
              HasSubstr("spec.schedule.micro_batches: must be >= 1, got 0"));
  EXPECT_TRUE(store_.LoadJobs()->empty());
}

TEST_F(JobManagerTest, GetUnknownIsNotFoundEmptyIsInvalid) {
  EXPECT_EQ(jobs_.Get("job-999").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs_.Get("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobManagerTest, ListNewestFirstWithPagesAndStateFilter) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(jobs_.Submit(ValidSpec()).ok());
  ASSERT_TRUE(jobs_.Cancel("job-000002", "").ok());
  apapo::v1::ListJobsRequest req;
  req.set_page_size(2);
  auto page1 = jobs_.List(req);
  ASSERT_TRUE(page1.ok());
  ASSERT_EQ(page1->jobs_size(), 2);
  EXPECT_EQ(page1->jobs(0).id(), "job-000005");
  EXPECT_EQ(page1->next_page_token(), "job-000004");
  req.set_page_token(page1->next_page_token());
  auto page2 = jobs_.List(req);
  ASSERT_TRUE(page2.ok());
  EXPECT_EQ(page2->jobs(0).id(), "job-000003");
  req.set_page_token("job-000002");
  auto last = jobs_.List(req);
  ASSERT_EQ(last->jobs_size(), 1);
  EXPECT_TRUE(last->next_page_token().empty());

  apapo::v1::ListJobsRequest cancelled;
  cancelled.add_states(apapo::v1::JOB_STATE_CANCELLED);
  auto only = jobs_.List(cancelled);
  ASSERT_EQ(only->jobs_size(), 1);
  EXPECT_EQ(only->jobs(0).id(), "job-000002");

  apapo::v1::ListJobsRequest bad;
  bad.set_page_token("nope");
  EXPECT_EQ(jobs_.List(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobManagerTest, CancelRunsHookOnceAndRefusesEndedJobs) {
  std::vector<std::string> hooked;
  jobs_.SetCancelHook([&](const apapo::v1::Job& j) { hooked.push_back(j.id()); });
  auto job = jobs_.Submit(ValidSpec());
  auto cancelled = jobs_.Cancel(job->id(), "user asked");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), apapo::v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(cancelled->has_end_time());
  EXPECT_EQ(hooked, std::vector<std::string>{job->id()});
  auto again = jobs_.Cancel(job->id(), "");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(hooked.size(), 1u);
}

TEST_F(JobManagerTest, TheEndHookSeesEveryFinalStateOnce) {
  std::vector<std::pair<std::string, apapo::v1::JobState>> ended;
  jobs_.SetEndHook([&](const apapo::v1::Job& j) { ended.push_back({j.id(), j.state()}); });
  const std::string queued = jobs_.Submit(ValidSpec())->id();
  const std::string failed = jobs_.Submit(ValidSpec())->id();
  const std::string done = jobs_.Submit(ValidSpec())->id();
  ASSERT_TRUE(jobs_.Cancel(queued, "").ok());
  ASSERT_TRUE(jobs_.Transition(failed, apapo::v1::JOB_STATE_PROFILING, "p").ok());
  EXPECT_EQ(ended.size(), 1u);  // not a final state
  ASSERT_TRUE(jobs_.Transition(failed, apapo::v1::JOB_STATE_FAILED, "lost",
                               absl::StatusCode::kUnavailable)
                  .ok());
  for (auto state : {apapo::v1::JOB_STATE_PROFILING, apapo::v1::JOB_STATE_PLANNING,
                     apapo::v1::JOB_STATE_RUNNING, apapo::v1::JOB_STATE_SUCCEEDED}) {
    ASSERT_TRUE(jobs_.Transition(done, state, "").ok());
  }
  // Refused transitions of ended jobs report nothing.
  EXPECT_FALSE(jobs_.Transition(failed, apapo::v1::JOB_STATE_SUCCEEDED, "").ok());
  EXPECT_FALSE(jobs_.Cancel(done, "").ok());
  EXPECT_THAT(ended, ::testing::ElementsAre(
                         std::pair{queued, apapo::v1::JOB_STATE_CANCELLED},
                         std::pair{failed, apapo::v1::JOB_STATE_FAILED},
                         std::pair{done, apapo::v1::JOB_STATE_SUCCEEDED}));
}

TEST_F(JobManagerTest, TransitionsFollowTheLifecycle) {
  auto job = jobs_.Submit(ValidSpec());
  const std::string id = job->id();
  ASSERT_TRUE(jobs_.Transition(id, apapo::v1::JOB_STATE_PROFILING, "p").ok());
  ASSERT_TRUE(jobs_.Transition(id, apapo::v1::JOB_STATE_PLANNING, "pl").ok());
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(jobs_.Transition(id, apapo::v1::JOB_STATE_RUNNING, "r").ok());
  EXPECT_EQ(jobs_.Transition(id, apapo::v1::JOB_STATE_PROFILING, "back")
                .code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(jobs_.Transition(id, apapo::v1::JOB_STATE_FAILED,
                               "stage 1 on w-2: peer lost",
                               absl::StatusCode::kUnavailable)
                  .ok());
  auto failed = jobs_.Get(id);
  EXPECT_EQ(failed->error(), "stage 1 on w-2: peer lost");
  EXPECT_EQ(failed->error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(failed->start_time().seconds(), 1'800'000'003);
  EXPECT_EQ(jobs_.Transition(id, apapo::v1::JOB_STATE_SUCCEEDED, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(failed->last_event_sequence(), 5);
}

TEST_F(JobManagerTest, GetPlanBeforePlanningIsFailedPrecondition) {
  auto job = jobs_.Submit(ValidSpec());
  EXPECT_EQ(jobs_.GetPlan(job->id()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  apapo::v1::GetPlanResponse plan;
  plan.mutable_plan()->set_micro_batches(4);
  ASSERT_TRUE(jobs_.SetPlan(job->id(), plan).ok());
  EXPECT_EQ(jobs_.GetPlan(job->id())->plan().micro_batches(), 4);
}

TEST_F(JobManagerTest, WaitForChangeWakesOnEventAndReturnsEventsAfterCursor) {
  auto job = jobs_.Submit(ValidSpec());
  auto first = jobs_.WaitForChange(job->id(), -1, 0, absl::InfinitePast());
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->events.size(), 1u);
  std::thread mover([&] {
    ASSERT_TRUE(
        jobs_.Transition(job->id(), apapo::v1::JOB_STATE_PROFILING, "go").ok());
  });
  auto next = jobs_.WaitForChange(job->id(), first->version, 1,
                                  absl::Now() + absl::Seconds(30));
  mover.join();
  ASSERT_TRUE(next.ok());
  EXPECT_GT(next->version, first->version);
  ASSERT_EQ(next->events.size(), 1u);
  EXPECT_EQ(next->events[0].message(), "go");
  EXPECT_EQ(next->job.state(), apapo::v1::JOB_STATE_PROFILING);
}

TEST_F(JobManagerTest, WaitForChangeTimesOutWithoutChange) {
  auto job = jobs_.Submit(ValidSpec());
  auto first = jobs_.WaitForChange(job->id(), -1, 0, absl::InfinitePast());
  auto same = jobs_.WaitForChange(job->id(), first->version, 1,
                                  absl::Now() + absl::Milliseconds(20));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->version, first->version);
  EXPECT_TRUE(same->events.empty());
}

TEST_F(JobManagerTest, RecoverKeepsHistoryFailsActiveJobsAndContinuesIds) {
  auto queued = jobs_.Submit(ValidSpec());
  auto running = jobs_.Submit(ValidSpec());
  ASSERT_TRUE(
      jobs_.Transition(running->id(), apapo::v1::JOB_STATE_PROFILING, "p").ok());
  JobManager restarted(&store_, &clock_);
  ASSERT_TRUE(restarted.Recover().ok());
  EXPECT_EQ(restarted.Get(queued->id())->state(), apapo::v1::JOB_STATE_QUEUED);
  auto failed = restarted.Get(running->id());
  EXPECT_EQ(failed->state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed->error(), HasSubstr("coordinator restarted"));
  auto change = restarted.WaitForChange(running->id(), -1, 0, absl::InfinitePast());
  EXPECT_EQ(change->events.size(), 3u);
  EXPECT_EQ(restarted.Submit(ValidSpec())->id(), "job-000003");
}

TEST_F(JobManagerTest, RecoverKeepsRunningJobsWithAPlanForAdoption) {
  auto running = jobs_.Submit(ValidSpec());
  for (auto state : {apapo::v1::JOB_STATE_PROFILING, apapo::v1::JOB_STATE_PLANNING}) {
    ASSERT_TRUE(jobs_.Transition(running->id(), state, "s").ok());
  }
  ASSERT_TRUE(jobs_.SetPlan(running->id(), apapo::v1::GetPlanResponse()).ok());
  ASSERT_TRUE(jobs_.Transition(running->id(), apapo::v1::JOB_STATE_RUNNING, "r").ok());
  JobManager restarted(&store_, &clock_);
  ASSERT_TRUE(restarted.Recover().ok());
  EXPECT_EQ(restarted.Get(running->id())->state(), apapo::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(restarted.JobsIn(apapo::v1::JOB_STATE_RUNNING),
            std::vector<std::string>{running->id()});
  auto change = restarted.WaitForChange(running->id(), -1, 0, absl::InfinitePast());
  EXPECT_THAT(change->events.back().message(),
              HasSubstr("adopting the stages still training"));
}

TEST_F(JobManagerTest, ProgressIsVisibleAtOnceAndSavedInOneTransactionPerBatch) {
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(jobs_.Submit(ValidSpec())->id());
  ASSERT_TRUE(jobs_.FlushProgress().ok());  // nothing dirty: no write
  const int64_t writes_before = store_.job_writes();
  // Many reports from three jobs' stages...
  for (int step = 1; step <= 50; ++step) {
    for (const std::string& id : ids) {
      apapo::v1::JobProgress p;
      p.set_step(step);
      ASSERT_TRUE(jobs_.UpdateProgress(id, p).ok());
      EXPECT_EQ(jobs_.Get(id)->progress().step(), step);  // visible at once
    }
  }
  // ...are saved by one batch, holding the newest progress of each job.
  ASSERT_TRUE(jobs_.FlushProgress().ok());
  EXPECT_LE(store_.job_writes() - writes_before, 2);  // the writer may have
                                                      // taken one batch too
  auto saved = store_.LoadJobs();  // kept: the loop must not outlive it
  ASSERT_TRUE(saved.ok()) << saved.status();
  for (const auto& job : *saved) {
    EXPECT_EQ(job.progress().step(), 50) << job.id();
  }
  EXPECT_EQ(jobs_.UpdateProgress("job-999999", {}).code(),
            absl::StatusCode::kNotFound);
}

TEST(JobManagerWriterTest, SavesProgressBehindWithoutBeingAsked) {
  MemoryJobStore store;
  FakeClock clock;
  JobManager jobs(&store, &clock, absl::Milliseconds(1));
  std::string id = jobs.Submit(ValidSpec())->id();
  apapo::v1::JobProgress p;
  p.set_step(7);
  ASSERT_TRUE(jobs.UpdateProgress(id, p).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (store.LoadJobs()->at(0).progress().step() != 7 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));  // polling the store's content
  }
  EXPECT_EQ(store.LoadJobs()->at(0).progress().step(), 7);
}

TEST(JobManagerWriterTest, ProgressNotYetSavedIsWrittenOnDestruction) {
  MemoryJobStore store;
  FakeClock clock;
  std::string id;
  {
    JobManager jobs(&store, &clock, absl::Hours(1));
    id = jobs.Submit(ValidSpec())->id();
    apapo::v1::JobProgress p;
    p.set_step(11);
    ASSERT_TRUE(jobs.UpdateProgress(id, p).ok());
  }
  EXPECT_EQ(store.LoadJobs()->at(0).progress().step(), 11);
}

TEST_F(JobManagerTest, ListPagesStayUnderTheReplyLimitWhateverTheSpecs) {
  // Specs near the cap (common/limits.h): a page of 100 of them would be
  // ~90 MiB; pages stop at kMaxPageBytes and continue.
  for (int i = 0; i < 5; ++i) {
    auto spec = ValidSpec();
    (*spec.mutable_labels())["blob"] = std::string(900 << 10, 'x');
    ASSERT_TRUE(jobs_.Submit(spec).ok());
  }
  apapo::v1::ListJobsRequest request;
  int seen = 0;
  for (int page = 0; page < 10; ++page) {
    auto response = jobs_.List(request);
    ASSERT_TRUE(response.ok());
    EXPECT_LE(response->ByteSizeLong(), kMaxPageBytes);
    EXPECT_GE(response->jobs_size(), 1);
    seen += response->jobs_size();
    if (response->next_page_token().empty()) break;
    request.set_page_token(response->next_page_token());
  }
  EXPECT_EQ(seen, 5);
}

}  // namespace
}  // namespace apapo::coordinator

namespace apapo::coordinator {
namespace {

TEST_F(JobManagerTest, StageTracesAreBoundedPerJobAndInJobs) {
  std::vector<std::string> ids;
  for (int i = 0; i < JobManager::kMaxTracedJobs + 1; ++i) {
    auto job = jobs_.Submit(ValidSpec());
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->id());
    apapo::v1::StageTrace t;
    t.add_spans();
    ASSERT_TRUE(jobs_.AddStageTrace(job->id(), t).ok());
  }
  // The oldest traced job's traces went first; the job itself stays.
  EXPECT_TRUE(jobs_.StageTraces(ids.front())->empty());
  EXPECT_EQ(jobs_.StageTraces(ids.back())->size(), 1u);
  // Too many spans for one job: refused, what was kept stays.
  apapo::v1::StageTrace big;
  big.set_stage(1);
  for (int i = 0; i < JobManager::kMaxTraceSpans; ++i) big.add_spans();
  absl::Status st = jobs_.AddStageTrace(ids.back(), big);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(jobs_.StageTraces(ids.back())->size(), 1u);
  EXPECT_EQ(jobs_.StageTraces("job-999999").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace apapo::coordinator
