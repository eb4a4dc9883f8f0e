#include "planning/network_levels.h"

#include <cmath>
#include <limits>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace apapo::planning {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

apapo::v1::LinkMeasurement Link(const std::string& a, const std::string& b,
                                double gb_per_s, double latency_us = 50) {
  apapo::v1::LinkMeasurement l;
  l.set_from_worker(a);
  l.set_to_worker(b);
  l.set_bandwidth_bytes_per_second(gb_per_s * 1e9);
  l.set_latency_seconds(latency_us * 1e-6);
  return l;
}

// Every pair of `workers`, fast when `same(a, b)`, slow otherwise.
std::vector<apapo::v1::LinkMeasurement> Mesh(
    const std::vector<std::string>& workers,
    const std::function<bool(int, int)>& same, double fast, double slow) {
  std::vector<apapo::v1::LinkMeasurement> links;
  for (size_t a = 0; a < workers.size(); ++a) {
    for (size_t b = a + 1; b < workers.size(); ++b) {
      links.push_back(Link(workers[a], workers[b], same(a, b) ? fast : slow,
                           same(a, b) ? 20 : 200));
    }
  }
  return links;
}

TEST(NetworkLevelsTest, TwoHostsOfTwoWorkersMakeTwoLevels) {
  // w-1, w-3 on one host; w-2, w-4 on the other (registration interleaved).
  std::vector<std::string> w = {"w-1", "w-2", "w-3", "w-4"};
  auto levels = InferNetworkLevels(
      w, Mesh(w, [](int a, int b) { return a % 2 == b % 2; }, 1.2, 0.118));
  EXPECT_THAT(levels.order, ElementsAre(0, 2, 1, 3));
  ASSERT_EQ(levels.levels.size(), 2u);
  EXPECT_EQ(levels.levels[0].group_size(), 2);
  EXPECT_DOUBLE_EQ(levels.levels[0].bandwidth_bytes_per_second(), 1.2e9);
  EXPECT_DOUBLE_EQ(levels.levels[0].latency_seconds(), 20e-6);
  EXPECT_EQ(levels.levels[1].group_size(), 2);
  EXPECT_DOUBLE_EQ(levels.levels[1].bandwidth_bytes_per_second(), 0.118e9);
  EXPECT_DOUBLE_EQ(levels.levels[1].latency_seconds(), 200e-6);
  EXPECT_EQ(levels.description, "2 groups of 2: 1.20 GB/s inside, 0.12 GB/s between");
}

TEST(NetworkLevelsTest, AHostsOwnFastLoopbackDoesNotHideTheHostsGap) {
  // Measured in the cluster lab (GB/s): w-1, w-3 on one host reached each
  // other at 4.91, w-2, w-4 on the other at 0.53, the hosts 0.09-0.12 apart.
  // The largest ratio (9.3x, 0.53 -> 4.91) splits off w-1 + w-3 alone, which
  // leaves uneven groups; the next (4.2x) is the hosts' gap.
  std::vector<std::string> w = {"w-1", "w-2", "w-3", "w-4"};
  auto levels = InferNetworkLevels(
      w, {Link("w-1", "w-4", 0.0992), Link("w-2", "w-3", 0.1018),
          Link("w-3", "w-4", 0.1236), Link("w-1", "w-2", 0.1248),
          Link("w-2", "w-4", 0.5281), Link("w-1", "w-3", 4.91)});
  EXPECT_THAT(levels.order, ElementsAre(0, 2, 1, 3));
  ASSERT_EQ(levels.levels.size(), 2u) << levels.description;
  EXPECT_EQ(levels.levels[0].group_size(), 2);
  EXPECT_DOUBLE_EQ(levels.levels[0].bandwidth_bytes_per_second(), 0.5281e9);
  EXPECT_DOUBLE_EQ(levels.levels[1].bandwidth_bytes_per_second(), 0.0992e9);
}

