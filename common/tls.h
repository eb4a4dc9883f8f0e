// TLS for the control plane: credentials built from PEM files (made by
// deploy/pki.sh), and the identity a verified client certificate gives.
//
// The coordinator serves TLS with its certificate and asks every client for
// a certificate signed by the cluster CA, without requiring one: worker
// daemons present theirs (the WorkerService then accepts a registration
// only under the certificate's common name), apapoctl and other JobService
// clients need only verify the server against the CA.
//
// Thread-safety: pure functions (they read files).
#ifndef APAPO_COMMON_TLS_H_
#define APAPO_COMMON_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace apapo {

// Paths of PEM files; empty = not given. `flag_prefix` names them in
// errors ("--tls_ca: cannot read /x: No such file or directory").
struct TlsFiles {
  std::string ca;    // the cluster CA's certificate
  std::string cert;  // this process's certificate
  std::string key;   // its private key
  bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

// Server credentials: TLS with cert + key (both required), client
// certificates requested and verified against `ca` (required). Insecure
// credentials when nothing is given.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);

// Client credentials: verify the server against `ca`; present cert + key
// when given (both or neither). Insecure when nothing is given.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files);

// The common name of the caller's verified client certificate; empty when
// the caller presented none (or the connection is not TLS).
std::string VerifiedPeerName(const grpc::AuthContext& context);

// Whether `host` (an address to listen on) is reachable only from this
// machine: 127.0.0.0/8, ::1 or localhost.
bool IsLoopback(const std::string& host);

}  // namespace apapo

#endif  // APAPO_COMMON_TLS_H_
