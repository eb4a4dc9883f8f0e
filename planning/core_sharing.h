// Workers that share cores: daemons of one machine (namespaces, containers)
// or pinned to the same CPUs report the same WorkerInfo.core_set, and the
// planner must not take them for devices of their own. Four one-thread
// workers on two cores compute as two: a plan that keeps all four busy runs
// each at half its speed, and one that keeps two busy (one per core) runs
// them at full speed. (bench/cluster, 2 hosts x 2 workers on this 2-core
// machine: the planner took the four for four devices and chose plans that
// ran 0.74-0.79x the ones it rejected.)
//
// The model: a core set of C CPUs whose b busy workers run t compute
// threads each gives each min(1, C / (t b)) of its speed alone. Profiling
// runs under it too (every worker of a job profiles at once, and a worker
// that joins later profiles beside the training ones): the coordinator
// scales a worker's measured times by that share, so a profile is what the
// worker computes with its cores to itself (ProfiledAlone), and the planner
// applies the share of the plan it weighs (SpeedsUnderLoad).
//
// Thread-safety: pure functions.
#ifndef APAPO_PLANNING_CORE_SHARING_H_
#define APAPO_PLANNING_CORE_SHARING_H_

#include <cstddef>
#include <string>
#include <vector>

#include "proto/apapo/v1/profile.pb.h"

namespace apapo::planning {

// min(1, cores / (threads x busy + elsewhere)), `elsewhere` the threads
// other jobs train with on the same cores; 1 when cores, threads or busy is
// not positive.
double ShareOfCores(int cores, int threads, int busy, int elsewhere = 0);

// `profile` as its worker computes it alone, from times measured at
// `share` of its cores: every node's forward and backward, the update and
// the gradient accumulation scaled by the share (kept when it is not in
// (0, 1)).
void ProfiledAlone(double share, apapo::v1::ModelProfile* profile);

// Every compute time of `profile` (nodes' forward and backward, the update,
// the gradient accumulation) times `factor`; kept when it is not a
// positive finite number.
void ScaleComputeTimes(double factor, apapo::v1::ModelProfile* profile);

// Each worker's relative_speed (1 where unset) times its core set's share
// when the workers marked `busy` (by index into cluster.workers) train at
// once beside its threads_elsewhere. A worker without a core set keeps its
// speed.
std::vector<double> SpeedsUnderLoad(const apapo::v1::ClusterSpec& cluster,
                                    const std::vector<bool>& busy);

// At most this many subsets are weighed (each is a whole MakePlan).
inline constexpr size_t kMaxCoreSharingSubsets = 4;

// The worker subsets a planner should weigh: empty when no core set holds
// more threads than cores with all its workers busy (theirs and other
// jobs': plan on all of them, as they are); otherwise, for k in descending
// order among: the largest set's size (every worker), each set's cores
// left by other jobs / threads (as many as run at full speed) and 1, every worker without a set and the
// first k of each set (in cluster order, which keeps network groups
// together). Indices ascending, each subset once, at most
// kMaxCoreSharingSubsets.
std::vector<std::vector<int>> CoreSharingSubsets(
    const apapo::v1::ClusterSpec& cluster);

// The worker subsets a planner should weigh when their speeds differ
// (relative_speed, 1 where unset): whether the DP prices each worker at its
// own speed or at their mean (partitioner/optimizer.h), a worker much
// slower than the rest binds the pipeline with whatever stage it is given. Empty when every worker runs at kSlowWorker of the
// fastest or more; otherwise every worker, then those at or above each of
// kSlowWorker, 1/2 and 1/4 of the fastest that leaves a different set.
// Indices ascending, each subset once.
inline constexpr double kSlowWorker = 0.8;
std::vector<std::vector<int>> SpeedSubsets(const apapo::v1::ClusterSpec& cluster);

// A worker's relative_speed, 1 where unset.
double SpeedOf(const apapo::v1::WorkerResources& worker);
// The slowest worker's speed over the fastest's; 1 without workers.
double SlowestOverFastest(const apapo::v1::ClusterSpec& cluster);

// Keeps the all-reduces timed among `workers` (ids) only: one naming its
// workers (AllReduceMeasurement.worker_ids) where they are all among them,
// one over every worker profiled (naming none) where it took no more part
// than `workers` holds. One over more crossed links and shared cores that
// they need not, so it does not describe theirs (the 2 x 2 lab's
// four-worker all-reduce over the slow link, kept for two workers of one
// host, priced their data parallelism at the slow link's rate:
// bench/cluster, 2026-12-07 07:53). Two workers of one host keep theirs.
// Without one the ring over their links is charged (network_levels.h).
void KeepAllReducesWithin(const std::vector<std::string>& workers,
                          apapo::v1::ClusterSpec* cluster);

// `cluster` restricted to `subset` (indices): its workers, each at its
// speed under that load (SpeedsUnderLoad) with its core set cleared (the
// share is applied), the links among them, the network levels re-inferred
// from those links (one level at the cluster's innermost bandwidth when
// none was measured), the all-reduces timed over no more workers than the
// subset holds (KeepAllReducesWithin); the rest as in `cluster`. Every
// worker of a cluster with levels keeps its order, links, levels and
// all-reduces.
apapo::v1::ClusterSpec SubCluster(const apapo::v1::ClusterSpec& cluster,
                                  const std::vector<int>& subset);

}  // namespace apapo::planning

#endif  // APAPO_PLANNING_CORE_SHARING_H_