TEST(NetworkLevelsTest, PeaksGroupTheWorkersWhenLoadHidesTheGapInTheMedians) {
  // Four workers on two busy cores measured their pairs at once: the
  // medians inside the hosts (w-1 + w-3, w-2 + w-4) read 0.19-0.2 GB/s,
  // under twice the 0.11-0.12 between them, but each pair's fastest round
  // trip still shows loopback's speed. Grouped by the peaks; charged the
  // medians.
  std::vector<std::string> w = {"w-1", "w-2", "w-3", "w-4"};
  const auto link = [](const std::string& a, const std::string& b, double median,
                       double peak) {
    apapo::v1::LinkMeasurement l = Link(a, b, median);
    l.set_peak_bandwidth_bytes_per_second(peak * 1e9);
    return l;
  };
  std::vector<apapo::v1::LinkMeasurement> links = {
      link("w-1", "w-2", 0.11, 0.125), link("w-1", "w-3", 0.19, 1.9),
      link("w-1", "w-4", 0.12, 0.126), link("w-2", "w-3", 0.115, 0.124),
      link("w-2", "w-4", 0.2, 2.4),    link("w-3", "w-4", 0.12, 0.127)};
  auto levels = InferNetworkLevels(w, links);
  EXPECT_THAT(levels.order, ElementsAre(0, 2, 1, 3));
  ASSERT_EQ(levels.levels.size(), 2u) << levels.description;
  EXPECT_EQ(levels.levels[0].group_size(), 2);
  EXPECT_DOUBLE_EQ(levels.levels[0].bandwidth_bytes_per_second(), 0.19e9);
  EXPECT_DOUBLE_EQ(levels.levels[1].bandwidth_bytes_per_second(), 0.11e9);

  // The same medians without every pair's peak (a worker that does not
  // report one, or a figure that is not finite) are grouped as before: no
  // gap of 2x, one level.
  links[3].set_peak_bandwidth_bytes_per_second(0);
  EXPECT_EQ(InferNetworkLevels(w, links).levels.size(), 1u);
  links[3].set_peak_bandwidth_bytes_per_second(std::numeric_limits<double>::infinity());
  EXPECT_EQ(InferNetworkLevels(w, links).levels.size(), 1u);
}

TEST(NetworkLevelsTest, GapsThatNeverMakeEvenGroupsStayFlat) {
  // Two gaps (a-b far above the rest, c-d above the slowest), neither of
  // which cuts the four workers into groups of one size.
  std::vector<std::string> w = {"a", "b", "c", "d"};
  auto levels = InferNetworkLevels(
      w, {Link("a", "b", 8.0), Link("a", "c", 1.0), Link("b", "c", 1.0),
          Link("c", "d", 0.3), Link("a", "d", 0.1), Link("b", "d", 0.1)});
  ASSERT_EQ(levels.levels.size(), 1u) << levels.description;
  EXPECT_DOUBLE_EQ(levels.levels[0].bandwidth_bytes_per_second(), 0.1e9);
}

TEST(NetworkLevelsTest, NoGapMeansOneFlatLevelAtTheSlowestLink) {
  std::vector<std::string> w = {"a", "b", "c"};
  auto levels = InferNetworkLevels(
      w, {Link("a", "b", 1.0), Link("b", "c", 0.8), Link("a", "c", 0.6)});
  EXPECT_THAT(levels.order, ElementsAre(0, 1, 2));
  ASSERT_EQ(levels.levels.size(), 1u);
  EXPECT_EQ(levels.levels[0].group_size(), 3);
  EXPECT_DOUBLE_EQ(levels.levels[0].bandwidth_bytes_per_second(), 0.6e9);
  EXPECT_EQ(levels.description, "one level: slowest link 0.60 GB/s");
}

TEST(NetworkLevelsTest, UnevenGroupsStayFlat) {
  // 3 workers on one host, 1 on another: the DP's levels need equal groups.
  std::vector<std::string> w = {"a", "b", "c", "d"};
  auto levels = InferNetworkLevels(
      w, Mesh(w, [](int a, int b) { return a < 3 && b < 3; }, 2.0, 0.1));
  ASSERT_EQ(levels.levels.size(), 1u);
  EXPECT_DOUBLE_EQ(levels.levels[0].bandwidth_bytes_per_second(), 0.1e9);
}

TEST(NetworkLevelsTest, ASlowDirectionCountsAndStrangersAreIgnored) {
  std::vector<std::string> w = {"a", "b"};
  auto levels = InferNetworkLevels(
      w, {Link("a", "b", 1.0), Link("b", "a", 0.25), Link("a", "zz", 0.001),
          Link("a", "a", 0.001)});
  ASSERT_EQ(levels.levels.size(), 1u);
  EXPECT_DOUBLE_EQ(levels.levels[0].bandwidth_bytes_per_second(), 0.25e9);
}

