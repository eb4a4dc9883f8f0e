#include "coordinator/job_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "coordinator/call_access.h"
#include "planning/simulated_trace.h"

namespace apapo::coordinator {

using apapo::v1::WatchJobResponse;

JobServiceImpl::JobServiceImpl(JobManager* jobs, absl::Duration watch_poll,
                               const AccessPolicy* access)
    : jobs_(jobs),
      watch_poll_(watch_poll),
      access_(access != nullptr ? access : &no_tokens_) {}

absl::StatusOr<Caller> JobServiceImpl::Authorize(grpc::ServerContext* context,
                                                 Role role,
                                                 absl::string_view what) const {
  return AuthorizeCall(*access_, *context, role, what);
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* context,
                                       const apapo::v1::SubmitJobRequest* request,
                                       apapo::v1::SubmitJobResponse* response) {
  absl::StatusOr<Caller> caller = Authorize(context, Role::kSubmit, "SubmitJob");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<apapo::v1::Job> job = jobs_->Submit(request->spec(), caller->user);
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (on_submitted_) on_submitted_(*job);
  *response->mutable_job() = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context,
                                    const apapo::v1::GetJobRequest* request,
                                    apapo::v1::Job* response) {
  absl::StatusOr<Caller> caller = Authorize(context, Role::kRead, "GetJob");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<apapo::v1::Job> job = jobs_->Get(request->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const apapo::v1::ListJobsRequest* request,
                                      apapo::v1::ListJobsResponse* response) {
  absl::StatusOr<Caller> caller = Authorize(context, Role::kRead, "ListJobs");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<apapo::v1::ListJobsResponse> list = jobs_->List(*request);
  if (!list.ok()) return ToGrpcStatus(list.status());
  *response = std::move(*list);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const apapo::v1::CancelJobRequest* request,
                                       apapo::v1::Job* response) {
  absl::StatusOr<Caller> caller = Authorize(context, Role::kSubmit, "CancelJob");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // One's own jobs; anyone's with the admin role.
  if (caller->role != Role::kAdmin) {
    absl::StatusOr<apapo::v1::Job> current = jobs_->Get(request->job_id());
    if (!current.ok()) return ToGrpcStatus(current.status());
    if (current->owner() != caller->user) {
      return ToGrpcStatus(absl::PermissionDeniedError(absl::StrCat(
          request->job_id(), " belongs to ", current->owner(), "; only its owner "
          "or an admin may cancel it")));
    }
  }
  absl::StatusOr<apapo::v1::Job> job =
      jobs_->Cancel(request->job_id(),
                    caller->user == "anonymous"
                        ? request->reason()
                        : absl::StrCat(request->reason(), " (by ", caller->user, ")"));
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetPlan(grpc::ServerContext* context,
                                     const apapo::v1::GetPlanRequest* request,
                                     apapo::v1::GetPlanResponse* response) {
  absl::StatusOr<Caller> caller = Authorize(context, Role::kRead, "GetPlan");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<apapo::v1::GetPlanResponse> plan =
      jobs_->GetPlan(request->job_id());
  if (!plan.ok()) return ToGrpcStatus(plan.status());
  *response = std::move(*plan);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetTrace(grpc::ServerContext* context,
                                      const apapo::v1::GetTraceRequest* request,
                                      apapo::v1::GetTraceResponse* response) {
  absl::StatusOr<Caller> caller = Authorize(context, Role::kRead, "GetTrace");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  constexpr int kDefaultSteps = 3, kMaxSteps = 50;
  if (request->simulated_steps() < 0 || request->simulated_steps() > kMaxSteps) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "simulated_steps: ", request->simulated_steps(), " is outside 0..",
        kMaxSteps)));
  }
  absl::StatusOr<std::vector<apapo::v1::StageTrace>> measured =
      jobs_->StageTraces(request->job_id());
  if (!measured.ok()) return ToGrpcStatus(measured.status());
  for (auto& t : *measured) *response->add_stages() = std::move(t);
  absl::StatusOr<apapo::v1::GetPlanResponse> plan = jobs_->GetPlan(request->job_id());
  if (!plan.ok()) {
    response->set_simulated_note(std::string(plan.status().message()));
    return grpc::Status::OK;
  }
  absl::StatusOr<std::vector<apapo::v1::StageTrace>> simulated =
      planning::SimulatedTrace(*plan, request->simulated_steps() > 0
                                          ? request->simulated_steps()
                                          : kDefaultSteps);
  if (!simulated.ok()) {
    response->set_simulated_note(
        absl::StrCat("simulation: ", simulated.status().message()));
    return grpc::Status::OK;
  }
  for (auto& t : *simulated) *response->add_simulated() = std::move(t);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::WatchJob(
    grpc::ServerContext* context, const apapo::v1::WatchJobRequest* request,
    grpc::ServerWriter<WatchJobResponse>* writer) {
  absl::StatusOr<Caller> caller = Authorize(context, Role::kRead, "WatchJob");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (request->after_sequence() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "after_sequence: must be >= 0"));
  }
  // The snapshot: the job now, then the history after the cursor.
  absl::StatusOr<JobChange> change = jobs_->WaitForChange(
      request->job_id(), /*seen_version=*/-1, request->after_sequence(),
      absl::InfinitePast());
  if (!change.ok()) return ToGrpcStatus(change.status());
  WatchJobResponse first;
  *first.mutable_job() = change->job;
  if (!writer->Write(first)) return grpc::Status::OK;
  int64_t cursor = request->after_sequence();
  int64_t version = change->version;
  while (true) {
    for (const auto& event : change->events) {
      WatchJobResponse message;
      *message.mutable_job() = change->job;
      *message.mutable_event() = event;
      if (!writer->Write(message)) return grpc::Status::OK;
      cursor = event.sequence();
    }
    if (IsTerminal(change->job.state()) &&
        cursor >= change->job.last_event_sequence()) {
      return grpc::Status::OK;
    }
    // Wait for the next change, waking up to notice a client that left.
    while (true) {
      if (context->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled");
      }
      change = jobs_->WaitForChange(request->job_id(), version, cursor,
                                    absl::Now() + watch_poll_);
      if (!change.ok()) return ToGrpcStatus(change.status());
      if (change->version != version) break;
    }
    version = change->version;
    if (change->events.empty()) {  // progress only
      WatchJobResponse message;
      *message.mutable_job() = change->job;
      if (!writer->Write(message)) return grpc::Status::OK;
    }
  }
}

}  // namespace apapo::coordinator
