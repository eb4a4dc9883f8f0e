#include "coordinator/access.h"

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace apapo::coordinator {
namespace {

// Compares without an early exit, so response time tells nothing about
// how much of a token matched.
bool SameToken(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kRead:
      return "read";
    case Role::kSubmit:
      return "submit";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

absl::StatusOr<AccessPolicy> AccessPolicy::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens_file: cannot read ", path));
  }
  AccessPolicy policy;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokens_file: ", path, ":", number, ": ", why));
    };
    if (fields.size() != 3) return bad("expected \"TOKEN ROLE USER\"");
    Entry entry;
    entry.token = std::string(fields[0]);
    if (entry.token.size() < 16) return bad("a token has at least 16 characters");
    if (fields[1] == "read") {
      entry.caller.role = Role::kRead;
    } else if (fields[1] == "submit") {
      entry.caller.role = Role::kSubmit;
    } else if (fields[1] == "admin") {
      entry.caller.role = Role::kAdmin;
    } else {
      return bad(absl::StrCat("unknown role \"", fields[1],
                              "\" (read, submit or admin)"));
    }
    entry.caller.user = std::string(fields[2]);
    for (const Entry& e : policy.entries_) {
      if (SameToken(e.token, entry.token)) return bad("this token is listed twice");
    }
    policy.entries_.push_back(std::move(entry));
  }
  if (policy.entries_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens_file: ", path, " lists no token"));
  }
  return policy;
}

absl::StatusOr<Caller> AccessPolicy::Authorize(absl::string_view authorization,
                                               Role needed,
                                               absl::string_view what) const {
  if (!enabled()) return Caller{"anonymous", Role::kAdmin};
  absl::string_view token = authorization;
  if (!absl::ConsumePrefix(&token, "Bearer ") || token.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        what, " needs a bearer token (apapoctl --token_file; metadata "
              "\"authorization: Bearer TOKEN\")"));
  }
  const Caller* found = nullptr;
  for (const Entry& e : entries_) {
    if (SameToken(e.token, token)) found = &e.caller;
  }
  if (found == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat(what, ": the bearer token is not known to this coordinator"));
  }
  if (static_cast<int>(found->role) < static_cast<int>(needed)) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " needs the ", RoleName(needed), " role; ", found->user, " has ",
        RoleName(found->role)));
  }
  return *found;
}

}  // namespace apapo::coordinator
