#include "coordinator/job_store.h"

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace apapo::coordinator {
namespace {

apapo::v1::Job MakeJob(const std::string& id, apapo::v1::JobState state) {
  apapo::v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.mutable_spec()->set_name("n-" + id);
  return job;
}

apapo::v1::JobEvent MakeEvent(int64_t seq, const std::string& message) {
  apapo::v1::JobEvent e;
  e.set_sequence(seq);
  e.set_message(message);
  return e;
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// Exercises the JobStore contract on any implementation.
void ExerciseContract(JobStore& store) {
  ASSERT_TRUE(store.SaveJob(MakeJob("job-000002", apapo::v1::JOB_STATE_QUEUED)).ok());
  ASSERT_TRUE(store.SaveJob(MakeJob("job-000001", apapo::v1::JOB_STATE_RUNNING)).ok());
  // Replace, not duplicate.
  ASSERT_TRUE(store.SaveJob(MakeJob("job-000001", apapo::v1::JOB_STATE_FAILED)).ok());
  ASSERT_TRUE(store.AppendEvent("job-000001", MakeEvent(1, "submitted")).ok());
  ASSERT_TRUE(store.AppendEvent("job-000001", MakeEvent(2, "failed")).ok());
  apapo::v1::GetPlanResponse plan;
  plan.mutable_plan()->set_micro_batches(4);
  plan.mutable_plan()->add_stages()->add_node_ids("fc1");
  ASSERT_TRUE(store.SavePlan("job-000001", plan).ok());
}

void CheckContract(JobStore& store) {
  auto jobs = store.LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id(), "job-000001");
  EXPECT_EQ((*jobs)[0].state(), apapo::v1::JOB_STATE_FAILED);
  EXPECT_EQ((*jobs)[1].spec().name(), "n-job-000002");
  auto events = store.LoadEvents("job-000001");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].message(), "failed");
  EXPECT_TRUE(store.LoadEvents("job-000002")->empty());
  auto plan = store.LoadPlan("job-000001");
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->plan().stages(0).node_ids(0), "fc1");
  EXPECT_EQ(store.LoadPlan("job-000002").status().code(),
            absl::StatusCode::kNotFound);
}

// DeleteJob removes the job, its events and its plan, and nothing else.
void CheckDelete(JobStore& store) {
  ASSERT_TRUE(store.DeleteJob("job-000001").ok());
  ASSERT_TRUE(store.DeleteJob("job-000009").ok());  // not stored: fine
  auto jobs = store.LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].id(), "job-000002");
  EXPECT_TRUE(store.LoadEvents("job-000001")->empty());
  EXPECT_EQ(store.LoadPlan("job-000001").status().code(), absl::StatusCode::kNotFound);
}

TEST(MemoryJobStoreTest, Contract) {
  MemoryJobStore store;
  ExerciseContract(store);
  CheckContract(store);
  CheckDelete(store);
}

TEST(SqliteJobStoreTest, ContractSurvivesReopen) {
  std::string path = TempPath("store_reopen.db");
  std::filesystem::remove(path);
  {
    auto store = OpenSqliteJobStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ExerciseContract(**store);
    CheckContract(**store);
  }
  auto reopened = OpenSqliteJobStore(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  CheckContract(**reopened);
  CheckDelete(**reopened);
}

TEST(SqliteJobStoreTest, UnopenablePathIsFailedPrecondition) {
  auto store = OpenSqliteJobStore("/nonexistent-dir/sub/x.db");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("/nonexistent-dir/sub/x.db"),
            std::string::npos);
}

}  // namespace
}  // namespace apapo::coordinator
