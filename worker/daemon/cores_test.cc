#include "worker/daemon/cores.h"

#include <sched.h>

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

}  // namespace
}  // namespace apapo::worker
