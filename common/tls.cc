#include "common/tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"

namespace apapo {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is not a PEM file"));
  }
  return text.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  if (files.cert.empty() || files.key.empty() || files.ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert, --tls_key and --tls_ca go together (deploy/pki.sh makes "
        "them)");
  }
  absl::StatusOr<std::string> ca = ReadPem(files.ca, "--tls_ca");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert = ReadPem(files.cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(files.key, "--tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = *ca;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  if (files.ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls_ca is needed to verify the coordinator (deploy/pki.sh makes it)");
  }
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  grpc::SslCredentialsOptions options;
  absl::StatusOr<std::string> ca = ReadPem(files.ca, "--tls_ca");
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *ca;
  if (!files.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(files.cert, "--tls_cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(files.key, "--tls_key");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  return grpc::SslCredentials(options);
}

std::string VerifiedPeerName(const grpc::AuthContext& context) {
  if (!context.IsPeerAuthenticated()) return "";
  std::vector<grpc::string_ref> names =
      context.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  if (names.empty()) return "";
  return std::string(names.front().data(), names.front().size());
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" ||
         absl::StartsWith(host, "127.");
}

}  // namespace apapo
