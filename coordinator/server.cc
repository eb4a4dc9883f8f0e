#include "coordinator/server.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace apapo::coordinator {

CoordinatorServer::CoordinatorServer(std::vector<grpc::Service*> services,
                                     std::vector<std::string> health_names)
    : services_(std::move(services)), health_names_(std::move(health_names)) {}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

absl::StatusOr<int> CoordinatorServer::Start(
    const std::string& address,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  if (credentials == nullptr) credentials = grpc::InsecureServerCredentials();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, credentials, &port);
  // gRPC sets SO_REUSEPORT by default on Linux: a second coordinator on a
  // taken port would then bind it too and share its connections. Refuse.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Bandwidth-delay probing pings a connection as data arrives, to grow its
  // flow-control window for bulk transfers; a control plane's messages are
  // small, and a fleet's heartbeats would each cost a ping round trip.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // Workers' keepalive pings (common/limits.h) are welcome, streams or not;
  // by default gRPC answers pings more frequent than 5 min with GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kKeepaliveTimeMs / 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // ... and it pings them too, so a connection whose worker vanished
  // without a FIN is closed.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kServerKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  for (grpc::Service* service : services_) builder.RegisterService(service);
  // The one limit servers and clients agree on (common/limits.h).
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address,
                     " (address in use or not valid)"));
  }
  for (const std::string& name : health_names_) {
    server_->GetHealthCheckService()->SetServingStatus(name, true);
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  return port;
}

void CoordinatorServer::Wait() {
  if (server_) server_->Wait();
}

void CoordinatorServer::Shutdown() {
  if (!server_) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace apapo::coordinator
