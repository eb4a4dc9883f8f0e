#include "worker/daemon/memory.h"

#include <map>

#include "gtest/gtest.h"

namespace apapo::worker {
namespace {

TEST(MemoryTest, MemAvailableFromMeminfo) {
  EXPECT_EQ(ParseMemAvailable("MemTotal: 100 kB\nMemAvailable:    2048 kB\n"), 2048 * 1024);
  EXPECT_FALSE(ParseMemAvailable("MemTotal: 100 kB\n").has_value());
}

TEST(MemoryTest, TheTightestCgroupLevelBoundsTheHeadroom) {
  // A 4 GiB pod slice holding a 8 GiB-limited container: the slice binds.
  std::map<std::string, std::string> files = {
      {"/kubepods/pod1/memory.max", "4294967296\n"},
      {"/kubepods/pod1/memory.current", "1073741824\n"},
      {"/kubepods/pod1/c1/memory.max", "8589934592\n"},
      {"/kubepods/pod1/c1/memory.current", "536870912\n"},
      {"/kubepods/memory.max", "max\n"},
      {"/memory.max", "max\n"},
  };
  auto read = [&](const std::string& path) -> std::optional<std::string> {
    auto it = files.find(path);
    if (it == files.end()) return std::nullopt;
    return it->second;
  };
  EXPECT_EQ(CgroupHeadroom("0::/kubepods/pod1/c1\n", read), int64_t{3} << 30);
  // No limit anywhere, or cgroup v1: nothing to bound.
  EXPECT_FALSE(CgroupHeadroom("0::/kubepods\n", read).has_value());
  EXPECT_FALSE(CgroupHeadroom("12:memory:/docker/abc\n", read).has_value());
}

TEST(MemoryTest, ThisProcessHasSomeMemory) { EXPECT_GT(AvailableMemoryBytes(), 0); }

}  // namespace
}  // namespace apapo::worker
