// Cluster description for the planner: N workers arranged in a hierarchy of
// levels, each level with its own link bandwidth, a memory limit per device
// and a relative compute speed per worker (heterogeneous clusters).
//
// Level syntax (flag --levels), innermost level first:
//   "8:300e9,4:25e9"   8 workers per server linked at 300e9 B/s, 4 servers
//                       linked at 25e9 B/s: 32 workers. The product of the
//                       fan-outs is the worker count.
// Bandwidths accept plain numbers or suffixes K/M/G/T (x1e3..1e12), e.g.
// "8:300G,4:25G". Memory ("--memory") accepts the same suffixes, or Ki/Mi/Gi
// (powers of 1024); 0 means unlimited. Speeds ("--speeds") are a comma list of
// per-worker factors with optional repetition, e.g. "4*1.0,4*0.5": worker w
// runs a layer in time / speed[w]. Workers are numbered in level order:
// worker w is in innermost group w / fanout(0).
//
// Thread-safety: plain value types and stateless functions.

#ifndef APAPO_PARTITIONER_CLUSTER_H_
#define APAPO_PARTITIONER_CLUSTER_H_

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace apapo {
namespace partitioner {

// PipeDream's default link bandwidth (bytes/second).
inline constexpr double kDefaultBandwidth = 1e9;

struct Level {
  int fanout = 1;                      // units of the level below per group
  double bandwidth = kDefaultBandwidth;  // bytes/second between those units
  // What such a link passes at once after it idled (a token bucket's
  // burst, measured while profiling: LinkMeasurement.burst_bytes); 0: a
  // wire. Only the in-flight depth bound credits it (optimizer.cc).
  double burst_bytes = 0;
};

// The largest factor transfer_cpu_scale may hold, or TransferCpuPerByte
// extrapolate to: 20x the reference figure (measured here: at most ~17x,
// 3.5 ns at 64 MiB against 0.2 at 4 MiB).
inline constexpr double kMaxTransferCpuFactor = 20;

struct Cluster {
  std::vector<Level> levels;  // innermost first; never empty once valid
  double memory_bytes = 0;    // per device; 0 = unlimited
  std::vector<double> speeds;  // per worker; empty = all 1.0
  // CPU seconds a worker spends per activation byte it sends or receives
  // (serialisation and socket copies), taken from its own compute: a stage
  // pays it for every byte crossing its cuts, both ways, on top of the
  // wire time that overlaps compute. 0: transfers cost no compute (as in
  // PipeDream). The kPipeDream cost model ignores it.
  double transfer_cpu_seconds_per_byte = 0;
  // How that cost grows with the size of one message: (message bytes,
  // factor on transfer_cpu_seconds_per_byte) in ascending bytes, the first
  // at the size the figure above was measured with (factor 1). A message
  // larger than the caches costs more per byte: on this development host,
  // 0.2 ns at 4 MiB, 0.4-0.8 at 19 MiB, 1-3.5 at 64 MiB (loopback TCP, each
  // way). Empty: the same at every size. Factors stay within
  // [1, kMaxTransferCpuFactor].
  std::vector<std::pair<double, double>> transfer_cpu_scale;
  // How much longer a real all-reduce took, measured while profiling, than
  // RingAllReduceSeconds predicts for it on this cluster (Gloo's chunking,
  // reductions and synchronisation on these CPUs, and copies that no
  // longer fit the caches at large sizes): (bytes, factor) in ascending
  // bytes, one point per size the workers timed. It multiplies every
  // all-reduce the kApapo cost model and the simulator charge, at that
  // all-reduce's size (AllReduceFactor). Empty: as modelled.
  std::vector<std::pair<double, double>> allreduce_factor;
  // The same where the all-reduces inside one group of a level were timed
  // apart: [l] for replicas that span level l (SpanLevel), the workers of
  // one host timed among themselves, whose all-reduce runs over the host's
  // links and CPUs (the one over every worker, bound by the slowest link,
  // tells nothing of it: 2 workers of one host ran theirs at 2.25x the
  // ring, the four over a 1 Gbit/s link at 1.1x). Missing or empty for a
  // level: allreduce_factor.
  std::vector<std::vector<std::pair<double, double>>> allreduce_factor_by_level;
  // CPU seconds a real all-reduce took in a worker's process per byte each
  // rank moves each way (2 (n - 1) / n of its bytes), measured while
  // profiling (AllReduceMeasurement.cpu_seconds): Gloo's copies and sums and
  // the sockets' system calls, which on a shaped link cost more than the
  // copies transfer_cpu_seconds_per_byte counts. 0: not measured (the
  // copies' figure stands in). AllReduceCpuShare.
  double allreduce_cpu_seconds_per_byte = 0;
  // The share of a window's seconds that an all-reduce running beside the
  // compute gets done, in [0, 1], measured while profiling
  // (AllReduceMeasurement.seconds_beside_compute): beside the compute the
  // all-reduce gets part of the core, so it runs at r = (seconds alone) /
  // (seconds beside) of its pace alone, while the compute runs at 1 - q,
  // q = (compute lost) / (seconds beside). A window of W seconds of compute
  // alone lasts W / (1 - q) and gets W r / (1 - q) of the all-reduce done,
  // at the cost of W q / (1 - q) more compute, which the all-reduce's CPU
  // share already charges: net, the window hides W (r - q) / (1 - q) of
  // it. 1: as if the all-reduce ran at its pace alone (not measured).
  double allreduce_window_factor = 1;

  // CPU seconds per byte of a transfer whose messages are `message_bytes`:
  // transfer_cpu_seconds_per_byte times transfer_cpu_scale's factor at that
  // size: linear in log bytes between points; below the first, its factor;
  // above the last, the last segment's slope continued where it rises (the
  // probe stops at 32 MiB, and the cost per byte still grew from 16 to 64
  // MiB here) up to kMaxTransferCpuFactor, else the last factor.
  double TransferCpuPerByte(double message_bytes) const;
  // CPU seconds the copies of one `message_bytes` message take at that rate.
  double TransferCpuSeconds(double message_bytes) const {
    return message_bytes * TransferCpuPerByte(message_bytes);
  }

  // The CPU's share of an all-reduce over a link of `bandwidth` (what a
  // replica's core loses while it runs, ExposedAllReduceSeconds):
  // RingAllReduceCpuShare at allreduce_cpu_seconds_per_byte / 2 where
  // measured (its figure counts both ways), else at
  // transfer_cpu_seconds_per_byte.
  double AllReduceCpuShare(double bandwidth) const;

  // allreduce_factor's factor for an all-reduce of `parameter_bytes`:
  // linear in log bytes between points, the nearest point's outside them;
  // 1 when there is none.
  double AllReduceFactor(double parameter_bytes) const;
  // The factor for replicas that span `level`: allreduce_factor_by_level's
  // where it has one for the level, else AllReduceFactor.
  double AllReduceFactor(double parameter_bytes, int level) const;
  // Whether any all-reduce was timed (a factor at some level).
  bool allreduce_measured() const;

  int num_workers() const;
  double speed(int worker) const {
    return speeds.empty() ? 1.0 : speeds[worker];
  }
  bool heterogeneous() const;
};

// One ring all-reduce of `parameter_bytes` over `replicas` workers, as the
// apapo cost model and the simulator charge it (before AllReduceFactor):
// each replica sends and receives 2 (R-1) / R of them, at the link's
// `bandwidth` or, where slower, at its CPU's copy cost
// (`cpu_seconds_per_byte` per byte sent or received). 0 for one replica.
double RingAllReduceSeconds(double parameter_bytes, int replicas,
                            double bandwidth, double cpu_seconds_per_byte);

// The CPU's share of RingAllReduceSeconds on that link: the copies'
// 2 x `cpu_seconds_per_byte` over the larger of it and 1 / `bandwidth`,
// in [0, 1] (1 where the copies bind, 0 without them).
double RingAllReduceCpuShare(double bandwidth, double cpu_seconds_per_byte);

// The part of an all-reduce of `allreduce_seconds` (as charged, after
// AllReduceFactor) that a replica waits for when it starts in buckets
// while the replica computes its last micro-batch's weight gradients for
// `hidden_window` seconds (a split backward's second pass): the window
// hides the link's time, not the copies and sums that run on the
// replica's own core (`cpu_share`, RingAllReduceCpuShare), and beside the
// compute the all-reduce runs slower than alone, so a second of the window
// hides `window_factor` seconds of it (Cluster::allreduce_window_factor):
//   exposed = max(AR - W x window_factor, AR x cpu_share)
// (AR = allreduce_seconds, W = hidden_window). AR for a window of 0. With
// the window factor 1 it is the link's tail or the core's loss, whichever
// is larger; below 1 the tail grows by what the slower pace left undone.
// Inline: the planner's DP prices it for every replica count of a segment.
inline double ExposedAllReduceSeconds(double allreduce_seconds,
                                      double cpu_share, double hidden_window,
                                      double window_factor) {
  if (!(allreduce_seconds > 0)) return 0;
  const double share = std::clamp(cpu_share, 0.0, 1.0);
  const double factor = std::clamp(window_factor, 0.0, 1.0);
  return std::max(allreduce_seconds - std::max(0.0, hidden_window) * factor,
                  allreduce_seconds * share);
}

// The window ExposedAllReduceSeconds takes for a replicated stage with a
// split backward: `weight_gradients`, W, the seconds of its last
// micro-batch's weight gradients, which the parts started before them
// travel behind. On the first stage no send separates the passes, so the
// parts of the nodes whose weight gradient is one product start as pass 1
// reaches them (`hooked_bytes` of the stage's `param_bytes`): those travel
// behind about the whole backward `backward` (without the update). The
// window is the two weighted by their bytes:
//   h / P x max(B, W) + (1 - h / P) x W.
// Inline: the DP prices it for every segment.
inline double AllReduceWindowSeconds(double weight_gradients, double backward,
                                     double hooked_bytes, double param_bytes) {
  const double w = std::max(0.0, weight_gradients);
  if (!(hooked_bytes > 0) || !(param_bytes > 0)) return w;
  const double share = std::min(1.0, hooked_bytes / param_bytes);
  return share * std::max(backward, w) + (1.0 - share) * w;
}

// Smallest level whose groups contain all `workers` (indices, grouped in
// order: level 0's groups are runs of levels[0].fanout workers; 0 =
// innermost): the level of the links between them.
int SpanLevel(const Cluster& cluster, const std::vector<int>& workers);

// Builds a cluster. `levels` empty means one level of `workers` at 1e9 B/s;
// otherwise the fan-out product must equal `workers` (workers <= 0: taken
// from the levels).
absl::StatusOr<Cluster> MakeCluster(int workers, absl::string_view levels,
                                    absl::string_view memory,
                                    absl::string_view speeds);

// Parses "300e9", "25G", "16Gi" into a non-negative finite number.
absl::StatusOr<double> ParseQuantity(absl::string_view text);

// "8:300e9,4:25e9 (32 workers), memory 16e9 B".
std::string DescribeCluster(const Cluster& cluster);

}  // namespace partitioner
}  // namespace apapo

#endif  // APAPO_PARTITIONER_CLUSTER_H_
