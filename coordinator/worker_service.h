// WorkerService gRPC adapter on gRPC's callback (reactor) API: each worker's
// Connect stream is one reactor object, not a thread. It registers the
// worker in the WorkerRegistry, records heartbeats on its session (one
// atomic store), hands every other message to a WorkerMessageListener
// (profiles, metrics, acknowledgements, stage outcomes), and writes the
// commands queued for the worker as soon as the registry tells it they are
// there (WorkerStream) — nothing polls.
//
// A stream ends when the worker closes it, the connection breaks, the
// registry marks the worker lost (silent too long: the stream is closed
// with UNAVAILABLE), the same id registers on another stream while this one
// is lost, or the server shuts down; the worker is then lost in the
// registry.
//
// Thread-safety: reactions run on gRPC's callback threads; a registry
// notification may arrive from any thread. Each reactor serialises its own
// writes; all shared state is in the registry and the listener, both of
// which must be thread-safe and must not block.
#ifndef APAPO_COORDINATOR_WORKER_SERVICE_H_
#define APAPO_COORDINATOR_WORKER_SERVICE_H_

#include <functional>
#include <string>

#include "coordinator/access.h"
#include "coordinator/worker_listener.h"
#include "coordinator/worker_registry.h"
#include "proto/apapo/v1/service.grpc.pb.h"

namespace apapo::coordinator {

class WorkerServiceImpl final : public apapo::v1::WorkerService::CallbackService {
 public:
  // `registry` (and `listener`, which may be null) must outlive the service.
  WorkerServiceImpl(WorkerRegistry* registry, WorkerMessageListener* listener);

  // Called after every registration with what the worker registered
  // (wakes the scheduler, counts, adopts the stages it still trains). Set
  // before the server starts.
  void SetRegisterHook(std::function<void(const apapo::v1::WorkerInfo&)> hook) {
    on_registered_ = std::move(hook);
  }
  // With TLS: a worker must present a client certificate signed by the
  // cluster CA whose common name is the id it registers
  // (UNAUTHENTICATED without one, PERMISSION_DENIED for another id). Set
  // before the server starts.
  void RequireWorkerCertificates(bool require) { require_certificates_ = require; }
  // ListWorkers needs the read role of `access` (null: no tokens checked).
  // Set before the server starts.
  void SetAccessPolicy(const AccessPolicy* access) { access_ = access; }

  grpc::ServerBidiReactor<apapo::v1::WorkerMessage, apapo::v1::CoordinatorMessage>*
  Connect(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListWorkers(
      grpc::CallbackServerContext* context,
      const apapo::v1::ListWorkersRequest* request,
      apapo::v1::ListWorkersResponse* response) override;

 private:
  class ConnectReactor;

  WorkerRegistry* const registry_;
  WorkerMessageListener* const listener_;
  std::function<void(const apapo::v1::WorkerInfo&)> on_registered_;
  bool require_certificates_ = false;
  const AccessPolicy* access_ = nullptr;
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_WORKER_SERVICE_H_
