#include "coordinator/coordinator.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/access.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_service.h"
#include "coordinator/job_store.h"
#include "coordinator/metrics.h"
#include "coordinator/server.h"
#include "coordinator/worker_registry.h"
#include "coordinator/worker_service.h"
#include "planning/partitioner_planner.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace apapo::coordinator {
namespace {

absl::Status Validate(const CoordinatorOptions& o) {
  if (o.port < 0 || o.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port must be in 0..65535, got ", o.port));
  }
  if (o.metrics_port < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics port must be -1 (off) or a port, got ", o.metrics_port));
  }
  if (o.max_ended_jobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_ended_jobs must be >= 0, got ", o.max_ended_jobs));
  }
  if (o.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat interval must be > 0, got ",
                     absl::FormatDuration(o.heartbeat_interval)));
  }
  if (o.heartbeat_slots < 0 || o.heartbeat_slots > WorkerServiceImpl::kMaxHeartbeatSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heartbeat_slots must be in 0..",
                     WorkerServiceImpl::kMaxHeartbeatSlots, ", got ", o.heartbeat_slots));
  }
  if (o.heartbeat_slot_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--heartbeat_slot_size must be >= 1, got ", o.heartbeat_slot_size));
  }
  if (!o.tls.enabled() && !IsLoopback(o.host) && !o.allow_insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listening on ", o.host, " without TLS would let anyone who reaches "
        "the port submit, read and cancel jobs and pose as a worker: give "
        "--tls_cert, --tls_key and --tls_ca (deploy/pki.sh makes them), or "
        "--insecure"));
  }
  if (o.state_path.empty()) {
    return absl::InvalidArgumentError(
        "state path is empty (a file, or \":memory:\")");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<JobStore>> OpenStore(const std::string& path) {
  if (path == ":memory:") return std::make_unique<MemoryJobStore>();
  return OpenSqliteJobStore(path);
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options,
                         planning::Planner* planner, Clock* clock)
    : options_(std::move(options)),
      owned_planner_(planner == nullptr
                         ? std::make_unique<planning::PartitionerPlanner>()
                         : nullptr),
      owned_clock_(clock == nullptr ? std::make_unique<RealClock>() : nullptr),
      planner_(planner != nullptr ? planner : owned_planner_.get()),
      clock_(clock != nullptr ? clock : owned_clock_.get()) {}

Coordinator::~Coordinator() { Shutdown(); }

absl::Status Coordinator::Start() {
  absl::Status status = StartServing();
  if (!status.ok()) Shutdown();
  return status;
}

absl::Status Coordinator::StartServing() {
  if (store_ != nullptr) {
    return absl::FailedPreconditionError("coordinator already started");
  }
  APAPO_RETURN_IF_ERROR(Validate(options_));
  const std::string& state = options_.state_path;
  APAPO_ASSIGN_OR_RETURN(store_, OpenStore(state));
  jobs_ = std::make_unique<JobManager>(store_.get(), clock_, absl::Milliseconds(200),
                                       options_.data_roots);
  if (absl::Status s = jobs_->Recover(); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("recovering ", state, ": ", s.message()));
  }
  jobs_->set_max_ended_jobs(options_.max_ended_jobs);
  registry_ = std::make_unique<WorkerRegistry>(clock_, options_.heartbeat_interval);

  // Metrics: families in a registry, served on the metrics port.
  metrics_registry_ = std::make_shared<prometheus::Registry>();
  metrics_ = std::make_unique<CoordinatorMetrics>(
      metrics_registry_.get(), jobs_.get(), registry_.get(), clock_);
  if (options_.metrics_port >= 0) {
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(
          absl::StrCat(options_.host, ":", options_.metrics_port));
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve metrics on port ", options_.metrics_port,
                       ": ", e.what()));
    }
    exposer_->RegisterCollectable(metrics_registry_);
    exposer_->RegisterCollectable(metrics_->state_collectable());
    metrics_port_ = exposer_->GetListeningPorts().front();
  }

  scheduler_ = std::make_unique<Scheduler>(jobs_.get(), registry_.get(),
                                           planner_, clock_, options_.scheduler,
                                           metrics_.get());
  // Jobs that were running when the previous coordinator stopped train on:
  // their workers' registrations are expected from here on.
  scheduler_->AdoptRunningJobs();
  jobs_->SetCancelHook(
      [this](const apapo::v1::Job& job) { scheduler_->OnCancelled(job); });
  jobs_->SetEndHook(
      [this](const apapo::v1::Job& job) { metrics_->OnJobFinished(job.state()); });
  registry_->SetLostHook([this](const std::string& worker,
                                const std::string& job,
                                const std::string& reason) {
    metrics_->OnWorkerLost(worker);
    scheduler_->OnWorkerLost(worker, job, reason);
  });

  access_ = std::make_unique<AccessPolicy>();
  if (!options_.tokens_file.empty()) {
    APAPO_ASSIGN_OR_RETURN(AccessPolicy policy,
                           AccessPolicy::FromFile(options_.tokens_file));
    *access_ = std::move(policy);
  }
  job_service_ = std::make_unique<JobServiceImpl>(
      jobs_.get(), absl::Milliseconds(250), access_.get());
  job_service_->SetSubmitHook([this](const apapo::v1::Job&) {
    metrics_->OnJobSubmitted();
    scheduler_->Wake();
  });
  APAPO_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                         MakeServerCredentials(options_.tls));
  worker_service_ =
      std::make_unique<WorkerServiceImpl>(registry_.get(), scheduler_.get(),
                                          options_.pace_idle_reads,
                                          options_.heartbeat_slots,
                                          options_.heartbeat_slot_size);
  worker_service_->RequireWorkerCertificates(options_.tls.enabled());
  worker_service_->SetAccessPolicy(access_.get());
  worker_service_->SetRegisterHook([this](const apapo::v1::WorkerInfo& info) {
    metrics_->OnWorkerRegistered(info.worker_id());
    scheduler_->OnWorkerRegistered(info);
  });
  server_ = std::make_unique<CoordinatorServer>(
      std::vector<grpc::Service*>{job_service_.get(), worker_service_.get()},
      std::vector<std::string>{apapo::v1::JobService::service_full_name(),
                               apapo::v1::WorkerService::service_full_name()});
  APAPO_ASSIGN_OR_RETURN(
      port_, server_->Start(absl::StrCat(options_.host, ":", options_.port),
                            credentials));

  scheduler_->Start();
  // Wakes when the registry's deadline queue says a worker may be due, not
  // to scan every worker: at least once per heartbeat interval, at most ten
  // times per interval (a fleet's deadlines are spread over the interval;
  // waking for each would cost a thread switch per worker and interval).
  // A silent worker is thus lost within 3.1 intervals.
  monitor_ = std::thread([this] {
    const absl::Duration resolution = options_.heartbeat_interval / 10;
    while (true) {
      absl::Duration wait =
          std::clamp(registry_->NextDeadline() - clock_->Now(), resolution,
                     options_.heartbeat_interval);
      if (stop_monitor_.WaitForNotificationWithTimeout(wait)) return;
      registry_->CheckTimeouts();
    }
  });
  return absl::OkStatus();
}

void Coordinator::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  // RPCs first, so no handler feeds the scheduler while it stops.
  if (server_ != nullptr) {
    server_->Shutdown();
    server_->Wait();
  }
  if (!stop_monitor_.HasBeenNotified()) stop_monitor_.Notify();
  if (monitor_.joinable()) monitor_.join();
  if (scheduler_ != nullptr) scheduler_->Stop();
  exposer_.reset();  // frees the metrics port
}

}  // namespace apapo::coordinator
