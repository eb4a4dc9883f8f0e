#include "worker/daemon/memory.h"

#include <map>

#include "gtest/gtest.h"

namespace apapo::worker {
namespace {

TEST(MemoryTest, MemAvailableFromMeminfo) {
  EXPECT_EQ(ParseMemAvailable("MemTotal: 100 kB\nMemAvailable:    2048 kB\n"), 2048 * 1024);
  EXPECT_FALSE(ParseMemAvailable("MemTotal: 100 kB\n").has_value());
}

CgroupReader Files(std::map<std::string, std::string> files) {
  return [files = std::move(files)](const std::string& path) -> std::optional<std::string> {
    auto it = files.find(path);
    if (it == files.end()) return std::nullopt;
    return it->second;
  };
}

TEST(MemoryTest, TheTightestCgroupLevelBoundsTheHeadroom) {
  // A 4 GiB pod slice holding a 8 GiB-limited container: the slice binds.
  const CgroupReader read = Files({
      {"/sys/fs/cgroup/kubepods/pod1/memory.max", "4294967296\n"},
      {"/sys/fs/cgroup/kubepods/pod1/memory.current", "1610612736\n"},
      {"/sys/fs/cgroup/kubepods/pod1/memory.stat", "anon 1\ninactive_file 536870912\n"},
      {"/sys/fs/cgroup/kubepods/pod1/c1/memory.max", "8589934592\n"},
      {"/sys/fs/cgroup/kubepods/pod1/c1/memory.current", "536870912\n"},
      {"/sys/fs/cgroup/kubepods/memory.max", "max\n"},
      {"/sys/fs/cgroup/memory.max", "max\n"},
  });
  const std::string mounts = "30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(CgroupHeadroom(CgroupFolders(mounts, "0::/kubepods/pod1/c1\n", "memory"), read),
            int64_t{3} << 30);
  // No limit anywhere: nothing to bound.
  EXPECT_FALSE(
      CgroupHeadroom(CgroupFolders(mounts, "0::/kubepods\n", "memory"), read).has_value());
}

// cgroup v1 (this machine's kind): memory.limit_in_bytes, and its
// unlimited value (PAGE_COUNTER_MAX pages) as none.
TEST(MemoryTest, CgroupV1sLimitBoundsTheHeadroom) {
  const CgroupReader read = Files({
      {"/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "2147483648\n"},
      {"/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", "805306368\n"},
      // 256 MiB of it inactive page cache, which the kernel reclaims first.
      {"/sys/fs/cgroup/memory/docker/abc/memory.stat",
       "cache 300000000\ninactive_file 1\ntotal_inactive_file 268435456\n"},
      {"/sys/fs/cgroup/memory/docker/memory.limit_in_bytes", "9223372036854771712\n"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"},
  });
  const std::string mounts =
      "27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
  EXPECT_EQ(CgroupHeadroom(CgroupFolders(mounts, "12:memory:/docker/abc\n", "memory"), read),
            int64_t{3} << 29);
  EXPECT_FALSE(
      CgroupHeadroom(CgroupFolders(mounts, "12:memory:/docker\n", "memory"), read).has_value());
}

TEST(MemoryTest, ThisProcessHasSomeMemory) { EXPECT_GT(AvailableMemoryBytes(), 0); }

}  // namespace
}  // namespace apapo::worker
