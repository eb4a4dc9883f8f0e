// The one place a gRPC call's bearer token is read and checked against an
// AccessPolicy, for the JobService and the WorkerService adapters alike.
//
// Thread-safety: a pure function of the call's metadata.
#ifndef APAPO_COORDINATOR_CALL_ACCESS_H_
#define APAPO_COORDINATOR_CALL_ACCESS_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/access.h"
#include "grpcpp/server_context.h"

namespace apapo::coordinator {

// The caller of `context` per its "authorization" metadata, if `policy`
// lets it do `what` with at least `role`.
inline absl::StatusOr<Caller> AuthorizeCall(const AccessPolicy& policy,
                                            const grpc::ServerContextBase& context,
                                            Role role, absl::string_view what) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  absl::string_view value;
  if (it != metadata.end()) value = absl::string_view(it->second.data(), it->second.size());
  return policy.Authorize(value, role, what);
}

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_CALL_ACCESS_H_
