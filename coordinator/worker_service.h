// WorkerService gRPC adapter: holds each worker's Connect stream, feeding
// the WorkerRegistry (registration, liveness) and a WorkerMessageListener
// (profiles, metrics, acknowledgements, stage outcomes), and writing the
// commands queued in the registry back down the stream.
//
// Thread-safety: each Connect call runs on its own gRPC thread plus one
// writer thread for its duration; all shared state is in the registry.
#ifndef APAPO_COORDINATOR_WORKER_SERVICE_H_
#define APAPO_COORDINATOR_WORKER_SERVICE_H_

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "coordinator/worker_listener.h"
#include "coordinator/worker_registry.h"
#include "proto/apapo/v1/service.grpc.pb.h"

namespace apapo::coordinator {

class WorkerServiceImpl final : public apapo::v1::WorkerService::Service {
 public:
  // `registry` (and `listener`, which may be null) must outlive the service.
  // Writers re-check their stream every `poll`.
  WorkerServiceImpl(WorkerRegistry* registry, WorkerMessageListener* listener,
                    absl::Duration poll = absl::Milliseconds(200));

  // Called after every registration (wakes the scheduler, counts).
  void SetRegisterHook(std::function<void(const std::string&)> hook) {
    on_registered_ = std::move(hook);
  }

  grpc::Status Connect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<apapo::v1::CoordinatorMessage,
                               apapo::v1::WorkerMessage>* stream) override;
  grpc::Status ListWorkers(grpc::ServerContext* context,
                           const apapo::v1::ListWorkersRequest* request,
                           apapo::v1::ListWorkersResponse* response) override;

 private:
  WorkerRegistry* const registry_;
  WorkerMessageListener* const listener_;
  const absl::Duration poll_;
  std::function<void(const std::string&)> on_registered_;
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_WORKER_SERVICE_H_
