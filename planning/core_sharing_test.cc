#include "planning/core_sharing.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planning/chain_profile_testing.h"
#include "planning/partitioner_planner.h"

namespace apapo::planning {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(CoreSharingTest, AShareIsTheCoresOverTheBusyThreads) {
  EXPECT_DOUBLE_EQ(ShareOfCores(2, 1, 4), 0.5);
  EXPECT_DOUBLE_EQ(ShareOfCores(2, 1, 3), 2.0 / 3);
  EXPECT_DOUBLE_EQ(ShareOfCores(2, 1, 2), 1.0);
  EXPECT_DOUBLE_EQ(ShareOfCores(8, 4, 4), 0.5);
  EXPECT_DOUBLE_EQ(ShareOfCores(0, 1, 4), 1.0);  // unknown
  // Another job trains 2 threads on the same 2 cores.
  EXPECT_DOUBLE_EQ(ShareOfCores(2, 1, 2, 2), 0.5);
  EXPECT_DOUBLE_EQ(ShareOfCores(2, 1, 1, 2), 2.0 / 3);
}

TEST(CoreSharingTest, AProfileAloneIsTheMeasuredTimesAtTheShare) {
  apapo::v1::ModelProfile p;
  auto* n = p.add_nodes();
  n->set_forward_seconds(0.2);
  n->set_backward_seconds(0.4);
  p.set_update_seconds(0.1);
  ProfiledAlone(0.5, &p);
  EXPECT_DOUBLE_EQ(p.nodes(0).forward_seconds(), 0.1);
  EXPECT_DOUBLE_EQ(p.nodes(0).backward_seconds(), 0.2);
  EXPECT_DOUBLE_EQ(p.update_seconds(), 0.05);
  ProfiledAlone(1.0, &p);  // the cores to itself: as measured
  ProfiledAlone(0.0, &p);
  EXPECT_DOUBLE_EQ(p.nodes(0).forward_seconds(), 0.1);
}

// The bench's 2 hosts x 2 workers on a 2-core machine: w-1, w-2 on host 1,
// w-3, w-4 on host 2, fast inside a host and slow between; w-1 and w-4 pinned
// to core 0, w-2 and w-3 to core 1. Profiled all at once, each at half its
// speed alone: relative speed 2 with its core to itself.
apapo::v1::ClusterSpec TwoByTwo() {
  apapo::v1::ClusterSpec c;
  const char* set[] = {"boot/0", "boot/1", "boot/1", "boot/0"};
  for (int i = 0; i < 4; ++i) {
    auto* w = c.add_workers();
    w->set_worker_id("w-" + std::to_string(i + 1));
    w->set_relative_speed(2.0);
    w->set_core_set(set[i]);
    w->set_core_set_size(1);
    w->set_threads(1);
  }
  for (int a = 0; a < 4; ++a) {
    for (int b = 0; b < 4; ++b) {
      if (a == b) continue;
      auto* l = c.add_links();
      l->set_from_worker("w-" + std::to_string(a + 1));
      l->set_to_worker("w-" + std::to_string(b + 1));
      l->set_bandwidth_bytes_per_second(a / 2 == b / 2 ? 1e9 : 1.25e7);
      l->set_message_bytes(4 << 20);
    }
  }
  auto* inner = c.add_levels();
  inner->set_group_size(2);
  inner->set_bandwidth_bytes_per_second(1e9);
  auto* outer = c.add_levels();
  outer->set_group_size(2);
  outer->set_bandwidth_bytes_per_second(1.25e7);
  return c;
}

TEST(CoreSharingTest, SpeedsFollowTheBusyWorkersOfEachCoreSet) {
  const apapo::v1::ClusterSpec c = TwoByTwo();
  EXPECT_THAT(SpeedsUnderLoad(c, {true, true, true, true}), ElementsAre(1, 1, 1, 1));
  // One busy per core: each at its speed alone.
  EXPECT_THAT(SpeedsUnderLoad(c, {true, true, false, false}), ElementsAre(2, 2, 2, 2));
  EXPECT_THAT(SpeedsUnderLoad(c, {true, true, true, false}), ElementsAre(2, 1, 1, 2));
  // A worker without a core set keeps its speed whatever is busy.
  apapo::v1::ClusterSpec unknown = c;
  unknown.mutable_workers(0)->clear_core_set();
  unknown.mutable_workers(0)->clear_core_set_size();
  EXPECT_THAT(SpeedsUnderLoad(unknown, {true, true, true, true}), ElementsAre(2, 1, 1, 2));
  // Another job's thread on core 0 halves w-1 even alone there.
  apapo::v1::ClusterSpec crowded = c;
  crowded.mutable_workers(0)->set_threads_elsewhere(1);
  crowded.mutable_workers(3)->set_threads_elsewhere(1);
  EXPECT_THAT(SpeedsUnderLoad(crowded, {true, true, false, false}), ElementsAre(1, 2, 2, 1));
}

TEST(CoreSharingTest, SubsetsAreFewerWorkersPerCoreSetWhenTheCoresAreShort) {
  apapo::v1::ClusterSpec c = TwoByTwo();
  // All four, then the first of each core set (w-1 and w-2: one host).
  EXPECT_THAT(CoreSharingSubsets(c), ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(0, 1)));
  // Two cores per set hold both one-thread workers: nothing to weigh.
  for (auto& w : *c.mutable_workers()) w.set_core_set_size(2);
  EXPECT_TRUE(CoreSharingSubsets(c).empty());
  // Not when another job trains on them too.
  for (auto& w : *c.mutable_workers()) w.set_threads_elsewhere(1);
  EXPECT_THAT(CoreSharingSubsets(c), ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(0, 1)));
  for (auto& w : *c.mutable_workers()) w.clear_threads_elsewhere();
  // With two threads each they do not.
  for (auto& w : *c.mutable_workers()) w.set_threads(2);
  EXPECT_EQ(CoreSharingSubsets(c).size(), 2u);
  // Three workers on one 2-core set, a fourth without one (always kept).
  apapo::v1::ClusterSpec three = TwoByTwo();
  for (int i = 0; i < 3; ++i) {
    three.mutable_workers(i)->set_core_set("boot/0-1");
    three.mutable_workers(i)->set_core_set_size(2);
  }
  three.mutable_workers(3)->clear_core_set();
  three.mutable_workers(3)->clear_core_set_size();
  EXPECT_THAT(CoreSharingSubsets(three),
              ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(0, 1, 3), ElementsAre(0, 3)));
}

