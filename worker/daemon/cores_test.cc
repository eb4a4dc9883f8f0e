#include "worker/daemon/cores.h"

#include <sched.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace apapo::worker {
namespace {

TEST(CoresTest, CpuListsAreTheKernelsForm) {
  EXPECT_EQ(FormatCpuList({0, 1, 2, 5}), "0-2,5");
  EXPECT_EQ(FormatCpuList({3}), "3");
  EXPECT_EQ(FormatCpuList({0, 2, 4, 5}), "0,2,4-5");
  EXPECT_EQ(FormatCpuList({}), "");
}

TEST(CoresTest, TheSetNamesTheMachineAndItsCpus) {
  const CoreSet s =
      MakeCoreSet("3f1c2b9e-0d4a-4c1e-9a7b-1234567890ab\n", {1, 0, 1});
  EXPECT_EQ(s.id, "3f1c2b9e-0d4a-4c1e-9a7b-1234567890ab/0-1");
  EXPECT_EQ(s.size, 2);
  // Another machine, or other CPUs: another set.
  EXPECT_NE(MakeCoreSet("aaaa", {0, 1}).id, MakeCoreSet("bbbb", {0, 1}).id);
  EXPECT_NE(MakeCoreSet("aaaa", {0}).id, MakeCoreSet("aaaa", {1}).id);
}

TEST(CoresTest, WhatCannotBeReadIsUnknown) {
  EXPECT_EQ(MakeCoreSet("", {0}).size, 0);
  EXPECT_EQ(MakeCoreSet("aaaa", {}).id, "");
  EXPECT_EQ(MakeCoreSet("a/b", {0}).id, "");  // not a plain token
  EXPECT_EQ(MakeCoreSet(std::string(41, 'a'), {0}).id, "");
}

TEST(CoresTest, AManyCpuMaskStaysShort) {
  std::vector<int> every_other;
  for (int c = 0; c < 1024; c += 2) every_other.push_back(c);
  const CoreSet s = MakeCoreSet("3f1c2b9e-0d4a-4c1e-9a7b-1234567890ab", every_other);
  EXPECT_EQ(s.size, 512);
  EXPECT_LE(s.id.size(), 128u);
}

TEST(CoresTest, ThisProcessHasItsAffinityMask) {
  cpu_set_t mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  const CoreSet s = ThisProcessCores();
  EXPECT_EQ(s.size, CPU_COUNT(&mask));
  EXPECT_NE(s.id.find('/'), std::string::npos) << s.id;
  // Pinned to its first CPU, the process reports that one alone.
  int first = 0;
  while (!CPU_ISSET(first, &mask)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const CoreSet pinned = ThisProcessCores();
  sched_setaffinity(0, sizeof(mask), &mask);
  EXPECT_EQ(pinned.size, 1);
  EXPECT_EQ(pinned.id.substr(pinned.id.find('/')), "/" + std::to_string(first));
  EXPECT_EQ(pinned.id.substr(0, pinned.id.find('/')), s.id.substr(0, s.id.find('/')));
}

// A fake cgroup hierarchy under a temporary folder.
class CpuQuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR")
                                                             : "/tmp") /
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& path, const std::string& text) {
    const std::filesystem::path p = root_ / path.substr(1);
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::filesystem::path root_;
};

constexpr char kV2Mounts[] =
    "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
constexpr char kV1Mounts[] =
    "25 24 0:22 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
    "26 25 0:23 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:7 - cgroup cgroup "
    "rw,cpu,cpuacct\n"
    "27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";

TEST_F(CpuQuotaTest, AContainersLimitIsTheSmallestOnItsPath) {
  // A pod limited to 2.5 CPUs whose container has no limit of its own,
  // under a node-wide slice of 6.
  Write("/sys/fs/cgroup/kubepods/cpu.max", "600000 100000\n");
  Write("/sys/fs/cgroup/kubepods/pod1/cpu.max", "250000 100000\n");
  Write("/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n");
  EXPECT_DOUBLE_EQ(CpuQuotaFrom(kV2Mounts, "0::/kubepods/pod1/ctr\n", root_.string()), 2.5);
  // The node slice alone binds a process directly in it.
  EXPECT_DOUBLE_EQ(CpuQuotaFrom(kV2Mounts, "0::/kubepods\n", root_.string()), 6);
}

TEST_F(CpuQuotaTest, CgroupV1sCpuControllerCounts) {
  Write("/sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us", "50000\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us", "100000\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  Write("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const std::string cgroup = "5:memory:/other\n4:cpu,cpuacct:/job\n0::/\n";
  EXPECT_DOUBLE_EQ(CpuQuotaFrom(kV1Mounts, cgroup, root_.string()), 0.5);
}

TEST_F(CpuQuotaTest, AContainersOwnViewStartsAtItsMount) {
  // Inside a cgroup namespace the mount's root is the container's cgroup
  // and /proc/self/cgroup names it "/"; without one, the mount's root is
  // that cgroup and the process's path runs through it.
  Write("/sys/fs/cgroup/cpu.max", "150000 100000\n");
  EXPECT_DOUBLE_EQ(CpuQuotaFrom(kV2Mounts, "0::/\n", root_.string()), 1.5);
  const std::string mounts =
      "30 24 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  EXPECT_DOUBLE_EQ(CpuQuotaFrom(mounts, "0::/kubepods/pod1\n", root_.string()), 1.5);
  // A path from another namespace's view: only the mount point is read.
  EXPECT_DOUBLE_EQ(CpuQuotaFrom(mounts, "0::/elsewhere\n", root_.string()), 1.5);
}

TEST_F(CpuQuotaTest, NoLimitAndHostileTextReadAsNone) {
  Write("/sys/fs/cgroup/cpu.max", "max 100000\n");
  EXPECT_EQ(CpuQuotaFrom(kV2Mounts, "0::/\n", root_.string()), 0);
  EXPECT_EQ(CpuQuotaFrom("", "", root_.string()), 0);
  EXPECT_EQ(CpuQuotaFrom("garbage\n- - -\n", "::::\n0::\n", root_.string()), 0);
  // A path climbing out of its mount is not followed.
  Write("/etc/cpu.max", "1000 100000\n");
  EXPECT_EQ(CpuQuotaFrom(kV2Mounts, "0::/../../etc\n", root_.string()), 0);
  EXPECT_EQ(ParseCpuMax("50000"), 0);
  EXPECT_EQ(ParseCpuMax("-5 100000"), 0);
  EXPECT_EQ(ParseCpuMax("50000 0"), 0);
  EXPECT_EQ(ParseCpuMax("x 100000"), 0);
  EXPECT_DOUBLE_EQ(ParseCpuMax("50000 100000"), 0.5);
  EXPECT_EQ(ParseCfsQuota("-1", "100000"), 0);
  EXPECT_EQ(ParseCfsQuota("", ""), 0);
  EXPECT_DOUBLE_EQ(ParseCfsQuota("400000\n", "100000\n"), 4);
}

TEST(CoresTest, ThisProcessesQuotaReadsWithoutFailing) {
  const double q = ThisProcessCpuQuota();
  EXPECT_GE(q, 0);
  EXPECT_TRUE(std::isfinite(q));
}

}  // namespace
}  // namespace apapo::worker
