#include "coordinator/access.h"

#include <cstdlib>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo::coordinator {
namespace {

using ::testing::HasSubstr;

std::string Write(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

constexpr char kTokens[] =
    "# token role user\n"
    "reader-token-0123456789 read dashboards\n"
    "\n"
    "alice-token-0123456789 submit alice\n"
    "ops-token-012345678901\tadmin\tops\n";

TEST(AccessPolicyTest, TokensGiveUsersTheirRoles) {
  auto policy = AccessPolicy::FromFile(Write("tokens", kTokens));
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_TRUE(policy->enabled());
  auto alice = policy->Authorize("Bearer alice-token-0123456789", Role::kSubmit, "SubmitJob");
  ASSERT_TRUE(alice.ok());
  EXPECT_EQ(alice->user, "alice");
  EXPECT_EQ(alice->role, Role::kSubmit);
  auto reader = policy->Authorize("Bearer reader-token-0123456789", Role::kSubmit, "SubmitJob");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(reader.status().message(),
            "SubmitJob needs the submit role; dashboards has read");
  EXPECT_TRUE(policy->Authorize("Bearer ops-token-012345678901", Role::kAdmin, "x").ok());
}

TEST(AccessPolicyTest, MissingOrUnknownTokensAreUnauthenticated) {
  auto policy = AccessPolicy::FromFile(Write("tokens2", kTokens));
  ASSERT_TRUE(policy.ok());
  auto none = policy->Authorize("", Role::kRead, "ListJobs");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("ListJobs needs a bearer token"));
  auto unknown = policy->Authorize("Bearer alice-token-0123456780", Role::kRead, "ListJobs");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("not known"));
  // The token alone, without the scheme, is not accepted either.
  EXPECT_FALSE(policy->Authorize("alice-token-0123456789", Role::kRead, "x").ok());
}

TEST(AccessPolicyTest, WithoutATokensFileEveryoneIsAnAnonymousAdmin) {
  AccessPolicy open;
  EXPECT_FALSE(open.enabled());
  auto caller = open.Authorize("", Role::kAdmin, "CancelJob");
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->user, "anonymous");
}

TEST(AccessPolicyTest, MalformedFilesAreRefusedNamingTheLine) {
  auto bad = AccessPolicy::FromFile(Write("bad1", "short read a\n"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("bad1:1: a token has at least 16"));
  bad = AccessPolicy::FromFile(Write("bad2", "# c\nalice-token-0123456789 root alice\n"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("bad2:2: unknown role \"root\""));
  bad = AccessPolicy::FromFile(
      Write("bad3", "alice-token-0123456789 read a\nalice-token-0123456789 admin b\n"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("listed twice"));
  bad = AccessPolicy::FromFile(Write("bad4", "# nothing\n"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("lists no token"));
  EXPECT_FALSE(AccessPolicy::FromFile("/nonexistent/tokens").ok());
}

}  // namespace
}  // namespace apapo::coordinator