TEST(CoreSharingTest, AtMostFourSubsetsAreWeighed) {
  // Four sets of 6 one-thread workers on 5, 4, 3 and 2 cores: k = 6 (all),
  // 5, 4, 3, 2 and 1 are candidates; the four largest are weighed.
  apapo::v1::ClusterSpec c;
  for (int set = 0; set < 4; ++set) {
    for (int j = 0; j < 6; ++j) {
      auto* w = c.add_workers();
      w->set_worker_id(absl::StrCat("w-", set, "-", j));
      w->set_core_set(absl::StrCat("boot/", set));
      w->set_core_set_size(5 - set);
      w->set_threads(1);
    }
  }
  const auto subsets = CoreSharingSubsets(c);
  ASSERT_EQ(subsets.size(), kMaxCoreSharingSubsets);
  EXPECT_EQ(subsets[0].size(), 24u);
  EXPECT_EQ(subsets[1].size(), 20u);
  EXPECT_EQ(subsets[3].size(), 12u);
}

TEST(CoreSharingTest, ASubClusterHasItsWorkersLinksAndLevels) {
  const apapo::v1::ClusterSpec sub = SubCluster(TwoByTwo(), {0, 1});
  ASSERT_EQ(sub.workers_size(), 2);
  EXPECT_EQ(sub.workers(0).worker_id(), "w-1");
  EXPECT_EQ(sub.workers(1).worker_id(), "w-2");
  EXPECT_DOUBLE_EQ(sub.workers(0).relative_speed(), 2.0);
  EXPECT_TRUE(sub.workers(0).core_set().empty());  // the share is applied
  EXPECT_EQ(sub.links_size(), 2);
  ASSERT_EQ(sub.levels_size(), 1);  // one host: one level, its fast link
  EXPECT_EQ(sub.levels(0).group_size(), 2);
  EXPECT_DOUBLE_EQ(sub.levels(0).bandwidth_bytes_per_second(), 1e9);
  const apapo::v1::ClusterSpec all = SubCluster(TwoByTwo(), {0, 1, 2, 3});
  ASSERT_EQ(all.levels_size(), 2);
  EXPECT_DOUBLE_EQ(all.workers(3).relative_speed(), 1.0);
}

// The profile's all-reduce ran over all four workers, across the slow link:
// two workers on one host keep none of it (their ring is charged as
// modelled over their fast link); all four keep it.
apapo::v1::ClusterSpec TwoByTwoWithAllReduce() {
  apapo::v1::ClusterSpec c = TwoByTwo();
  for (int i = 0; i < 4; ++i) {
    auto* a = c.add_allreduces();
    a->set_ranks(4);
    a->set_bytes(4 << 20);
    a->set_seconds(0.6);  // 4 MiB x 1.5 each way at 12.5 MB/s, and more
    a->set_compute_lost_seconds(0.05);
    a->set_seconds_beside_compute(0.6);
  }
  return c;
}

