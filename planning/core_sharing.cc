#include "planning/core_sharing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <limits>
#include <set>
#include <string>

#include "planning/network_levels.h"

namespace apapo::planning {

double ShareOfCores(int cores, int threads, int busy, int elsewhere) {
  if (cores <= 0 || threads <= 0 || busy <= 0) return 1.0;
  return std::min(1.0, static_cast<double>(cores) /
                           (static_cast<double>(threads) * busy +
                            std::max(0, elsewhere)));
}

void ScaleComputeTimes(double factor, apapo::v1::ModelProfile* profile) {
  if (!(factor > 0) || !std::isfinite(factor) || factor == 1) return;
  for (auto& node : *profile->mutable_nodes()) {
    node.set_forward_seconds(node.forward_seconds() * factor);
    node.set_backward_seconds(node.backward_seconds() * factor);
  }
  profile->set_update_seconds(profile->update_seconds() * factor);
  profile->set_update_prediction_seconds(profile->update_prediction_seconds() * factor);
  profile->set_accumulate_seconds_per_byte(profile->accumulate_seconds_per_byte() *
                                           factor);
}

void ProfiledAlone(double share, apapo::v1::ModelProfile* profile) {
  if (!(share > 0 && share < 1)) return;
  ScaleComputeTimes(share, profile);
}

namespace {

bool Shares(const apapo::v1::WorkerResources& w) {
  return !w.core_set().empty() && w.core_set_size() > 0;
}

}  // namespace

std::vector<double> SpeedsUnderLoad(const apapo::v1::ClusterSpec& cluster,
                                    const std::vector<bool>& busy) {
  std::map<std::string, int> busy_in;
  for (int i = 0; i < cluster.workers_size(); ++i) {
    const auto& w = cluster.workers(i);
    if (Shares(w) && i < static_cast<int>(busy.size()) && busy[i]) ++busy_in[w.core_set()];
  }
  std::vector<double> speeds;
  for (const auto& w : cluster.workers()) {
    double speed = SpeedOf(w);
    if (Shares(w)) {
      speed *= ShareOfCores(w.core_set_size(), std::max(1, w.threads()),
                            std::max(1, busy_in[w.core_set()]), w.threads_elsewhere());
    }
    speeds.push_back(speed);
  }
  return speeds;
}

std::vector<std::vector<int>> CoreSharingSubsets(
    const apapo::v1::ClusterSpec& cluster) {
  std::map<std::string, std::vector<int>> members;
  // Each worker's position in its set (0 for a worker without one).
  std::vector<size_t> position(cluster.workers_size(), 0);
  bool oversubscribed = false;
  for (int i = 0; i < cluster.workers_size(); ++i) {
    const auto& w = cluster.workers(i);
    if (!Shares(w)) continue;
    std::vector<int>& m = members[w.core_set()];
    position[i] = m.size();
    m.push_back(i);
    oversubscribed |= static_cast<int64_t>(std::max(1, w.threads())) *
                              static_cast<int64_t>(m.size()) +
                          std::max(0, w.threads_elsewhere()) > w.core_set_size();
  }
  std::vector<std::vector<int>> subsets;
  if (!oversubscribed) return subsets;
  // k: every worker; as many per set as its cores hold at full speed
  // (fewer than that only saves links); one.
  size_t largest = 0;
  std::set<size_t, std::greater<>> ks = {1};
  for (const auto& [set, m] : members) {
    largest = std::max(largest, m.size());
    const auto& w = cluster.workers(m.front());
    const int left = w.core_set_size() - std::max(0, w.threads_elsewhere());
    ks.insert(std::max<size_t>(1, std::max(0, left) / std::max(1, w.threads())));
  }
  ks.insert(largest);
  std::set<std::vector<int>> seen;
  for (size_t k : ks) {
    if (k > largest) continue;
    if (subsets.size() == kMaxCoreSharingSubsets) break;
    std::vector<int> subset;
    for (int i = 0; i < cluster.workers_size(); ++i) {
      if (!Shares(cluster.workers(i)) || position[i] < k) subset.push_back(i);
    }
    if (seen.insert(subset).second) subsets.push_back(std::move(subset));
  }
  return subsets;
}

double SpeedOf(const apapo::v1::WorkerResources& worker) {
  return worker.relative_speed() > 0 ? worker.relative_speed() : 1.0;
}

double SlowestOverFastest(const apapo::v1::ClusterSpec& cluster) {
  if (cluster.workers().empty()) return 1.0;
  double fastest = 0;
  double slowest = std::numeric_limits<double>::infinity();
  for (const auto& w : cluster.workers()) {
    fastest = std::max(fastest, SpeedOf(w));
    slowest = std::min(slowest, SpeedOf(w));
  }
  return slowest / fastest;
}

std::vector<std::vector<int>> SpeedSubsets(const apapo::v1::ClusterSpec& cluster) {
  std::vector<std::vector<int>> subsets;
  if (SlowestOverFastest(cluster) >= kSlowWorker) return subsets;
  double fastest = 0;
  for (const auto& w : cluster.workers()) fastest = std::max(fastest, SpeedOf(w));
  std::set<std::vector<int>> seen;
  for (double at : {0.0, kSlowWorker, 0.5, 0.25}) {
    std::vector<int> subset;
    for (int i = 0; i < cluster.workers_size(); ++i) {
      if (SpeedOf(cluster.workers(i)) >= at * fastest) subset.push_back(i);
    }
    if (seen.insert(subset).second) subsets.push_back(std::move(subset));
  }
  return subsets;
}

void KeepAllReducesWithin(const std::vector<std::string>& workers,
                          apapo::v1::ClusterSpec* cluster) {
  const std::set<std::string> held(workers.begin(), workers.end());
  auto* all = cluster->mutable_allreduces();
  all->erase(std::remove_if(all->begin(), all->end(),
                            [&](const apapo::v1::AllReduceMeasurement& a) {
                              if (a.worker_ids_size() == 0) {
                                return a.ranks() > static_cast<int>(held.size());
                              }
                              return !std::all_of(a.worker_ids().begin(),
                                                  a.worker_ids().end(),
                                                  [&](const std::string& id) {
                                                    return held.count(id) > 0;
                                                  });
                            }),
             all->end());
}

apapo::v1::ClusterSpec SubCluster(const apapo::v1::ClusterSpec& cluster,
                                  const std::vector<int>& subset) {
  std::vector<bool> busy(cluster.workers_size(), false);
  for (int i : subset) {
    if (i >= 0 && i < cluster.workers_size()) busy[i] = true;
  }
  const std::vector<double> speeds = SpeedsUnderLoad(cluster, busy);
  std::vector<std::string> ids;
  std::vector<int> kept;
  for (int i = 0; i < cluster.workers_size(); ++i) {
    if (!busy[i]) continue;
    kept.push_back(i);
    ids.push_back(cluster.workers(i).worker_id());
  }
  apapo::v1::ClusterSpec out = cluster;
  if (static_cast<int>(kept.size()) == cluster.workers_size() && cluster.levels_size() > 0) {
    // Every worker: the cluster's own order, links and levels (the
    // coordinator inferred them), each worker at its speed under load.
    for (int i = 0; i < out.workers_size(); ++i) {
      apapo::v1::WorkerResources* w = out.mutable_workers(i);
      w->set_relative_speed(speeds[i]);
      w->clear_core_set();
      w->clear_core_set_size();
    }
    return out;
  }
  const std::set<std::string> held(ids.begin(), ids.end());
  out.clear_workers();
  out.clear_links();
  out.clear_levels();
  KeepAllReducesWithin(ids, &out);
  std::vector<apapo::v1::LinkMeasurement> links;
  for (const auto& link : cluster.links()) {
    if (held.count(link.from_worker()) && held.count(link.to_worker())) {
      links.push_back(link);
      *out.add_links() = link;
    }
  }
  const NetworkLevels levels = InferNetworkLevels(ids, links);
  std::vector<int> order = levels.order;
  if (order.size() != kept.size()) {
    order.clear();
    for (size_t i = 0; i < kept.size(); ++i) order.push_back(static_cast<int>(i));
  }
  for (int o : order) {
    apapo::v1::WorkerResources* w = out.add_workers();
    *w = cluster.workers(kept[o]);
    w->set_relative_speed(speeds[kept[o]]);
    w->clear_core_set();
    w->clear_core_set_size();
  }
  if (!levels.levels.empty()) {
    for (const auto& level : levels.levels) *out.add_levels() = level;
  } else {
    apapo::v1::NetworkLevel* level = out.add_levels();
    level->set_group_size(static_cast<int>(kept.size()));
    if (cluster.levels_size() > 0) {
      level->set_bandwidth_bytes_per_second(cluster.levels(0).bandwidth_bytes_per_second());
    }
  }
  return out;
}

}  // namespace apapo::planning
