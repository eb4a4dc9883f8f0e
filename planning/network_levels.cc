#include "planning/network_levels.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include "absl/strings/str_format.h"
#include "partitioner/cluster.h"

namespace apapo::planning {
namespace {

struct Pair {
  int a = 0, b = 0;
  double bandwidth = 0;
  double latency = 0;
  double burst = 0;  // the smaller of its directions'
  // The smaller of its directions' peak_bandwidth_bytes_per_second; 0 when
  // a direction has none.
  double peak = 0;
};

// A pair's figure after one more direction's: the smaller. A worker's
// figure that is not finite and positive counts as none (0), and a pair
// with none in either direction has none. `first`: the pair's first.
double SlowerFigure(bool first, double kept, double figure) {
  const double or_none = std::isfinite(figure) && figure > 0 ? figure : 0;
  return first ? or_none : std::min(kept, or_none);
}

int Find(std::vector<int>& parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

std::string Rate(double bytes_per_second) {
  return absl::StrFormat("%.2f GB/s", bytes_per_second / 1e9);
}

NetworkLevels Flat(int n, const std::vector<Pair>& pairs) {
  NetworkLevels out;
  out.order.resize(n);
  std::iota(out.order.begin(), out.order.end(), 0);
  if (pairs.empty()) {
    out.description = "one level: no link measured";
    return out;
  }
  apapo::v1::NetworkLevel level;
  level.set_group_size(n);
  double slowest = pairs[0].bandwidth, latency = 0, burst = pairs[0].burst;
  for (const Pair& p : pairs) {
    slowest = std::min(slowest, p.bandwidth);
    latency = std::max(latency, p.latency);
    burst = std::min(burst, p.burst);
  }
  level.set_bandwidth_bytes_per_second(slowest);
  level.set_latency_seconds(latency);
  level.set_burst_bytes(burst);
  out.levels.push_back(level);
  out.description = "one level: slowest link " + Rate(slowest);
  return out;
}

// The upper median of `values` (reorders them); `values` must not be empty.
double MedianOf(std::vector<double>& values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2,
                   values.end());
  return values[values.size() / 2];
}

}  // namespace

NetworkLevels InferNetworkLevels(
    const std::vector<std::string>& workers,
    const std::vector<apapo::v1::LinkMeasurement>& links) {
  const int n = static_cast<int>(workers.size());
  std::map<std::string, int> index;
  for (int i = 0; i < n; ++i) index[workers[i]] = i;
  // One entry per unordered pair, at its slower direction.
  std::map<std::pair<int, int>, Pair> by_pair;
  for (const auto& l : links) {
    auto a = index.find(l.from_worker()), b = index.find(l.to_worker());
    if (a == index.end() || b == index.end() || a->second == b->second ||
        !(l.bandwidth_bytes_per_second() > 0)) {
      continue;
    }
    const auto key = std::minmax(a->second, b->second);
    auto [it, inserted] = by_pair.try_emplace(key);
    Pair& p = it->second;
    if (inserted || l.bandwidth_bytes_per_second() < p.bandwidth) {
      p.a = key.first;
      p.b = key.second;
      p.bandwidth = l.bandwidth_bytes_per_second();
    }
    p.latency = std::max(p.latency, l.latency_seconds());
    p.burst = SlowerFigure(inserted, p.burst, l.burst_bytes());
    p.peak = SlowerFigure(inserted, p.peak, l.peak_bandwidth_bytes_per_second());
  }
  std::vector<Pair> pairs;
  for (const auto& [key, p] : by_pair) pairs.push_back(p);
  if (n <= 2 || pairs.size() < 2) return Flat(n, pairs);

  // Workers are grouped by each pair's peak where every pair has one: a
  // busy host only adds time, and with every worker measuring at once the
  // medians of links inside a host have read 0.2 GB/s against 0.11 between
  // the hosts (loopback runs at 0.5-3). Otherwise by the medians.
  const bool by_peak = std::all_of(pairs.begin(), pairs.end(),
                                   [](const Pair& p) { return p.peak > 0; });
  const auto grouping = [by_peak](const Pair& p) {
    return by_peak ? p.peak : p.bandwidth;
  };
  // Every ratio of at least kLevelGap between neighbouring measured
  // bandwidths is a candidate split, the largest first. The first that
  // joins the workers into groups of one size wins: a host whose own
  // loopback is faster than its neighbour's (2.2 and 0.53 GB/s inside,
  // 0.12 between: two gaps of 4.2x) must not hide the hosts' gap behind it.
  std::vector<double> sorted;
  for (const Pair& p : pairs) sorted.push_back(grouping(p));
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::pair<double, double>> splits;  // (ratio, threshold)
  for (size_t i = 1; i < sorted.size(); ++i) {
    const double ratio = sorted[i] / sorted[i - 1];
    if (ratio >= kLevelGap) {
      splits.push_back({ratio, std::sqrt(sorted[i] * sorted[i - 1])});
    }
  }
  std::stable_sort(splits.begin(), splits.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::map<int, std::vector<int>> groups;  // root -> members, in index order
  size_t g = 0;
  for (const auto& [ratio, threshold] : splits) {
    // Groups: workers joined by links above the split.
    std::vector<int> parent(n);
    std::iota(parent.begin(), parent.end(), 0);
    for (const Pair& p : pairs) {
      if (grouping(p) >= threshold) parent[Find(parent, p.a)] = Find(parent, p.b);
    }
    groups.clear();
    for (int i = 0; i < n; ++i) groups[Find(parent, i)].push_back(i);
    g = groups.begin()->second.size();
    for (const auto& [root, members] : groups) {
      if (members.size() != g) g = 0;  // uneven
    }
    if (g > 1 && static_cast<int>(g) < n) break;
    g = 0;
  }
  if (g == 0) return Flat(n, pairs);

  std::vector<int> group_of(n);
  NetworkLevels out;
  // Groups in the order of their first worker; members in worker order.
  std::vector<std::vector<int>> ordered;
  for (const auto& [root, members] : groups) ordered.push_back(members);
  std::sort(ordered.begin(), ordered.end());
  for (size_t k = 0; k < ordered.size(); ++k) {
    for (int w : ordered[k]) {
      group_of[w] = static_cast<int>(k);
      out.order.push_back(w);
    }
  }
  double inside = 0, between = 0, inside_latency = 0, between_latency = 0;
  double inside_burst = -1, between_burst = -1;  // -1: no pair yet
  for (const Pair& p : pairs) {
    const bool same = group_of[p.a] == group_of[p.b];
    double& bw = same ? inside : between;
    bw = bw == 0 ? p.bandwidth : std::min(bw, p.bandwidth);
    double& lat = same ? inside_latency : between_latency;
    lat = std::max(lat, p.latency);
    double& burst = same ? inside_burst : between_burst;
    burst = burst < 0 ? p.burst : std::min(burst, p.burst);
  }
  if (inside == 0 || between == 0) return Flat(n, pairs);  // a side unmeasured
  apapo::v1::NetworkLevel inner, outer;
  inner.set_group_size(static_cast<int>(g));
  inner.set_bandwidth_bytes_per_second(inside);
  inner.set_latency_seconds(inside_latency);
  inner.set_burst_bytes(std::max(0.0, inside_burst));
  outer.set_group_size(n / static_cast<int>(g));
  outer.set_bandwidth_bytes_per_second(between);
  outer.set_latency_seconds(between_latency);
  outer.set_burst_bytes(std::max(0.0, between_burst));
  out.levels = {inner, outer};
  out.description = absl::StrFormat("%d groups of %d: %s inside, %s between",
                                    n / static_cast<int>(g), g, Rate(inside),
                                    Rate(between));
  return out;
}

double TransferCpuSecondsPerByte(
    const google::protobuf::RepeatedPtrField<apapo::v1::LinkMeasurement>& links) {
  std::vector<double> cpu;
  for (const apapo::v1::LinkMeasurement& link : links) {
    const double c = link.cpu_seconds_per_byte();
    if (c > 0 && c < 1) cpu.push_back(c);  // < 1 s per byte: finite, sane
  }
  return cpu.empty() ? 0 : MedianOf(cpu);
}

std::vector<std::pair<double, double>> TransferCpuScale(
    const apapo::v1::ClusterSpec& spec) {
  std::map<std::string, std::map<int64_t, double>> by_worker;
  for (const auto& t : spec.transfer_cpu()) {
    const double c = t.cpu_seconds_per_byte();
    if (t.message_bytes() > 0 && c > 0 && c < 1) {
      by_worker[t.worker_id()][t.message_bytes()] = c;
    }
  }
  std::map<int64_t, std::vector<double>> ratios;
  for (const auto& [worker, points] : by_worker) {
    if (points.size() < 2) continue;
    const double reference = points.begin()->second;
    for (const auto& [bytes, c] : points) ratios[bytes].push_back(c / reference);
  }
  std::vector<std::pair<double, double>> out;
  for (auto& [bytes, r] : ratios) {
    out.push_back({static_cast<double>(bytes),
                   std::clamp(MedianOf(r), 1.0, partitioner::kMaxTransferCpuFactor)});
  }
  if (out.size() < 2) out.clear();
  return out;
}

namespace {

// Whether `a` was timed over every worker of `spec`: it names none (the
// job's every worker when profiled), or exactly them.
bool OverEveryWorker(const apapo::v1::AllReduceMeasurement& a,
                     const apapo::v1::ClusterSpec& spec) {
  if (a.worker_ids_size() == 0) return true;
  const std::set<std::string> named(a.worker_ids().begin(), a.worker_ids().end());
  if (static_cast<int>(named.size()) != spec.workers_size()) return false;
  for (const auto& w : spec.workers()) {
    if (!named.count(w.worker_id())) return false;
  }
  return true;
}

// The slowest measured link among `workers` (all of spec's when empty);
// 0 when none was measured.
double SlowestLink(const apapo::v1::ClusterSpec& spec, const std::set<std::string>& workers) {
  double slowest = 0;
  for (const auto& link : spec.links()) {
    if (!workers.empty() &&
        (!workers.count(link.from_worker()) || !workers.count(link.to_worker()))) {
      continue;
    }
    const double bw = link.bandwidth_bytes_per_second();
    if (bw > 0 && (slowest == 0 || bw < slowest)) slowest = bw;
  }
  return slowest;
}

// Adds `a`'s time (after the compute where timed so: a replica's
// all-reduce follows its backward, not another all-reduce) over the ring
// at `bandwidth` to `ratios` at its size.
void AddRatio(const apapo::v1::AllReduceMeasurement& a, double bandwidth,
              double cpu_seconds_per_byte, std::map<int64_t, std::vector<double>>* ratios) {
  const double after = a.seconds_after_compute();
  const double seconds = after > 0 && std::isfinite(after) ? after : a.seconds();
  if (a.ranks() < 2 || a.bytes() <= 0 || !(seconds > 0) || !std::isfinite(seconds)) {
    return;
  }
  const double model =
      partitioner::RingAllReduceSeconds(a.bytes(), a.ranks(), bandwidth, cpu_seconds_per_byte);
  if (model > 0) (*ratios)[a.bytes()].push_back(seconds / model);
}

std::vector<std::pair<double, double>> Medians(std::map<int64_t, std::vector<double>>& ratios) {
  std::vector<std::pair<double, double>> out;
  for (auto& [bytes, r] : ratios) {
    out.push_back({static_cast<double>(bytes), std::clamp(MedianOf(r), 0.25, 20.0)});
  }
  return out;
}

}  // namespace

std::vector<std::pair<double, double>> AllReduceFactors(
    const apapo::v1::ClusterSpec& spec, double cpu_seconds_per_byte) {
  const double slowest = SlowestLink(spec, {});
  if (slowest == 0) return {};
  std::map<int64_t, std::vector<double>> ratios;
  for (const auto& a : spec.allreduces()) {
    if (OverEveryWorker(a, spec)) AddRatio(a, slowest, cpu_seconds_per_byte, &ratios);
  }
  return Medians(ratios);
}

std::vector<std::vector<std::pair<double, double>>> AllReduceFactorsByLevel(
    const apapo::v1::ClusterSpec& spec, double cpu_seconds_per_byte) {
  partitioner::Cluster hierarchy;
  hierarchy.levels = ClusterLevels(spec);
  const std::vector<partitioner::Level>& levels = hierarchy.levels;
  std::map<std::string, int> index;
  for (int i = 0; i < spec.workers_size(); ++i) index[spec.workers(i).worker_id()] = i;
  std::vector<std::map<int64_t, std::vector<double>>> ratios(levels.size());
  for (const auto& a : spec.allreduces()) {
    if (OverEveryWorker(a, spec)) continue;
    const std::set<std::string> named(a.worker_ids().begin(), a.worker_ids().end());
    std::vector<int> workers;
    for (const std::string& id : named) {
      auto it = index.find(id);
      if (it != index.end()) workers.push_back(it->second);
    }
    if (workers.size() != named.size() || workers.size() < 2) continue;
    // The level its workers span, if inside the outermost: the outermost's
    // all-reduces are those over every worker.
    const int level = partitioner::SpanLevel(hierarchy, workers);
    if (level + 1 >= static_cast<int>(levels.size())) continue;
    const double measured = SlowestLink(spec, named);
    AddRatio(a, measured > 0 ? measured : levels[level].bandwidth, cpu_seconds_per_byte,
             &ratios[level]);
  }
  std::vector<std::vector<std::pair<double, double>>> out;
  bool any = false;
  for (auto& r : ratios) {
    out.push_back(Medians(r));
    any |= !out.back().empty();
  }
  if (!any) out.clear();
  return out;
}

double AllReduceCpuSecondsPerByte(const apapo::v1::ClusterSpec& spec) {
  // The compute lost where measured, else the process's CPU.
  bool lost = false;
  for (const auto& a : spec.allreduces()) lost |= a.compute_lost_seconds() > 0;
  // Over every worker, as the factor: each host's alone measures
  // the factor of its own level only.
  const auto figure = [&](const apapo::v1::AllReduceMeasurement& a) {
    const double f = lost ? a.compute_lost_seconds() : a.cpu_seconds();
    return a.ranks() >= 2 && a.bytes() > 0 && f > 0 && std::isfinite(f) &&
                   OverEveryWorker(a, spec)
               ? f
               : 0.0;
  };
  int64_t largest = 0;
  for (const auto& a : spec.allreduces()) {
    if (figure(a) > 0) largest = std::max(largest, a.bytes());
  }
  std::vector<double> per_byte;
  for (const auto& a : spec.allreduces()) {
    if (a.bytes() != largest || !(figure(a) > 0)) continue;
    const double moved = 2.0 * (a.ranks() - 1) / a.ranks() * static_cast<double>(a.bytes());
    per_byte.push_back(figure(a) / moved);
  }
  return per_byte.empty() ? 0.0 : MedianOf(per_byte);
}

double AllReduceWindowFactor(const apapo::v1::ClusterSpec& spec) {
  std::vector<double> factors;
  for (const auto& a : spec.allreduces()) {
    const double beside = a.seconds_beside_compute();
    if (a.ranks() < 2 || !OverEveryWorker(a, spec) || !(beside > 0) ||
        !std::isfinite(beside) || !(a.seconds() > 0) ||
        !std::isfinite(a.seconds()) || !(a.compute_lost_seconds() >= 0) ||
        !std::isfinite(a.compute_lost_seconds())) {
      continue;
    }
    const double r = std::min(1.0, a.seconds() / beside);
    const double q = std::min(0.99, a.compute_lost_seconds() / beside);
    factors.push_back(std::clamp((r - q) / (1 - q), 0.0, 1.0));
  }
  return factors.empty() ? 1.0 : MedianOf(factors);
}

void SetMeasuredCosts(const apapo::v1::ClusterSpec& spec, partitioner::Cluster* cluster) {
  cluster->transfer_cpu_seconds_per_byte = TransferCpuSecondsPerByte(spec.links());
  cluster->transfer_cpu_scale = TransferCpuScale(spec);
  cluster->allreduce_factor = AllReduceFactors(spec, cluster->transfer_cpu_seconds_per_byte);
  cluster->allreduce_factor_by_level =
      AllReduceFactorsByLevel(spec, cluster->transfer_cpu_seconds_per_byte);
  cluster->allreduce_cpu_seconds_per_byte = AllReduceCpuSecondsPerByte(spec);
  cluster->allreduce_window_factor = AllReduceWindowFactor(spec);
}

std::vector<partitioner::Level> ClusterLevels(const apapo::v1::ClusterSpec& spec) {
  const int n = std::max(1, spec.workers_size());
  std::vector<partitioner::Level> levels;
  int64_t product = 1;
  for (const auto& level : spec.levels()) {
    partitioner::Level l;
    l.fanout = std::max(1, level.group_size());
    if (level.bandwidth_bytes_per_second() > 0) {
      l.bandwidth = level.bandwidth_bytes_per_second();
    }
    if (level.burst_bytes() > 0 && std::isfinite(level.burst_bytes())) {
      l.burst_bytes = level.burst_bytes();
    }
    product *= l.fanout;
    levels.push_back(l);
  }
  if (levels.empty() || product != n) {
    levels = {partitioner::Level{
        n, levels.empty() ? partitioner::kDefaultBandwidth : levels[0].bandwidth}};
  }
  return levels;
}

}  // namespace apapo::planning
