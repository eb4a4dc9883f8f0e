#include "worker/daemon/cgroup.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo::worker {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Paths(const std::vector<CgroupFolder>& folders) {
  std::vector<std::string> out;
  for (const CgroupFolder& f : folders) out.push_back(f.path + (f.v2 ? " v2" : " v1"));
  return out;
}

constexpr char kV2Mounts[] =
    "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";

TEST(CgroupTest, AV2CgroupIsReadFromItselfUpToTheMount) {
  EXPECT_THAT(Paths(CgroupFolders(kV2Mounts, "0::/kubepods/pod1/ctr\n", "cpu")),
              ElementsAre("/sys/fs/cgroup/kubepods/pod1/ctr v2", "/sys/fs/cgroup/kubepods/pod1 v2",
                          "/sys/fs/cgroup/kubepods v2", "/sys/fs/cgroup v2"));
  // Inside a cgroup namespace the process's cgroup reads "/".
  EXPECT_THAT(Paths(CgroupFolders(kV2Mounts, "0::/\n", "memory")),
              ElementsAre("/sys/fs/cgroup v2"));
}

TEST(CgroupTest, AV1HierarchyCountsWhereItMountsTheController) {
  // This machine's shape: v1 controllers, and a v2 mount without them.
  const std::string mounts =
      "25 24 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
      "26 25 0:23 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:7 - cgroup cgroup "
      "rw,cpu,cpuacct\n"
      "27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
      "28 25 0:25 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
  const std::string cgroup = "5:memory:/process_api/37\n4:cpu,cpuacct:/job\n0::/\n";
  EXPECT_THAT(Paths(CgroupFolders(mounts, cgroup, "cpu")),
              ElementsAre("/sys/fs/cgroup/cpu,cpuacct/job v1", "/sys/fs/cgroup/cpu,cpuacct v1",
                          "/sys/fs/cgroup/unified v2"));
  EXPECT_THAT(Paths(CgroupFolders(mounts, cgroup, "memory")),
              ElementsAre("/sys/fs/cgroup/memory/process_api/37 v1",
                          "/sys/fs/cgroup/memory/process_api v1", "/sys/fs/cgroup/memory v1",
                          "/sys/fs/cgroup/unified v2"));
  // cpuacct is not cpu.
  EXPECT_THAT(Paths(CgroupFolders(mounts, "4:cpuacct:/job\n", "cpu")), ElementsAre());
}

TEST(CgroupTest, AContainersOwnCgroupMountedAsTheRootStartsThere) {
  // No cgroup namespace: the container's cgroup is mounted at
  // /sys/fs/cgroup, and /proc/self/cgroup names its full path.
  const std::string mounts = "30 24 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  EXPECT_THAT(Paths(CgroupFolders(mounts, "0::/kubepods/pod1/ctr\n", "cpu")),
              ElementsAre("/sys/fs/cgroup/ctr v2", "/sys/fs/cgroup v2"));
  // Not a prefix at a folder boundary, or another namespace's view: the
  // mount point alone.
  EXPECT_THAT(Paths(CgroupFolders(mounts, "0::/kubepods/pod10\n", "cpu")),
              ElementsAre("/sys/fs/cgroup v2"));
  EXPECT_THAT(Paths(CgroupFolders(mounts, "0::/elsewhere\n", "cpu")),
              ElementsAre("/sys/fs/cgroup v2"));
}

TEST(CgroupTest, HostileTextLeadsNowhereElse) {
  EXPECT_THAT(Paths(CgroupFolders(kV2Mounts, "0::/../../etc\n", "cpu")),
              ElementsAre("/sys/fs/cgroup v2"));
  EXPECT_THAT(Paths(CgroupFolders(kV2Mounts, "0::relative\n", "cpu")), ElementsAre());
  EXPECT_THAT(Paths(CgroupFolders("", "", "cpu")), ElementsAre());
  EXPECT_THAT(Paths(CgroupFolders("garbage\n- - -\n1 2 3 - cgroup2\n", "::::\n0::\n", "cpu")),
              ElementsAre());
  EXPECT_THAT(Paths(CgroupFolders("30 24 0:26 / relative rw - cgroup2 cgroup2 rw\n", "0::/a\n",
                                  "cpu")),
              ElementsAre());
}

TEST(CgroupTest, ThisProcessesFoldersCanBeRead) {
  // Wherever this runs, whatever it finds is a readable path or nothing.
  for (const CgroupFolder& f : ThisProcessCgroupFolders("cpu")) {
    EXPECT_EQ(f.path[0], '/') << f.path;
  }
  EXPECT_FALSE(ReadCgroupFile("/nonexistent/cpu.max").has_value());
}

}  // namespace
}  // namespace apapo::worker