TEST(CoreSharingTest, ASubClusterKeepsNoAllReduceTimedOverMoreWorkers) {
  EXPECT_EQ(SubCluster(TwoByTwoWithAllReduce(), {0, 1}).allreduces_size(), 0);
  EXPECT_EQ(SubCluster(TwoByTwoWithAllReduce(), {0, 1, 2}).allreduces_size(), 0);
  EXPECT_EQ(SubCluster(TwoByTwoWithAllReduce(), {0, 1, 2, 3}).allreduces_size(), 4);
  apapo::v1::ClusterSpec pairs = TwoByTwoWithAllReduce();
  pairs.mutable_allreduces(0)->set_ranks(2);
  EXPECT_EQ(SubCluster(pairs, {0, 1}).allreduces_size(), 1);
}

// A job of one stage on two replicas, mini-batches of 128.
apapo::v1::JobSpec OneStageOfTwoReplicas() {
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  spec.mutable_schedule()->set_stages(1);
  spec.mutable_schedule()->set_replicas(2);
  return spec;
}

// Each host's two workers timed their all-reduce among themselves too
// (ProfileResult.host_allreduce), 3x the ring over their 1 GB/s link: 4
// MiB each way, 12.6 ms.
apapo::v1::ClusterSpec TwoByTwoWithHostAllReduces() {
  apapo::v1::ClusterSpec c = TwoByTwoWithAllReduce();
  for (const char* pair : {"w-1,w-2", "w-3,w-4"}) {
    for (int i = 0; i < 2; ++i) {
      auto* a = c.add_allreduces();
      a->set_ranks(2);
      a->set_bytes(4 << 20);
      a->set_seconds(3.0 * (4 << 20) / 1e9);
      for (const auto id : absl::StrSplit(pair, ',')) a->add_worker_ids(std::string(id));
    }
  }
  return c;
}

TEST(CoreSharingTest, ASubClusterKeepsTheAllReducesTimedAmongItsWorkers) {
  const auto ids = [](const apapo::v1::ClusterSpec& c) {
    std::vector<std::string> out;
    for (const auto& a : c.allreduces()) {
      out.push_back(absl::StrCat(a.ranks(), ":", absl::StrJoin(a.worker_ids(), ",")));
    }
    return out;
  };
  EXPECT_THAT(ids(SubCluster(TwoByTwoWithHostAllReduces(), {0, 1})),
              ElementsAre("2:w-1,w-2", "2:w-1,w-2"));
  EXPECT_THAT(ids(SubCluster(TwoByTwoWithHostAllReduces(), {2, 3})),
              ElementsAre("2:w-3,w-4", "2:w-3,w-4"));
  // One of each host: neither host's, nor the four workers'.
  EXPECT_THAT(ids(SubCluster(TwoByTwoWithHostAllReduces(), {0, 2})), IsEmpty());
  EXPECT_EQ(SubCluster(TwoByTwoWithHostAllReduces(), {0, 1, 2}).allreduces_size(), 2);
  EXPECT_EQ(SubCluster(TwoByTwoWithHostAllReduces(), {0, 1, 2, 3}).allreduces_size(), 8);
}

// Two workers of one host that timed their own all-reduce are charged it:
// 3x the ring over their link, where without it the ring itself was.
TEST(CoreSharingTest, TwoWorkersOfOneHostAreChargedTheAllReduceTheyTimed) {
  const apapo::v1::JobSpec spec = OneStageOfTwoReplicas();
  const apapo::v1::ModelProfile profile = test_profiles::Chain("chain", 0.02, 0);
  PartitionerPlanner planner;
  auto plan = planner.MakePlan(spec, profile, TwoByTwoWithHostAllReduces());
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto ring = planner.MakePlan(spec, profile, TwoByTwoWithAllReduce());
  ASSERT_TRUE(ring.ok()) << ring.status();
  ASSERT_EQ(plan->stages_size(), 1);
  ASSERT_EQ(ring->stages_size(), 1);
  EXPECT_GT(plan->stages(0).allreduce_seconds(), 2.5 * ring->stages(0).allreduce_seconds());
  std::string notes;
  for (const auto& n : plan->notes()) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("3.00x the ring over its link"));
  EXPECT_THAT(notes, HasSubstr("these 2 timed theirs among themselves"));
}

