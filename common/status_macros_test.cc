#include "common/status_macros.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace apapo {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(x, " is odd"));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  APAPO_ASSIGN_OR_RETURN(int half, Half(x));
  APAPO_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::StatusOr<int> QuarterLabelled(int x) {
  APAPO_ASSIGN_OR_RETURN(
      int half, Half(x),
      absl::Status(_.code(), absl::StrCat("first half: ", _.message())));
  return Half(half);
}

absl::Status Check(int x) {
  APAPO_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, AssignsOrReturnsTheError) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().message(), "3 is odd");
  EXPECT_EQ(Quarter(5).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusMacrosTest, ErrorExpressionSeesTheStatus) {
  EXPECT_EQ(QuarterLabelled(3).status().message(), "first half: 3 is odd");
  EXPECT_EQ(QuarterLabelled(6).status().message(), "3 is odd");
}

TEST(StatusMacrosTest, ReturnIfError) {
  EXPECT_TRUE(Check(4).ok());
  EXPECT_EQ(Check(1).message(), "1 is odd");
}

}  // namespace
}  // namespace apapo
