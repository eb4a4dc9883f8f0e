// AccessPolicy: who may call the JobService (and ListWorkers), from bearer
// tokens in a file the operator writes, one per line:
//
//   # token                          role    user
//   3f9c0d7e...                      read    dashboards
//   8a1b44c2...                      submit  alice
//   c0ffee00...                      admin   ops
//
// read: get, list, watch, plans, workers. submit: also submit jobs and
// cancel one's own. admin: also cancel anyone's. A request carries its
// token as "authorization: Bearer TOKEN" metadata; apapoctl sends the
// token of --token_file. Without a tokens file every caller is an admin
// named "anonymous" (development on loopback).
//
// Thread-safety: immutable after construction; Authorize is thread-safe.
#ifndef APAPO_COORDINATOR_ACCESS_H_
#define APAPO_COORDINATOR_ACCESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace apapo::coordinator {

enum class Role { kRead = 1, kSubmit = 2, kAdmin = 3 };

struct Caller {
  std::string user;
  Role role = Role::kRead;
};

class AccessPolicy {
 public:
  // Everyone is "anonymous" with the admin role.
  AccessPolicy() = default;

  // Reads a tokens file (format above). INVALID_ARGUMENT naming the file
  // and line for a malformed line, an unknown role, a token shorter than 16
  // characters or a token listed twice.
  static absl::StatusOr<AccessPolicy> FromFile(const std::string& path);

  bool enabled() const { return !entries_.empty(); }

  // The caller that `authorization` (the metadata value, or empty) names,
  // if it has at least `needed`. UNAUTHENTICATED without a known token,
  // PERMISSION_DENIED when the role is too low; `what` names the action.
  absl::StatusOr<Caller> Authorize(absl::string_view authorization, Role needed,
                                   absl::string_view what) const;

 private:
  struct Entry {
    std::string token;
    Caller caller;
  };
  std::vector<Entry> entries_;
};

const char* RoleName(Role role);

}  // namespace apapo::coordinator

#endif  // APAPO_COORDINATOR_ACCESS_H_