// Data parallelism on the two workers of one host is priced on their fast
// link, not at the four-worker all-reduce's slow rate, and the plan says
// why.
TEST(CoreSharingTest, TwoWorkersOfOneHostAreNotChargedTheFourWorkerAllReduce) {
  const apapo::v1::JobSpec spec = OneStageOfTwoReplicas();
  const apapo::v1::ModelProfile profile = test_profiles::Chain("chain", 0.02, 0);
  PartitionerPlanner planner;
  auto plan = planner.MakePlan(spec, profile, TwoByTwoWithAllReduce());
  ASSERT_TRUE(plan.ok()) << plan.status();
  apapo::v1::ClusterSpec unmeasured = TwoByTwo();
  auto expected = planner.MakePlan(spec, profile, SubCluster(unmeasured, {0, 1}));
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_DOUBLE_EQ(plan->prediction().samples_per_second(),
                   expected->prediction().samples_per_second());
  std::set<std::string> placed;
  for (const auto& st : plan->stages()) {
    for (const auto& r : st.placement()) placed.insert(r.worker_id());
  }
  EXPECT_THAT(placed, ElementsAre("w-1", "w-2"));
  std::string notes;
  for (const auto& n : plan->notes()) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("the all-reduces timed while profiling spanned 4 workers, "
                               "over links and cores these 2 do not share"));
  // Kept, the slow measurement would have priced the pair far lower.
  apapo::v1::ClusterSpec kept = SubCluster(TwoByTwo(), {0, 1});
  const apapo::v1::ClusterSpec measured = TwoByTwoWithAllReduce();
  for (const auto& a : measured.allreduces()) *kept.add_allreduces() = a;
  auto slow = planner.MakePlan(spec, profile, kept);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_LT(slow->prediction().samples_per_second(),
            0.9 * plan->prediction().samples_per_second());
}

// A chain of four equal layers, 1 MiB of activations between them: a cut
// across hosts costs more than it gains.
apapo::v1::ModelProfile Chain() { return test_profiles::Chain("chain", 0.02, 0); }

TEST(CoreSharingTest, ThePlannerWeighsFewerWorkersAtTheirWholeCores) {
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  spec.mutable_schedule()->set_split_layers(false);
  PartitionerPlanner planner;
  auto plan = planner.MakePlan(spec, Chain(), TwoByTwo());
  ASSERT_TRUE(plan.ok()) << plan.status();
  // What each subset predicts, planned as it is (its speeds under load).
  auto four = planner.MakePlan(spec, Chain(), SubCluster(TwoByTwo(), {0, 1, 2, 3}));
  auto two = planner.MakePlan(spec, Chain(), SubCluster(TwoByTwo(), {0, 1}));
  ASSERT_TRUE(four.ok() && two.ok());
  EXPECT_GT(two->prediction().samples_per_second(),
            four->prediction().samples_per_second());
  EXPECT_DOUBLE_EQ(plan->prediction().samples_per_second(),
                   two->prediction().samples_per_second());
  std::set<std::string> placed;
  for (const auto& st : plan->stages()) {
    for (const auto& r : st.placement()) placed.insert(r.worker_id());
  }
  EXPECT_THAT(placed, ElementsAre("w-1", "w-2"));  // one host, one per core
  std::string notes;
  for (const auto& n : plan->notes()) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("workers share cores"));
  EXPECT_THAT(notes, HasSubstr("planned on 2"));
}

// A spec's stages x replicas is not planned on fewer workers than it asks
// for while all of them can run it.
TEST(CoreSharingTest, AskedStagesAndReplicasKeepTheirWorkers) {
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  spec.mutable_schedule()->set_stages(2);
  spec.mutable_schedule()->set_replicas(2);
  auto plan = PartitionerPlanner().MakePlan(spec, Chain(), TwoByTwo());
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages_size(), 2);
  EXPECT_EQ(plan->stages(0).placement_size(), 2);
  EXPECT_EQ(plan->stages(1).placement_size(), 2);
}

// Two workers without core sets on a 10 GB/s level, the second at `speed`
// of the first.
apapo::v1::ClusterSpec TwoAtSpeeds(double speed) {
  apapo::v1::ClusterSpec c;
  for (int i = 0; i < 2; ++i) {
    auto* w = c.add_workers();
    w->set_worker_id("w-" + std::to_string(i + 1));
    w->set_relative_speed(i == 0 ? 1.0 : speed);
  }
  auto* level = c.add_levels();
  level->set_group_size(2);
  level->set_bandwidth_bytes_per_second(10e9);
  return c;
}

