#include "bench/fleet/fleet_benchmark.h"

#include <unistd.h>

#include "gtest/gtest.h"

namespace apapo::bench {
namespace {

TEST(ParseProcStatCpuSecondsTest, AddsUtimeAndStimeAfterTheCommandName) {
  // A command name with spaces and parentheses must not shift the fields.
  const char* stat =
      "4242 (apapo (co) ord) S 1 4242 4242 0 -1 4194560 100 0 0 0 "
      "250 50 0 0 20 0 12 0 1000 1000000 500";
  absl::StatusOr<double> s = ParseProcStatCpuSeconds(stat, 100);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ(*s, 3.0);
}

TEST(ParseProcStatCpuSecondsTest, MalformedLinesAreInvalidArgument) {
  EXPECT_EQ(ParseProcStatCpuSeconds("garbage", 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProcStatCpuSeconds("1 (x) S 1 2", 100).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProcessCpuSecondsTest, ReadsThisProcess) {
  absl::StatusOr<double> s = ProcessCpuSeconds(getpid());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GE(*s, 0);
}

TEST(ResultJsonTest, IsOneLineWithTheFiguresAndProblems) {
  BenchResult r;
  r.workers = 10;
  r.problems.push_back("a \"quoted\" problem");
  const std::string json = ResultJson(r);
  EXPECT_EQ(json.find('\n'), std::string::npos);
  EXPECT_NE(json.find("\"workers\":10"), std::string::npos) << json;
  EXPECT_NE(json.find("a \\\"quoted\\\" problem"), std::string::npos) << json;
}

}  // namespace
}  // namespace apapo::bench
