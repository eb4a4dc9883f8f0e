// The one conversion between absl::Status and grpc::Status, used at every
// service boundary (servers) and by every client.
//
// Thread-safety: pure functions.
#ifndef APAPO_COMMON_GRPC_STATUS_H_
#define APAPO_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace apapo {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace apapo

#endif  // APAPO_COMMON_GRPC_STATUS_H_