TEST(CoreSharingTest, SpeedSubsetsAreTheFasterWorkersAtEachThreshold) {
  EXPECT_TRUE(SpeedSubsets(TwoAtSpeeds(0.9)).empty());
  // w-1 at 0.67 of w-2: w-2 alone is weighed.
  EXPECT_THAT(SpeedSubsets(TwoAtSpeeds(1.5)), ElementsAre(ElementsAre(0, 1), ElementsAre(1)));
  EXPECT_THAT(SpeedSubsets(TwoAtSpeeds(0.2)), ElementsAre(ElementsAre(0, 1), ElementsAre(0)));
  // 1, 0.7, 0.4, 0.1 (unset is 1): all, >= 0.8, >= 0.5, >= 0.25.
  apapo::v1::ClusterSpec four;
  for (double v : {0.4, 0.0, 0.1, 0.7}) {
    four.add_workers()->set_relative_speed(v);
  }
  EXPECT_THAT(SpeedSubsets(four),
              ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(1), ElementsAre(1, 3),
                          ElementsAre(0, 1, 3)));
}

// The DP cuts a chain of two equal halves for one speed; a second worker at
// a fifth of the first would bind the pipeline at 2.5x the time the first
// takes alone, so the first trains alone. At 0.9 both do.
TEST(CoreSharingTest, AMuchSlowerWorkerIsLeftOutWhenTheRestAreFasterAlone) {
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  PartitionerPlanner planner;
  auto plan = planner.MakePlan(spec, Chain(), TwoAtSpeeds(0.2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto alone = planner.MakePlan(spec, Chain(), SubCluster(TwoAtSpeeds(0.2), {0}));
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_DOUBLE_EQ(plan->prediction().samples_per_second(),
                   alone->prediction().samples_per_second());
  ASSERT_EQ(plan->stages_size(), 1);
  ASSERT_EQ(plan->stages(0).placement_size(), 1);
  EXPECT_EQ(plan->stages(0).placement(0).worker_id(), "w-1");
  std::string notes;
  for (const auto& n : plan->notes()) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("workers differ in speed (the slowest at 0.20x the fastest): "
                               "the DP predicted "));
  EXPECT_THAT(notes, HasSubstr("planned on 1"));

  auto both = planner.MakePlan(spec, Chain(), TwoAtSpeeds(0.9));
  ASSERT_TRUE(both.ok()) << both.status();
  std::set<std::string> placed;
  for (const auto& st : both->stages()) {
    for (const auto& r : st.placement()) placed.insert(r.worker_id());
  }
  EXPECT_THAT(placed, ElementsAre("w-1", "w-2"));
}

// Across a 12 MB/s link (100 Mbit/s as the lab measures it) the
// whole-batch pipeline waits on its round trips and predicts less than the
// faster worker alone; with micro-batches (up to m + 1 in flight at one
// update of staleness) it predicts more, by the 1.1x a finer m and a second
// worker each need. The subsets are weighed with them, so both train.
TEST(CoreSharingTest, SubsetsAreWeighedWithTheMicroBatchesThatHideALink) {
  apapo::v1::JobSpec spec;
  spec.mutable_data()->set_batch_size(128);
  PartitionerPlanner planner;
  apapo::v1::ClusterSpec slow = TwoAtSpeeds(0.75);
  slow.mutable_levels(0)->set_bandwidth_bytes_per_second(1.2e7);
  auto alone = planner.MakePlan(spec, Chain(), SubCluster(slow, {0}));
  ASSERT_TRUE(alone.ok()) << alone.status();
  apapo::v1::JobSpec whole = spec;
  whole.mutable_schedule()->set_micro_batches(1);
  whole.mutable_schedule()->set_kind(apapo::v1::SCHEDULE_KIND_ASYNC);
  whole.mutable_schedule()->set_stages(2);
  auto whole_plan = planner.MakePlan(whole, Chain(), slow);
  ASSERT_TRUE(whole_plan.ok()) << whole_plan.status();
  EXPECT_LT(whole_plan->prediction().samples_per_second(),
            alone->prediction().samples_per_second());

  auto plan = planner.MakePlan(spec, Chain(), slow);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::set<std::string> placed;
  for (const auto& st : plan->stages()) {
    for (const auto& r : st.placement()) placed.insert(r.worker_id());
  }
  EXPECT_THAT(placed, ElementsAre("w-1", "w-2"));
  EXPECT_GT(plan->micro_batches(), 1);
  EXPECT_GT(plan->prediction().samples_per_second(),
            1.1 * alone->prediction().samples_per_second());
  std::string notes;
  for (const auto& n : plan->notes()) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("micro-batches: "));
  EXPECT_THAT(notes, HasSubstr("planned on 2"));
}

}  // namespace
}  // namespace apapo::planning
