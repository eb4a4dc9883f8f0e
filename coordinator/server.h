// CoordinatorServer: one gRPC server carrying JobService, the gRPC health
// service (grpc.health.v1) and server reflection, on one port.
//
// Call order: construct, Start(), then Wait() or Shutdown() (once).
// Thread-safety: Shutdown may be called from any thread (e.g. a signal
// watcher) while another thread is in Wait().
#ifndef APAPO_COORDINATOR_SERVER_H_
#define APAPO_COORDINATOR_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace apapo::coordinator {

class CoordinatorServer {
 public:
  // `services` must outlive the server. `health_names` are the fully
  // qualified service names the health service reports SERVING (besides "").
  explicit CoordinatorServer(std::vector<grpc::Service*> services,
                             std::vector<std::string> health_names = {});
  ~CoordinatorServer();

  // Binds `address` ("0.0.0.0:0" picks a free port) and starts serving with
  // `credentials` (insecure when null). Returns the bound port. UNAVAILABLE
  // if the address cannot be bound, including when another server (even
  // another gRPC one) holds the port.
  absl::StatusOr<int> Start(
      const std::string& address,
      std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

  // Blocks until Shutdown().
  void Wait();

  // Marks the health service NOT_SERVING, cancels open streams and stops.
  void Shutdown();

 private:
  std::vector<grpc::Service*> services_;
  std::vector<std::string> health_names_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_SERVER_H_
