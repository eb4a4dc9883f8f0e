#include "coordinator/worker_service.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/tls.h"
#include "coordinator/call_access.h"
#include "google/protobuf/util/time_util.h"

namespace apapo::coordinator {

using apapo::v1::CoordinatorMessage;
using apapo::v1::WorkerMessage;

// One worker's Connect stream. Lives from Connect() until OnDone(), where it
// deletes itself. One read is outstanding at a time, and at most one write:
// the Registered reply first, then the session's commands in order.
class WorkerServiceImpl::ConnectReactor final
    : public grpc::ServerBidiReactor<WorkerMessage, CoordinatorMessage>,
      public WorkerStream {
 public:
  ConnectReactor(WorkerServiceImpl* service,
                 grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    StartRead(&in_);
  }

  // --- gRPC reactions ---

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The worker half-closed, or the call was cancelled (connection lost,
      // server shutting down).
      End(grpc::Status::OK, context_->IsCancelled()
                                ? "connection lost"
                                : "stream closed by the worker");
      return;
    }
    if (session_ == nullptr) {
      OnRegister();
      return;
    }
    if (!session_->live()) {
      End(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       "this session ended; reconnect"),
          "superseded");
      return;
    }
    session_->Heartbeat();  // any message is a sign of life
    switch (in_.kind_case()) {
      case WorkerMessage::kHeartbeat:
        break;
      case WorkerMessage::kRegister:
        End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "register may only be the first message"),
            "registered twice on one stream");
        return;
      default:
        if (service_->listener_ != nullptr) {
          service_->listener_->OnWorkerMessage(session_->worker_id(), in_);
        }
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) broken_ = true;  // the read fails too and ends the stream
      if (pending_finish_.has_value()) {
        finish = std::move(pending_finish_);
        pending_finish_.reset();
      }
    }
    if (finish.has_value()) {
      Finish(*finish);
      return;
    }
    WriteNext();
  }

  void OnDone() override {
    if (session_ != nullptr) session_->DetachStream();
    delete this;
  }

  // --- WorkerStream (from the registry, any thread) ---

  void OnCommandsQueued() override { WriteNext(); }

  void OnSessionEnded(const std::string& reason) override {
    FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "the coordinator marked this worker lost: " + reason));
  }

 private:
  void OnRegister() {
    if (in_.kind_case() != WorkerMessage::kRegister) {
      FinishOnce(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "the first message on Connect must be register"));
      return;
    }
    if (service_->require_certificates_) {
      const std::string& id = in_.register_().worker_id();
      const std::string name = VerifiedPeerName(*context_->auth_context());
      if (name.empty()) {
        FinishOnce(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                "a worker must present its client certificate "
                                "(--tls_cert, --tls_key; deploy/pki.sh)"));
        return;
      }
      if (name != id) {
        FinishOnce(grpc::Status(
            grpc::StatusCode::PERMISSION_DENIED,
            "the client certificate is for worker \"" + name +
                "\"; it cannot register as \"" + id + "\""));
        return;
      }
    }
    WorkerRegistry* registry = service_->registry_;
    absl::StatusOr<std::shared_ptr<WorkerSession>> session =
        registry->Register(in_.register_(), this);
    if (!session.ok()) {
      FinishOnce(ToGrpcStatus(session.status()));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      session_ = *session;
      registered_.mutable_registered()->set_worker_id(session_->worker_id());
      *registered_.mutable_registered()->mutable_heartbeat_interval() =
          google::protobuf::util::TimeUtil::NanosecondsToDuration(
              absl::ToInt64Nanoseconds(registry->heartbeat_interval()));
      send_registered_ = true;
    }
    if (service_->on_registered_) service_->on_registered_(in_.register_());
    WriteNext();
    StartRead(&in_);
  }

  // Starts the next write if none is in flight: the Registered reply, then
  // the oldest queued command. StartWrite is called without mu_ held, since
  // gRPC may run OnWriteDone on this thread before it returns.
  void WriteNext() {
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_ || broken_) return;
      if (send_registered_) {
        send_registered_ = false;
        out_ = std::move(registered_);
      } else {
        if (session_ == nullptr) return;
        std::optional<CoordinatorMessage> command = session_->TakeCommand();
        if (!command.has_value()) return;
        out_ = std::move(*command);
      }
      writing_ = true;
    }
    StartWrite(&out_);
  }

  // Finishes the call with `status` and records the worker lost (unless it
  // already is). Finishing first keeps `status`: the registry's lost
  // notification would finish it with UNAVAILABLE. Once finished, OnDone
  // may delete this at any moment, so what follows uses locals only.
  void End(grpc::Status status, const std::string& reason) {
    std::shared_ptr<WorkerSession> session = session_;
    WorkerRegistry* registry = service_->registry_;
    FinishOnce(std::move(status));
    if (session != nullptr) registry->Disconnect(*session, reason);
  }

  // Finishes the call once; after a write in flight completes, if any.
  void FinishOnce(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
      if (writing_) {
        pending_finish_ = std::move(status);
        return;
      }
    }
    Finish(status);
  }

  WorkerServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  // Touched only by the read reactions, which gRPC never runs concurrently.
  WorkerMessage in_;
  std::shared_ptr<WorkerSession> session_;  // set once, on registration

  absl::Mutex mu_;
  CoordinatorMessage out_ ABSL_GUARDED_BY(mu_);  // the write in flight
  CoordinatorMessage registered_ ABSL_GUARDED_BY(mu_);
  bool send_registered_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
};

WorkerServiceImpl::WorkerServiceImpl(WorkerRegistry* registry,
                                     WorkerMessageListener* listener)
    : registry_(registry), listener_(listener) {}

grpc::ServerBidiReactor<WorkerMessage, CoordinatorMessage>*
WorkerServiceImpl::Connect(grpc::CallbackServerContext* context) {
  return new ConnectReactor(this, context);
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ListWorkers(
    grpc::CallbackServerContext* context,
    const apapo::v1::ListWorkersRequest* request,
    apapo::v1::ListWorkersResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (access_ != nullptr) {
    absl::StatusOr<Caller> caller =
        AuthorizeCall(*access_, *context, Role::kRead, "ListWorkers");
    if (!caller.ok()) {
      reactor->Finish(ToGrpcStatus(caller.status()));
      return reactor;
    }
  }
  absl::StatusOr<apapo::v1::ListWorkersResponse> page = registry_->List(*request);
  if (page.ok()) *response = std::move(*page);
  reactor->Finish(ToGrpcStatus(page.status()));
  return reactor;
}

}  // namespace apapo::coordinator
