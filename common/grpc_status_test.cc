#include "common/grpc_status.h"

#include "gtest/gtest.h"

namespace apapo {
namespace {

TEST(GrpcStatusTest, CodesAndMessagesRoundTrip) {
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument,
        absl::StatusCode::kFailedPrecondition, absl::StatusCode::kNotFound,
        absl::StatusCode::kResourceExhausted, absl::StatusCode::kUnavailable,
        absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kInternal}) {
    absl::Status in(code, "spec.x: bad");
    grpc::Status g = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(g.error_code()), static_cast<int>(code));
    EXPECT_EQ(g.error_message(), "spec.x: bad");
    EXPECT_EQ(FromGrpcStatus(g), in);
  }
}

TEST(GrpcStatusTest, OkIsOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, CanonicalNumbering) {
  EXPECT_EQ(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED),
            static_cast<int>(absl::StatusCode::kUnauthenticated));
}

}  // namespace
}  // namespace apapo
