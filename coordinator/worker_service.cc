#include "coordinator/worker_service.h"

#include <thread>

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "google/protobuf/util/time_util.h"

namespace apapo::coordinator {

WorkerServiceImpl::WorkerServiceImpl(WorkerRegistry* registry,
                                     WorkerMessageListener* listener,
                                     absl::Duration poll)
    : registry_(registry), listener_(listener), poll_(poll) {}

grpc::Status WorkerServiceImpl::Connect(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<apapo::v1::CoordinatorMessage,
                             apapo::v1::WorkerMessage>* stream) {
  apapo::v1::WorkerMessage message;
  if (!stream->Read(&message)) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "stream closed before registering");
  }
  if (message.kind_case() != apapo::v1::WorkerMessage::kRegister) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first message on Connect must be register");
  }
  const std::string worker_id = message.register_().worker_id();
  absl::StatusOr<int64_t> session = registry_->Register(message.register_());
  if (!session.ok()) return ToGrpcStatus(session.status());

  apapo::v1::CoordinatorMessage registered;
  registered.mutable_registered()->set_worker_id(worker_id);
  *registered.mutable_registered()->mutable_heartbeat_interval() =
      google::protobuf::util::TimeUtil::NanosecondsToDuration(
          absl::ToInt64Nanoseconds(registry_->heartbeat_interval()));
  if (on_registered_) on_registered_(worker_id);
  if (!stream->Write(registered)) {
    registry_->Disconnect(worker_id, *session, "stream broke on registration");
    return grpc::Status::OK;
  }

  // One writer drains the registry's outbox while this thread reads.
  std::thread writer([&] {
    while (registry_->IsCurrent(worker_id, *session) && !context->IsCancelled()) {
      auto command =
          registry_->NextCommand(worker_id, *session, absl::Now() + poll_);
      if (command && !stream->Write(*command)) break;
    }
  });
  std::string reason = "stream closed by the worker";
  while (stream->Read(&message)) {
    if (!registry_->IsCurrent(worker_id, *session)) {
      reason = "superseded";
      break;
    }
    registry_->Heartbeat(worker_id, *session);
    if (message.kind_case() == apapo::v1::WorkerMessage::kRegister) {
      reason = "registered twice on one stream";
      break;
    }
    if (message.kind_case() != apapo::v1::WorkerMessage::kHeartbeat &&
        listener_ != nullptr) {
      listener_->OnWorkerMessage(worker_id, message);
    }
  }
  if (context->IsCancelled()) reason = "connection lost";
  registry_->Disconnect(worker_id, *session, reason);
  writer.join();
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::ListWorkers(
    grpc::ServerContext*, const apapo::v1::ListWorkersRequest*,
    apapo::v1::ListWorkersResponse* response) {
  for (auto& w : registry_->List()) *response->add_workers() = std::move(w);
  return grpc::Status::OK;
}

}  // namespace apapo::coordinator
