#include "worker/daemon/cores.h"

#include <sched.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

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

// Cgroup files as a map: path -> text.
CgroupReader Files(std::map<std::string, std::string> files) {
  return [files = std::move(files)](const std::string& path) -> std::optional<std::string> {
    auto it = files.find(path);
    if (it == files.end()) return std::nullopt;
    return it->second;
  };
}

std::vector<CgroupFolder> V2(std::vector<std::string> paths) {
  std::vector<CgroupFolder> folders;
  for (std::string& p : paths) folders.push_back({std::move(p), true});
  return folders;
}

TEST(CpuQuotaTest, AContainersLimitIsTheSmallestOnItsPath) {
  // A pod limited to 2.5 CPUs whose container has no limit of its own,
  // under a node-wide slice of 6.
  const CgroupReader read = Files({
      {"/sys/fs/cgroup/kubepods/cpu.max", "600000 100000\n"},
      {"/sys/fs/cgroup/kubepods/pod1/cpu.max", "250000 100000\n"},
      {"/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n"},
  });
  EXPECT_DOUBLE_EQ(CpuQuota(V2({"/sys/fs/cgroup/kubepods/pod1/ctr",
                                "/sys/fs/cgroup/kubepods/pod1", "/sys/fs/cgroup/kubepods",
                                "/sys/fs/cgroup"}),
                            read),
                   2.5);
  // The node slice alone binds a process directly in it.
  EXPECT_DOUBLE_EQ(CpuQuota(V2({"/sys/fs/cgroup/kubepods", "/sys/fs/cgroup"}), read), 6);
}

TEST(CpuQuotaTest, CgroupV1sCpuControllerCounts) {
  const CgroupReader read = Files({
      {"/sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us", "50000\n"},
      {"/sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us", "100000\n"},
      {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n"},
      {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"},
  });
  EXPECT_DOUBLE_EQ(CpuQuota({{"/sys/fs/cgroup/cpu,cpuacct/job", false},
                             {"/sys/fs/cgroup/cpu,cpuacct", false}},
                            read),
                   0.5);
}

TEST(CpuQuotaTest, NoLimitAndHostileTextReadAsNone) {
  EXPECT_EQ(CpuQuota(V2({"/sys/fs/cgroup"}), Files({{"/sys/fs/cgroup/cpu.max", "max 100000"}})),
            0);
  EXPECT_EQ(CpuQuota(V2({"/sys/fs/cgroup"}), Files({})), 0);
  EXPECT_EQ(CpuQuota({}, Files({})), 0);
  EXPECT_EQ(ParseCpuMax("50000"), 0);
  EXPECT_EQ(ParseCpuMax("-5 100000"), 0);
  EXPECT_EQ(ParseCpuMax("50000 0"), 0);
  EXPECT_EQ(ParseCpuMax("x 100000"), 0);
  EXPECT_EQ(ParseCpuMax("50000 100000 7"), 0);
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
