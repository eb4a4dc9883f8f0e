// NetworkLevels: the network hierarchy the planner is given, inferred from
// the links the workers measured while profiling.
//
// Workers joined by links much faster than the rest (e.g. processes on one
// host, or hosts in one rack) form groups; the planner's DP then charges a
// transfer inside a group the group's bandwidth and one between groups the
// bandwidth between them, instead of the slowest link for everything.
//
// The rule: sort the measured bandwidths (each pair's peak where every pair
// has one, LinkMeasurement.peak_bandwidth_bytes_per_second; its median
// otherwise); every ratio of at least kLevelGap between neighbours is a
// candidate gap, tried from the largest ratio down. Links at or above a gap
// join workers into groups (connected components); the first gap whose
// groups all have the same size g, 1 < g < n, gives two levels: groups of g
// at the slowest median bandwidth inside a group, and n / g groups at the
// slowest median between groups. Otherwise (no gap, only
// uneven groups, at most two workers) there is one flat level at the
// slowest link. Only two levels are inferred; deeper hierarchies are
// flattened into those two.
//
// Thread-safety: a pure function.
#ifndef APAPO_PLANNING_NETWORK_LEVELS_H_
#define APAPO_PLANNING_NETWORK_LEVELS_H_

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "partitioner/cluster.h"
#include "proto/apapo/v1/profile.pb.h"

namespace apapo::planning {

// Links within a level must be at least this many times faster than the
// links between its groups to count as a level of their own.
inline constexpr double kLevelGap = 2.0;

struct NetworkLevels {
  // Indices into the worker list, each innermost group contiguous (the
  // order the planner numbers workers in).
  std::vector<int> order;
  // Innermost first; the product of the group sizes is the worker count.
  // Empty when no link was measured (the caller assumes a bandwidth).
  std::vector<apapo::v1::NetworkLevel> levels;
  // One line for people: "2 groups of 2: 1.20 GB/s inside, 0.12 GB/s
  // between" or "one level: slowest link 0.12 GB/s".
  std::string description;
};

// `workers` are the worker ids; links naming other ids are ignored. A pair
// measured both ways counts at its slower direction.
NetworkLevels InferNetworkLevels(
    const std::vector<std::string>& workers,
    const std::vector<apapo::v1::LinkMeasurement>& links);

// The CPU a worker spends per byte it sends or receives, from what the
// links measured (LinkMeasurement.cpu_seconds_per_byte): the median of the
// positive finite figures, so one disturbed measurement does not move the
// plan; 0 when none was measured.
double TransferCpuSecondsPerByte(
    const google::protobuf::RepeatedPtrField<apapo::v1::LinkMeasurement>& links);

// pt::Cluster::transfer_cpu_scale from what the workers timed
// (ClusterSpec.transfer_cpu): each worker's figures divided by its figure at
// its smallest size (the link test's, the reference), the median of those
// ratios at each size, in ascending bytes, each kept within
// [1, partitioner::kMaxTransferCpuFactor]; empty when no worker timed more
// than the reference. Figures that are not positive and finite, or sizes
// that are not positive, are left out.
std::vector<std::pair<double, double>> TransferCpuScale(
    const apapo::v1::ClusterSpec& spec);

// pt::Cluster::allreduce_factor from what the workers timed: at each size
// of spec.allreduces, the median of the measured time (its time after the
// compute, seconds_after_compute, where timed; else `seconds`) /
// RingAllReduceSeconds
// of the same all-reduce at the slowest link of spec.links and
// `cpu_seconds_per_byte`, kept within [0.25, 20]; in ascending bytes. Empty
// (as modelled) when nothing usable was measured.
// Only those timed over every worker of spec count here (an all-reduce
// naming fewer, AllReduceMeasurement.worker_ids, goes to
// AllReduceFactorsByLevel).
std::vector<std::pair<double, double>> AllReduceFactors(
    const apapo::v1::ClusterSpec& spec, double cpu_seconds_per_byte);

// pt::Cluster::allreduce_factor_by_level from the all-reduces timed among
// some of spec's workers (those of one host): each where its workers span
// a level inside the outermost of ClusterLevels(spec), over the ring at the
// slowest link measured among them (else that level's bandwidth), the
// median at each size as AllReduceFactors. Empty when none is usable.
std::vector<std::vector<std::pair<double, double>>> AllReduceFactorsByLevel(
    const apapo::v1::ClusterSpec& spec, double cpu_seconds_per_byte);

// pt::Cluster::allreduce_cpu_seconds_per_byte from what the workers timed:
// the median over spec.allreduces of the largest size measured with its
// figure, the compute it cost beside it (compute_lost_seconds) where any
// has one, else its process CPU (cpu_seconds), over 2 (ranks - 1) / ranks
// x bytes, the bytes each rank moves each way. 0 (not measured) when none
// has a figure.
double AllReduceCpuSecondsPerByte(const apapo::v1::ClusterSpec& spec);

// pt::Cluster::allreduce_window_factor from what the workers timed: over
// spec.allreduces with a time beside the compute (seconds_beside_compute),
// r = seconds / seconds_beside_compute (at most 1) and q =
// compute_lost_seconds / seconds_beside_compute (below 1), the median of
// (r - q) / (1 - q), within [0, 1]. 1 (as if the all-reduce ran at its
// pace alone) when none has the figures.
double AllReduceWindowFactor(const apapo::v1::ClusterSpec& spec);

// Sets `cluster`'s figures measured while profiling: the transfers' CPU
// per byte and its scale with size, the all-reduce factors, the
// all-reduce's CPU per byte and its window factor (the functions above).
void SetMeasuredCosts(const apapo::v1::ClusterSpec& spec, partitioner::Cluster* cluster);

// The planner's levels for `spec` (innermost first; spec.workers grouped in
// order): each level's group size, bandwidth (the default where not
// positive) and token bucket (none where not finite and positive). One
// level of all the workers, at level 0's bandwidth, where there are none
// or their group sizes do not multiply to the number of workers.
std::vector<partitioner::Level> ClusterLevels(const apapo::v1::ClusterSpec& spec);

}  // namespace apapo::planning

#endif  // APAPO_PLANNING_NETWORK_LEVELS_H_