TEST(NetworkLevelsTest, ALevelsTokenBucketIsTheSmallestOfItsPairs) {
  // Two hosts of two workers, the hosts joined by shaped links whose
  // buckets the link test measured at 90-110 KB (each direction its own);
  // inside a host, none. A level gets the smallest burst of its pairs.
  std::vector<std::string> w = {"w-1", "w-2", "w-3", "w-4"};
  auto links = Mesh(w, [](int a, int b) { return a % 2 == b % 2; }, 1.2, 0.0122);
  double burst = 90e3;
  for (auto& l : links) {
    if (l.bandwidth_bytes_per_second() < 1e9) l.set_burst_bytes(burst += 5e3);
  }
  auto back = Link("w-2", "w-1", 0.0122);  // the other direction: less
  back.set_burst_bytes(91e3);
  links.push_back(back);
  auto levels = InferNetworkLevels(w, links);
  ASSERT_EQ(levels.levels.size(), 2u);
  EXPECT_DOUBLE_EQ(levels.levels[0].burst_bytes(), 0);
  EXPECT_DOUBLE_EQ(levels.levels[1].burst_bytes(), 91e3);
  // One level: the smallest over every pair, a wire's 0 included.
  std::vector<std::string> two = {"w-1", "w-2"};
  auto flat = InferNetworkLevels(two, {links.back()});
  ASSERT_EQ(flat.levels.size(), 1u);
  EXPECT_DOUBLE_EQ(flat.levels[0].burst_bytes(), 91e3);
  auto mixed = InferNetworkLevels({"a", "b", "c"},
                                  {Link("a", "b", 0.1), Link("b", "c", 0.1),
                                   Link("a", "c", 0.1)});
  ASSERT_EQ(mixed.levels.size(), 1u);
  EXPECT_DOUBLE_EQ(mixed.levels[0].burst_bytes(), 0);
  // A worker's figure that is not finite counts as no bucket.
  for (double bad : {std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN(), -5.0}) {
    auto l = Link("w-1", "w-2", 0.0122);
    l.set_burst_bytes(bad);
    auto levels_bad = InferNetworkLevels(two, {l});
    ASSERT_EQ(levels_bad.levels.size(), 1u);
    EXPECT_EQ(levels_bad.levels[0].burst_bytes(), 0) << bad;
  }
}

TEST(NetworkLevelsTest, NothingMeasuredLeavesTheBandwidthToTheCaller) {
  auto levels = InferNetworkLevels({"solo"}, {});
  EXPECT_THAT(levels.order, ElementsAre(0));
  EXPECT_TRUE(levels.levels.empty());
}

