// Durable storage of jobs, their event history and their plans.
//
// The JobManager writes through a JobStore on every change and reads it back
// once at start-up (Recover), so a restarted coordinator lists every job
// with its history. Two implementations: MemoryJobStore (tests, and
// `--state=:memory:`) and SqliteJobStore (the default, one file).
//
// Thread-safety: implementations are thread-safe.
#ifndef APAPO_COORDINATOR_JOB_STORE_H_
#define APAPO_COORDINATOR_JOB_STORE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/apapo/v1/job.pb.h"
#include "proto/apapo/v1/service.pb.h"

namespace apapo::coordinator {

class JobStore {
 public:
  virtual ~JobStore() = default;
  // Inserts or replaces the job with id `job.id()`.
  virtual absl::Status SaveJob(const apapo::v1::Job& job) = 0;
  // Inserts or replaces every job of `jobs` in one transaction: all or none.
  virtual absl::Status SaveJobs(const std::vector<apapo::v1::Job>& jobs) = 0;
  // Appends one event to the job's history.
  virtual absl::Status AppendEvent(const std::string& job_id,
                                   const apapo::v1::JobEvent& event) = 0;
  // Stores the job's plan with the profile and cluster it came from.
  virtual absl::Status SavePlan(const std::string& job_id,
                                const apapo::v1::GetPlanResponse& plan) = 0;
  // Every stored job, in id order.
  virtual absl::StatusOr<std::vector<apapo::v1::Job>> LoadJobs() = 0;
  // The job's events in sequence order.
  virtual absl::StatusOr<std::vector<apapo::v1::JobEvent>> LoadEvents(
      const std::string& job_id) = 0;
  // The job's plan; NOT_FOUND if none was stored.
  virtual absl::StatusOr<apapo::v1::GetPlanResponse> LoadPlan(
      const std::string& job_id) = 0;
  // Removes the job, its events and its plan (history retention); OK if
  // it is not stored.
  virtual absl::Status DeleteJob(const std::string& job_id) = 0;
};

// Keeps everything in memory (lost at exit).
class MemoryJobStore : public JobStore {
 public:
  absl::Status SaveJob(const apapo::v1::Job& job) override;
  absl::Status SaveJobs(const std::vector<apapo::v1::Job>& jobs) override;
  // Calls of SaveJob and SaveJobs so far (each one a transaction).
  int64_t job_writes();
  absl::Status AppendEvent(const std::string& job_id,
                           const apapo::v1::JobEvent& event) override;
  absl::Status SavePlan(const std::string& job_id,
                        const apapo::v1::GetPlanResponse& plan) override;
  absl::StatusOr<std::vector<apapo::v1::Job>> LoadJobs() override;
  absl::StatusOr<std::vector<apapo::v1::JobEvent>> LoadEvents(
      const std::string& job_id) override;
  absl::StatusOr<apapo::v1::GetPlanResponse> LoadPlan(
      const std::string& job_id) override;
  absl::Status DeleteJob(const std::string& job_id) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, apapo::v1::Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<apapo::v1::JobEvent>> events_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, apapo::v1::GetPlanResponse> plans_ ABSL_GUARDED_BY(mu_);
  int64_t job_writes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Opens (creating if needed) an SQLite database at `path` holding jobs,
// events and plans as serialized protos. Writes are durable on return.
absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(
    const std::string& path);

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_JOB_STORE_H_
