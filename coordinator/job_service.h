// JobService gRPC adapter: unpacks requests, calls the JobManager, converts
// statuses (common/grpc_status.h) and nothing else.
//
// Thread-safety: handlers run concurrently on gRPC's threads; all state is
// in the JobManager.
#ifndef APAPO_COORDINATOR_JOB_SERVICE_H_
#define APAPO_COORDINATOR_JOB_SERVICE_H_

#include <functional>

#include "absl/time/time.h"
#include "coordinator/access.h"
#include "coordinator/job_manager.h"
#include "proto/apapo/v1/service.grpc.pb.h"

namespace apapo::coordinator {

class JobServiceImpl final : public apapo::v1::JobService::Service {
 public:
  // `jobs` (and `access`, when given) must outlive the service. WatchJob
  // streams re-check for client cancellation every `watch_poll`. Every call
  // is authorized by `access` (coordinator/access.h); none checks tokens
  // when it is null.
  explicit JobServiceImpl(JobManager* jobs,
                          absl::Duration watch_poll = absl::Milliseconds(250),
                          const AccessPolicy* access = nullptr);

  // Called after every accepted submission (wakes the scheduler, counts).
  void SetSubmitHook(std::function<void(const apapo::v1::Job&)> hook) {
    on_submitted_ = std::move(hook);
  }

  grpc::Status SubmitJob(grpc::ServerContext* context,
                         const apapo::v1::SubmitJobRequest* request,
                         apapo::v1::SubmitJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context,
                      const apapo::v1::GetJobRequest* request,
                      apapo::v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const apapo::v1::ListJobsRequest* request,
                        apapo::v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context,
                         const apapo::v1::CancelJobRequest* request,
                         apapo::v1::Job* response) override;
  grpc::Status GetPlan(grpc::ServerContext* context,
                       const apapo::v1::GetPlanRequest* request,
                       apapo::v1::GetPlanResponse* response) override;
  grpc::Status GetTrace(grpc::ServerContext* context,
                        const apapo::v1::GetTraceRequest* request,
                        apapo::v1::GetTraceResponse* response) override;
  grpc::Status WatchJob(
      grpc::ServerContext* context, const apapo::v1::WatchJobRequest* request,
      grpc::ServerWriter<apapo::v1::WatchJobResponse>* writer) override;

 private:
  // The caller, if it may do `what` with at least `role`.
  absl::StatusOr<Caller> Authorize(grpc::ServerContext* context, Role role,
                                   absl::string_view what) const;

  JobManager* const jobs_;
  const absl::Duration watch_poll_;
  const AccessPolicy no_tokens_;
  const AccessPolicy* const access_;
  std::function<void(const apapo::v1::Job&)> on_submitted_;
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_JOB_SERVICE_H_