TEST(NetworkLevelsTest, EightWorkersInFourRacks) {
  std::vector<std::string> w;
  for (int i = 0; i < 8; ++i) w.push_back("w" + std::to_string(i));
  auto levels = InferNetworkLevels(
      w, Mesh(w, [](int a, int b) { return a / 2 == b / 2; }, 1.1, 0.11));
  ASSERT_EQ(levels.levels.size(), 2u);
  EXPECT_EQ(levels.levels[0].group_size(), 2);
  EXPECT_EQ(levels.levels[1].group_size(), 4);
  EXPECT_THAT(levels.order, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
}

// The all-reduce's CPU per byte each rank moves each way, of the largest
// all-reduce timed with its CPU: 4 MB over 2 ranks moves 4 MB each way.
TEST(NetworkLevelsTest, TheAllReduceCpuPerByteIsTheLargestMeasuredOverTheBytesMoved) {
  apapo::v1::ClusterSpec spec;
  EXPECT_EQ(AllReduceCpuSecondsPerByte(spec), 0);  // nothing timed
  const auto add = [&](int ranks, int64_t bytes, double cpu) {
    auto* a = spec.add_allreduces();
    a->set_ranks(ranks);
    a->set_bytes(bytes);
    a->set_seconds(0.05);
    a->set_cpu_seconds(cpu);
  };
  add(2, 1000000, 0.9);  // smaller: not the figure
  add(2, 4000000, 0.004);
  add(2, 4000000, 0.012);
  add(2, 4000000, 0.008);  // median 8 ms of 4 MB: 2 ns per byte
  EXPECT_DOUBLE_EQ(AllReduceCpuSecondsPerByte(spec), 2e-9);
  // 4 ranks move 3/4 x 2 = 1.5 x their bytes each way; a larger one
  // without a CPU time, or with one that is not a number, is skipped.
  spec.clear_allreduces();
  add(4, 4000000, 0.012);
  add(2, 64000000, 0);
  add(2, 64000000, std::nan(""));
  add(1, 64000000, 5);
  EXPECT_DOUBLE_EQ(AllReduceCpuSecondsPerByte(spec), 2e-9);
  // The compute lost beside one, where measured, is the figure (the others
  // have none): 0.9 s of the 64 MB; without it, 24 ms of the 4 MB over 4
  // ranks, 6 MB moved each way.
  spec.mutable_allreduces(0)->set_compute_lost_seconds(0.024);
  spec.mutable_allreduces(1)->set_compute_lost_seconds(0.9);  // 64 MB, CPU 0
  EXPECT_DOUBLE_EQ(AllReduceCpuSecondsPerByte(spec), 0.9 / 64e6);
  spec.mutable_allreduces(1)->set_compute_lost_seconds(0);
  EXPECT_DOUBLE_EQ(AllReduceCpuSecondsPerByte(spec), 4e-9);
}

// The window factor: an all-reduce of 40 ms alone that took 50 ms beside
// the compute loop, which lost 10 ms to it, ran at r = 0.8 of its pace
// while the compute ran at 1 - q = 0.8: a window hides (0.8 - 0.2) / 0.8
// = 0.75 of its seconds. The median over the workers' figures; those
// without a time beside, or with one that is not a number, are skipped.
TEST(NetworkLevelsTest, TheAllReduceWindowFactorIsItsPaceBesideTheComputeNetOfTheLoss) {
  apapo::v1::ClusterSpec spec;
  EXPECT_EQ(AllReduceWindowFactor(spec), 1);  // nothing timed: as alone
  const auto add = [&](double seconds, double beside, double lost) {
    auto* a = spec.add_allreduces();
    a->set_ranks(2);
    a->set_bytes(4 << 20);
    a->set_seconds(seconds);
    a->set_seconds_beside_compute(beside);
    a->set_compute_lost_seconds(lost);
  };
  add(0.04, 0.05, 0.01);
  EXPECT_DOUBLE_EQ(AllReduceWindowFactor(spec), 0.75);
  add(0.04, 0, 0.01);                    // not measured
  add(0.04, std::nan(""), 0.01);         // not a number
  add(0.04, 0.05, -1);                   // a negative loss
  add(std::numeric_limits<double>::infinity(), 0.05, 0.01);
  EXPECT_DOUBLE_EQ(AllReduceWindowFactor(spec), 0.75);
  // Faster beside than alone (noise) counts as its pace alone: the window
  // hides all it lasts; an all-reduce that made no headway hides nothing.
  add(0.06, 0.05, 0.01);
  add(0.06, 0.05, 0.01);
  EXPECT_DOUBLE_EQ(AllReduceWindowFactor(spec), 1);
  spec.clear_allreduces();
  add(0.001, 1.0, 0.5);
  EXPECT_DOUBLE_EQ(AllReduceWindowFactor(spec), 0);
  // SetMeasuredCosts hands it to the planner's cluster.
  spec.clear_allreduces();
  add(0.04, 0.05, 0.01);
  partitioner::Cluster cluster;
  SetMeasuredCosts(spec, &cluster);
  EXPECT_DOUBLE_EQ(cluster.allreduce_window_factor, 0.75);
}

TEST(NetworkLevelsTest, TheAllReduceFactorIsTheMeasuredOverTheRingModel) {
  apapo::v1::ClusterSpec spec;
  *spec.add_links() = Link("a", "b", 2.0);
  *spec.add_links() = Link("b", "a", 1.0);  // the slowest link: 1 GB/s
  // Nothing timed: as modelled.
  EXPECT_THAT(AllReduceFactors(spec, 0), IsEmpty());
  // 4 MB over 2 ranks moves 4 MB each way: 4 ms at 1 GB/s, 8 ms where
  // copying costs 1 ns per byte sent or received. The median of 12, 16 and
  // 400 ms (one disturbed) is 16 ms.
  for (double seconds : {0.012, 0.4, 0.016}) {
    auto* a = spec.add_allreduces();
    a->set_ranks(2);
    a->set_bytes(4000000);
    a->set_seconds(seconds);
  }
  EXPECT_THAT(AllReduceFactors(spec, 0), ElementsAre(Pair(4e6, 4.0)));
  EXPECT_THAT(AllReduceFactors(spec, 1e-9), ElementsAre(Pair(4e6, 2.0)));
  // A larger all-reduce (64 MB: 64 ms modelled) gets its own point, in
  // ascending bytes, whatever order the workers reported in.
  for (double seconds : {0.128, 0.192, 0.16}) {
    auto* a = spec.add_allreduces();
    a->set_ranks(2);
    a->set_bytes(64000000);
    a->set_seconds(seconds);
  }
  std::swap(*spec.mutable_allreduces(0), *spec.mutable_allreduces(5));
  EXPECT_THAT(AllReduceFactors(spec, 0),
              ElementsAre(Pair(4e6, 4.0), Pair(64e6, 2.5)));
  // Timed after the compute too (as a replica's follows its backward):
  // that time is charged, 24 ms where back to back read 16; a figure
  // that is not a positive finite time falls back to `seconds`.
  for (int i = 0; i < spec.allreduces_size(); ++i) {
    auto* a = spec.mutable_allreduces(i);
    if (a->bytes() == 4000000) a->set_seconds_after_compute(1.5 * a->seconds());
    if (a->bytes() == 64000000) a->set_seconds_after_compute(std::nan(""));
  }
  EXPECT_THAT(AllReduceFactors(spec, 0),
              ElementsAre(Pair(4e6, 6.0), Pair(64e6, 2.5)));
  // Kept within [0.25, 20]; unusable figures are skipped.
  spec.clear_allreduces();
  auto* slow = spec.add_allreduces();
  slow->set_ranks(2);
  slow->set_bytes(4000000);
  slow->set_seconds(100);
  auto* broken = spec.add_allreduces();
  broken->set_ranks(1);
  broken->set_bytes(4000000);
  broken->set_seconds(1e-9);
  auto* nan = spec.add_allreduces();
  nan->set_ranks(2);
  nan->set_bytes(64000000);
  nan->set_seconds(std::nan(""));
  EXPECT_THAT(AllReduceFactors(spec, 0), ElementsAre(Pair(4e6, 20.0)));
  spec.clear_links();
  EXPECT_THAT(AllReduceFactors(spec, 0), IsEmpty());
}

// An all-reduce timed among the workers of one host (named) sets the
// factor of the level they span, over the ring at their own link; the
// one over every worker sets the general factor alone.
TEST(NetworkLevelsTest, AnAllReduceInsideAHostSetsItsLevelsFactor) {
  apapo::v1::ClusterSpec spec;
  for (int i = 1; i <= 4; ++i) spec.add_workers()->set_worker_id("w-" + std::to_string(i));
  for (double gb : {1.0, 0.01}) {
    auto* level = spec.add_levels();
    level->set_group_size(2);
    level->set_bandwidth_bytes_per_second(gb * 1e9);
  }
  for (int a = 1; a <= 4; ++a) {
    for (int b = 1; b <= 4; ++b) {
      if (a != b) {
        *spec.add_links() = Link("w-" + std::to_string(a), "w-" + std::to_string(b),
                                 (a - 1) / 2 == (b - 1) / 2 ? 1.0 : 0.01);
      }
    }
  }
  // 4 MB over 4 ranks at 10 MB/s: 600 ms as the ring has it; timed 1.2 s.
  auto* all = spec.add_allreduces();
  all->set_ranks(4);
  all->set_bytes(4000000);
  all->set_seconds(1.2);
  // w-1 and w-2 over their 1 GB/s link: 4 ms as the ring has it; timed 12.
  const auto named = [&](std::vector<std::string> ids, double seconds) {
    auto* a = spec.add_allreduces();
    a->set_ranks(static_cast<int>(ids.size()));
    a->set_bytes(4000000);
    a->set_seconds(seconds);
    for (const auto& id : ids) a->add_worker_ids(id);
  };
  named({"w-1", "w-2"}, 0.012);
  named({"w-2", "w-1"}, 0.012);
  EXPECT_THAT(AllReduceFactors(spec, 0), ElementsAre(Pair(4e6, 2.0)));
  EXPECT_THAT(AllReduceFactorsByLevel(spec, 0),
              ElementsAre(ElementsAre(Pair(4e6, 3.0)), IsEmpty()));
  // Named over workers the cluster does not hold, or across the hosts
  // (the outermost level, the four-worker one's): not counted.
  named({"w-1", "w-9"}, 1.0);
  named({"w-1", "w-3"}, 1.0);
  EXPECT_THAT(AllReduceFactorsByLevel(spec, 0),
              ElementsAre(ElementsAre(Pair(4e6, 3.0)), IsEmpty()));
  // Naming every worker is the four-worker measurement.
  named({"w-4", "w-3", "w-2", "w-1"}, 1.2);
  EXPECT_THAT(AllReduceFactors(spec, 0), ElementsAre(Pair(4e6, 2.0)));
  // The planner's cluster reads each level's.
  partitioner::Cluster cluster;
  cluster.levels = ClusterLevels(spec);
  SetMeasuredCosts(spec, &cluster);
  EXPECT_DOUBLE_EQ(cluster.AllReduceFactor(4e6, 0), 3.0);
  EXPECT_DOUBLE_EQ(cluster.AllReduceFactor(4e6, 1), 2.0);
  // Nothing named: no level's own.
  spec.clear_allreduces();
  EXPECT_THAT(AllReduceFactorsByLevel(spec, 0), IsEmpty());
}

// Each worker's figures over its own figure at its smallest size (the link
// test's), the median per size: a worker twice as dear everywhere scales
// alike, and one disturbed figure does not move the median.
TEST(NetworkLevelsTest, TheTransferCpuScaleIsEachWorkersRatioToItsReference) {
  apapo::v1::ClusterSpec spec;
  const auto add = [&](const std::string& w, int64_t bytes, double cpu) {
    auto* t = spec.add_transfer_cpu();
    t->set_worker_id(w);
    t->set_message_bytes(bytes);
    t->set_cpu_seconds_per_byte(cpu);
  };
  EXPECT_TRUE(TransferCpuScale(spec).empty());  // nothing timed
  add("a", 4 << 20, 0.2e-9);
  add("a", 19 << 20, 0.8e-9);
  add("b", 4 << 20, 0.4e-9);
  add("b", 19 << 20, 1.2e-9);
  add("c", 4 << 20, 0.2e-9);
  add("c", 19 << 20, 9e-9);  // disturbed
  auto scale = TransferCpuScale(spec);
  ASSERT_EQ(scale.size(), 2u);
  EXPECT_EQ(scale[0].first, 4 << 20);
  EXPECT_DOUBLE_EQ(scale[0].second, 1.0);
  EXPECT_EQ(scale[1].first, 19 << 20);
  EXPECT_DOUBLE_EQ(scale[1].second, 4.0);  // median of 4, 3 and 45
  // A worker with one size has no ratio; hostile figures are left out; a
  // ratio is kept within [1, 20] (a large message is not cheaper).
  spec.clear_transfer_cpu();
  add("a", 4 << 20, 0.4e-9);
  add("a", 8 << 20, 0.2e-9);
  add("a", 64 << 20, 1.0);  // a second per byte: not a measurement
  add("a", -5, 1e-9);
  add("a", 32 << 20, std::nan(""));
  add("b", 19 << 20, 1e-9);
  scale = TransferCpuScale(spec);
  ASSERT_EQ(scale.size(), 2u);
  EXPECT_DOUBLE_EQ(scale[1].second, 1.0);
  spec.clear_transfer_cpu();
  add("a", 4 << 20, 0.4e-9);
  add("a", 64 << 20, 0.4e-6);
  scale = TransferCpuScale(spec);
  ASSERT_EQ(scale.size(), 2u);
  EXPECT_DOUBLE_EQ(scale[1].second, 20.0);
}

}  // namespace
}  // namespace apapo::planning
